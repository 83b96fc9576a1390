"""Evaluation generates with the KV cache, though training turned it off in the model's config."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    from hpcpipe.models.hf_lm import ModelSource, load_base_model
    from hpcpipe.models.tiny_lm import tiny_llama_dir

    path = tiny_llama_dir(tmp_path_factory.mktemp("models"), ["def f(x): return x + 1"] * 40, seed=0)
    model = load_base_model(ModelSource(str(path), None), "fp32")  # use_cache=False, as for training
    return model, AutoTokenizer.from_pretrained(path)


def test_generation_uses_the_kv_cache_and_replies_as_without_it(tiny) -> None:  # type: ignore[no-untyped-def]
    from hpcpipe.evaluate.generate import generate_replies

    model, tokenizer = tiny
    assert model.config.use_cache is False
    # generate() takes its default from generation_config, which this transformers leaves at
    # use_cache=True whatever the training config says; older ones built it from the model config
    # (use_cache=False included), and a model saved that way carries it. Off here too, so only
    # generate_replies' own use_cache=True brings the cache back: without it this test fails.
    model.generation_config.use_cache = False
    lengths: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda _m, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    prompts = ["def f(x):", "return x"]
    try:
        replies = generate_replies(model, tokenizer, prompts, max_new_tokens=12, batch_size=2)
    finally:
        hook.remove()
    # With the cache every forward after the first feeds one new token; without, the whole prefix.
    assert len(lengths) > 2 and lengths[0] > 1 and set(lengths[1:]) == {1}, lengths
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(
            **enc, max_new_tokens=12, do_sample=False, use_cache=False,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
    uncached = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert replies == uncached


def test_replies_come_back_in_the_prompts_order(tiny) -> None:  # type: ignore[no-untyped-def]
    from hpcpipe.evaluate.generate import generate_replies

    model, tokenizer = tiny
    # Longest first: generation runs them shortest first (batches of similar lengths).
    prompts = ["def f(x): return x + 1\ndef g(y):", "def f(x):", "return"]
    one_by_one = [generate_replies(model, tokenizer, [p], max_new_tokens=6, batch_size=1)[0] for p in prompts]
    assert generate_replies(model, tokenizer, prompts, max_new_tokens=6, batch_size=1) == one_by_one
    assert len(set(one_by_one)) > 1  # distinct replies: a reordering would show


def test_the_decision_records_p_call_and_its_threshold_decides(tiny) -> None:  # type: ignore[no-untyped-def]
    from hpcpipe.evaluate.generate import CallDecision, generate_replies

    model, tokenizer = tiny
    prompts = ["def f(x):", "return x", "def g(y): return"]
    opener = tokenizer("def", add_special_tokens=False)["input_ids"][0]  # stands in for "<tool_call>"
    greedy = CallDecision(opener)
    plain = generate_replies(model, tokenizer, prompts, max_new_tokens=4, batch_size=2)
    assert (
        generate_replies(model, tokenizer, prompts, 4, 2, decision=greedy) == plain
    )  # reading changes nothing
    for i, prompt in enumerate(prompts):  # P(opener) at the first token, as one forward pass gives it
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            p = model(ids).logits[0, -1].softmax(-1)[opener].item()
        assert abs(greedy.p_call[i] - p) < 1e-5
    first_tokens = []
    for threshold in (0.0, 1.0):  # everything reaches 0: all open with it; nothing below 1 does: none
        decided = CallDecision(opener, threshold)
        replies = generate_replies(model, tokenizer, prompts, 4, 2, decision=decided)
        first_tokens.append(
            [tokenizer(r, add_special_tokens=False)["input_ids"][:1] == [opener] for r in replies]
        )
    assert first_tokens == [[True] * 3, [False] * 3]


def test_a_threshold_just_above_p_call_declines() -> None:
    """threshold_for puts the threshold for target 1.0 at nextafter(the largest P(call)): compared
    in the scores' float32 it rounded down to that P, and the reply called."""
    import math

    from hpcpipe.evaluate.generate import CallDecision

    scores = torch.tensor([[0.3, 1.7, -0.4]])  # (B=1, V=3); the opener is token 0
    p = scores.softmax(dim=-1)[0, 0].item()
    decision = CallDecision(0, math.nextafter(p, math.inf))
    out = decision.processor([0], prompt_length=4)(torch.zeros(1, 4, dtype=torch.long), scores)
    assert out[0, 0] == float("-inf") and torch.isfinite(out[0, 1:]).all()  # declined
    at = CallDecision(0, p).processor([0], prompt_length=4)(torch.zeros(1, 4, dtype=torch.long), scores)
    assert torch.isfinite(at[0, 0]) and torch.isinf(at[0, 1:]).all()  # P >= threshold: calls


def _scripted(tokenizer, text: str):  # type: ignore[no-untyped-def]
    """A constraint that makes every row write ``text`` (its tokens, one a step), then anything."""
    script = tokenizer(text, add_special_tokens=False)["input_ids"]
    start: list[int] = []

    def processor(index):  # type: ignore[no-untyped-def]
        def force(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            start.append(start[0] if start else input_ids.shape[1])
            step = input_ids.shape[1] - start[0]
            if step < len(script):
                scores = torch.full_like(scores, float("-inf"))
                scores[:, script[step]] = 0.0
            return scores

        return force

    return processor


def test_a_reply_ends_at_the_templates_end_of_turn_though_eos_is_another_token(tiny) -> None:  # type: ignore[no-untyped-def]
    """hpcpipe's own ChatML template ends a turn with <|im_end|>; with EOS <|endoftext|> a reply
    ran on to --max-new-tokens through the turns the model made up, and those were parsed."""
    from transformers import AutoTokenizer

    from hpcpipe.data.function_calling.tokens import ChatFormat
    from hpcpipe.evaluate.generate import generate_replies, turn_end

    model, _ = tiny
    tokenizer = AutoTokenizer.from_pretrained(model.config._name_or_path)
    tokenizer.eos_token = "<|endoftext|>"  # as a tokenizer without a chat template may have it
    chat = ChatFormat(tokenizer)
    assert chat.own_template and turn_end(chat) == "<|im_end|>"
    invented = "x = 1<|im_end|>\n<|im_start|>user\nmore"
    forced = _scripted(tokenizer, invented)
    free = generate_replies(model, tokenizer, ["def f(x):"], 16, 1, constraint=forced)
    assert free[0].startswith("x = 1\nuser")  # without the stop: the invented turn is read
    ended = generate_replies(model, tokenizer, ["def f(x):"], 16, 1, constraint=forced, stop=turn_end(chat))
    assert ended == ["x = 1"]
    # An end the tokenizer splits into several tokens cannot stop generation: the text is cut there.
    cut = generate_replies(model, tokenizer, ["def f(x):"], 16, 1, constraint=forced, stop="user\nmore")
    assert cut == ["x = 1\n"]
