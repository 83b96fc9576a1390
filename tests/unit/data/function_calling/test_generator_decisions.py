"""data.synthetic_mix, the knobs that teach the call/no-call decision itself rather than its
prior: twins (the same request with and without a matching function), restate (replies that say
what is wanted and what the functions do first) and follow_ups (more requests against the same
functions). Shares are counted on Glaive rows parsed back, as in data/function_calling/test_generator.py.
"""

from __future__ import annotations

import re
from collections import Counter

from tests.fc_mix_rows import (
    SPECS,
    assert_share,
    calls_with_request,
    declines_naming_the_listed_functions,
    first_assistant,
    first_calls,
    first_request,
    listed,
    only,
    rows,
    spec_of,
)

from hpcpipe.data.function_calling.conversation import Conversation, Message
from hpcpipe.data.function_calling.generator import SCIENCE_LIBRARY

# ------------------------------------------------------------------------------------------------------ twins


def test_twins_repeat_a_single_request_with_the_matching_function_swapped_for_one_of_its_library() -> None:
    convs = rows(only(single=1, twins=1), 600)
    for conv, twin in zip(convs[::2], convs[1::2], strict=True):
        (call,) = first_calls(conv)
        wanted = spec_of(call.name)
        assert first_request(twin) == first_request(conv)
        assert not first_calls(twin) and declines_naming_the_listed_functions(first_assistant(twin), twin)
        assert wanted.capability in first_assistant(twin).content
        swapped = [spec_of(name) for name in listed(twin) if spec_of(name) not in map(spec_of, listed(conv))]
        (sibling,) = swapped
        assert (sibling in SCIENCE_LIBRARY) == (wanted in SCIENCE_LIBRARY)
        assert sibling.domain not in {spec_of(name).domain for name in listed(conv)}
        assert len(listed(twin)) == len(listed(conv))


def test_twins_is_the_share_of_single_conversations_followed_by_a_twin() -> None:
    convs = rows(only(single=1, twins=0.5), 1500)
    singles = sum(bool(first_calls(conv)) for conv in convs)
    twins = len(convs) - singles
    assert_share(twins, singles, 0.5, "single conversations with a twin")


# ---------------------------------------------------------------------------------------------------- restate

RESTATED = re.compile(r"^You'd like to (.+)\. The functions? here can (.+?)\.(?: (.+))?$")


def test_restate_says_what_is_wanted_and_what_the_listed_functions_do_before_calling_or_declining() -> None:
    called = declined = 0
    for conv in rows(only(single=1, parallel=1, refusal=2, restate=1), 600):
        message = first_assistant(conv)
        match = RESTATED.match(message.content)
        assert match, message.content
        need, can, rest = match.groups()
        assert can.startswith(spec_of(listed(conv)[0]).capability)
        assert all(spec_of(name).capability in can for name in listed(conv))
        if message.tool_calls:  # what is wanted is what the called functions do, and nothing follows
            called += 1
            assert rest is None
            assert all(spec_of(call.name).capability in need for call in message.tool_calls)
        else:  # what is wanted is none of the listed functions' capabilities
            declined += 1
            assert rest and all(spec_of(name).capability != need for name in listed(conv))
    assert_share(called, called + declined, 0.5, "restated replies that call")


def test_restate_is_the_share_of_conversations_whose_replies_restate_and_never_at_0() -> None:
    convs = rows(only(single=1, refusal=1, restate=0.3), 1500)
    restated = sum(bool(RESTATED.match(first_assistant(conv).content)) for conv in convs)
    assert_share(restated, len(convs), 0.3, "restated conversations")
    plain = rows(only(single=1, refusal=1), 500)
    assert not any(RESTATED.match(first_assistant(conv).content) for conv in plain)


# ------------------------------------------------------------------------------------------------- follow-ups


def replies_to_requests(conv: Conversation) -> list[Message]:
    """The assistant turns that answer a request: a call, or a refusal naming the listed
    functions (not answers to function results, nor "you're welcome" to a thanks)."""
    replies = []
    for before, message in zip(conv.messages, conv.messages[1:], strict=False):
        answers = message.tool_calls or declines_naming_the_listed_functions(message, conv)
        if before.role == "user" and answers:
            replies.append(message)
    return replies


def test_follow_ups_ask_one_to_three_more_requests_against_the_same_functions() -> None:
    lengths: Counter[int] = Counter()
    for conv in rows(only(single=1, refusal=1, follow_ups=1), 600):
        replies = replies_to_requests(conv)
        lengths[len(replies)] += 1
        for call, _ in calls_with_request(conv):
            assert call.name in listed(conv)
        for reply in replies:
            if not reply.tool_calls:  # declines a request that no listed function serves
                wanted = [spec for spec in SPECS.values() if f" {spec.capability}" in reply.content]
                assert any(spec not in map(spec_of, listed(conv)) for spec in wanted), reply.content
    assert set(lengths) == {2, 3, 4}, lengths
    for extra in (1, 2, 3):
        assert_share(lengths[extra + 1], 600, 1 / 3, f"conversations with {extra} follow-ups")


def test_follow_ups_call_as_often_as_single_weighs_against_refusal() -> None:
    calls = requests = 0
    for conv in rows(only(single=1, refusal=3, follow_ups=1), 800):
        later = replies_to_requests(conv)[1:]
        calls += sum(bool(reply.tool_calls) for reply in later)
        requests += len(later)
    assert_share(calls, requests, 0.25, "follow-up requests answered by a call")


def test_follow_ups_is_the_share_of_single_and_refusal_conversations_that_go_on_and_never_at_0() -> None:
    convs = rows(only(single=1, refusal=1, parallel=1, follow_ups=0.5), 1500)
    eligible = [conv for conv in convs if len(first_calls(conv)) <= 1]  # single and refusal
    going_on = sum(len(replies_to_requests(conv)) > 1 for conv in eligible)
    assert_share(going_on, len(eligible), 0.5, "single and refusal conversations with follow-ups")
    assert all(len(replies_to_requests(conv)) == 1 for conv in convs if len(first_calls(conv)) > 1)
    assert all(len(replies_to_requests(conv)) == 1 for conv in rows(only(single=1, refusal=1), 500))


def test_call_only_ends_a_conversation_with_follow_ups_at_its_last_call() -> None:
    ended_at_a_call = 0
    for conv in rows(only(single=1, refusal=1, follow_ups=1, call_only=1), 600):
        last_request = max(i for i, m in enumerate(conv.messages) if m.role == "user")
        if conv.messages[last_request + 1].tool_calls:
            ended_at_a_call += 1
            assert len(conv.messages) == last_request + 2
    assert ended_at_a_call > 100
