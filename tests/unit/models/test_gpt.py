"""The GPT model: shapes, tying, causality, counts, learning, sampling, HF-compatible RoPE."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hpcpipe.config import ModelConfig
from hpcpipe.models.gpt import GPT, apply_rope, mlp_hidden

VOCAB = 100
VARIANTS = ["gpt2", "llama"]


def tiny(variant: str, **overrides: object) -> ModelConfig:
    fields: dict[str, object] = {
        "variant": variant,
        "n_layers": 2,
        "n_heads": 2,
        "d_model": 32,
        "seq_len": 16,
        **overrides,
    }
    return ModelConfig.model_validate(fields)


def build(variant: str, seed: int = 0, **overrides: object) -> GPT:
    torch.manual_seed(seed)
    return GPT(tiny(variant, **overrides), VOCAB)


@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_shape(variant: str) -> None:
    model = build(variant)
    idx = torch.randint(0, VOCAB, (3, 16))
    assert model(idx).shape == (3, 16, VOCAB)
    assert model(idx[:, :5]).shape == (3, 5, VOCAB)  # shorter than seq_len is fine


@pytest.mark.parametrize("variant", VARIANTS)
def test_lm_head_is_tied_to_the_token_embedding(variant: str) -> None:
    model = build(variant)
    assert model.lm_head.weight is model.tok_emb.weight
    assert model.lm_head.weight.data_ptr() == model.tok_emb.weight.data_ptr()


@pytest.mark.parametrize("variant", VARIANTS)
def test_init_weights_reties_after_to_empty(variant: str) -> None:
    # Meta-device construction + to_empty() unties shared parameters; init_weights() repairs it.
    with torch.device("meta"):
        model = GPT(tiny(variant), VOCAB)
    model.to_empty(device="cpu")
    model.init_weights()
    assert model.lm_head.weight is model.tok_emb.weight
    assert torch.isfinite(model(torch.randint(0, VOCAB, (1, 8)))).all()


@pytest.mark.parametrize("variant", VARIANTS)
def test_future_tokens_do_not_change_earlier_logits(variant: str) -> None:
    model = build(variant).eval()
    idx = torch.randint(0, VOCAB, (2, 16))
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % VOCAB
    before, after = model(idx), model(changed)
    torch.testing.assert_close(before[:, :10], after[:, :10])
    assert not torch.allclose(before[:, 10:], after[:, 10:])


@pytest.mark.parametrize("variant", VARIANTS)
def test_longer_than_context_raises(variant: str) -> None:
    model = build(variant)
    with pytest.raises(ValueError, match=r"seq_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_param_count_gpt2_by_hand() -> None:
    d, f, v, t, layers = 32, 128, VOCAB, 16, 2
    block = (
        2 * d  # ln_1 weight + bias
        + (d * 3 * d + 3 * d)  # attn.qkv
        + (d * d + d)  # attn.proj
        + 2 * d  # ln_2
        + (d * f + f)  # mlp.fc
        + (f * d + d)  # mlp.proj
    )
    embeddings = v * d + t * d  # tok_emb (= tied lm_head) + pos_emb
    total = embeddings + layers * block + 2 * d  # + ln_f
    model = build("gpt2")
    assert total == 29_184
    assert model.num_params(non_embedding=False) == total
    assert model.num_params() == total - embeddings


def test_param_count_llama_by_hand() -> None:
    d, v, layers = 32, VOCAB, 2
    f = 128  # round(2/3 * 4 * 32) = 85 -> next multiple of 64
    block = d + 4 * d * d + d + 3 * d * f  # ln_1, qkv + proj, ln_2, gate/up/down
    total = v * d + layers * block + d  # tok_emb (= tied lm_head), blocks, ln_f
    model = build("llama")
    assert mlp_hidden(model.cfg) == f
    assert total == 36_128
    assert model.num_params(non_embedding=False) == total
    assert model.num_params() == total - v * d


@pytest.mark.parametrize(("d_model", "width"), [(128, 384), (768, 2048), (4096, 10944)])
def test_llama_mlp_width_rounds_up_to_64(d_model: int, width: int) -> None:
    # round(2/3 * 4 * d) rounded up to a multiple of 64: 341 -> 384, 2048 -> 2048, 10923 -> 10944.
    cfg = ModelConfig.model_validate({"variant": "llama", "n_heads": 4, "d_model": d_model})
    assert mlp_hidden(cfg) == width
    assert mlp_hidden(cfg.model_copy(update={"variant": "gpt2"})) == 4 * d_model


@pytest.mark.parametrize("variant", VARIANTS)
def test_rope_tables_are_not_in_the_state_dict(variant: str) -> None:
    keys = set(build(variant).state_dict())
    assert not any("rope" in key for key in keys)
    assert ("pos_emb.weight" in keys) == (variant == "gpt2")


def test_residual_projections_use_the_scaled_init() -> None:
    model = build("llama", n_layers=4, d_model=64)
    down = model.get_parameter("blocks.0.mlp.down.weight")
    up = model.get_parameter("blocks.0.mlp.up.weight")
    assert down.std().item() == pytest.approx(0.02 / (2 * 4) ** 0.5, rel=0.1)
    assert up.std().item() == pytest.approx(0.02, rel=0.1)


@pytest.mark.parametrize("variant", VARIANTS)
def test_overfits_a_fixed_batch(variant: str) -> None:
    model = build(variant)
    idx = torch.randint(0, VOCAB, (4, 17), generator=torch.Generator().manual_seed(1))
    inputs, targets = idx[:, :-1], idx[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(torch.log(torch.tensor(VOCAB)).item(), abs=0.3)  # ~uniform
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("variant", VARIANTS)
def test_generate_length_and_determinism(variant: str) -> None:
    model = build(variant, dropout=0.1)
    prompt = torch.randint(0, VOCAB, (2, 5))

    def sample() -> torch.Tensor:
        gen = torch.Generator().manual_seed(123)
        return model.generate(prompt, max_new_tokens=20, temperature=0.8, top_k=10, generator=gen)

    out = sample()  # 5 + 20 > seq_len 16: the context is cropped, no error
    assert out.shape == (2, 25)
    assert torch.equal(out[:, :5], prompt)
    assert torch.equal(out, sample())
    assert model.training  # the mode is restored
    greedy = model.generate(prompt, max_new_tokens=3, temperature=0.0)
    assert torch.equal(greedy, model.generate(prompt, max_new_tokens=3, temperature=0.0))


def test_a_diverged_model_is_named_not_sampled() -> None:
    """NaN weights made torch.multinomial fail ("probability tensor contains either inf, nan")
    at the end of a diverged run; the recipe writes a note in the sample's place instead."""
    from hpcpipe.models.gpt import NotFinite

    model = build("gpt2", dropout=0.0)
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    with pytest.raises(NotFinite, match="not finite"):
        model.generate(torch.randint(0, VOCAB, (1, 3)), max_new_tokens=2, temperature=0.8, top_k=5)
    assert model.training  # the mode is restored


