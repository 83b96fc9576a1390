"""`hpcpipe report DIR...`: a self-contained report of one run, or a comparison of several.

Reads only what run directories hold (config.yaml, lineage.json, metrics.jsonl, events.jsonl,
eval.json) and writes ``report.md``, ``report.html`` (one file: PNGs inlined as data URIs, inline
CSS, no scripts, no links out), the PNGs and ``series.csv``, whose rows every plot is drawn from.
A sweep or scaling-study directory gets its study report (:func:`build_study`) and its run
directories are compared. Nothing time-dependent goes into the report, so it regenerates
identically from the same directories.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

from hpcpipe.errors import UserError
from hpcpipe.layout import ReportLayout, RunLayout
from hpcpipe.report.hpo_study import hpo_study_parts, is_hpo_study
from hpcpipe.report.plots_run import Plot, draw_plots
from hpcpipe.report.run_tables import (
    Table,
    comparison_table,
    config_diff,
    eval_tables,
    events_table,
    header_facts,
    key_figures,
    pipeline_table,
)
from hpcpipe.report.series import RunData, find_run_dirs, is_run_dir, load_run, write_series_csv
from hpcpipe.report.study import build_study, find_study_csvs

# made[key]: (template, file written)
TEMPLATES = {
    "markdown": ("run_report.md.j2", ReportLayout.MARKDOWN),
    "html": ("run_report.html.j2", ReportLayout.HTML),
}


def default_out(paths: list[Path]) -> Path:
    """One directory (run or study): DIR/report; several: ./report in the current directory."""
    return paths[0] / RunLayout.REPORT if len(paths) == 1 else Path(RunLayout.REPORT)


def resolve_inputs(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """Run directories (given, or found up to two levels under a study) and study directories."""
    runs: list[Path] = []
    studies: list[Path] = []
    for path in paths:
        if is_run_dir(path):
            runs.append(path)
        elif _is_study_dir(path) or is_hpo_study(path):
            studies.append(path)
            runs += find_run_dirs(path)
        else:
            raise UserError(
                f"{path}: not a run directory (no config.yaml) and not a study directory "
                "(no scaling.csv or sweep.csv under it, no study.json of `hpcpipe hpo`)"
            )
    unique = list({run.resolve(): run for run in runs}.values())
    return unique, studies


def _is_study_dir(path: Path) -> bool:
    try:
        find_study_csvs(path)
    except UserError:
        return False
    return True


def build_report(paths: list[Path], out: Path | None = None) -> dict[str, Any]:
    """Write the report of ``paths`` (run and/or study directories) under ``out``; what was made."""
    if not paths:
        raise UserError("give at least one run or study directory")
    run_dirs, study_dirs = resolve_inputs(paths)
    out = out or default_out(paths)
    out.mkdir(parents=True, exist_ok=True)
    studies = [_build_one_study(d, out, several=len(study_dirs) > 1) for d in study_dirs]
    runs = load_runs(run_dirs)
    rows = [row for run in runs for row in run.rows]
    csv_path = write_series_csv(rows, ReportLayout(out).series)
    # The plots are drawn from the very rows written to series.csv.
    plots = draw_plots(rows, out, compare=len(runs) > 1)
    context = report_context(runs, plots, studies, out)
    made: dict[str, Any] = {
        "runs": [str(run.path) for run in runs],
        "series_csv": str(csv_path),
        "plots": [str(plot.path) for plot in plots],
        "studies": studies,
    }
    for key, (template, filename) in TEMPLATES.items():
        path = out / filename
        path.write_text(render(template, context).rstrip() + "\n")
        made[key] = str(path)
    return made


def load_runs(run_dirs: list[Path]) -> list[RunData]:
    """The runs, labelled by run.name, or by directory name where names repeat (sweep points);
    ``#N`` (its place on the command line) where that label is taken too: a label names one run,
    in the tables, series.csv and the plots' legends."""
    runs = [load_run(d) for d in run_dirs]
    labels = [run.label for run in runs]
    names = [run.path.name for run in runs]
    for index, run in enumerate(runs):
        if labels.count(run.label) > 1:
            by_dir = run.path.name
            taken = names.count(by_dir) > 1 or by_dir in labels
            run.label = f"{by_dir}#{index + 1}" if taken else by_dir
    for run in runs:
        run.rows = [row._replace(run=run.label) for row in run.rows]
    return runs


