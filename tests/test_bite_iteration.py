"""The iteration's outputs pinned by hand: what a backend is handed and called with, the total prefill cap, and
the engine's part of the observation. Each case runs on both ways of running the engine (compiled where it was
built, and its source interpreted), so these catch a slip in ``engine/engine.py`` without comparing one with the
other.

``flat_profile`` takes 43 ms per iteration and charges nothing for prefill (see tests/test_bite_engine.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from servegym.backends import CalibratedBackend
from servegym.engine import compiled_available
from servegym.envs.observation import ENGINE_INDEX
from servegym.runner import make_env
from tests.conftest import fixed, flat_profile

ENGINES = ["python", pytest.param("compiled", marks=pytest.mark.skipif(not compiled_available(),
                                                                        reason="the compiled engine is not built"))]


@pytest.fixture(params=ENGINES)
def engine(request, monkeypatch) -> str:
    monkeypatch.setenv("SERVEGYM_ENGINE", request.param)
    return request.param


class QuarterSecond(CalibratedBackend):
    """Overrides ``execute`` alone (not ``execute_totals``): every iteration takes 0.25 s and is recorded."""

    def __init__(self) -> None:
        super().__init__(flat_profile())
        self.batches: list[tuple[list[int], ...]] = []

    def execute(self, batch) -> float:
        self.batches.append(tuple(np.asarray(part).tolist() for part in batch))
        return 0.25


def admit_all(env) -> np.ndarray:
    return np.ones(env.unwrapped.queue_window, dtype=np.int64)


def test_a_backend_that_overrides_execute_is_called_with_each_iterations_batch(engine):
    # One request: a 10-token prompt, 3 output tokens. Iteration 1 prefills all 10 tokens (start 0, target 10) and
    # samples the first token: 11 KV tokens. Iterations 2 and 3 decode with 11 and then 12 tokens of context held
    # before the iteration; the third token is the last. Each iteration takes the override's 0.25 s (the flat
    # profile's 43 ms would finish at 0.129 s), so the request finishes at 0.75 s.
    backend = QuarterSecond()
    env = make_env(None, workload=fixed([0.0], [10], [3]), backend=backend)
    env.reset(seed=0)
    for _ in range(3):
        env.step(admit_all(env))
    assert backend.batches == [([], [], [0], [0], [10], [10]), ([0], [11], [], [], [], []),
                               ([0], [12], [], [], [], [])]
    assert env.unwrapped.cluster.log.finish_s[0] == pytest.approx(0.75, abs=1e-12)


@pytest.mark.parametrize(("cap", "chunks"), [(30, [30, 30, 30, 10]), (100, [100]), (99, [99, 1])])
def test_the_total_prefill_cap_bounds_every_iterations_prompt_tokens(engine, cap, chunks):
    # A 100-token prompt under max_prefill_tokens = cap, with no other limit binding: it ingests cap tokens per
    # iteration and the rest in the last (30: 30 + 30 + 30 + 10; 99: 99 + 1; 100: all at once).
    env = make_env(None, workload=fixed([0.0], [100], [2]), profile=flat_profile(),
                   engine={"max_prefill_tokens": cap, "prefill_chunk_tokens": 512, "max_num_batched_tokens": 4096})
    env.reset(seed=0)
    for _ in range(len(chunks)):
        env.step(admit_all(env))
    steps = env.unwrapped.cluster.log.steps()
    assert steps[: len(chunks), 4].astype(int).tolist() == chunks  # num_prefill_tokens
    assert env.unwrapped.cluster.log.first_token_s[0] == pytest.approx(0.043 * len(chunks), abs=1e-12)


def test_the_observation_counts_what_the_last_iteration_did_and_the_whole_queue(engine):
    # Five requests arrive at 0 with a queue window of 2. Admitting both visible ones: request 0 (output 1) samples
    # its only token at the end of its prefill and finishes; request 1 (output 3) goes on. So the iteration
    # admitted 2 and finished 1, and 3 requests still wait, one more than the window shows.
    env = make_env(None, workload=fixed([0.0] * 5, [10] * 5, [1, 3, 3, 3, 3]), profile=flat_profile(),
                   queue_window=2)
    env.reset(seed=0)
    obs, *_ = env.step(np.array([1, 2], dtype=np.int64))
    engine_part = obs["engine"]
    assert engine_part[ENGINE_INDEX["last_num_admitted"]] == 2
    assert engine_part[ENGINE_INDEX["last_num_finished"]] == 1
    assert engine_part[ENGINE_INDEX["num_waiting"]] == 3
    assert engine_part[ENGINE_INDEX["num_running"]] == 1
