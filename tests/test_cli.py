"""The CLI as a user types it: help and config printing are fast and torch-free; bad input fails early."""

from __future__ import annotations

import argparse
import subprocess
import sys

from grpo_lab.cli import parse_flags, prepare_overrides

from conftest import REPO, cli_env, run_cli


def test_plain_overrides_become_force_adds_but_groups_do_not():
    args, swept = prepare_overrides(
        [
            "-m",
            "experiment=smoke",
            "lr=1e-5,2e-5",
            "trainer.loss_type=dr_grpo",
            "+x=1",
            "hydra.verbose=true",
            "--config-name",
            "config",
            "hydra/launcher=basic",
        ]
    )
    assert args == [
        "-m",
        "experiment=smoke",
        "++lr=1e-5,2e-5",
        "++trainer.loss_type=dr_grpo",
        "+x=1",
        "hydra.verbose=true",
        "--config-name",
        "config",
        "hydra/launcher=basic",
    ]
    assert swept == ["lr"]


def test_grpo_labs_own_options_leave_hydras_arguments_in_order(monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--prompts", type=int, default=8)
    argv = ["-m", "--prompts", "3", "lr=1e-5,2e-5", "--cfg", "job", "--verbose", "-cn", "config", "--help"]
    options, rest = parse_flags(argv, parser)
    assert (options.prompts, options.verbose) == (3, True)
    assert rest == ["-m", "lr=1e-5,2e-5", "--cfg", "job", "-cn", "config", "--help"]
    assert parse_flags(["x=1"]) == (argparse.Namespace(verbose=False), ["x=1"])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # Hydra's own switch for full tracebacks asks for them too
    assert parse_flags(["x=1"])[0].verbose


def _python_importtime(args: list[str], tmp_path, model_cache) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "grpo_lab", *args],
        cwd=tmp_path,
        env=cli_env(model_cache),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cfg_job_prints_the_config_without_torch(tmp_path, model_cache):
    proc = _python_importtime(["--cfg", "job", "experiment=smoke", "lr=2e-5"], tmp_path, model_cache)
    assert proc.returncode == 0, proc.stderr
    assert "lr: 2.0e-05" in proc.stdout
    assert "name_or_path: builtin:tiny-llama" in proc.stdout
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "torch" not in imported and "transformers" not in imported and "trl" not in imported


def test_help_lists_groups_without_torch(tmp_path, model_cache):
    proc = _python_importtime(["--help"], tmp_path, model_cache)
    assert proc.returncode == 0, proc.stderr
    for group in ("model:", "data:", "reward:", "optimizer:", "trainer:", "logger:", "launcher:", "experiment:"):
        assert group in proc.stdout
    assert "smollm2_135m_gguf" in proc.stdout and "smoke" in proc.stdout
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "torch" not in imported


def _groups(help_text: str) -> dict[str, list[str]]:
    """The `group: a, b` lines of a help text, without the groups' shared `_` bases."""
    lines = help_text.split("== Config groups ==")[1].split("== Config ==")[0].splitlines()
    pairs = [line.split(": ", 1) for line in lines if ": " in line]
    return {group: [o for o in options.split(", ") if not o.startswith("_")] for group, options in pairs}


def test_help_lists_what_hydra_lists_and_the_chosen_values(tmp_path, model_cache):
    """grpo_lab's own listing (no `--config-dir`) against Hydra's (`--config-dir` makes grpo_lab leave the help to
    Hydra), with a user's folder adding an option and a sweep; the knob line shows the overrides' values."""
    user = tmp_path / "team"
    (user / "model").mkdir(parents=True)
    (user / "sweeps").mkdir()
    (user / "model" / "my_model.yaml").write_text("defaults: [tiny]\n")
    (user / "sweeps" / "my_sweep.yaml").write_text("# @package _global_\nname: mine\n")
    env = cli_env(model_cache, GRPO_LAB_CONFIG=str(user))
    ours = subprocess.run(
        [sys.executable, "-m", "grpo_lab", "--help", "experiment=smoke", "beta=0.5", "-m", "lr=1e-5,2e-5"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    hydras = subprocess.run(
        [sys.executable, "-m", "grpo_lab", "--help", "--config-dir", str(empty)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ours.returncode == 0 and hydras.returncode == 0, ours.stderr + hydras.stderr
    assert _groups(ours.stdout) == _groups(hydras.stdout)
    assert "my_model" in _groups(ours.stdout)["model"] and "my_sweep" in _groups(ours.stdout)["sweep"]
    assert "_base" not in ours.stdout and "_base" in hydras.stdout
    assert "lr=0.0001  beta=0.5  num_generations=4" in ours.stdout  # smoke's lr (the grid's is left out)


def test_typo_fails_fast_with_suggestion_and_no_wandb_run(tmp_path, model_cache):
    proc = run_cli(["experiment=smoke", "num_generation=4"], tmp_path, model_cache, timeout=60)
    assert proc.returncode == 1
    assert "Did you mean `num_generations`?" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("*.wandb"))


def test_invalid_batch_fails_before_any_model(tmp_path, model_cache):
    proc = run_cli(["experiment=smoke", "num_generations=3"], tmp_path, model_cache, timeout=60)
    assert proc.returncode == 1
    assert "not a multiple of num_generations=3" in proc.stderr
    assert not list(tmp_path.rglob("*.wandb"))


def test_readme_names_the_commands_it_promises():
    readme = (REPO / "README.md").read_text()
    for command in (
        "make demo",
        "make test",
        "python -m grpo_lab experiment=smoke",
        "python -m grpo_lab -m experiment=smoke lr=1e-5,2e-5",
        "python -m grpo_lab.check_rewards",
        "python -m grpo_lab.doctor",
    ):
        assert command in readme, command


def test_unreachable_hub_model_fails_fast_and_names_offline_choices(tmp_path, model_cache):
    proc = run_cli(["experiment=smoke", "model=smollm2_135m"], tmp_path, model_cache, timeout=60)
    assert proc.returncode == 1
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in proc.stderr
    assert "model=smollm2_135m_gguf" in proc.stderr and "model=tiny" in proc.stderr
    assert not list(tmp_path.rglob("*.wandb"))


def test_missing_data_file_fails_clearly(tmp_path, model_cache):
    proc = run_cli(["experiment=smoke", "data=jsonl", "data.path=nope.jsonl"], tmp_path, model_cache, timeout=60)
    assert proc.returncode == 1
    assert "nope.jsonl" in proc.stderr
    assert not list(tmp_path.rglob("*.wandb"))
