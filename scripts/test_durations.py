"""Per-file test durations from pytest's JUnit XML: the table `tests/durations.json` that orders the
suite (longest files first) and the before/after table in benchmarks/README.md.

    python scripts/test_durations.py record JUNIT.xml            # rewrite tests/durations.json
    python scripts/test_durations.py table BEFORE.xml AFTER.xml  # a Markdown table, slowest first
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


def table(before: Path, after: Path, top: int) -> None:
    old, new = per_file(before), per_file(after)
    old = _renamed(old, new)
    names = sorted(set(old) | set(new), key=lambda n: -max(old.get(n, 0), new.get(n, 0)))
    print("| test file | before (s) | after (s) |")
    print("|---|---:|---:|")
    for name in names[:top]:
        print(f"| `{name}` | {old.get(name, 0):.0f} | {new.get(name, 0):.0f} |")
    rest_old = sum(old.get(n, 0) for n in names[top:])
    rest_new = sum(new.get(n, 0) for n in names[top:])
    print(f"| {len(names) - top} other files | {rest_old:.0f} | {rest_new:.0f} |")
    print(f"| **all test time (both workers)** | **{sum(old.values()):.0f}** | **{sum(new.values()):.0f}** |")


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
    tab = sub.add_parser("table", help="a Markdown before/after table of two JUnit XMLs")
    tab.add_argument("before", type=Path)
    tab.add_argument("after", type=Path)
    tab.add_argument("--top", type=int, default=25)
    use = sub.add_parser("cpu", help="CPU seconds per test file from HPCPIPE_TEST_CPU's JSON lines")
    use.add_argument("jsonl", type=Path)
    use.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    if args.verb == "record":
        record(args.junit)
    elif args.verb == "cpu":
        cpu(args.jsonl, args.top)
    else:
        table(args.before, args.after, args.top)


if __name__ == "__main__":
    main()
