"""The ``launch`` section of a job: what the Slurm and Kubernetes launchers render."""

from __future__ import annotations

from pydantic import Field, field_validator

from hpcpipe.config_section import Section


class SlurmConfig(Section):
    """``hpcpipe launch slurm``: what the rendered sbatch script asks for and sets up."""

    partition: str | None = Field(None, description="#SBATCH --partition (null: the cluster's default).")
    account: str | None = Field(None, description="#SBATCH --account.")
    qos: str | None = Field(None, description="#SBATCH --qos.")
    constraint: str | None = Field(None, description="#SBATCH --constraint (node features).")
    time: str = Field("01:00:00", description="#SBATCH --time, [D-]HH:MM:SS.")
    gpus_per_node: int = Field(
        0, ge=0, description="#SBATCH --gpus-per-node; also the processes per node when > 0."
    )
    cpus_per_task: int | None = Field(
        None, ge=1, description="#SBATCH --cpus-per-task: cores for the node's agent and all its workers."
    )
    mem: str | None = Field(None, description="#SBATCH --mem per node, e.g. 200G (null: the default).")
    exclusive: bool = Field(False, description="#SBATCH --exclusive: no other job on the nodes.")
    signal: str = Field(
        "USR1",
        description="Signal Slurm sends every task signal_grace_s before the time limit "
        "(#SBATCH --signal=<signal>@<grace>, without B:, which would reach only the batch shell).",
    )
    signal_grace_s: int = Field(
        120, ge=10, description="Seconds before the time limit that the signal is sent."
    )
    max_requeues: int = Field(
        3,
        ge=0,
        description="Requeue a preempted job (exit 75) at most this many times "
        "(SLURM_RESTART_COUNT), and only while its newest checkpoint advances.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Exported in the script before the job starts: NCCL_*, GLOO_SOCKET_IFNAME, "
        "NCCL_IB_HCA, ... (values only, no secrets: those come from the cluster's environment).",
    )
    setup: list[str] = Field(
        default_factory=list,
        description="Shell lines run before the job (module load ..., source venv/bin/activate).",
    )
    hpcpipe: str = Field(
        "hpcpipe", description="The command that runs hpcpipe on the nodes (e.g. /opt/venv/bin/hpcpipe)."
    )
    rdzv_port: int | None = Field(
        None,
        ge=1024,
        le=65535,
        description="c10d rendezvous port on the first node (null: 20000 + job id mod 20000, so "
        "jobs sharing a node do not collide).",
    )
    max_restarts: int = Field(
        3,
        ge=0,
        description="Elastic agent: times the worker group is restarted after a failure or a "
        "membership change within one allocation.",
    )

    @field_validator("signal")
    @classmethod
    def _a_signal_every_task_gets(cls, value: str) -> str:
        if value.startswith("B:"):
            raise ValueError(
                "'B:' sends the signal only to the batch shell, never to the training "
                "processes; give the bare name (USR1)"
            )
        name = value.removeprefix("SIG")
        if name not in ("USR1", "TERM"):
            raise ValueError("use USR1 or TERM: the signals hpcpipe's workers checkpoint on")
        return name


class LaunchConfig(Section):
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)
