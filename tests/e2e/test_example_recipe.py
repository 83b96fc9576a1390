"""A recipe from outside hpcpipe, installed the way a team installs its own package: the example
(examples/recipes/stdlib-classifier, a byte-level CNN on the standard library's source, not
imported by hpcpipe) built and installed into a directory of its own, then run by a fresh
``hpcpipe`` that finds it through its entry point: every property of ``hpcpipe recipes check``
(1 process, 2 DDP and 2 FSDP2 ranks, a SIGKILLed rank restarted and resumed bit for bit, the
export), ``hpcpipe run`` with the observers on, DeepSpeed, and an HPO study of 3 trials over its
own arguments. The real Slurm submission is in tests/integration/test_slurm.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.helpers import EXAMPLE_RECIPE, install_into, run_fresh_cli, with_site

from hpcpipe.netutil import free_port
from hpcpipe.observe.metrics import read_metrics

pytestmark = pytest.mark.timeout(900)

JOB = EXAMPLE_RECIPE / "job.yaml"
SMALL = [
    "recipe.train_per_class=64",
    "recipe.val_per_class=16",
    "recipe.channels=16",
    "observe.progress=false",
]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    site = install_into(tmp_path_factory.mktemp("site"), EXAMPLE_RECIPE)
    assert (site / "stdlib_classifier" / "recipe.py").is_file()  # installed, not a path into the repo
    return with_site(site)


def _sets(*sets: str) -> list[str]:
    return [a for s in [*SMALL, *sets] for a in ("--set", s)]


def test_the_installed_package_registers_its_recipe(env: dict[str, str]) -> None:
    proc = run_fresh_cli("recipes", "list", env=env)
    assert proc.returncode == 0, proc.stderr
    row = next(
        line.split("\t") for line in proc.stdout.splitlines() if line.startswith("stdlib-classifier\t")
    )
    assert row[1] == "hpcpipe-stdlib-classifier 0.1.0"
    shown = json.loads(run_fresh_cli("recipes", "show", "stdlib-classifier", "--json", "-", env=env).stdout)
    assert shown["class"] == "stdlib_classifier.recipe:StdlibClassifier"
    assert [a["key"] for a in shown["args"]][:2] == ["classes", "window"]


def test_recipe_check_passes_every_property(env: dict[str, str], tmp_path: Path) -> None:
    proc = run_fresh_cli(
        "recipe", "check", "stdlib-classifier", "--work", str(tmp_path), "--json", "-", env=env, timeout=600
    )
    report = json.loads(proc.stdout)
    failed = [f"{r['name']}: {r['detail']}" for r in report["results"] if not r["passed"]]
    assert proc.returncode == 0 and report["passed"], failed
    assert {r["name"] for r in report["results"]} >= {
        "parity-ddp",
        "parity-fsdp",
        "resume-after-kill",
        "export-loads",
    }


def test_hpcpipe_run_with_tensorboard_profiling_and_prometheus(env: dict[str, str], tmp_path: Path) -> None:
    sets = _sets(
        f"run.out_dir={tmp_path}",
        "train.steps=6",
        "train.eval_every=3",
        "checkpoint.every_steps=3",
        "observe.log_every=1",
        "observe.tensorboard=true",
        f"observe.prometheus.port={free_port()}",
        "observe.profile.start_step=2",
        "observe.profile.warmup=0",
        "observe.profile.active=2",
    )
    proc = run_fresh_cli("run", str(JOB), *sets, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "stdlib-classifier"
    evals = [r for r in read_metrics(run) if "val_acc" in r]
    assert [r["step"] for r in evals] == [0, 3, 6]
    assert (run / "export").is_dir() and list((run / "export").glob("*/model.safetensors"))
    assert list((run / "tensorboard").iterdir()) and list((run / "profile").glob("*.trace.json"))
    assert (run / "report" / "report.md").is_file() and "byte CNN" in (run / "summary.md").read_text()
    assert list((tmp_path / "prometheus-targets").iterdir()) == []  # finished: no longer a scrape target
    # The last checkpoint's verification runs in the background after the last step; its event
    # reaches TensorBoard: the trackers close after the store (they closed first, and a late event
    # could fail the finished run).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    texts = [t.tensor_proto.string_val[0].decode() for t in events.Tensors("events/text_summary")]
    assert any(t.startswith("`checkpoint_verified`") and '"step": 6' in t for t in texts), texts


def test_deepspeed_zero2_trains_it_on_two_ranks(env: dict[str, str], tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    sets = _sets(
        f"run.out_dir={tmp_path}", "train.steps=4", "parallel.strategy=deepspeed", "parallel.zero_stage=2"
    )
    proc = run_fresh_cli(
        "train", str(JOB), "--nproc", "2", *sets, env={**env, "DS_ACCELERATOR": "cpu"}, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r for r in read_metrics(tmp_path / "stdlib-classifier") if "val_acc" in r][-1]["step"] == 4


def test_an_hpo_study_of_three_trials_searches_its_own_arguments(env: dict[str, str], tmp_path: Path) -> None:
    space = (
        "hpo.space={recipe.channels: {type: categorical, choices: [8, 16, 32]}, "
        "train.lr: {type: float, low: 0.001, high: 0.01, log: true}}"
    )
    sets = _sets(
        f"run.out_dir={tmp_path}", "train.steps=4", "train.eval_every=2", "hpo.metric=val_acc", space
    )
    proc = run_fresh_cli("hpo", "run", str(JOB), *sets, "--trials", "3", env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = json.loads(
        run_fresh_cli("hpo", "status", str(tmp_path / "hpo-stdlib-classifier"), "--json", "-", env=env).stdout
    )
    assert status["direction"] == "maximize"  # val_acc's goal, declared by the recipe
    ended = [
        t for t in status["trials"] if t["state"] in ("COMPLETE", "PRUNED")
    ]  # the median pruner may stop one
    assert len(ended) == 3 and all("recipe.channels" in t["params"] for t in ended)
    assert sum(t["state"] == "COMPLETE" for t in ended) >= 2
