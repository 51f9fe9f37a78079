"""benchmarks/step_parts.py: its timers change no episode, and every part it reports is timed where it says."""

from __future__ import annotations

import argparse

import pytest

from tests.conftest import load_benchmark


@pytest.mark.parametrize("mode", ["admit", "score"])
def test_the_timed_run_steps_the_same_episodes_and_every_part_is_timed(mode):
    script = load_benchmark("step_parts")
    args = argparse.Namespace(task="memory-tight", envs=2, steps=40)
    _, _, plain = script.run(mode, args, None)
    _, spent, timed = script.run(mode, args, script.instrument)
    assert timed == plain and len(plain) == 40 and any(plain)  # same rewards, step by step, to the bit
    # Each timer ran: the nested sums grow outward (vector step > wrapped > unwrapped > pool step > engine step).
    assert spent["vector"] > spent["wrapped"] > spent["unwrapped"] > spent["cluster"] > spent["engine"] > 0
    assert spent["encode"] > 0 and spent["decode"] > 0 and spent["account"] > 0 and spent["info"] > 0
    assert spent["skip"] > 0  # these seeds and actions run the engine's own loop: its timer fires
    split = script.parts(spent)
    assert list(split) == list(script.PARTS)
    assert all(value >= 0 for value in split.values()), split  # no part is counted twice
    assert sum(split.values()) == pytest.approx(spent["vector"], rel=1e-9)  # each timed second in one part


def test_the_engine_part_times_the_pool_steps_engine_calls_alone(monkeypatch):
    """The engine's own loop (``skip``) calls its step too: those calls belong to ``skip``, not to ``engine``.
    On a clock that ticks once a reading, an untimed-inside call adds exactly 1, so the parts become call counts:
    each pool step holds one engine step, which adds 2 ticks to it (its own two readings), hence cluster = 3 x
    engine exactly when only the pool step's engine calls are timed."""
    script = load_benchmark("step_parts")
    ticks = iter(range(10**9))
    monkeypatch.setitem(script._timed_attr.__globals__, "time", argparse.Namespace(perf_counter=lambda: next(ticks)))
    _, spent, _ = script.run("admit", argparse.Namespace(task="memory-tight", envs=2, steps=40), script.instrument)
    assert spent["skip"] > 0 and spent["engine"] > 0
    assert spent["cluster"] == 3 * spent["engine"]


def test_repeats_report_the_fastest_untimed_run_and_refuse_other_episodes(monkeypatch):
    script = load_benchmark("step_parts")
    walls = iter([3.0, 0.5, 2.0])
    spent = {**dict.fromkeys(("vector", "wrapped", "unwrapped", "cluster", "engine", "skip", "encode", "decode",
                              "account", "info"), 0.0)}

    def fake_run(mode, args, instrument):
        return (9.0, spent, [1.0]) if instrument else (next(walls), {}, [1.0])

    monkeypatch.setattr(script, "run", fake_run)
    args = argparse.Namespace(task="memory-tight", envs=2, steps=10, repeats=3)
    row = script.parts_row("admit", args).split(" | ")
    assert row[1:3] == ["40", "25000.0"]  # 20 env steps in the fastest 0.5 s: 40/s, 25,000 us each
    sums = iter([[1.0], [2.0]])
    monkeypatch.setattr(script, "run", lambda mode, args, instrument: (1.0, {}, next(sums)))
    with pytest.raises(RuntimeError, match="other episodes"):
        script.parts_row("admit", argparse.Namespace(task="memory-tight", envs=2, steps=10, repeats=2))
