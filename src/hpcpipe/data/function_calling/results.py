"""What the functions of ``schemas.json`` return, and the answers that need more than a template.

A spec names its result function (``"result": "weather"``): given the arguments, the random
generator and the pools, it returns the ``FUNCTION RESPONSE`` object. Most answers are templates
in the file, filled from the arguments and the result; a spec whose answer needs a loop or a
choice names an answer function here instead (``"answer": "forecast"``), which gets the same
fields. Each result function declares the pools it reads, so a file without them is refused on load.
The math and science functions of ``science.json`` register theirs from ``science_results.py``.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hpcpipe.data.function_calling.draws import TODAY, Pools, clock

Args = dict[str, Any]
ResultFn = Callable[[Args, random.Random, Pools], dict[str, Any]]
AnswerFn = Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class Result:
    function: ResultFn
    reads: tuple[str, ...]  # pools it looks up: schemas.json must define them


RESULTS: dict[str, Result] = {}
ANSWERS: dict[str, AnswerFn] = {}


def result_function(name: str, *reads: str) -> Callable[[ResultFn], ResultFn]:
    def register(function: ResultFn) -> ResultFn:
        RESULTS[name] = Result(function, reads)
        return function

    return register


def answer_function(name: str) -> Callable[[AnswerFn], AnswerFn]:
    def register(function: AnswerFn) -> AnswerFn:
        ANSWERS[name] = function
        return function

    return register


def join_words(items: Sequence[str], conjunction: str = "and") -> str:
    """``a, b and c``: a list as a sentence says it."""
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} {conjunction} {items[-1]}"


def _id(r: random.Random, prefix: str) -> str:
    return f"{prefix}{r.getrandbits(32):08x}"


# ------------------------------------------------------------------------------------ travel and weather


@result_function("weather", "conditions")
def _weather(a: Args, r: random.Random, pools: Pools) -> dict[str, Any]:
    units = a.get("units", "celsius")
    celsius = r.randint(-5, 34)
    temperature = celsius if units == "celsius" else round(celsius * 9 / 5 + 32)
    return {
        "city": a["city"],
        "temperature": temperature,
        "units": units,
        "condition": r.choice(pools["conditions"]),
        "humidity": r.randint(20, 95),
    }


@result_function("forecast", "conditions")
def _forecast(a: Args, r: random.Random, pools: Pools) -> dict[str, Any]:
    days = []
    for i in range(a["days"]):
        high = r.randint(5, 33)
        day = {
            "date": (TODAY + dt.timedelta(days=i)).isoformat(),
            "high": high,
            "low": high - r.randint(4, 11),
        }
        days.append({**day, "condition": r.choice(pools["conditions"])})
    out: dict[str, Any] = {"city": a["city"], "forecast": days}
    if a.get("include_hourly"):
        out["hourly_available"] = True
    return out


@answer_function("forecast")
def _forecast_answer(c: dict[str, Any]) -> str:
    days = c["forecast"]
    highs = [d["high"] for d in days]
    first = days[0]
    return (
        f"Here's the {len(days)}-day forecast for {c['city']}: highs between {min(highs)} and "
        f"{max(highs)}°C. Tomorrow starts {first['condition']} with a high of {first['high']}°C "
        f"and a low of {first['low']}°C."
    )


@result_function("flights", "airlines")
def _flights(a: Args, r: random.Random, pools: Pools) -> dict[str, Any]:
    flights = []
    for airline, code in r.sample(list(pools["airlines"].items()), r.randint(2, 3)):
        flights.append(
            {
                "airline": airline,
                "flight_number": f"{code} {r.randint(10, 2999)}",
                "departure_time": clock(r),
                "price": r.randrange(180, 1900),
            }
        )
    return {"origin": a["origin"], "destination": a["destination"], "flights": flights}


@answer_function("flights")
def _flights_answer(c: dict[str, Any]) -> str:
    cheapest = min(c["flights"], key=lambda f: f["price"])
    return (
        f"I found {len(c['flights'])} flights from {c['origin']} to {c['destination']} on "
        f"{c['departure_date']}. The cheapest is {cheapest['airline']} {cheapest['flight_number']}, "
        f"leaving at {cheapest['departure_time']} for ${cheapest['price']}."
    )


@result_function("flight_status")
def _flight_status(a: Args, r: random.Random, _pools: Pools) -> dict[str, Any]:
    return {
        "flight_number": a["flight_number"],
        "status": r.choice(("on time", "delayed by 25 minutes", "delayed by about an hour", "boarding now")),
        "gate": f"{r.choice('ABCDE')}{r.randint(1, 40)}",
        "departure_time": clock(r),
    }


@result_function("distance", "cities")
def _distance(a: Args, _r: random.Random, pools: Pools) -> dict[str, Any]:
    """Great-circle distance between the two cities' coordinates."""
    start, end = pools["cities"][a["origin"]], pools["cities"][a["destination"]]
    p1, p2 = math.radians(start["lat"]), math.radians(end["lat"])
    dl = math.radians(end["lon"] - start["lon"])
    h = math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    km = round(2 * 6371.0 * math.asin(math.sqrt(h)), 1)
    return {"distance_km": km, "distance_miles": round(km * 0.621371, 1), "mode": a.get("mode", "driving")}


