"""Rebuild the pre-trained ``@tiny-llama`` that ships with hpcpipe (``src/hpcpipe/models/tiny_llama/``).

Needed after a change to what it is built from (the texts, the pre-training recipe) or to the code
that builds it; ``tests/unit/models/test_tiny_lm.py`` fails until then. Pre-trains on this machine
(1.5 to 4 minutes on 2 cores), never from a kept copy, and records where in ``BUILD.json``.

    python scripts/build_tiny_llama.py           # rebuild when the shipped copy is out of date
    python scripts/build_tiny_llama.py --force   # rebuild anyway
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when the shipped copy is current")
    args = parser.parse_args()
    os.environ["HPCPIPE_CACHE_DIR"] = ""  # pre-train here: no machine's kept copy
    import torch
    import transformers

    from hpcpipe.doctor.host import cpu_model
    from hpcpipe.models import tiny_lm

    name = tiny_lm.default_tiny_name(pretrained=True)
    if not args.force and tiny_lm.shipped_copy(name) is not None:
        print(f"{tiny_lm.SHIPPED / name} is current: nothing to do (--force rebuilds it)")
        return 0
    shipped = tiny_lm.SHIPPED
    tiny_lm.SHIPPED = shipped.with_name("no-shipped-copy")  # never copied into its own rebuild
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        built = tiny_lm.default_tiny_dir(Path(tmp), pretrained=True)
        seconds = time.perf_counter() - started
        shutil.rmtree(shipped, ignore_errors=True)
        shutil.copytree(built, shipped / name)
    record = {
        "code": tiny_lm.build_code_stamp(),
        "built": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "seconds": round(seconds, 1),
    }
    (shipped / name / "BUILD.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {shipped / name} ({seconds:.0f} s of pre-training)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
