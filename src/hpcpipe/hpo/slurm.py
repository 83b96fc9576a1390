"""``hpcpipe hpo launch slurm``: a job array whose tasks are study workers on a shared store.

Each array task is one node running ``hpcpipe hpo worker STUDY_DIR``: it asks the study for
trials until the study has ``hpo.n_trials``, and trains each on that node's GPUs (``--nproc``
from ``launch.slurm.gpus_per_node``, else ``parallel.nproc``). The launcher's own pieces render
the environment, the container command and the submission.
"""

from __future__ import annotations

from pathlib import Path

from hpcpipe.config.launch import check_plain_env
from hpcpipe.errors import UserError
from hpcpipe.hpo.study import StudyPlan
from hpcpipe.launch.slurm import hpcpipe_command, sbatch_templates


def check_shared_storage(plan: StudyPlan) -> None:
    """Array tasks run on many nodes: SQLite on a shared file system corrupts or locks up."""
    if plan.storage_url.startswith("sqlite"):
        raise UserError(
            "hpo.storage: array tasks on several nodes cannot share SQLite (Optuna's docs advise "
            "against it); set hpo.storage=postgresql://USER@HOST:PORT/DB or journal:PATH on the "
            "shared file system"
        )


def render_array(plan: StudyPlan, workers: int) -> str:

    from hpcpipe import __version__

    slurm = plan.base.launch.slurm
    check_plain_env(plan.base.launch)
    nproc = slurm.gpus_per_node or plan.base.parallel.nproc
    env = dict(slurm.env)
    if slurm.cpus_per_task:
        env.setdefault("OMP_NUM_THREADS", str(max(1, slurm.cpus_per_task // nproc)))
    template = sbatch_templates()
    return template.get_template("hpo.sbatch.j2").render(
        study=plan.name,
        storage=plan.storage_shown,
        version=__version__,
        name=f"hpo-{plan.name}",
        workers=workers,
        s=slurm,
        env=env,
        output=plan.layout.slurm_output,
        hpcpipe=hpcpipe_command(slurm),
        study_dir=plan.study_dir,
        nproc=nproc,
    )


def write_array(plan: StudyPlan, workers: int) -> Path:
    script = plan.layout.slurm_script
    script.write_text(render_array(plan, workers))
    return script