@result_function("timezone_conversion", "timezones")
def _timezone(a: Args, _r: random.Random, pools: Pools) -> dict[str, Any]:
    hours, minutes = (int(x) for x in a["time"].split(":"))
    shift = pools["timezones"][a["to_timezone"]] - pools["timezones"][a["from_timezone"]]
    total = hours * 60 + minutes + round(shift * 60)
    day = "the previous day" if total < 0 else "the next day" if total >= 24 * 60 else "the same day"
    total %= 24 * 60
    return {"converted_time": f"{total // 60:02d}:{total % 60:02d}", "day": day}


@result_function("hotel_booking", "hotels")
def _hotel(a: Args, r: random.Random, pools: Pools) -> dict[str, Any]:
    cap = a.get("max_price_per_night", 400)
    return {
        "status": "confirmed",
        "hotel_name": r.choice(pools["hotels"]),
        "confirmation_number": f"HB-{r.randint(100000, 999999)}",
        "price_per_night": round(r.uniform(cap * 0.5, cap), 2),
    }


@result_function("taxi_booking", "drivers")
def _taxi(_a: Args, r: random.Random, pools: Pools) -> dict[str, Any]:
    return {
        "status": "confirmed",
        "driver_name": r.choice(pools["drivers"]),
        "eta_minutes": r.randint(3, 15),
        "fare_estimate": round(r.uniform(12, 85), 2),
    }


# ---------------------------------------------------------------------------------- money and numbers


@result_function("currency_conversion", "exchange_rates")
def _convert(a: Args, _r: random.Random, pools: Pools) -> dict[str, Any]:
    rates = pools["exchange_rates"]
    rate = rates[a["to_currency"]] / rates[a["from_currency"]]
    return {
        "converted_amount": round(a["amount"] * rate, 2),
        "from_currency": a["from_currency"],
        "to_currency": a["to_currency"],
        "exchange_rate": round(rate, 4),
    }


@result_function("unit_conversion", "units")
def _units(a: Args, _r: random.Random, pools: Pools) -> dict[str, Any]:
    factor = pools["units"][a["from_unit"]][a["to_unit"]]
    return {"converted_value": round(a["value"] * factor, 3), "unit": a["to_unit"]}


@result_function("stock_quote", "stocks")
def _stock(a: Args, r: random.Random, pools: Pools) -> dict[str, Any]:
    stock = pools["stocks"][a["symbol"]]
    return {
        "symbol": a["symbol"],
        "exchange": stock["exchange"],
        "price": round(stock["price"] * r.uniform(0.97, 1.03), 2),
        "currency": stock["currency"],
        "change_percent": round(r.uniform(-3, 3), 2),
    }


@result_function("crypto_quote", "coins", "exchange_rates")
def _crypto(a: Args, r: random.Random, pools: Pools) -> dict[str, Any]:
    currency = a.get("currency", "USD")
    price = pools["coins"][a["coin"]] * pools["exchange_rates"][currency] * r.uniform(0.95, 1.05)
    return {
        "coin": a["coin"],
        "price": round(price, 2),
        "currency": currency,
        "change_24h": round(r.uniform(-6, 6), 2),
    }


def _payment(principal: float, annual_rate: float, years: int) -> float:
    """The monthly payment of an annuity loan."""
    i, n = annual_rate / 100 / 12, years * 12
    return principal / n if i == 0 else principal * i / (1 - (1 + i) ** -n)


