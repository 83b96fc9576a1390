"""Rank 0's view of training: a rich progress bar on a terminal, plain log lines otherwise."""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class TrainProgress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.enabled = enabled
        self.total = total
        self.interactive = enabled and sys.stdout.isatty()
        self._status = ""
        self._progress: Progress | None = None
        if self.interactive:
            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[status]}"),
                console=Console(),
            )
            self._task = self._progress.add_task("train", total=total, status="")

    def __enter__(self) -> TrainProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()

    def advance(self, step: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=step, status=self._status)

    def note(self, text: str) -> None:
        """One line before training (the layout): above the bar on a terminal, else a log line."""
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, flush=True)

    def show(self, row: dict[str, Any]) -> None:
        """A metrics row: into the bar's status on a terminal, as a log line otherwise."""
        if not self.enabled:
            return
        line = format_row(row)
        if self._progress is not None:
            self._status = line
            self._progress.update(self._task, status=line)
            if "val_loss" in row:
                self._progress.console.print(f"step {row['step']:>6}  {line}")
        else:
            print(f"step {row['step']:>6}/{self.total}  {line}", flush=True)


def format_row(row: dict[str, Any]) -> str:
    if "val_loss" in row:
        return "  ".join(f"{key} {_metric(value)}" for key, value in row.items() if key.startswith("val_"))
    rate_key = next((k for k in row if k.endswith("_per_s")), None)
    # DeepSpeed ZeRO-0 measures no gradient norm: the row says None, the line "n/a"
    gnorm = "n/a" if row.get("grad_norm") is None else f"{row['grad_norm']:.2f}"
    parts = [f"loss {row['loss']:.4f}", f"lr {row['lr']:.2e}", f"gnorm {gnorm}"]
    if rate_key is not None:
        parts.append(f"{rate_key.removesuffix('_per_s')}/s {row[rate_key]:,.0f}")
    if row.get("mfu") is not None:
        parts.append(f"mfu {100 * row['mfu']:.1f}%")
    return "  ".join(parts)


def _metric(value: float) -> str:
    """Four decimals, or four significant digits below 0.01: Katib's collector reads these lines,
    and every metric under 5e-5 read 0.0000."""
    return f"{value:.4f}" if value == 0 or abs(value) >= 0.01 else f"{value:.4g}"
