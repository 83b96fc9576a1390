"""Rendering, exact assistant-only masking, packing with per-document boundaries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hpcpipe.data.function_calling.conversation import Conversation, Message, ToolCall
from hpcpipe.data.function_calling.pack import PAD_DOC, bins_first_fit, pack
from hpcpipe.data.function_calling.tokens import IGNORE, ChatFormat, Encoded
from hpcpipe.recipes.lora_fc_loss import packed_attention

TOOL = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CONV = Conversation(
    messages=(
        Message("system", "You are helpful."),
        Message("user", "Weather in O'Hare?"),
        Message("assistant", "", (ToolCall("get_weather", {"city": "O'Hare"}),)),
        Message("tool", '{"temp": 21}'),
        Message("assistant", "It is 21 degrees in Zürich's sister city."),
    ),
    tools=(TOOL,),
)
# A tools-aware template in the style of Qwen2.5's (tools= and tool_calls rendered by the template).
NATIVE_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %}{{ t['function']['name'] }};{% endfor %}"
    "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m['tool_calls'] is defined %}{% for c in m['tool_calls'] %}<tool_call>{{ c['function']['name'] }}"
    "{{ c['function']['arguments'] | tojson }}</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hpcpipe.models.tiny_lm import tiny_llama_dir

    texts = ["Weather in O'Hare? It is 21 degrees in Zürich.", '{"name": "get_weather"}'] * 50
    return tiny_llama_dir(tmp_path_factory.mktemp("models"), texts, seed=0)


def _tokenizer(path: Path, template: str | None = None):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = template
    return tok


def _supervised_text(tok, enc: Encoded) -> list[str]:  # type: ignore[no-untyped-def]
    """Decoded runs of consecutive supervised tokens."""
    runs, current = [], []
    for token, label in zip(enc.input_ids.tolist(), enc.labels.tolist(), strict=True):
        if label != IGNORE:
            assert label == token
            current.append(token)
        elif current:
            runs.append(tok.decode(current))
            current = []
    if current:
        runs.append(tok.decode(current))
    return runs


def test_own_template_supervises_exactly_the_assistant_turns_and_their_end_token(tokenizer_dir: Path) -> None:
    tok = _tokenizer(tokenizer_dir)
    fmt = ChatFormat(tok)
    assert fmt.own_template and not fmt.native_tools
    enc = fmt.encode(CONV)
    runs = _supervised_text(tok, enc)
    assert runs == [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "O\'Hare"}}\n</tool_call><|im_end|>\n',
        "It is 21 degrees in Zürich's sister city.<|im_end|>\n",
    ]
    text = tok.decode(enc.input_ids.tolist())
    assert "<tools>" in text and '"get_weather"' in text  # schemas rendered into the system turn
    assert '<tool_response>\n{"temp": 21}\n</tool_response>' in text


@pytest.mark.parametrize("template", [None, NATIVE_TEMPLATE])
def test_the_context_is_the_system_prompt_with_the_tools(tokenizer_dir: Path, template: str | None) -> None:
    tok = _tokenizer(tokenizer_dir, template)
    enc = ChatFormat(tok).encode(CONV)
    context, rest = (
        tok.decode(enc.input_ids[: enc.context].tolist()),
        tok.decode(enc.input_ids[enc.context :].tolist()),
    )
    assert "get_weather" in context and "O'Hare" not in context  # the schemas, not the request
    assert rest.startswith("<|im_start|>user") and (enc.labels[: enc.context] == IGNORE).all()


def test_native_tools_template_receives_tools_and_tool_calls(tokenizer_dir: Path) -> None:
    tok = _tokenizer(tokenizer_dir, NATIVE_TEMPLATE)
    fmt = ChatFormat(tok)
    assert fmt.native_tools and not fmt.own_template
    enc = fmt.encode(CONV)
    runs = _supervised_text(tok, enc)
    assert runs[0] == '<tool_call>get_weather{"city": "O\'Hare"}</tool_call><|im_end|>\n'
    assert tok.decode(enc.input_ids.tolist()).startswith("<|im_start|>system\nTOOLS:get_weather;")


def test_prompt_ends_with_the_generation_prompt(tokenizer_dir: Path) -> None:
    fmt = ChatFormat(_tokenizer(tokenizer_dir))
    prompt = fmt.prompt(CONV, 2)
    assert prompt.endswith("Weather in O'Hare?<|im_end|>\n<|im_start|>assistant\n")


def test_first_fit_places_everything_within_capacity() -> None:
    lengths = [7, 3, 5, 2, 8, 1, 4]
    bins = bins_first_fit(lengths, 10)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins)
    assert len(bins) == 3  # 30 tokens in bins of 10: first-fit decreasing finds the optimum here


def test_pack_keeps_documents_whole_and_marks_padding() -> None:
    def enc(n: int, start: int) -> Encoded:
        ids = np.arange(start, start + n, dtype=np.int32)
        return Encoded(ids, ids.copy(), context=2)

    packed = pack([enc(5, 10), enc(3, 20), enc(4, 30)], seq_len=8, packing=True, pad_id=0)
    assert len(packed) == 2
    starts = packed.input_ids % 10 == 0  # each conversation's first token: 10, 20, 30
    context = starts | np.pad(starts[:, :-1], ((0, 0), (1, 0)))  # and the token after it
    assert (packed.context == (context & (packed.doc_ids != PAD_DOC))).all()
    for row in range(len(packed)):
        docs = packed.doc_ids[row]
        for doc in set(docs.tolist()) - {PAD_DOC}:
            values = packed.input_ids[row][docs == doc]
            assert np.all(np.diff(values) == 1)  # contiguous, in order
    assert (packed.labels[packed.doc_ids == PAD_DOC] == IGNORE).all()
    unpacked = pack([enc(5, 10), enc(3, 20)], seq_len=8, packing=False, pad_id=0)
    assert len(unpacked) == 2 and unpacked.fill == 0.5


def test_packed_attention_blocks_documents_and_restarts_positions() -> None:
    docs = torch.tensor([[0, 0, 1, 1, 1, PAD_DOC]])
    mask, positions = packed_attention(docs)
    assert positions.tolist() == [[0, 1, 0, 1, 2, 0]]
    m = mask[0, 0]
    assert m[3].tolist() == [False, False, True, True, False, False]
    assert m[5].tolist() == [False] * 5 + [True]  # padding sees itself only: no empty softmax row
    assert not m.triu(1).any()  # causal


def test_packed_logits_equal_separate_logits(tokenizer_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tokenizer_dir, attn_implementation="sdpa").eval()
    a, b = torch.randint(0, 500, (1, 5)), torch.randint(0, 500, (1, 7))
    docs = torch.tensor([[0] * 5 + [1] * 7])
    mask, positions = packed_attention(docs)
    with torch.no_grad():
        packed = model(torch.cat([a, b], 1), attention_mask=mask, position_ids=positions).logits
        alone = model(b).logits
    torch.testing.assert_close(packed[:, 5:], alone, rtol=1e-4, atol=1e-4)


def test_the_decision_weight_weighs_the_tokens_that_open_a_reply() -> None:
    from hpcpipe.recipes.lora_fc_loss import opening_targets, supervised_loss

    turns = torch.tensor([[IGNORE, 3, 4, IGNORE, IGNORE, 5], [7, 8, IGNORE, 9, IGNORE, IGNORE]])
    assert opening_targets(turns).tolist() == [[0, 1, 0, 0, 0, 1], [1, 0, 0, 1, 0, 0]]
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)  # (B, K, V)
    targets = torch.tensor([[3, 1, IGNORE, 4, 2], [IGNORE, 5, 6, 0, IGNORE]])
    opens = torch.tensor([[True, False, False, True, False], [False, True, False, False, False]])
    per_token = F.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="none"
    )
    valid = targets.flatten() != IGNORE
    plain = supervised_loss(logits, targets, opens, 1.0)
    torch.testing.assert_close(plain, per_token[valid].mean())
    weights = torch.tensor([4.0, 1, 0, 4, 1, 0, 4, 1, 1, 0])  # 4 on the three opening tokens
    torch.testing.assert_close(supervised_loss(logits, targets, opens, 4.0), (per_token * weights).sum() / 16)


def test_the_no_call_weight_weighs_the_openings_of_turns_without_a_call() -> None:
    from hpcpipe.recipes.lora_fc_loss import opening_targets, supervised_loss, text_openings

    call = [8, 9]  # "<tool_call>" as two token ids
    targets = torch.tensor(
        [
            # a call turn, a text turn, a call after a preamble (5 then 8, 9)
            [IGNORE, 8, 9, 4, IGNORE, 3, 4, IGNORE, 5, 8, 9, IGNORE],
            # a text turn holding 8 and 9 apart, then a text turn ending the row on 8
            [1, 8, 2, 9, IGNORE, IGNORE, IGNORE, IGNORE, IGNORE, IGNORE, 2, 8],
        ]
    )
    opens = opening_targets(targets)
    assert opens.long().tolist() == [
        [0, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0],
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0],
    ]
    text = text_openings(targets, opens, call)
    assert text.long().tolist() == [
        [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0],
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0],
    ]

    torch.manual_seed(0)
    logits = torch.randn(2, 12, 10)  # (B, K, V)
    per_token = F.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="none"
    )
    weights = torch.where(opens, 2.0, 1.0) * torch.where(text, 3.0, 1.0) * (targets != IGNORE)
    expected = (per_token * weights.flatten()).sum() / weights.sum()
    assert weights.sum() == 14 + 2 + 5 * 3  # 14 supervised; 2 call openings at 2; 3 text ones at 6
    torch.testing.assert_close(supervised_loss(logits, targets, opens, 2.0, text, 3.0), expected)
    # at 1 the text openings weigh as the call openings do
    torch.testing.assert_close(
        supervised_loss(logits, targets, opens, 2.0, text, 1.0), supervised_loss(logits, targets, opens, 2.0)
    )
