"""`hpcpipe run` as a pipeline on a real 2-rank job: every step runs once, a second run skips them
all, a changed export format re-runs only export and what follows, a failed export resumes at
export, and the lineage links the exported model to the dataset manifest hash."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tests.helpers import run_cli, tiny_job_sets

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

STEPS = ("prepare", "stage", "train", "evaluate", "export", "register", "report")


def _decisions(stdout: str) -> dict[str, str]:
    return {m.group(2): m.group(1) for m in re.finditer(r"^(run|skip) +(\w+):", stdout, re.MULTILINE)}


def test_the_pipeline_skips_what_is_unchanged_and_resumes_where_it_failed(tmp_path: Path) -> None:
    sets = tiny_job_sets(
        tmp_path, "pipe", "parallel.strategy=ddp", "train.steps=10", "checkpoint.every_steps=10"
    )

    def run(*extra: str) -> tuple[int, str, str]:
        proc = run_cli("run", "tiny", "--nproc", "2", *sets, *extra, cwd=tmp_path, timeout=400)
        return proc.returncode, proc.stdout, proc.stderr

    code, out, err = run()
    assert code == 0, err[-3000:]
    assert _decisions(out) == dict.fromkeys(STEPS, "run")
    run_dir = tmp_path / "pipe"
    assert (run_dir / "export" / "step-00000010-hf" / "config.json").is_file()
    assert (run_dir / "report" / "report.html").is_file() and (run_dir / "eval.json").is_file()

    code, out, _ = run()
    assert code == 0 and _decisions(out) == dict.fromkeys(STEPS, "skip")
    assert "skip train: unchanged" in out

    # A changed export format, and a file where that export goes: export fails...
    blocker = run_dir / "export" / "step-00000010-safetensors"
    blocker.write_text("in the way")
    code, out, _ = run("--set", "pipeline.export_format=safetensors")
    assert code != 0
    assert "step export failed" in out and "resumes at export" in out
    assert _decisions(out) == {**dict.fromkeys(STEPS[:4], "skip"), "export": "run"}
    # ... and once it is out of the way, the run resumes at export; nothing before it re-runs.
    blocker.unlink()
    code, out, err = run("--set", "pipeline.export_format=safetensors")
    assert code == 0, err[-3000:]
    assert _decisions(out) == {**dict.fromkeys(STEPS[:4], "skip"), **dict.fromkeys(STEPS[4:], "run")}
    assert "run  export: failed last time: resuming" in out
    assert (blocker / "model.safetensors").is_file()

    lineage = json.loads(run_cli("lineage", str(run_dir), "--json", "-", cwd=tmp_path).stdout)
    steps = lineage["steps"]
    dataset = lineage["dataset_manifest_sha256"]
    assert steps["prepare"]["outputs"] == {"dataset": dataset}
    assert steps["train"]["inputs"]["upstream"]["prepare"] == {"dataset": dataset}
    checkpoint = steps["train"]["outputs"]["checkpoint"]
    assert steps["export"]["inputs"]["upstream"]["train"]["checkpoint"] == checkpoint
    assert steps["export"]["inputs"]["config"] == {"pipeline.export_format": "safetensors"}
    printed = run_cli("lineage", str(run_dir), cwd=tmp_path)
    assert printed.returncode == 0 and f"dataset {dataset[:12]}" in printed.stdout
    assert "register: not-applicable (pipeline.register_as is null)" in printed.stdout
