"""`hpcpipe bench collectives|compute|throughput|scaling`: measure a node or a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hpcpipe.cli.common import (
    ConfigArg,
    JsonOption,
    NprocOption,
    SetOption,
    console,
    err_console,
    load_job,
    print_whole,
    writable_output,
    write_json,
)
from hpcpipe.errors import UserError

app = typer.Typer(
    help="Benchmarks: collective bandwidth (like nccl-tests), compute ceilings, training throughput, "
    "and strong/weak scaling. Every verb prints a table and takes --json PATH ('-' for stdout).",
    no_args_is_help=True,
)

ALL_COLLECTIVES = "all_reduce,all_gather,reduce_scatter,broadcast,all_to_all"
RanksOption = Annotated[
    int | None,
    typer.Option(
        "--nproc",
        "-n",
        min=1,
        help="Local ranks to start (default: one per GPU, or 2 on a CPU host). Ignored under torchrun "
        "or srun, which decide the ranks.",
        show_default=False,
    ),
]


def _default_nproc() -> int:
    """One rank per GPU on this node; two ranks on a CPU host (the smallest group that communicates).

    Counted without a CUDA context in this process, from which the workers fork
    (``prestart_bench_server``): ``torch.cuda.is_available()`` would initialise CUDA here and leave
    every forked worker unable to use it. A driver's device node first, then torch's count, which
    asks NVML (the driver's library) before CUDA."""
    from hpcpipe.train.environment import gpu_device_present

    if not gpu_device_present():
        return 2
    import torch

    return torch.cuda.device_count() or 2


def human_console(json_out: str | None) -> Console:
    """Where tables go: standard output, silenced when the JSON itself goes there (`--json -`)."""
    return Console(quiet=True) if json_out == "-" else console


def _check_group_options(backend: str, timeout_s: float) -> None:
    """--backend and --timeout-s, refused here in one line rather than by every worker's traceback."""
    from hpcpipe.train.environment import gpu_device_present

    if backend not in ("auto", "gloo", "nccl"):
        raise UserError(f"--backend: expected auto, gloo or nccl, got {backend!r}")
    if backend == "nccl" and not gpu_device_present():
        raise UserError("--backend nccl needs CUDA GPUs and this host has none; use auto or gloo")
    if not timeout_s > 0 or timeout_s == float("inf"):
        raise UserError(f"--timeout-s: must be a positive number of seconds, got {timeout_s}")


def _fail(exc: RuntimeError) -> typer.Exit:
    err_console.print(f"error: {escape(str(exc))}")
    return typer.Exit(1)


@app.command("collectives")
def collectives(
    names: Annotated[
        str, typer.Option("--collectives", "-c", help="Comma-separated collectives.")
    ] = ALL_COLLECTIVES,
    sizes: Annotated[
        str | None,
        typer.Option(
            "--sizes",
            help="MIN:MAX (powers of two), MIN:MAX:FACTOR or a list 1M,64M. "
            "Default: 1K up to what memory allows (8G on GPUs, 64M on CPU).",
            show_default=False,
        ),
    ] = None,
    dtype: Annotated[
        str, typer.Option(help="float32, bfloat16 (bf16), float16 (fp16), float64, int32.")
    ] = "float32",
    warmup: Annotated[int, typer.Option(help="Untimed calls per size.")] = 5,
    iters: Annotated[int, typer.Option(help="Timed calls per size.")] = 20,
    nproc: RanksOption = None,
    backend: Annotated[str, typer.Option(help="auto (nccl on GPUs, gloo on CPU), nccl or gloo.")] = "auto",
    check: Annotated[
        bool, typer.Option("--check/--no-check", help="Verify each collective's result.")
    ] = True,
    plot: Annotated[
        Path | None,
        typer.Option(help="Write a busbw-vs-size PNG here.", show_default=False, callback=writable_output),
    ] = None,
    timeout_s: Annotated[float, typer.Option(help="Process-group timeout (seconds).")] = 300.0,
    json_out: JsonOption = None,
) -> None:
    """Collective bandwidth over a size sweep, reported as nccl-tests reports it.

    Per size: time, algbw = size / time and busbw = algbw x the collective's bus factor
    (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast 1), a check
    of the result on every rank, and the slowest rank.

    Examples:

      hpcpipe bench collectives --nproc 2 --sizes 1K:16M

      hpcpipe bench collectives -c all_reduce --sizes 64M,1G --dtype bf16 --json busbw.json

      srun -N 2 --ntasks-per-node 8 hpcpipe bench collectives -c all_reduce
    """
    from hpcpipe.bench.bus import COLLECTIVES, parse_sizes
    from hpcpipe.bench.collectives import CollectiveSpec
    from hpcpipe.bench.group import exit_process
    from hpcpipe.bench.runner import BenchFailure, prestart_bench_server, run_bench

    wanted = [c.strip() for c in names.split(",") if c.strip()]
    if wanted == ["all"]:
        wanted = list(COLLECTIVES)
    spec = CollectiveSpec.build(wanted, parse_sizes(sizes) if sizes else None, dtype, warmup, iters, check)
    _check_group_options(backend, timeout_s)
    ranks = nproc or _default_nproc()
    prestart_bench_server(ranks)  # the workers fork from this process (no CUDA in it yet: _default_nproc)
    try:
        result = run_bench({"collectives": spec.to_dict()}, ranks, backend, timeout_s)
    except BenchFailure as exc:
        raise _fail(exc) from None
    if result is not None:
        view = human_console(json_out)
        _print_collectives(result["collectives"], view)
        if plot is not None:
            from hpcpipe.report.plots_bench import plot_collectives

            view.print(f"plot: {plot_collectives(result['collectives'], plot)}")
        write_json(result["collectives"], json_out)
    wrong = result is not None and any(r["correct"] is False for r in result["collectives"]["results"])
    exit_process(1 if wrong else 0)  # a torchrun/srun rank leaves here (see bench.group)
    if wrong:
        raise typer.Exit(1)


def _print_collectives(result: dict[str, Any], view: Console) -> None:
    """nccl-tests' columns; the slowest rank is flagged when it lags the median rank by > 20 %."""
    from hpcpipe.bench.bus import format_size

    table = Table(
        "collective",
        "size",
        "time us",
        "algbw GB/s",
        "busbw GB/s",
        "check",
        "slowest",
        title=f"{result['world_size']} ranks, {result['backend']} on {result['device']}, {result['dtype']}, "
        f"{result['iters']} iterations",
    )
    for r in result["results"]:
        if r["correct"] is None:
            check = "[yellow]n/a[/yellow]" if r.get("unchecked") else "-"  # n/a: could not, -: --no-check
        else:
            check = "ok" if r["correct"] else f"[red]wrong {r['wrong_ranks']}[/red]"
        slowest = f"{r['slowest_rank']}" + (" [yellow]slow[/yellow]" if r["slow_ranks"] else "")
        table.add_row(
            r["collective"],
            format_size(r["size_bytes"]),
            f"{r['time_s'] * 1e6:.1f}",
            f"{r['algbw_gbps']:.3f}",
            f"{r['busbw_gbps']:.3f}",
            check,
            slowest,
        )
    print_whole(table, view)
    for line in _unchecked_lines(result["results"]):
        view.print(line, markup=False, highlight=False)


def _unchecked_lines(results: list[dict[str, Any]]) -> list[str]:
    """Why the rows marked n/a were not checked: a line per collective and reason, naming the sizes."""
    from hpcpipe.bench.bus import format_size

    sizes: dict[tuple[str, str], list[str]] = {}
    for r in results:
        if r.get("unchecked"):
            sizes.setdefault((r["collective"], r["unchecked"]), []).append(format_size(r["size_bytes"]))
    return [f"check n/a: {name} at {', '.join(found)}: {why}" for (name, why), found in sizes.items()]


@app.command("compute")
def compute(
    dtypes: Annotated[
        str, typer.Option(help="Matmul dtypes: fp32, tf32, bf16, fp16.")
    ] = "fp32,tf32,bf16,fp16",
    device: Annotated[str, typer.Option(help="auto (cuda:0 when present), cpu, or cuda:N.")] = "auto",
    matmul_n: Annotated[
        int | None,
        typer.Option(
            help="Matrix size n (default: 8192 GPU, 1024 CPU, smaller only where one call at that size "
            "takes longer than --min-time / --repeats, e.g. bf16 emulated by a CPU).",
            show_default=False,
        ),
    ] = None,
    copy_size: Annotated[
        str | None,
        typer.Option(help="Copy buffer size, e.g. 1G (default: 1G GPU, 128M CPU).", show_default=False),
    ] = None,
    min_time: Annotated[float, typer.Option(help="Timed seconds per figure.")] = 0.3,
    repeats: Annotated[int, typer.Option(help="Timed windows per figure; the median is reported.")] = 3,
    json_out: JsonOption = None,
) -> None:
    """Compute ceilings of one device: matmul TFLOP/s per dtype, memory and host-device GB/s.

    A dtype the device cannot run (TF32 on a CPU, bf16 on a V100) is reported as skipped, with
    the reason. The JSON is what `hpcpipe roofline --ceilings` reads.

    Examples:

      hpcpipe bench compute

      hpcpipe bench compute --dtypes bf16,fp16 --device cuda:1 --json ceilings.json
    """
    import torch

    from hpcpipe.bench.bus import parse_size
    from hpcpipe.bench.compute import ComputeSpec, measure_compute

    spec = ComputeSpec.build(
        [d.strip() for d in dtypes.split(",") if d.strip()],
        matmul_n,
        parse_size(copy_size, "--copy-size") if copy_size else None,
        min_time,
        repeats,
    )
    result = measure_compute(spec, _device(device, torch))
    table = Table(
        "figure",
        "value",
        "unit",
        "detail",
        title=f"{result['device_name']} ({result['device']}, {result['threads']} threads)",
    )
    for key, fig in result["figures"].items():
        value = "skipped" if fig["value"] is None else f"{fig['value']:.4g}"
        table.add_row(key, value, fig["unit"], escape(fig["skipped"] or fig["detail"]))
    print_whole(table, human_console(json_out), wraps={"detail"})
    write_json(result, json_out)


def _device(text: str, torch: Any) -> Any:
    """auto, cpu or cuda[:N], N a device present: the figures are written for those (xpu failed in
    an assertion, meta timed no work and reported hundreds of TB/s)."""
    if text == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise UserError(f"--device: cannot read {text!r} (examples: auto, cpu, cuda:0)") from None
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"--device {text}: bench compute measures auto, cpu or cuda[:N] only")
    if device.type == "cpu":
        return device
    if not torch.cuda.is_available():
        raise UserError(f"--device {text}: no CUDA device is available")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise UserError(f"--device {text}: this machine has cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", device.index or 0)


