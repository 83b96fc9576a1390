"""`hpcpipe plan memory`: the closed form on hand-computed cases, against hpcpipe's own GPT (its
parameter count exactly; what autograd keeps per layer, measured), the two published layouts, and
bad input."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tests.helpers import run_cli

from hpcpipe.config import ModelConfig
from hpcpipe.plan.layouts import Bandwidths, rank_of, rank_of_split, search
from hpcpipe.plan.memory import (
    GIB,
    GPUS,
    RESIDUAL_BYTES,
    Layout,
    ModelShape,
    fits,
    in_flight,
    layer_kept,
    memory_per_gpu,
    stage_memory,
)
from hpcpipe.plan.memory_inputs import ShapeFlags, resolve_shape

SMALL = ModelShape(
    layers=2, hidden=8, heads=2, vocab=10, seq_len=4, ffn=32, kv_heads=2, gated_mlp=False, rotary=False
)
MEGATRON_1T = ModelShape(
    layers=128, hidden=25600, heads=160, vocab=51200, seq_len=2048, ffn=102400, kv_heads=160,
    gated_mlp=False, tied_embeddings=True, rotary=False,
)  # fmt: skip
LLAMA3_405B = ModelShape(
    layers=126, hidden=16384, heads=128, vocab=128256, seq_len=8192, ffn=53248, kv_heads=8
)


def test_parameters_by_hand() -> None:
    # per layer: attention 2*8*8 + 2*8*8 = 256, MLP 2*8*32 = 512, norms 16 -> 784
    assert SMALL.layer_params() == 784
    # layers, embedding and head, the position table (no RoPE), final norm
    assert SMALL.total_params() == 2 * 784 + 2 * 10 * 8 + 4 * 8 + 8 == 1768


def test_weights_gradients_and_adam_by_hand() -> None:
    mixed = memory_per_gpu(SMALL, Layout(precision="bf16", zero=0))
    assert (mixed["parameters"], mixed["gradients"], mixed["optimizer"]) == (1768 * 2, 1768 * 2, 1768 * 12)
    full = memory_per_gpu(SMALL, Layout(precision="fp32", zero=0))
    assert (full["parameters"], full["gradients"], full["optimizer"]) == (1768 * 4, 1768 * 4, 1768 * 8)
    zero1 = memory_per_gpu(SMALL, Layout(dp=4, zero=1))
    assert (zero1["parameters"], zero1["gradients"], zero1["optimizer"]) == (1768 * 2, 1768 * 2, 1768 * 3)
    zero3 = memory_per_gpu(SMALL, Layout(dp=4, zero=3))
    assert (zero3["parameters"], zero3["gradients"]) == (1768 / 2, 1768 / 2)


def test_activations_by_hand() -> None:
    # GPT-2 (f = 4h, kv = heads), bf16 autocast: bytes per s*b*h kept by one layer
    sbh = 4 * 3 * 8
    lse = 4 * 2 / 8  # SDPA's fp32 log-sum-exp: heads per hidden element
    # norm inputs 2 x 4 (fp32); q, k, v, fc each cast their input 4 x 2; q, k, v, attention out
    # 4 x 2; fc out and GELU out 2 x 4 x 2
    none = layer_kept(SMALL, Layout(), "none")
    assert (none.sequence, none.heads, none.full) == (8, 8 + 16 + lse, 8)
    parts = memory_per_gpu(SMALL, Layout(micro_batch=3))
    head = (4 + 2) * sbh  # final norm input (fp32) and the head's cast input
    assert parts["activations"] == 2 * (8 + 8 + 16 + lse + 8) * sbh + head
    full = memory_per_gpu(SMALL, Layout(micro_batch=3, recompute="full"))
    assert full["activations"] == (2 * 4 + (40 + lse - 4)) * sbh + head  # block inputs + one layer
    assert parts["logits"] == 4 * 3 * 10 * (2 + 4)
    assert parts["weight_casts"] == (2 * (784 - 16) + 10 * 8) * 2  # matmul weights and the tied head
    assert memory_per_gpu(SMALL, Layout(precision="fp32"))["weight_casts"] == 0


def test_tensor_parallelism_keeps_the_gathered_inputs_and_the_logits_whole() -> None:
    """Every activation was divided by t, as Megatron's sequence parallelism does; hpcpipe's DTensor
    plan keeps the all-gathered matmul inputs (and, selective, the gathers and partial sums) whole,
    and the head's Replicate() output leaves the whole logits on every rank."""
    tp2 = Layout(micro_batch=3, tp=2)
    none = layer_kept(SMALL, tp2, "none")
    assert none.per_rank(tp2) == none.sequence / 2 + none.heads / 2 + none.full
    assert none.full == 4 * 2  # four casts of the gathered input, not divided
    selective = layer_kept(SMALL, tp2, "selective")
    assert selective.full == 2 * 4 + 2 * 2  # two fp32 all-gathers, two 16-bit partial sums
    assert memory_per_gpu(SMALL, tp2)["logits"] == memory_per_gpu(SMALL, Layout(micro_batch=3))["logits"]