def test_rope_matches_hugging_face_llama() -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    model = build("llama", n_heads=4, d_model=64, rope_theta=500.0)  # head dim 16
    batch, heads, t, head_dim = 2, 4, 16, 16
    hf_cfg = LlamaConfig(
        hidden_size=64,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=16,
        rope_theta=500.0,
    )
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, t, head_dim, generator=gen)
    k = torch.randn(batch, heads, t, head_dim, generator=gen)
    positions = torch.arange(t).unsqueeze(0).expand(batch, t)  # (B, T)
    cos, sin = LlamaRotaryEmbedding(hf_cfg)(q, positions)  # (B, T, D) each
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)

    ours_cos, ours_sin = model.get_buffer("rope_cos"), model.get_buffer("rope_sin")
    assert ours_cos.dtype == torch.float32
    torch.testing.assert_close(apply_rope(q, ours_cos[:t], ours_sin[:t]), q_hf)
    torch.testing.assert_close(apply_rope(k, ours_cos[:t], ours_sin[:t]), k_hf)


def test_bf16_autocast_forward_runs() -> None:
    model = build("llama")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(torch.randint(0, VOCAB, (2, 16)))
    assert logits.dtype == torch.bfloat16
    assert torch.isfinite(logits.float()).all()


def test_grouped_query_attention_matches_hugging_face_llama() -> None:
    """model.n_kv_heads: k and v have fewer heads, each serving n_heads / n_kv_heads query heads in
    HF's order; the export loads into LlamaForCausalLM with the same logits."""
    from transformers import LlamaForCausalLM

    from hpcpipe.models.gpt_export import hf_config, hf_state_dict

    model = build("llama", n_heads=8, n_kv_heads=2, d_model=64).eval()
    assert model.blocks[0].attn.k.weight.shape == (16, 64)  # 2 heads x head dim 8
    hf = LlamaForCausalLM(hf_config(model.cfg, VOCAB, None)).eval()
    missing, unexpected = hf.load_state_dict(hf_state_dict(model), strict=False)
    assert not unexpected and all("rotary" in name for name in missing)
    ids = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids))


def test_grouped_query_attention_is_llamas() -> None:
    with pytest.raises(ValueError, match="grouped-query attention is the llama variant's"):
        tiny("gpt2", n_kv_heads=1)
    with pytest.raises(ValueError, match=r"model.n_kv_heads \(3\) must divide model.n_heads \(2\)"):
        tiny("llama", n_kv_heads=3)


def test_generation_pads_for_sequence_parallel_lengths() -> None:
    """GPT.sequence_multiple pads the context on the right; a causal model's next token is unchanged."""
    model = build("gpt2")
    prompt = torch.randint(0, VOCAB, (1, 5))
    plain = model.generate(prompt, max_new_tokens=4, temperature=0.0)
    model.sequence_multiple = 4
    assert torch.equal(model.generate(prompt, max_new_tokens=4, temperature=0.0), plain)


def test_the_host_memory_check_counts_what_linux_can_reclaim(monkeypatch: pytest.MonkeyPatch) -> None:
    """MemFree left out the page cache: a data node refused models that fit."""
    import builtins
    import io

    from hpcpipe.models import gpt

    real_open = builtins.open

    def meminfo(path: object, *args: object, **kwargs: object) -> object:
        if path == "/proc/meminfo":
            return io.StringIO("MemTotal: 100 kB\nMemFree: 10 kB\nMemAvailable: 80 kB\n")
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(builtins, "open", meminfo)
    assert gpt._available_host_bytes() == 80 * 1024
