"""What every doctor check shares: the status names, a finding (`Check`), and `Probe`, the
outside world as the checks see it (environment, PATH, NVML, /sys and /proc), replaceable in tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

OK, WARN, FAIL, SKIPPED = "OK", "WARN", "FAIL", "SKIPPED"
TOOL_TIMEOUT_S = 5.0
GIB = 1 << 30
MIN_FREE_DISK_GIB, LOW_FREE_DISK_GIB = 1, 10
HOT_GPU_C = 85
CONTAINER_RUNTIMES = ("docker", "podman", "apptainer", "singularity", "enroot")


@dataclass(frozen=True)
class Check:
    """One finding: which check, its status, a one-line summary and optional details."""

    name: str
    status: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def locate(path: Path) -> tuple[Path, Path]:
    """``path`` resolved, and it or the nearest folder above it that exists (where it would be
    created). Raises OSError (PermissionError) where a folder on the way cannot be looked into:
    resolving follows links through it, and ``exists`` stats in it."""
    target = path.resolve()
    return target, next((p for p in (target, *target.parents) if p.exists()), Path("/"))


def not_accessible(path: Path, exc: OSError) -> str:
    return f"{path.absolute()}: not accessible ({exc.strerror or exc})"


def _load_nvml() -> ModuleType:
    import pynvml

    return pynvml


@dataclass
class Probe:
    """The outside world as the checks see it (replaceable in tests)."""

    run_dir: Path = Path("runs")
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    sys_root: Path = Path("/")
    load_nvml: Callable[[], ModuleType] = _load_nvml
    timeout_s: float = TOOL_TIMEOUT_S

    def which(self, tool: str) -> str | None:
        return shutil.which(tool, path=self.env.get("PATH", ""))

    def run(self, cmd: list[str]) -> tuple[str | None, str]:
        """(stdout, "") on success; (None, why not) when missing, failing or hanging."""
        exe = self.which(cmd[0])
        if exe is None:
            return None, f"{cmd[0]} not found on PATH"
        try:
            proc = subprocess.run(
                [exe, *cmd[1:]],
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                env=dict(self.env),
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None, f"`{' '.join(cmd)}` timed out after {self.timeout_s:g} s"
        except OSError as exc:
            return None, f"`{' '.join(cmd)}` could not start: {exc}"
        if proc.returncode != 0:
            first = (proc.stderr or proc.stdout).strip().splitlines()
            return None, f"`{' '.join(cmd)}` exited {proc.returncode}" + (f": {first[0]}" if first else "")
        return proc.stdout, ""

    def path(self, absolute: str) -> Path:
        return self.sys_root / absolute.lstrip("/")
