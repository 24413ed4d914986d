"""Every command in the README runs in a test.

The commands are read from the README's ```bash blocks. Each one must have an entry in CHECKS, else the test
fails (a command added to the README without a test is caught here):

- `Run`: fast commands (`--help`, `--cfg job`, doctor) really run, as typed.
- `Compose`: commands that train (or sample a model) are composed exactly as `python -m grpo_lab` composes them
  (Hydra's config, the sweeper's settings included) and validated by grpo_lab's and TRL's own checks, in
  this process and without a model; the entry names the test that runs the same command for real
  (smoke-sized where the real one takes minutes), and that test must exist.
- `Compare`: the arguments are parsed by `grpo_lab.compare`'s own parser; the named test runs it on a folder.
- `Make`: the Makefile target runs exactly the command the README says, and the named test runs that command.

`$ command` lines in the README's ```text blocks (example outputs) run too, and print what the README shows.
The grpo_lab commands of docs/*.md's bash blocks are composed and validated the same way (where they run for
real is the page's topic's test file).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

import pytest

from conftest import REPO, run_cli

README = REPO / "README.md"


@dataclass(frozen=True)
class Run:
    expect: str  # printed on stdout
    codes: tuple[int, ...] = (0,)


@dataclass(frozen=True)
class Compose:
    covered_by: str  # tests/<file>.py::<test>: runs the same command for real


@dataclass(frozen=True)
class Compare:
    covered_by: str


@dataclass(frozen=True)
class Serve:
    """A service that runs until stopped: its arguments parsed by its own parser; the named test runs it."""

    parser: str  # module:function returning its argparse parser
    covered_by: str


@dataclass(frozen=True)
class Make:
    recipe: str  # the target's command line in the Makefile
    covered_by: str


E2E_SMOKE = "tests/test_e2e.py::test_smoke_run_writes_the_run_folder"
SWEEP_AND_COMPARE = "tests/test_compare.py::test_a_sweep_folder_compares_its_study"

MACHINES = "tests/test_machines.py::test_two_machines_on_loopback_train_one_job_recorded_once"
MACHINE = "python -m grpo_lab experiment=smoke launcher=ddp launcher.num_processes=2 launcher.num_machines=2 "
PROXY = "python -m grpo_lab.sweep.proxy postgresql+psycopg2://postgres:postgres@127.0.0.1:5432/postgres --port 13000"
GRPC_WORKERS = "tests/test_storage.py::test_eight_workers_through_the_grpc_proxy_run_exactly_n_trials"

CHECKS: dict[str, Run | Compose | Compare | Make | Serve] = {
    "make demo": Make("$(PY) -m grpo_lab", "tests/test_quickstart.py::test_quickstart_learns"),
    "make test": Make("$(PY) -m pytest", "tests/test_readme.py::test_every_readme_command_has_a_check"),
    "make test-full": Make(
        '$(PY) -m pytest -m "not slow"', "tests/test_readme.py::test_every_readme_command_has_a_check"
    ),
    "python -m grpo_lab": Compose("tests/test_quickstart.py::test_quickstart_learns"),
    "python -m grpo_lab experiment=smoke": Compose(E2E_SMOKE),
    "python -m grpo_lab experiment=smoke lr=3e-5 beta=0.1 trainer.loss_type=dr_grpo": Compose(
        "tests/test_config.py::test_any_grpo_field_can_be_set_under_trainer"
    ),
    "python -m grpo_lab -m experiment=smoke lr=1e-5,2e-5": Compose(
        "tests/test_e2e.py::test_grid_gives_one_run_per_job_in_one_group"
    ),
    "python -m grpo_lab --help": Run("== Config groups =="),
    "python -m grpo_lab experiment=smoke eval.every_n_steps=2 output.keep=best": Run("kept         step "),
    "python -m grpo_lab --cfg job experiment=smoke": Run("name: smoke"),
    "python -m grpo_lab -m sweep=lr_beta experiment=smoke hydra.sweeper.n_trials=4": Compose(SWEEP_AND_COMPARE),
    "python -m grpo_lab.compare outputs/sweeps/lr_beta": Compare(SWEEP_AND_COMPARE),
    # It samples the tiny model (~8 s idle, ~30 s on busy cores): the named test runs it with --prompts 4.
    "python -m grpo_lab.check_rewards experiment=smoke": Compose(
        "tests/test_health.py::test_check_rewards_sees_a_signal_and_its_absence"
    ),
    "python -m grpo_lab experiment=code_smoke": Compose(
        "tests/test_code.py::test_code_smoke_runs_the_whole_path_and_ends_with_pass_at_1"
    ),
    "python -m grpo_lab -m experiment=code_smoke lr=1e-5,2e-5": Compose(
        "tests/test_code.py::test_a_code_smoke_grid_ends_with_its_leaderboard_on_pass_at_1"
    ),
    "python -m grpo_lab experiment=code_humaneval": Compose(
        "tests/test_code.py::test_code_humaneval_ends_with_held_out_pass_at_1"
    ),
    "python -m grpo_lab experiment=smoke 'reward.schedule.length=[[0,1.0],[0.5,0.2]]'": Compose(
        "tests/test_schedule.py::test_a_smoke_run_applies_the_schedule_at_every_step"
    ),
    "python -m grpo_lab -m sweep=curriculum experiment=smoke hydra.sweeper.n_trials=3": Compose(
        "tests/test_schedule.py::test_the_curriculum_sweep_varies_the_schedules"
    ),
    MACHINE + "launcher.main_process_ip=127.0.0.1 launcher.machine_rank=0": Compose(MACHINES),
    MACHINE + "launcher.main_process_ip=127.0.0.1 launcher.machine_rank=1": Compose(MACHINES),
    "python -m grpo_lab -m sweep=grpo experiment=gsm8k_qwen05b hydra/launcher=submitit_slurm hydra.launcher.nodes=2 "
    "hydra.launcher.tasks_per_node=1 hydra.launcher.gpus_per_node=8 launcher=ddp launcher.num_processes=16": Compose(
        "tests/test_machines.py::test_a_sweep_trial_across_two_submitit_tasks_gives_one_objective"
    ),
    PROXY: Serve("grpo_lab.sweep.proxy:parser", GRPC_WORKERS),
    "python -m grpo_lab -m sweep=lr_beta experiment=smoke hydra.sweeper.storage=grpc://127.0.0.1:13000 "
    "hydra.sweeper.n_trials=8": Compose(GRPC_WORKERS),
    # Exit 1 is the doctor's answer on a machine that cannot run the quick-start (it names the blocker).
    "python -m grpo_lab.doctor": Run("== grpo_lab doctor ==", codes=(0, 1)),
}


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def readme_commands(text: str) -> list[str]:
    """The commands of the ```bash blocks: continuation lines joined, comments dropped, spaces normalised."""
    commands = []
    for block in _blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(shlex.join(words))
    return commands


def _test_exists(node: str) -> bool:
    path, _, name = node.partition("::")
    file = REPO / path
    return file.is_file() and re.search(rf"^def {re.escape(name)}\(", file.read_text(), flags=re.M) is not None


COMMANDS = readme_commands(README.read_text())


def test_every_readme_command_has_a_check():
    assert COMMANDS, "no ```bash blocks found in README.md"
    missing = [c for c in COMMANDS if c not in CHECKS]
    assert not missing, f"README commands without a test: add them to CHECKS in tests/test_readme.py: {missing}"
    stale = [c for c in CHECKS if c not in COMMANDS]
    assert not stale, f"CHECKS entries whose command is no longer in README.md: {stale}"
    for command, check in CHECKS.items():
        if isinstance(check, Compose | Compare | Make | Serve):
            assert _test_exists(check.covered_by), f"{command}: no test {check.covered_by}"


