"""Per-file test durations from pytest's JUnit XML: the table `tests/durations.json` that orders the
suite (longest files first) and the before/after table in benchmarks/README.md.

    python scripts/test_durations.py record JUNIT.xml            # rewrite tests/durations.json
    python scripts/test_durations.py table BEFORE.xml AFTER.xml  # a Markdown table, slowest first
    python scripts/test_durations.py table A.xml tests/durations.json --labels AVX2,AVX-512
    python scripts/test_durations.py cpu CPU.jsonl               # CPU seconds per file (HPCPIPE_TEST_CPU)
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

DURATIONS = Path(__file__).resolve().parent.parent / "tests" / "durations.json"


def per_file(junit: Path) -> dict[str, float]:
    """Seconds per test file: the sum of its test cases' times (setup and teardown included).

    The XML is pytest's own output for this project's suite (not untrusted input)."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        # classname is the dotted module path, plus the class for tests in a class.
        parts = case.get("classname", "").split(".")
        while parts and not parts[-1].startswith("test_"):
            parts.pop()
        if parts:
            totals["/".join(parts) + ".py"] += float(case.get("time", 0))
    return dict(totals)


def record(junit: Path) -> None:
    found = per_file(junit)
    ordered = {name: round(found[name], 1) for name in sorted(found, key=lambda n: -found[n])}
    DURATIONS.write_text(json.dumps(ordered, indent=1) + "\n")
    print(f"wrote {DURATIONS} ({len(ordered)} files, {sum(ordered.values()):.0f} s of test time)")


def table(runs: list[Path], top: int, labels: list[str] | None = None) -> None:
    """A Markdown table of seconds per file, one column per run (a JUnit XML, or a per-file JSON
    such as ``tests/durations.json``), slowest first; the first run's files renamed to the last's."""
    found = [_seconds(run) for run in runs]
    found = [_renamed(f, found[-1]) for f in found]
    heads = labels or (["before", "after"] if len(runs) == 2 else [run.stem for run in runs])
    names = sorted(set().union(*found), key=lambda n: -max(f.get(n, 0) for f in found))
    print("| test file | " + " | ".join(f"{h} (s)" for h in heads) + " |")
    print("|---|" + "---:|" * len(runs))
    for name in names[:top]:
        print(f"| `{name}` | " + " | ".join(f"{f.get(name, 0):.0f}" for f in found) + " |")
    rest = [sum(f.get(n, 0) for n in names[top:]) for f in found]
    print(f"| {len(names) - top} other files | " + " | ".join(f"{r:.0f}" for r in rest) + " |")
    totals = " | ".join(f"**{sum(f.values()):.0f}**" for f in found)
    print(f"| **all test time (both workers)** | {totals} |")


def _seconds(run: Path) -> dict[str, float]:
    if run.suffix == ".json":
        return {str(k): float(v) for k, v in json.loads(run.read_text()).items()}
    return per_file(run)


def _renamed(old: dict[str, float], new: dict[str, float]) -> dict[str, float]:
    """``old`` with each file that moved to another folder (same file name) under its new path."""
    by_name = {Path(n).name: n for n in new}
    return {(n if n in new else by_name.get(Path(n).name, n)): t for n, t in old.items()}


def cpu(path: Path, top: int) -> None:
    """CPU seconds per test file from the JSON lines the suite's HPCPIPE_TEST_CPU hook wrote
    (module fixtures count in the file's first test)."""
    totals: dict[str, float] = defaultdict(float)
    for line in path.read_text().splitlines():
        row = json.loads(line)
        totals[row["test"].split("::", 1)[0]] += float(row["cpu_s"])
    print("| test file | CPU (s) |")
    print("|---|---:|")
    for name in sorted(totals, key=lambda n: -totals[n])[:top]:
        print(f"| `{name}` | {totals[name]:.0f} |")
    print(f"| **all** | **{sum(totals.values()):.0f}** |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    rec = sub.add_parser("record", help="rewrite tests/durations.json from a JUnit XML")
    rec.add_argument("junit", type=Path)
    tab = sub.add_parser("table", help="a Markdown table of JUnit XMLs or per-file JSONs, one column each")
    tab.add_argument("runs", type=Path, nargs="+")
    tab.add_argument("--top", type=int, default=25)
    tab.add_argument("--labels", help="column names, comma-separated (default: before, after for two)")
    use = sub.add_parser("cpu", help="CPU seconds per test file from HPCPIPE_TEST_CPU's JSON lines")
    use.add_argument("jsonl", type=Path)
    use.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    if args.verb == "record":
        record(args.junit)
    elif args.verb == "cpu":
        cpu(args.jsonl, args.top)
    else:
        labels = args.labels.split(",") if args.labels else None
        if labels is not None and len(labels) != len(args.runs):
            parser.error(f"--labels: {len(labels)} names for {len(args.runs)} runs")
        missing = [str(run) for run in args.runs if not run.is_file()]
        if missing:
            parser.error(f"no such file: {', '.join(missing)}")
        table(args.runs, args.top, labels)


if __name__ == "__main__":
    main()
