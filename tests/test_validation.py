"""One way to report a bad value: the sweeper's settings as declared data, and errors that carry their key."""

from __future__ import annotations

import pickle

import pytest
from omegaconf import OmegaConf

from grpo_lab.config.problems import Problem, fail
from grpo_lab.config.sweep import SweeperSettings, check
from grpo_lab.errors import ConfigError

from conftest import one_line_naming, run_cli

SWEEP = ["-m", "sweep=lr_beta", "experiment=smoke", "max_steps=1"]


def _settings(**changes: object) -> object:
    """The sweeper's settings as Hydra hands them over: the schema's defaults, a sampler and a pruner."""
    schema = OmegaConf.to_container(OmegaConf.structured(SweeperSettings))
    settings = {k: v for k, v in schema.items() if k not in ("_target_", "_recursive_", "defaults")}
    settings |= {"sampler": {"_target_": "optuna.samplers.TPESampler"}, "pruner": {"_target_": "x.P"}}
    return OmegaConf.create(settings | changes)


def test_the_shipped_defaults_pass():
    assert check(_settings()).keep_models == "best"


@pytest.mark.parametrize(
    ("changes", "key", "kind", "nearest"),
    [
        ({"keep_models": "bets"}, "hydra.sweeper.keep_models", "choice", "best"),
        ({"n_trials": 0}, "hydra.sweeper.n_trials", "range", None),
        ({"confirm": {"top_k": -1, "seeds": 2}}, "hydra.sweeper.confirm.top_k", "range", None),
        (
            {"objectives": [{"metric": "train/kl", "direction": "maxim"}]},
            "hydra.sweeper.objectives.0.direction",
            "choice",
            "maximize",
        ),
        ({"max_failure_fraction": 1.5}, "hydra.sweeper.max_failure_fraction", "range", None),
    ],
)
def test_a_bad_sweeper_value_names_its_key(changes, key, kind, nearest):
    with pytest.raises(ConfigError) as info:
        check(_settings(**changes))
    assert (info.value.key, info.value.kind, info.value.problems[0].near) == (key, kind, nearest)
    one_line_naming(info.value, f"`{key}")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("hydra.sweeper.n_trial=1", "hydra.sweeper.n_trial"),  # Hydra refuses it while composing
        ("hydra.sweeper.confirm.seedz=2", "hydra.sweeper.confirm.seedz"),
        ("hydra.sweeper.n_trials=abc", "hydra.sweeper.n_trials"),
        ("hydra.sweeper.keep_models=bets", "hydra.sweeper.keep_models"),  # the sweeper refuses it at its start
    ],
)
def test_cli_refuses_a_bad_sweeper_setting_in_one_line_before_the_study(override, key, tmp_path, model_cache):
    proc = run_cli([*SWEEP, override], tmp_path, model_cache, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    one_line_naming(line, f"`{key}")
    assert not (tmp_path / "outputs").exists()  # no study, no trial folder


def test_a_hydra_refusal_names_the_nearest_sweeper_key(tmp_path, model_cache):
    proc = run_cli([*SWEEP, "hydra.sweeper.n_trial=1"], tmp_path, model_cache, timeout=120)
    assert "`hydra.sweeper.n_trials`" in proc.stderr


def test_a_config_error_keeps_its_key_across_processes():
    error = fail(Problem("trainer.top_p", "range", 1.5, "be <= 1"), Problem("trainer.top_q", "unknown_key"))
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.key, copy.kind, str(copy), copy.problems) == ("trainer.top_p", "range", str(error), error.problems)
