"""Which interpreter has the kfp SDK, and compiling a pipeline spec with it.

kfp needs ``kubernetes<31`` and ``protobuf<7``, which conflict with the k8s extra, so the pipeline
is compiled in an interpreter of its own: ``kfp_compile.py`` imports kfp and the standard library
only, and reads the spec (``spec.py``) as JSON on standard input.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcpipe.errors import UserError

# The SDK the pipeline is compiled with (also the `kfp` dependency group of the lock).
KFP_REQUIREMENTS = ("kfp==2.17.3", "kfp-kubernetes==2.17.3")
KFP_PYTHON_VAR = "HPCPIPE_KFP_PYTHON"
# What `make kfp-env` builds beside the project's .venv: the lock's `kfp` group alone.
KFP_VENV = ".venv-kfp"


def compile_pipeline(spec: dict[str, Any], out: Path) -> None:
    """Compile ``spec`` to KFP's IR YAML at ``out`` with the kfp SDK; UserError if it cannot run."""
    script = Path(__file__).with_name("kfp_compile.py")
    try:
        done = subprocess.run(
            # -I: neither the script's own directory first on sys.path, nor PYTHON* variables or
            # user site-packages: the kfp environment sees only what it installed.
            [*kfp_interpreter(), "-I", str(script), str(out)],
            input=json.dumps(spec),
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"launch kfp: the kfp compiler did not run ({exc})") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or [f"exit {done.returncode}"]
        raise UserError(f"launch kfp: the kfp compiler failed: {lines[-1]}")


def kfp_interpreter(roots: Sequence[Path] | None = None) -> list[str]:
    """The command that runs Python with kfp: $HPCPIPE_KFP_PYTHON; else the project's own
    ``.venv-kfp`` (``make kfp-env``) under one of ``roots`` (default: ``project_roots()``); else
    ``uv run`` with the pinned SDK in an isolated, cached environment. Never this interpreter:
    hpcpipe checks the train step's job with the k8s extra's models, and kfp cannot share an
    environment with them."""
    chosen = os.environ.get(KFP_PYTHON_VAR)
    if chosen:
        if not Path(chosen).is_file():
            raise UserError(f"{KFP_PYTHON_VAR}={chosen}: no such interpreter")
        return [chosen]
    for root in project_roots() if roots is None else roots:
        python = root / KFP_VENV / "bin" / "python"
        if python.is_file():
            return [str(python)]
    uv = shutil.which("uv")
    if uv is not None:
        pins = [arg for req in KFP_REQUIREMENTS for arg in ("--with", req)]
        return [uv, "run", "--quiet", "--isolated", "--no-project", *pins, "python"]
    raise UserError(
        "launch kfp compiles with the kfp SDK, which cannot share an environment with the k8s extra: "
        f"run `make kfp-env` in the hpcpipe checkout (it builds {KFP_VENV} beside .venv), install uv, "
        f"or make an environment with `pip install {' '.join(KFP_REQUIREMENTS)}` and set "
        f"{KFP_PYTHON_VAR} to its python"
    )


def project_roots() -> list[Path]:
    """Where ``make kfp-env`` may have put ``.venv-kfp``: beside the virtual environment hpcpipe
    runs in (``make install``'s ``.venv``), and at the root of the checkout this source file lies
    in (an editable install run from another interpreter)."""
    roots = []
    if sys.prefix != sys.base_prefix:  # a virtual environment: its directory's parent
        roots.append(Path(sys.prefix).parent)
    checkout = Path(__file__).resolve().parents[3]  # src/hpcpipe/kfp/sdk.py -> the checkout
    if (checkout / "pyproject.toml").is_file() and checkout not in roots:
        roots.append(checkout)
    return roots
