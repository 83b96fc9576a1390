"""How the generator draws argument values: the ``draw`` of each parameter in ``schemas.json``.

A draw is one of these forms; a pool is a named entry of the file's ``pools``, a list or a mapping
(a mapping's keys are what is drawn, in file order):

- ``{"pick": "cities"}``: one entry of a pool; ``{"pick": [true, false]}``: one of the values listed.
- ``{"ints": [lo, hi]}`` or ``{"ints": [lo, hi, step]}``: a whole number from lo to hi, both included.
- ``{"floats": [lo, hi, digits]}``: a uniform number from lo to hi, rounded to ``digits`` decimals.
- ``{"money": [lo, hi]}``: an amount as people type it: whole mostly, with cents sometimes.
- ``{"several": [pool, lo, hi]}``: lo to hi different entries of a pool, as a list.
- ``{"other": [pool, param]}``: an entry of a pool other than the value of the earlier ``param``.
- ``"date"``: a day (YYYY-MM-DD) within 300 days after ``TODAY``; ``"clock"``: a time HH:MM.
- ``{"derive": name}``: a function of ``DERIVES`` below, for a value that depends on others in its
  own way (the unit to convert to depends on the unit converted from, an email body on its subject).

Parameters are drawn in the order listed, so a draw can depend on values drawn before it. Each
form makes the same calls to the random generator as the code it replaced, so a seed gives the same
rows as before the library became a data file.
"""

from __future__ import annotations

import copy
import datetime as dt
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, model_validator

Pools = Mapping[str, Any]  # pool name -> list, or mapping whose keys are drawn
Gen = Callable[[random.Random, dict[str, Any]], Any]  # (rng, arguments drawn so far) -> value
DeriveFn = Callable[[random.Random, dict[str, Any], Pools], Any]

TODAY = dt.date(2025, 6, 1)  # "now" for ages and dates: fixed, so rows never depend on the clock
WORDS = ("date", "clock")  # the draws written as a bare string


class Draw(BaseModel):
    """One parameter's draw: exactly one of the forms in the module docstring."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pick: StrictStr | list[Any] | None = None
    ints: list[StrictInt] | None = Field(None, min_length=2, max_length=3)
    floats: tuple[StrictFloat, StrictFloat, StrictInt] | None = None
    money: tuple[StrictInt, StrictInt] | None = None
    several: tuple[StrictStr, StrictInt, StrictInt] | None = None
    other: tuple[StrictStr, StrictStr] | None = None
    derive: StrictStr | None = None
    word: Literal["date", "clock"] | None = None  # written as the bare string "date" or "clock"

    @model_validator(mode="before")
    @classmethod
    def _bare_word(cls, data: Any) -> Any:
        if isinstance(data, str):
            if data not in WORDS:
                raise ValueError(f"unknown draw {data!r}: the bare words are {' and '.join(WORDS)}")
            return {"word": data}
        return data

    @model_validator(mode="after")
    def _one_known_form(self) -> Draw:
        forms = [name for name in type(self).model_fields if getattr(self, name) is not None]
        if len(forms) != 1:
            raise ValueError(f"a draw has exactly one form, this one has {' and '.join(forms) or 'none'}")
        if self.pick == []:
            raise ValueError("pick: list at least one value")
        if self.derive is not None and self.derive not in DERIVES:
            raise ValueError(f"unknown derive function {self.derive!r} (known: {', '.join(DERIVES)})")
        low_high = self.ints or self.floats or self.money or (self.several and self.several[1:])
        if low_high and low_high[0] > low_high[1]:
            raise ValueError(f"the range {low_high[0]}..{low_high[1]} is empty")
        return self

    def pools_read(self) -> list[str]:
        """The pools this draw needs, its derive function's included."""
        if isinstance(self.pick, str):
            return [self.pick]
        if self.several is not None:
            return [self.several[0]]
        if self.other is not None:
            return [self.other[0]]
        return list(DERIVES[self.derive].reads) if self.derive is not None else []

    def earlier_params(self) -> list[str]:
        """The parameters that must be drawn (always: required) before this one."""
        if self.other is not None:
            return [self.other[1]]
        return list(DERIVES[self.derive].uses) if self.derive is not None else []


def draw_function(draw: Draw, pools: Pools) -> Gen:
    """``draw`` as a function of (rng, arguments so far); pools are looked up once, here."""
    if draw.pick is not None:
        values = tuple(pools[draw.pick] if isinstance(draw.pick, str) else draw.pick)
        return lambda r, _a: _fresh(r.choice(values))
    if draw.ints is not None:
        lo, hi, step = draw.ints[0], draw.ints[1], draw.ints[2] if len(draw.ints) == 3 else 1
        return lambda r, _a: r.randrange(lo, hi + 1, step)
    if draw.floats is not None:
        low, high, digits = draw.floats
        return lambda r, _a: round(r.uniform(low, high), digits)
    if draw.money is not None:
        return _money(*draw.money)
    if draw.several is not None:
        name, fewest, most = draw.several
        entries = tuple(pools[name])
        return lambda r, _a: r.sample(list(entries), r.randint(fewest, most))
    if draw.other is not None:
        name, than = draw.other
        entries = tuple(pools[name])
        return lambda r, a: r.choice([v for v in entries if v != a[than]])
    if draw.derive is not None:
        derive = DERIVES[draw.derive].function
        return lambda r, a: derive(r, a, pools)
    return _date if draw.word == "date" else _clock


