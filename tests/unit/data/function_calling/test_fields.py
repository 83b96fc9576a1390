"""data.synthetic_mix.near_misses and close_distractors: requests declined beside a function of their
field, and calls made beside one (fields.py). Shares are counted on Glaive rows parsed back, as in
data/function_calling/test_generator.py.
"""

from __future__ import annotations

import re
from collections import Counter

from tests.fc_mix_rows import SPECS, assert_share, first_assistant, first_calls, listed, only, rows, spec_of

from hpcpipe.data.function_calling.conversation import Conversation
from hpcpipe.data.function_calling.fields import FIELDS, field_of, siblings
from hpcpipe.data.function_calling.generator import LIBRARY, SCIENCE_LIBRARY
from hpcpipe.data.function_calling.library import Spec

# What the three refusal replies (phrases.REFUSALS) say cannot be done.
DECLINED = re.compile(r"(?:can't|not able to|a function to) (.+?)(?: —|\. )")
BY_CAPABILITY: dict[str, Spec] = {spec.capability: spec for spec in SPECS.values()}


def declined(conv: Conversation) -> Spec:
    """The function whose request the first reply declines (named by its capability)."""
    match = DECLINED.search(first_assistant(conv).content)
    assert match, first_assistant(conv).content
    return BY_CAPABILITY[match.group(1)]


def beside_its_field(wanted: Spec, conv: Conversation) -> bool:
    """Whether a listed function is of ``wanted``'s field (and not of its domain)."""
    return any(spec_of(name) in siblings(wanted, LIBRARY + SCIENCE_LIBRARY) for name in listed(conv))


def test_every_function_of_a_field_is_in_the_library_once_and_siblings_leave_its_domain_out() -> None:
    names = [name for members in FIELDS.values() for name in members]
    assert len(names) == len(set(names)) and set(names) <= set(SPECS)
    assert len({spec.capability for spec in SPECS.values()}) == len(SPECS)  # DECLINED can tell them apart
    for name in names:
        spec = SPECS[name]
        kin = siblings(spec, LIBRARY + SCIENCE_LIBRARY)
        assert kin and all(field_of(k.name) == field_of(name) and k.domain != spec.domain for k in kin)
    assert siblings(SPECS["make_password"], LIBRARY) == []  # no field: no near miss


def test_near_misses_decline_a_request_beside_a_function_of_its_field_and_never_of_its_domain() -> None:
    fields: Counter[str] = Counter()
    for conv in rows(only(refusal=1, near_misses=1), 600):
        wanted = declined(conv)
        assert not first_calls(conv) and beside_its_field(wanted, conv), conv.messages[1:3]
        assert wanted.domain not in {spec_of(name).domain for name in listed(conv)}
        fields[field_of(wanted.name) or ""] += 1
    assert set(fields) == set(FIELDS)  # every field comes up


def test_near_misses_is_the_share_of_refusals_beside_their_field_and_never_at_0() -> None:
    def beside(mix_share: float, seed: int) -> tuple[int, int]:
        convs = rows(only(refusal=1, near_misses=mix_share), 1500, seed)
        return sum(beside_its_field(declined(conv), conv) for conv in convs), len(convs)

    by_chance, n = beside(0, 1)  # unrelated draws land in a field now and then
    chance = by_chance / n
    assert chance < 0.25
    count, n = beside(0.4, 0)
    assert_share(count, n, 0.4 + 0.6 * chance, "refusals beside a function of their field")
    default = rows(only(refusal=1), 300)
    assert rows(only(refusal=1, near_misses=0), 300) == default  # no draw at 0: older mixes keep their rows


def test_near_misses_in_follow_ups_keep_the_functions_that_earlier_turns_used() -> None:
    for conv in rows(only(single=1, refusal=1, near_misses=1, follow_ups=1), 400):
        names = set(listed(conv))
        assert all(call.name in names for message in conv.messages for call in message.tool_calls)


def test_close_distractors_list_a_function_of_the_called_one_s_field_that_is_not_called() -> None:
    library = LIBRARY + SCIENCE_LIBRARY
    with_field = 0
    for conv in rows(only(single=1, close_distractors=1), 600):
        (call,) = first_calls(conv)
        wanted = spec_of(call.name)
        if siblings(wanted, library):
            with_field += 1
            assert beside_its_field(wanted, conv), listed(conv)
    assert with_field > 300


def test_close_distractors_is_the_share_of_calls_beside_their_field() -> None:
    def beside(mix_share: float, seed: int) -> tuple[int, int]:
        convs = rows(only(single=1, close_distractors=mix_share), 1500, seed)
        called = [spec_of(first_calls(c)[0].name) for c in convs]
        library = LIBRARY + SCIENCE_LIBRARY
        eligible = [(s, c) for s, c in zip(called, convs, strict=True) if siblings(s, library)]
        return sum(beside_its_field(s, c) for s, c in eligible), len(eligible)

    by_chance, n = beside(0, 1)
    chance = by_chance / n
    count, n = beside(0.5, 0)
    assert_share(count, n, 0.5 + 0.5 * chance, "calls beside a function of their field")