def test_the_last_pipeline_stage_is_sized_with_its_head_and_logits() -> None:
    """With pp > 1 the logits were counted 0 and the last stage never sized: a model whose vocabulary
    outweighs its layers' activations was planned to fit when its last stage did not."""
    shape = ModelShape(layers=2, hidden=64, heads=4, vocab=50000, seq_len=512, ffn=256, kv_heads=4)
    layout = Layout(pp=2, micro_batches=8, recompute="full")
    first, last = stage_memory(shape, layout, last=False), stage_memory(shape, layout, last=True)
    assert first["logits"] == 0 and last["logits"] == 512 * 50000 * (2 + 4)
    assert last["total"] > first["total"]
    assert memory_per_gpu(shape, layout) == last


def test_pipeline_micro_batches_in_flight() -> None:
    assert in_flight(Layout(pp=4, micro_batches=16)) == 4  # 1F1B: one per stage
    assert in_flight(Layout(pp=4, micro_batches=16, schedule="gpipe")) == 16
    assert in_flight(Layout(pp=4, micro_batches=16, schedule="interleaved-1f1b", virtual_stages=2)) == 4 * (
        1 + 3 / 8
    )


def test_the_shape_of_hpcpipes_llama_gpt_is_counted_exactly() -> None:
    from hpcpipe.models.gpt import GPT, mlp_hidden

    cfg = ModelConfig(variant="llama", n_layers=3, d_model=64, n_heads=4, seq_len=32, vocab_size=100)
    shape = ModelShape(3, 64, 4, 100, 32, mlp_hidden(cfg), 4, gated_mlp=True, tied_embeddings=True)
    assert shape.total_params() == GPT(cfg, 100).num_params(non_embedding=False)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("variant", ["gpt2", "llama"])
def test_activations_per_layer_match_what_autograd_keeps(variant: str, precision: str) -> None:
    """Bytes autograd saves for backward per layer, measured on the GPT (two depths, the difference
    is per layer; bf16 as the trainer runs it, autocast over fp32 weights), against the closed form.
    bf16 was planned as all-16-bit (44 bytes per s*b*h for llama where 58 are kept). The 16-bit
    weight casts autograd also saves are the plan's weight_casts, not counted here; the CPU's
    composite RMSNorm keeps its normalized input too (CUDA's fused one does not): added for llama."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from hpcpipe.models.gpt import GPT, mlp_hidden

    saved = {}
    for layers in (1, 2):
        cfg = ModelConfig(variant=variant, n_layers=layers, d_model=128, n_heads=4, seq_len=64)
        torch.manual_seed(0)
        model = GPT(cfg, 96)
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        x, y = torch.randint(0, 96, (2, 2, 64))
        storages: dict[int, int] = {}

        def pack(
            t: torch.Tensor, storages: dict[int, int] = storages, weights: set[int] = weights
        ) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in weights and not _cast_of_a_weight(t):
                storages[storage.data_ptr()] = storage.nbytes()
            return t

        # The flash kernel, as the closed form assumes (CPU's math kernel would keep the T x T scores).
        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
            sdpa_kernel(SDPBackend.FLASH_ATTENTION),
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"),
        ):
            F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        saved[layers] = sum(storages.values())
    llama = variant == "llama"
    shape = ModelShape(2, 128, 4, 96, 64, mlp_hidden(cfg), 4, gated_mlp=llama, rotary=llama)
    layout = Layout(precision=precision)  # type: ignore[arg-type]
    predicted = layer_kept(shape, layout, "none").per_rank(layout) + (2 * RESIDUAL_BYTES if llama else 0)
    assert (saved[2] - saved[1]) / (2 * 64 * 128) == pytest.approx(predicted, rel=0.01)


def _cast_of_a_weight(t: torch.Tensor) -> bool:
    """A weight's 16-bit cast (or a view of it) that autocast made for a matmul: its graph leads
    straight to a parameter's AccumulateGrad."""
    fn = t.grad_fn
    while fn is not None:
        inputs = [f for f, _ in fn.next_functions if f is not None]
        if len(inputs) != 1:
            return False
        fn = inputs[0]
        if type(fn).__name__ == "AccumulateGrad":
            return True
    return False


