"""Nothing from BFCL's test files or answers is in the synthetic generator's schemas or its rows: the
function-calling model is evaluated on BFCL, so training on its functions or questions would
inflate the score. BFCL's files come from ``make fc-assets`` (CI runs it before the tests).

Names: every BFCL function name (the docs on offer, the ground truths' keys, the multi-turn
answers' calls), in full and, when its last dotted component is long and has an underscore (a
specific name, not a generic word), that component too. Texts: every user turn and every
description in a function doc (of the function, its parameters, nested ones) of at least 40
characters, whitespace normalised, searched in the rows' text (case-folded).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from hpcpipe.config.synthetic import SyntheticMix
from hpcpipe.data.function_calling.generator import LIBRARY, SCIENCE_LIBRARY
from hpcpipe.data.function_calling.glaive_rows import generate_glaive_rows
from hpcpipe.data.function_calling.places import PLACES

ROOT = Path(__file__).resolve().parents[4]
BFCL = ROOT / "data" / "external" / "bfcl"

pytestmark = pytest.mark.skipif(
    not BFCL.is_dir(), reason="no BFCL files in data/external/bfcl: run `make fc-assets`"
)

MIN_TEXT = 40  # characters: shorter user turns ("What is my first name?") are common phrases
MIN_COMPONENT = 12  # characters of a last dotted component checked on its own
PLAIN_WORD = re.compile(r"[A-Za-z][a-z]*")  # a name like "add" or "Subdomain" is a word, in any text
IDENTIFIER = re.compile(r"\w+(?:\.\w+)*")  # BFCL's names are made of word characters and dots
CALL_IN_ANSWER = re.compile(r"^\s*(\w+(?:\.\w+)*)\s*\(")  # multi-turn ground truths: "cd(folder='x')"


def _entries(path: Path) -> Iterator[dict[str, Any]]:
    """A BFCL file's entries: one JSON object per line (a single object for index files)."""
    text = path.read_text(encoding="utf-8")
    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError:
        docs = [json.loads(line) for line in text.split("\n") if line.strip()]
    yield from (doc for doc in docs if isinstance(doc, dict) and "id" in doc)


def _answer_names(truth: Any) -> Iterator[str]:
    if isinstance(truth, dict):  # {"function_name": {argument: [accepted values]}}
        yield from truth
    elif isinstance(truth, str) and (match := CALL_IN_ANSWER.match(truth)):
        yield match.group(1)
    elif isinstance(truth, list):
        for item in truth:
            yield from _answer_names(item)


def _user_texts(question: Any) -> Iterator[str]:
    for turn in question if isinstance(question, list) else ():
        for message in turn if isinstance(turn, list) else [turn]:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str) and message.get("role") == "user":
                yield content


def _descriptions(doc: Any) -> Iterator[str]:
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "description" and isinstance(value, str):
                yield value
            else:
                yield from _descriptions(value)
    elif isinstance(doc, list):
        for item in doc:
            yield from _descriptions(item)


def _normalised(text: str) -> str:
    return " ".join(text.split()).casefold()


@cache
def bfcl() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """Function name, normalised question and normalised description -> the case id of one
    entry holding it, from every file."""
    names: dict[str, str] = {}
    questions: dict[str, str] = {}
    descriptions: dict[str, str] = {}
    paths = sorted(BFCL.glob("BFCL_v4_*.json")) + sorted((BFCL / "possible_answer").glob("BFCL_v4_*.json"))
    for path in paths:
        for entry in _entries(path):
            case = f"{path.name}:{entry['id']}"
            for doc in entry.get("function") or []:
                names.setdefault(doc["name"], case)
            for name in [*_answer_names(entry.get("ground_truth")), *(entry.get("excluded_function") or [])]:
                names.setdefault(name, case)
            for text in _user_texts(entry.get("question")):
                if len(question := _normalised(text)) >= MIN_TEXT:
                    questions.setdefault(question, case)
            for text in _descriptions(entry.get("function")):
                if len(description := _normalised(text)) >= MIN_TEXT:
                    descriptions.setdefault(description, case)
    return names, questions, descriptions


def checked_forms(name: str) -> Iterator[str]:
    """The forms of a BFCL name that must not appear: the name, and a specific last component."""
    yield name
    last = name.rsplit(".", 1)[-1]
    if last != name and len(last) >= MIN_COMPONENT and "_" in last:
        yield last


