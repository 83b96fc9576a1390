"""`hpcpipe data prepare|verify` through typer's test runner (function-calling jobs through the real CLI:
their preparation imports torch and transformers), and torch kept off the module's import path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hpcpipe.cli.data import app
from hpcpipe.errors import DataError

runner = CliRunner()


def _prepare_args(corpus: Path, tmp_path: Path) -> list[str]:
    return [
        "prepare",
        "tiny",
        "--set",
        f"data.sources=[{corpus}]",
        "--set",
        f"data.prepared_dir={tmp_path / 'prepared'}",
        "--set",
        "data.max_bytes=null",
    ]


def test_prepare_then_reuse_with_json(tiny_corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    first = runner.invoke(app, [*_prepare_args(tiny_corpus, tmp_path), "--json", str(out)])
    assert first.exit_code == 0, first.output
    assert "prepared" in first.output and "train" in first.output
    result = json.loads(out.read_text())
    assert result["reused"] is False and result["tokenizer"]["kind"] == "bytes"
    assert result["splits"]["train"]["tokens"] > result["splits"]["val"]["tokens"] > 0
    second = runner.invoke(app, [*_prepare_args(tiny_corpus, tmp_path), "--json", "-"])
    assert second.exit_code == 0
    again = json.loads(second.stdout)  # standard output carries the JSON alone
    assert again["reused"] is True and again["path"] == result["path"]


def test_verify_reports_ok_and_names_damage(tiny_corpus: Path, tmp_path: Path) -> None:
    runner.invoke(app, _prepare_args(tiny_corpus, tmp_path))
    # (and .resolved/, the ranks' record, once the corpus is older than its 2 s racy window)
    [dataset] = [p for p in (tmp_path / "prepared").iterdir() if not p.name.startswith(".")]
    ok = runner.invoke(app, ["verify", str(dataset)])
    assert ok.exit_code == 0 and "ok" in ok.output
    (dataset / "val-00000.bin").write_bytes(b"")
    bad = runner.invoke(app, ["verify", str(dataset)])
    assert isinstance(bad.exception, DataError)  # the main app prints it as one line, exit 2
    assert "val-00000.bin" in str(bad.exception)


def test_bad_source_is_a_data_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["prepare", "tiny", "--set", f"data.sources=[{tmp_path}/nope]"])
    assert isinstance(result.exception, DataError) and "nope" in str(result.exception)


def _fc_args(prepared: Path, *sets: str) -> list[str]:
    # The random-weight tiny Llama builds in a second (the pre-trained one takes minutes once).
    overrides = [f"data.prepared_dir={prepared}", "model.name_or_path=@tiny-llama-random", *sets]
    return ["data", "prepare", "lora-fc-tiny", *(arg for kv in overrides for arg in ("--set", kv))]


def test_prepare_function_calling_then_reuse_and_verify(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    first = cli(*_fc_args(tmp_path, "data.synthetic_rows=60"), "--json", "-", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout)  # standard output carries the JSON alone (no library notes)
    path = Path(result["path"])
    assert result["reused"] is False and path == tmp_path / f"fc-{result['fingerprint']}"
    assert result["rows"] == 60 and result["encoded"]["train"] > 0 and result["sequences"]["train"] > 0
    assert sorted(result["files"]) == ["eval.npz", "heldout.jsonl", "train.npz"]
    assert all((path / name).is_file() for name in result["files"])

    second = cli(*_fc_args(tmp_path, "data.synthetic_rows=60"), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith(f"reused {path} in ") and "heldout" in second.stdout

    bad = cli(*_fc_args(tmp_path, f"data.sources=[{tmp_path}/nope.jsonl]"), cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "nope.jsonl" in bad.stderr

    ok = runner.invoke(app, ["verify", str(path)])
    assert ok.exit_code == 0 and ok.output.startswith(f"ok {path} "), ok.output
    with (path / "heldout.jsonl").open("a") as fh:
        fh.write("\n")
    damaged = runner.invoke(app, ["verify", str(path)])
    assert isinstance(damaged.exception, DataError) and "heldout.jsonl" in str(damaged.exception)
    reuse = cli(*_fc_args(tmp_path, "data.synthetic_rows=60"), cwd=tmp_path)  # was reused as it was
    assert reuse.returncode == 2 and f"{path}/heldout.jsonl: corrupted" in reuse.stderr, reuse.stderr
    assert f"delete {path} and run again" in reuse.stderr
    report = json.loads((path / "data_report.json").read_text())
    del report["files"]  # prepared before the hashes were recorded
    (path / "data_report.json").write_text(json.dumps(report))
    old = runner.invoke(app, ["verify", str(path)])
    assert isinstance(old.exception, DataError) and "hpcpipe data prepare" in str(old.exception)
    older = cli(*_fc_args(tmp_path, "data.synthetic_rows=60"), cwd=tmp_path)
    assert older.returncode == 0, older.stderr  # reused unchecked, as before


def test_verify_names_both_kinds_of_prepared_directory(tmp_path: Path) -> None:
    result = runner.invoke(app, ["verify", str(tmp_path)])
    assert isinstance(result.exception, DataError)
    assert "manifest.json" in str(result.exception) and "data_report.json" in str(result.exception)


def test_cli_module_does_not_import_torch() -> None:
    code = "import sys, hpcpipe.cli.data, hpcpipe.data; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_gc_days_frees_the_space_the_copy_needs_before_it(
    tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The too-small-cache error names --gc-days as the remedy, but the entries went only after a
    successful copy: the suggested command failed the same way and removed nothing."""
    import os
    import time

    from hpcpipe.data import stage as staging

    assert runner.invoke(app, _prepare_args(tiny_corpus, tmp_path)).exit_code == 0
    (dataset,) = [path for path in (tmp_path / "prepared").iterdir() if not path.name.startswith(".")]
    old = tmp_path / "cache" / ("a" * 64)
    old.mkdir(parents=True)
    (old / staging.MARKER).write_text("{}")
    os.utime(old / staging.MARKER, (time.time() - 30 * 86400,) * 2)
    usage = staging.shutil.disk_usage(tmp_path)
    # the old entry holds what the copy needs: no room while it is there
    monkeypatch.setattr(
        staging.shutil, "disk_usage", lambda path: usage._replace(free=1000 if old.exists() else usage.free)
    )
    result = runner.invoke(app, ["stage", str(dataset), str(tmp_path / "cache"), "--gc-days", "7"])
    assert result.exit_code == 0, result.output
    assert not old.exists() and "removed unused cache entry aaaa" in result.output


