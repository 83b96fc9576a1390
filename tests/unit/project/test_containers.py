"""The container recipes: hadolint-clean Dockerfile, an Apptainer .def that parses (spython) and
agrees with it. No Docker daemon or Apptainer runs here: they are linted, not built."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "containers" / "Dockerfile"
DEF_FILE = ROOT / "containers" / "hpcpipe.def"
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.timeout(60)


def _base_from_dockerfile() -> str:
    match = re.search(r"^ARG BASE=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert match is not None
    return match.group(1)


def _hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    command = [str(BIN / "hadolint"), "--no-color", str(dockerfile)]
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


def test_the_dockerfile_is_hadolint_clean() -> None:
    proc = _hadolint(DOCKERFILE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_dockerfile_installs_from_the_lock_as_a_non_root_user_and_smoke_checks() -> None:
    text = DOCKERFILE.read_text()
    assert "COPY pyproject.toml uv.lock" in text and "--frozen" in text and "--require-hashes" in text
    assert re.search(r"^USER 1000$", text, re.M)
    assert re.search(r"^RUN .*hpcpipe doctor", text, re.M)
    assert ":latest" not in _base_from_dockerfile()


def test_the_apptainer_recipe_parses_and_matches_the_dockerfile(tmp_path: Path) -> None:
    from spython.main.parse.parsers import SingularityParser

    recipe = SingularityParser(str(DEF_FILE)).recipe["spython-base"]
    assert recipe.fromHeader == _base_from_dockerfile()  # one base image for both recipes
    sources = {entry.split()[0] for entry in recipe.files}
    assert {"pyproject.toml", "uv.lock", "src"} <= sources
    install = "\n".join(recipe.install)
    assert "--require-hashes" in install and "--frozen" in install
    assert 'exec hpcpipe "$@"' in recipe.cmd
    test_section = DEF_FILE.read_text().split("%test", 1)[1]
    assert "hpcpipe doctor" in test_section
    # %post runs under bash (-c /bin/bash: it uses arrays) and must be shellcheck-clean.
    assert "%post -c /bin/bash" in DEF_FILE.read_text()
    script = tmp_path / "post.sh"
    script.write_text("#!/bin/bash\n" + install + "\n")
    proc = subprocess.run(
        [str(BIN / "shellcheck"), str(script)], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0, proc.stdout


def test_the_docker_build_context_holds_only_what_the_dockerfile_copies() -> None:
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[1] == "*" or "*" in ignore
    copied = set(re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE.read_text(), re.M))
    wanted = {word for line in copied for word in line.split()}
    assert {f"!{name}" for name in wanted} <= {line.rstrip("/") for line in ignore}


def test_the_recipe_dockerfiles_are_hadolint_clean_and_check_the_recipe_is_found(tmp_path: Path) -> None:
    """containers/recipe.Dockerfile and the one `hpcpipe new recipe` writes: hadolint-clean, built
    on hpcpipe's image as root, run as uid 1000, and failing the build without the recipe."""
    from hpcpipe.scaffold.recipe import write_package

    write_package("my-model", tmp_path / "pkg", "0.1.0")
    for dockerfile in (ROOT / "containers" / "recipe.Dockerfile", tmp_path / "pkg" / "Dockerfile"):
        proc = subprocess.run(
            [str(BIN / "hadolint"), "--no-color", str(dockerfile)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert proc.returncode == 0, f"{dockerfile}: {proc.stdout}{proc.stderr}"
        text = dockerfile.read_text()
        assert "FROM ${HPCPIPE_IMAGE}" in text and text.rstrip().splitlines()[-2] == "USER 1000"
        assert "hpcpipe recipes show" in text.rstrip().splitlines()[-1]


def _uv() -> Path:
    """The uv `make` installs (`.tools/bin/uv`, a prerequisite of the test environment)."""
    found = ROOT / ".tools" / "bin" / "uv"
    if not found.is_file():
        pytest.skip(f"{found} missing: `make install-test` puts uv there")
    return found


def test_the_image_requirements_are_hashed_pins_without_torch_or_cuda(tmp_path: Path) -> None:
    """The Dockerfile's own `uv export` line, run on the lock: every requirement pinned and hashed,
    and none of what the base image provides (torch, triton, the CUDA wheels; NVML's bindings stay)."""
    run = re.search(r"^RUN (skip=.*?) && uv pip install", DOCKERFILE.read_text(), re.M | re.S)
    assert run is not None
    requirements = tmp_path / "requirements.txt"
    script = run.group(1).replace("/tmp/requirements.txt", str(requirements))
    env = {**os.environ, "PATH": f"{_uv().parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    text = requirements.read_text()
    # one block per requirement: "name==version [; marker] \", then its hash lines
    blocks = re.findall(r"^([A-Za-z0-9_.-]+)==\S+.*\n((?:    .*\n)*)", text, re.M)
    names = {name.lower() for name, _ in blocks}
    assert {"transformers", "peft", "deepspeed", "kubernetes", "opentelemetry-sdk"} <= names
    unhashed = [name for name, lines in blocks if "--hash=sha256:" not in lines]
    assert not unhashed, unhashed
    provided = {
        n for n in names if n in ("torch", "torchvision", "triton") or n.startswith(("cuda-", "nvidia-"))
    }
    assert provided <= {"nvidia-ml-py"}, sorted(provided)
