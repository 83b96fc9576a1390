"""The layouts (``hpcpipe.layout``) are the one place the names of hpcpipe's directories are spelled:
every constant is a name the layout lists, the names are distinct, every path lies under its root,
real directories hold nothing their layout does not name, and no other module spells a name itself."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from tests.helpers import run_cli, tiny_job_sets

import hpcpipe
from hpcpipe.layout import ChaosLayout, Entry, Layout, ReportLayout, RunLayout, StudyLayout, SweepLayout

SRC = Path(hpcpipe.__file__).parent
LAYOUTS: tuple[type[Layout], ...] = (RunLayout, ReportLayout, StudyLayout, ChaosLayout, SweepLayout)
# Literals equal to a layout's name that name something else, each with the reason.
UNRELATED = {
    # The prepared dataset's own report (a dataset directory); the run copies it as DATA_REPORT.
    ("data/function_calling/prepare.py", "data_report.json"),
}


def _constants(layout: type[Layout]) -> dict[str, str]:
    """The layout's own names: its upper-case string ClassVars."""
    return {k: v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str)}


def _all_names() -> set[str]:
    return {name for layout in LAYOUTS for name in _constants(layout).values()}


def _sample_paths(layout: Layout) -> dict[str, Path]:
    """Every path the layout gives: its properties, and its methods called with sample arguments."""
    found = {
        name: getattr(layout, name)
        for name, value in vars(type(layout)).items()
        if isinstance(value, property | Entry)
    }
    samples: dict[str, tuple[object, ...]] = {
        "export_dir": ("step-00000002", "hf"),
        "hang_dump": (3,),
        "trial_dir": ("kill", 3) if isinstance(layout, ChaosLayout) else (3,),
        "harness_error": ("kill", 3),
        "plot": ("optimization_history",),
    }
    for name, args in samples.items():
        if callable(getattr(layout, name, None)):
            found[name] = getattr(layout, name)(*args)
    if isinstance(layout, RunLayout):
        for split in RunLayout.FC_EVAL_SPLITS:
            for base in (False, True):
                for constrained in (False, True):
                    path = layout.fc_eval_dir(base, constrained, split)
                    found[f"fc_eval_dir({base}, {constrained}, {split})"] = path
    return found


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.__name__)
def test_every_constant_is_a_listed_name(layout: type[Layout]) -> None:
    """Each constant is a name at the top, a name inside a folder, or a computed name's template;
    the lists hold nothing that is not a constant."""
    constants = _constants(layout)
    # A folder laid out by a layout of its own (a run's report/) lists that layout's names.
    own = {folder: names for folder, names in layout.NESTED.items() if names is not ReportLayout.ENTRIES}
    nested = {name for names in own.values() for name in names}
    listed = set(layout.ENTRIES) | nested | set(layout.TEMPLATES)
    assert set(constants.values()) == listed, set(constants.values()) ^ listed
    assert len(set(layout.ENTRIES)) == len(layout.ENTRIES), layout.ENTRIES
    for folder, names in layout.NESTED.items():
        top = folder.split("/")[0]
        assert top in layout.ENTRIES or folder in layout.TEMPLATES, folder
        assert len(set(names)) == len(names), (folder, names)
    assert all("/" not in name for name in constants.values())
    # A computed name at the top matches one of the patterns that names() knows.
    samples = {t.format(rank=0, number=1, trial=1, name="x").replace("%j", "12") for t in layout.TEMPLATES}
    top_level = {
        s.replace("%A", "12").replace("%a", "3") for s in samples if s.startswith("slurm-") or "hang" in s
    }
    assert all(layout.names(name) for name in top_level), top_level


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.__name__)
def test_every_constant_is_in_the_module_table(layout: type[Layout]) -> None:
    """The module docstring (rendered as docs/reference/run-directory.md) names every constant."""
    import hpcpipe.layout

    table = hpcpipe.layout.__doc__ or ""
    missing = [key for key in _constants(layout) if key not in table]
    assert missing == [], f"{layout.__name__}: add these to the layout.py docstring: {missing}"
    assert f":class:`{layout.__name__}`" in table


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.__name__)
def test_every_path_is_under_the_root_and_named(layout: type[Layout], tmp_path: Path) -> None:
    root = layout(tmp_path / "dir")
    paths = _sample_paths(root)
    assert len(set(paths.values())) == len(paths), paths  # constants that differ name different paths
    for name, path in paths.items():
        assert path.is_relative_to(root.root) and path != root.root, name
        parts = path.relative_to(root.root).parts
        if isinstance(root, ChaosLayout) and parts[0] == "kill":  # a scenario's folder
            assert parts[1] == "trial-0003", name
            continue
        assert layout.names(parts[0]), f"{name}: {parts[0]} is not a named entry"
        folder = "/".join(parts[:-1])
        if folder in layout.NESTED and name != "export_dir":
            assert parts[-1] in layout.NESTED[folder], name


