"""Overrides in Hydra's grammar: parsed, normalised (`++`), classified (user / sweep machinery) and rendered."""

from __future__ import annotations

import math

import pytest
from hydra.errors import HydraException

from grpo_lab.config import overrides as ov
from grpo_lab.config.overrides import Machinery

GROUPS = {"model", "data", "experiment", "sweep"}


# ------------------------------------------------------------------------------------------------ parse
@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("lr=1e-5", "lr"),
        ("++trainer.loss_type=dr_grpo", "trainer.loss_type"),
        ("+x=1", "x"),
        ("~x", "x"),
        ("model@policy=tiny", "model"),
        ("hydra/launcher=basic", "hydra/launcher"),
        ("lr=1e-5,2e-5", "lr"),
    ],
)
def test_key_is_the_config_key_or_group(text, key):
    assert ov.key(text) == key


def test_bad_override_raises_hydras_own_message():
    with pytest.raises(HydraException, match="it's"):
        ov.parse("name=it's")


def test_as_dict_types_values_like_hydra_and_skips_deletions():
    assert ov.as_dict(["++lr=1e-5", "model=tiny", "+flag=true", "~x", "name='a b'", "n=null", "w=[1,2]"]) == {
        "lr": 1e-5,
        "model": "tiny",
        "flag": True,
        "name": "a b",
        "n": None,
        "w": [1, 2],
    }


# -------------------------------------------------------------------------------------------- normalise
@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ("lr=1e-5", "++lr=1e-5"),
        ("trainer.loss_type=dr_grpo", "++trainer.loss_type=dr_grpo"),
        ("lr=1e-5,2e-5", "++lr=1e-5,2e-5"),  # a multirun sweep of a value
        ("logger.name=mine", "++logger.name=mine"),
        ("model=tiny", "model=tiny"),  # group selections stay plain
        ("model=tiny,smollm2_135m_gguf", "model=tiny,smollm2_135m_gguf"),
        ("hydra/launcher=basic", "hydra/launcher=basic"),
        ("sweep=grpo", "sweep=grpo"),
        ("hydra.verbose=true", "hydra.verbose=true"),  # Hydra's own settings are Hydra's to check
        ("+x=1", "+x=1"),  # the user's explicit forms are kept
        ("++x=1", "++x=1"),
        ("~x", "~x"),
        ("~x=1", "~x=1"),
        ("foo@bar=1", "foo@bar=1"),  # a package override
    ],
)
def test_normalise_force_adds_plain_config_values_only(text, normalised):
    assert ov.normalise(ov.parse(text), GROUPS) == normalised


def test_normalise_is_idempotent_and_as_typed_undoes_it():
    for text in ("lr=1e-5", "model=tiny", "+x=1", "~x", "name=a\\ b", "hydra.verbose=true"):
        once = ov.normalise(ov.parse(text), GROUPS)
        assert ov.normalise(ov.parse(once), GROUPS) == once
        assert ov.as_typed(once) == text


@pytest.mark.parametrize(
    ("text", "element"),
    [
        ("lr=1,2", "++lr"),
        ("model=a,b", "model"),
        ("+x=1,2", "+x"),
        ("++x=1,2", "++x"),
        ("hydra.verbose=1,2", "hydra.verbose"),
    ],
)
def test_key_element_matches_normalise(text, element):
    override = ov.parse(text)
    assert ov.key_element(override, GROUPS) == element
    assert ov.normalise(override, GROUPS).startswith(element + "=")


@pytest.mark.parametrize(
    ("text", "swept"),
    [
        ("lr=1e-5,2e-5", "lr"),
        ("++seed=choice(1,2)", "seed"),
        ("beta=interval(0,1)", "beta"),
        ("model=tiny,smollm2_135m_gguf", "model"),
        ("lr=1e-5", None),
        ("w=[1,2]", None),  # a list is one value, not a sweep
        ("hydra.job.name=a,b", None),
    ],
)
def test_swept_key(text, swept):
    assert ov.swept_key(ov.parse(text)) == swept


# --------------------------------------------------------------------------------------------- classify
@pytest.mark.parametrize(
    ("text", "part"),
    [
        ("hydra.sweep.dir=outputs/x", Machinery.HYDRA),
        ("hydra/launcher=joblib", Machinery.HYDRA),
        ("++hydra.verbose=true", Machinery.HYDRA),
        ("++trial={study:s,number:1}", Machinery.TRIAL),
        ("trial.number=1", Machinery.TRIAL),
        ("sweep=grpo", Machinery.LABEL),
        ("++logger.name=trial_3", Machinery.LABEL),
        ("++logger.group=grpo", Machinery.LABEL),
        ("++lr=1e-5", None),
        ("model=tiny", None),
        ("experiment=smoke", None),
        ("++logger.project=mine", None),
        ("++trials=3", None),  # only `trial` itself is the sweeper's channel
        ("++hydra_like=1", None),
    ],
)
def test_machinery_tells_the_sweepers_overrides_from_the_users(text, part):
    assert ov.machinery(ov.parse(text)) is part


