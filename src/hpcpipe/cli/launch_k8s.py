"""`hpcpipe launch k8s`: render (and optionally submit) Kubeflow manifests for a job;
`hpcpipe launch helm-values`: the same job as values of the Helm chart."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hpcpipe.cli.common import ConfigArg, SetOption, console, err_console, scheduler_overrides, write_text
from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout

if TYPE_CHECKING:
    from hpcpipe.config import JobConfig

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


ApiOption = Annotated[
    str,
    typer.Option(
        help="trainjob: Kubeflow Trainer v2 TrainJob. pytorchjob: Training Operator v1 PyTorchJob, "
        "needed for elastic MIN:MAX nodes.",
    ),
]
NodesOption = Annotated[
    str | None, typer.Option(help="Nodes: N or MIN:MAX (overrides parallel.nnodes).", show_default=False)
]
GpusPerNodeOption = Annotated[
    int | None, typer.Option(help="Overrides launch.k8s.gpus_per_node.", show_default=False)
]


def k8s(
    config: ConfigArg,
    sets: SetOption = None,
    api: ApiOption = "trainjob",
    runtime: Annotated[
        bool,
        typer.Option(
            "--runtime",
            help="Also render the hpcpipe-torch ClusterTrainingRuntime (init step that stages data, "
            "restart after preemption) and run the TrainJob on it.",
        ),
    ] = False,
    nodes: NodesOption = None,
    gpus_per_node: GpusPerNodeOption = None,
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
    from hpcpipe.launch.k8s_train import kept_name, recorded_job
    from hpcpipe.launch.kubernetes import APIS, render_k8s, runtime_note, to_yaml

    if api not in APIS:
        raise UserError(f"--api {api}: use trainjob or pytorchjob")
    if dry_run and submit:
        raise UserError("--dry-run and --submit: pick one")
    job = load_config(
        config, [*(sets or []), *scheduler_overrides(nodes, gpus_per_node, "launch.k8s.gpus_per_node")]
    )
    k8s_cluster.require_client()
    connection = k8s_cluster.connect(kubeconfig, context) if submit else None  # fail before writing
    # The name this run's job was created under, not a second job beside it (k8s_train); not the
    # name of a recorded job of the other API, which this leaves running: its ConfigMap is that name's.
    recorded = recorded_job(job)
    name = kept_name(job, recorded if recorded is not None and recorded.kind.lower() == api else None)
    docs = render_k8s(job, api, runtime, name=name)  # type: ignore[arg-type]  # checked against APIS above
    note_image(job)
    if note := runtime_note(job, api, runtime):
        err_console.print(note, markup=False, highlight=False)
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
    rendered = {(d["kind"], d["metadata"]["name"]) for d in docs}
    other = None if recorded is None or (recorded.kind, recorded.name) in rendered else recorded
    if other is not None and k8s_cluster.get_or_none(connection, other) is not None:  # two jobs, one dir
        raise UserError(
            f"{other.kind} {other.namespace}/{other.name}, this run's recorded job, is still "
            f"there: `hpcpipe jobs cancel {job.run_dir}` first (a second job would train into its "
            "run directory)"
        )
    ref = k8s_cluster.create(connection, docs)
    k8s_cluster.record_submission(job.run_dir, ref)
    console.print(f"created {ref.kind} [bold]{ref.namespace}/{ref.name}[/]")
    console.print(f"follow it: hpcpipe jobs status {job.run_dir}; hpcpipe jobs logs {job.run_dir}")
    if not (job.launch.k8s.checkpoint_pvc or job.launch.k8s.runs_pvc):
        err_console.print(
            "note: launch.k8s.checkpoint_pvc and runs_pvc are unset: checkpoints stay on the pods' own disks"
        )


def helm_values(
    config: ConfigArg,
    sets: SetOption = None,
    api: ApiOption = "trainjob",
    runtime: Annotated[
        bool,
        typer.Option("--runtime", help="Install the hpcpipe-torch ClusterTrainingRuntime with the release."),
    ] = False,
    monitoring: Annotated[
        bool,
        typer.Option(
            "--monitoring",
            help="Also create the PodMonitor, alert rules and Grafana dashboard "
            "(needs observe.prometheus.port).",
        ),
    ] = False,
    nodes: NodesOption = None,
    gpus_per_node: GpusPerNodeOption = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--out",
            help="Write the values here (default: <run dir>/helm-values.yaml); - prints them.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Values for the Helm chart (deploy/helm/hpcpipe) that make the same job `launch k8s` renders:
    the resolved config, image, nodes, GPUs, claims, node cache, environment and scheduling of the
    config's launch.k8s section. Checked as `launch k8s` checks a job; nothing is written on an error.

      hpcpipe launch helm-values job.yaml --nodes 4 --gpus-per-node 8 -o values.yaml

      helm install my-job deploy/helm/hpcpipe -n ml-training -f values.yaml --set resources.gpu.count=8
    """
    from hpcpipe.config import load_config
    from hpcpipe.launch import k8s_cluster
    from hpcpipe.launch.helm_values import helm_values as build_values
    from hpcpipe.launch.helm_values import values_header
    from hpcpipe.launch.kubernetes import APIS
    from hpcpipe.yamlfile import dump_yaml

    if api not in APIS:
        raise UserError(f"--api {api}: use trainjob or pytorchjob")
    job = load_config(
        config, [*(sets or []), *scheduler_overrides(nodes, gpus_per_node, "launch.k8s.gpus_per_node")]
    )
    if monitoring and job.observe.prometheus.port is None:
        raise UserError("--monitoring: set observe.prometheus.port (and observe.prometheus.host=0.0.0.0)")
    k8s_cluster.require_client()  # the operators' models check the job (the k8s extra)
    values = build_values(job, api, runtime, monitoring)  # type: ignore[arg-type]  # checked against APIS
    note_image(job)
    target = "-" if out is not None and str(out) == "-" else str(out or RunLayout(job.run_dir).helm_values)
    text = values_header(job, values["nameOverride"], target) + dump_yaml(values, sort_keys=False, width=100)
    if target == "-":
        typer.echo(text, nl=False)
        return
    path = Path(target)
    write_text(path, text)
    console.print(f"wrote {path}")
    console.print(
        f"install it: helm install {values['nameOverride']} deploy/helm/hpcpipe "
        f"-n {job.launch.k8s.namespace} -f {path}"
    )


def note_image(job: JobConfig) -> None:
    """Say so when the pods' image cannot hold the job's recipe (a user's package, hpcpipe's image)."""
    from hpcpipe.launch.recipe_image import image_note

    note = image_note(job)
    if note:
        err_console.print(note, markup=False, highlight=False)
