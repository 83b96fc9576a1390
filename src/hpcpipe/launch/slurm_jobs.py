"""A submitted Slurm job: find it (by id or run directory), its state, its logs; cancel or signal it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout

SUBMISSION_FILE = RunLayout.SLURM_JOB  # in the run directory (a job array: its sweep directory)
_JOB_ID = re.compile(r"^\d+(_\d+)?$")


@dataclass(frozen=True)
class JobRef:
    job_id: str
    script_dir: Path | None = None  # where the output files are (known for a run directory)


def resolve_job(text: str) -> JobRef:
    """A job id as given, or the id recorded in a run/sweep directory by ``launch slurm``."""
    if _JOB_ID.match(text):
        return JobRef(text)
    path = Path(text)
    record = path / SUBMISSION_FILE
    if not record.is_file():
        raise UserError(f"{text}: neither a Slurm job id nor a directory with {SUBMISSION_FILE}")
    try:
        return JobRef(str(json.loads(record.read_text())["job_id"]), path)
    except (ValueError, KeyError, TypeError, OSError) as exc:  # TypeError: not a JSON object
        raise UserError(f"{record}: unreadable ({exc})") from None


def job_states(job_id: str) -> list[dict[str, str]]:
    """One row per job (array task): scontrol while slurmctld remembers the job (MinJobAge after
    it ends), else sacct (needs accounting)."""
    rows = _scontrol(job_id)
    return rows if rows else _sacct(job_id)


def _scontrol(job_id: str) -> list[dict[str, str]]:
    proc = _slurm(["scontrol", "show", "job", "--oneliner", job_id], check=False)
    rows = []
    for line in proc.stdout.splitlines():
        fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
        if "JobId" not in fields:
            continue
        task = fields.get("ArrayTaskId")
        name = f"{fields['ArrayJobId']}_{task}" if task and "ArrayJobId" in fields else fields["JobId"]
        rows.append(
            {
                "job": name,
                "state": fields.get("JobState", ""),
                "exit_code": fields.get("ExitCode", ""),
                "elapsed": fields.get("RunTime", ""),
                "nodes": fields.get("NodeList", ""),
                "restarts": fields.get("Restarts", "0"),
            }
        )
    return rows


def _sacct(job_id: str) -> list[dict[str, str]]:
    fields = "JobID,State,ExitCode,Elapsed,NodeList"
    proc = _slurm(["sacct", "--noheader", "--parsable2", "--allocations", f"--format={fields}", "-j", job_id])
    rows = []
    for line in proc.stdout.splitlines():
        job, state, code, elapsed, nodes = (line.split("|") + [""] * 5)[:5]
        rows.append(
            {
                "job": job,
                "state": state.split()[0] if state else "",
                "exit_code": code,
                "elapsed": elapsed,
                "nodes": nodes,
            }
        )
    if not rows:
        raise UserError(f"job {job_id}: unknown to squeue and sacct")
    return rows


def log_files(ref: JobRef) -> list[Path]:
    """The output files: ``slurm-<id>*.out`` in the run directory, else scontrol's StdOut."""
    base = ref.job_id.split("_")[0]
    if ref.script_dir is not None:
        found = sorted(ref.script_dir.glob(f"slurm-{base}*.out"))
        if found:
            return found
    proc = _slurm(["scontrol", "show", "job", ref.job_id], check=False)
    paths = {Path(m) for m in re.findall(r"StdOut=(\S+)", proc.stdout)}
    found = sorted(p for p in paths if p.is_file())
    if not found:
        raise UserError(f"job {ref.job_id}: no log file found (give the run directory instead of the id)")
    return found


def cancel_job(job_id: str, signal: str | None = None) -> None:
    """scancel the job, or send its job steps ``signal`` (not the batch shell: that would kill it)."""
    argv = ["scancel", *([f"--signal={signal}"] if signal else []), job_id]
    _slurm(argv)


def _slurm(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        raise UserError(f"{argv[0]} is not on the PATH: run this where Slurm's commands are installed")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        raise UserError(f"{argv[0]} did not answer within 60 s (is slurmctld up?)") from None
    if check and proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise UserError(f"{' '.join(argv)}: {reason}")
    return proc
