"""The policy interface and the registry every policy file adds itself to."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from servegym.engine.config import LengthMode
from servegym.envs.observation import ENGINE_INDEX, QUEUE_FEATURES
from servegym.policies.params import PolicyParams

if TYPE_CHECKING:
    from servegym.backends import Profile

Observation = dict[str, np.ndarray]


class Policy(ABC):
    """A scheduler that drives the env through ``step`` alone.

    Subclasses implement :meth:`act` on one observation and may keep state between steps (reset by
    :meth:`reset`). :meth:`predict` follows stable-baselines3's contract so that SB3's ``evaluate_policy``
    scores hand-coded and learned policies with the same code; on a batch of observations it keeps one copy
    of the policy per environment.
    """

    name: ClassVar[str] = ""
    source: ClassVar[str] = ""
    """Where the policy comes from (paper, system)."""
    rule: ClassVar[str] = ""
    """The one-line rule it implements."""
    search_space: ClassVar[Callable[[Any], dict[str, Any]] | None] = None
    """``trial -> params`` for Optuna (``servegym tune``); None when the policy has nothing to tune."""
    uses_output_lengths: ClassVar[bool] = False
    """True when the rule reads ``output_lo``/``output_hi``: runners then default to predicted lengths, since
    with unknown lengths the interval is ``[1, max_tokens]`` and the rule degenerates."""
    needs_overrides: ClassVar[bool] = False
    """True for a policy that means nothing without its engine overrides (the clairvoyant greedy packer's true
    lengths): a benchmark runs it only in a task's engine-config track."""
    stateless: ClassVar[bool] = False
    """True when :meth:`act` is a function of the observation and the parameters alone (no filter, bucket or
    random stream advanced by a call): runners then skip the iterations with no admission decision to make
    without calling it (``decision_steps``), which leaves every episode unchanged."""
    decision: ClassVar[str] = "admission"
    """What :meth:`act` decides: ``"admission"`` (a ``MultiDiscrete`` action of the serving env) or ``"route"`` (the
    replica of the routing env, :class:`~servegym.envs.routing.RoutingEnv`); a task is played by policies of its
    own decision (:attr:`~servegym.envs.tasks.Task.decision`)."""
    Params: ClassVar[type[PolicyParams] | None] = None
    """The policy's parameters (a frozen :class:`PolicyParams` dataclass); None when it has none."""

    def __init__(self, **params: Any) -> None:
        if self.Params is None:
            if params:
                raise ValueError(f"policy {self.name!r} takes no parameters, got {sorted(params)}")
            self.params: PolicyParams | None = None
        else:
            self.params = self.Params(**params)
        self.reset()

    def engine_overrides(self) -> dict[str, Any]:
        """EngineConfig fields this policy needs (its preemption rule, prefill chunk); runners apply them."""
        return {}

    def pool_overrides(self) -> dict[str, Any]:
        """PoolConfig fields this policy needs (its router, its loader's cold-start scale)."""
        return {}

    def env_overrides(self) -> dict[str, Any]:
        """Env arguments this policy's rule needs (MC-SF's queue window, to sort the whole queue); runners apply
        them with the engine overrides, unless the caller set the argument itself."""
        return {}

    def bind_profile(self, profile: Profile | None) -> None:
        """Take what the policy reads from the latency profile it will run on (TWP: its ``B0``). ``make_env`` calls
        it with the env's profile, None for another backend or a mixture of envs."""

    def reset(self) -> None:
        """Forget per-episode state."""

    def diagnostics(self) -> dict[str, list[float]]:
        """Per-step internal signals to store beside an episode's results (name -> one value per step)."""
        return {}

    @abstractmethod
    def act(self, obs: Observation) -> np.ndarray:
        """Return a ``MultiDiscrete`` action (int64, one rank per visible queue slot, 0 = wait)."""

    def predict(
        self,
        observation: Observation,
        state: Any = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = True,
    ) -> tuple[np.ndarray, Any]:
        if observation["engine"].ndim == 1:
            if episode_start is not None and np.any(episode_start):
                self.reset()
            return self.act(observation), state
        n = observation["engine"].shape[0]
        clones: list[Policy] = getattr(self, "_clones", [])
        if len(clones) != n:
            clones = [copy.deepcopy(self) for _ in range(n)]
            for clone in clones:
                clone.reset()
            self._clones = clones
        actions = []
        for i, clone in enumerate(clones):
            if episode_start is not None and episode_start[i]:
                clone.reset()
            actions.append(clone.act({k: v[i] for k, v in observation.items()}))
        return np.stack(actions), state


