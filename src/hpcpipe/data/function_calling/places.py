"""Places written the way a function asks for them: "Denver, CO", "Lyon, France".

Real APIs often want a city with its state or country, and say so in the parameter's description;
a model trained only on bare city names copies "Denver" where the description asks for "Denver, CO",
and drops ", Latvia" from "Riga, Latvia". At ``data.synthetic_mix.place_formats`` a conversation
that calls a function taking a city (``PLACE_PARAMS``) is rewritten: that parameter's description
asks for "City, ST" (two-letter state code) in the US and "City, Country" elsewhere, each city of
the conversation becomes a place of ``PLACES``, and the call writes it in that form, whether the
user wrote it so, wrote the state out in full, or named the city alone (the model adds the region
from what it knows).

Only functions whose result does not look the city up are rewritten (their result echoes it), so the
new places need no coordinates. ``PLACES`` names no city that the 240 BFCL cases of the training-mix
sweep name (a test checks it), so a gain there comes from the format, not from knowing the cities.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from hpcpipe.data.function_calling.conversation import Conversation, Message, ToolCall
from hpcpipe.data.function_calling.results import RESULTS
from hpcpipe.data.function_calling.schemas import load_catalogue

# (city, region, state written out): the region is the state code in the US, else the country.
PLACES: tuple[tuple[str, str, str], ...] = (
    ("Austin", "TX", "Texas"),
    ("Dallas", "TX", "Texas"),
    ("Houston", "TX", "Texas"),
    ("Denver", "CO", "Colorado"),
    ("Spokane", "WA", "Washington"),
    ("Phoenix", "AZ", "Arizona"),
    ("Tucson", "AZ", "Arizona"),
    ("Atlanta", "GA", "Georgia"),
    ("Savannah", "GA", "Georgia"),
    ("Orlando", "FL", "Florida"),
    ("Tampa", "FL", "Florida"),
    ("Nashville", "TN", "Tennessee"),
    ("Memphis", "TN", "Tennessee"),
    ("Minneapolis", "MN", "Minnesota"),
    ("Detroit", "MI", "Michigan"),
    ("Philadelphia", "PA", "Pennsylvania"),
    ("Pittsburgh", "PA", "Pennsylvania"),
    ("Baltimore", "MD", "Maryland"),
    ("Cleveland", "OH", "Ohio"),
    ("Columbus", "OH", "Ohio"),
    ("St. Louis", "MO", "Missouri"),
    ("Kansas City", "MO", "Missouri"),
    ("Salt Lake City", "UT", "Utah"),
    ("Las Vegas", "NV", "Nevada"),
    ("Albuquerque", "NM", "New Mexico"),
    ("New Orleans", "LA", "Louisiana"),
    ("Charlotte", "NC", "North Carolina"),
    ("Raleigh", "NC", "North Carolina"),
    ("Honolulu", "HI", "Hawaii"),
    ("Anchorage", "AK", "Alaska"),
    ("Milwaukee", "WI", "Wisconsin"),
    ("Indianapolis", "IN", "Indiana"),
    ("Louisville", "KY", "Kentucky"),
    ("Oklahoma City", "OK", "Oklahoma"),
    ("Omaha", "NE", "Nebraska"),
    ("Boise", "ID", "Idaho"),
    ("Buffalo", "NY", "New York"),
    ("Richmond", "VA", "Virginia"),
    ("Providence", "RI", "Rhode Island"),
    ("Hartford", "CT", "Connecticut"),
    ("Des Moines", "IA", "Iowa"),
    ("Burlington", "VT", "Vermont"),
    ("Lyon", "France", ""),
    ("Marseille", "France", ""),
    ("Munich", "Germany", ""),
    ("Hamburg", "Germany", ""),
    ("Milan", "Italy", ""),
    ("Florence", "Italy", ""),
    ("Barcelona", "Spain", ""),
    ("Seville", "Spain", ""),
    ("Lisbon", "Portugal", ""),
    ("Porto", "Portugal", ""),
    ("Amsterdam", "Netherlands", ""),
    ("Brussels", "Belgium", ""),
    ("Vienna", "Austria", ""),
    ("Prague", "Czech Republic", ""),
    ("Budapest", "Hungary", ""),
    ("Warsaw", "Poland", ""),
    ("Stockholm", "Sweden", ""),
    ("Oslo", "Norway", ""),
    ("Copenhagen", "Denmark", ""),
    ("Helsinki", "Finland", ""),
    ("Dublin", "Ireland", ""),
    ("Manchester", "UK", ""),
    ("Athens", "Greece", ""),
    ("Istanbul", "Turkey", ""),
    ("Dubai", "United Arab Emirates", ""),
    ("Nairobi", "Kenya", ""),
    ("Lagos", "Nigeria", ""),
    ("Casablanca", "Morocco", ""),
    ("Johannesburg", "South Africa", ""),
    ("Vancouver", "Canada", ""),
    ("Lima", "Peru", ""),
    ("Bogotá", "Colombia", ""),
    ("Santiago", "Chile", ""),
    ("Buenos Aires", "Argentina", ""),
    ("Osaka", "Japan", ""),
    ("Kyoto", "Japan", ""),
    ("Beijing", "China", ""),
    ("Jakarta", "Indonesia", ""),
    ("Manila", "Philippines", ""),
    ("Kuala Lumpur", "Malaysia", ""),
    ("Delhi", "India", ""),
    ("Kolkata", "India", ""),
    ("Karachi", "Pakistan", ""),
    ("Melbourne", "Australia", ""),
    ("Auckland", "New Zealand", ""),
    ("Kyiv", "Ukraine", ""),
)

# How a description asks for the form; {base} is the parameter's own description without its example.
FORMAT_NOTES: tuple[str, ...] = (
    "{base}, in the form 'City, ST' (the two-letter state code) for US cities and 'City, Country' elsewhere",
    "{base}, as the city and its state for US cities (e.g. {us}) "
    "or the city and its country elsewhere (e.g. {world})",
    "{base}. Write the city with its state abbreviation in the US, like {us}, and with its country "
    "outside the US, like {world}",
    "{base}: 'City, State' with the state abbreviated, or 'City, Country' outside the US",
)


def _place_params() -> dict[str, str]:
    """Function name -> its parameter that picks a city, for functions whose result does not look
    the city up (weather, forecast, hotels, restaurants; not the distance between two cities)."""
    out: dict[str, str] = {}
    for spec in load_catalogue().specs:
        if "cities" in RESULTS[spec.result].reads:
            continue
        for p in spec.params:
            if p.draw.pick == "cities":
                out[spec.name] = p.name
    return out


PLACE_PARAMS: dict[str, str] = _place_params()


def written(place: tuple[str, str, str]) -> str:
    """A place as a call writes it: "Denver, CO", "Lyon, France"."""
    return f"{place[0]}, {place[1]}"


def _said(place: tuple[str, str, str], r: random.Random) -> str:
    """How the user names it: as the call writes it, with the state written out, or the city alone."""
    city, region, state = place
    u = r.random()
    if u < 0.4:
        return city
    if state and u < 0.65:
        return f"{city}, {state}"
    return f"{city}, {region}"


def calls_a_place(conv: Conversation) -> bool:
    """Whether some call takes a city of ``PLACE_PARAMS`` (only those conversations are rewritten)."""
    return any(c.name in PLACE_PARAMS for m in conv.messages for c in m.tool_calls)


def with_places(conv: Conversation, r: random.Random) -> Conversation:
    """``conv`` with its cities as places the listed functions ask for in "City, Region" form.

    Unchanged when a city of a rewritten call also appears in another argument (a flight from the
    same city): replacing it there would change what that call means."""
    cities = sorted(
        {
            c.arguments[PLACE_PARAMS[c.name]]
            for m in conv.messages
            for c in m.tool_calls
            if c.name in PLACE_PARAMS
        }
    )
    if any(_mentions(c.arguments, cities, c.name) for m in conv.messages for c in m.tool_calls):
        return conv
    places = dict(zip(cities, r.sample(PLACES, len(cities)), strict=True))
    said = {city: _said(place, r) for city, place in places.items()}
    others = [p for p in PLACES if p not in places.values()]  # the description's examples
    us, world = r.choice([p for p in others if p[2]]), r.choice([p for p in others if not p[2]])
    note = r.choice(FORMAT_NOTES)
    tools = tuple(_described(t, note, written(us), written(world)) for t in conv.tools)
    messages = tuple(_message(m, places, said) for m in conv.messages)
    return replace(conv, messages=messages, tools=tools)


def _mentions(args: Mapping[str, Any], cities: list[str], name: str) -> bool:
    """Whether an argument other than the city of a rewritten call names one of ``cities``."""
    own = PLACE_PARAMS.get(name)
    text = json.dumps({k: v for k, v in args.items() if k != own}, ensure_ascii=False)
    return any(city in text for city in cities)


def _described(tool: dict[str, Any], note: str, us: str, world: str) -> dict[str, Any]:
    """A listed function's schema with its city parameter asking for the "City, Region" form."""
    param = PLACE_PARAMS.get(tool["name"])
    if param is None:
        return tool
    props = tool["parameters"]["properties"]
    base = re.sub(r",? e\.g\. .*$", "", props[param]["description"])
    described = {**props[param], "description": note.format(base=base, us=us, world=world)}
    parameters = {**tool["parameters"], "properties": {**props, param: described}}
    return {**tool, "parameters": parameters}


