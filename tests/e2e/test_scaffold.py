"""`hpcpipe new recipe NAME` writes a package a user can install and test as it is: generated here,
installed into a fresh virtual environment (which sees this one's packages, as a user's sees
hpcpipe's), and its own test, which runs `hpcpipe recipes check`, passes there."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from tests.helpers import run_cli, uv_binary

pytestmark = pytest.mark.timeout(900)


def _venv_seeing_this_one(venv: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    parent = sysconfig.get_paths()["purelib"]  # torch, hpcpipe (editable), pytest: this environment's
    Path(site, "parent-environment.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    return python


def test_a_generated_recipe_package_installs_and_its_own_test_passes(tmp_path: Path) -> None:
    pkg = tmp_path / "fresh-model"
    proc = run_cli("new", "recipe", "fresh-model", "--dir", str(pkg))
    assert proc.returncode == 0, proc.stderr
    python = _venv_seeing_this_one(tmp_path / "venv")
    install = [
        uv_binary(),
        "pip",
        "install",
        "--quiet",
        "--python",
        str(python),
        "--no-deps",
        "--no-build-isolation",
    ]
    subprocess.run([*install, str(pkg)], check=True, capture_output=True, text=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    listed = subprocess.run(
        [str(python), "-m", "hpcpipe", "recipes", "list"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert "fresh-model\tfresh-model 0.1.0" in listed.stdout, listed.stdout + listed.stderr
    proc = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=pkg,
        capture_output=True,
        text=True,
        env=env,
        timeout=800,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
