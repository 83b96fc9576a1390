"""`hpcpipe launch k8s`: render (and optionally submit) Kubeflow manifests for a job."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hpcpipe.cli.common import ConfigArg, SetOption, console, err_console, scheduler_overrides
from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout

KubeconfigOption = Annotated[
    Path | None,
    typer.Option(
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the pod's service account).",
        show_default=False,
    ),
]
ContextOption = Annotated[
    str | None, typer.Option(help="kubeconfig context (default: the current one).", show_default=False)
]


def k8s(
    config: ConfigArg,
    sets: SetOption = None,
    api: Annotated[
        str,
        typer.Option(
            help="trainjob: Kubeflow Trainer v2 TrainJob. pytorchjob: Training Operator v1 PyTorchJob, "
            "needed for elastic MIN:MAX nodes.",
        ),
    ] = "trainjob",
    runtime: Annotated[
        bool,
        typer.Option(
            "--runtime",
            help="Also render the hpcpipe-torch ClusterTrainingRuntime (init step that stages data, "
            "restart after preemption) and run the TrainJob on it.",
        ),
    ] = False,
    nodes: Annotated[
        str | None, typer.Option(help="Nodes: N or MIN:MAX (overrides parallel.nnodes).", show_default=False)
    ] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option(help="Overrides launch.k8s.gpus_per_node.", show_default=False)
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Write the YAML here (default: <run dir>/k8s.yaml).", show_default=False),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the YAML; write nothing.")] = False,
    submit: Annotated[
        bool, typer.Option("--submit", help="Create the objects in the cluster (needs the k8s extra).")
    ] = False,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
) -> None:
    """Kubeflow manifests for a job: its config as a ConfigMap, and a TrainJob (default) or an
    elastic PyTorchJob, each checked against the operators' published models before it is written.

    The pods run `hpcpipe launch agent`, which reads the operator's PET_* variables like torchrun.
    Set what the pods mount and ask for in the config's launch.k8s section (image and digest,
    GPUs, PVCs, node-local cache, NCCL environment, secrets by reference, Kueue queue). Examples:

      hpcpipe launch k8s job.yaml --nodes 4 --gpus-per-node 8 --dry-run

      hpcpipe launch k8s job.yaml --api pytorchjob --nodes 30:32 --submit
    """
    from hpcpipe.config import load_config
    from hpcpipe.launch import k8s_cluster
    from hpcpipe.launch.kubernetes import APIS, job_name, render_k8s, to_yaml

    if api not in APIS:
        raise UserError(f"--api {api}: use trainjob or pytorchjob")
    if dry_run and submit:
        raise UserError("--dry-run and --submit: pick one")
    job = load_config(
        config, [*(sets or []), *scheduler_overrides(nodes, gpus_per_node, "launch.k8s.gpus_per_node")]
    )
    k8s_cluster.require_client()
    connection = k8s_cluster.connect(kubeconfig, context) if submit else None  # fail before writing
    docs = render_k8s(job, api, runtime)  # type: ignore[arg-type]  # checked against APIS above
    text = to_yaml(docs)
    if dry_run:
        typer.echo(text, nl=False)
        return
    target = out or RunLayout(job.run_dir).k8s_manifest
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    console.print(f"wrote {target} ({', '.join(d['kind'] for d in docs)})")
    if connection is None:
        console.print(f"submit it: kubectl apply -f {target}   (or rerun with --submit)")
        return
    ref = k8s_cluster.create(connection, docs)
    k8s_cluster.record_submission(job.run_dir, ref)
    console.print(f"created {ref.kind} [bold]{ref.namespace}/{job_name(job)}[/]")
    console.print(f"follow it: hpcpipe jobs status {job.run_dir}; hpcpipe jobs logs {job.run_dir}")
    if not job.launch.k8s.checkpoint_pvc:
        err_console.print("note: launch.k8s.checkpoint_pvc is unset: checkpoints stay on the pods' own disks")
