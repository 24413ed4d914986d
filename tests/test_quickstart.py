"""The README's quick-start, exactly as typed: SmolLM2-135M from the packaged GGUF, ~8 min on 2 CPU cores."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli


@pytest.mark.slow
def test_quickstart_learns(tmp_path, model_cache):
    proc = run_cli([], tmp_path, model_cache, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "== grpo_lab run `quickstart`: finished ==" in proc.stdout
    (metrics_file,) = (tmp_path / "outputs").rglob("metrics.json")
    metrics = json.loads(metrics_file.read_text())["metrics"]
    assert metrics["train/steps"] == 16
    # The training reward visibly rises, and the model learns the output format.
    assert metrics["train/reward_end"] > metrics["train/reward_start"] + 0.5
    assert metrics["eval_after/format"] > metrics["eval_before/format"] + 0.3
    # The README's claim for the default (seeded) run: an accuracy gain outside its paired 95% interval.
    assert metrics["eval_change/accuracy_ci_low"] > 0, metrics