def _message(m: Message, places: Mapping[str, tuple[str, str, str]], said: Mapping[str, str]) -> Message:
    """Cities swapped for places: as said in requests, in full in calls and results, bare in answers."""
    if m.role == "user":
        return replace(m, content=_swap(m.content, said))
    if m.role == "tool":
        return replace(m, content=_swap(m.content, {c: written(p) for c, p in places.items()}))
    calls = tuple(_placed_call(c, places) for c in m.tool_calls)
    return replace(m, content=_swap(m.content, {c: p[0] for c, p in places.items()}), tool_calls=calls)


def _placed_call(call: ToolCall, places: Mapping[str, tuple[str, str, str]]) -> ToolCall:
    param = PLACE_PARAMS.get(call.name)
    if param is None:
        return call
    return replace(call, arguments={**call.arguments, param: written(places[call.arguments[param]])})


def _swap(text: str, names: Mapping[str, str]) -> str:
    """Each city name in ``text`` (as a whole word) replaced by its new name, in one pass (a new
    name may hold an old one: "Buffalo, New York")."""
    if not names:
        return text
    pattern = "|".join(re.escape(old) for old in sorted(names, key=len, reverse=True))
    return re.sub(rf"(?<!\w)(?:{pattern})(?!\w)", lambda m: names[m.group()], text)