def _ranks_of(found: list, layout: Layout) -> tuple[int, int]:  # type: ignore[type-arg]
    """The given layout's own rank (checked against every faster one) and its split's best rank."""
    rank, split = rank_of(found, layout), rank_of_split(found, layout)
    assert rank is not None and split is not None
    mine = found[rank - 1]
    assert (mine.layout.virtual_stages, mine.layout.zero, mine.layout.micro_batch, mine.layout.recompute) == (
        layout.virtual_stages, layout.zero, layout.micro_batch, layout.recompute
    )  # fmt: skip
    assert rank == 1 + sum(c.step_s < mine.step_s for c in found) or found[rank - 2].step_s == mine.step_s
    assert (found[split - 1].layout.tp, found[split - 1].layout.pp) == (
        layout.tp,
        layout.pp,
    ) and split <= rank
    return rank, split


def test_megatrons_1t_layout_fits_and_is_ranked_itself() -> None:
    """tp x pp x dp alone ranked the split's fastest variant (#41: ZeRO 2, selective, v 2) as the
    published layout (ZeRO 0, full recomputation, v 1)."""
    layout = Layout(tp=8, pp=64, dp=6, zero=0, micro_batch=1, micro_batches=512, recompute="full")
    assert MEGATRON_1T.total_params() == pytest.approx(1.008e12, rel=1e-3)
    assert fits(memory_per_gpu(MEGATRON_1T, layout)["total"], GPUS["a100-80"])
    found = search(MEGATRON_1T, 3072, GPUS["a100-80"], Bandwidths(), 3072)
    rank, split = _ranks_of(found, layout)
    assert (rank, split, len(found)) == (87, 34, 297)  # docs/parallelism.md quotes these


def test_llama3_405bs_layout_fits_only_with_full_recomputation() -> None:
    """As hpcpipe runs it: its selective policy keeps tensor parallelism's all-gathered inputs and
    partial sums whole (docs/parallelism.md says the published layout does not fit so)."""
    assert LLAMA3_405B.total_params() == pytest.approx(405.9e9, rel=1e-3)
    layout = Layout(tp=8, pp=16, dp=128, zero=3, micro_batch=1, micro_batches=16, recompute="full")
    assert fits(memory_per_gpu(LLAMA3_405B, layout)["total"], GPUS["h100"])
    for recompute in ("selective", "none"):
        kept = memory_per_gpu(LLAMA3_405B, Layout(tp=8, pp=16, dp=128, micro_batches=16, recompute=recompute))
        assert kept["total"] > GPUS["h100"].memory_bytes
    found = search(LLAMA3_405B, 16384, GPUS["h100"], Bandwidths(), 2048)
    assert (*_ranks_of(found, layout), len(found)) == (25, 4, 35)  # docs/parallelism.md quotes these


