"""Behaviour is pinned: whole episode logs on fixed seeds hash as they did when ``golden_logs.json`` was made.

The cases cover every length mode, preemption (LIFO, clear-all, fewest-generated), a cold pool and most
policies, each on both engines (Python and compiled), on the paper profile and on the default schema-2 profile
(arrivals compressed to its capacity). A failure means an episode changed: if that was the
intent, regenerate with ``python -m tests.golden`` and say why in the commit.
"""

from __future__ import annotations

import json

import pytest

from servegym.engine import compiled_available
from tests.golden import CASES, GOLDEN, PROFILES, label, run_case

EXPECTED = json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("engine", ["python", pytest.param("compiled", marks=pytest.mark.skipif(
    not compiled_available(), reason="the compiled engine is not built here"))])
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_episode_log_is_unchanged(case, profile, engine, monkeypatch):
    monkeypatch.setenv("SERVEGYM_ENGINE", engine)
    prints, total = run_case(case, profile)
    assert {**prints, "reward": total} == EXPECTED[label(case, profile)]


def test_every_stored_fingerprint_is_a_case():
    # A renamed or dropped case would otherwise leave a stale fingerprint that pins nothing.
    assert set(EXPECTED) == {label(case, profile) for case in CASES for profile in PROFILES}
