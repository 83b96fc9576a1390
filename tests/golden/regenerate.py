"""Regenerate the golden loss curve of the tiny model (single process, 20 steps).

Run after a deliberate change to the model, data order or optimizer, from the repository root:
    .venv/bin/python tests/golden/regenerate.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from tests.distributed.test_trainer_parity import train_tiny  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        losses = train_tiny(Path(tmp), "golden", 1)
    out = {"preset": "tiny", "corpus": "tests.helpers.write_synthetic_corpus", "losses": losses}
    (HERE / "tiny_single_loss.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {len(losses)} losses")


if __name__ == "__main__":
    main()
