"""The acceptance report: ``acceptance.json`` (everything, for machines) and ``acceptance.md``."""

from __future__ import annotations

import json
import platform
import socket
import time
from pathlib import Path
from typing import Any

from hpcpipe.accept.evaluate import Row, fmt
from hpcpipe.accept.thresholds import Thresholds


def build_report(
    th: Thresholds, source: str, rows: list[Row], measurements: dict[str, Any], world_size: int
) -> dict[str, Any]:
    import hpcpipe

    failed = [r for r in rows if not r.passed]
    return {
        "thresholds": {"name": th.name, "source": source, "description": th.description},
        "passed": not failed and bool(rows),
        "counts": {"rows": len(rows), "passed": len(rows) - len(failed), "failed": len(failed)},
        "rows": [r.to_dict() for r in rows],
        "measurements": measurements,
        "environment": {
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "launcher_host": socket.gethostname(),
            "world_size": world_size,
            "platform": platform.platform(),
            "hpcpipe": hpcpipe.__version__,
        },
    }


def to_markdown(report: dict[str, Any]) -> str:
    th, counts = report["thresholds"], report["counts"]
    verdict = "PASS" if report["passed"] else "FAIL"
    lines = [
        f"# Acceptance: {verdict} ({counts['passed']}/{counts['rows']} rows pass)",
        "",
        f"Thresholds: `{th['name']}` ({th['source']}). {th['description']}".rstrip(),
        f"Run {report['environment']['time_utc']} from {report['environment']['launcher_host']}, "
        f"world size {report['environment']['world_size']}.",
        "",
        "| result | section | check | measured | required | detail |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        required = f"{r['comparison']} {fmt(r['required'])} {r['unit']}".rstrip()
        detail = r["detail"].replace("|", "\\|")
        lines.append(
            f"| {'PASS' if r['passed'] else '**FAIL**'} | {r['section']} | {r['check']} | "
            f"{fmt(r['measured'])} | {required} | {detail} |"
        )
    failed = [r for r in report["rows"] if not r["passed"]]
    if failed:
        lines += ["", "## Failing rows", ""]
        lines += [f"- **{r['check']}**: {r['detail']}" for r in failed]
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "acceptance.json", out_dir / "acceptance.md"
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    md_path.write_text(to_markdown(report))
    return json_path, md_path