@cache
def generated_text() -> str:
    """The text of the default mix's, the classic mix's and a science-heavy mix's rows (with
    places in "City, Region" form, near misses and close distractors), each turn once, whitespace
    normalised."""
    science = SyntheticMix(
        science=5,
        inline_lists=0.5,
        call_only=0.5,
        place_formats=1,
        place_functions=3,
        near_misses=0.5,
        close_distractors=0.5,
    )
    rows = (
        generate_glaive_rows(3000, 0)
        + generate_glaive_rows(2000, 0, SyntheticMix.classic())
        + generate_glaive_rows(1500, 0, science)
    )
    turns = {row["system"] for row in rows} | {turn for row in rows for turn in row["chat"].split("\n\n\n")}
    return "\n".join(" ".join(turn.split()) for turn in sorted(turns))


def identifiers(text: str) -> set[str]:
    """Every identifier in ``text``, and every run of components of a dotted one."""
    found: set[str] = set()
    for token in set(IDENTIFIER.findall(text)):
        parts = token.split(".")
        found.update(".".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1))
    return found


def test_bfcl_was_read() -> None:
    names, questions, descriptions = bfcl()
    assert len(names) > 500 and len(questions) > 500 and len(descriptions) > 500, (
        len(names),
        len(questions),
        len(descriptions),
    )


def test_no_bfcl_function_name_is_a_library_function_or_in_the_rows() -> None:
    names, _, _ = bfcl()
    specs = LIBRARY + SCIENCE_LIBRARY
    library = {spec.name for spec in specs} | {f"{spec.domain}.{spec.name}" for spec in specs}
    # The rows' identifiers hold a dotted name and each run of its components.
    assert {"OpenWeatherMap.get_current_weather", "get_current_weather"} <= identifiers(
        "call 'OpenWeatherMap.get_current_weather' now."
    )
    in_rows = identifiers(generated_text())
    leaks: dict[str, str] = {}
    for name, case in names.items():
        for form in checked_forms(name):
            if form in library:
                leaks.setdefault(form, f"{form} (a library function; {case})")
            elif not PLAIN_WORD.fullmatch(form) and form in in_rows:
                leaks.setdefault(form, f"{form} (in the rows; {case})")
    assert not leaks, f"{len(leaks)} BFCL function name(s) in the generator: " + "; ".join(
        sorted(leaks.values())
    )


WORD_START = re.compile(r"(?<=\W)\w")


def questions_in(text: str, questions: list[str]) -> set[str]:
    """The ``questions`` (or other texts) that occur in ``text``, exactly, in one pass over it.

    A question with a word start after its first character is keyed by the text from there: each
    word start of ``text`` is looked up once in a dict (much faster than searching the text once
    per question). The others (one long word) are searched in full.
    """
    width = MIN_TEXT // 2
    keyed: dict[str, list[tuple[str, int]]] = {}
    found = set()
    for question in questions:
        start = next((m.start() for m in WORD_START.finditer(question)), None)
        if start is None or start + width > len(question):
            found |= {question} if question in text else set()
        else:
            keyed.setdefault(question[start : start + width], []).append((question, start))
    for match in WORD_START.finditer(text):
        for question, start in keyed.get(text[match.start() : match.start() + width], ()):
            if match.start() >= start and text.startswith(question, match.start() - start):
                found.add(question)
    return found


def test_no_bfcl_question_or_description_is_in_the_rows() -> None:
    _, questions, descriptions = bfcl()
    texts = {**descriptions, **questions}
    ordered = sorted(texts)
    # The search finds what is there: two questions planted mid-line in other text.
    planted = f"USER: Hi! {ordered[0]} Thanks.\nASSISTANT: ({ordered[-1]})"
    assert questions_in(planted, ordered) >= {ordered[0], ordered[-1]}
    leaks = questions_in(generated_text().casefold(), ordered)
    assert not leaks, f"{len(leaks)} BFCL question(s) or description(s) in the rows: " + "; ".join(
        f"{texts[text]}: {text[:80]!r}" for text in sorted(leaks)
    )


SWEEP_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
SWEEP_CATEGORIES += ("live_simple", "live_multiple", "live_irrelevance")
SWEEP_CASES = 30  # per category: the training-mix sweep's sample (benchmarks/README.md)


def test_no_place_of_the_generator_is_named_in_the_sweeps_cases() -> None:
    """``places.PLACES`` teaches the "City, Region" form on cities BFCL's sampled cases do not name,
    so what the sweep measures there is the form, not memorised cities."""
    named: dict[str, str] = {}
    for category in SWEEP_CATEGORIES:
        for entry in list(_entries(BFCL / f"BFCL_v4_{category}.json"))[:SWEEP_CASES]:
            text = " ".join(_user_texts(entry["question"]))
            named |= {
                city: entry["id"] for city, _, _ in PLACES if re.search(rf"\b{re.escape(city)}\b", text)
            }
    assert not named, f"places named in the sweep's BFCL cases: {named}"