def test_is_group():
    assert ov.is_group(ov.parse("model=tiny"), GROUPS)
    assert ov.is_group(ov.parse("model@policy=tiny"), GROUPS)
    assert ov.is_group(ov.parse("hydra/launcher=basic"), GROUPS)
    assert not ov.is_group(ov.parse("++lr=1e-5"), GROUPS)
    assert not ov.is_group(ov.parse("model.name_or_path=x"), GROUPS)


TRIAL = [
    "experiment=smoke",
    "sweep=grpo",
    "++max_steps=2",
    "+x=1",
    "++lr=2e-05",
    "++trial={study:grpo,storage:sqlite\\:///outputs/sweeps/optuna.db,number:3,id:4,pruner:null}",
    "hydra.sweep.dir=outputs/sweeps/grpo",
    "hydra.sweep.subdir=trial_3",
    "++logger.group=grpo",
    "++logger.name=trial_3",
]


def test_user_overrides_are_as_typed_without_the_machinery():
    assert ov.user_overrides(TRIAL) == ["experiment=smoke", "max_steps=2", "+x=1", "lr=2e-05"]
    assert ov.user_overrides(iter(TRIAL)) == ov.user_overrides(TRIAL)  # any iterable, read once


def test_without_keeps_the_rest_unchanged():
    kept = ov.without(TRIAL, Machinery.HYDRA, Machinery.TRIAL)
    assert kept == [t for t in TRIAL if not t.startswith(("hydra.", "++trial="))]
    assert ov.without(TRIAL) == TRIAL


# ----------------------------------------------------------------------------------------------- render
VALUES = [
    0,
    -3,
    1e-5,
    0.1,
    float("inf"),
    float("nan"),
    True,
    False,
    None,
    "tiny",
    "",
    "a b",
    " leading and trailing ",
    "a,b",
    "k=v",
    "f(x)",
    "[not a list]",
    "{not: a dict}",
    "sqlite:///outputs/sweeps/optuna.db",
    "postgresql://user:p@ss@host:5432/db",
    "C:\\path\\to",
    "it's",
    'say "hi"',
    "both ' and \"",
    "a\\'b",
    "true",
    "null",
    "1",
    "1e-5",
    "nan",
    "${oc.env:HOME}",
    "tab\there",
    "glob(*)",
    [1, "a b", None, [2.5]],
    {"study": "my study", "storage": "sqlite:///x.db", "number": 3, "pruner": None, "tags": ["a", "b"]},
]


def _same(a, b) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_render_value_parses_back_to_the_same_value(value):
    parsed = ov.parse(ov.render("++key", value)).value()
    assert _same(parsed, value), (ov.render_value(value), parsed)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("a b", "a\\ b"),  # Hydra's escapes where they suffice
        ("a,b", "a\\,b"),
        ("sqlite:///x.db", "sqlite\\:///x.db"),
        ("it's", "'it\\'s'"),  # quotes where escapes cannot do
        ('say "hi"', "'say \"hi\"'"),
        ("true", "'true'"),  # a string that would read as another type
        ("1", "'1'"),
        (2e-05, "2e-05"),
        (None, "null"),
        ([1, "a b"], "[1,a\\ b]"),
        ({"study": "s", "pruner": None}, "{study:s,pruner:null}"),
    ],
)
def test_render_value_text(value, text):
    assert ov.render_value(value) == text


def test_render_value_refuses_what_the_grammar_cannot_hold():
    with pytest.raises(TypeError, match="object"):
        ov.render_value(object())


def test_as_typed_drops_only_the_force_add():
    assert [ov.as_typed(t) for t in ("++lr=1", "+x=1", "~x", "model=tiny")] == ["lr=1", "+x=1", "~x", "model=tiny"]


# ---------------------------------------------------------------------------------- where they are used
def test_cli_normalises_only_the_overrides_in_argv():
    from grpo_lab.cli import prepare_overrides

    args, swept = prepare_overrides(["-cn", "config", "--cfg", "job", "x=1", "--package", "a=b", "seed=1,2"])
    assert args == ["-cn", "config", "--cfg", "job", "++x=1", "--package", "a=b", "++seed=1,2"]
    assert swept == ["seed"]


