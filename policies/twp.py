"""Token Window Pacing (Desai, N K, Addya: "Stable Token-level Scheduling for Serverless LLM Inference").

Each decode step, in this order: monitor the smoothed ITL, update the token window, rank the waiting
requests, gate them against the window and the KV guard, and stage admitted prompts in chunks of ``C``.

The paper's engine is one GPU. In a pool TWP keeps one controller per container (its window, ITL filter,
``l_min`` estimate and KV guard), each fed only by its own engine's steps; ``shared_controller=True`` keeps the
one controller that every container fed in turn before (its window zig-zags between the engines' values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from servegym.envs.observation import POOL_FEATURES, POOL_INDEX, QUEUE_INDEX
from servegym.policies.base import Observation, Policy, engine_feature, ranks_action, register_policy
from servegym.policies.common import (
    admission_blocks,
    free_slots,
    remaining_queued,
    remaining_running,
    total_blocks,
    visible_queue,
)
from servegym.policies.params import PolicyParams, in_range, optional, param, positive_int, positive_number
from servegym.validation import boolean

if TYPE_CHECKING:
    import optuna

    from servegym.backends import Profile

_Q = QUEUE_INDEX
TRACE_FIELDS = ("window", "window_floor", "target", "sigma", "kv_guard", "token_load", "forced", "num_admitted",
                "num_waiting", "num_running", "container")
"""What :meth:`TokenWindowPacing.diagnostics` reports per step (``container``: the deciding one)."""
DEFAULT_B0 = 8
"""``min_active_requests="profile"`` without a profile (a torch backend, a mixture): the paper's V100 ``B0``."""
CONTROLLER_STATE = ("window", "itl_hat", "itl_floor", "kv_guard")
"""The per-engine feedback state: one copy per container unless ``shared_controller``."""


def _b0(name: str, value: object) -> None:
    if value is not None and value != "profile":
        positive_int(name, value)


def deciding_container(obs: Observation) -> int:
    """The container whose decision ``obs`` asks for (``obs["pool"]``'s ``deciding`` column; 0 without a pool)."""
    pool = obs.get("pool")
    if pool is None or pool.size <= len(POOL_FEATURES):  # no pool, or one container: it decides
        return 0
    return int(np.argmax(pool.reshape(-1, len(POOL_FEATURES))[:, POOL_INDEX["deciding"]]))


def _chunking(name: str, value: object) -> None:
    if value not in ("per_request", "total"):
        raise ValueError(f"{name} must be 'per_request' or 'total', got {value!r}")


@dataclass(frozen=True)
class TWPParams(PolicyParams):
    """TWP's knobs; defaults follow the paper (``H0 = 400``, ``gamma = 0.15``, ``C = 64``)."""

    initial_window: float = param(400.0, "H0: base token window (tokens)", positive_number)
    gain: float = param(0.15, "gamma: smoothing of H_{t+1} = H_t + gamma (H* - H_t)", in_range(0.0, 1.0))
    prefill_chunk_tokens: int = param(64, "C: prompt tokens staged per step", positive_int)
    queue_norm: float = param(32.0, "Q: queue depth at which the window doubles", positive_number)
    window_min: float = param(32.0, "H_min: lower clamp of the window", positive_number)
    window_max: float = param(4096.0, "H_max: upper clamp of the window", positive_number)
    itl_filter: float = param(0.3, "EMA weight of the newest ITL in l_hat", in_range(0.0, 1.0))
    max_wait_steps: int = param(200, "T_max: steps after which a request is forced in", positive_int)
    weights: tuple[float, float, float] = param((0.5, 0.3, 0.2), "w1 > w2 > w3: starvation, token balance, fairness")
    kv_guard: float = param(0.05, "delta_kv at rest: minimum free KV fraction to admit", in_range(0.0, 1.0, True))
    kv_guard_max: float = param(0.3, "the tightest delta_kv", in_range(0.0, 1.0, True))
    kv_guard_gain: float = param(50.0, "delta_kv rise per unit of KV consumed per step", positive_number)
    kv_guard_relax: float = param(0.1, "fraction of the gap closed per step when relaxing", in_range(0.0, 1.0))
    unknown_output_tokens: float | None = param(
        128.0, "length estimate when lengths are unknown (None: use max_tokens)", optional(positive_number)
    )
    min_active_requests: int | str | None = param(
        "profile", "B0: the window never falls below this many requests' mean estimated remaining tokens, so "
        "enough requests stay active to use the GPU's parallelism; 'profile': the env profile's saturation batch "
        "(8 on the paper's V100, 20 on a100-llama3-8b), 8 without one; None: window_min alone", _b0)
    shared_controller: bool = param(
        False, "one window, ITL filter, l_min estimate and KV guard fed by every container of a pool in turn; "
        "default: one per container (the paper's engine is one GPU)", boolean)
    chunking: str = param(
        "per_request", "'per_request': each prompt ingests at most C tokens per step, the paper's fixed-size "
        "chunks, one per decode step; 'total': at most C prefill tokens per step over all prompts", _chunking)

    def validate(self) -> None:
        if self.gain == 0 or self.itl_filter == 0:
            raise ValueError("gain and itl_filter must be > 0")
        if self.window_min > self.window_max:
            raise ValueError(f"window_min {self.window_min} exceeds window_max {self.window_max}")
        w1, w2, w3 = self.weights
        if not w1 > w2 > w3 > 0:
            raise ValueError(f"weights must satisfy w1 > w2 > w3 > 0, got {self.weights}")
        if not self.kv_guard <= self.kv_guard_max:
            raise ValueError("need 0 <= kv_guard <= kv_guard_max < 1")