def engine_feature(obs: Observation, name: str) -> float:
    """One named entry of ``obs["engine"]`` (see ``ENGINE_FEATURES``)."""
    return float(obs["engine"][ENGINE_INDEX[name]])


def output_estimate(lo: np.ndarray, hi: np.ndarray, length_mode: LengthMode,
                    unknown_prior: float | None) -> np.ndarray:
    """A point estimate of output length from the observed interval ``[lo, hi]``.

    Known lengths: exact. Predicted or truth interval: the interval's midpoint. Unknown: ``unknown_prior`` (an
    operator's estimate of the mean, clipped to the interval), or ``hi`` (``max_tokens``) when the prior is None.
    """
    if length_mode is LengthMode.KNOWN:
        return lo.astype(np.float64)
    if length_mode is LengthMode.PREDICTED or length_mode is LengthMode.TRUTH_INTERVAL:
        return (lo + hi) / 2.0
    if unknown_prior is None:
        return hi.astype(np.float64)
    # np.clip's value, without its Python wrappers (the per-step path of TWP and the KV-aware baselines).
    return np.minimum(np.maximum(np.float64(unknown_prior), lo), hi)


def ranks_action(obs: Observation, slots: list[int] | np.ndarray) -> np.ndarray:
    """The action that admits queue ``slots`` in the given order (rank 1 first)."""
    action = np.zeros(obs["queue"].shape[0] // len(QUEUE_FEATURES), dtype=np.int64)
    if len(slots):
        action[np.asarray(slots, dtype=np.int64)] = np.arange(1, len(slots) + 1)
    return action


def admit_first(obs: Observation, count: int) -> np.ndarray:
    """The action that admits the first ``count`` visible waiting requests in queue order."""
    action = np.zeros(obs["queue"].shape[0] // len(QUEUE_FEATURES), dtype=np.int64)
    action[:count] = 1
    return action


POLICIES: dict[str, type[Policy]] = {}


def register_policy(cls: type[Policy]) -> type[Policy]:
    """Class decorator adding a policy to :data:`POLICIES`; a duplicate or missing name is an error."""
    if not cls.name or not cls.source or not cls.rule:
        raise ValueError(f"{cls.__name__} must set name, source and rule")
    if cls.name in POLICIES:
        raise ValueError(f"policy name {cls.name!r} is already registered by {POLICIES[cls.name].__name__}")
    POLICIES[cls.name] = cls
    return cls


def deciding(decision: str) -> list[str]:
    """The registered policies that decide ``decision`` (``"admission"`` or ``"route"``), by name."""
    return sorted(name for name, cls in POLICIES.items() if cls.decision == decision)


def policies_table() -> str:
    """The registry as a Markdown table (README and docs/POLICIES.md carry it verbatim; ``servegym policies
    --markdown`` prints it)."""
    rows = ["| policy | rule | source | tuned parameters | skips idle iterations |", "| --- | --- | --- | --- | --- |"]
    for name, cls in sorted(POLICIES.items()):
        tuned = "yes" if cls.search_space is not None else ""
        rows.append(f"| `{name}` | {cls.rule} | {cls.source} | {tuned} | {'yes' if cls.stateless else ''} |")
    return "\n".join(rows)


def make_policy(name: str, **params: Any) -> Policy:
    """A registered policy by name, ``rl:RUN_DIR`` for an agent trained by ``servegym train``, or ``random:MODE``
    for the random floor of a learning action mode (``count``, ``window``, ``rank``)."""
    if name.startswith("rl:"):
        from servegym.rl.agent import RLPolicy

        return RLPolicy(name.removeprefix("rl:"), **params)
    if name.startswith("random:"):
        from servegym.rl.random_floor import RandomAction

        return RandomAction(mode=name.removeprefix("random:"), **params)
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; registered: {sorted(POLICIES)}") from None
    return cls(**params)

