"""The run directory's layout (``hpcpipe.layout.RunLayout``) is the one place its names are spelled:
the names are distinct, every path lies under the run directory, a real run leaves nothing the
layout does not name, and no other module spells the core file names itself."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import run_cli, tiny_job_sets

import hpcpipe
from hpcpipe.layout import RunLayout

SRC = Path(hpcpipe.__file__).parent
# Names that must be spelled only in layout.py (a string constant equal to one of them).
GUARDED = (RunLayout.CONFIG, RunLayout.LINEAGE, RunLayout.METRICS, RunLayout.EVENTS)


def _paths(layout: RunLayout) -> dict[str, Path]:
    """Every path the layout gives: its properties, and its helpers called with sample arguments."""
    found = {
        name: getattr(layout, name) for name, value in vars(RunLayout).items() if isinstance(value, property)
    }
    found["export_dir"] = layout.export_dir("step-00000002", "hf")
    found["fc_eval_dir(base)"] = layout.fc_eval_dir(base=True)
    found["fc_eval_dir"] = layout.fc_eval_dir(base=False)
    found["fc_eval_dir(base, constrained)"] = layout.fc_eval_dir(base=True, constrained=True)
    found["fc_eval_dir(constrained)"] = layout.fc_eval_dir(base=False, constrained=True)
    found["hang_dump"] = layout.hang_dump(3)
    return found


def test_names_are_unique() -> None:
    assert len(set(RunLayout.ENTRIES)) == len(RunLayout.ENTRIES), RunLayout.ENTRIES
    for folder, names in RunLayout.NESTED.items():
        assert folder in RunLayout.ENTRIES
        assert len(set(names)) == len(names), (folder, names)
    # Each constant is a name at the top, a name inside a folder, or a computed name's template.
    constants = {k: v for k, v in vars(RunLayout).items() if k.isupper() and isinstance(v, str)}
    nested = {n for names in RunLayout.NESTED.values() for n in names}
    templates = {RunLayout.HANG_DUMP, RunLayout.SLURM_OUTPUT}
    assert set(constants.values()) == set(RunLayout.ENTRIES) | nested | templates
    assert all(RunLayout.names(t.replace("{rank}", "0").replace("%j", "12")) for t in templates)
    # Top-level names are one path component each; constants that differ name different entries.
    assert all("/" not in name for name in constants.values())
    paths = _paths(RunLayout(Path("run")))
    assert len(set(paths.values())) == len(paths), paths


def test_every_path_is_under_the_root(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "runs" / "tiny")
    for name, path in _paths(layout).items():
        assert path.is_relative_to(layout.root) and path != layout.root, name
        top = path.relative_to(layout.root).parts[0]
        assert RunLayout.names(top), f"{name}: {top} is not a named entry"
        inner = path.relative_to(layout.root).parts[1:]
        if inner and top in RunLayout.NESTED and name not in ("export_dir",):
            assert inner[0] in RunLayout.NESTED[top], name
    assert layout.config == tmp_path / "runs" / "tiny" / "config.yaml"
    assert layout.adapter == layout.root / "export" / "adapter"
    assert layout.export_dir("step-00000002", "hf") == layout.root / "export" / "step-00000002-hf"
    assert layout.fc_eval_dir(base=True).name == "eval-base" and layout.fc_eval_dir(False).name == "eval"
    assert layout.fc_eval_dir(False, constrained=True).name == "eval-constrained"
    assert layout.fc_eval_dir(True, constrained=True).name == "eval-base-constrained"
    assert layout.hang_dump(3).name == "hang-rank3.txt"


def test_module_constants_follow_the_layout() -> None:
    from hpcpipe.launch.k8s_cluster import SUBMISSION_FILE as K8S_SUBMISSION
    from hpcpipe.launch.slurm import SCRIPT_NAME
    from hpcpipe.launch.slurm_jobs import SUBMISSION_FILE as SLURM_SUBMISSION
    from hpcpipe.recipes.lora_fc import ADAPTER_DIR
    from hpcpipe.sweep import DONE_FILE
    from hpcpipe.track.mlflow_client import RUN_FILE
    from hpcpipe.track.registry import REGISTRY_FILE

    root = RunLayout(Path("run"))
    assert root.root / RUN_FILE == root.mlflow_run
    assert root.root / REGISTRY_FILE == root.registry
    assert root.root / ADAPTER_DIR == root.adapter
    assert root.root / DONE_FILE == root.sweep_point
    assert root.root / SCRIPT_NAME == root.slurm_script
    assert root.root / SLURM_SUBMISSION == root.slurm_job
    assert root.root / K8S_SUBMISSION == root.k8s_job


def test_a_real_run_leaves_only_named_entries(tmp_path: Path) -> None:
    """The tiny preset trained two steps with a checkpoint: every top-level entry is named."""
    run_name = "tiny"
    sets = tiny_job_sets(tmp_path, run_name, "train.steps=2", "checkpoint.every_steps=2")
    proc = run_cli("train", "tiny", *sets)
    assert proc.returncode == 0, proc.stderr[-2000:]
    layout = RunLayout(tmp_path / run_name)
    top = sorted(p.name for p in layout.root.iterdir())
    assert [name for name in top if not RunLayout.names(name)] == [], top
    for path in (layout.config, layout.lineage, layout.metrics, layout.metrics_csv, layout.events):
        assert path.is_file(), path
    assert [p.name for p in layout.checkpoints.iterdir()] == ["step-00000002"]


def _spelled(path: Path) -> list[str]:
    """``file:line: name`` for each string constant in ``path`` that is exactly a guarded name."""
    shown = path.relative_to(SRC.parent) if path.is_relative_to(SRC.parent) else path
    return [
        f"{shown}:{node.lineno}: {node.value}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in GUARDED
    ]


def test_only_the_layout_spells_the_run_files() -> None:
    modules = sorted(p for p in SRC.rglob("*.py") if p != SRC / "layout.py")
    spelled = [hit for path in modules for hit in _spelled(path)]
    assert spelled == [], "use hpcpipe.layout.RunLayout instead: " + "; ".join(spelled)


def test_the_spelling_check_sees_a_literal(tmp_path: Path) -> None:
    """The check above flags a bare name, and not a help text that mentions it."""
    sample = tmp_path / "sample.py"
    sample.write_text('A = "config.yaml"\nB = "a run directory (config.yaml)"\nC = f"{A}/events.jsonl"\n')
    assert [hit.rsplit(" ", 1)[-1] for hit in _spelled(sample)] == ["config.yaml"]