def _of(kind: type) -> list[str]:
    return [c for c in COMMANDS if isinstance(CHECKS.get(c), kind)]


@pytest.mark.parametrize("command", _of(Make))
def test_make_targets_run_what_the_readme_says(command):
    check = CHECKS[command]
    target = command.split()[1]
    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert recipe, f"no `{target}` target in the Makefile"
    assert recipe.group(1).strip() == check.recipe


@pytest.mark.parametrize("command", _of(Serve))
def test_service_commands_parse(command):
    import importlib

    module, _, function = CHECKS[command].parser.partition(":")
    parser = getattr(importlib.import_module(module), function)()
    parser.parse_args(shlex.split(command)[3:])  # exits 2 on an argument its parser does not take


@pytest.mark.parametrize("command", _of(Run))
def test_fast_commands_run_as_typed(command, tmp_path, model_cache):
    check = CHECKS[command]
    module, *args = shlex.split(command)[2:]
    proc = run_cli(args, tmp_path, model_cache, timeout=180, module=module, fresh=True)  # as typed: a new interpreter
    assert proc.returncode in check.codes, proc.stderr[-3000:]
    assert check.expect in proc.stdout, proc.stdout[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def _grid_points(args: list[str]) -> list[list[str]]:
    """A grid's `key=a,b` as one argument list per value (Hydra's own parser splits the values)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    points: list[list[str]] = [[]]
    for arg in args:
        override = OverridesParser.create().parse_override(arg)
        if override.is_sweep_override() and not arg.startswith("hydra."):
            values = list(override.sweep_string_iterator())
            points = [[*p, f"{override.get_key_element()}={v}"] for p in points for v in values]
        else:
            points = [[*p, arg] for p in points]
    return points


def _compose_and_validate(args: list[str], trl: bool = True) -> None:
    """What `python -m grpo_lab ARGS` checks before it loads a model: Hydra's composition (the hydra node and
    the sweeper's settings too), grpo_lab's config validation and TRL's, transformers' and peft's checks."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from grpo_lab import config
    from grpo_lab.cli import prepare_overrides
    from grpo_lab.paths import CONF_DIR

    overrides, _ = prepare_overrides(args)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        del cfg["hydra"]
    config.load(cfg, libraries=trl)


def _compose_command(words: list[str], trl: bool = True) -> None:
    args = words[1:] if words[0] == "grpo-lab" else words[3:]
    multirun = "-m" in args
    args = [a for a in args if a not in ("-m", "--multirun")]
    for point in _grid_points(args) if multirun else [args]:
        _compose_and_validate(point, trl=trl)


@pytest.mark.parametrize("command", _of(Compose))
def test_training_commands_compose_and_validate(command):
    _compose_command(shlex.split(command))


@pytest.mark.parametrize("command", _of(Compare))
def test_compare_commands_parse(command):
    from grpo_lab.compare.__main__ import parser

    args = parser().parse_args(shlex.split(command)[3:])
    assert args.source


def test_example_outputs_show_what_the_command_prints(tmp_path, model_cache):
    """`$ python -m grpo_lab ...` lines in ```text blocks: the output lines the README shows after them."""
    examples = []
    for block in _blocks(README.read_text(), "text"):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("$ "):
                shown = []
                for out in lines[i + 1 :]:
                    if out.startswith("$ "):
                        break
                    shown.append(out)
                examples.append((line[2:], shown))
    for command, shown in examples:
        words = shlex.split(command)
        assert words[:2] == ["python", "-m"], command
        proc = run_cli(words[3:], tmp_path, model_cache, timeout=120, module=words[2], fresh=True)
        printed = proc.stdout + proc.stderr
        for out in shown:
            if out.strip() and out.strip() != "...":
                assert out.strip() in printed, f"{command}: {out!r} not in\n{printed[-3000:]}"


def test_readme_is_a_door():
    """The README stays short: the depth is in docs/, and every page it links exists."""
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).is_file(), link
    for page in (REPO / "docs").glob("*.md"):
        for link in re.findall(r"\]\(([^)#:]+\.md)", page.read_text()):
            assert (page.parent / link).is_file(), f"{page.name}: {link}"