def test_computed_names() -> None:
    assert RunLayout.NESTED[RunLayout.REPORT] is ReportLayout.ENTRIES
    run = RunLayout(Path("run"))
    assert run.config == Path("run/config.yaml")
    assert run.adapter == Path("run/export/adapter")
    assert run.decline == run.adapter / "decline.json"
    assert run.call_threshold == run.adapter / "call_threshold.json"
    assert run.export_dir("step-00000002", "hf") == Path("run/export/step-00000002-hf")
    assert run.fc_eval_dir(base=True).name == "eval-base" and run.fc_eval_dir(False).name == "eval"
    assert run.fc_eval_dir(False, constrained=True).name == "eval-constrained"
    assert run.fc_eval_dir(True, constrained=True).name == "eval-base-constrained"
    # Each split its own folders: --split test wrote RUN/eval, over the dev split's evaluation.
    assert run.fc_eval_dir(False, split="test").name == "eval-test"
    assert run.fc_eval_dir(True, True, "test").name == "eval-base-test-constrained"
    assert run.fc_eval_dir(False, True, "all").name == "eval-all-constrained"
    assert run.hang_dump(3).name == "hang-rank3.txt"
    assert run.report_markdown == ReportLayout(run.report).markdown == Path("run/report/report.md")
    study = StudyLayout(Path("study"))
    assert study.trial_dir(7) == Path("study/trials/trial-0007")
    assert study.plot("param_importances") == Path("study/plots/param_importances.png")
    assert ChaosLayout(Path("out")).trial_dir("kill", 2) == Path("out/kill/trial-0002")
    assert SweepLayout(Path("sw")).slurm_output.name == StudyLayout.SLURM_OUTPUT == "slurm-%A_%a.out"


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
    """The tiny preset trained two steps with a checkpoint, then reported: every entry is named."""
    run_name = "tiny"
    sets = tiny_job_sets(tmp_path, run_name, "train.steps=2", "checkpoint.every_steps=2")
    proc = run_cli("train", "tiny", *sets)
    assert proc.returncode == 0, proc.stderr[-2000:]
    layout = RunLayout(tmp_path / run_name)
    proc = run_cli("report", str(layout.root))
    assert proc.returncode == 0, proc.stderr[-2000:]
    top = sorted(p.name for p in layout.root.iterdir())
    assert [name for name in top if not RunLayout.names(name)] == [], top
    for path in (layout.config, layout.lineage, layout.metrics, layout.metrics_csv, layout.events):
        assert path.is_file(), path
    assert [p.name for p in layout.checkpoints.iterdir()] == ["step-00000002"]
    report = sorted(p.name for p in layout.report.iterdir())
    assert [name for name in report if not ReportLayout.names(name)] == [], report
    assert {ReportLayout.MARKDOWN, ReportLayout.HTML, ReportLayout.SERIES, ReportLayout.PLOT_LOSS} <= set(
        report
    )


def test_a_chaos_directory_holds_only_named_entries(tmp_path: Path) -> None:
    """A chaos run of the harness's own scenario (one kept trial) and its report."""
    from hpcpipe.chaos.report import write_report
    from hpcpipe.chaos.runner import ChaosPlan, run_plan
    from hpcpipe.chaos.scenario import Scenario

    out = tmp_path / "chaos"
    plan = ChaosPlan(tmp_path / "s.yaml", [Scenario(name="pass", kind="always_pass")], 1, 0, out, keep=True)
    run_plan(plan, progress=False)
    write_report(out)
    top = sorted(p.name for p in out.iterdir())
    assert [name for name in top if not ChaosLayout.names(name) and name != "pass"] == [], top
    assert ChaosLayout(out).trial_dir("pass", 0).is_dir()
    assert json.loads(ChaosLayout(out).trials.read_text())["scenario"] == "pass"


