"""The Gymnasium adapter over the serving engine."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from servegym.backends import DEFAULT_PROFILE, Backend, CalibratedBackend, Profile, load_profile
from servegym.engine import Engine, EngineConfig
from servegym.envs.observation import ObservationEncoder, observation_space
from servegym.workloads import Workload, make_workload

REWARDS = {
    "latency": "minus requests-in-system x step seconds (plus arrivals' lag): sums to minus total latency",
    "tokens": "output tokens emitted in the step (throughput)",
}


class ServingEnv(gym.Env):
    """
    ## Description

    An LLM serving engine under a scheduler's control. Requests arrive from a workload, wait in a queue, are
    admitted, ingest their prompt in chunks (chunked prefill) and then decode one token per iteration until
    they finish. KV memory is paged; when an iteration would overflow it, running requests are preempted and
    later recompute. One `step` is one engine iteration (one forward pass): the action decides which waiting
    requests to admit before it runs. Iteration latency comes from the backend: a calibrated latency model
    (default) or a real model.

    ## Action Space

    `MultiDiscrete([W + 1] * W)` over the `W = queue_window` requests at the head of the queue. `action[i] = 0`
    leaves slot `i` waiting; `action[i] = k >= 1` admits it with rank `k` (rank 1 first; equal ranks go in queue
    order). So a 0/1 vector is an admit mask in arrival order, and distinct ranks give any order. Admission
    stops at the first request that does not fit (`max_num_seqs`, or free KV blocks for its first chunk).
    Admitting an empty slot is ignored and counted in `info["invalid_admissions"]` (an error with
    `strict_actions=True`); `action_masks()` gives the valid choices for MaskablePPO.

    ## Observation Space

    A `Dict` of flat float32 boxes (SB3 `MultiInputPolicy`); `queue_matrix(obs)` and `running_matrix(obs)`
    give row views. Rows beyond the live count are zero.

    | key | shape | content |
    |-----|-------|---------|
    | `engine` | `(15,)` | `ENGINE_FEATURES`: last and smoothed ITL, baseline `l_min`, batch size, prefilling count, token load, queue depth, KV free fraction and its smoothed rate of change, KV capacity and block size, last step's preempted/admitted/finished, length mode (0 known, 1 predicted, 2 unknown) |
    | `queue` | `(W * 6,)` | per visible waiting request: prompt tokens, wait s, wait steps, output lo, output hi, generated (preempted) |
    | `running` | `(max_num_seqs * 6,)` | per running request in activation order: prompt tokens, KV tokens, generated, output lo, output hi, prompt tokens left to prefill |

    Output lengths show as an interval `[lo, hi]`: exact when `length_mode="known"`, a seeded interval around
    the truth when `"predicted"`, `[1, max_tokens]` when `"unknown"`.

    ## Rewards

    `reward="latency"` (default): `-(requests in system) x step seconds`, plus minus the lag of requests that
    arrived during the step; over an episode it sums to minus the total time requests spent in the system, so
    maximising it minimises mean latency. `reward="tokens"`: output tokens emitted in the step.

    ## Starting State

    The workload is drawn from `np_random`; the clock starts at the first arrival with it queued.

    ## Episode End

    Terminated when the workload is exhausted and the system is empty. Truncated by `max_episode_steps`
    (20,000 for `servegym/Serving-v0`).

    ## Arguments

    ```python
    import gymnasium as gym
    import servegym
    env = gym.make("servegym/Serving-v0", workload="burst", engine={"length_mode": "known"})
    ```

    | parameter | default | description |
    |-----------|---------|-------------|
    | `workload` | `"medium"` | a name from `servegym.workloads.WORKLOADS` or a `Workload` |
    | `profile` | `"paper-v100-llama3.2-3b"` | calibrated profile: a shipped name, a JSON path or a `Profile` |
    | `backend` | `None` | a `Backend` instance; overrides `profile` (e.g. the real torch backend) |
    | `engine` | `None` | an `EngineConfig` or a dict of its fields |
    | `queue_window` | `32` | visible waiting requests `W` |
    | `reward` | `"latency"` | one of `REWARDS` |
    | `latency_noise_cv` | `None` | override the profile's multiplicative latency noise |
    | `strict_actions` | `False` | raise on admits of empty slots instead of counting them |

    ## Version History

    * v0: initial release.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        workload: str | Workload = "medium",
        profile: str | Profile = DEFAULT_PROFILE,
        backend: Backend | None = None,
        engine: EngineConfig | dict[str, Any] | None = None,
        queue_window: int = 32,
        reward: str = "latency",
        latency_noise_cv: float | None = None,
        strict_actions: bool = False,
        render_mode: str | None = None,
    ) -> None:
        if isinstance(engine, dict):
            engine = EngineConfig(**engine)
        self.engine_config = engine or EngineConfig()
        if isinstance(queue_window, bool) or not isinstance(queue_window, int) or queue_window < 1:
            raise ValueError(f"queue_window must be a positive int, got {queue_window!r}")
        if reward not in REWARDS:
            raise ValueError(f"unknown reward {reward!r}; choose from {sorted(REWARDS)}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or one of {self.metadata['render_modes']}")
        if backend is None:
            prof = profile if isinstance(profile, Profile) else load_profile(profile)
            backend = CalibratedBackend(prof, noise_cv=latency_noise_cv)
        self.workload = make_workload(workload) if isinstance(workload, str) else workload
        self.engine = Engine(self.engine_config, backend, self.workload)
        self.queue_window = queue_window
        self.reward_name = reward
        self.strict_actions = strict_actions
        self.render_mode = render_mode
        slots = self.engine_config.max_num_seqs
        self.action_space = spaces.MultiDiscrete(np.full(queue_window, queue_window + 1, dtype=np.int64))
        self.observation_space = observation_space(queue_window, slots)
        self._encoder = ObservationEncoder(queue_window, slots)
        self._invalid = 0

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.engine.reset(self.np_random)
        self._encoder.reset(self.engine)
        self._invalid = 0
        return self._encoder.encode(self.engine), self._info()

    def step(self, action):
        order = self._decode_action(action)
        out = self.engine.step(order)
        if self.reward_name == "latency":
            reward = -(out.in_system * out.dt_s + out.arrival_lag_s)
        else:
            reward = float(out.decode_tokens)
        return self._encoder.encode(self.engine), reward, self.engine.done, False, self._info()

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        e = self.engine
        return (f"t={e.clock:9.3f}s step={e.step_index} running={e.n_running} queue={e.queue.size} "
                f"kv={e.used_blocks}/{e.num_kv_blocks} done={e.finished} itl={e.itl_last * 1e3:.1f}ms")

    # ------------------------------------------------------------------ actions
    def _decode_action(self, action) -> np.ndarray:
        a = np.asarray(action)
        w = self.queue_window
        if a.shape != (w,):
            raise ValueError(f"action must have shape ({w},), got {a.shape}")
        if a.dtype.kind not in "iu":
            if a.dtype.kind == "f" and np.isnan(a).any():
                raise ValueError("action contains NaN")
            raise TypeError(f"action must be an integer array (MultiDiscrete), got dtype {a.dtype}")
        if not a.any():
            return a[:0]
        if a.min() < 0 or a.max() > w:
            raise ValueError(f"action values must be in [0, {w}], got min {a.min()} max {a.max()}")
        slots = np.flatnonzero(a)
        visible = min(self.engine.queue.size, w)
        if slots[-1] >= visible:
            empty = slots[slots >= visible]
            if self.strict_actions:
                raise ValueError(f"action admits empty queue slot(s) {empty.tolist()}; only {visible} visible")
            self._invalid += empty.size
            slots = slots[slots < visible]
        return slots[np.argsort(a[slots], kind="stable")]

    def action_masks(self) -> np.ndarray:
        """Valid values per slot, flattened for sb3-contrib's MaskablePPO: empty slots may only be 0."""
        w = self.queue_window
        mask = np.zeros((w, w + 1), dtype=bool)
        mask[:, 0] = True
        mask[: min(self.engine.queue.size, w), 1:] = True
        return mask.ravel()

    # ------------------------------------------------------------------ info
    def _info(self) -> dict[str, Any]:
        e, out = self.engine, self.engine.last
        return {
            "clock_s": e.clock,
            "step_s": out.dt_s,
            "decode_tokens": out.decode_tokens,
            "prefill_tokens": out.prefill_tokens,
            "admitted": out.admitted,
            "refused": out.refused,
            "preempted": out.preempted,
            "finished": out.finished,
            "arrived": out.arrived,
            "rejected": out.rejected,
            "running": e.n_running,
            "waiting": e.queue.size,
            "kv_used_frac": e.used_blocks / e.num_kv_blocks,
            "invalid_admissions": self._invalid,
        }

    def config_dict(self) -> dict[str, Any]:
        """The engine configuration as plain values (for logs and result files)."""
        return {k: getattr(v, "value", v) for k, v in asdict(self.engine_config).items()}