@app.command("throughput")
def throughput(
    config: ConfigArg,
    sets: SetOption = None,
    nproc: NprocOption = None,
    steps: Annotated[int, typer.Option(help="Measured optimizer steps per run.")] = 10,
    warmup: Annotated[int, typer.Option(help="Steps dropped before measuring.")] = 3,
    repeats: Annotated[int, typer.Option(help="Runs; the median over runs is reported.")] = 1,
    out: Annotated[Path, typer.Option(help="Parent directory of the benchmark runs.")] = Path("runs/bench"),
    json_out: JsonOption = None,
) -> None:
    """Training throughput of a recipe: tokens/s (or samples/s) per device and MFU.

    Trains the job for WARMUP + STEPS steps with a metrics row every step, drops the warm-up rows
    and reports medians; MFU is shown where the device's peak is known (or observe.peak_tflops).

    Examples:

      hpcpipe bench throughput tiny --nproc 2

      hpcpipe bench throughput gpt-124m --nproc 8 --steps 30 --repeats 3 --json tput.json
    """
    from hpcpipe.bench.throughput import measure_throughput
    from hpcpipe.launch.job import prestart_fork_server

    job = load_job(config, sets, nproc)
    prestart_fork_server(job)  # before anything computes: every run's workers fork from it
    try:
        result = measure_throughput(job, steps, warmup, repeats, out)
    except RuntimeError as exc:
        raise _fail(exc) from None
    if result is not None:
        _print_throughput(result, human_console(json_out))
        write_json(result, json_out)