def test_a_group_only_a_config_dir_has_is_selected_not_set(tmp_path):
    from grpo_lab.cli import prepare_overrides

    (tmp_path / "curriculum").mkdir()
    for flag in (["--config-dir", str(tmp_path)], ["-cd", str(tmp_path)], [f"--config-dir={tmp_path}"]):
        args, _ = prepare_overrides([*flag, "curriculum=short", "lr=1"])
        assert args == [*flag, "curriculum=short", "++lr=1"]
    assert prepare_overrides(["curriculum=short"])[0] == ["++curriculum=short"]  # without it: a value


def test_the_command_line_is_checked_before_hydra_writes_anything(tmp_path):
    from grpo_lab import command
    from grpo_lab.cli import prepare_overrides
    from grpo_lab.errors import ConfigError

    def checked(*args: str) -> list[str]:
        prepared = prepare_overrides(list(args))[0]
        return command.checked(prepared, [i for i, a in enumerate(prepared) if "=" in a and not a.startswith("-")])

    assert checked("lr=1e-5") == ["++lr=1e-5"]  # nothing to check: as prepared
    assert checked("-m", "lr=1e-5,2e-5", f"hydra.sweep.dir={tmp_path / 'new'}")[0] == "-m"
    full = tmp_path / "full"
    (full / "0").mkdir(parents=True)
    with pytest.raises(ConfigError, match="is not empty: a new grid would write over it"):
        checked("-m", "lr=1e-5,2e-5", f"hydra.sweep.dir={full}")
    with pytest.raises(ConfigError, match="is not empty: a new run would write over it"):
        checked("lr=1e-5", f"hydra.run.dir={full}")
    (full / "0" / "metrics.json").write_text("{}")
    with pytest.raises(ConfigError, match="holds a multirun already"):
        checked("-m", "lr=1e-5,2e-5", f"hydra.sweep.dir={full}")
    assert checked("lr=1e-5", "hydra.run.dir=outputs/${now:%H}")[-1] == "hydra.run.dir=outputs/${now:%H}"
    with pytest.raises(ConfigError, match="`sweep=lr_beta` is an Optuna sweep, which runs with -m"):
        checked("sweep=lr_beta", "experiment=smoke")
    with pytest.raises(ConfigError, match="no such run folder"):
        checked(f"resume={tmp_path / 'none'}")
    with pytest.raises(ConfigError, match="takes no -m"):
        checked("-m", f"resume={full}")
    with pytest.raises(ConfigError, match="is the folder of a grid or a sweep"):
        (full / "multirun.yaml").write_text("{}")
        checked(f"resume={full}")
    # Hydra's own refusal is a ValueError with its traceback; one job's config is shown without -m.
    with pytest.raises(ConfigError, match="--cfg shows one job's config and takes no -m"):
        checked("-m", "lr=1e-5,2e-5", "--cfg", "job")
    assert checked("lr=1e-5", "--cfg", "job")[-2:] == ["--cfg", "job"] and checked("-m", "--help")


def test_sweep_space_and_rerun_command_round_trip():
    from grpo_lab.evaluation.ranking import rerun_command
    from grpo_lab.sweep.space import parse_space

    space = parse_space({"lr": "interval(1e-6, 1e-4)", "trainer.x": "5"}, ["model=tiny", "name='a b'"], GROUPS)
    assert space.fixed == ("++trainer.x=5", "model=tiny", "++name='a b'")
    trial = space.overrides_for({"lr": 2e-5})
    assert trial[-1] == "++lr=2e-05"
    command = rerun_command([*trial, "++trial={number:1}", "hydra.sweep.subdir=trial_1", "++logger.name=trial_1"])
    assert command == "python -m grpo_lab trainer.x=5 model=tiny 'name='\"'\"'a b'\"'\"'' lr=2e-05"


def test_leaderboard_varies_typed_parameters():
    from grpo_lab.compare.leaderboard import vary
    from grpo_lab.compare.sources import RunRecord

    runs = [
        RunRecord("a", "finished", 1.0, overrides=["experiment=smoke", "lr=1e-5", "model=tiny"]),
        RunRecord("b", "finished", 2.0, overrides=["experiment=smoke", "lr=2e-5", "model=tiny", "+x=[1,2]"]),
    ]
    assert vary(runs) == ["lr", "x"]
    assert runs[0].params == {"lr": 1e-5} and runs[1].params == {"lr": 2e-5, "x": [1, 2]}
