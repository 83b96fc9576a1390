"""No table cuts a typed value off a terminal: the CLI's rich tables, rendered on an 80-column
terminal, a narrower one and a pipe, hold every number, name and verdict whole (rich's default
shrinks columns and cuts their cells to "…")."""

from __future__ import annotations

import io
import sys
from collections.abc import Collection
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text
from tests.unit.accept.test_accept import THRESHOLDS, collective, good

from hpcpipe.accept.evaluate import evaluate
from hpcpipe.cli import analysis, bench, common, plan, plan_memory
from hpcpipe.cli.accept import verdict_table
from hpcpipe.cli.common import print_whole

Printed = list[tuple[Table, set[str]]]
ACCEPT_WRAPS = {"required", "where"}  # as `hpcpipe accept` prints it


def _screen(width: int, terminal: bool = True) -> Console:
    file = io.StringIO()
    return Console(width=width, file=file, force_terminal=terminal, color_system=None, soft_wrap=True)


def _plain(cell: object) -> str:
    return cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain


def _assert_whole(view: Console, printed: Printed) -> str:
    """Every typed cell (and header) on one output line; every word of a wrapping cell whole."""
    out = view.file.getvalue()  # type: ignore[attr-defined]
    lines = out.splitlines()
    assert printed and "…" not in out, out
    for table, wraps in printed:
        for column in table.columns:
            for cell in (column.header, *column.cells):
                value = _plain(cell)
                if str(column.header) in wraps:
                    missing = [word for word in value.split() if word not in out]
                    assert not missing, (missing, out)
                else:
                    assert any(value in line for line in lines), (value, out)
    return out


def _failing_accept_table() -> Table:
    """The accept table with a failing, long-winded row: a slow rank named on its host."""
    measured = good()
    measured["collectives"]["results"][1] = collective(1 << 30, 35.123456, [5e-3, 5e-3, 9e-3, 5e-3])
    return verdict_table("h100-8x-ib", evaluate(THRESHOLDS, measured, 4))


def test_the_accept_table_keeps_every_value_whole_at_80_columns() -> None:
    view, table = _screen(80), _failing_accept_table()
    print_whole(table, view, wraps=ACCEPT_WRAPS)
    out = _assert_whole(view, [(table, ACCEPT_WRAPS)])
    assert "FAIL" in out and "35.1" in out and "┃ result ┃" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_a_narrower_terminal_gets_one_block_per_row() -> None:
    view, table = _screen(40), _failing_accept_table()
    print_whole(table, view, wraps=ACCEPT_WRAPS)
    out = _assert_whole(view, [(table, ACCEPT_WRAPS)])
    assert out.startswith("acceptance: h100-8x-ib\n") and "┃" not in out
    assert "result: FAIL\n" in out and "measured: 35.1\n" in out


def test_a_pipe_gets_the_table_as_wide_as_it_needs() -> None:
    view, table = _screen(40, terminal=False), _failing_accept_table()
    print_whole(table, view, wraps=ACCEPT_WRAPS)
    out = _assert_whole(view, [(table, ACCEPT_WRAPS)])
    assert "┃ result ┃ check" in out and max(len(line) for line in out.splitlines()) > 40


@pytest.fixture
def printed(monkeypatch: pytest.MonkeyPatch) -> tuple[Console, Printed]:
    """Every table the CLI verbs print goes to an 80-column terminal, and is recorded."""
    view, seen = _screen(80), []

    def spy(table: Table, target: Console | None = None, wraps: Collection[str] = ()) -> None:
        seen.append((table, set(wraps)))
        print_whole(table, view, wraps)

    for module in (bench, plan, plan_memory, analysis):
        monkeypatch.setattr(module, "print_whole", spy)
    monkeypatch.setattr(common, "console", view)
    return view, seen


def _main(monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    from hpcpipe.cli.app import main

    monkeypatch.setattr(sys, "argv", ["hpcpipe", *args])
    with pytest.raises(SystemExit) as stop:
        main()
    assert not stop.value.code


def test_the_bench_tables_keep_every_value_whole(printed: tuple[Console, Printed]) -> None:
    view, seen = printed
    result = {"world_size": 16, "backend": "nccl", "device": "cuda", "dtype": "bfloat16", "iters": 20}
    row = {"collective": "reduce_scatter", "size_bytes": 1 << 30, "time_s": 0.0123456, "algbw_gbps": 87.21}
    row |= {"busbw_gbps": 163.512, "correct": False, "wrong_ranks": [3, 11], "slowest_rank": 11}
    bench._print_collectives({**result, "results": [{**row, "slow_ranks": [11]}]}, view)
    throughput = {"unit": "tokens", "precision": "bf16-mixed", "global_batch_size": 512, "name": "gpt-1.3b"}
    throughput |= {"world_size": 64, "per_s": 1234567.0, "per_s_per_device": 19290.1, "step_time_s": 0.4246}
    bench._print_throughput({**throughput, "mfu": 0.4312, "runs": [{}, {}, {}]}, view)
    _assert_whole(view, seen)
    assert len(seen) == 2


def test_the_plan_and_roofline_tables_keep_every_value_whole(
    printed: tuple[Console, Printed], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    view, seen = printed
    goodput = ["--save-s", "2", "--restore-s", "3", "--restart-s", "90", "--durable-save-s", "300"]
    goodput += ["--gpus", "1024,16384", "--replicas", "20", "--out", str(tmp_path)]
    _main(monkeypatch, "plan", "goodput", *goodput)
    _main(monkeypatch, "plan", "memory", "gpt-124m", "--gpus", "8", "--gpu", "h100")
    roofs = ["--peak-tflops", "989", "--bandwidth-gbps", "3350", "--png", str(tmp_path / "r.png")]
    _main(monkeypatch, "roofline", "tiny", *roofs)
    _assert_whole(view, seen)
    assert len(seen) == 3 + 2 + 1