@register_policy
class TokenWindowPacing(Policy):
    """Admit against a token window that breathes with smoothed ITL and queue depth."""

    name = "twp"
    source = "Desai, N K, Addya: Stable Token-level Scheduling for Serverless LLM Inference"
    rule = "token window H_t steered by ITL and queue, KV guard, forced admission after T_max, chunked prefill C"
    uses_output_lengths = True
    Params = TWPParams


    @staticmethod
    def search_space(trial: optuna.Trial) -> dict[str, Any]:
        """H0, gamma and C (the paper's three knobs), plus T_max and the KV guard."""
        return {
            "initial_window": trial.suggest_float("initial_window", 50.0, 8000.0, log=True),
            "gain": trial.suggest_float("gain", 0.01, 1.0, log=True),
            "prefill_chunk_tokens": trial.suggest_categorical("prefill_chunk_tokens", [16, 32, 64, 128, 256, 512]),
            "max_wait_steps": trial.suggest_int("max_wait_steps", 10, 5000, log=True),
            "kv_guard": trial.suggest_float("kv_guard", 0.0, 0.25),
        }

    @classmethod
    def from_saturation(cls, saturation_batch: int, mean_output_tokens: float, **params: Any) -> TokenWindowPacing:
        """The alternative start ``H0 = B0 * mean_output_len``."""
        return cls(initial_window=float(saturation_batch * mean_output_tokens), **params)

    def engine_overrides(self) -> dict[str, Any]:
        c = self.params.prefill_chunk_tokens
        return {"prefill_chunk_tokens": c, "max_prefill_tokens": c if self.params.chunking == "total" else None}

    profile_b0: int | None = None
    """The saturation batch of the profile :meth:`bind_profile` saw (None: none seen)."""

    def bind_profile(self, profile: Profile | None) -> None:
        self.profile_b0 = None if profile is None else int(profile.latency.saturation_batch)

    @property
    def min_active_requests(self) -> int | None:
        """``B0`` in force: the explicit parameter, else the bound profile's, else :data:`DEFAULT_B0`."""
        b0 = self.params.min_active_requests
        if b0 != "profile":
            return b0
        return self.profile_b0 or DEFAULT_B0

    def reset(self) -> None:
        self.window = self.params.initial_window
        self.itl_hat: float | None = None
        self.itl_floor = math.inf
        self.kv_guard = self.params.kv_guard
        self.forced_total = 0
        """Forced admissions over all containers."""
        self._initial = self._controller_state()
        self._controllers: dict[int, tuple[Any, ...]] = {}
        """Each container's :data:`CONTROLLER_STATE` while another one's is loaded."""
        self._container = 0
        """The container whose controller state the attributes hold."""
        self._trace: list[tuple[float, ...]] = []
        """One row of :data:`TRACE_FIELDS` per step."""

    def _controller_state(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in CONTROLLER_STATE)

    def _load_controller(self, container: int) -> None:
        """Put ``container``'s controller state in the attributes the five stages read, keeping the one there."""
        if container == self._container:
            return
        self._controllers[self._container] = self._controller_state()
        for name, value in zip(CONTROLLER_STATE, self._controllers.get(container, self._initial), strict=True):
            setattr(self, name, value)
        self._container = container

    def diagnostics(self) -> dict[str, np.ndarray]:
        """Per step: H_t, its floor H_min, H*, sigma, delta_kv, token load K_t, forced and total admissions, queue,
        batch, and the deciding container (in a pool the other columns are that container's controller's)."""
        rows = np.asarray(self._trace, dtype=np.float64).reshape(-1, len(TRACE_FIELDS))
        return {name: rows[:, i] for i, name in enumerate(TRACE_FIELDS)}

    # ------------------------------------------------------------------ the five stages
    def _monitor(self, obs: Observation) -> float:
        p = self.params
        itl = engine_feature(obs, "itl_last_s")
        if itl > 0:
            self.itl_hat = itl if self.itl_hat is None else self.itl_hat + p.itl_filter * (itl - self.itl_hat)
            self.itl_floor = min(self.itl_floor, itl)
        baseline = engine_feature(obs, "baseline_step_s")
        l_min = baseline if baseline > 0 else self.itl_floor
        return self.itl_hat / l_min if self.itl_hat is not None and math.isfinite(l_min) else 1.0

    def _update_window(self, sigma: float, queue_depth: float, floor: float) -> float:
        p = self.params
        target = p.initial_window * (1.0 + min(1.0, queue_depth / p.queue_norm)) / max(0.5, sigma)
        self.window = min(p.window_max, max(floor, self.window + p.gain * (target - self.window)))
        return target

    def _window_floor(self, running_mean: float | None, queued_remaining: np.ndarray) -> float:
        """``H_min``: ``window_min``, raised to ``B0`` times the mean estimated remaining tokens of the running
        requests (``running_mean``, None while nothing runs: then of the waiting ones), capped at ``window_max``."""
        p, b0 = self.params, self.min_active_requests
        if b0 is None:
            return p.window_min
        if running_mean is not None:
            mean = running_mean
        else:
            mean = float(queued_remaining.sum() / queued_remaining.size) if queued_remaining.size else 0.0
        return min(p.window_max, max(p.window_min, b0 * mean))

    def _update_kv_guard(self, obs: Observation) -> None:
        p = self.params
        consumption = max(0.0, -engine_feature(obs, "kv_free_delta"))
        target = min(p.kv_guard_max, p.kv_guard + p.kv_guard_gain * consumption)
        # Tighten at once when KV is being eaten; relax gradually once usage is stable.
        relaxed = self.kv_guard + p.kv_guard_relax * (target - self.kv_guard)
        self.kv_guard = target if target > self.kv_guard else relaxed

    def _rank(self, queue: np.ndarray, want: np.ndarray, mean_remaining: float) -> np.ndarray:
        p = self.params
        w1, w2, w3 = p.weights
        starvation = queue[:, _Q["wait_steps"]] / p.max_wait_steps
        balance = np.exp(-np.abs(want - mean_remaining) / (mean_remaining + 1.0))
        fairness = queue[:, _Q["wait_s"]] / (queue[:, _Q["num_prompt_tokens"]] + want)
        top = fairness.max(initial=0.0)
        fairness = fairness / top if top > 0 else fairness
        score = w1 * starvation + w2 * balance + w3 * fairness
        return np.argsort(-score, kind="stable")

    def act(self, obs: Observation) -> np.ndarray:
        p = self.params
        container = deciding_container(obs)
        self._load_controller(0 if p.shared_controller else container)
        depth = engine_feature(obs, "num_waiting")
        batch = int(engine_feature(obs, "num_running"))
        remaining = remaining_running(obs, p.unknown_output_tokens)
        total = remaining.sum()
        token_load = float(total)
        mean_remaining = float(total / remaining.size) if batch else 0.0  # remaining.mean(), summed once
        queue = visible_queue(obs)
        want = remaining_queued(obs, queue, p.unknown_output_tokens)

        sigma = self._monitor(obs)
        floor = self._window_floor(mean_remaining if batch else None, want)
        target = self._update_window(sigma, depth, floor)
        self._update_kv_guard(obs)

        admitted, num_forced = self._gate(obs, queue, want, token_load, mean_remaining) if queue.shape[0] else ([], 0)
        self.forced_total += num_forced
        self._trace.append((self.window, floor, target, sigma, self.kv_guard, token_load, num_forced, len(admitted),
                            depth, batch, container))
        return ranks_action(obs, admitted)

    def _gate(self, obs: Observation, queue: np.ndarray, want: np.ndarray, token_load: float,
              mean_remaining: float) -> tuple[list[int], int]:
        """Forced admissions first (longest wait first), then ranked candidates while they pass the window and
        the KV guard; returns the queue slots in admission order and how many were forced."""
        p = self.params
        slots = free_slots(obs)
        if slots <= 0:  # the loop below would admit nothing, forced requests included
            return [], 0
        forced = (queue[:, _Q["wait_steps"]] > p.max_wait_steps).nonzero()[0]
        # When every candidate fails the window test, the loop below stops at whichever ranks first: the ranking
        # is skipped. Rounding is monotonic, so the smallest estimate fails it exactly when all do (the same sum,
        # in the same dtype, as the loop's).
        smallest = np.minimum.reduce(want)
        if not forced.size and token_load + smallest > self.window:
            return [], 0
        blocks = admission_blocks(obs, queue) / total_blocks(obs)
        kv_free = engine_feature(obs, "kv_free_frac")

        token_load_after, admitted, skip = token_load, [], set()
        if forced.size:  # in a saturated queue: requests that waited past T_max
            forced = forced[np.argsort(-queue[forced, _Q["wait_steps"]], kind="stable")][:slots]
            admitted = forced.tolist()
            skip = set(admitted)
            token_load_after += float(want[forced].sum())
            kv_free -= float(blocks[forced].sum())
            if len(admitted) >= slots or token_load_after + smallest > self.window:
                return admitted, int(forced.size)
        for i in self._rank(queue, want, mean_remaining):
            if len(admitted) >= slots:
                break
            if i in skip:
                continue
            # The gate: stop at the first candidate that fails; never skip ahead to a smaller one.
            if token_load_after + want[i] > self.window or kv_free - blocks[i] <= self.kv_guard:
                break
            admitted.append(int(i))
            token_load_after += want[i]
            kv_free -= blocks[i]
        return admitted, int(forced.size)
