"""ResNet-18 under DDP on 2 gloo ranks: BatchNorm buffers agree, resume with DataLoader workers is
bitwise exact across epoch boundaries, OOM recovery still finishes, FSDP2 trains the same recipe."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.helpers import run_cli, start_ranks

from hpcpipe.data.images.generator import write_dataset
from hpcpipe.netutil import free_port
from hpcpipe.observe.metrics import read_metrics
from hpcpipe.train.preempt import PREEMPT_EXIT_CODE

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("vision")
    write_dataset("cifar10", out / "cifar", n_train=96, n_test=24)  # 6 steps of 16 per epoch
    return out


def _sets(tmp: Path, name: str, *extra: str) -> list[str]:
    sets = [
        f"run.name={name}",
        f"run.out_dir={tmp}",
        f"data.root={tmp}/cifar",
        f"data.prepared_dir={tmp}/prepared",
        "data.max_train_samples=null",
        "train.steps=14",
        "observe.log_every=1",
        *extra,
    ]
    return [arg for s in sets for arg in ("--set", s)]


def _train(tmp: Path, name: str, *extra: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return run_cli(
        "train", "resnet-tiny", "--nproc", "2", *_sets(tmp, name, *extra), cwd=tmp, timeout=300, env=env
    )


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


@pytest.fixture(scope="module")
def reference(tmp: Path) -> dict[int, float]:
    proc = _train(tmp, "reference", "data.num_workers=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = _losses(tmp / "reference")
    assert sorted(losses) == list(range(1, 15))
    return losses


def test_resume_with_workers_is_bitwise_exact(tmp: Path, reference: dict[int, float]) -> None:
    sets = ["data.num_workers=2", "data.persistent_workers=true", "checkpoint.every_steps=100"]
    proc = _train(tmp, "preempted", *sets, env={"HPCPIPE_CHAOS_SIGTERM": "step=5,rank=0"})
    assert proc.returncode == PREEMPT_EXIT_CODE, proc.stderr[-3000:]
    again = _train(tmp, "preempted", *sets)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _losses(tmp / "preempted") == reference  # steps 6..14 cross the epoch boundary at 6 and 12
    final = [r for r in read_metrics(tmp / "preempted") if "val_acc" in r][-1]
    expected = [r for r in read_metrics(tmp / "reference") if "val_acc" in r][-1]
    final.pop("time"), expected.pop("time")  # when each evaluated: the rest is bitwise the same
    assert final == expected


def test_a_simulated_oom_is_recovered_and_training_finishes(tmp: Path) -> None:
    proc = _train(tmp, "oom", env={"HPCPIPE_CHAOS_OOM": "step=3,rank=1,micro=0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [json.loads(line) for line in (tmp / "oom" / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("oom_recovered") == 1
    assert sorted(_losses(tmp / "oom")) == list(range(1, 15))


def test_fsdp_trains_the_resnet_recipe(tmp: Path) -> None:
    proc = _train(tmp, "fsdp", "parallel.strategy=fsdp", "train.steps=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r for r in read_metrics(tmp / "fsdp") if "val_acc" in r][-1]["step"] == 4


def test_deepspeed_zero3_trains_the_resnet_recipe_as_fsdp_does(tmp: Path) -> None:
    pytest.importorskip("deepspeed")
    partition_all = "parallel.deepspeed_config={zero_optimization: {stage3_param_persistence_threshold: 0}}"
    proc = _train(
        tmp, "zero3", "parallel.strategy=deepspeed", "parallel.zero_stage=3", partition_all, "train.steps=4"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r for r in read_metrics(tmp / "zero3") if "val_acc" in r][-1]["step"] == 4
    if not (tmp / "fsdp" / "metrics.jsonl").exists():  # run alone: the FSDP2 run first
        test_fsdp_trains_the_resnet_recipe(tmp)
    assert _losses(tmp / "zero3") == pytest.approx(_losses(tmp / "fsdp"), rel=1e-4)


def _bn_worker(rank: int, port: int, tmp: str, strategy: str, broadcast: str) -> None:
    import torch
    import torch.distributed as dist

    from hpcpipe.config import load_config
    from hpcpipe.recipes import build_recipe
    from hpcpipe.train.distributed import init_distributed
    from hpcpipe.train.environment import DistEnv
    from hpcpipe.train.parallel import unwrap
    from hpcpipe.train.trainer import Trainer

    name = f"bn-{strategy}-{broadcast}"
    sets = _sets(Path(tmp), name, "train.steps=3", f"parallel.broadcast_buffers={broadcast}")
    sets += ["--set", f"parallel.strategy={strategy}"]
    job = load_config("resnet-tiny", [*sets[1::2], "observe.progress=false"])
    ctx = init_distributed(job.parallel, DistEnv("torchrun", rank, rank, 2, 2, "127.0.0.1", port))
    run_dir = Path(tmp) / name
    run_dir.mkdir(exist_ok=True)
    trainer = Trainer(job, build_recipe(job), ctx, run_dir)
    trainer.fit()
    stats = torch.cat([b.float().flatten() for b in unwrap(trainer.model).buffers()])
    gathered = [torch.zeros_like(stats) for _ in range(2)]
    dist.all_gather(gathered, stats)
    if rank == 0:
        diff = float((gathered[0] - gathered[1]).abs().max())
        (Path(tmp) / f"{name}.json").write_text(json.dumps({"max_diff": diff}))
    trainer.close()
    dist.destroy_process_group()
    os._exit(0)


@pytest.mark.parametrize(
    ("strategy", "broadcast"), [("ddp", "null"), ("ddp", "false"), ("fsdp", "null"), ("deepspeed", "null")]
)
def test_batchnorm_buffers_agree_across_ranks_after_an_evaluation_and_a_checkpoint(
    tmp: Path, strategy: str, broadcast: str
) -> None:
    """The run ends with an evaluation and a checkpoint, before which every rank takes rank 0's
    statistics, whether or not DDP broadcast them at every forward (switched off, each rank's
    forwards update its own copy in between)."""
    port = free_port()
    start_ranks(_bn_worker, (port, str(tmp), strategy, broadcast), 2)
    diff = json.loads((tmp / f"bn-{strategy}-{broadcast}.json").read_text())["max_diff"]
    assert diff == 0.0
