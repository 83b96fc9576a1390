"""The GPU suite's training steps (``gpu_suite.py``): each trains through ``hpcpipe bench
throughput`` for a figure: gpt-124m on one GPU (tokens/s, MFU), under FSDP2 and DeepSpeed ZeRO-3,
through a real CUDA OOM (and the micro-batch that causes it), ResNet-18, and LoRA on SmolLM2 and
on Qwen2-7B's shape."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpu_suite_proc import gpu_memory_bytes
from gpu_suite_run import DRY, PASS, Outcome, StepFailed, StepRun, StepSkipped, need_packages

MFU_GOAL = 0.45  # GPU-CHECKLIST.md item 3 (llm.c reaches about 41% per GPU on 8xH100)
OOM_RATIO_GOAL = 0.95  # item 4


def _tokens_figure(result: Mapping[str, Any], goal: float | None = None) -> str:
    unit = "tok/s" if result["unit"] == "tokens" else "img/s"
    text = f"{result['per_s_per_device']:,.4g} {unit}/device"
    mfu = result.get("mfu")
    if mfu is not None:
        text += f", MFU {mfu:.1%}"
        if goal is not None:
            text += f" ({'met' if mfu >= goal else 'missed'}: goal >= {goal:.0%})"
    return text


def step_gpt(run: StepRun) -> Outcome:
    steps, warmup = (20, 5) if run.suite.gpu else (2, 0)
    result = run.throughput("gpt-124m", run.suite.gpt_sets(), 1, steps, warmup, "gpt")
    if not result["per_s"] > 0:
        raise StepFailed(f"no throughput measured: {result['per_s']}")
    goal = MFU_GOAL if run.suite.gpu else None
    note = "" if run.suite.gpu else "toy GPT, fp32, no torch.compile on a CPU"
    return Outcome(PASS, _tokens_figure(result, goal), note, {"throughput": result, "mfu_goal": MFU_GOAL})


def _ranks_for_sharding(run: StepRun) -> int:
    """2 ranks: on a GPU machine only with 2 GPUs (NCCL puts one rank on one GPU); SKIP otherwise."""
    if run.suite.gpu and run.suite.gpus < 2:
        raise StepSkipped(
            f"needs 2 GPUs, this machine has {run.suite.gpus}: hpcpipe trains one process unwrapped "
            "(parallel.strategy resolves to single at world size 1) and NCCL cannot put 2 ranks on one GPU"
        )
    return 2


def _layout_strategy(result: Mapping[str, Any]) -> str | None:
    from hpcpipe.observe.metrics import read_events

    events = read_events(Path(result["runs"][0]["run_dir"]))
    layouts = [e for e in events if e.get("event") == "layout"]
    return layouts[-1].get("strategy") if layouts else None


def _sharded(run: StepRun, strategy: str, sets: Sequence[str]) -> Outcome:
    nproc = _ranks_for_sharding(run)
    steps, warmup = (15, 5) if run.suite.gpu else (2, 0)
    result = run.throughput("gpt-124m", [*run.suite.gpt_sets(), *sets], nproc, steps, warmup, strategy)
    seen = _layout_strategy(result)
    if seen != strategy:
        raise StepFailed(f"the run's layout event says strategy {seen}, not {strategy}")
    note = "" if run.suite.gpu else f"{nproc} gloo ranks on the CPU"
    return Outcome(PASS, f"{nproc} ranks, " + _tokens_figure(result), note, {"throughput": result})


def step_fsdp2(run: StepRun) -> Outcome:
    return _sharded(run, "fsdp", ["parallel.strategy=fsdp"])


def step_deepspeed(run: StepRun) -> Outcome:
    need_packages("deepspeed", how="pip install 'hpcpipe[deepspeed]'")
    # DeepSpeed refuses train.compile (docs/deepspeed.md): the same job in eager mode.
    return _sharded(
        run, "deepspeed", ["parallel.strategy=deepspeed", "parallel.zero_stage=3", "train.compile=false"]
    )


def step_oom(run: StepRun) -> Outcome:
    from hpcpipe.observe.metrics import read_events

    gpu = run.suite.gpu
    # Eager mode: recovery changes the batch's shape, and torch.compile would compile again.
    base = [*run.suite.gpt_sets(), "train.compile=false"]
    steps, warmup = (5, 3) if gpu else (2, 1)
    data: dict[str, Any] = {}
    if gpu:
        micro = _oom_micro_batch(run, base, data)
        env = None
    else:
        micro, env = 8, {"HPCPIPE_CHAOS_OOM": "step=1"}  # the fault-injection hook: a simulated OOM
    sets = [*base, f"train.global_batch_size={micro}"]
    first = run.throughput(
        "gpt-124m", [*sets, f"train.micro_batch_size={micro}"], 1, steps, warmup, "oom", env
    )
    events = [e for e in read_events(Path(first["runs"][0]["run_dir"])) if e.get("event") == "oom_recovered"]
    if not events:
        raise StepFailed(f"no oom_recovered event: micro-batch {micro} fit, or the run did not recover")
    final = int(events[-1]["new_micro_batch_size"])
    reference = run.throughput(
        "gpt-124m", [*sets, f"train.micro_batch_size={final}"], 1, steps, warmup, "reference"
    )
    ratio = first["per_s"] / reference["per_s"]
    verdict = "met" if ratio >= OOM_RATIO_GOAL else "missed"
    figure = f"micro {micro}->{final} ({len(events)} recoveries), ratio {ratio:.3f}"
    figure += f" ({verdict}: >= {OOM_RATIO_GOAL})" if gpu else ""
    data.update(oom_events=events, recovered=first, reference=reference, ratio=ratio, goal=OOM_RATIO_GOAL)
    if gpu:
        return Outcome(PASS, figure, data=data)
    return Outcome(DRY, figure, "simulated OOM (HPCPIPE_CHAOS_OOM), not a CUDA one", data)


PROBE_MICRO = 32
OOM_TRAIN_OVER = 1.3  # the OOM run's training needs this many times the GPU's memory ...
OOM_EVAL_UNDER = 0.8  # ... while its evaluation needs at most this share of it


def choose_oom_micro_batch(
    total: float, train_per_sample: float, eval_per_sample: float, multiple: int = PROBE_MICRO
) -> int | None:
    """The smallest multiple of ``multiple`` whose training needs >= 1.3x the GPU's ``total``
    bytes, while its evaluation needs <= 0.8x: the trainer evaluates at step 0 at the configured
    micro-batch, outside OOM recovery, so that evaluation must fit. None when no micro-batch
    does both."""
    micro = multiple * max(1, math.ceil(OOM_TRAIN_OVER * total / train_per_sample / multiple))
    return micro if micro * eval_per_sample <= OOM_EVAL_UNDER * total else None


def _oom_micro_batch(run: StepRun, base: Sequence[str], data: dict[str, Any]) -> int:
    """A micro-batch of gpt-124m that this GPU cannot train but can evaluate, from a probe run's
    measured peak memory per sequence (training) and the logits' bytes per sequence (evaluation:
    bf16 logits, their fp32 copy and log-softmax, 10 bytes per vocabulary entry and position)."""
    import yaml

    from hpcpipe.layout import RunLayout
    from hpcpipe.observe.metrics import read_events, read_metrics

    total = gpu_memory_bytes()
    sets = [*base, f"train.global_batch_size={PROBE_MICRO}", f"train.micro_batch_size={PROBE_MICRO}"]
    probe = run.throughput("gpt-124m", sets, 1, 2, 1, "probe")
    run_dir = Path(probe["runs"][0]["run_dir"])
    peak = max(int(r["mem_bytes"]) for r in read_metrics(run_dir) if r.get("mem_bytes"))
    shrunk = [e for e in read_events(run_dir) if e.get("event") == "oom_recovered"]
    probed = int(shrunk[-1]["new_micro_batch_size"]) if shrunk else PROBE_MICRO
    config = yaml.safe_load(RunLayout(run_dir).config.read_text())
    eval_per_sample = 10.0 * config["data"]["vocab_size"] * config["model"]["seq_len"]
    train_per_sample = peak / probed
    micro = choose_oom_micro_batch(total, train_per_sample, eval_per_sample)
    data.update(
        gpu_memory_bytes=total,
        probe_peak_bytes=peak,
        probe_micro_batch=probed,
        train_bytes_per_sequence=train_per_sample,
        eval_bytes_per_sequence=eval_per_sample,
        oom_micro_batch=micro,
    )
    if micro is None:
        raise StepSkipped(
            f"no micro-batch of gpt-124m needs >= {OOM_TRAIN_OVER}x this GPU's {total / 2**30:.0f} GiB "
            f"to train ({train_per_sample / 2**20:.0f} MiB a sequence) and <= {OOM_EVAL_UNDER}x to evaluate "
            f"({eval_per_sample / 2**20:.0f} MiB)"
        )
    return micro


def step_resnet(run: StepRun) -> Outcome:
    base = [f"data.root={run.suite.images}"]
    if run.suite.gpu:
        sets, steps, warmup = [*base, "train.global_batch_size=128"], 20, 5  # micro 128, bf16, channels_last
    else:
        sets = [
            *base,
            "model.variant=resnet18-imagenet",
            "train.micro_batch_size=4",
            "train.global_batch_size=4",
            "train.precision=fp32",
            "data.num_workers=0",
            "data.persistent_workers=false",
            "data.pin_memory=false",
            "data.prefetch_factor=null",
        ]
        steps, warmup = 2, 0
    result = run.throughput("resnet18-cifar10", sets, 1, steps, warmup, "resnet")
    note = (
        "" if run.suite.gpu else "ResNet-18 with the ImageNet stem (16x fewer FLOPs), fp32, 4 images a step"
    )
    return Outcome(PASS, _tokens_figure(result), note, {"throughput": result})


LORA_DRY = (
    "model.seq_len=256",
    "data.synthetic_rows=40",
    "train.micro_batch_size=1",
    "train.global_batch_size=1",
)


def step_lora_smollm2(run: StepRun) -> Outcome:
    source = run.suite.smollm2
    if not source.exists():
        raise StepSkipped(f"no SmolLM2 model at {source} (`make fc-assets`, or --smollm2 PATH)")
    need_packages("peft", *(("gguf", "accelerate") if source.suffix == ".gguf" else ()))
    if source.suffix == ".gguf":
        model = [f"model.name_or_path={source.parent}", f"model.gguf_file={source.name}"]
    else:
        model = [f"model.name_or_path={source}", "model.gguf_file=null"]
    if run.suite.gpu:
        sets = [
            *model,
            "model.base_dtype=bf16",
            "train.precision=bf16",
            "train.micro_batch_size=8",
            "train.global_batch_size=8",
        ]
        steps, warmup = 10, 3
    else:
        sets, steps, warmup = [*model, *LORA_DRY], 1, 0
    result = run.throughput("lora-fc-smollm2", sets, 1, steps, warmup, "lora")
    note = "" if run.suite.gpu else "256-token rows, one a step"
    return Outcome(PASS, _tokens_figure(result), note, {"throughput": result})


def step_lora_qwen2(run: StepRun) -> Outcome:
    need_packages("peft")
    if run.suite.gpu:
        # The preset's own recipe for one GPU (its header): seq 4096, micro 2, bf16 base, gradient
        # checkpointing, LoRA r64 on every projection; global batch 8 = 4 accumulation steps.
        sets = [
            "model.name_or_path=@random:qwen2-7b",
            'data.sources=["@synthetic"]',
            "data.synthetic_rows=1000",
            "train.global_batch_size=8",
        ]
        steps, warmup = 4, 2
    else:
        sets = [
            "model.name_or_path=@random:qwen2-tiny",
            'data.sources=["@synthetic"]',
            *LORA_DRY,
            "train.global_batch_size=2",
            "model.base_dtype=fp32",
            "train.precision=fp32",
        ]
        steps, warmup = 2, 0
    result = run.throughput("lora-fc-qwen2-7b", sets, 1, steps, warmup, "lora")
    note = "" if run.suite.gpu else "Qwen2's architecture at 2 layers, width 64 (@random:qwen2-tiny)"
    return Outcome(PASS, _tokens_figure(result), note, {"throughput": result})
