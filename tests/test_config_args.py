"""CLI flags that mirror a config field are built from the field: its type, default, help and choices."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from servegym.cli import build_parser
from servegym.cli_args import add_config_args, config_args
from servegym.cli_tune import TUNE_FLAGS
from servegym.tuning.study import TuneConfig


def tune_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices  # argparse has no public getter
    return sub["tune"]


def test_tune_flags_carry_the_config_fields_defaults_and_help() -> None:
    actions = {a.dest: a for a in tune_parser()._actions}
    for f in dataclasses.fields(TuneConfig):
        if f.name in TUNE_FLAGS:
            assert actions[f.name].default == f.default, f.name
            assert actions[f.name].help.startswith(f.metadata["help"]), f.name
    assert actions["sampler"].choices == ("tpe", "cmaes") and actions["trials"].type("7") == 7


def test_parsed_flags_make_the_config() -> None:
    args = tune_parser().parse_args(["--policy", "twp", "--trials", "7", "--sampler", "cmaes", "--sampler-seed", "3"])
    cfg = TuneConfig(policy="twp", workload="burst", **config_args(args, TUNE_FLAGS))
    assert (cfg.trials, cfg.sampler, cfg.sampler_seed, cfg.max_steps) == (7, "cmaes", 3, 100_000)
    with pytest.raises(SystemExit):
        tune_parser().parse_args(["--policy", "twp", "--sampler", "random"])


def test_a_field_without_help_cannot_become_a_flag() -> None:
    @dataclasses.dataclass(frozen=True)
    class Bare:
        count: int = 1

    with pytest.raises(TypeError, match=r"Bare\.count has no metadata help"):
        add_config_args(argparse.ArgumentParser(), Bare, ("count",))


def test_train_flags_carry_the_config_fields_defaults_and_help() -> None:
    from servegym.cli_train import TRAIN_FLAGS
    from servegym.rl.config import TrainConfig

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    actions = {a.dest: a for a in sub["train"]._actions}
    by_name = {f.name: f for f in dataclasses.fields(TrainConfig)}
    for name in TRAIN_FLAGS:
        assert actions[name].default == by_name[name].default, name
        assert actions[name].help.startswith(by_name[name].metadata["help"]), name
    assert actions["observation"].choices == ("raw", "scaled") and actions["reward_scale"].type is float
    args = sub["train"].parse_args(["--timesteps", "64", "--observation", "scaled"])
    assert config_args(args, TRAIN_FLAGS)["timesteps"] == 64 and args.observation == "scaled"
