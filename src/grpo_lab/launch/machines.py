"""Where a job's processes run: one machine, or several machines that make one job (`accelerate launch` on each).

The user runs the same command on every machine, each with its `launcher.machine_rank`; or Slurm runs it
on every node of a job step (`srun`, or `hydra/launcher=submitit_slurm` with `nodes=N tasks_per_node=1`), and
the keys left null take Slurm's own values: the step's number of nodes, this node's index, the first host of
its node list. Everything here is decided before a model loads, from the config and the environment only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from grpo_lab.config import LauncherConfig
from grpo_lab.errors import ConfigError

# torch.distributed's usual rendezvous port, for machines that must agree on one without Slurm's help.
DEFAULT_PORT = 29500


@dataclass(frozen=True)
class Machines:
    """This job's machines as this machine sees them."""

    num_machines: int
    machine_rank: int
    main_process_ip: str | None  # None on one machine (accelerate's own loopback)
    main_process_port: int | None  # None on one machine: a free port per job
    source: str  # "config", or "slurm" when a value came from Slurm's environment

    @property
    def several(self) -> bool:
        return self.num_machines > 1

    @property
    def is_main(self) -> bool:
        """Machine 0 hosts global rank 0: it records the run (metrics.json, W&B) and gives the objective."""
        return self.machine_rank == 0

    def describe(self) -> str:
        where = f" ({self.source})" if self.source != "config" else ""
        return (
            f"machine {self.machine_rank} of {self.num_machines}{where}, "
            f"main process at {self.main_process_ip}:{self.main_process_port}"
        )


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list as names, in order: `gpu[01-02,07],cpu5` -> gpu01 gpu02 gpu07 cpu5
    (what `scontrol show hostnames` prints; numbers keep their zero padding)."""
    hosts: list[str] = []
    for group in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)?", nodelist):  # commas inside brackets stay
        bracket = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", group)
        if bracket is None:
            hosts.append(group)
            continue
        prefix, ranges, suffix = bracket.groups()
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            if not (first.isdigit() and (last or first).isdigit()):
                hosts = []
                break
            hosts += [f"{prefix}{n:0{len(first)}d}{suffix}" for n in range(int(first), int(last or first) + 1)]
    if not hosts:
        raise ConfigError(f"Cannot read Slurm's node list {nodelist!r}: set `launcher.main_process_ip`.")
    return hosts


def _job_step(env: Mapping[str, str]) -> dict[str, str] | None:
    """The scheduler's view of this job step, or None outside one (an sbatch script runs on one node only).

    Slurm: inside `srun` (submitit runs its tasks so) each node's task sees its node index and the node list.
    submitit's local executor (`hydra/launcher=submitit_local hydra.launcher.tasks_per_node=N`) runs N tasks on
    this host and no Slurm: each task stands in for one machine, reached on loopback (how this is tested)."""
    if "SLURM_STEP_ID" in env or "SLURM_STEPID" in env:
        nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if nodes is None or "SLURM_NODEID" not in env or nodelist is None:
            return None
        return {
            "source": "slurm",
            "nodes": nodes,
            "node": env["SLURM_NODEID"],
            "host": expand_nodelist(nodelist)[0],
            "tasks": env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or nodes,
            "job": env.get("SLURM_JOB_ID", "0"),
        }
    if env.get("SUBMITIT_EXECUTOR") == "local" and int(env.get("SUBMITIT_LOCAL_NTASKS", "1")) > 1:
        tasks = env["SUBMITIT_LOCAL_NTASKS"]
        return {
            "source": "submitit_local",
            "nodes": tasks,
            "node": env.get("SUBMITIT_LOCAL_GLOBALID", "0"),
            "host": "127.0.0.1",
            "tasks": tasks,
            "job": env.get("SUBMITIT_LOCAL_JOB_ID", "0"),
        }
    return None


def resolve(launcher: LauncherConfig, env: Mapping[str, str]) -> Machines:
    """This job's machines from `launcher.*` and, for what is null, Slurm's environment; one line on a mistake."""
    step = _job_step(env)
    source = "config"
    num_machines, machine_rank, ip = launcher.num_machines, launcher.machine_rank, launcher.main_process_ip
    if step is not None and (num_machines is None or machine_rank is None or ip is None):
        if int(step["tasks"]) != int(step["nodes"]):
            raise ConfigError(
                f"This Slurm step runs {step['tasks']} tasks on {step['nodes']} node(s), but grpo_lab starts the "
                "processes of each machine itself (`accelerate launch`): run one task per node "
                "(`srun --ntasks-per-node=1`, or `hydra.launcher.tasks_per_node=1`)."
            )
        source = step["source"]
        num_machines = int(step["nodes"]) if num_machines is None else num_machines
        machine_rank = int(step["node"]) if machine_rank is None else machine_rank
        ip = step["host"] if ip is None and num_machines > 1 else ip
    num_machines = num_machines or 1
    machine_rank = machine_rank or 0
    port = launcher.main_process_port
    if num_machines == 1:
        if machine_rank != 0:
            raise ConfigError(f"`launcher.machine_rank={machine_rank}` but the job has one machine.")
        return Machines(1, 0, None, port, source)
    if launcher.kind != "accelerate":
        raise ConfigError(
            f"`launcher.num_machines={num_machines}` needs an accelerate launcher (e.g. `launcher=ddp`), "
            f"not `launcher={launcher.kind}`."
        )
    if machine_rank >= num_machines:
        raise ConfigError(
            f"`launcher.machine_rank={machine_rank}` but the job has {num_machines} machines "
            f"(ranks 0 to {num_machines - 1})."
        )
    if launcher.num_processes % num_machines:
        raise ConfigError(
            f"`launcher.num_processes={launcher.num_processes}` counts the processes of all {num_machines} machines "
            f"(as accelerate's --num_processes does): make it a multiple of {num_machines}."
        )
    if ip is None:
        raise ConfigError(
            f"`launcher.num_machines={num_machines}` needs `launcher.main_process_ip`: the address machine 0 is "
            "reached at, the same on every machine (under Slurm it is found by itself inside `srun`)."
        )
    if port is None:  # every machine must pick the same one: in a job step, its job id keeps two jobs apart
        port = 20000 + int(step["job"]) % 10000 if step is not None else DEFAULT_PORT
    return Machines(num_machines, machine_rank, ip, port, source)
