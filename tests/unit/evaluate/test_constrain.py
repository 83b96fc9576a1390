"""Schema-constrained tool calls (hpcpipe.evaluate.constrain): the grammar takes exactly the calls
the functions' schemas allow, text stays free, and a model's reply decoded under it is a call the
AST checker accepts where the same model, unconstrained, writes garbage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import needs_package

from hpcpipe.data.function_calling.conversation import Conversation, Message, ToolCall
from hpcpipe.data.function_calling.tokens import ChatFormat, format_call
from hpcpipe.errors import UserError

pytestmark = needs_package("xgrammar", "lora")

WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
        },
        "required": ["city", "unit"],
    },
}
CHOICE = {  # WEATHER with closed values
    **WEATHER,
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Oslo", "Rome"]},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
    },
}
CLOCK = {"name": "get_time", "description": "Time now", "parameters": {"type": "object", "properties": {}}}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hpcpipe.models.tiny_lm import tiny_llama_dir

    texts = [format_call(ToolCall("get_weather", {"city": "Oslo", "unit": "celsius"})), "It is sunny."] * 50
    return tiny_llama_dir(tmp_path_factory.mktemp("models"), texts, seed=0)


@pytest.fixture(scope="module")
def chat(tiny_dir: Path) -> ChatFormat:
    from transformers import AutoTokenizer

    return ChatFormat(AutoTokenizer.from_pretrained(tiny_dir))


def _accepts(grammars: Any, tools: list[dict[str, Any]], text: str) -> bool:
    import xgrammar

    matcher = xgrammar.GrammarMatcher(grammars.compile(tools))
    return bool(matcher.accept_string(text)) and matcher.is_completed()


def test_call_syntax_rebuilds_format_call() -> None:
    from hpcpipe.evaluate.constrain import call_syntax

    before, between, after = call_syntax()
    call = ToolCall("math.gcd", {"a": [1, 2], "b": {"c": "x"}})
    assert before + json.dumps(call.name) + between + json.dumps(call.arguments) + after == format_call(call)


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        (format_call(ToolCall("get_weather", {"city": "Oslo", "unit": "celsius"})), True),
        (format_call(ToolCall("get_weather", {"city": "Oslo", "unit": "celsius", "days": 3})), True),
        (format_call(ToolCall("get_time", {})), True),
        ("It is sunny, no function needed.", True),  # text stays free
        (  # two calls in one reply (parallel)
            format_call(ToolCall("get_time", {})) + "\n" + format_call(ToolCall("get_time", {})),
            True,
        ),
        (format_call(ToolCall("get_forecast", {"city": "Oslo"})), False),  # a name not on offer
        (format_call(ToolCall("get_weather", {"city": "Oslo"})), False),  # required "unit" left out
        (format_call(ToolCall("get_weather", {"city": "Oslo", "unit": "kelvin"})), False),  # not in enum
        (format_call(ToolCall("get_weather", {"city": "Oslo", "unit": "celsius", "days": "3"})), False),
        (format_call(ToolCall("get_weather", {"city": "Oslo", "unit": "celsius", "wind": 1})), False),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": ("Oslo",)}}\n</tool_call>', False),
    ],
)
def test_grammar_takes_exactly_the_schemas_calls(chat: ChatFormat, text: str, accepted: bool) -> None:
    from hpcpipe.evaluate.constrain import CallGrammars

    grammars = CallGrammars(chat.tokenizer, vocab_size=len(chat.tokenizer))
    assert _accepts(grammars, [WEATHER, CLOCK], text) is accepted


def test_no_tools_leaves_the_reply_free(chat: ChatFormat) -> None:
    from hpcpipe.evaluate.constrain import CallGrammars

    grammars = CallGrammars(chat.tokenizer, vocab_size=len(chat.tokenizer))
    assert _accepts(grammars, [], "<tool_call> anything {")
    assert grammars.unconstrained == 0


def test_without_xgrammar_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from hpcpipe.evaluate.constrain import CallGrammars

    monkeypatch.setitem(sys.modules, "xgrammar", None)  # `import xgrammar` raises ImportError
    with pytest.raises(UserError, match=r"--constrain needs XGrammar: pip install 'hpcpipe\[lora\]'"):
        CallGrammars(object(), vocab_size=8)


def test_a_template_with_its_own_call_text_is_refused(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    from hpcpipe.evaluate.constrain import check_template

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    tokenizer.chat_template = (  # tools-aware, writes calls as NAME(ARGS)
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% if m['tool_calls'] is defined %}"
        "{% for c in m['tool_calls'] %}{{ c['function']['name'] }}({{ c['function']['arguments'] | tojson }})"
        "{% endfor %}{% endif %}\n{% endfor %}{% if tools %}{% endif %}"
    )
    with pytest.raises(UserError, match="--constrain"):
        check_template(ChatFormat(tokenizer))


def test_constrained_replies_are_calls_the_checker_accepts(chat: ChatFormat, tiny_dir: Path) -> None:
    """A random tiny model made to open a call (its first tokens forced to ``<tool_call>\n``)
    writes garbage after it; under the grammar every reply is a complete call to an offered
    function that passes the checker's name, required-key, type and enum checks."""
    import torch
    from transformers import AutoModelForCausalLM

    from hpcpipe.evaluate.constrain import CallGrammars
    from hpcpipe.evaluate.function_calling import Case, bfcl_doc, score
    from hpcpipe.evaluate.generate import generate_replies

    tools = (CHOICE, CLOCK)  # closed choices only: a random model never ends a free string
    cases = [
        Case(
            f"c{i}",
            "multiple",
            "multiple",
            Conversation((Message("user", q),), tools),
            [bfcl_doc(t) for t in tools],
            [{"get_weather": {"city": ["Oslo"], "unit": ["celsius"]}}],
        )
        for i, q in enumerate(["Weather in Oslo?", "What time is it?", "Is it cold in Rome?"])
    ]
    prompts = [chat.prompt(c.conversation, 1) for c in cases]
    opener = chat.tokenizer("<tool_call>\n", add_special_tokens=False)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    grammars = CallGrammars(chat.tokenizer, vocab_size=model.config.vocab_size)
    compiled = [grammars.compile(c.conversation.tools) for c in cases]

    def opening(then: Any) -> Any:
        """A processor forcing the opener's tokens first, then handing the scores to ``then``."""
        start: list[int] = []

        def process(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            start[:] = start or [input_ids.shape[1]]
            step = input_ids.shape[1] - start[0]
            if step < len(opener):
                forced = torch.full_like(scores, float("-inf"))
                forced[:, opener[step]] = 0.0
                scores = forced
            return scores if then is None else then(input_ids, scores)

        return process

    def replies(constrained: bool) -> list[dict[str, Any]]:
        def constraint(index: Any) -> Any:
            return opening(grammars.processor([compiled[i] for i in index]) if constrained else None)

        out = generate_replies(model, chat.tokenizer, prompts, 96, 2, constraint=constraint)
        return [score(case, reply) for case, reply in zip(cases, out, strict=True)]

    assert all(r["error"] == "invalid_call" for r in replies(False))  # the model's own calls: garbage
    for result in replies(True):
        assert result["parsed"] and result["reply"].startswith("<tool_call>"), result["reply"]
        assert result["error"] in (None, "wrong_name", "value_error"), result  # schema-valid


def test_a_reply_may_end_at_the_turns_end_where_it_is_not_eos(tiny_dir: Path) -> None:
    """With EOS <|endoftext|> and the template's turn ending at <|im_end|>, the grammar read
    <|im_end|> as more text: the turn's end ends the grammar as it ends generation, so a row that
    has finished is not masked further."""
    import xgrammar
    from transformers import AutoTokenizer

    from hpcpipe.evaluate.constrain import CallGrammars
    from hpcpipe.evaluate.generate import stop_ids, turn_end

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    tokenizer.eos_token = "<|endoftext|>"
    chat = ChatFormat(tokenizer)
    stops = stop_ids(tokenizer, turn_end(chat))
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert stops == [tokenizer.eos_token_id, end]
    grammars = CallGrammars(tokenizer, vocab_size=len(tokenizer), stop_ids=stops)
    matcher = xgrammar.GrammarMatcher(grammars.compile([WEATHER]))
    assert matcher.accept_string(format_call(ToolCall("get_weather", {"city": "Oslo", "unit": "celsius"})))
    assert matcher.accept_token(end) and matcher.is_terminated()
