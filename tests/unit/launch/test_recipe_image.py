"""A recipe of the user's own through every launcher: its recipe: section travels in the config
Slurm and Kubernetes run, the label is the recipe's name, the pods are told when their image
cannot hold it, and its own exceptions show the user's traceback."""

from __future__ import annotations

from pathlib import Path

import yaml
from tests.helpers import run_cli

from hpcpipe.config import load_config
from hpcpipe.launch.helm_values import helm_values
from hpcpipe.launch.kubernetes import render_k8s
from hpcpipe.launch.recipe_image import image_note
from hpcpipe.launch.slurm import SlurmSubmission, write_submission

OWN = "tests.recipes_for_tests:Tiny"
SETS = [
    f"run.recipe={OWN}",
    "recipe.hidden=24",
    "parallel.nnodes=2",
    "train.global_batch_size=16",
    "train.micro_batch_size=4",
]


def test_kubernetes_carries_the_recipe_section_and_labels_the_recipe_by_name() -> None:
    job = load_config("tiny", SETS)
    docs = render_k8s(job, "trainjob", False)
    config = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["config.yaml"])
    assert config["run"]["recipe"] == OWN and config["recipe"]["hidden"] == 24
    trainjob = next(d for d in docs if d["kind"] == "TrainJob")
    assert trainjob["metadata"]["labels"]["hpcpipe.dev/recipe"] == "tiny-regression"
    values = helm_values(job, "trainjob", False, False)
    assert values["recipe"] == "tiny-regression" and "hidden: 24" in values["config"]


def test_the_default_image_with_a_recipe_of_the_users_own_gets_a_note() -> None:
    own = load_config("tiny", SETS)
    note = image_note(own)
    assert note is not None and "containers/recipe.Dockerfile" in note and "launch.k8s.image" in note
    assert (
        image_note(load_config("tiny", [*SETS, "launch.k8s.image=registry.example.com/team/own:1"])) is None
    )
    assert image_note(load_config("tiny")) is None  # hpcpipe's own recipe: hpcpipe's image has it


def test_slurm_writes_the_recipe_section_into_the_runs_config(tmp_path: Path) -> None:
    job = load_config("tiny", [*SETS, f"run.out_dir={tmp_path}"])
    script = write_submission(SlurmSubmission([job], script_dir=job.run_dir))
    config = yaml.safe_load((job.run_dir / "config.yaml").read_text())
    assert config["run"]["recipe"] == OWN
    want = {"hidden": 24, "samples": 64, "activation": "relu", "val_samples": 16, "dropout": 0.0}
    want["inputs"] = "float32"
    assert config["recipe"] == want
    assert str(job.run_dir / "config.yaml") in script.read_text()  # what the nodes' agents read


def test_an_exception_in_the_users_recipe_shows_their_traceback(tmp_path: Path) -> None:
    sets = [f"run.recipe={OWN}", "recipe.activation=gelu", f"run.out_dir={tmp_path}", "train.steps=2"]
    proc = run_cli("train", "tiny", *[a for s in sets for a in ("--set", s)], cwd=tmp_path)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "recipes_for_tests.py" in proc.stderr
    assert "ValueError: activation 'gelu': relu or tanh" in proc.stderr
