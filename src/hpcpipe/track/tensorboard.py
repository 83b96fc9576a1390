"""TensorBoard event files under ``<run_dir>/tensorboard`` (``observe.tensorboard``), rank 0.

Scalars: training rows as ``train/<key>``, evaluation rows as ``eval/<key>``; the flattened
config as hyper-parameters (the HPARAMS tab) and as text; events as text at their step. The
writer's own thread does the file I/O. A resumed run purges what was written after the step it
resumed from, as metrics.jsonl does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout
from hpcpipe.track.params import as_text, flatten

SKIPPED_KEYS = {"step", "world_size", "slowest_rank", "time"}


class TensorBoardSink:
    def __init__(self, run_dir: Path, config: dict[str, Any], start_step: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
            from torch.utils.tensorboard.summary import hparams
        except ImportError:  # tensorboard is an extra
            raise UserError(
                "observe.tensorboard needs tensorboard: pip install 'hpcpipe[tensorboard]'"
            ) from None
        self.writer = SummaryWriter(
            str(RunLayout(run_dir).tensorboard), purge_step=start_step + 1 if start_step else 0
        )
        if start_step == 0:
            text = "```yaml\n" + yaml.safe_dump(config, sort_keys=False) + "```"
            self.writer.add_text("config", text, 0)
            values = {k: _hparam(v) for k, v in flatten(config).items()}
            files = self.writer.file_writer  # created by add_text above
            assert files is not None
            for summary in hparams(values, {"eval/val_loss": math.nan}):
                files.add_summary(summary)

    def on_row(self, row: dict[str, Any]) -> None:
        step = int(row["step"])
        group = "train" if "loss" in row else "eval"
        for key, value in row.items():
            if key not in SKIPPED_KEYS and isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(f"{group}/{key}", value, step)

    def on_event(self, kind: str, fields: dict[str, Any]) -> None:
        step = fields.get("step")
        text = f"`{kind}` " + json.dumps(fields, default=str)
        self.writer.add_text("events", text, int(step) if isinstance(step, int) else None)

    def close(self, finished: bool) -> None:
        self.writer.close()


def _hparam(value: Any) -> int | float | str | bool:
    """The HPARAMS plugin takes numbers, strings and booleans only."""
    return value if isinstance(value, int | float | str | bool) else as_text(value)
