"""data.synthetic_mix: every knob of the synthetic function-calling generator gives the share it
states, counted on Glaive rows parsed back (what a user's training data holds), and bad mixes are
refused with one line naming the key.

A conversation's shape is read from its content: the first assistant turn's calls (how many, how
many functions), whether functions are listed, the system prompt, and where the conversation ends.
Shares are checked within 4 binomial standard deviations of the stated one (seeds are fixed, so a
run is deterministic; the margin only keeps a reseed from failing by chance).
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from tests.fc_mix_rows import (
    SPECS,
    assert_share,
    calls_with_request,
    declines_naming_the_listed_functions,
    first_calls,
    first_request,
    listed,
    only,
    rows,
    spec_of,
)

from hpcpipe.config import load_config
from hpcpipe.config.synthetic import NO_CALL_SHAPES, SHAPE_FIELDS, SyntheticMix
from hpcpipe.data.function_calling.conversation import Conversation, ToolCall
from hpcpipe.data.function_calling.formats import GLAIVE_NO_FUNCTIONS, parse_glaive
from hpcpipe.data.function_calling.generator import LIBRARY, SCIENCE_LIBRARY, generate_conversations
from hpcpipe.data.function_calling.glaive_rows import generate_glaive_rows
from hpcpipe.data.function_calling.library import Spec
from hpcpipe.data.function_calling.schemas import load_catalogue
from hpcpipe.errors import ConfigError


def shape_of(conv: Conversation) -> str:
    """The shape a conversation was drawn as, read from its content."""
    if conv.messages[0].content == GLAIVE_NO_FUNCTIONS:
        assert not conv.tools
        return "no_access"
    assert conv.tools
    assistant = [m for m in conv.messages if m.role == "assistant"]
    calls = assistant[0].tool_calls
    if not calls:
        if any(m.tool_calls for m in assistant):
            return "clarify"
        return "refusal" if declines_naming_the_listed_functions(assistant[0], conv) else "irrelevant"
    names = Counter(call.name for call in calls)
    if len(calls) >= 2:
        return "parallel_multiple" if len(names) >= 2 and max(names.values()) >= 2 else "parallel"
    # One call: a second request answered by a call or a refusal is multi_turn (a single may end in thanks).
    later = assistant[1:]
    if sum(bool(m.tool_calls) for m in later) or any(
        declines_naming_the_listed_functions(m, conv) for m in later
    ):
        return "multi_turn"
    return "single"


# ------------------------------------------------------------------------------------------- shape weights


def test_only_irrelevant_lists_functions_and_never_calls() -> None:
    convs = rows(only(irrelevant=1), 500)
    assert all(conv.tools and conv.messages[0].content != GLAIVE_NO_FUNCTIONS for conv in convs)
    assert not any(m.tool_calls for conv in convs for m in conv.messages)
    assert {shape_of(conv) for conv in convs} == {"irrelevant"}  # a plain answer, not a refusal


def test_single_and_irrelevant_weighed_alike_call_in_half_the_conversations() -> None:
    convs = rows(only(single=1, irrelevant=1), 2000)
    calling = sum(bool(first_calls(conv)) for conv in convs)
    assert_share(calling, len(convs), 0.5, "conversations whose first assistant turn calls")


@pytest.mark.parametrize(
    "mix",
    [SyntheticMix(), SyntheticMix.classic(), SyntheticMix(call_only=1, dotted_names=1, parallel_multiple=30)],
    ids=["default", "classic", "call-only-dotted"],
)
def test_every_shape_comes_as_often_as_its_weight_says(mix: SyntheticMix) -> None:
    weights = dict(zip(SHAPE_FIELDS, mix.shape_weights(), strict=True))
    total = sum(weights.values())
    convs = rows(mix, 2000)
    shapes = Counter(shape_of(conv) for conv in convs)
    for shape in SHAPE_FIELDS:
        assert_share(shapes[shape], len(convs), weights[shape] / total, shape)
    # The shapes config/synthetic.py says make no call in the first assistant turn make none.
    no_call = sum(not first_calls(conv) for conv in convs)
    p = (sum(weights[s] for s in NO_CALL_SHAPES) + weights["clarify"]) / total
    assert_share(no_call, len(convs), p, "first assistant turns without a call")


def test_a_mix_gives_the_same_rows_for_the_same_seed_and_a_longer_list_extends_a_shorter() -> None:
    mix = only(single=1, parallel=2, irrelevant=1, copy_values=0.5, dotted_names=0.5)
    assert generate_glaive_rows(50, 3, mix) == generate_glaive_rows(50, 3, mix)
    assert generate_glaive_rows(80, 3, mix)[:50] == generate_glaive_rows(50, 3, mix)
    assert [parse_glaive(row) for row in generate_glaive_rows(50, 3, mix)] == generate_conversations(
        50, 3, mix
    )


# -------------------------------------------------------------------------------------------- parallel calls


def test_parallel_calls_of_one_function_come_two_to_max_parallel_calls_with_other_arguments() -> None:
    convs = rows(only(parallel=1, max_parallel_calls=4, same_function_parallel=1), 900)
    counts: Counter[int] = Counter()
    for conv in convs:
        calls = first_calls(conv)
        assert 2 <= len(calls) <= 4
        assert len({call.name for call in calls}) == 1, calls
        arguments = [call.arguments for call in calls]
        assert all(a != b for i, a in enumerate(arguments) for b in arguments[:i]), arguments
        counts[len(calls)] += 1
    for count in (2, 3, 4):  # uniform over 2..4
        assert_share(counts[count], len(convs), 1 / 3, f"parallel turns of {count} calls")


def test_same_function_parallel_is_the_share_of_parallel_turns_calling_one_function() -> None:
    convs = rows(only(parallel=1, same_function_parallel=0.6), 1000)
    one_function = sum(len({call.name for call in first_calls(conv)}) == 1 for conv in convs)
    assert_share(one_function, len(convs), 0.6, "parallel turns calling one function")
    for conv in rows(only(parallel=1, same_function_parallel=0), 200):
        calls = first_calls(conv)
        assert len(calls) == 2 and calls[0].name != calls[1].name  # two functions, once each
    for conv in rows(only(parallel=1, same_function_parallel=1, max_parallel_calls=2), 200):
        assert len(first_calls(conv)) == 2


def test_compact_parallel_calls_differ_in_one_value_that_the_request_states() -> None:
    mix = only(
        parallel=1,
        same_function_parallel=1,
        compact_parallel=1,
        max_parallel_calls=4,
        inline_lists=0,
        written_numbers=0,
    )
    convs = rows(mix, 400)
    compact = [conv for conv in convs if COMPACT.search(first_request(conv))]
    # A function without a required value that reads alone (a name, a number) and that no other
    # value depends on falls back to full requests.
    assert len(compact) / len(convs) > 0.7
    for conv in compact:
        calls, user = first_calls(conv), first_request(conv)
        assert all(call.arguments.keys() == calls[0].arguments.keys() for call in calls), calls
        first = calls[0].arguments
        (key,) = {k for call in calls[1:] for k, v in call.arguments.items() if first[k] != v}
        # Never a value another one is drawn from (a flight's origin: its destination differs from it).
        assert not next(p for p in spec_of(calls[0].name).params if p.name == key).has_dependents
        assert all(str(call.arguments[key]) in user for call in calls), (calls, user)
    plain = rows(
        only(parallel=1, same_function_parallel=1, compact_parallel=0, max_parallel_calls=4, inline_lists=0),
        300,
    )
    assert not any(COMPACT.search(first_request(conv)) for conv in plain)


def test_inline_lists_name_every_value_in_the_one_request() -> None:
    knobs = {"parallel": 1, "same_function_parallel": 1, "compact_parallel": 1, "max_parallel_calls": 4}
    inline = rows(only(**knobs, inline_lists=1), 400)
    # Functions without a value that can vary alone fall back to one full request per call, joined.
    varied = [c for c in inline if one_value_varies(first_calls(c)) and not JOINED.search(first_request(c))]
    assert len(varied) / len(inline) > 0.7
    for conv in varied:
        calls, user = first_calls(conv), first_request(conv)
        assert not COMPACT.search(user), user
        first = calls[0].arguments
        (key,) = {k for call in calls[1:] for k, v in call.arguments.items() if first[k] != v}
        assert all(str(call.arguments[key]) in user for call in calls), (calls, user)
    # inline_lists is the share of compact requests that name the values inline.
    compact = [
        sum(bool(COMPACT.search(first_request(c))) for c in rows(only(**knobs, inline_lists=p), 600))
        for p in (0.0, 0.5)
    ]
    assert_share(compact[1], 600, compact[0] / 600 * 0.5, "compact requests left at inline_lists=0.5")


def one_value_varies(calls: tuple[ToolCall, ...]) -> bool:
    """Two or more calls of one function whose arguments differ in exactly one key."""
    first = calls[0].arguments
    keys = {k for call in calls[1:] for k, v in call.arguments.items() if first.get(k) != v}
    return len(calls) >= 2 and len({c.name for c in calls}) == 1 and len(keys) == 1


JOINED = re.compile(r"(Also, |And |In addition, |Oh, and )[a-zI]")
COMPACT = re.compile(r"(Do the same for|Then repeat that for|And the same for|Please also do it for) ")


def test_parallel_multiple_calls_two_or_three_functions_one_of_them_twice() -> None:
    convs = rows(only(parallel_multiple=1), 600)
    distinct_counts: Counter[int] = Counter()
    for conv in convs:
        calls = first_calls(conv)
        names = Counter(call.name for call in calls)
        assert len(calls) in (3, 4) and len(names) in (2, 3) and len(calls) == len(names) + 1, calls
        assert sorted(names.values())[-1] == 2  # one function twice, the others once
        (twice,) = [name for name, count in names.items() if count == 2]
        first, second = (call.arguments for call in calls if call.name == twice)
        assert first != second
        distinct_counts[len(names)] += 1
    assert_share(distinct_counts[2], len(convs), 0.5, "parallel_multiple turns of two functions")


# ------------------------------------------------------------------------------------------------ call_only


def test_call_only_ends_call_conversations_at_the_call() -> None:
    shapes = {"single": 1, "parallel": 1, "parallel_multiple": 1}
    for conv in rows(only(**shapes, call_only=1), 600):
        # system, user, the first assistant turn: its calls, and nothing after
        assert [m.role for m in conv.messages] == ["system", "user", "assistant"]
        assert conv.messages[-1].tool_calls
    for conv in rows(only(**shapes, call_only=0), 600):
        assert len(conv.messages) > 3 and any(m.role == "tool" for m in conv.messages)
    convs = rows(only(**shapes, call_only=0.5), 1000)
    ended = sum(
        conv.messages[-1].role == "assistant" and bool(conv.messages[-1].tool_calls) for conv in convs
    )
    assert_share(ended, len(convs), 0.5, "conversations ending at the call")


# --------------------------------------------------------------------------------------------- dotted_names

DOTTED = re.compile(r"^([a-z_]+)\.([a-z_]+)$")


def test_dotted_names_namespace_every_listed_function_and_every_call_names_a_listed_one() -> None:
    for conv in rows(SyntheticMix(dotted_names=1, api_namespaces=0), 1000):
        names = listed(conv)
        for name in names:
            match = DOTTED.match(name)
            assert match, name
            assert match.group(1) == spec_of(name).domain and match.group(2) in SPECS
        for call, _ in calls_with_request(conv):
            assert call.name in names
    convs = rows(SyntheticMix(dotted_names=0), 1000)
    assert not any("." in name for conv in convs for name in listed(conv))
    with_tools = [conv for conv in rows(SyntheticMix(dotted_names=0.3), 2000) if conv.tools]
    dotted = sum("." in listed(conv)[0] for conv in with_tools)
    assert_share(dotted, len(with_tools), 0.3, "conversations with dotted names")


def test_api_namespaces_give_every_listed_function_one_made_up_namespace() -> None:
    domains = {spec.domain for spec in SPECS.values()}
    shared = 0
    convs = [conv for conv in rows(SyntheticMix(dotted_names=1, api_namespaces=0.5), 1000) if conv.tools]
    for conv in convs:
        names = listed(conv)
        prefixes = {name.rsplit(".", 1)[0] for name in names}
        suffixes = [name.rsplit(".", 1)[1] for name in names]
        assert all(suffix in SPECS for suffix in suffixes)
        assert all(call.name in names for call, _ in calls_with_request(conv))
        if prefixes & domains:  # the domain of each function
            assert all(name == f"{spec_of(name).domain}.{spec_of(name).name}" for name in names)
        else:  # one made-up API name for all
            (api,) = prefixes
            assert re.fullmatch(r"[A-Z][a-z]+([A-Z][a-z]+)?|[A-Z]+(_[A-Z]+)?", api), api
            shared += 1
    assert_share(shared, len(convs), 0.5, "conversations with a made-up API namespace")


# ------------------------------------------------------------------------------------------ written_numbers

SIGNED = re.compile(r"[$€£]\d")


def test_written_numbers_state_large_numbers_with_separators_and_money_with_a_sign() -> None:
    signed = separated = 0
    for conv in rows(only(single=1, science=1, written_numbers=1), 1500):
        for call, user in calls_with_request(conv):
            spec = spec_of(call.name)
            for param in spec.params:
                value = call.arguments.get(param.name)
                if isinstance(value, bool) or not isinstance(value, int | float):
                    continue
                assert not isinstance(value, str)  # the call holds the plain number
                if abs(value) >= 1000:
                    assert f"{value:,}" in user or f"{value:,.2f}" in user, (value, user)
                    separated += 1
                if param.money and not any("currency" in p.name for p in spec.params):
                    assert re.search(
                        rf"[$€£]{re.escape(f'{value:,}')}|[$€£]{re.escape(f'{value:,.2f}')}", user
                    )
                    signed += 1
    assert signed > 50 and separated > 50
    plain = rows(only(single=1, science=1, written_numbers=0), 500)
    assert not any(SIGNED.search(user) for conv in plain for _, user in calls_with_request(conv))


# ---------------------------------------------------------------------------------------------- copy_values


def _pool_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _pool_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _pool_strings(item)


POOL_STRINGS = frozenset(_pool_strings(dict(load_catalogue().pools)))
MADE_UP = re.compile(r"^[A-Za-z]+( [A-Za-z]+)*$")
CALLING_SHAPES = {"single": 1, "parallel": 1, "multi_turn": 1, "clarify": 1, "parallel_multiple": 1}


def free_text_values(mix: SyntheticMix, n: int) -> Iterator[tuple[list[str], str]]:
    """(the values, the request) of every free-text argument of every call: lists give each item."""
    for conv in rows(mix, n):
        for call, user in calls_with_request(conv):
            for param in spec_of(call.name).params:
                if param.free_text and param.name in call.arguments:
                    value = call.arguments[param.name]
                    yield (value if isinstance(value, list) else [value]), user


def test_copy_values_replaces_every_free_text_value_by_a_made_up_word_stated_in_the_request() -> None:
    seen = 0
    for values, user in free_text_values(
        only(**CALLING_SHAPES, copy_values=1, optional_args=1, science=0), 600
    ):
        for value in values:
            assert value not in POOL_STRINGS and MADE_UP.match(value), value
            assert value in user, (value, user)
            seen += 1
    assert seen > 200
    seen = 0
    for values, _ in free_text_values(only(**CALLING_SHAPES, copy_values=0, optional_args=1, science=0), 600):
        assert all(value in POOL_STRINGS for value in values), values
        seen += 1
    assert seen > 200


def test_copy_values_is_the_share_of_free_text_arguments_made_up() -> None:
    arguments = list(free_text_values(only(**CALLING_SHAPES, copy_values=0.3), 1500))
    made_up = sum(values[0] not in POOL_STRINGS for values, _ in arguments)
    assert_share(made_up, len(arguments), 0.3, "free-text arguments made up")


# ---------------------------------------------------------------------------------------------- enum_nested


def test_enum_nested_draws_functions_with_enum_or_nested_arguments_that_much_more_often() -> None:
    rich = sum(spec.rich for spec in LIBRARY)
    assert 0 < rich < len(LIBRARY)
    shares = {}
    for weight in (1.0, 10.0):
        convs = rows(only(single=1, enum_nested=weight, science=0), 2000)
        drawn = sum(spec_of(first_calls(conv)[0].name).rich for conv in convs)
        # A weighted shuffle draws a function first with probability weight / total weight.
        p = weight * rich / (weight * rich + len(LIBRARY) - rich)
        assert_share(drawn, len(convs), p, f"single calls of rich functions at enum_nested={weight}")
        shares[weight] = drawn / len(convs)
    assert shares[1.0] == pytest.approx(rich / len(LIBRARY), abs=0.05)
    assert shares[10.0] > shares[1.0] + 0.3


def test_science_draws_the_math_and_science_functions_that_much_as_often_and_never_at_0() -> None:
    science = {spec.name for spec in SCIENCE_LIBRARY}
    assert len(science) >= 20 and not science & {spec.name for spec in LIBRARY}
    everyday = rows(only(single=1, refusal=1, no_access=1, enum_nested=1, science=0), 600)
    assert not any(spec_of(name).name in science for conv in everyday for name in listed(conv))
    weight = 2.0
    convs = rows(only(single=1, enum_nested=1, science=weight), 1500)
    drawn = sum(spec_of(first_calls(conv)[0].name).name in science for conv in convs)
    p = weight * len(science) / (weight * len(science) + len(LIBRARY))
    assert_share(drawn, len(convs), p, f"single calls of math and science functions at science={weight}")


# --------------------------------------------------------------------------------------------- optional_args


def _optional(spec: Spec) -> set[str]:
    return {p.name for p in spec.params if not p.required}


def test_optional_args_is_the_chance_each_optional_argument_is_stated() -> None:
    for conv in rows(only(single=1, optional_args=0), 600):
        (call,) = first_calls(conv)
        assert not set(call.arguments) & _optional(spec_of(call.name)), call
    with_optional = 0
    for conv in rows(only(single=1, optional_args=1), 600):
        (call,) = first_calls(conv)
        assert _optional(spec_of(call.name)) <= set(call.arguments), call
        with_optional += bool(_optional(spec_of(call.name)))
    assert with_optional > 300
    stated = slots = 0
    for conv in rows(only(single=1, optional_args=0.5), 1500):
        (call,) = first_calls(conv)
        optional = _optional(spec_of(call.name))
        stated += len(optional & set(call.arguments))
        slots += len(optional)
    assert_share(stated, slots, 0.5, "optional arguments stated")


# ------------------------------------------------------------------------------------------ calls are valid

MIXES = {
    "default": SyntheticMix(),
    "classic": SyntheticMix.classic(),
    "extremes": SyntheticMix(
        max_parallel_calls=6,
        same_function_parallel=1,
        optional_args=1,
        copy_values=1,
        call_only=0,
        dotted_names=1,
        follow_ups=1,
    ),
    "bare": SyntheticMix(optional_args=0, copy_values=0, call_only=1, enum_nested=10, dotted_names=0),
    "science": SyntheticMix(science=3, inline_lists=1, call_only=0),
}


@pytest.mark.parametrize("name", list(MIXES))
def test_every_call_names_a_listed_function_with_its_required_arguments(name: str) -> None:
    calls = 0
    for conv in rows(MIXES[name], 1000):
        tools = {tool["name"]: tool["parameters"] for tool in conv.tools}
        for call, _ in calls_with_request(conv):
            assert call.name in tools, (call.name, list(tools))
            schema = tools[call.name]
            assert set(schema["required"]) <= set(call.arguments), call
            assert set(call.arguments) <= set(schema["properties"]), call
            for key, value in call.arguments.items():
                prop = schema["properties"][key]
                items = value if prop.get("type") == "array" else [value]
                allowed = prop.get("enum") or (prop.get("items") or {}).get("enum")
                assert allowed is None or all(item in allowed for item in items), (call, key)
            calls += 1
    assert calls > 500


# ------------------------------------------------------------------------------------------------- config


def test_a_mix_without_any_shape_is_refused_naming_the_shapes() -> None:
    with pytest.raises(ValidationError, match="every shape weight is 0: give one of single, parallel, "):
        only()
    with pytest.raises(ConfigError) as err:
        load_config("lora-fc-tiny", [f"data.synthetic_mix.{shape}=0" for shape in SHAPE_FIELDS])
    message = str(err.value)
    assert "data.synthetic_mix" in message and all(shape in message for shape in SHAPE_FIELDS)
    assert "\n" not in message


def test_a_negative_weight_is_refused() -> None:
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        SyntheticMix(single=-1)
    with pytest.raises(ConfigError) as err:
        load_config("lora-fc-tiny", ["data.synthetic_mix.single=-1"])
    assert "data.synthetic_mix.single" in str(err.value) and "\n" not in str(err.value)


def test_the_mix_is_set_from_the_job_config_and_unknown_keys_are_refused() -> None:
    cfg = load_config(
        "lora-fc-smollm2", ["data.synthetic_mix.irrelevant=3", "data.synthetic_mix.call_only=0"]
    )
    assert cfg.data.synthetic_mix.irrelevant == 3 and cfg.data.synthetic_mix.call_only == 0
    assert cfg.data.synthetic_mix.single == SyntheticMix().single  # the others keep their defaults
    assert load_config("lora-fc-smollm2").data.synthetic_mix == SyntheticMix()
    with pytest.raises(ConfigError) as err:
        load_config("lora-fc-tiny", ["data.synthetic_mix.irrelevnt=3"])
    assert "unknown config key 'data.synthetic_mix.irrelevnt'" in str(err.value)
    assert "\n" not in str(err.value)


def test_the_sweep_script_s_classic_overrides_are_the_classic_mix() -> None:
    script = Path(__file__).resolve().parents[4] / "benchmarks" / "fc_mix_sweep.sh"
    out = subprocess.run(
        ["bash", str(script), "--classic"], capture_output=True, text=True, check=True, timeout=30
    )
    pairs = dict(item.removeprefix("data.synthetic_mix.").split("=") for item in out.stdout.split()[1::2])
    assert SyntheticMix(**pairs) == SyntheticMix.classic()  # type: ignore[arg-type]
    assert set(pairs) == set(SyntheticMix.model_fields)
