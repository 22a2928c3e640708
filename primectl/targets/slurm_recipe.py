"""The recipe's `slurm:` block: how `target: slurm` submits the deployment (the target's own block, declared by
SlurmTarget.recipe_block, validated with file:line like the rest of the recipe)."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field, field_validator

from primectl.recipe.model import AbsolutePath, Strict

SLURM_TIME_RE = re.compile(r"^(UNLIMITED|INFINITE|\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2})$")
SLURM_NAME_RE = re.compile(r"^[A-Za-z0-9_.,+-]+$")
SBATCH_OPTION_RE = re.compile(r"^--[a-z][a-z0-9-]*(=[^\s'\"\\;&|<>`$]*)?$")
# sbatch options primectl writes itself (per component or job-wide), and what to do instead.
_PLACED = "it follows from the placement (prefill/decode hosts, parallel)"
SLURM_MANAGED: dict[str, str] = {
    "--job-name": "it is primectl-<name>", "--output": "it goes under slurm.job_dir",
    "--error": "it goes under slurm.job_dir", "--nodes": _PLACED, "--ntasks": _PLACED, "--ntasks-per-node": _PLACED,
    "--het-group": _PLACED, "--gpus-per-node": "set slurm.gpu_request", "--gres": "set slurm.gpu_request",
    "--segment": "set slurm.nvlink", "--switches": "set slurm.nvlink", "--partition": "set slurm.partition",
    "--account": "set slurm.account", "--time": "set slurm.time_limit", "--exclusive": "set slurm.exclusive",
    "--comment": "primectl records the revision there", "--chdir": "primectl submits from the release directory",
}


def _slurm_name(v: str | None) -> str | None:
    if v is not None and not SLURM_NAME_RE.match(v):
        raise ValueError(f"{v!r} is not a Slurm name (letters, digits and _ . , + -)")
    return v


SlurmName = Annotated[str | None, AfterValidator(_slurm_name)]


def _sbatch_option(v: str) -> str:
    if not SBATCH_OPTION_RE.match(v):
        raise ValueError(f"{v!r} is not one sbatch option (--name or --name=value, no spaces, quotes or shell characters)")
    flag = v.split("=", 1)[0]
    if flag in SLURM_MANAGED:
        raise ValueError(f"{flag} is written by primectl: {SLURM_MANAGED[flag]}")
    return v


SbatchOption = Annotated[str, AfterValidator(_sbatch_option)]


def _srun_option(v: str) -> str:
    if not SBATCH_OPTION_RE.match(v):
        raise ValueError(f"{v!r} is not one srun option (--name or --name=value, no spaces, quotes or shell characters)")
    return v


class SlurmComponentOptions(Strict):
    """Extra sbatch options for one kind of het-job component."""

    head: list[SbatchOption] = Field(default_factory=list, description="The head component (etcd, Mooncake master, frontend).")
    prefill: list[SbatchOption] = Field(default_factory=list, description="Each prefill component.")
    decode: list[SbatchOption] = Field(default_factory=list, description="Each decode component.")


class Slurm(Strict):
    """How `target: slurm` submits the deployment: one (heterogeneous) batch job."""

    # a block of its own, None where the recipe leaves it out (defaults apply then)
    optional_block: ClassVar[bool] = True
    block_description: ClassVar[str] = "Slurm job options (target: slurm); defaults apply when left out."

    job_dir: AbsolutePath = Field(
        "/var/lib/primectl/slurm",
        description="Directory on a filesystem shared by the submitting machine and every node: releases, job logs, "
        "state, lock and (unless software.python is given) the runtime venv live under it.",
    )
    head_dir: AbsolutePath = Field(
        "/etc/primectl", description="With monitoring: on the head (the machine primectl runs on), <head_dir>/<name>/ "
        "holds the deployment's Prometheus and Alertmanager configuration, pid files and logs.")
    head_data_dir: AbsolutePath = Field(
        "/var/lib/primectl/monitoring", description="With monitoring: <head_data_dir>/<name>/ holds the head's "
        "Prometheus and Alertmanager data (`down --purge` removes it).")
    partition: SlurmName = Field(None, description="sbatch --partition for every component; default: the cluster's.")
    account: SlurmName = Field(None, description="sbatch --account.")
    time_limit: str | None = Field(
        None, description="sbatch --time (minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]] or UNLIMITED); default: the partition's.")
    exclusive: bool = Field(True, description="Whole nodes (sbatch --exclusive --mem=0): no other job shares them.")
    gpu_request: Literal["gpus-per-node", "gres", "none"] = Field(
        "gpus-per-node", description="How GPUs are asked for: --gpus-per-node=N, --gres=gpu:N, or not at all.")
    nvlink: Literal["segment", "switches", "none"] = Field(
        "segment",
        description="How a multi-node instance is kept inside one NVLink domain: `segment` (--segment=N; Slurm 24.05+ with "
        "topology/block, what NVL72 clusters use), `switches` (--switches=1 under topology/tree, any version), or `none`.",
    )
    switches_wait: str | None = Field(None, description="With nvlink: switches, the longest wait for one switch (--switches=1@TIME).")
    extra_sbatch: list[SbatchOption] = Field(default_factory=list, description="More sbatch options for every component, e.g. --qos=high.")
    component_sbatch: SlurmComponentOptions = Field(
        default_factory=SlurmComponentOptions, description="More sbatch options for one kind of component only.")
    srun_args: list[Annotated[str, AfterValidator(_srun_option)]] = Field(
        default_factory=list,
        description="More srun options for every service step, e.g. pyxis' --container-image=... when nodes run a container.")
    interface: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.:-]+$",
        description="Resolve each node's address from this network interface on the node; default: the node's NodeAddr.")
    pending_timeout_s: int = Field(600, gt=0, description="How long `up` waits for the job to start running.")

    @field_validator("time_limit", "switches_wait")
    @classmethod
    def _time(cls, v: str | None) -> str | None:
        if v is not None and not SLURM_TIME_RE.match(v):
            raise ValueError(f"{v!r} is not a Slurm time; allowed: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, UNLIMITED")
        return v
