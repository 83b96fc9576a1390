"""Generate the reference pages in docs/reference/ from the code.

    .venv/bin/python scripts/build_reference.py           write them (`make docs` runs this)
    .venv/bin/python scripts/build_reference.py --check   exit 1 naming each stale page

config.md (the config models), cli.md (the CLI itself), run-directory.md (hpcpipe.layout),
exit-codes.md (the *_EXIT_CODE constants) and events.md (hpcpipe.observe.event_kinds). Edit the
code's descriptions and docstrings, not the Markdown. A config field without a description (or a
section without a docstring) stops the build with exit 2, naming it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import reference_cli
import reference_config
import reference_events
import reference_exit_codes
import reference_run_dir
from reference_markdown import MissingDescription

OUT = Path(__file__).resolve().parents[1] / "docs" / "reference"
PAGES: dict[str, Callable[[], str]] = {
    "config.md": reference_config.build,
    "cli.md": reference_cli.build,
    "run-directory.md": reference_run_dir.build,
    "exit-codes.md": reference_exit_codes.build,
    "events.md": reference_events.build,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="compare with the committed pages, write nothing"
    )
    parser.add_argument("--out", type=Path, default=OUT, help="the folder to write (default docs/reference)")
    args = parser.parse_args()
    try:
        pages = {name: build() for name, build in PAGES.items()}
    except MissingDescription as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        stale = [
            n
            for n, text in pages.items()
            if not (args.out / n).is_file() or (args.out / n).read_text() != text
        ]
        for name in stale:
            print(f"docs/reference/{name} is stale: run `make docs`", file=sys.stderr)
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in pages.items():
        (args.out / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
