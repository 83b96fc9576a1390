"""``data.synthetic_mix.place_formats`` and ``place_functions``: cities in the "City, Region" form a
function's description asks for, counted on generated rows parsed back as a trainer reads them."""

from __future__ import annotations

import json
import random

from fc_mix_rows import assert_share, calls_with_request, only, rows, spec_of
from hpcpipe.data.function_calling.conversation import Conversation, Message, ToolCall
from hpcpipe.data.function_calling.places import (
    PLACE_PARAMS,
    PLACES,
    _swap,
    calls_a_place,
    with_places,
    written,
)
from hpcpipe.data.function_calling.schemas import load_catalogue

WRITTEN = {written(p): p for p in PLACES}
POOL_CITIES = set(load_catalogue().pools["cities"])  # the bare names the generator draws


def _place_calls(conv: Conversation) -> list[tuple[ToolCall, str]]:
    return [(c, user) for c, user in calls_with_request(conv) if spec_of(c.name).name in PLACE_PARAMS]


def _value(call: ToolCall) -> str:
    return str(call.arguments[PLACE_PARAMS[spec_of(call.name).name]])


def _asks_for_the_form(conv: Conversation) -> bool:
    """Every listed function taking a city describes the "City, Region" form."""
    for tool in conv.tools:
        param = PLACE_PARAMS.get(spec_of(tool["name"]).name)
        if (
            param is not None
            and "country" not in tool["parameters"]["properties"][param]["description"].lower()
        ):
            return False
    return True


def test_the_functions_taking_a_city_are_those_whose_result_echoes_it() -> None:
    assert PLACE_PARAMS == {
        "current_weather_report": "city",
        "weather_forecast_days": "city",
        "reserve_hotel_room": "city",
        "search_restaurants": "location",
    }


def test_calls_write_a_place_in_full_whatever_the_user_wrote() -> None:
    forms = {"as written": 0, "state written out": 0, "city alone": 0}
    convs = [
        c
        for c in rows(only(single=1, parallel=1, place_formats=1, place_functions=10), 400)
        if calls_a_place(c)
    ]
    assert len(convs) > 100
    for conv in convs:
        assert _asks_for_the_form(conv), conv.tools
        for call, user in _place_calls(conv):
            value = _value(call)
            city, region, state = WRITTEN[value]  # KeyError: not a place of PLACES in full
            if value in user:
                forms["as written"] += 1
            elif state and f"{city}, {state}" in user:
                forms["state written out"] += 1
            else:
                assert city in user and f"{city}, {region}" not in user, (user, value)
                forms["city alone"] += 1
        results = [json.loads(m.content) for m in conv.messages if m.role == "tool"]
        assert not any(r.get("city") in POOL_CITIES for r in results), results  # results echo the place
    assert all(count > 10 for count in forms.values()), forms


def test_place_formats_is_the_share_of_conversations_calling_a_place_and_never_at_0() -> None:
    half = [c for c in rows(only(single=1, place_formats=0.5, place_functions=10), 600) if calls_a_place(c)]
    rewritten = sum(all(_value(call) in WRITTEN for call, _ in _place_calls(c)) for c in half)
    assert all(_asks_for_the_form(c) for c in half if _value(_place_calls(c)[0][0]) in WRITTEN)
    assert_share(rewritten, len(half), 0.5, "conversations in City, Region form")
    for conv in rows(only(single=1, parallel=1, place_functions=10), 300):
        for call, _ in _place_calls(conv):
            assert _value(call) not in WRITTEN


def test_place_functions_draws_functions_taking_a_city_more_often() -> None:
    def share(weight: float) -> float:
        convs = rows(only(single=1, place_functions=weight), 800)
        return (
            sum(spec_of(c.name).name in PLACE_PARAMS for conv in convs for c, _ in calls_with_request(conv))
            / 800
        )

    # 4 of 40 everyday functions: about 0.1 at weight 1, about 0.4 at 6 (4 * 6 / (36 + 4 * 6))
    assert 0.05 < share(1) < 0.16 and 0.3 < share(6) < 0.5, (share(1), share(6))


def test_a_city_is_swapped_once_even_when_its_new_name_holds_another_city() -> None:
    names = {"Chicago": "Buffalo, New York", "New York": "Denver, CO"}
    assert (
        _swap("From New York to Chicago, not New Yorker", names)
        == "From Denver, CO to Buffalo, New York, not New Yorker"
    )


def test_a_city_named_by_another_argument_is_left_alone() -> None:
    """A weather call for Paris beside a taxi to "Gare de Paris": swapping Paris would change the taxi."""
    tools = (
        {
            "name": "current_weather_report",
            "description": "",
            "parameters": {"properties": {"city": {"description": "The city"}}},
        },
    )
    messages = (
        Message("user", "Weather in Paris, and a taxi to Gare de Paris."),
        Message(
            "assistant",
            "",
            (
                ToolCall("current_weather_report", {"city": "Paris"}),
                ToolCall("book_taxi", {"to": "Gare de Paris"}),
            ),
        ),
    )
    conv = Conversation(messages, tools)
    assert with_places(conv, random.Random(0)) is conv
    alone = Conversation((messages[0], Message("assistant", "", messages[1].tool_calls[:1])), tools)
    placed = with_places(alone, random.Random(0))
    assert placed.messages[1].tool_calls[0].arguments["city"] in WRITTEN
    assert "country" in placed.tools[0]["parameters"]["properties"]["city"]["description"]