def _fresh(value: Any) -> Any:
    """A drawn list or mapping is a copy: arguments never share an object with the pool."""
    return copy.deepcopy(value) if isinstance(value, dict | list) else value


def _money(lo: int, hi: int) -> Gen:
    return lambda r, _a: r.randrange(lo, hi + 1) if r.random() < 0.6 else round(r.uniform(lo, hi), 2)


def _date(r: random.Random, _a: dict[str, Any]) -> str:
    return (TODAY + dt.timedelta(days=r.randint(1, 300))).isoformat()


def _clock(r: random.Random, _a: dict[str, Any]) -> str:
    return clock(r)


def clock(r: random.Random) -> str:
    """A time of day as people say it: 06:00 to 21:45, on the quarter hour."""
    return f"{r.randint(6, 21):02d}:{r.choice((0, 15, 30, 45)):02d}"


# ------------------------------------------------------------------------------------ derive functions


@dataclass(frozen=True)
class Derive:
    function: DeriveFn
    reads: tuple[str, ...]  # pools it looks up: schemas.json must define them
    uses: tuple[str, ...]  # arguments it reads: the spec must draw them first, always


DERIVES: dict[str, Derive] = {}


def _derive(
    name: str, reads: tuple[str, ...] = (), uses: tuple[str, ...] = ()
) -> Callable[[DeriveFn], DeriveFn]:
    def register(function: DeriveFn) -> DeriveFn:
        DERIVES[name] = Derive(function, reads, uses)
        return function

    return register


@_derive("to_unit", reads=("units",), uses=("from_unit",))
def _to_unit(r: random.Random, a: dict[str, Any], pools: Pools) -> Any:
    return r.choice(list(pools["units"][a["from_unit"]]))


@_derive("email_body", reads=("emails",), uses=("subject",))
def _email_body(_r: random.Random, a: dict[str, Any], pools: Pools) -> Any:
    return pools["emails"][a["subject"]]


@_derive("cc", reads=("people",), uses=("recipient",))
def _cc(r: random.Random, a: dict[str, Any], pools: Pools) -> Any:
    """One or two people to copy, never the recipient."""
    return r.sample([p for p in pools["people"] if p != a["recipient"]], r.randint(1, 2))


@_derive("target_language", reads=("translations",), uses=("text",))
def _target_language(r: random.Random, a: dict[str, Any], pools: Pools) -> Any:
    """A language the text has a translation into, so the result can give it."""
    return r.choice(tuple(pools["translations"][a["text"]]))


@_derive("down_payment", uses=("home_price",))
def _down_payment(r: random.Random, a: dict[str, Any], _pools: Pools) -> Any:
    return round(a["home_price"] * r.choice((0.05, 0.1, 0.15, 0.2, 0.25)))


@_derive("stock_exchange", reads=("stocks",), uses=("symbol",))
def _stock_exchange(_r: random.Random, a: dict[str, Any], pools: Pools) -> Any:
    return pools["stocks"][a["symbol"]]["exchange"]


@_derive("movie_year", reads=("movies",), uses=("title",))
def _movie_year(_r: random.Random, a: dict[str, Any], pools: Pools) -> Any:
    return pools["movies"][a["title"]]["year"]


@_derive("song_artist", reads=("songs",), uses=("title",))
def _song_artist(_r: random.Random, a: dict[str, Any], pools: Pools) -> Any:
    return pools["songs"][a["title"]]


@_derive("book_author", reads=("books",), uses=("query",))
def _book_author(_r: random.Random, a: dict[str, Any], pools: Pools) -> Any:
    return pools["books"][a["query"]]["author"]


@_derive("check_out", uses=("check_in",))
def _check_out(r: random.Random, a: dict[str, Any], _pools: Pools) -> Any:
    """One to seven nights after check-in."""
    return (dt.date.fromisoformat(a["check_in"]) + dt.timedelta(days=r.randint(1, 7))).isoformat()


@_derive("guests")
def _guests(r: random.Random, _a: dict[str, Any], _pools: Pools) -> Any:
    return {"adults": r.randint(1, 4), "children": r.randint(0, 2)}


@_derive("cart_item", reads=("products",))
def _cart_item(r: random.Random, _a: dict[str, Any], pools: Pools) -> Any:
    return {"product_name": r.choice(tuple(pools["products"])), "quantity": r.randint(1, 4)}


@_derive("order_id")
def _order_id(r: random.Random, _a: dict[str, Any], _pools: Pools) -> Any:
    return f"ORD-{r.randint(10000, 99999)}"


@_derive("numbers")
def _numbers(r: random.Random, _a: dict[str, Any], _pools: Pools) -> Any:
    """Three to six numbers, whole mostly (as people list them), some with one decimal."""
    return [
        r.randint(1, 99) if r.random() < 0.7 else round(r.uniform(1, 99), 1) for _ in range(r.randint(3, 6))
    ]


@_derive("birth_date")
def _birth_date(r: random.Random, _a: dict[str, Any], _pools: Pools) -> Any:
    """A birthday from 1950 to about 2010."""
    return (dt.date(1950, 1, 1) + dt.timedelta(days=r.randint(0, 22000))).isoformat()