def _print_throughput(result: dict[str, Any], view: Console) -> None:
    unit = result["unit"]
    table = Table(
        "job",
        "ranks",
        f"{unit}/s",
        f"{unit}/s/device",
        "step time (ms)",
        "MFU",
        "runs",
        title=f"training throughput ({result['precision']}, global batch {result['global_batch_size']})",
    )
    mfu = "-" if result["mfu"] is None else f"{result['mfu']:.1%}"
    table.add_row(
        result["name"],
        str(result["world_size"]),
        f"{result['per_s']:.4g}",
        f"{result['per_s_per_device']:.4g}",
        f"{result['step_time_s'] * 1e3:.3g}",
        mfu,
        str(len(result["runs"])),
    )
    print_whole(table, view)


@app.command("scaling")
def scaling(
    config: ConfigArg,
    nproc: Annotated[str, typer.Option("--nproc", "-n", help="World sizes, e.g. 1,2,4,8.")] = "1,2",
    mode: Annotated[
        str, typer.Option(help="strong (fixed global batch), weak (fixed per-rank batch) or both.")
    ] = "both",
    sets: SetOption = None,
    steps: Annotated[int, typer.Option(help="Measured optimizer steps per run.")] = 10,
    warmup: Annotated[int, typer.Option(help="Steps dropped before measuring.")] = 3,
    out: Annotated[Path, typer.Option(help="Directory for the runs, scaling.csv and scaling.png.")] = Path(
        "runs/bench/scaling"
    ),
    bottlenecks: Annotated[
        bool,
        typer.Option(
            help="Also time each N > 1 without gradient all-reduces, to report exposed communication "
            "and a compute/communication/input-bound verdict (doubles the runs for N > 1)."
        ),
    ] = True,
    json_out: JsonOption = None,
) -> None:
    """Strong and weak scaling efficiency over world sizes N, with a CSV and PNG plots.

    Strong: the global batch stays fixed, E_s(N) = T(1) / (N T(N)). Weak: the per-rank batch
    (global batch / parallel.nproc of the job) stays fixed, E_w(N) = T(1) / T(N). T is the median
    step time after warm-up. Each row also gets its data-wait share, exposed communication (step
    time minus the same step without gradient sync) and a bottleneck verdict. Redraw the plots and
    tables from the CSV alone with `hpcpipe report OUT`.

    Examples:

      hpcpipe bench scaling tiny --nproc 1,2

      hpcpipe bench scaling resnet-tiny --nproc 1,2 --set data.root=data/generated/cifar10

      hpcpipe bench scaling gpt-124m --nproc 1,2,4,8 --mode weak --out runs/scaling-h100
    """
    from hpcpipe.bench.scaling import MODES, parse_nprocs, run_scaling
    from hpcpipe.launch.job import prestart_fork_server
    from hpcpipe.report.plots_bench import plot_scaling

    modes = list(MODES) if mode == "both" else [mode]
    job = load_job(config, sets)
    world_sizes = parse_nprocs(nproc)
    prestart_fork_server(job, nproc=max(world_sizes))  # before the N=1 run computes in this process
    try:
        result = run_scaling(job, world_sizes, modes, steps, warmup, out, bottlenecks)
    except RuntimeError as exc:
        raise _fail(exc) from None
    result["png"] = str(plot_scaling(result["rows"], out / "scaling.png"))
    table = Table(
        "mode",
        "N",
        "global batch",
        "step time (ms)",
        f"{result['rows'][0]['unit']}/s",
        "efficiency",
        "data wait",
        "exposed comm",
        "bottleneck",
        title=f"scaling of {result['name']}",
    )
    for r in result["rows"]:
        table.add_row(
            r["mode"],
            str(r["nproc"]),
            str(r["global_batch_size"]),
            f"{r['step_time_s'] * 1e3:.3g}",
            f"{r['per_s']:.4g}",
            f"{r['efficiency']:.2f}",
            f"{100 * r['data_share']:.0f}%",
            "-" if r["comm_share"] is None else f"{100 * r['comm_share']:.0f}%",
            r["bottleneck"],
        )
    view = human_console(json_out)
    print_whole(table, view)
    for note in result["notes"]:
        view.print(f"note: {note}")
    view.print(f"wrote {result['csv']} and {result['png']}")
    write_json(result, json_out)