@pytest.mark.parametrize(
    "args",
    [
        ["experiment=smoke", "trainer.loss_type=dr_grop"],  # TRL's choices
        ["experiment=smoke", "num_generation=4"],  # grpo_lab's unknown key
        ["sweep=lr_beta", "hydra.sweeper.n_trialz=4"],  # the sweeper's settings
        ["experiment=smok"],  # a group option
    ],
)
def test_composing_catches_what_the_cli_would_refuse(args):
    """The Compose check has teeth: a README command with any of these mistakes fails it."""
    with pytest.raises(Exception):  # noqa: B017 (ConfigError, or Hydra's own composition errors)
        _compose_and_validate(args)


# docs/ commands that cannot compose in this checkout, and where they are run instead.
DOCS_ELSEWHERE = {
    # the preset `compare --export` writes
    "experiment=lr_beta_best": "tests/test_compare.py::test_export_the_best_and_run_it_again",
}


def docs_commands(module: str = "grpo_lab") -> list:
    """`[path/]python -m grpo_lab ...` / `grpo-lab ...` lines of docs/*.md bash blocks (leading VAR=value dropped).
    Blocks that write files first (heredocs: docs/own-repo.md's session) are tests/test_packaging.py's."""
    found = []
    for page in sorted((REPO / "docs").glob("*.md")):
        for block in _blocks(page.read_text(), "bash"):
            if "<<" in block:
                continue
            for command in readme_commands(f"```bash\n{block}```\n"):
                words = shlex.split(command)
                while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                    words = words[1:]
                # `python`, or another environment's (`.venv-vllm/bin/python`: docs/distributed.md's vLLM commands)
                python = bool(words) and words[0].rsplit("/", 1)[-1] == "python"
                ours = (python and words[1:3] == ["-m", module]) or (module == "grpo_lab" and words[:1] == ["grpo-lab"])
                if ours and not any(skip in command for skip in DOCS_ELSEWHERE):
                    found.append(pytest.param(words, id=f"{page.name}: {shlex.join(words)}"))
    return found


@pytest.mark.parametrize("words", docs_commands())
def test_docs_commands_compose_and_validate(words):
    """Every grpo_lab command in docs/ names groups, keys and values that exist. vLLM's settings are checked
    by TRL only where vLLM is installed (TRL refuses `use_vllm` without it, as the CLI does)."""
    import importlib.util

    vllm_missing = "vllm" in " ".join(words) and importlib.util.find_spec("vllm") is None
    _compose_command(words, trl=not vllm_missing)


@pytest.mark.parametrize("words", docs_commands("grpo_lab.compare"))
def test_docs_compare_commands_parse(words):
    from grpo_lab.compare.__main__ import parser

    assert parser().parse_args(words[3:]).source