def test_a_preemption_mid_copy_exits_with_the_job_s_code_and_stages_nothing_in_part(
    tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`data stage` (the hpcpipe-torch runtime's init step) died of SIGTERM with 143, which the
    runtime's failure policy reads as a crash: an evicted pod failed the whole job instead of
    restarting it."""
    import os
    import signal

    from hpcpipe.data import stage as staging

    copy_one = staging._copy_one

    def evicted(*args: object) -> None:  # the kubelet's SIGTERM, in the middle of the copy
        os.kill(os.getpid(), signal.SIGTERM)
        copy_one(*args)  # type: ignore[arg-type]

    def unhandled(_signum: int, _frame: object) -> None:  # not this test process's death
        raise RuntimeError("SIGTERM reached the test's handler")

    monkeypatch.setattr(staging, "_copy_one", evicted)
    cache = tmp_path / "cache"
    sets = [f"data.sources=[{tiny_corpus}]", f"data.prepared_dir={tmp_path / 'prepared'}"]
    sets += [f"data.cache_dir={cache}", "fault.preempt_exit_code=42"]
    args = ["stage", "--job", "tiny", "--workers", "1", *(a for s in sets for a in ("--set", s))]
    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        result = runner.invoke(app, args)
        assert signal.getsignal(signal.SIGTERM) is unhandled  # put back as it was
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == 42, result.output
    assert result.stderr.count("\n") == 1 and "preempted" in result.stderr, result.stderr
    assert [p.name for p in cache.iterdir() if p.is_dir()] == []  # neither the entry nor its .tmp-*
