"""The wheel works outside this checkout: built, installed into a fresh venv, run from a user's own repository.

The fresh venv sees the already-installed dependencies through a .pth file (nothing is downloaded but, without
hatchling installed, the build backend), never this checkout's src/.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import FAST, REPO, cli_env

# One worker runs this module: its module-scoped run is made once, not once per pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("packaging")

SHIPPED_EXPERIMENTS = {p.name for p in (REPO / "conf" / "experiment").glob("*.yaml")}

MY_REWARDS = '''
def brevity(completions, **kwargs):
    """Shorter is better: 1 / (1 + characters)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 / (1.0 + len(text)) for text in texts]
'''


def _preset(name: str, *defaults: str) -> str:
    return "\n".join(["# @package _global_", "defaults:", *(f"  - {d}" for d in defaults), f"name: {name}", ""])


def _sh(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, **kwargs)
    assert proc.returncode == 0, f"{args}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed (no deps: it sees ours through a .pth file); its bin/ folder."""
    root = tmp_path_factory.mktemp("packaging")
    # hatchling installed (the dev extra): build offline; else pip fetches it into an isolated build env.
    no_isolation = ["--no-build-isolation"] if importlib.util.find_spec("hatchling") else []
    _sh([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *no_isolation, "-w", str(root / "dist"), str(REPO)])
    (wheel,) = (root / "dist").glob("grpo_lab-*.whl")
    env_dir = root / "venv"
    _sh([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    python = env_dir / "bin" / "python"
    purelib = _sh([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    user_site = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
    deps = [p for p in dict.fromkeys([*site.getsitepackages(), *user_site]) if Path(p).is_dir()]
    # Plain lines of a .pth only extend sys.path: the .pth files in there (our editable install's) are not read.
    (Path(purelib) / "_grpo_lab_test_deps.pth").write_text("\n".join(deps) + "\n")
    _sh([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)])
    probe = "import grpo_lab, grpo_lab.paths as p, sys; print(grpo_lab.__file__); print(p.CONF_DIR); print(sys.path)"
    where, conf, path = _sh([str(python), "-c", probe], cwd=root, env=_env(root)).stdout.splitlines()
    assert Path(where).is_relative_to(env_dir) and Path(conf) == Path(where).parent / "conf", (where, conf)
    assert str(REPO / "src") not in path
    return env_dir / "bin"


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = cli_env(cache, **extra)
    env.pop("PYTHONPATH", None)
    return env


@pytest.fixture
def user_repo(tmp_path) -> Path:
    """A user's own repository (a git checkout): their preset, their reward group and reward module."""
    (tmp_path / "my_rewards.py").write_text(MY_REWARDS)
    conf = tmp_path / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "reward").mkdir()
    (conf / "experiment" / "mine.yaml").write_text(_preset("mine", "smoke", "override /reward: brevity"))
    (conf / "reward" / "brevity.yaml").write_text(
        "functions:\n  brevity: {_target_: my_rewards.brevity}\nweights:\n  brevity: 1.0\n"
    )
    if shutil.which("git"):
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]
        _sh([*git, "init", "-q"], cwd=tmp_path)
        _sh([*git, "add", "."], cwd=tmp_path)
        _sh([*git, "commit", "-q", "-m", "mine"], cwd=tmp_path)
    return tmp_path


def _run_folder(cwd: Path) -> Path:
    (metrics,) = (cwd / "outputs" / "runs").rglob("metrics.json")
    return metrics.parent


@pytest.mark.heavy
def test_the_wheel_runs_smoke_and_the_users_own_preset(venv, user_repo, model_cache):
    # Our preset, from the user's repository: the configs come from the installed package.
    proc = subprocess.run(
        [str(venv / "grpo-lab"), *FAST], cwd=user_repo, env=_env(model_cache), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = _run_folder(user_repo)
    assert json.loads((run / "metrics.json").read_text())["status"] == "finished"
    assert yaml.safe_load((run / "config.yaml").read_text())["name"] == "smoke"
    git = json.loads((run / "environment.json").read_text())["git"]
    if shutil.which("git"):  # the user's repository, not where grpo_lab is installed
        head = _sh(["git", "rev-parse", "HEAD"], cwd=user_repo).stdout.strip()
        assert git == {"commit": head, "dirty": False}
    shutil.rmtree(user_repo / "outputs")

    # Their preset, on top of ours, with their reward module (./my_rewards.py) and GRPO_LAB_CONFIG relative.
    fast = [a for a in FAST if not a.startswith("experiment=")]
    env = _env(model_cache, GRPO_LAB_CONFIG="conf")
    proc = subprocess.run(
        [str(venv / "grpo-lab"), "experiment=mine", *fast], cwd=user_repo, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = _run_folder(user_repo)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["status"] == "finished" and metrics["run_name"].startswith("mine")
    assert "train/rewards/brevity/mean" in metrics["metrics"]
    assert yaml.safe_load((run / "config.yaml").read_text())["reward"]["weights"]["brevity"] == 1.0

    # The winner is exported into the user's config folder, not into the installed package.
    proc = subprocess.run(
        [str(venv / "python"), "-m", "grpo_lab.compare", "outputs/runs", "--export", "best", "--no-plots"],
        cwd=user_repo,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "  - mine" in (user_repo / "conf" / "experiment" / "best.yaml").read_text()
    assert "python -m grpo_lab experiment=best" in proc.stdout  # the command that re-runs it
    shipped = next((venv.parent / "lib").glob("python*/site-packages/grpo_lab/conf/experiment"))
    assert {p.name for p in shipped.iterdir()} == SHIPPED_EXPERIMENTS


def test_users_folders_come_first(venv, tmp_path, model_cache):
    """`--config-dir` beats `$GRPO_LAB_CONFIG`, which beats ours, file by file; user sweeps replace ours too."""
    team, mine = tmp_path / "team", tmp_path / "mine"
    for folder in (team, mine):
        (folder / "experiment").mkdir(parents=True)
        (folder / "experiment" / "smoke.yaml").write_text(_preset(f"{folder.name}_smoke", "override /model: tiny"))
    (team / "sweeps").mkdir()
    (team / "sweeps" / "lr_beta.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /hydra/sweeper: grpo_optuna\n"
        "hydra:\n  sweeper:\n    study_name: team\n"
    )

    def composed(*args: str) -> dict:
        proc = _sh(
            [str(venv / "grpo-lab"), "--cfg", "all", *args], cwd=tmp_path, env=_env(model_cache, GRPO_LAB_CONFIG="team")
        )
        return yaml.safe_load(proc.stdout)

    team_cfg = composed("experiment=smoke", "sweep=lr_beta")
    assert team_cfg["name"] == "team_smoke" and team_cfg["hydra"]["sweeper"]["study_name"] == "team"
    assert composed("--config-dir", str(mine), "experiment=smoke")["name"] == "mine_smoke"
