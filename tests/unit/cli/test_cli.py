"""The CLI as a user drives it: help that teaches, and bad input as one line with exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest


def _one_line_error(proc) -> str:  # type: ignore[no-untyped-def]
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_help_lists_the_verbs(cli) -> None:  # type: ignore[no-untyped-def]
    proc = cli("--help")
    assert proc.returncode == 0
    for verb in ("run", "train", "data", "presets"):
        assert verb in proc.stdout
    train_help = cli("train", "--help")
    assert "--set" in train_help.stdout and "--nproc" in train_help.stdout
    assert "Examples" in train_help.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["train", "tiny", "--set", "train.stepz=3"], "unknown config key 'train.stepz'"),
        (["train", "tiny", "--set", "train.steps=abc"], "train.steps"),
        (["train", "tiny", "--nproc", "3"], "train.global_batch_size (8) must be a multiple"),
        (
            ["train", "tiny", "--nproc", "2", "--set", "checkpoint.memory_limit_gb=1e6"],
            "checkpoint.memory_limit_gb=1e+06 is larger than /dev/shm",
        ),
        (["train", "does/not/exist.yaml"], "config file not found: does/not/exist.yaml"),
        (["train", "nopreset"], "unknown preset 'nopreset'"),
        (["data", "prepare", "tiny", "--set", "data.sources=[/no/such/dir]"], "/no/such/dir"),
        (["train", "tiny", "--set", "train.lr=inf"], "train.lr: Input should be a finite number"),
        (["hpo", "run", "tiny", "--set", "hpo.study=x/../../out"], "hpo.study: must be a plain name"),
        (["run", "tiny", "--api", "foo"], "--api foo: use trainjob or pytorchjob"),
        (["run", "tiny", "--only", "report", "--record", "tiny/lineage.json"], "inside the run directory"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, tmp_path: Path, args: list[str], needle: str) -> None:  # type: ignore[no-untyped-def]
    proc = cli(
        *args, "--set", f"run.out_dir={tmp_path}", "--set", f"data.prepared_dir={tmp_path}/d", cwd=tmp_path
    )
    assert needle in _one_line_error(proc)
    assert not (tmp_path / "tiny").exists() or not (tmp_path / "tiny" / "metrics.jsonl").exists()


def test_a_file_where_a_folder_is_due_is_one_line_naming_it(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "notes.txt").write_text("a file\n")
    assert "notes.txt: Not a directory" in _one_line_error(cli("ckpt", "list", "notes.txt", cwd=tmp_path))
    # The Slurm script's requeue decision reads it: a typo must not print 0 ("no progress").
    assert "no/run: not a run directory" in _one_line_error(cli("ckpt", "newest", "no/run", cwd=tmp_path))
    sets = ["--set", f"run.out_dir={tmp_path}", "--set", "train.steps=2", "--set", "checkpoint.dir=notes.txt"]
    proc = cli("train", "tiny", *sets, cwd=tmp_path)
    assert "notes.txt: Not a directory" in _one_line_error(proc)
    # A durable tier that cannot be written failed every copy in the background, and exit 0.
    sets[-1] = "checkpoint.durable_dir=notes.txt/durable"
    proc = cli("train", "tiny", *sets, cwd=tmp_path)
    assert "checkpoint.durable_dir notes.txt/durable: cannot write there" in _one_line_error(proc)


def test_a_refusal_of_rank_0_alone_is_not_buried_under_its_peers_traceback(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Rank 1, waiting in a broadcast for rank 0, printed gloo's "Connection reset by peer"
    traceback (30 lines) around rank 0's one-line error."""
    sets = ["--set", f"run.out_dir={tmp_path}", "--set", "train.steps=2", "--set", "checkpoint.every_steps=2"]
    proc = cli("train", "tiny", "--nproc", "2", *sets, "--set", "checkpoint.durable_dir=/proc/durable")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    # The refusal and the launcher's summary: rank 1 (its peer's line said it all) and the agent
    # (the worker said why) add nothing; they added "rank 1: lost a peer (...)" and "agent: ...".
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith("error: checkpoint.durable_dir /proc/durable: cannot write")
    assert lines[1].startswith("error: a worker rejected the job (see its message above)")


