"""`hpcpipe data prepare|verify` through typer's test runner, and torch kept off its import path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
    [dataset] = (tmp_path / "prepared").iterdir()
    ok = runner.invoke(app, ["verify", str(dataset)])
    assert ok.exit_code == 0 and "ok" in ok.output
    (dataset / "val-00000.bin").write_bytes(b"")
    bad = runner.invoke(app, ["verify", str(dataset)])
    assert isinstance(bad.exception, DataError)  # the main app prints it as one line, exit 2
    assert "val-00000.bin" in str(bad.exception)


def test_bad_source_is_a_data_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["prepare", "tiny", "--set", f"data.sources=[{tmp_path}/nope]"])
    assert isinstance(result.exception, DataError) and "nope" in str(result.exception)


def test_cli_module_does_not_import_torch() -> None:
    code = "import sys, hpcpipe.cli.data, hpcpipe.data; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