def test_a_sweep_and_a_study_hold_only_named_entries(tmp_path: Path) -> None:
    """A planned sweep (its job array's files) and a started study, from their writers alone."""
    from hpcpipe.config import load_config
    from hpcpipe.hpo.results import write_trials_csv
    from hpcpipe.hpo.study import plan_study, write_record
    from hpcpipe.launch.slurm import SlurmSubmission, write_submission
    from hpcpipe.sweep import collect_plan, plan_points, write_plan

    sweep_dir = tmp_path / "sweep"
    points = plan_points("tiny", [], {"train.lr": [0.1, 0.2]}, sweep_dir)
    write_submission(SlurmSubmission([p.job for p in points], script_dir=sweep_dir, sweep_dir=sweep_dir))
    write_plan(points, sweep_dir)
    collect_plan(sweep_dir)
    points_dirs = {p.run_dir.name for p in points}
    top = sorted(p.name for p in sweep_dir.iterdir())
    assert [n for n in top if not SweepLayout.names(n) and n not in points_dirs] == [], top
    assert SweepLayout(sweep_dir).csv.is_file() and SweepLayout(sweep_dir).plan.is_file()

    study = plan_study(load_config("tiny", [f"hpo.dir={tmp_path / 'study'}"]))
    write_record(study)
    write_trials_csv([], study.study_dir)
    study.layout.trials.mkdir()
    top = sorted(p.name for p in study.study_dir.iterdir())
    assert [n for n in top if not StudyLayout.names(n)] == [], top


def _path_operands(tree: ast.AST) -> set[int]:
    """ids of the string constants used to build a path: operands of ``/``, ``joinpath`` arguments."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            found |= {id(node.left), id(node.right)}
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "joinpath"
        ):
            found |= {id(arg) for arg in node.args}
    return found


def _spelled(path: Path, names: set[str]) -> list[str]:
    """``file:line: name`` for each string constant in ``path`` that spells a layout's name: a file
    name (it has a dot, or is a template) anywhere, a bare folder name where it builds a path."""
    tree = ast.parse(path.read_text())
    in_paths = _path_operands(tree)
    shown = path.relative_to(SRC) if path.is_relative_to(SRC) else path
    hits = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names):
            continue
        file_like = "." in node.value or "{" in node.value or "%" in node.value
        if (file_like or id(node) in in_paths) and (str(shown), node.value) not in UNRELATED:
            hits.append(f"{shown}:{node.lineno}: {node.value}")
    return hits


def test_only_the_layouts_spell_their_names() -> None:
    names = _all_names()
    modules = sorted(p for p in SRC.rglob("*.py") if p != SRC / "layout.py")
    spelled = [hit for path in modules for hit in _spelled(path, names)]
    assert spelled == [], "use hpcpipe.layout instead: " + "; ".join(spelled)
    # Every allowed literal still exists: an entry that no longer matches anything is removed.
    for module, name in UNRELATED:
        assert name in {
            n.value for n in ast.walk(ast.parse((SRC / module).read_text())) if isinstance(n, ast.Constant)
        }


def test_the_spelling_check_sees_a_literal(tmp_path: Path) -> None:
    """The check flags a bare file name and a folder name in a path, not a help text that mentions
    one, nor a folder's name used as a word (a command's name, a dict key)."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        'A = "config.yaml"\nB = "a run directory (config.yaml)"\nC = f"{A}/events.jsonl"\n'
        'D = root / "checkpoints"\nE = {"report": 1}\nF = root.joinpath("trials")\nG = "trials.csv"\n'
    )
    hits = sorted(hit.rsplit(" ", 1)[-1] for hit in _spelled(sample, _all_names()))
    assert hits == ["checkpoints", "config.yaml", "trials", "trials.csv"]