def test_plan_memory_refuses_a_job_without_a_transformer(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """It printed a transformer table from the ResNet job's unused model.* defaults."""
    proc = cli("plan", "memory", "resnet-tiny", cwd=tmp_path)
    assert "run.recipe 'resnet-cifar' trains no hpcpipe transformer" in _one_line_error(proc)


def test_a_job_the_runs_checkpoints_refuse_changes_nothing_in_the_run(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Another model shape on an existing run: refused with the keys that changed, and the run's
    config.yaml and lineage.json stay as they were (they are what the checkpoints belong to),
    whether the job runs in the CLI's process or on two ranks behind the launcher."""
    sets = ["--set", f"run.out_dir={tmp_path}", "--set", "checkpoint.every_steps=2", "--set", "train.steps=2"]
    assert cli("train", "tiny", *sets, cwd=tmp_path).returncode == 0
    run = tmp_path / "tiny"
    kept = {name: (run / name).read_bytes() for name in ("config.yaml", "lineage.json")}
    for nproc in ("1", "2"):
        # train.steps=4: a run that trains on, so the checkpoint's load is what refuses (a finished
        # run refuses new settings before it loads anything: tests/unit/launch/test_job.py)
        more = ("--set", "train.steps=4", "--set", "model.d_model=64")
        proc = cli("train", "tiny", *sets, "--nproc", nproc, *more, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "does not load into this model" in proc.stderr and "model.d_model 32 -> 64" in proc.stderr
        assert {name: (run / name).read_bytes() for name in kept} == kept
        # Both ranks refuse: the node says it once (it printed one line per rank).
        assert proc.stderr.count("does not load into this model") == 1, proc.stderr


def test_a_new_run_with_a_secret_in_a_launch_env_is_refused(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A local train never renders a script or a manifest, yet its config.yaml and the tracked
    params would hold the value: refused before anything is written, whichever scheduler's env."""
    secret = "launch.slurm.env={HF_TOKEN: hf_SECRETVALUE}"
    proc = cli("train", "tiny", "--set", f"run.out_dir={tmp_path}", "--set", secret, cwd=tmp_path)
    assert "launch.slurm.env: HF_TOKEN looks like a secret" in _one_line_error(proc)
    assert not (tmp_path / "tiny").exists()


def test_a_runs_stored_config_keeps_its_old_secret_but_takes_no_new_one(tmp_path: Path) -> None:
    """Resuming from the run's own config.yaml (written before the check) stays possible; a
    --set adding another secret to it is a new one, and refused."""
    from hpcpipe.cli.common import load_new_run
    from hpcpipe.config import load_config
    from hpcpipe.errors import ConfigError

    job = load_config("tiny", [f"run.out_dir={tmp_path}", "launch.k8s.env={HF_TOKEN: hf_x}"])
    job.run_dir.mkdir()
    stored = job.run_dir / "config.yaml"
    stored.write_text(job.to_yaml())
    assert load_new_run(str(stored), None).launch.k8s.env == {"HF_TOKEN": "hf_x"}
    # A sweep or a study starts new runs from it (its points and trials copy the value): refused.
    with pytest.raises(ConfigError, match=r"launch\.k8s\.env: HF_TOKEN looks like a secret"):
        load_new_run(str(stored), None, resumes=False)
    with pytest.raises(ConfigError, match=r"launch\.slurm\.env: WANDB_API_KEY looks like a secret"):
        load_new_run(str(stored), ["launch.slurm.env={WANDB_API_KEY: k}"])
    copy = tmp_path / "copy.yaml"  # the same text elsewhere is a new run's job file
    copy.write_text(job.to_yaml())
    with pytest.raises(ConfigError, match=r"launch\.k8s\.env: HF_TOKEN looks like a secret"):
        load_new_run(str(copy), None)


def test_presets_list_and_show(cli) -> None:  # type: ignore[no-untyped-def]
    from hpcpipe.presets import preset_names

    listing = cli("presets", "list")  # a pipe: one tab-separated row per preset, names whole
    assert listing.returncode == 0
    rows = [line.split("\t") for line in listing.stdout.splitlines()]
    assert rows[0][0] == "preset" and [row[0] for row in rows[1:]] == preset_names()
    assert any(row[0] == "resnet-fashion-mnist" for row in rows)  # `| grep fashion` finds it
    names = cli("presets", "list", "--names")
    assert names.stdout.split() == preset_names()
    shown = cli("presets", "show", "quickstart")
    assert shown.returncode == 0
    assert "global_batch_size: 16" in shown.stdout


def test_presets_show_raw_prints_a_job_files_own_text(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    job = tmp_path / "job.yaml"
    job.write_text("# mine\ntrain: {steps: 5}\n")
    shown = cli("presets", "show", "--raw", str(job))  # it was "unknown preset 'job.yaml'"
    assert shown.returncode == 0 and shown.stdout == job.read_text(), shown.stderr
    missing = cli("presets", "show", "--raw", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and missing.stderr.strip().splitlines() == [
        f"error: config file not found: {tmp_path / 'nope.yaml'}"
    ]


def test_model_smaller_than_tokenizer_fails_before_workers_start(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = cli(
        "train",
        "tiny",
        "--nproc",
        "2",
        "--set",
        "model.vocab_size=10",
        "--set",
        f"run.out_dir={tmp_path}",
        "--set",
        f"data.prepared_dir={tmp_path}/d",
        cwd=tmp_path,
    )
    line = _one_line_error(proc)
    assert "model.vocab_size (10) is smaller than the tokenizer's vocabulary" in line
    assert "worker" not in proc.stderr  # rejected in the launcher, no worker was started


def test_a_failed_or_preempted_worker_group_exits_with_its_code() -> None:
    import typer

    from hpcpipe.cli.train import _report_failure
    from hpcpipe.config import load_config
    from hpcpipe.launch.job import WorkerFailure
    from hpcpipe.train.preempt import Preempted

    job = load_config("tiny")
    for failure, code in ((WorkerFailure(75), 75), (WorkerFailure(1), 1), (Preempted(4, 75), 75)):
        with pytest.raises(typer.Exit) as exited:
            _report_failure(job, failure)
        assert exited.value.exit_code == code


def test_a_long_failure_line_is_not_wrapped_or_read_as_markup(capfd: pytest.CaptureFixture[str]) -> None:
    import typer

    from hpcpipe.cli.train import _report_failure
    from hpcpipe.config import load_config
    from hpcpipe.launch.job import WorkerFailure

    job = load_config("tiny", [f"run.out_dir=/tmp/{'deep/' * 30}[1]"])  # 170+ columns, a `[`
    with pytest.raises(typer.Exit):
        _report_failure(job, WorkerFailure(1))
    lines = capfd.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(f"{job.run_dir}"), lines


def _printed(width: int | None, *args: object, **kwargs: object) -> str:
    """What ``common.print_table`` shows on a terminal of ``width`` columns (None: piped)."""
    import io

    from rich.console import Console

    from hpcpipe.cli import common

    out = io.StringIO()
    screen = Console(file=out, width=width or 80, force_terminal=width is not None, color_system=None)
    original, common.console = common.console, screen
    try:
        if width is None:  # piped rows go through typer.echo
            import contextlib

            with contextlib.redirect_stdout(out):
                common.print_table(*args, **kwargs)  # type: ignore[arg-type]
        else:
            common.print_table(*args, **kwargs)  # type: ignore[arg-type]
    finally:
        common.console = original
    return out.getvalue()


def test_typed_values_are_never_cut_or_wrapped_at_any_width() -> None:
    """Every CLI table (jobs, pods, models, checkpoints, trials, sweep points, presets) prints
    through ``common.print_table``: what a user types back stays whole on one line."""
    from hpcpipe.cli import common
    from hpcpipe.presets import preset_names

    path = "/scratch/runs/a-rather-long-run-name/checkpoints/step-00001200"
    args = (("step", "verified", "path"), [["1200", "[green]yes[/], every file", path]])
    for width in (None, 40, 80, 200):
        shown = _printed(width, *args, typed={"step", "path"})
        assert any(path in line for line in shown.splitlines()), (width, shown)
    assert _printed(None, *args, typed={"path"}).splitlines() == [
        "step\tverified\tpath",
        f"1200\tyes, every file\t{path}",
    ]
    assert "path: " + path in _printed(40, *args, typed={"path"})  # too narrow: one block per row
    from hpcpipe.cli.presets import _row

    rows = [_row(name) for name in preset_names()]
    headers = ("preset", "model", "global batch", "steps", "parallel", "description")
    shown = _printed(72, headers, rows, typed={"preset"})
    first_cells = [line.split("│")[1].strip() for line in shown.splitlines() if "│" in line]
    assert [cell for cell in first_cells if cell] == preset_names()  # descriptions wrap, names never
    assert common.console.soft_wrap and common.err_console.soft_wrap


@pytest.mark.parametrize(("signum", "said"), [(2, "interrupted"), (1, "stopped by SIGHUP")])
def test_torchs_signal_exception_exits_128_plus_its_signal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], signum: int, said: str
) -> None:
    """A signal that reaches torch's agent handler ends the launcher as dying of it would, in one
    line: it was a SignalException traceback and exit 1."""
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException

    from hpcpipe.cli import app as app_module

    def raising() -> None:
        raise SignalException("Process got signal", signal.Signals(signum))

    monkeypatch.setattr(app_module, "app", raising)
    with pytest.raises(SystemExit) as exited:
        app_module.main()
    assert exited.value.code == 128 + signum
    assert capsys.readouterr().err == f"{said}\n"


EARLY_SIGNAL = """
import os, signal, sys, time
from hpcpipe.cli import app
from hpcpipe.launch import job

SIGNAL = signal.Signals[sys.argv[1]]
WHEN = sys.argv[4]

def signalled(*args, **kwargs):  # the fork server's start: a preemption arrives now
    if WHEN == "cut-import":  # it cut `import torch` short: torch cannot be imported again
        for name in ("torch", "hpcpipe.train.preempt", "hpcpipe.train.trial"):
            sys.modules[name] = None
    os.kill(os.getpid(), SIGNAL)
    time.sleep(5)

job.prestart_fork_server = signalled
sys.argv = ["hpcpipe", sys.argv[2], "tiny", "--nproc", "2", "--set", f"run.out_dir={sys.argv[3]}"]
app.main()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("signame", "verb", "when"),
    [
        ("SIGTERM", "train", "after-imports"),
        ("SIGUSR1", "train", "after-imports"),
        ("SIGTERM", "run", "after-imports"),
        # its report imported torch again: a 112-line ImportError, exit 1
        ("SIGTERM", "train", "cut-import"),
    ],
)
def test_a_preemption_before_the_agent_exits_75_in_one_line(
    tmp_path: Path, signame: str, verb: str, when: str
) -> None:
    """It killed the launcher (143, 138) with nothing printed; `launch agent` exits 75 already."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", EARLY_SIGNAL, signame, verb, str(tmp_path), when],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert proc.returncode == 75, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("preempted;"), proc.stderr[-2000:]
