"""The CLI as a user types it: help and config printing are fast and torch-free; bad input fails early."""

from __future__ import annotations

import subprocess
import sys

from grpo_lab.cli import prepare_overrides

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
