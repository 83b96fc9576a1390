"""`hpcpipe report` on files that are damaged, foreign or ambiguous: one line naming the file, or a
report that still tells runs apart and compares like with like."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.unit.report.test_plots_run import write_run

from hpcpipe.errors import UserError
from hpcpipe.report.run_report import build_report, load_runs
from hpcpipe.report.study import build_study, optimization_table


def test_a_knob_is_compared_only_between_runs_equal_in_everything_else_swept() -> None:
    """bf16 on 1, 2 and 4 devices against fp32 on 4 read as 'fp32 1.2x faster, 3 pairs'."""
    rows = [
        {
            "precision": "bf16",
            "devices": n,
            "throughput": 100.0 * n,
            "point": f"train.precision=bf16 nproc={n}",
        }
        for n in (1, 2, 4)
    ]
    rows.append(
        {"precision": "fp32", "devices": 4, "throughput": 240.0, "point": "train.precision=fp32 nproc=4"}
    )
    [only] = optimization_table(rows)
    assert (only["after"], only["pairs"]) == ("fp32", 1) and only["ratio"] == pytest.approx(0.6)
    lr = [
        {"precision": p, "throughput": t, "point": f"train.precision={p} train.lr={lr}"}
        for p, lr, t in (("bf16", 0.1, 100.0), ("fp32", 0.1, 50.0), ("fp32", 0.3, 90.0))
    ]
    assert optimization_table(lr)[0]["pairs"] == 1  # the lr=0.3 run has no bf16 twin


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        (
            "scaling.csv",
            "mode,nproc\nstrong,1\n",
            "no per_s, efficiency, global_batch_size, step_time_s column",
        ),
        ("sweep.csv", "run_id,throughput\na,fast\n", "line 2: throughput 'fast' is not a number"),
    ],
)
def test_a_study_csv_without_what_the_report_needs_is_named(
    tmp_path: Path, name: str, text: str, says: str
) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(UserError, match=f"{name}.*{says}"):
        build_study(tmp_path)


def test_damaged_hpo_files_and_foreign_eval_tables_are_named_or_skipped(tmp_path: Path) -> None:
    from hpcpipe.report.hpo_study import hpo_study_parts

    study = tmp_path / "study"
    (study / "trials").mkdir(parents=True)
    (study / "study.json").write_text('{"study": ')
    with pytest.raises(UserError, match=r"study.json: not valid JSON"):
        hpo_study_parts(study)
    (study / "study.json").write_text('{"study": "s", "metric": "val_loss"}')
    (study / "trials.csv").write_text("number,state\n0,COMPLETE\n")
    with pytest.raises(UserError, match=r"trials.csv: no value, last_step, seconds column"):
        hpo_study_parts(study)
    run = write_run(tmp_path, "run")
    (run / "eval.json").write_text(json.dumps({"step": 30, "metrics": {"a": 1.0}, "tables": [1, 2]}))
    (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text() + '{"step": 31, "loss": 1.0}\n')
    made = build_report([run])  # a list of tables, a row without a rate: AttributeError, KeyError
    assert Path(made["markdown"]).is_file()


@pytest.mark.parametrize(("field", "value"), [("hosts", "vm"), ("versions", "x")])
def test_a_lineage_of_another_shape_is_named(tmp_path: Path, field: str, value: str) -> None:
    """ "hosts": "vm" or "versions": "x" ended the report in an AttributeError traceback."""
    run = write_run(tmp_path, "run")
    lineage = json.loads((run / "lineage.json").read_text())
    (run / "lineage.json").write_text(json.dumps({**lineage, field: value}))
    with pytest.raises(UserError, match=rf"lineage.json: {field} is a str, expected a"):
        load_runs([run])


def test_each_run_keeps_its_own_label_when_names_and_directories_collide(tmp_path: Path) -> None:
    """a/ and b/ both named 'tiny', c/ named 'a': two runs were labelled 'a' and their curves joined."""
    (tmp_path / "lc").mkdir()
    made = [(write_run(tmp_path / d, name), d) for d, name in (("a", "tiny"), ("b", "tiny"), ("c", "a"))]
    runs = [run.rename(tmp_path / "lc" / d) for run, d in made]
    labels = [run.label for run in load_runs(runs)]
    assert len(set(labels)) == 3, labels


def test_two_scaling_studies_are_two_lines_each_with_its_own_ideal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every scaling.csv under DIR was merged into one series per mode: two strong-scaling studies
    drew one zig-zag line, and 'ideal' came from whichever N=1 row sorted first."""
    import matplotlib.axes

    header = "mode,nproc,per_s,efficiency,global_batch_size,step_time_s,time_per_epoch_s\n"
    for name, base in (("a100", 100.0), ("h100", 300.0)):
        (tmp_path / name).mkdir()
        rows = [
            f"{mode},{n},{base * n * 0.9},0.9,{8 * n},0.5,10\n"
            for mode in ("strong", "weak")
            for n in (1, 2, 4)
        ]
        (tmp_path / name / "scaling.csv").write_text(header + "".join(rows))
    drawn: dict[str, tuple[list[float], list[float]]] = {}
    plot = matplotlib.axes.Axes.plot

    def record(ax: Any, x: Any, y: Any, *args: Any, **kw: Any) -> Any:
        drawn.setdefault(kw.get("label", ""), (list(x), list(y)))  # the throughput plot comes first
        return plot(ax, x, y, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", record)
    made = build_study(tmp_path)
    assert drawn["a100: strong scaling"] == ([1, 2, 4], [90.0, 180.0, 360.0])
    assert drawn["h100: strong scaling"] == ([1, 2, 4], [270.0, 540.0, 1080.0])
    assert drawn["a100: strong: ideal"][1] == [90.0, 180.0, 360.0]
    assert drawn["h100: strong: ideal"][1] == [270.0, 540.0, 1080.0]
    assert "a100: time per epoch (s)" in drawn and "h100: time per epoch (s)" in drawn
    assert made["weak_variation"] == 0.0
    table = Path(made["markdown"]).read_text()
    assert "| study | mode | N |" in table and "| h100 | weak | 4 |" in table


def test_weak_studies_in_different_units_share_no_axis_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One study with epochs in its CSV, one without: the axis said the last one's unit, and the
    other's step times were read as times per epoch."""
    from hpcpipe.report import study

    rows = [
        {"study": name, "mode": "weak", "nproc": n, "step_time_s": 0.5, "time_per_epoch_s": epoch}
        for name, epoch in (("a100", None), ("h100", 10.0))
        for n in (1, 2)
    ]
    axes: list[Any] = []
    real_save = study._save

    def keep(fig: Any, path: Path) -> Path:
        axes.append(fig.axes[0])
        return real_save(fig, path)

    monkeypatch.setattr(study, "_save", keep)
    study.plot_weak_epoch_time(rows, tmp_path / "weak.png")
    legend = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert "a100: step time (s)" in legend and "h100: time per epoch (s)" in legend
    assert axes[0].get_ylabel() not in ("step time (s)", "time per epoch (s)")
    study.plot_weak_epoch_time(rows[:2], tmp_path / "one.png")  # one study: its unit on the axis
    assert axes[1].get_ylabel() == "step time (s)"