def _build_one_study(directory: Path, out: Path, several: bool) -> dict[str, Any]:
    if is_hpo_study(directory):  # its section is read from its files when the report is drawn
        _, _, plots = hpo_study_parts(directory)
        return {"directory": str(directory), "hpo": True, "plots": [str(p) for p in plots]}
    # Several studies would overwrite each other's study.md: each gets its own folder then.
    made = build_study(directory, out / directory.resolve().name if several else out)
    made["directory"] = str(directory)
    return made


def report_context(
    runs: list[RunData], plots: list[Plot], studies: list[dict[str, Any]], out: Path
) -> dict[str, Any]:
    """What the templates show: a title, header facts and titled sections of tables and plots."""
    sections = _single_sections(runs[0], plots) if len(runs) == 1 else _comparison_sections(runs, plots)
    sections += [_study_section(study, out) for study in studies]
    if len(runs) == 1:
        title = f"Run report: {runs[0].label}"
    else:
        title = f"Comparison of {len(runs)} runs" if runs else "Study report"
    return {"title": title, "facts": header_facts(runs[0]) if len(runs) == 1 else [], "sections": sections}


def _section(
    title: str, tables: list[Table | None], plots: list[Plot] | None = None, text: str = ""
) -> dict[str, Any]:
    return {
        "title": title,
        "tables": [t for t in tables if t is not None],
        "plots": [_plot_view(p.title, p.path, p.path.name) for p in plots or []],
        "text": text,
    }


def _single_sections(run: RunData, plots: list[Plot]) -> list[dict[str, Any]]:
    sections = [_section("Key figures", [key_figures(run)])]
    if plots:
        sections.append(_section("Plots", [], plots))
    if run.events:
        sections.append(_section("Events", [events_table([run])]))
    evaluation = eval_tables(run)
    if evaluation:
        sections.append(_section("Evaluation", list(evaluation)))
    pipeline = pipeline_table(run)
    if pipeline:
        sections.append(_section("Pipeline steps", [pipeline]))
    return sections


def _comparison_sections(runs: list[RunData], plots: list[Plot]) -> list[dict[str, Any]]:
    if not runs:
        return []
    diff = config_diff(runs)
    sections = [
        _section("Runs", [comparison_table(runs)]),
        _section(
            "Config differences", [diff] if diff.rows else [], text="" if diff.rows else "No differences."
        ),
    ]
    if plots:
        sections.append(_section("Plots", [], plots))
    if any(run.events for run in runs):
        sections.append(_section("Events", [events_table(runs)]))
    return sections


def _study_section(study: dict[str, Any], out: Path) -> dict[str, Any]:
    if study.get("hpo"):
        title, tables, plots = hpo_study_parts(Path(study["directory"]))
        views = [
            _plot_view(p.stem.replace("_", " "), p, Path(os.path.relpath(p, out)).as_posix()) for p in plots
        ]
        return {"title": title, "tables": tables, "plots": views, "text": ""}
    markdown = Path(study["markdown"])
    link = Path(os.path.relpath(markdown, out)).as_posix()
    plots = [Path(p) for p in study["plots"]]
    views = [_plot_view(p.stem.replace("_", " "), p, Path(os.path.relpath(p, out)).as_posix()) for p in plots]
    text = f"Tables and bottleneck verdicts: {link} (from the CSVs of {study['directory']})."
    return {"title": f"Study: {study['directory']}", "tables": [], "plots": views, "text": text}


def _plot_view(title: str, path: Path, relative: str) -> dict[str, str]:
    """A plot as the templates need it: its file for Markdown, its bytes inlined for HTML."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return {"title": title, "file": relative, "data_uri": f"data:image/png;base64,{data}"}


def render(template: str, context: dict[str, Any]) -> str:
    """Render one of the report templates; HTML is autoescaped, Markdown cells escape '|'."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("hpcpipe.report", "templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default_for_string=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["md_row"] = md_row
    env.filters["md_rule"] = lambda header: "|" + " --- |" * len(header)
    return env.get_template(template).render(**context)


def md_cell(value: Any) -> str:
    """A Markdown table cell: '|' escaped and line breaks flattened so the row stays one row."""
    return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def md_row(cells: list[Any]) -> str:
    return "| " + " | ".join(md_cell(cell) for cell in cells) + " |"
