"""`hpcpipe report DIR...`: one-run and comparison reports from hand-written run directories.

The run directories are built by hand (no training) with the files a real run leaves:
config.yaml, lineage.json, metrics.jsonl, events.jsonl and eval.json.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from tests.helpers import run_cli
from typer.testing import CliRunner

from hpcpipe.cli.report import report
from hpcpipe.errors import UserError
from hpcpipe.observe.run_summary import summarize_run_dir
from hpcpipe.report.plots_run import plot_from_csv
from hpcpipe.report.run_report import build_report
from hpcpipe.report.series import read_series_csv
from hpcpipe.sweep import write_sweep_csv

EVENTS = [
    {"event": "checkpoint_saved", "step": 10, "path": "ckpt/step-10"},
    {"event": "restart", "step": 15, "restart_count": 1},
    {"event": "oom_recovered", "step": 22, "micro_batch_size": 2},
]


def write_run(
    root: Path, name: str, *, lr: float = 1e-3, mfu: bool = True, phases: bool = True, events: bool = True
) -> Path:
    """A finished-looking run directory: 30 training rows, 3 evaluations, events and eval.json."""
    run = root / name
    run.mkdir(parents=True)
    config = {
        "run": {"name": name, "recipe": "gpt"},
        "train": {
            "steps": 30,
            "global_batch_size": 8,
            "micro_batch_size": 4,
            "precision": "bf16",
            "lr": lr,
            "channels_last": False,
        },
        "parallel": {"strategy": "ddp", "bucket_cap_mb": 25},
        "data": {"num_workers": 0},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    lineage = {
        "git_sha": "0123456789abcdef0123",
        "config_hash": f"cfg{name}hash0000000000",
        "dataset_manifest_sha256": "feedbeef" * 8,
        "hosts": ["node01", "node02"],
        "world_size": 2,
        "versions": {"torch": "2.11.0"},
        "steps": {"prepare": {"status": "done"}, "train": {"status": "done"}},
    }
    (run / "lineage.json").write_text(json.dumps(lineage))
    rows = [_train_row(step, mfu, phases) for step in range(1, 31)]
    for step in (10, 20, 30):
        rows.insert(step + step // 10 - 1, {"step": step, "val_loss": 3.0 - step / 20, "val_acc": step / 100})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if events:
        lines = [{"time": 1.7e9 + i, **e} for i, e in enumerate(EVENTS)]
        (run / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    result = {
        "step": 30,
        "metrics": {"exact_match": 0.375, "tool_accuracy": 0.625},
        "tables": {"per_category": {"simple": {"accuracy": 0.5, "n": 8}, "parallel": {"accuracy": 0.25}}},
    }
    (run / "eval.json").write_text(json.dumps(result))
    return run


def _train_row(step: int, mfu: bool, phases: bool) -> dict[str, Any]:
    row: dict[str, Any] = {
        "step": step,
        "loss": 4.0 - step / 10,
        "lr": 1e-3,
        "grad_norm": 1.0,
        "tokens_per_s": 1000.0 + step,
        "mem_bytes": 2**30 + step * 2**20,
        "world_size": 2,
        "step_time_s": 0.5,
    }
    if mfu:
        row["mfu"] = 0.3
    if phases:
        row |= {"data_time_s": 0.05, "forward_time_s": 0.15, "backward_time_s": 0.2, "optimizer_time_s": 0.05}
    return row


def _is_png(uri: str) -> bool:
    return base64.b64decode(uri.removeprefix("data:image/png;base64,")).startswith(b"\x89PNG")


def test_one_run_report_is_self_contained_with_events_and_eval(tmp_path: Path) -> None:
    run = write_run(tmp_path, "quick")
    made = build_report([run])
    out = run / "report"
    assert made["markdown"] == str(out / "report.md")
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    sources = re.findall(r"<img [^>]*src=\"([^\"]*)\"", html)
    assert len(sources) == html.count("<img") == 5  # loss, throughput, mfu, memory, phases
    assert all(s.startswith("data:image/png;base64,") and _is_png(s) for s in sources)
    assert "<script" not in html.lower() and "http://" not in html and "https://" not in html
    assert "<link" not in html.lower() and "@import" not in html
    pngs = re.findall(r"!\[[^]]*\]\(([^)]+)\)", md)
    assert {Path(p).name for p in pngs} == {
        "loss.png",
        "throughput.png",
        "mfu.png",
        "memory.png",
        "phases.png",
    }
    assert all((out / p).is_file() for p in pngs)
    for event in EVENTS:
        assert f"| {event['step']} | {event['event']} |" in md
    assert "restart_count=1" in md and "| exact_match | 0.375 |" in md and "| simple | 0.5 | 8 |" in md
    assert "| parallel | 0.25 | - |" in md and "| 30 | 1.5 | 0.3 |" in md  # val rows over steps
    assert "| train | done |" in md  # lineage.json pipeline steps
    for fact in ("gpt", "node01, node02", "0123456789abcdef0123", "cfgquickhash", "feedbeef", "2.11.0"):
        assert fact in md and fact in html
    assert "| median throughput (after the first interval) | 1,016 tokens/s |" in md
    assert "| median MFU | 30.0% |" in md and "| peak memory (GiB) | 1.03 |" in md
    assert "| final train loss | 1 |" in md and "| first val loss | 2.5 (step 10) |" in md
    build_report([run])
    assert (out / "report.md").read_text() == md  # nothing time-dependent


def test_plots_whose_data_is_absent_are_skipped(tmp_path: Path) -> None:
    run = write_run(tmp_path, "bare", mfu=False, phases=False, events=False)
    made = build_report([run], tmp_path / "out")
    names = {Path(p).name for p in made["plots"]}
    assert names == {"loss.png", "throughput.png", "memory.png"}
    assert not (tmp_path / "out" / "mfu.png").exists() and not (tmp_path / "out" / "phases.png").exists()
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Events" not in md and "| median MFU | - |" in md
    assert not (run / "report").exists()  # --out given: nothing written into the run directory


def test_two_runs_compare_with_differing_config_keys_and_redraw_from_csv(tmp_path: Path) -> None:
    a, b = write_run(tmp_path, "lr-small", lr=1e-3), write_run(tmp_path, "lr-big", lr=3e-3, mfu=False)
    out = tmp_path / "cmp"
    made = build_report([a, b], out)
    md = (out / "report.md").read_text()
    assert "# Comparison of 2 runs" in md
    assert re.search(
        r"^\| lr-small \| gpt \| 2 \| 30 \| 1 \| 1.5 \| 1,016 tokens/s \| 30.0% \| cfglr-smallh \|$", md, re.M
    )
    assert re.search(r"^\| lr-big \| gpt \| 2 \| 30 \| .* \| - \| cfglr-bighas \|$", md, re.M)
    assert "| train.lr | 0.001 | 0.003 |" in md and "| run.name | lr-small | lr-big |" in md
    assert "train.global_batch_size" not in md  # equal in both runs
    rows = read_series_csv(out / "series.csv")
    assert {r.run for r in rows} == {"lr-small", "lr-big"}
    assert {Path(p).name for p in made["plots"]} == {"loss.png", "val_loss.png", "throughput.png"}
    redrawn = plot_from_csv(out / "series.csv", tmp_path / "redrawn")
    assert [p.path.name for p in redrawn] == [Path(p).name for p in made["plots"]]
    assert all(p.path.read_bytes().startswith(b"\x89PNG") for p in redrawn)


def test_one_run_redraws_the_same_plots_from_its_csv(tmp_path: Path) -> None:
    run = write_run(tmp_path, "again")
    made = build_report([run])
    rows = read_series_csv(run / "report" / "series.csv")
    assert {"loss", "val_loss", "mfu", "event:restart"} <= {r.series for r in rows}
    redrawn = plot_from_csv(run / "report" / "series.csv", tmp_path / "redrawn")
    assert sorted(p.path.name for p in redrawn) == sorted(Path(p).name for p in made["plots"])


def test_sweep_directory_gets_its_study_and_its_runs_compared(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    runs = [write_run(sweep, "p-fp32"), write_run(sweep, "p-bf16", lr=2e-3)]
    rows = [{"point": f"train.lr={r.name}", "status": "trained", **summarize_run_dir(r)} for r in runs]
    write_sweep_csv(rows, sweep / "sweep.csv")
    made = build_report([sweep])
    out = sweep / "report"
    assert (out / "study.md").is_file() and (out / "sweep_throughput.png").is_file()
    assert sorted(Path(r).name for r in made["runs"]) == ["p-bf16", "p-fp32"]
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert "| p-fp32 | gpt |" in md and "| p-bf16 | gpt |" in md and "study.md" in md
    assert html.count("<img") == 4 and "https://" not in html  # 3 overlays + the sweep plot, inlined


def test_a_path_that_is_neither_is_one_line_user_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"empty: not a run directory \(no config.yaml\).*sweep.csv"):
        build_report([tmp_path / "empty"])
    proc = run_cli("report", str(tmp_path / "empty"), timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1
    assert str(tmp_path / "empty") in proc.stderr


def test_cli_function_writes_and_prints_where(tmp_path: Path) -> None:
    run = write_run(tmp_path, "cli")
    app = typer.Typer()
    app.command()(report)
    result = CliRunner().invoke(app, [str(run), "--out", str(tmp_path / "o"), "--json", "-"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["html"] == str(tmp_path / "o" / "report.html")
    result = CliRunner().invoke(app, [str(run), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0 and "# Run report: cli" in result.output and "report.html" in result.output


def test_names_are_escaped_in_html_and_markdown_tables(tmp_path: Path) -> None:
    run = write_run(tmp_path, "evil")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["run"]["name"] = "a|<b>x</b>"
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    result = json.loads((run / "eval.json").read_text())
    result["metrics"]["pass|fail"] = 1
    (run / "eval.json").write_text(json.dumps(result))
    build_report([run])
    html = (run / "report" / "report.html").read_text()
    assert "<b>" not in html and "a|&lt;b&gt;x&lt;/b&gt;" in html
    assert "| pass\\|fail | 1 |" in (run / "report" / "report.md").read_text()