def test_shape_flags_override_the_job_and_name_what_is_missing() -> None:
    from hpcpipe.errors import UserError

    job = ShapeFlags(layers=2, hidden=64, heads=4, kv_heads=4, ffn=256, vocab=None, seq_len=32)
    with pytest.raises(UserError, match="--vocab is required"):
        resolve_shape(job, ShapeFlags())
    shape = resolve_shape(job, ShapeFlags(vocab=100, layers=6))
    assert (shape.layers, shape.vocab, shape.hidden) == (6, 100, 64)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--layers", "0"], "--layers must be 1 or more (got 0)"),
        (["--hidden", "-8"], "--hidden must be 1 or more (got -8)"),
        (["--gpu", "b200"], "--gpu b200: unknown GPU; one of a100-40, a100-80, h100, h200"),
        (["--tp", "3"], "--tp 3 must divide --heads (4)"),
        (["--pp", "8"], "--pp 8 x --virtual-stages 1 is more stages than --layers (2)"),
        (["--tp", "0"], "--tp must be 1 or more (got 0)"),
        (["--gpus", "8", "--dp", "3"], "--tp x --pp x --dp = 3, not --gpus 8"),
        (["--precision", "fp8"], "--precision fp8: expected bf16, fp16 or fp32"),
        (
            ["--pp", "2", "--global-batch", "1"],  # the trainer refuses it: it was planned
            "--pp 2 (1f1b) needs at least 2 micro-batches per step; --global-batch / (--micro-batch x "
            "--dp) gives 1",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    base = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "100", "--seq", "32"]
    proc = run_cli("plan", "memory", *base, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == f"error: {needle}"


@pytest.mark.parametrize(
    ("layout", "seq", "needle"),
    [
        (Layout(pp=2, micro_batches=1), 32, "needs at least 2 micro-batches"),
        (Layout(pp=2, virtual_stages=2, schedule="interleaved-1f1b", micro_batches=3), 32, "a multiple of 2"),
        (Layout(tp=2), 31, "--tp 2 must divide --seq (31)"),
    ],
)
def test_a_layout_the_trainer_refuses_is_refused(layout: Layout, seq: int, needle: str) -> None:
    """1F1B with fewer micro-batches than stages, interleaved with micro-batches not a multiple of
    pp, tp not dividing the sequence: the trainer refuses each; the planner planned them."""
    from hpcpipe.errors import UserError
    from hpcpipe.plan.memory_inputs import check_layout

    shape = ModelShape(layers=4, hidden=64, heads=4, vocab=100, seq_len=seq, ffn=256, kv_heads=4)
    with pytest.raises(UserError, match=re.escape(needle)):
        check_layout(shape, layout)
    check_layout(shape, replace(layout, micro_batches=4) if layout.pp > 1 else replace(layout, tp=1))


def test_the_search_leaves_out_layouts_the_trainer_refuses() -> None:
    """It ranked interleaved pp 4 over 6 micro-batches and pp 2 over 3, and tp 2 over a sequence
    of 2047 tokens."""
    from hpcpipe.plan.layouts import candidate_layouts

    shape = ModelShape(layers=8, hidden=1024, heads=16, vocab=32000, seq_len=2048, ffn=4096, kv_heads=16)
    found = list(candidate_layouts(shape, 8, 8, 12, Layout()))
    assert all(c.micro_batches >= c.pp for c in found if c.pp > 1)
    assert all(c.micro_batches % c.pp == 0 for c in found if c.virtual_stages > 1)
    assert any(c.virtual_stages > 1 for c in found)  # the interleaved ones it may run stay
    odd = replace(shape, seq_len=2047)
    assert {c.tp for c in candidate_layouts(odd, 8, 8, 12, Layout())} == {1}


def test_the_default_global_batch_gives_each_stage_a_micro_batch() -> None:
    from hpcpipe.cli.plan_memory import _layout

    layout = _layout(None, None, 4, 2, None, None, 1, None, None, None, None)
    assert (layout.micro_batches, layout.pp, layout.dp) == (4, 4, 2)


def test_the_cli_plans_a_preset_and_searches(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    args = ["gpt-124m", "--gpus", "8", "--gpu", "h100", "--json", str(out)]  # vocabulary: data.vocab_size
    proc = run_cli("plan", "memory", *args)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["params"] == ModelShape(**result["shape"]).total_params()
    assert result["fits"]["h100"] and result["search"]["fitting_layouts"] > 0
    assert result["bytes_per_gpu"]["total"] / GIB < 80
    assert "layouts of 8 x H100 80GB SXM fit" in proc.stdout


def test_a_search_from_an_interleaved_job_models_one_chunk_layouts_as_plain_1f1b() -> None:
    """v=1 layouts kept the base's interleaved schedule: 2p-1 micro-batches in flight, not p."""
    from hpcpipe.plan.layouts import candidate_layouts

    base = Layout(pp=8, virtual_stages=2, schedule="interleaved-1f1b")
    found = list(candidate_layouts(MEGATRON_1T, 64, 8, 512, base))
    assert {(c.virtual_stages, c.schedule) for c in found if c.pp > 1} == {
        (1, "1f1b"),
        (2, "interleaved-1f1b"),
        (4, "interleaved-1f1b"),
        (8, "interleaved-1f1b"),
    }


def test_plan_memory_takes_the_zero_stage_the_job_trains_with(tmp_path: Path) -> None:
    """strategy auto trains with DDP (FSDP2 only beside tensor parallelism): it was planned as ZeRO-3,
    under-counting weights, gradients and optimizer state by the data-parallel degree."""
    from hpcpipe.cli.plan_memory import _zero
    from hpcpipe.config import load_config

    auto = load_config("gpt-124m", ["parallel.strategy=auto"])
    assert (_zero(auto, None, 1, 1, 2), _zero(auto, None, 2, 1, 2), _zero(auto, 1, 1, 1, 2)) == (0, 3, 1)
    assert _zero(load_config("gpt-124m"), None, 1, 1, 2) == 3  # fsdp


def test_plan_memory_takes_fsdp2_for_strategy_auto_beside_a_pipeline() -> None:
    """The trainer wraps each stage in FSDP2 under pp > 1 (strategy auto): planned as DDP, ZeRO 0."""
    from hpcpipe.cli.plan_memory import _zero
    from hpcpipe.config import load_config

    auto = load_config("gpt-124m", ["parallel.strategy=auto"])
    assert (_zero(auto, None, 1, 2, 2), _zero(auto, None, 1, 2, 1)) == (3, 0)  # dp 1: nothing to wrap


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[1, 2]", "no all_reduce results with busbw_gbps"),  # AttributeError before
        ('{"results": [{"collective": "all_reduce", "size_bytes": 1}]}', "no all_reduce results"),  # KeyError
        (
            '{"results": [{"collective": "all_reduce", "size_bytes": 1, "busbw_gbps": 0}]}',
            "its all_reduce bus bandwidth is 0 GB/s (one rank moves nothing)",  # named --intra-gbs
        ),
    ],
)
def test_a_bench_file_the_planner_cannot_use_is_one_line_before_any_table(
    tmp_path: Path, text: str, says: str
) -> None:
    bench = tmp_path / "bench.json"
    bench.write_text(text)
    proc = run_cli("plan", "memory", "gpt-124m", "--gpus", "8", "--intra-bench", str(bench))
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr


def test_a_job_on_the_byte_tokenizer_is_planned_with_its_vocabulary() -> None:
    """`plan memory tiny` asked for --vocab although the byte tokenizer's size is known."""
    from hpcpipe.config import load_config
    from hpcpipe.plan.memory_inputs import shape_from_job

    assert shape_from_job(load_config("tiny", ["data.tokenizer=bytes"])).vocab == 257


def test_a_one_rank_layout_is_found_whatever_its_zero_stage() -> None:
    """--zero 3 (the default) on dp 1: the search tries ZeRO 0 only, and never found the layout."""
    shape = ModelShape(4, 256, 4, 128, 1024, 1024, 4)
    found = search(shape, 1, GPUS["h100"], Bandwidths(), 64)
    given = Layout(tp=1, pp=1, dp=1, zero=3, micro_batch=4, micro_batches=16)
    assert rank_of(found, given) is not None
