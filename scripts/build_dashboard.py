"""Generate deploy/grafana/hpcpipe.json with the pinned grafana-foundation-sdk.

    .venv/bin/python scripts/build_dashboard.py [OUT]   (default: deploy/grafana/hpcpipe.json)

The panels are data (``PANELS``: title, PromQL, unit); tests/unit/project/test_deploy.py regenerates the
file and compares, checks every expression with ``promtool``, and the Prometheus integration test
runs them against a live server scraping a real 2-rank run. Edit here, not in the JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

OUT = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "hpcpipe.json"
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
R = '{run=~"$run"}'
RATE = "$__rate_interval"

Panel = tuple[str, list[tuple[str, str]], str, str]  # title, [(expr, legend)], unit, "ts" | "stat"
BY_GPU = "{{node}} gpu{{gpu}}"


def ts(title: str, unit: str, *targets: tuple[str, str]) -> Panel:
    return title, list(targets), unit, "ts"


def st(title: str, unit: str, expr: str) -> Panel:
    return title, [(expr, "{{run}}")], unit, "stat"


def quantile(q: float, metric: str) -> str:
    return f"histogram_quantile({q}, sum by (run, le) (rate({metric}_bucket{R}[{RATE}])))"


def rate_sum(metric: str) -> str:
    return f"sum by (run) (rate({metric}{R}[{RATE}]))"


PHASE_SHARE = (
    f"sum by (run, phase) (rate(hpcpipe_phase_seconds_total{R}[{RATE}])) / ignoring (phase) "
    f"group_left sum by (run) (rate(hpcpipe_step_duration_seconds_sum{R}[{RATE}]))"
)
VAL_LOSS = 'max by (run) (hpcpipe_eval_metric{run=~"$run", metric="val_loss"})'

PANELS: dict[str, list[Panel]] = {
    "Training": [
        ts("Throughput (tokens/s)", "short", (rate_sum("hpcpipe_tokens_total"), "{{run}}")),
        ts("Throughput (samples/s)", "short", (rate_sum("hpcpipe_samples_total"), "{{run}}")),
        ts("Loss", "none", (f"max by (run) (hpcpipe_loss{R})", "{{run}} train"), (VAL_LOSS, "{{run}} val")),
        ts("MFU", "percentunit", (f"avg by (run) (hpcpipe_mfu_ratio{R})", "{{run}}")),
        ts(
            "Step time p50 / p95",
            "s",
            (quantile(0.5, "hpcpipe_step_duration_seconds"), "{{run}} p50"),
            (quantile(0.95, "hpcpipe_step_duration_seconds"), "{{run}} p95"),
        ),
        ts("Phase share of step time", "percentunit", (PHASE_SHARE, "{{run}} {{phase}}")),
        ts("Rank imbalance", "percentunit", (f"max by (run) (hpcpipe_imbalance_ratio{R})", "{{run}}")),
        st("Slowest rank", "none", f"max by (run) (hpcpipe_slowest_rank{R})"),
        ts("Peak memory", "bytes", (f"max by (run, rank) (hpcpipe_memory_peak_bytes{R})", "r{{rank}}")),
    ],
    "GPUs": [
        ts("GPU utilisation", "percentunit", (f"hpcpipe_gpu_utilization_ratio{R}", BY_GPU)),
        ts("GPU power", "watt", (f"hpcpipe_gpu_power_watts{R}", BY_GPU)),
        ts("GPU temperature", "celsius", (f"hpcpipe_gpu_temperature_celsius{R}", BY_GPU)),
        ts("SM clock", "hertz", (f"hpcpipe_gpu_sm_clock_hertz{R}", BY_GPU)),
        st("Throttled GPUs", "none", f"sum by (run) (hpcpipe_gpu_throttled{R})"),
        st("Uncorrected ECC errors", "none", f"sum by (run) (hpcpipe_gpu_ecc_uncorrected_errors_total{R})"),
        ts("GPU memory used", "bytes", (f"hpcpipe_gpu_memory_used_bytes{R}", BY_GPU)),
    ],
    "Fault tolerance": [
        # Over the dashboard's range: each process counts from 0 (every resume, every restart).
        st(
            "Checkpoints committed",
            "none",
            f"sum by (run) (increase(hpcpipe_checkpoint_saves_total{R}[$__range]))",
        ),
        ts("Save time p95", "s", (quantile(0.95, "hpcpipe_checkpoint_save_duration_seconds"), "{{run}}")),
        st("Restarts", "none", f"max by (run) (hpcpipe_restarts{R})"),
        st("OOM recoveries", "none", f"sum by (run) (increase(hpcpipe_oom_recoveries_total{R}[$__range]))"),
        st("Since the last step", "s", f"time() - max by (run) (hpcpipe_last_step_timestamp_seconds{R})"),
    ],
}

ANNOTATIONS = [
    ("Checkpoints", f"increase(hpcpipe_checkpoint_saves_total{R}[1m]) > 0", "blue"),
    ("Restarts", f"changes(hpcpipe_restarts{R}[2m]) > 0", "red"),
    ("Imbalance", f"increase(hpcpipe_imbalance_events_total{R}[2m]) > 0", "orange"),
]


def all_exprs() -> list[str]:
    """Every PromQL expression in the dashboard (panels and annotations)."""
    exprs = [expr for row in PANELS.values() for _, targets, _, _ in row for expr, _ in targets]
    return exprs + [expr for _, expr, _ in ANNOTATIONS]


def build() -> dict[str, object]:
    board = (
        dashboard.Dashboard("hpcpipe training")
        .uid("hpcpipe-training")
        .tags(["hpcpipe", "training"])
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(
            dashboard.QueryVariable("run")
            .label("Run")
            .datasource(DS)
            .query("label_values(hpcpipe_steps_total, run)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
        )
    )
    for name, expr, color in ANNOTATIONS:
        board = board.annotation(
            dashboard.AnnotationQuery().name(name).datasource(DS).enable(True).icon_color(color).expr(expr)
        )
    for row, panels in PANELS.items():
        board = board.with_row(dashboard.Row(row))
        for title, targets, unit, kind in panels:
            panel = (stat.Panel() if kind == "stat" else timeseries.Panel()).title(title).unit(unit)
            panel = panel.datasource(DS).height(8).span(6 if kind == "stat" else 12)
            for ref, (expr, legend) in zip("ABCDEFGH", targets, strict=False):
                panel = panel.with_target(prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref))
            board = board.with_panel(panel)
    encoded: dict[str, object] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return encoded


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(build(), indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