@result_function("loan_payment")
def _loan(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    monthly = _payment(a["principal"], a["annual_interest_rate"], a["loan_term_years"])
    total = monthly * a["loan_term_years"] * 12
    return {"monthly_payment": round(monthly, 2), "total_interest": round(total - a["principal"], 2)}


@result_function("mortgage_payment")
def _mortgage(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    loan = a["home_price"] - a["down_payment"]
    monthly = _payment(loan, a["interest_rate"], a["term_years"])
    return {"loan_amount": loan, "monthly_payment": round(monthly, 2)}


@result_function("tip")
def _tip(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    tip = round(a["bill_amount"] * a["tip_percentage"] / 100, 2)
    total = round(a["bill_amount"] + tip, 2)
    out: dict[str, Any] = {"tip_amount": tip, "total_amount": total}
    if "split_between" in a:
        out["per_person"] = round(total / a["split_between"], 2)
    return out


@answer_function("tip")
def _tip_answer(c: dict[str, Any]) -> str:
    text = (
        f"A {c['tip_percentage']}% tip on {c['bill_amount']} is {c['tip_amount']:.2f}, "
        f"so the total is {c['total_amount']:.2f}."
    )
    if "per_person" in c:
        text += f" Split between {c['split_between']} people, that's {c['per_person']:.2f} each."
    return text


@result_function("discount")
def _discount(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    savings = round(a["original_price"] * a["discount_percent"] / 100, 2)
    return {"discounted_price": round(a["original_price"] - savings, 2), "savings": savings}


@result_function("average")
def _average(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    return {"average": round(sum(a["numbers"]) / len(a["numbers"]), 2)}


@result_function("bmi")
def _bmi(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    bmi = round(a["weight_kg"] / a["height_m"] ** 2, 1)
    category = (
        "underweight"
        if bmi < 18.5
        else "normal weight"
        if bmi < 25
        else "overweight"
        if bmi < 30
        else "obese"
    )
    return {"bmi": bmi, "category": category}


@result_function("age")
def _age(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    born = dt.date.fromisoformat(a["birth_date"])
    return {"age": TODAY.year - born.year - ((TODAY.month, TODAY.day) < (born.month, born.day))}


# ---------------------------------------------------------------------------------- looking things up


@result_function("translation", "translations")
def _translation(a: Args, _r: random.Random, pools: Pools) -> dict[str, Any]:
    return {"translated_text": pools["translations"][a["text"]][a["target_language"]]}


@result_function("definition", "words")
def _definition(a: Args, _r: random.Random, pools: Pools) -> dict[str, Any]:
    return {"word": a["word"], "definition": pools["words"][a["word"]]}


@result_function("recipes")
def _recipes(a: Args, r: random.Random, _pools: Pools) -> dict[str, Any]:
    style = a.get("cuisine") or r.choice(("Easy", "One-pot", "Weeknight", "15-minute"))
    main = a["ingredients"]
    dishes = r.sample(("skillet", "salad", "curry", "pasta", "stir-fry", "tacos", "bowl"), 2)
    limit = a.get("max_prep_time", 60)
    recipes = [
        {"name": f"{style} {join_words(main[:2])} {dish}", "prep_time": r.randint(10, max(limit, 11))}
        for dish in dishes
    ]
    return {"recipes": recipes}


@answer_function("recipes")
def _recipes_answer(c: dict[str, Any]) -> str:
    first, second = c["recipes"][:2]
    return (
        f'I found a couple of recipes with {c["ingredients"]}. How about "{first["name"]}"? It takes about '
        f'{first["prep_time"]} minutes. Another option is "{second["name"]}" ({second["prep_time"]} minutes).'
    )


@result_function("nutrition", "foods")
def _nutrition(a: Args, _r: random.Random, pools: Pools) -> dict[str, Any]:
    """The pool gives each food's figures per 100 g."""
    grams = a.get("serving_grams", 100)
    food = pools["foods"][a["food"]]
    kcal, protein, carbs, fat = (food[k] * grams / 100 for k in ("kcal", "protein_g", "carbs_g", "fat_g"))
    return {
        "food": a["food"],
        "serving_grams": grams,
        "calories": round(kcal),
        "protein_g": round(protein, 1),
        "carbs_g": round(carbs, 1),
        "fat_g": round(fat, 1),
    }


@result_function("movie_details", "movies")
def _movie(a: Args, _r: random.Random, pools: Pools) -> dict[str, Any]:
    movie = pools["movies"][a["title"]]
    return {
        "title": a["title"],
        "year": movie["year"],
        "director": movie["director"],
        "genre": movie["genre"],
        "rating": movie["rating"],
    }


@result_function("movie_recommendations", "genres")
def _recommendations(a: Args, r: random.Random, pools: Pools) -> dict[str, Any]:
    titles = list(pools["genres"][a["genre"]])
    r.shuffle(titles)
    return {"movies": titles[: a.get("max_results", 3)]}


@answer_function("movie_recommendations")
def _recommendations_answer(c: dict[str, Any]) -> str:
    return f"Here are some {c['genre']} movies you might enjoy: {join_words(c['movies'])}."


@result_function("book_availability", "books")
def _book(a: Args, r: random.Random, pools: Pools) -> dict[str, Any]:
    book = pools["books"][a["query"]]
    return {
        "title": a["query"],
        "author": book["author"],
        "year": book["year"],
        "available": r.random() < 0.7,
    }


@answer_function("book_availability")
def _book_answer(c: dict[str, Any]) -> str:
    found = f"I found '{c['title']}' by {c['author']} ({c['year']}). "
    return found + ("It's available to borrow." if c["available"] else "All copies are currently on loan.")


@result_function("headlines", "news")
def _news(a: Args, r: random.Random, pools: Pools) -> dict[str, Any]:
    headlines = list(pools["news"][a["category"]])
    r.shuffle(headlines)
    return {"category": a["category"], "headlines": headlines[: a.get("max_results", 3)]}


@answer_function("headlines")
def _news_answer(c: dict[str, Any]) -> str:
    lines = "\n".join(f"{i}. {h}" for i, h in enumerate(c["headlines"], start=1))
    return f"Here are the latest {c['category']} headlines:\n{lines}"


@result_function("restaurants", "restaurants")
def _restaurants(_a: Args, r: random.Random, pools: Pools) -> dict[str, Any]:
    names = r.sample(pools["restaurants"], 3)
    return {"restaurants": [{"name": n, "rating": round(r.uniform(3.8, 4.9), 1)} for n in names]}


@answer_function("restaurants")
def _restaurants_answer(c: dict[str, Any]) -> str:
    options = join_words([f"{x['name']} (rated {x['rating']})" for x in c["restaurants"]])
    return f"Here are a few places to eat in {c['location']}: {options}. Enjoy your meal!"


@result_function("last_game", "teams")
def _score(a: Args, r: random.Random, pools: Pools) -> dict[str, Any]:
    ours, theirs = r.randint(0, 4), r.randint(0, 4)
    outcome = "won" if ours > theirs else "lost" if ours < theirs else "drew"
    opponent = r.choice([t for t in pools["teams"] if t != a["team"]])
    return {"opponent": opponent, "team_score": ours, "opponent_score": theirs, "outcome": outcome}


# ------------------------------------------------------------------------------- actions that confirm


@result_function("confirmation")
def _confirmation(_a: Args, r: random.Random, _pools: Pools) -> dict[str, Any]:
    return {"status": "success", "id": _id(r, "")}


@result_function("email_sent")
def _email_sent(_a: Args, r: random.Random, _pools: Pools) -> dict[str, Any]:
    return {"status": "sent", "message_id": _id(r, "msg-")}


@result_function("playlist_created")
def _playlist(a: Args, r: random.Random, _pools: Pools) -> dict[str, Any]:
    return {"playlist_id": _id(r, "pl_"), "name": a["name"], "track_count": len(a["songs"])}


@result_function("song_playing", "songs")
def _song(a: Args, _r: random.Random, pools: Pools) -> dict[str, Any]:
    return {"status": "playing", "title": a["title"], "artist": pools["songs"][a["title"]]}


@result_function("cart_update", "products")
def _cart(a: Args, r: random.Random, pools: Pools) -> dict[str, Any]:
    item = a["item"]
    price = pools["products"][item["product_name"]]
    subtotal = round(price * item["quantity"] + r.choice((0, 0, 12.5, 40.0)), 2)
    return {"status": "added", "cart_items": item["quantity"] + r.randint(0, 3), "cart_subtotal": subtotal}


@result_function("delivery_window")
def _delivery(_a: Args, r: random.Random, _pools: Pools) -> dict[str, Any]:
    return {"status": "scheduled", "window": r.choice(("08:00-12:00", "12:00-16:00", "16:00-20:00"))}


@result_function("password")
def _password(a: Args, r: random.Random, _pools: Pools) -> dict[str, Any]:
    chars = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ"
    chars += "23456789" if a.get("include_numbers", True) else ""
    chars += "!@#$%^&*" if a.get("include_symbols", False) else ""
    return {"password": "".join(r.choice(chars) for _ in range(a["length"]))}


@result_function("qr_code")
def _qr_code(_a: Args, r: random.Random, _pools: Pools) -> dict[str, Any]:
    return {"qr_code_url": f"https://qr.example.com/{_id(r, '')}.png"}


@result_function("workout_logged")
def _workout(a: Args, r: random.Random, _pools: Pools) -> dict[str, Any]:
    return {"status": "logged", "weekly_total_minutes": a["duration_minutes"] + r.randrange(0, 300, 5)}
