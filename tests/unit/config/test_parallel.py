"""Layouts that cannot work are refused when the job is loaded (one line naming the key, exit 2),
and the arithmetic of pipeline stages and micro-batches."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers import run_cli

from hpcpipe.config import JobConfig, check_layout, check_micro_batches, grad_accum_steps, load_config
from hpcpipe.errors import ConfigError
from hpcpipe.launch.job import check_node_range, check_world
from hpcpipe.plan.layouts import step_time
from hpcpipe.plan.memory import GPUS, Layout, ModelShape
from hpcpipe.train.pipeline_parallel import bubble_fraction, split_blocks


@pytest.mark.parametrize(
    ("preset", "overrides", "needle"),
    [
        ("tiny", ["parallel.tp=2", "parallel.strategy=deepspeed"], "parallel.tp=2, parallel.pp=1: DeepSpeed"),
        ("tiny", ["parallel.pp=2", "parallel.strategy=deepspeed"], "use parallel.strategy=fsdp"),
        ("tiny", ["parallel.tp=2", "parallel.strategy=ddp"], "set parallel.strategy to fsdp or auto"),
        ("resnet-tiny", ["parallel.tp=2"], "recipe 'resnet-cifar' declares no tensor-parallel plan"),
        ("resnet-tiny", ["parallel.pp=2"], "recipe 'resnet-cifar' declares no pipeline stages"),
        ("tiny", ["parallel.tp=4"], "parallel.tp=4 must divide model.n_heads (2)"),
        ("tiny", ["parallel.tp=2", "model.seq_len=31"], "must divide model.seq_len"),
        ("tiny", ["parallel.pp=4"], "4 stages (split None) for model.n_layers=2"),
        (
            "tiny",
            ["parallel.pp=2", "fault.oom_recovery=true"],
            "fault.oom_recovery cannot work under parallel.pp",
        ),
        (
            "tiny",
            ["parallel.tp=2", "fault.oom_recovery=true"],
            "fault.oom_recovery cannot work under parallel.tp > 1",
        ),
        ("tiny", ["parallel.pp=2", "train.precision=fp16"], "train.precision=fp16 is not available with"),
        ("tiny", ["parallel.pp_schedule=interleaved-1f1b"], "needs parallel.virtual_stages 2 or more"),
        ("tiny", ["parallel.virtual_stages=2"], "needs parallel.pp_schedule=interleaved-1f1b"),
        ("tiny", ["parallel.pp=2", "parallel.pp_split=[1,1]"], "parallel.pp_split [1, 1]: give 1 increasing"),
        ("tiny", ["parallel.tp=2", "parallel.nproc=3"], "parallel.tp=2 must divide parallel.nproc=3"),
        ("tiny", ["train.activation_checkpointing=some"], "train.activation_checkpointing"),
        ("hf-causal-lm-tiny", ["parallel.tp=2"], "use recipe.finetune=full, or parallel.tp=1 with LoRA"),
    ],
)
def test_layouts_that_cannot_work_are_refused_at_load(preset: str, overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(preset, overrides)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_the_world_must_split_into_the_layout() -> None:
    check_layout(2, 8, 4, pp=2)  # 2 nodes x 4: tp 2 inside a node, pp 2, dp 2
    with pytest.raises(ConfigError, match=r"parallel.tp=4 must divide the ranks per node \(2"):
        check_layout(4, 8, 2)
    with pytest.raises(ConfigError, match=r"parallel.pp=3 x parallel.tp=2 must divide the world size \(8\)"):
        check_layout(2, 8, 4, pp=3)


def test_an_elastic_range_that_breaks_the_layout_is_refused() -> None:
    job = load_config(
        "tiny",
        ["parallel.pp=2", "parallel.nnodes=1:3", "train.global_batch_size=24", "train.micro_batch_size=2"],
    )
    with pytest.raises(ConfigError, match=r"parallel.pp=2 x parallel.tp=1 must divide the world size \(1\)"):
        check_node_range(job, 1)  # 1 process per node: 1 and 3 nodes cannot hold 2 stages
    fits = ["parallel.pp=2", "parallel.nnodes=1:2", "train.micro_batch_size=2"]
    check_node_range(load_config("tiny", fits), 2)  # 2 or 4 ranks: dp 1 or 2, 4 or 2 micro-batches


def test_the_batch_splits_over_the_data_parallel_ranks_only() -> None:
    job: JobConfig = load_config("tiny", ["train.global_batch_size=16", "train.micro_batch_size=2"])
    assert grad_accum_steps(job.train, 8, tp=2, pp=2) == 4  # dp 2: 16 / (2 x 2)
    with pytest.raises(
        ConfigError, match=r"x data-parallel ranks \(3 = world / \(parallel.pp x parallel.tp\)\)"
    ):
        grad_accum_steps(job.train, 12, tp=2, pp=2)


def test_one_f_one_b_needs_a_micro_batch_per_stage() -> None:
    job = load_config("tiny", ["parallel.pp=2", "train.global_batch_size=4", "train.micro_batch_size=4"])
    with pytest.raises(ConfigError, match=r"needs at least parallel.pp=2 micro-batches per step"):
        check_world(job, 2, 2)
    check_micro_batches(load_config("tiny", ["parallel.pp=2", "parallel.pp_schedule=gpipe"]).parallel, 1)


def test_stages_are_balanced_by_parameter_count_or_given() -> None:
    assert split_blocks([1, 1, 1, 1], 2) == [range(0, 2), range(2, 4)]
    assert split_blocks([1, 1, 1, 1], 4) == [range(i, i + 1) for i in range(4)]
    assert split_blocks([6, 1, 1, 1, 1], 2) == [range(0, 1), range(1, 5)]  # the big block alone
    assert split_blocks([1, 1, 1, 1, 1], 2, [4]) == [range(0, 4), range(4, 5)]
    with pytest.raises(ConfigError, match="at most one stage per block"):
        split_blocks([1, 1], 3)


def test_the_bubble_is_the_narayanan_formula_in_trainer_and_planner() -> None:
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction(4, 8, virtual_stages=2) == pytest.approx(3 / 19)
    assert bubble_fraction(1, 8) == 0.0
    shape = ModelShape(layers=8, hidden=64, heads=4, vocab=100, seq_len=32, ffn=256, kv_heads=4)
    parts = step_time(shape, Layout(pp=4, dp=1, micro_batches=8, virtual_stages=2), GPUS["h100"], _bw(), 8)
    assert parts["bubble_fraction"] == pytest.approx(3 / 19)


def test_the_cli_refuses_a_layout_in_one_line(tmp_path: Path) -> None:
    proc = run_cli("train", "tiny", "--nproc", "3", "--set", "parallel.tp=2", cwd=tmp_path)
    assert proc.returncode == 2
    line = (
        "error: tiny: parallel: parallel.tp=2 must divide parallel.nproc=3 "
        "(tensor parallelism stays inside a node)"
    )
    assert proc.stderr.strip() == line


def _bw():  # type: ignore[no-untyped-def]
    from hpcpipe.plan.layouts import Bandwidths

    return Bandwidths()


def test_the_big_presets_render_with_their_layout(tmp_path: Path) -> None:
    slurm = run_cli(
        "launch", "slurm", "gpt-1t", "--nodes", "384", "--gpus-per-node", "8", "--dry-run", cwd=tmp_path
    )
    assert slurm.returncode == 0, slurm.stderr
    assert "#SBATCH --nodes=384" in slurm.stdout and "--nproc-per-node 8" in slurm.stdout
    assert "# layout: pipeline 64 x data 6 x tensor 8 (tensor parallel inside each node)" in slurm.stdout
    k8s = run_cli(
        "launch", "k8s", "llama-405b", "--nodes", "2048", "--gpus-per-node", "8", "--dry-run", cwd=tmp_path
    )
    assert k8s.returncode == 0, k8s.stderr
    assert "hpcpipe.dev/layout: pp16-dp128-tp8" in k8s.stdout and "numNodes: 2048" in k8s.stdout
