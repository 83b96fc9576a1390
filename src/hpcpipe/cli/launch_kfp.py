"""`hpcpipe launch kfp`: the job as a Kubeflow Pipelines v2 pipeline (IR YAML), compiled by kfp."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hpcpipe.cli.common import ConfigArg, SetOption, console, load_job
from hpcpipe.cli.launch_k8s import ApiOption, note_image
from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout


def kfp(
    config: ConfigArg,
    sets: SetOption = None,
    api: ApiOption = "trainjob",
    katib: Annotated[
        bool,
        typer.Option(
            "--katib",
            help="Add a Katib search before train (the Experiment `hpo launch katib` renders); its best "
            "values feed train. The pipeline parameter `tune` turns it off per run.",
        ),
    ] = False,
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, help="Katib's parallel trials.")] = 2,
    out: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--out",
            help="Write the pipeline here (default: <run dir>/pipeline.yaml).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """A Kubeflow Pipelines v2 pipeline for the job: prepare → stage → train → evaluate → export →
    register → report, each a container step running `hpcpipe run CONFIG --only STEP` in the
    launch.k8s image, on the run directory the steps share through launch.k8s.runs_pvc (or
    checkpoint_pvc).
    The train step creates the TrainJob (or PyTorchJob) `launch k8s` renders and waits for it;
    each step's lineage record is a KFP artifact, so KFP's lineage shows what `hpcpipe lineage`
    shows. The config is the pipeline parameter `config`.

    Compiled by the kfp SDK in its own interpreter (it conflicts with the k8s extra): $HPCPIPE_KFP_PYTHON,
    else the project's .venv-kfp (`make kfp-env`), else uv with the pinned SDK. Upload the file in
    the KFP UI, or `kfp pipeline create`. The steps' service account needs to create ConfigMaps and
    the job (and Experiments with --katib).

      hpcpipe launch kfp examples/k8s/h200-elastic.yaml --api pytorchjob -o pipeline.yaml

      hpcpipe launch kfp job.yaml --katib -w 4
    """
    from hpcpipe.kfp.sdk import compile_pipeline
    from hpcpipe.kfp.spec import pipeline_spec
    from hpcpipe.launch import k8s_cluster
    from hpcpipe.launch.kubernetes import APIS

    if api not in APIS:
        raise UserError(f"--api {api}: use trainjob or pytorchjob")
    job = load_job(config, sets)
    k8s_cluster.require_client()  # the train step's job is checked with the operators' models
    spec = pipeline_spec(job, api, katib, workers)  # type: ignore[arg-type]  # checked against APIS
    note_image(job)
    target = out or RunLayout(job.run_dir).kfp_pipeline
    if target.is_dir():
        raise UserError(f"-o {target}: a directory; name the pipeline file (e.g. {target}/pipeline.yaml)")
    partial = target.with_name(f".{target.stem}.partial{target.suffix or '.yaml'}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        compile_pipeline(spec, partial)
        partial.replace(target)  # a failed compile leaves no pipeline file behind
    except OSError as exc:
        raise UserError(f"-o {target}: cannot write it ({exc.strerror or exc})") from None
    finally:
        partial.unlink(missing_ok=True)
    steps = [s["name"] for s in spec["steps"]]
    if katib:
        steps.insert(steps.index("train"), "katib?")
    console.print(f"wrote {target} ({' → '.join(steps)})")
    console.print("run it: upload it in the Kubeflow Pipelines UI, or `kfp pipeline create -p NAME FILE`")
