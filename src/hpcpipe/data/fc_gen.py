"""Synthetic Glaive v2 function-calling rows: realistic, varied, and the same for the same seed.

Offline runs and tests need function-calling data without downloading a data set. This writes rows
in the exact Glaive v2 format that ``function_calling.parse_glaive`` reads (so the real data set can
replace them), from a library of function schemas in many domains.

Conversation shapes, mixed by seed: a single call (call -> ``FUNCTION RESPONSE`` -> an answer that
uses the result), parallel calls, two requests in one chat, a clarifying question before the call,
a polite refusal when no listed function fits, and general chat under the "no access to external
functions" system prompt. Each row lists 1-4 functions, the right one(s) among distractors from
other domains (so exactly one function fits each request). User requests state every argument
value in words, through several templates per function, so a model can learn to extract them.

Parallel calls: Glaive v2 has one call per assistant turn, so hpcpipe writes two ``<functioncall>``
lines in one assistant turn, followed by one ``FUNCTION RESPONSE`` turn per call, in call order;
``parse_glaive`` returns them as the ``tool_calls`` of one message.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcpipe.data.conversation import Conversation, Message, ToolCall
from hpcpipe.data.function_calling import (
    GLAIVE_CALL,
    GLAIVE_END,
    GLAIVE_NO_FUNCTIONS,
    GLAIVE_WITH_FUNCTIONS,
)

Gen = Callable[[random.Random, dict[str, Any]], Any]  # (rng, arguments drawn so far) -> value
ResultFn = Callable[[dict[str, Any], random.Random], dict[str, Any]]
AnswerFn = Callable[[dict[str, Any]], str]

SHAPES = ("single", "parallel", "multi_turn", "clarify", "refusal", "no_access")
_SHAPE_WEIGHTS = (30, 12, 14, 10, 17, 17)
_TODAY = dt.date(2025, 6, 1)  # "now" for ages and dates: fixed, so rows never depend on the clock


@dataclass(frozen=True)
class _Param:
    name: str
    schema: dict[str, Any]
    gen: Gen
    required: bool = True
    # How a request states an optional value: a template, or one sentence per value (bools, enums).
    phrase: str | Mapping[Any, str] = ""


@dataclass(frozen=True, eq=False)  # identity: one library entry is one function
class _Spec:
    name: str
    description: str
    domain: str  # distractors and refusals come from other domains, so one function fits a request
    capability: str  # verb phrase: "I can help you <capability>" / "I can't <capability>"
    params: tuple[_Param, ...]
    requests: tuple[str, ...]  # every template names every required parameter
    result: ResultFn
    answers: tuple[str | AnswerFn, ...]

    def schema(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": {
                "type": "object",
                "properties": {p.name: p.schema for p in self.params},
                "required": [p.name for p in self.params if p.required],
            },
        }


# ---------------------------------------------------------------------------------- schema and value helpers


def _string(desc: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": desc, **extra}


def _integer(desc: str, **extra: Any) -> dict[str, Any]:
    return {"type": "integer", "description": desc, **extra}


def _number(desc: str, **extra: Any) -> dict[str, Any]:
    return {"type": "number", "description": desc, **extra}


def _boolean(desc: str) -> dict[str, Any]:
    return {"type": "boolean", "description": desc}


def _enum(desc: str, values: Sequence[Any], kind: str = "string") -> dict[str, Any]:
    return {"type": kind, "enum": list(values), "description": desc}


def _array(desc: str, items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items, "description": desc}


def _object(desc: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "description": desc, "properties": properties, "required": list(properties)}


def _one(values: Sequence[Any]) -> Gen:
    return lambda r, _a: r.choice(values)


def _ints(lo: int, hi: int, step: int = 1) -> Gen:
    return lambda r, _a: r.randrange(lo, hi + 1, step)


def _floats(lo: float, hi: float, digits: int = 2) -> Gen:
    return lambda r, _a: round(r.uniform(lo, hi), digits)


def _money(lo: int, hi: int) -> Gen:
    """Amounts as people type them: whole numbers mostly, cents sometimes."""
    return lambda r, _a: r.randrange(lo, hi + 1) if r.random() < 0.6 else round(r.uniform(lo, hi), 2)


def _several(values: Sequence[Any], lo: int, hi: int) -> Gen:
    return lambda r, _a: r.sample(list(values), r.randint(lo, hi))


def _other(values: Sequence[Any], than: str) -> Gen:
    """A value different from argument ``than`` (a trip has two different ends)."""
    return lambda r, a: r.choice([v for v in values if v != a[than]])


def _date(r: random.Random, _a: dict[str, Any] | None = None) -> str:
    return (_TODAY + dt.timedelta(days=r.randint(1, 300))).isoformat()


def _clock(r: random.Random, _a: dict[str, Any] | None = None) -> str:
    return f"{r.randint(6, 21):02d}:{r.choice((0, 15, 30, 45)):02d}"


def _join(items: Sequence[str], conjunction: str = "and") -> str:
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} {conjunction} {items[-1]}"


def _display(value: Any) -> Any:
    """An argument as a request states it: lists in words; numbers and objects stay for ``format``."""
    if isinstance(value, list):
        return _join([str(v) for v in value])
    return value


def _id(r: random.Random, prefix: str) -> str:
    return f"{prefix}{r.getrandbits(32):08x}"


# ---------------------------------------------------------------------------------------------- value pools

# Unicode and apostrophes on purpose: a parser or tokenizer that mangles them shows up in tests.
_COORDS: dict[str, tuple[float, float]] = {
    "New York": (40.7128, -74.0060),
    "London": (51.5074, -0.1278),
    "Paris": (48.8566, 2.3522),
    "Zürich": (47.3769, 8.5417),
    "São Paulo": (-23.5505, -46.6333),
    "東京": (35.6762, 139.6503),
    "Kraków": (50.0647, 19.9450),
    "Montréal": (45.5019, -73.5674),
    "Reykjavík": (64.1466, -21.9426),
    "Berlin": (52.5200, 13.4050),
    "Sydney": (-33.8688, 151.2093),
    "Mumbai": (19.0760, 72.8777),
    "Cape Town": (-33.9249, 18.4241),
    "Mexico City": (19.4326, -99.1332),
    "Seoul": (37.5665, 126.9780),
    "Chicago": (41.8781, -87.6298),
    "Madrid": (40.4168, -3.7038),
    "Cairo": (30.0444, 31.2357),
}
_CITIES = tuple(_COORDS)
_AIRPORTS = (
    "Chicago O'Hare",
    "New York JFK",
    "London Heathrow",
    "Zürich",
    "São Paulo Guarulhos",
    "東京 Haneda",
    "Paris Charles de Gaulle",
    "Montréal-Trudeau",
    "Reykjavík Keflavík",
    "Dallas/Fort Worth",
    "Kraków",
    "Sydney",
)
_AIRLINES = (("Swiss", "LX"), ("United", "UA"), ("Air France", "AF"), ("ANA", "NH"), ("Lufthansa", "LH"))
_FLIGHT_NUMBERS = ("LX 17", "UA 1549", "AF 1280", "NH 106", "LH 400", "BA 283", "LA 8084", "AA 2314")
_RATES = {
    "USD": 1.0,
    "EUR": 0.92,
    "GBP": 0.79,
    "JPY": 151.3,
    "CHF": 0.88,
    "BRL": 5.05,
    "CAD": 1.36,
    "INR": 83.2,
    "AUD": 1.52,
    "MXN": 17.1,
}
_UNITS = {
    ("kilometers", "miles"): 0.621371,
    ("miles", "kilometers"): 1.609344,
    ("kilograms", "pounds"): 2.204623,
    ("pounds", "kilograms"): 0.453592,
    ("liters", "gallons"): 0.264172,
    ("feet", "meters"): 0.3048,
    ("inches", "centimeters"): 2.54,
    ("ounces", "grams"): 28.349523,
}
_STOCKS = {
    "AAPL": ("NASDAQ", "USD", 189.5),
    "MSFT": ("NASDAQ", "USD", 415.2),
    "TSLA": ("NASDAQ", "USD", 176.8),
    "JPM": ("NYSE", "USD", 198.4),
    "KO": ("NYSE", "USD", 61.2),
    "HSBA": ("LSE", "GBP", 6.45),
    "7203": ("TSE", "JPY", 3350.0),
    "NESN": ("SIX", "CHF", 91.7),
}
_PEOPLE = (
    "siobhan.obrien@example.com",
    "liam.o'connor@example.ie",
    "jose.garcia@example.es",
    "zoe.mueller@example.de",
    "tanaka.yuki@example.jp",
    "priya.patel@example.in",
)
_EMAILS = (
    ("Tomorrow's meeting", "Hi, just confirming we're still on for 10am. Let me know if anything's changed."),
    ("Lunch on Friday?", "Are you free for lunch on Friday? I'd love to catch up at Café Müller."),
    ("Quarterly report", "Please find the Q3 numbers attached. Don't hesitate to reach out with questions."),
    ("Résumé", "I've attached my résumé for the open position. Thanks for considering me!"),
    ("Trip to 東京", "The flights are booked — we land at Haneda on the 12th. Can't wait!"),
)
_EVENTS = (
    "Team stand-up",
    "Dentist appointment",
    "Lunch with Zoë",
    "Mom's birthday dinner",
    "Quarterly review",
    "Yoga class",
)
_PLACES = ("Café Müller", "Room 4B", "O'Malley's Pub", "Central Park", "Rua Augusta 1500, São Paulo")
_INGREDIENTS = (
    "chicken",
    "crème fraîche",
    "jalapeño",
    "tofu",
    "basil",
    "tomatoes",
    "garlic",
    "mozzarella",
    "chickpeas",
    "spinach",
    "salmon",
    "mushrooms",
)
_CUISINES = ("Italian", "Mexican", "Japanese", "Indian", "French", "Thai", "Greek", "Brazilian")
_TRANSLATIONS = {
    "I'd like a coffee, please.": {
        "French": "Je voudrais un café, s'il vous plaît.",
        "Spanish": "Quisiera un café, por favor.",
        "German": "Ich hätte gern einen Kaffee, bitte.",
        "Japanese": "コーヒーをお願いします。",
    },
    "Where's the nearest train station?": {
        "French": "Où est la gare la plus proche ?",
        "Spanish": "¿Dónde está la estación de tren más cercana?",
        "German": "Wo ist der nächste Bahnhof?",
        "Japanese": "最寄りの駅はどこですか？",
    },
    "Thank you for your help!": {
        "French": "Merci pour votre aide !",
        "Spanish": "¡Gracias por tu ayuda!",
        "German": "Danke für Ihre Hilfe!",
        "Japanese": "手伝ってくれてありがとう！",
    },
    "Don't forget your umbrella.": {
        "French": "N'oublie pas ton parapluie.",
        "Spanish": "No olvides tu paraguas.",
        "German": "Vergiss deinen Regenschirm nicht.",
        "Japanese": "傘を忘れないでね。",
    },
    "It's a beautiful day, isn't it?": {
        "French": "C'est une belle journée, n'est-ce pas ?",
        "Spanish": "Hace un día precioso, ¿verdad?",
        "German": "Es ist ein schöner Tag, nicht wahr?",
        "Japanese": "いい天気ですね。",
    },
}
_MOVIES = {
    "Schindler's List": (1993, "Steven Spielberg", "historical drama", 9.0),
    "Ocean's Eleven": (2001, "Steven Soderbergh", "heist comedy", 7.8),
    "Amélie": (2001, "Jean-Pierre Jeunet", "romantic comedy", 8.3),
    "千と千尋の神隠し": (2001, "宮崎駿", "animated fantasy", 8.6),
    "Pan's Labyrinth": (2006, "Guillermo del Toro", "dark fantasy", 8.2),
    "Léon: The Professional": (1994, "Luc Besson", "action thriller", 8.5),
    "Parasite": (2019, "Bong Joon-ho", "thriller", 8.5),
    "Y tu mamá también": (2001, "Alfonso Cuarón", "road drama", 7.6),
    "Howl's Moving Castle": (2004, "Hayao Miyazaki", "animated fantasy", 8.2),
    "Inception": (2010, "Christopher Nolan", "science fiction", 8.8),
}
_GENRES = {
    "action": ("Mad Max: Fury Road", "Die Hard", "John Wick", "Crouching Tiger, Hidden Dragon"),
    "comedy": ("Groundhog Day", "Amélie", "The Grand Budapest Hotel", "Monty Python and the Holy Grail"),
    "drama": ("Schindler's List", "The Shawshank Redemption", "Roma", "Cinema Paradiso"),
    "horror": ("Get Out", "The Shining", "Hereditary", "Rosemary's Baby"),
    "science fiction": ("Blade Runner 2049", "Arrival", "Inception", "Ex Machina"),
    "animation": ("千と千尋の神隠し", "Howl's Moving Castle", "Coco", "WALL·E"),
    "romance": ("Before Sunrise", "In the Mood for Love", "Pride & Prejudice", "When Harry Met Sally..."),
    "thriller": ("Parasite", "Se7en", "Gone Girl", "Oldboy"),
}
_SONGS = {
    "Don't Stop Me Now": "Queen",
    "Sweet Child o' Mine": "Guns N' Roses",
    "Livin' on a Prayer": "Bon Jovi",
    "Ain't No Mountain High Enough": "Marvin Gaye",
    "La Vie en rose": "Édith Piaf",
    "99 Luftballons": "Nena",
    "Despacito": "Luis Fonsi",
    "上を向いて歩こう": "坂本九",
    "Can't Help Falling in Love": "Elvis Presley",
    "Hotel California": "Eagles",
}
_PLAYLISTS = ("Road Trip '25", "Sunday Chill", "Café Mornings", "Workout Mix", "Lo-fi für die Arbeit")
_NEWS = {
    "business": (
        "Central banks signal a pause in rate hikes",
        "Retail sales rise for a third straight month",
        "Chipmaker's shares jump after strong earnings",
    ),
    "technology": (
        "New smartphone chips promise longer battery life",
        "Open-source AI models gain ground in enterprises",
        "Researchers unveil a faster solid-state battery",
    ),
    "sports": (
        "Underdogs reach the cup final after extra time",
        "Marathon record falls in Berlin",
        "Star striker signs a four-year deal",
    ),
    "science": (
        "Telescope captures the most distant galaxy yet",
        "Study links sleep quality to memory",
        "New species of frog found in the Andes",
    ),
    "health": (
        "Walking 7,000 steps a day linked to longer life",
        "Flu season starts earlier than expected",
        "New guidelines on children's screen time",
    ),
    "entertainment": (
        "Festival line-up announced with a surprise headliner",
        "Animated film breaks opening-weekend records",
        "Beloved sitcom returns for a reunion special",
    ),
}
_COUNTRIES = ("the United States", "Brazil", "Japan", "Germany", "Switzerland", "Côte d'Ivoire")
_PRODUCTS = {
    "men's running shoes": 89.99,
    "crème brûlée torch": 24.5,
    "children's raincoat": 34.0,
    "noise-cancelling headphones": 199.0,
    "espresso cups": 18.75,
    "yoga mat": 29.9,
}
_ADDRESSES = (
    {"street": "Bahnhofstrasse 12", "city": "Zürich", "postal_code": "8001"},
    {"street": "Rua Augusta 1500", "city": "São Paulo", "postal_code": "01304-001"},
    {"street": "221B Baker Street", "city": "London", "postal_code": "NW1 6XE"},
    {"street": "ul. Floriańska 3", "city": "Kraków", "postal_code": "31-019"},
    {"street": "1-1 Marunouchi", "city": "東京", "postal_code": "100-0005"},
    {"street": "12 O'Connell Street", "city": "Dublin", "postal_code": "D01 F5P2"},
)
_HOTELS = (
    "Hôtel Le Petit Palais",
    "The O'Neill Inn",
    "Grand Hotel Zürichberg",
    "ホテル・サクラ",
    "Pousada do Sol",
)
_RESTAURANTS = (
    "Luigi's Trattoria",
    "Café de Flore",
    "Sushi Saitō",
    "O'Reilly's Grill",
    "Churrascaria Boi Preto",
    "Zum Löwen",
    "Taquería El Güero",
)
_WORDS = {
    "serendipity": "the occurrence of events by chance in a happy or beneficial way",
    "schadenfreude": "pleasure derived from another person's misfortune",
    "ephemeral": "lasting for a very short time",
    "naïve": "showing a lack of experience, wisdom or judgement",
    "saudade": "a deep, nostalgic longing for someone or something that is absent",
    "ubiquitous": "present, appearing or found everywhere",
}
_QR_DATA = (
    "https://example.com/menü",
    "https://example.org/events/o'hare-meetup",
    "WIFI:S:Café Müller;T:WPA;P:kaffee123;;",
    "Meet me at Zürich HB, platform 7",
)
_PICKUPS = (
    "Zürich HB",
    "Chicago O'Hare Terminal 3",
    "Hotel Adlon, Berlin",
    "Gare de Lyon",
    "新宿駅 (Shinjuku Station)",
    "Avenida Paulista 1578",
)
_DRIVERS = ("Mehmet", "Siobhan", "João", "Yuki", "Priya", "Luca")
_BOOKS = {
    "Harry Potter and the Philosopher's Stone": ("J. K. Rowling", 1997),
    "One Hundred Years of Solitude": ("Gabriel García Márquez", 1967),
    "ノルウェイの森": ("村上春樹", 1987),
    "The Handmaid's Tale": ("Margaret Atwood", 1985),
    "Les Misérables": ("Victor Hugo", 1862),
    "Charlotte's Web": ("E. B. White", 1952),
}
_TASKS = (
    "call Grandma",
    "pick up the dry cleaning",
    "renew my passport",
    "pay Siobhan O'Brien back",
    "water the plants",
    "book a table at Lily's Café",
)
_TODOS = (
    "Finish the Q3 report",
    "Buy groceries for Sunday's brunch",
    "Email Zoë about the trip",
    "Fix the garage door",
    "Read chapter 4 of 'Dune'",
)
_FOODS = {  # per 100 g: kcal, protein, carbs, fat
    "avocado": (160, 2.0, 8.5, 14.7),
    "banana": (89, 1.1, 22.8, 0.3),
    "chicken breast": (165, 31.0, 0.0, 3.6),
    "crème brûlée": (290, 4.5, 25.0, 19.0),
    "tofu": (76, 8.0, 1.9, 4.8),
    "croissant": (406, 8.2, 45.8, 21.0),
}
_TEAMS = ("FC Zürich", "São Paulo FC", "Real Madrid", "Bayern München", "Chicago Bulls", "Yomiuri Giants")
_COINS = {"bitcoin": 67000.0, "ethereum": 3500.0, "solana": 150.0, "cardano": 0.45}
_TIMEZONES = {
    "America/Los_Angeles": -8.0,
    "America/New_York": -5.0,
    "America/Sao_Paulo": -3.0,
    "Europe/London": 0.0,
    "Europe/Zurich": 1.0,
    "Asia/Kolkata": 5.5,
    "Asia/Tokyo": 9.0,
    "Australia/Sydney": 10.0,
}
_CONDITIONS = ("sunny", "partly cloudy", "light rain", "overcast", "snowing", "windy", "foggy")


# --------------------------------------------------------------------------------------- results and answers


def _weather(a: dict[str, Any], r: random.Random) -> dict[str, Any]:
    units = a.get("units", "celsius")
    celsius = r.randint(-5, 34)
    temperature = celsius if units == "celsius" else round(celsius * 9 / 5 + 32)
    return {
        "city": a["city"],
        "temperature": temperature,
        "units": units,
        "condition": r.choice(_CONDITIONS),
        "humidity": r.randint(20, 95),
    }


def _forecast(a: dict[str, Any], r: random.Random) -> dict[str, Any]:
    days = []
    for i in range(a["days"]):
        high = r.randint(5, 33)
        day = {
            "date": (_TODAY + dt.timedelta(days=i)).isoformat(),
            "high": high,
            "low": high - r.randint(4, 11),
        }
        days.append({**day, "condition": r.choice(_CONDITIONS)})
    out: dict[str, Any] = {"city": a["city"], "forecast": days}
    if a.get("include_hourly"):
        out["hourly_available"] = True
    return out


def _forecast_answer(c: dict[str, Any]) -> str:
    days = c["forecast"]
    highs = [d["high"] for d in days]
    first = days[0]
    return (
        f"Here's the {len(days)}-day forecast for {c['city']}: highs between {min(highs)} and "
        f"{max(highs)}°C. Tomorrow starts {first['condition']} with a high of {first['high']}°C "
        f"and a low of {first['low']}°C."
    )


def _flights(a: dict[str, Any], r: random.Random) -> dict[str, Any]:
    flights = []
    for airline, code in r.sample(_AIRLINES, r.randint(2, 3)):
        flights.append(
            {
                "airline": airline,
                "flight_number": f"{code} {r.randint(10, 2999)}",
                "departure_time": _clock(r),
                "price": r.randrange(180, 1900),
            }
        )
    return {"origin": a["origin"], "destination": a["destination"], "flights": flights}


def _flights_answer(c: dict[str, Any]) -> str:
    cheapest = min(c["flights"], key=lambda f: f["price"])
    return (
        f"I found {len(c['flights'])} flights from {c['origin']} to {c['destination']} on "
        f"{c['departure_date']}. The cheapest is {cheapest['airline']} {cheapest['flight_number']}, "
        f"leaving at {cheapest['departure_time']} for ${cheapest['price']}."
    )


def _convert(a: dict[str, Any], _r: random.Random) -> dict[str, Any]:
    rate = _RATES[a["to_currency"]] / _RATES[a["from_currency"]]
    return {
        "converted_amount": round(a["amount"] * rate, 2),
        "from_currency": a["from_currency"],
        "to_currency": a["to_currency"],
        "exchange_rate": round(rate, 4),
    }


def _units(a: dict[str, Any], _r: random.Random) -> dict[str, Any]:
    factor = _UNITS[(a["from_unit"], a["to_unit"])]
    return {"converted_value": round(a["value"] * factor, 3), "unit": a["to_unit"]}


def _stock(a: dict[str, Any], r: random.Random) -> dict[str, Any]:
    exchange, currency, base = _STOCKS[a["symbol"]]
    return {
        "symbol": a["symbol"],
        "exchange": exchange,
        "price": round(base * r.uniform(0.97, 1.03), 2),
        "currency": currency,
        "change_percent": round(r.uniform(-3, 3), 2),
    }


def _recipes(a: dict[str, Any], r: random.Random) -> dict[str, Any]:
    style = a.get("cuisine") or r.choice(("Easy", "One-pot", "Weeknight", "15-minute"))
    main = a["ingredients"]
    dishes = r.sample(("skillet", "salad", "curry", "pasta", "stir-fry", "tacos", "bowl"), 2)
    limit = a.get("max_prep_time", 60)
    recipes = [
        {"name": f"{style} {_join(main[:2])} {dish}", "prep_time": r.randint(10, max(limit, 11))}
        for dish in dishes
    ]
    return {"recipes": recipes}


def _recipes_answer(c: dict[str, Any]) -> str:
    first, second = c["recipes"][:2]
    return (
        f'I found a couple of recipes with {c["ingredients"]}. How about "{first["name"]}"? It takes about '
        f'{first["prep_time"]} minutes. Another option is "{second["name"]}" ({second["prep_time"]} minutes).'
    )


def _distance(a: dict[str, Any], _r: random.Random) -> dict[str, Any]:
    (lat1, lon1), (lat2, lon2) = (_COORDS[a["origin"]], _COORDS[a["destination"]])
    p1, p2, dl = math.radians(lat1), math.radians(lat2), math.radians(lon2 - lon1)
    h = math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    km = round(2 * 6371.0 * math.asin(math.sqrt(h)), 1)
    return {"distance_km": km, "distance_miles": round(km * 0.621371, 1), "mode": a.get("mode", "driving")}


def _movie(a: dict[str, Any], _r: random.Random) -> dict[str, Any]:
    year, director, genre, rating = _MOVIES[a["title"]]
    return {"title": a["title"], "year": year, "director": director, "genre": genre, "rating": rating}


def _recommendations(a: dict[str, Any], r: random.Random) -> dict[str, Any]:
    titles = list(_GENRES[a["genre"]])
    r.shuffle(titles)
    return {"movies": titles[: a.get("max_results", 3)]}


def _payment(principal: float, annual_rate: float, years: int) -> float:
    i, n = annual_rate / 100 / 12, years * 12
    return principal / n if i == 0 else principal * i / (1 - (1 + i) ** -n)


def _loan(a: dict[str, Any], _r: random.Random) -> dict[str, Any]:
    monthly = _payment(a["principal"], a["annual_interest_rate"], a["loan_term_years"])
    total = monthly * a["loan_term_years"] * 12
    return {"monthly_payment": round(monthly, 2), "total_interest": round(total - a["principal"], 2)}


def _mortgage(a: dict[str, Any], _r: random.Random) -> dict[str, Any]:
    loan = a["home_price"] - a["down_payment"]
    monthly = _payment(loan, a["interest_rate"], a["term_years"])
    return {"loan_amount": loan, "monthly_payment": round(monthly, 2)}


def _bmi(a: dict[str, Any], _r: random.Random) -> dict[str, Any]:
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


def _tip(a: dict[str, Any], _r: random.Random) -> dict[str, Any]:
    tip = round(a["bill_amount"] * a["tip_percentage"] / 100, 2)
    total = round(a["bill_amount"] + tip, 2)
    out: dict[str, Any] = {"tip_amount": tip, "total_amount": total}
    if "split_between" in a:
        out["per_person"] = round(total / a["split_between"], 2)
    return out


def _tip_answer(c: dict[str, Any]) -> str:
    text = (
        f"A {c['tip_percentage']}% tip on {c['bill_amount']} is {c['tip_amount']:.2f}, "
        f"so the total is {c['total_amount']:.2f}."
    )
    if "per_person" in c:
        text += f" Split between {c['split_between']} people, that's {c['per_person']:.2f} each."
    return text


def _timezone(a: dict[str, Any], _r: random.Random) -> dict[str, Any]:
    hours, minutes = (int(x) for x in a["time"].split(":"))
    shift = _TIMEZONES[a["to_timezone"]] - _TIMEZONES[a["from_timezone"]]
    total = hours * 60 + minutes + round(shift * 60)
    day = "the previous day" if total < 0 else "the next day" if total >= 24 * 60 else "the same day"
    total %= 24 * 60
    return {"converted_time": f"{total // 60:02d}:{total % 60:02d}", "day": day}


def _news(a: dict[str, Any], r: random.Random) -> dict[str, Any]:
    headlines = list(_NEWS[a["category"]])
    r.shuffle(headlines)
    return {"category": a["category"], "headlines": headlines[: a.get("max_results", 3)]}


def _news_answer(c: dict[str, Any]) -> str:
    lines = "\n".join(f"{i}. {h}" for i, h in enumerate(c["headlines"], start=1))
    return f"Here are the latest {c['category']} headlines:\n{lines}"


def _cart(a: dict[str, Any], r: random.Random) -> dict[str, Any]:
    item = a["item"]
    subtotal = round(_PRODUCTS[item["product_name"]] * item["quantity"] + r.choice((0, 0, 12.5, 40.0)), 2)
    return {"status": "added", "cart_items": item["quantity"] + r.randint(0, 3), "cart_subtotal": subtotal}


def _hotel(a: dict[str, Any], r: random.Random) -> dict[str, Any]:
    cap = a.get("max_price_per_night", 400)
    return {
        "status": "confirmed",
        "hotel_name": r.choice(_HOTELS),
        "confirmation_number": f"HB-{r.randint(100000, 999999)}",
        "price_per_night": round(r.uniform(cap * 0.5, cap), 2),
    }


def _restaurants(a: dict[str, Any], r: random.Random) -> dict[str, Any]:
    names = r.sample(_RESTAURANTS, 3)
    return {"restaurants": [{"name": n, "rating": round(r.uniform(3.8, 4.9), 1)} for n in names]}


def _restaurants_answer(c: dict[str, Any]) -> str:
    options = _join([f"{x['name']} (rated {x['rating']})" for x in c["restaurants"]])
    return f"Here are a few places to eat in {c['location']}: {options}. Enjoy your meal!"


def _password(a: dict[str, Any], r: random.Random) -> dict[str, Any]:
    chars = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ"
    chars += "23456789" if a.get("include_numbers", True) else ""
    chars += "!@#$%^&*" if a.get("include_symbols", False) else ""
    return {"password": "".join(r.choice(chars) for _ in range(a["length"]))}


def _age(a: dict[str, Any], _r: random.Random) -> dict[str, Any]:
    born = dt.date.fromisoformat(a["birth_date"])
    return {"age": _TODAY.year - born.year - ((_TODAY.month, _TODAY.day) < (born.month, born.day))}


def _discount(a: dict[str, Any], _r: random.Random) -> dict[str, Any]:
    savings = round(a["original_price"] * a["discount_percent"] / 100, 2)
    return {"discounted_price": round(a["original_price"] - savings, 2), "savings": savings}


def _taxi(a: dict[str, Any], r: random.Random) -> dict[str, Any]:
    return {
        "status": "confirmed",
        "driver_name": r.choice(_DRIVERS),
        "eta_minutes": r.randint(3, 15),
        "fare_estimate": round(r.uniform(12, 85), 2),
    }


def _nutrition(a: dict[str, Any], _r: random.Random) -> dict[str, Any]:
    grams = a.get("serving_grams", 100)
    kcal, protein, carbs, fat = (v * grams / 100 for v in _FOODS[a["food"]])
    return {
        "food": a["food"],
        "serving_grams": grams,
        "calories": round(kcal),
        "protein_g": round(protein, 1),
        "carbs_g": round(carbs, 1),
        "fat_g": round(fat, 1),
    }


def _score(a: dict[str, Any], r: random.Random) -> dict[str, Any]:
    ours, theirs = r.randint(0, 4), r.randint(0, 4)
    outcome = "won" if ours > theirs else "lost" if ours < theirs else "drew"
    opponent = r.choice([t for t in _TEAMS if t != a["team"]])
    return {"opponent": opponent, "team_score": ours, "opponent_score": theirs, "outcome": outcome}


def _crypto(a: dict[str, Any], r: random.Random) -> dict[str, Any]:
    currency = a.get("currency", "USD")
    price = _COINS[a["coin"]] * _RATES[currency] * r.uniform(0.95, 1.05)
    return {
        "coin": a["coin"],
        "price": round(price, 2),
        "currency": currency,
        "change_24h": round(r.uniform(-6, 6), 2),
    }


def _status(**fields: Any) -> ResultFn:
    """A confirmation result: fixed fields plus a fresh id."""
    return lambda _a, r: {"status": "success", **fields, "id": _id(r, "")}


# ---------------------------------------------------------------------------------------------- the library


def _library() -> tuple[_Spec, ...]:
    return (
        _Spec(
            "get_current_weather",
            "Get the current weather conditions for a city",
            "weather",
            "check the weather",
            (
                _Param("city", _string("The city to get the weather for, e.g. Zürich"), _one(_CITIES)),
                _Param(
                    "units",
                    _enum("The temperature units", ("celsius", "fahrenheit")),
                    _one(("celsius", "fahrenheit")),
                    required=False,
                    phrase={
                        "celsius": "Please give me the temperature in Celsius.",
                        "fahrenheit": "I'd like the temperature in Fahrenheit.",
                    },
                ),
            ),
            (
                "What's the weather like in {city} right now?",
                "Can you check the current weather in {city}?",
                "I'm heading out in {city} — how's the weather at the moment?",
                "Tell me the current weather conditions in {city}, please.",
            ),
            _weather,
            (
                "Right now it's {temperature} degrees ({units}) and {condition} in {city}, with "
                "{humidity}% humidity.",
                "The current weather in {city} is {condition}, {temperature} degrees {units}, humidity "
                "{humidity}%.",
            ),
        ),
        _Spec(
            "get_weather_forecast",
            "Get a multi-day weather forecast for a city",
            "weather",
            "get a weather forecast",
            (
                _Param("city", _string("The city to forecast"), _one(_CITIES)),
                _Param("days", _integer("The number of days to forecast", minimum=1, maximum=7), _ints(2, 7)),
                _Param(
                    "include_hourly",
                    _boolean("Whether to include hourly detail"),
                    _one((True, False)),
                    required=False,
                    phrase={True: "Include the hourly breakdown too.", False: "No need for hourly details."},
                ),
            ),
            (
                "What's the forecast for {city} for the next {days} days?",
                "Can you get me a {days}-day weather forecast for {city}?",
                "I'm travelling to {city}. What will the weather be like over the next {days} days?",
            ),
            _forecast,
            (_forecast_answer,),
        ),
        _Spec(
            "search_flights",
            "Search for flights between two airports on a date",
            "flights",
            "search for flights",
            (
                _Param("origin", _string("The departure city or airport"), _one(_AIRPORTS)),
                _Param("destination", _string("The arrival city or airport"), _other(_AIRPORTS, "origin")),
                _Param("departure_date", _string("The departure date in YYYY-MM-DD format"), _date),
                _Param(
                    "passengers",
                    _integer("The number of passengers", minimum=1),
                    _ints(1, 5),
                    required=False,
                    phrase="There will be {passengers} passengers.",
                ),
                _Param(
                    "cabin_class",
                    _enum("The cabin class", ("economy", "premium_economy", "business", "first")),
                    _one(("economy", "premium_economy", "business", "first")),
                    required=False,
                    phrase={
                        "economy": "Economy is fine.",
                        "premium_economy": "I'd prefer premium economy.",
                        "business": "Business class, please.",
                        "first": "I'd like to fly first class.",
                    },
                ),
            ),
            (
                "Find me flights from {origin} to {destination} on {departure_date}.",
                "I need to fly from {origin} to {destination} on {departure_date}. What are my options?",
                "Can you search for flights leaving {origin} for {destination} on {departure_date}?",
            ),
            _flights,
            (_flights_answer,),
        ),
        _Spec(
            "get_flight_status",
            "Get the live status of a flight",
            "flights",
            "check flight statuses",
            (
                _Param("flight_number", _string("The flight number, e.g. LX 17"), _one(_FLIGHT_NUMBERS)),
                _Param(
                    "date",
                    _string("The flight date in YYYY-MM-DD format; today if omitted"),
                    _date,
                    required=False,
                    phrase="It's the flight on {date}.",
                ),
            ),
            (
                "What's the status of flight {flight_number}?",
                "Is flight {flight_number} on time?",
                "Can you check whether {flight_number} has been delayed?",
            ),
            lambda a, r: {
                "flight_number": a["flight_number"],
                "status": r.choice(
                    ("on time", "delayed by 25 minutes", "delayed by about an hour", "boarding now")
                ),
                "gate": f"{r.choice('ABCDE')}{r.randint(1, 40)}",
                "departure_time": _clock(r),
            },
            (
                "Flight {flight_number} is {status}. It departs from gate {gate} at {departure_time}.",
                "{flight_number} is {status}; departure is at {departure_time} from gate {gate}.",
            ),
        ),
        _Spec(
            "convert_currency",
            "Convert an amount from one currency to another",
            "currency",
            "convert currencies",
            (
                _Param("amount", _number("The amount to convert"), _money(5, 5000)),
                _Param(
                    "from_currency",
                    _string("The currency code to convert from, e.g. USD"),
                    _one(tuple(_RATES)),
                ),
                _Param(
                    "to_currency",
                    _string("The currency code to convert to, e.g. EUR"),
                    _other(tuple(_RATES), "from_currency"),
                ),
            ),
            (
                "Can you convert {amount} {from_currency} to {to_currency}?",
                "I have {amount} {from_currency}. How much is that in {to_currency}?",
                "How much is {amount} {from_currency} in {to_currency}?",
                "Hi, I need to convert {amount} {from_currency} into {to_currency}. Can you help me with "
                "that?",
            ),
            _convert,
            (
                "{amount} {from_currency} is approximately {converted_amount:,.2f} {to_currency} at a rate "
                "of {exchange_rate}.",
                "Sure! {amount} {from_currency} converts to about {converted_amount:,.2f} {to_currency}.",
            ),
        ),
        _Spec(
            "convert_units",
            "Convert a measurement from one unit to another",
            "units",
            "convert units of measurement",
            (
                _Param("value", _number("The value to convert"), _floats(0.5, 500, 1)),
                _Param(
                    "from_unit",
                    _string("The unit to convert from, e.g. kilometers"),
                    _one(tuple(sorted({f for f, _ in _UNITS}))),
                ),
                _Param(
                    "to_unit",
                    _string("The unit to convert to, e.g. miles"),
                    lambda r, a: r.choice([t for f, t in _UNITS if f == a["from_unit"]]),
                ),
            ),
            (
                "How many {to_unit} is {value} {from_unit}?",
                "Convert {value} {from_unit} to {to_unit}, please.",
                "Could you tell me what {value} {from_unit} is in {to_unit}?",
            ),
            _units,
            (
                "{value} {from_unit} is about {converted_value} {to_unit}.",
                "That's {converted_value} {to_unit}.",
            ),
        ),
        _Spec(
            "create_calendar_event",
            "Create an event in the user's calendar",
            "calendar",
            "add events to your calendar",
            (
                _Param("title", _string("The title of the event"), _one(_EVENTS)),
                _Param("date", _string("The date of the event in YYYY-MM-DD format"), _date),
                _Param("start_time", _string("The start time in HH:MM (24-hour) format"), _clock),
                _Param(
                    "location",
                    _string("Where the event takes place"),
                    _one(_PLACES),
                    required=False,
                    phrase="It's at {location}.",
                ),
                _Param(
                    "attendees",
                    _array("Email addresses of people to invite", {"type": "string"}),
                    _several(_PEOPLE, 1, 3),
                    required=False,
                    phrase="Invite {attendees}.",
                ),
            ),
            (
                "Please add '{title}' to my calendar on {date} at {start_time}.",
                "Can you schedule an event called {title} for {date}, starting at {start_time}?",
                "Create a calendar event: {title}, on {date} at {start_time}.",
            ),
            _status(),
            (
                "Done! '{title}' is on your calendar for {date} at {start_time}.",
                "I've added {title} to your calendar on {date}, starting at {start_time}.",
            ),
        ),
        _Spec(
            "send_email",
            "Send an email to a recipient",
            "email",
            "send emails",
            (
                _Param("recipient", _string("The email address of the recipient"), _one(_PEOPLE)),
                _Param("subject", _string("The subject line"), lambda r, _a: r.choice(_EMAILS)[0]),
                _Param(
                    "body",
                    _string("The body of the email"),
                    lambda r, a: next(b for s, b in _EMAILS if s == a["subject"]),
                ),
                _Param(
                    "cc",
                    _array("The email addresses to copy", {"type": "string"}),
                    lambda r, a: r.sample([p for p in _PEOPLE if p != a["recipient"]], r.randint(1, 2)),
                    required=False,
                    phrase="Please cc {cc}.",
                ),
            ),
            (
                "Send an email to {recipient} with the subject '{subject}' saying: {body}",
                "Can you email {recipient}? Subject: {subject}. Message: {body}",
                'Please write to {recipient} — the subject is "{subject}" and the message is "{body}"',
            ),
            lambda _a, r: {"status": "sent", "message_id": _id(r, "msg-")},
            (
                "Your email to {recipient} with the subject '{subject}' has been sent.",
                'Done — the email "{subject}" is on its way to {recipient}.',
            ),
        ),
        _Spec(
            "get_stock_price",
            "Get the latest price of a stock",
            "stocks",
            "look up stock prices",
            (
                _Param("symbol", _string("The ticker symbol, e.g. AAPL"), _one(tuple(_STOCKS))),
                _Param(
                    "exchange",
                    _enum("The stock exchange", ("NASDAQ", "NYSE", "LSE", "TSE", "SIX")),
                    lambda _r, a: _STOCKS[a["symbol"]][0],
                    required=False,
                    phrase="It's listed on {exchange}.",
                ),
            ),
            (
                "What's the current price of {symbol} stock?",
                "Can you tell me how {symbol} is trading right now?",
                "Get me the latest stock price for {symbol}.",
            ),
            _stock,
            (
                "{symbol} is trading at {price} {currency} on {exchange}, {change_percent:+.2f}% today.",
                "The latest price for {symbol} is {price} {currency} ({change_percent:+.2f}% on the day).",
            ),
        ),
        _Spec(
            "search_recipes",
            "Search for recipes that use the given ingredients",
            "recipes",
            "find recipes",
            (
                _Param(
                    "ingredients",
                    _array("The ingredients to cook with", {"type": "string"}),
                    _several(_INGREDIENTS, 2, 3),
                ),
                _Param(
                    "cuisine",
                    _string("The preferred cuisine"),
                    _one(_CUISINES),
                    required=False,
                    phrase="I'm in the mood for {cuisine} food.",
                ),
                _Param(
                    "max_prep_time",
                    _integer("The maximum preparation time in minutes"),
                    _ints(15, 60, 5),
                    required=False,
                    phrase="It should take no more than {max_prep_time} minutes.",
                ),
            ),
            (
                "I have {ingredients}. What can I cook with them?",
                "Can you find me a recipe that uses {ingredients}?",
                "Search for recipes with {ingredients}, please.",
            ),
            _recipes,
            (_recipes_answer,),
        ),
        _Spec(
            "translate_text",
            "Translate text into another language",
            "translation",
            "translate text",
            (
                _Param("text", _string("The text to translate"), _one(tuple(_TRANSLATIONS))),
                _Param(
                    "target_language",
                    _string("The language to translate into"),
                    lambda r, a: r.choice(tuple(_TRANSLATIONS[a["text"]])),
                ),
                _Param(
                    "source_language",
                    _string("The language of the text; detected if omitted"),
                    _one(("English",)),
                    required=False,
                    phrase="The text is in {source_language}.",
                ),
            ),
            (
                'Translate "{text}" into {target_language}.',
                'How do I say "{text}" in {target_language}?',
                "Can you translate this to {target_language} for me: {text}",
            ),
            lambda a, _r: {"translated_text": _TRANSLATIONS[a["text"]][a["target_language"]]},
            (
                'In {target_language}, "{text}" is: {translated_text}',
                "Here's the translation: {translated_text}",
            ),
        ),
        _Spec(
            "calculate_distance",
            "Calculate the distance between two places",
            "maps",
            "calculate distances between places",
            (
                _Param("origin", _string("The starting location"), _one(_CITIES)),
                _Param("destination", _string("The destination"), _other(_CITIES, "origin")),
                _Param(
                    "mode",
                    _enum("The mode of travel", ("driving", "walking", "bicycling", "transit")),
                    _one(("driving", "walking", "bicycling", "transit")),
                    required=False,
                    phrase={
                        "driving": "I'll be driving.",
                        "walking": "Assume I'm walking.",
                        "bicycling": "I'm going bicycling.",
                        "transit": "I'll take transit.",
                    },
                ),
            ),
            (
                "How far is it from {origin} to {destination}?",
                "What's the distance between {origin} and {destination}?",
                "Can you calculate the distance from {origin} to {destination}?",
            ),
            _distance,
            (
                "The distance between {origin} and {destination} is about {distance_km:,} km "
                "({distance_miles:,} miles).",
                "{origin} to {destination} is roughly {distance_km:,} kilometres.",
            ),
        ),
        _Spec(
            "search_movies",
            "Look up details of a movie by its title",
            "movies",
            "look up movies",
            (
                _Param("title", _string("The title of the movie"), _one(tuple(_MOVIES))),
                _Param(
                    "year",
                    _integer("The release year, to tell remakes apart"),
                    lambda _r, a: _MOVIES[a["title"]][0],
                    required=False,
                    phrase="The one from {year}.",
                ),
            ),
            (
                "Can you find details about the movie '{title}'?",
                "Tell me about the film {title}.",
                "I'm looking for information on '{title}'.",
            ),
            _movie,
            (
                "'{title}' ({year}) is a {genre} film directed by {director}, rated {rating}/10.",
                "{title} came out in {year}. It's a {genre} by {director} with a rating of {rating}.",
            ),
        ),
        _Spec(
            "get_movie_recommendations",
            "Recommend movies of a genre",
            "movies",
            "recommend movies",
            (
                _Param("genre", _enum("The movie genre", tuple(_GENRES)), _one(tuple(_GENRES))),
                _Param(
                    "max_results",
                    _integer("The maximum number of movies to return"),
                    _ints(2, 4),
                    required=False,
                    phrase="Give me {max_results} suggestions.",
                ),
            ),
            (
                "Can you recommend some {genre} movies?",
                "I'm in the mood for a {genre} film. Any suggestions?",
                "Suggest a few good {genre} movies for tonight.",
            ),
            _recommendations,
            (lambda c: f"Here are some {c['genre']} movies you might enjoy: {_join(c['movies'])}.",),
        ),
        _Spec(
            "calculate_loan_payment",
            "Calculate the monthly payment of a loan",
            "loans",
            "calculate loan payments",
            (
                _Param("principal", _number("The loan amount"), _ints(5000, 100000, 500)),
                _Param(
                    "annual_interest_rate",
                    _number("The annual interest rate in percent"),
                    _floats(2.5, 9.5, 1),
                ),
                _Param("loan_term_years", _integer("The loan term in years"), _ints(1, 10)),
            ),
            (
                "I want to take out a loan of {principal} at {annual_interest_rate}% interest for "
                "{loan_term_years} years. What would my monthly payment be?",
                "Calculate the monthly payment on a {principal} loan, {annual_interest_rate}% annual "
                "interest, {loan_term_years}-year term.",
                "Hi, can you help me with my loan payments? The amount is {principal}, the rate is "
                "{annual_interest_rate}% and the term is {loan_term_years} years.",
            ),
            _loan,
            (
                "Your monthly payment would be about {monthly_payment:,.2f}, with {total_interest:,.2f} "
                "paid in interest overall.",
                "With those terms you'd pay roughly {monthly_payment:,.2f} per month.",
            ),
        ),
        _Spec(
            "calculate_mortgage",
            "Calculate the monthly mortgage payment for a home purchase",
            "loans",
            "estimate mortgage payments",
            (
                _Param("home_price", _number("The price of the home"), _ints(150000, 1200000, 5000)),
                _Param(
                    "down_payment",
                    _number("The down payment amount"),
                    lambda r, a: round(a["home_price"] * r.choice((0.05, 0.1, 0.15, 0.2, 0.25))),
                ),
                _Param("interest_rate", _number("The annual interest rate in percent"), _floats(3.0, 7.5, 2)),
                _Param(
                    "term_years",
                    _enum("The mortgage term in years", (15, 20, 30), "integer"),
                    _one((15, 20, 30)),
                ),
            ),
            (
                "I'm buying a home for {home_price} with {down_payment} down. At {interest_rate}% over "
                "{term_years} years, what's my monthly mortgage payment?",
                "What would the mortgage payment be on a {home_price} house, {down_payment} down payment, "
                "{interest_rate}% interest, {term_years}-year term?",
                "Can you calculate my mortgage? Price {home_price}, down payment {down_payment}, rate "
                "{interest_rate}%, {term_years} years.",
            ),
            _mortgage,
            (
                "You'd borrow {loan_amount:,} and pay about {monthly_payment:,.2f} per month over "
                "{term_years} years.",
            ),
        ),
        _Spec(
            "calculate_bmi",
            "Calculate the body mass index from weight and height",
            "health",
            "calculate your BMI",
            (
                _Param("weight_kg", _number("The weight in kilograms"), _floats(45, 120, 1)),
                _Param("height_m", _number("The height in meters"), _floats(1.5, 2.0, 2)),
            ),
            (
                "I weigh {weight_kg} kg and I'm {height_m} m tall. What's my BMI?",
                "Can you calculate my BMI? Weight {weight_kg} kg, height {height_m} meters.",
                "My height is {height_m} m and my weight is {weight_kg} kg — what's my body mass index?",
            ),
            _bmi,
            (
                "Your BMI is {bmi}, which falls in the {category} range.",
                "With those numbers your body mass index is {bmi} ({category}).",
            ),
        ),
        _Spec(
            "calculate_tip",
            "Calculate the tip and total for a bill",
            "tips",
            "calculate tips",
            (
                _Param("bill_amount", _number("The total bill amount"), _money(15, 300)),
                _Param("tip_percentage", _number("The tip percentage"), _one((10, 12.5, 15, 18, 20, 25))),
                _Param(
                    "split_between",
                    _integer("The number of people splitting the bill"),
                    _ints(2, 6),
                    required=False,
                    phrase="We're splitting it between {split_between} people.",
                ),
            ),
            (
                "My bill is {bill_amount} and I want to leave a {tip_percentage}% tip. How much is that?",
                "Calculate a {tip_percentage}% tip on a bill of {bill_amount}.",
                "What's a {tip_percentage} percent tip on {bill_amount}?",
            ),
            _tip,
            (_tip_answer,),
        ),
        _Spec(
            "convert_timezone",
            "Convert a time of day from one time zone to another",
            "time",
            "convert times between time zones",
            (
                _Param("time", _string("The time in HH:MM (24-hour) format"), _clock),
                _Param(
                    "from_timezone", _string("The IANA time zone of the given time"), _one(tuple(_TIMEZONES))
                ),
                _Param(
                    "to_timezone",
                    _string("The IANA time zone to convert to"),
                    _other(tuple(_TIMEZONES), "from_timezone"),
                ),
            ),
            (
                "What time is {time} {from_timezone} in {to_timezone}?",
                "If it's {time} in {from_timezone}, what time is it in {to_timezone}?",
                "Convert {time} from {from_timezone} to {to_timezone}.",
            ),
            _timezone,
            ("{time} in {from_timezone} is {converted_time} in {to_timezone} ({day}).",),
        ),
        _Spec(
            "create_reminder",
            "Create a reminder at a date and time",
            "reminders",
            "set reminders",
            (
                _Param("task", _string("The thing to be reminded of"), _one(_TASKS)),
                _Param("date", _string("The date in YYYY-MM-DD format"), _date),
                _Param("time", _string("The time in HH:MM (24-hour) format"), _clock),
                _Param(
                    "repeat",
                    _enum("How often the reminder repeats", ("daily", "weekly", "monthly")),
                    _one(("daily", "weekly", "monthly")),
                    required=False,
                    phrase="Make it repeat {repeat}.",
                ),
            ),
            (
                "Remind me to {task} on {date} at {time}.",
                "Set a reminder for {date} at {time}: {task}.",
                "Can you create a reminder to {task} at {time} on {date}?",
            ),
            _status(),
            (
                "Okay, I'll remind you to {task} on {date} at {time}.",
                "Reminder set: {task}, {date} at {time}.",
            ),
        ),
        _Spec(
            "create_playlist",
            "Create a music playlist with the given songs",
            "music",
            "manage music",
            (
                _Param("name", _string("The name of the playlist"), _one(_PLAYLISTS)),
                _Param(
                    "songs",
                    _array("The song titles to add", {"type": "string"}),
                    _several(tuple(_SONGS), 2, 4),
                ),
                _Param(
                    "is_public",
                    _boolean("Whether other people can see the playlist"),
                    _one((True, False)),
                    required=False,
                    phrase={True: "Make it public.", False: "Keep it private."},
                ),
            ),
            (
                "Create a playlist called '{name}' with {songs}.",
                "Can you make me a new playlist named {name}? Add {songs}.",
                "I'd like a playlist '{name}' containing {songs}.",
            ),
            lambda a, r: {"playlist_id": _id(r, "pl_"), "name": a["name"], "track_count": len(a["songs"])},
            (
                "Your playlist '{name}' is ready with {track_count} songs.",
                "Done! '{name}' now has {track_count} tracks.",
            ),
        ),
        _Spec(
            "play_song",
            "Play a song on the user's speaker",
            "music",
            "play music",
            (
                _Param("title", _string("The title of the song"), _one(tuple(_SONGS))),
                _Param(
                    "artist",
                    _string("The artist, to pick the right version"),
                    lambda _r, a: _SONGS[a["title"]],
                    required=False,
                    phrase="It's by {artist}.",
                ),
            ),
            ("Play '{title}'.", "Can you put on {title} for me?", 'I want to listen to "{title}".'),
            lambda a, _r: {"status": "playing", "title": a["title"], "artist": _SONGS[a["title"]]},
            ("Now playing '{title}' by {artist}. Enjoy!", 'Here comes "{title}" by {artist}.'),
        ),
        _Spec(
            "get_news_headlines",
            "Get the latest news headlines in a category",
            "news",
            "get news headlines",
            (
                _Param("category", _enum("The news category", tuple(_NEWS)), _one(tuple(_NEWS))),
                _Param(
                    "country",
                    _string("The country to get news from"),
                    _one(_COUNTRIES),
                    required=False,
                    phrase="Focus on news from {country}.",
                ),
                _Param(
                    "max_results",
                    _integer("The maximum number of headlines"),
                    _ints(2, 3),
                    required=False,
                    phrase="Just the top {max_results}, please.",
                ),
            ),
            (
                "What are the latest {category} headlines?",
                "Can you get me today's top {category} news?",
                "I'd like to catch up on {category} news. What's happening?",
            ),
            _news,
            (_news_answer,),
        ),
        _Spec(
            "add_to_cart",
            "Add a product to the shopping cart",
            "shopping",
            "manage your shopping cart",
            (
                _Param(
                    "item",
                    _object(
                        "The item to add",
                        {
                            "product_name": _string("The product name"),
                            "quantity": _integer("How many to add", minimum=1),
                        },
                    ),
                    lambda r, _a: {"product_name": r.choice(tuple(_PRODUCTS)), "quantity": r.randint(1, 4)},
                ),
                _Param(
                    "gift_wrap",
                    _boolean("Whether to gift-wrap the item"),
                    _one((True, False)),
                    required=False,
                    phrase={True: "Please gift-wrap it.", False: "No gift wrap needed."},
                ),
            ),
            (
                "Add {item[quantity]} × {item[product_name]} to my cart.",
                "Please put {item[quantity]} of the {item[product_name]} in my shopping cart.",
                "I'd like to buy {item[quantity]} {item[product_name]} — add them to the cart.",
            ),
            _cart,
            (
                "I've added {item[quantity]} × {item[product_name]} to your cart. Your subtotal is now "
                "{cart_subtotal:.2f}.",
            ),
        ),
        _Spec(
            "schedule_delivery",
            "Schedule the delivery of an order to an address",
            "shopping",
            "schedule deliveries",
            (
                _Param(
                    "order_id", _string("The order number"), lambda r, _a: f"ORD-{r.randint(10000, 99999)}"
                ),
                _Param(
                    "address",
                    _object(
                        "The delivery address",
                        {
                            "street": _string("The street and number"),
                            "city": _string("The city"),
                            "postal_code": _string("The postal code"),
                        },
                    ),
                    lambda r, _a: dict(r.choice(_ADDRESSES)),
                ),
                _Param(
                    "delivery_date",
                    _string("The preferred delivery date in YYYY-MM-DD format"),
                    _date,
                    required=False,
                    phrase="Deliver it on {delivery_date}.",
                ),
            ),
            (
                "Please deliver order {order_id} to {address[street]}, {address[postal_code]} "
                "{address[city]}.",
                "Can you schedule delivery of {order_id} to {address[street]} in {address[city]} "
                "({address[postal_code]})?",
                "Ship {order_id} to {address[street]}, {address[city]}, postal code {address[postal_code]}.",
            ),
            lambda _a, r: {
                "status": "scheduled",
                "window": r.choice(("08:00-12:00", "12:00-16:00", "16:00-20:00")),
            },
            ("Order {order_id} will be delivered to {address[street]}, {address[city]} between {window}.",),
        ),
        _Spec(
            "book_hotel",
            "Book a hotel room",
            "hotels",
            "book hotels",
            (
                _Param("city", _string("The city to stay in"), _one(_CITIES)),
                _Param("check_in", _string("The check-in date in YYYY-MM-DD format"), _date),
                _Param(
                    "check_out",
                    _string("The check-out date in YYYY-MM-DD format"),
                    lambda r, a: (
                        dt.date.fromisoformat(a["check_in"]) + dt.timedelta(days=r.randint(1, 7))
                    ).isoformat(),
                ),
                _Param(
                    "guests",
                    _object(
                        "The number of guests",
                        {
                            "adults": _integer("Adults", minimum=1),
                            "children": _integer("Children", minimum=0),
                        },
                    ),
                    lambda r, _a: {"adults": r.randint(1, 4), "children": r.randint(0, 2)},
                ),
                _Param(
                    "max_price_per_night",
                    _number("The highest acceptable price per night"),
                    _ints(80, 450, 10),
                    required=False,
                    phrase="My budget is {max_price_per_night} per night.",
                ),
            ),
            (
                "Book a hotel in {city} from {check_in} to {check_out} for {guests[adults]} adults and "
                "{guests[children]} children.",
                "I need a room in {city}, checking in {check_in} and out {check_out}. We're "
                "{guests[adults]} adults and {guests[children]} kids.",
                "Can you find and book a hotel in {city} for {guests[adults]} adults and "
                "{guests[children]} children, {check_in} to {check_out}?",
            ),
            _hotel,
            (
                "You're booked at {hotel_name} in {city} from {check_in} to {check_out}. Your confirmation "
                "number is {confirmation_number}.",
                "Done! {hotel_name} is confirmed at {price_per_night:.2f} per night (confirmation "
                "{confirmation_number}).",
            ),
        ),
        _Spec(
            "find_restaurants",
            "Find restaurants near a location",
            "restaurants",
            "find restaurants",
            (
                _Param("location", _string("The city or neighbourhood"), _one(_CITIES)),
                _Param(
                    "cuisine",
                    _string("The type of food"),
                    _one(_CUISINES),
                    required=False,
                    phrase="I feel like {cuisine} food.",
                ),
                _Param(
                    "price_range",
                    _enum("The price range", ("$", "$$", "$$$")),
                    _one(("$", "$$", "$$$")),
                    required=False,
                    phrase="Price range {price_range}, please.",
                ),
                _Param(
                    "open_now",
                    _boolean("Only restaurants open right now"),
                    _one((True, False)),
                    required=False,
                    phrase={True: "It has to be open now.", False: "It doesn't have to be open right now."},
                ),
            ),
            (
                "Can you find restaurants in {location}?",
                "I'm hungry — where can I eat in {location}?",
                "Find me a good place to eat in {location}.",
            ),
            _restaurants,
            (_restaurants_answer,),
        ),
        _Spec(
            "get_definition",
            "Get the dictionary definition of a word",
            "dictionary",
            "look up word definitions",
            (_Param("word", _string("The word to define"), _one(tuple(_WORDS))),),
            (
                "What does '{word}' mean?",
                "Can you define the word {word}?",
                "Look up the definition of '{word}' for me.",
            ),
            lambda a, _r: {"word": a["word"], "definition": _WORDS[a["word"]]},
            ("'{word}' means {definition}.", "The definition of {word} is: {definition}."),
        ),
        _Spec(
            "calculate_average",
            "Calculate the average of a list of numbers",
            "math",
            "do calculations",
            (
                _Param(
                    "numbers",
                    _array("The numbers to average", {"type": "number"}),
                    lambda r, _a: [
                        r.randint(1, 99) if r.random() < 0.7 else round(r.uniform(1, 99), 1)
                        for _ in range(r.randint(3, 6))
                    ],
                ),
            ),
            (
                "What's the average of {numbers}?",
                "Calculate the mean of these numbers: {numbers}.",
                "Can you average {numbers} for me?",
            ),
            lambda a, _r: {"average": round(sum(a["numbers"]) / len(a["numbers"]), 2)},
            ("The average of {numbers} is {average}.", "The mean is {average}."),
        ),
        _Spec(
            "generate_password",
            "Generate a random password",
            "security",
            "generate passwords",
            (
                _Param("length", _integer("The length of the password", minimum=8), _ints(8, 32)),
                _Param(
                    "include_symbols",
                    _boolean("Whether to include symbols"),
                    _one((True, False)),
                    required=False,
                    phrase={True: "Include symbols.", False: "No symbols, please."},
                ),
                _Param(
                    "include_numbers",
                    _boolean("Whether to include digits"),
                    _one((True, False)),
                    required=False,
                    phrase={True: "It should have numbers in it.", False: "Don't use any numbers."},
                ),
            ),
            (
                "Generate a random password that's {length} characters long.",
                "I need a new password with {length} characters.",
                "Can you create a secure password of length {length}?",
            ),
            _password,
            ("Here's your new password: {password}. Keep it somewhere safe!",),
        ),
        _Spec(
            "generate_qr_code",
            "Generate a QR code for a piece of text or a URL",
            "utilities",
            "generate QR codes",
            (
                _Param("data", _string("The text or URL to encode"), _one(_QR_DATA)),
                _Param(
                    "size",
                    _integer("The width of the image in pixels"),
                    _ints(100, 600, 50),
                    required=False,
                    phrase="Make it {size} pixels wide.",
                ),
            ),
            (
                "Create a QR code for {data}.",
                "Can you generate a QR code that encodes {data}?",
                "I need a QR code with this content: {data}",
            ),
            lambda _a, r: {"qr_code_url": f"https://qr.example.com/{_id(r, '')}.png"},
            ("Here's your QR code: {qr_code_url}",),
        ),
        _Spec(
            "calculate_age",
            "Calculate a person's age from their birth date",
            "dates",
            "calculate ages",
            (
                _Param(
                    "birth_date",
                    _string("The birth date in YYYY-MM-DD format"),
                    lambda r, _a: (dt.date(1950, 1, 1) + dt.timedelta(days=r.randint(0, 22000))).isoformat(),
                ),
            ),
            (
                "I was born on {birth_date}. How old am I?",
                "Calculate my age — my birthday is {birth_date}.",
                "If someone was born on {birth_date}, how old are they today?",
            ),
            _age,
            ("Someone born on {birth_date} is {age} years old.", "You are {age} years old."),
        ),
        _Spec(
            "calculate_discount",
            "Calculate the price after a percentage discount",
            "discounts",
            "calculate discounts",
            (
                _Param("original_price", _number("The original price"), _money(10, 500)),
                _Param(
                    "discount_percent", _number("The discount in percent"), _one((10, 15, 20, 25, 30, 40, 50))
                ),
            ),
            (
                "A jacket costs {original_price} and it's {discount_percent}% off. What's the final price?",
                "How much will I pay for an item priced at {original_price} with a {discount_percent}% "
                "discount?",
                "Calculate the discounted price: {original_price} minus {discount_percent} percent.",
            ),
            _discount,
            ("The discounted price is {discounted_price:.2f} — you save {savings:.2f}.",),
        ),
        _Spec(
            "book_taxi",
            "Book a taxi between two places",
            "transport",
            "book taxis",
            (
                _Param("pickup_location", _string("The pickup location"), _one(_PICKUPS)),
                _Param(
                    "dropoff_location", _string("The drop-off location"), _other(_PICKUPS, "pickup_location")
                ),
                _Param(
                    "pickup_time",
                    _string("The pickup time in HH:MM; as soon as possible if omitted"),
                    _clock,
                    required=False,
                    phrase="Pick me up at {pickup_time}.",
                ),
                _Param(
                    "vehicle_type",
                    _enum("The type of car", ("standard", "xl", "luxury")),
                    _one(("standard", "xl", "luxury")),
                    required=False,
                    phrase={
                        "standard": "A standard car is fine.",
                        "xl": "We need an XL car for the luggage.",
                        "luxury": "Send a luxury car.",
                    },
                ),
            ),
            (
                "Book me a taxi from {pickup_location} to {dropoff_location}.",
                "I need a ride from {pickup_location} to {dropoff_location}.",
                "Can you get a cab to take me from {pickup_location} to {dropoff_location}?",
            ),
            _taxi,
            (
                "Your taxi is booked. {driver_name} will pick you up at {pickup_location} in about "
                "{eta_minutes} minutes; the fare should be around {fare_estimate:.2f}.",
            ),
        ),
        _Spec(
            "log_workout",
            "Log a workout in the user's fitness diary",
            "fitness",
            "log workouts",
            (
                _Param(
                    "activity",
                    _enum(
                        "The type of exercise", ("running", "cycling", "swimming", "yoga", "hiking", "rowing")
                    ),
                    _one(("running", "cycling", "swimming", "yoga", "hiking", "rowing")),
                ),
                _Param("duration_minutes", _integer("The duration in minutes"), _ints(10, 120, 5)),
                _Param(
                    "calories_burned",
                    _integer("The calories burned"),
                    _ints(80, 900, 10),
                    required=False,
                    phrase="I burned about {calories_burned} calories.",
                ),
            ),
            (
                "Log a {duration_minutes}-minute {activity} workout.",
                "I just did {duration_minutes} minutes of {activity}. Please record it.",
                "Add {activity} for {duration_minutes} minutes to my workout log.",
            ),
            lambda a, r: {
                "status": "logged",
                "weekly_total_minutes": a["duration_minutes"] + r.randrange(0, 300, 5),
            },
            (
                "Nice work! I've logged {duration_minutes} minutes of {activity}. That's "
                "{weekly_total_minutes} minutes this week.",
            ),
        ),
        _Spec(
            "search_books",
            "Search the library catalogue for a book",
            "books",
            "search for books",
            (
                _Param("query", _string("The title or keywords"), _one(tuple(_BOOKS))),
                _Param(
                    "author",
                    _string("The author's name"),
                    lambda _r, a: _BOOKS[a["query"]][0],
                    required=False,
                    phrase="It's by {author}.",
                ),
            ),
            (
                "Can you find the book '{query}'?",
                "I'm looking for {query}. Can you search for it?",
                "Search the library for '{query}'.",
            ),
            lambda a, r: {
                "title": a["query"],
                "author": _BOOKS[a["query"]][0],
                "year": _BOOKS[a["query"]][1],
                "available": r.random() < 0.7,
            },
            (
                lambda c: (
                    f"I found '{c['title']}' by {c['author']} ({c['year']}). "
                    + ("It's available to borrow." if c["available"] else "All copies are currently on loan.")
                ),
            ),
        ),
        _Spec(
            "create_todo",
            "Add an item to the user's to-do list",
            "todo",
            "manage your to-do list",
            (
                _Param("title", _string("The to-do item"), _one(_TODOS)),
                _Param(
                    "due_date",
                    _string("The due date in YYYY-MM-DD format"),
                    _date,
                    required=False,
                    phrase="It's due on {due_date}.",
                ),
                _Param(
                    "priority",
                    _enum("The priority", ("low", "medium", "high")),
                    _one(("low", "medium", "high")),
                    required=False,
                    phrase="Mark it as {priority} priority.",
                ),
            ),
            (
                "Add '{title}' to my to-do list.",
                "Create a to-do item: {title}.",
                'Put "{title}" on my task list, please.',
            ),
            _status(),
            ("I've added '{title}' to your to-do list.", 'Got it — "{title}" is on your list.'),
        ),
        _Spec(
            "get_nutrition_info",
            "Get the nutrition facts of a food",
            "nutrition",
            "look up nutrition facts",
            (
                _Param("food", _string("The food to look up"), _one(tuple(_FOODS))),
                _Param(
                    "serving_grams",
                    _number("The serving size in grams; 100 if omitted"),
                    _ints(50, 300, 25),
                    required=False,
                    phrase="Assume a {serving_grams} g serving.",
                ),
            ),
            (
                "How many calories are in {food}?",
                "What are the nutrition facts for {food}?",
                "Can you tell me the calories and protein of {food}?",
            ),
            _nutrition,
            (
                "A {serving_grams} g serving of {food} has about {calories} kcal, {protein_g} g protein, "
                "{carbs_g} g carbs and {fat_g} g fat.",
            ),
        ),
        _Spec(
            "get_sports_scores",
            "Get the result of a team's most recent game",
            "sports",
            "check sports scores",
            (_Param("team", _string("The team name"), _one(_TEAMS)),),
            (
                "How did {team} do in their last game?",
                "What was the score of the last {team} match?",
                "Did {team} win last night?",
            ),
            _score,
            ("In their last game, {team} {outcome} against {opponent}, {team_score}–{opponent_score}.",),
        ),
        _Spec(
            "get_crypto_price",
            "Get the current price of a cryptocurrency",
            "crypto",
            "check cryptocurrency prices",
            (
                _Param("coin", _string("The cryptocurrency, e.g. bitcoin"), _one(tuple(_COINS))),
                _Param(
                    "currency",
                    _string("The currency to quote the price in"),
                    _one(("USD", "EUR", "CHF", "JPY")),
                    required=False,
                    phrase="Quote it in {currency}.",
                ),
            ),
            (
                "What's the price of {coin} right now?",
                "How much is one {coin} worth today?",
                "Check the current {coin} price for me.",
            ),
            _crypto,
            ("One {coin} is worth {price:,.2f} {currency} right now ({change_24h:+.2f}% in 24 hours).",),
        ),
    )


LIBRARY: tuple[_Spec, ...] = _library()


# ------------------------------------------------------------------------------------ chat without functions

_QA = (
    (
        "What's the capital of Switzerland?",
        "The capital of Switzerland is Bern, although Zürich is its largest city.",
    ),
    (
        "Can you explain what photosynthesis is?",
        "Photosynthesis is how plants turn sunlight, water and carbon dioxide into glucose and oxygen. It "
        "happens mostly in the chloroplasts of leaf cells.",
    ),
    (
        "Who wrote 'One Hundred Years of Solitude'?",
        "'One Hundred Years of Solitude' was written by Gabriel García Márquez and published in 1967.",
    ),
    (
        "How do you say 'thank you' in Japanese?",
        "'Thank you' in Japanese is ありがとう (arigatō). A more polite form is ありがとうございます.",
    ),
    (
        "What does 'déjà vu' mean?",
        "'Déjà vu' is French for 'already seen': the feeling that you've lived the present moment before.",
    ),
    (
        "How many continents are there?",
        "There are seven: Africa, Antarctica, Asia, Australia, Europe, North America and South America.",
    ),
    (
        "Why is the sky blue?",
        "Sunlight scatters off air molecules, and blue light scatters much more than red (Rayleigh "
        "scattering), so the sky looks blue.",
    ),
    (
        "Who painted the Mona Lisa?",
        "Leonardo da Vinci painted the Mona Lisa in the early 1500s. It hangs in the Louvre in Paris.",
    ),
    ("What's the square root of 144?", "The square root of 144 is 12."),
    ("What's the tallest mountain in the world?", "Mount Everest, at 8,849 metres above sea level."),
    (
        "What's the plural of 'cactus'?",
        "Both 'cacti' and 'cactuses' are correct; 'cacti' is more common in writing.",
    ),
    (
        "Can you suggest a name for my new puppy?",
        "How about Biscuit, Luna, Miso or Pepper? Pick one that suits your puppy's personality!",
    ),
    ("How long does sunlight take to reach Earth?", "About 8 minutes and 20 seconds."),
    (
        "What's the difference between weather and climate?",
        "Weather is what the atmosphere does on a given day; climate is the average of that weather over "
        "decades.",
    ),
    ("Give me a synonym for 'happy'.", "Some synonyms for 'happy' are cheerful, joyful, content and glad."),
    (
        "Can you write a haiku about autumn?",
        "Crisp leaves drift and fall,\nthe maple's last red whisper —\nwind carries it home.",
    ),
)
_PREAMBLES = ("Sure, one moment.", "Sure! Let me do that.", "On it.", "Okay, just a second.")
_GREETINGS = ("", "", "Hi! ", "Hey, ", "Quick question: ", "Hello! ")
_THANKS = ("Thanks!", "Thank you, that's really helpful.", "Great, thanks a lot!", "Perfect, merci!")
_WELCOME = (
    "You're welcome! Let me know if there's anything else I can do.",
    "Happy to help! Anything else?",
    "My pleasure — just ask if you need anything else.",
)
_CONNECTORS = ("Also, ", "And ", "In addition, ", "Oh, and ")
_ASK_OPENERS = (
    "Can you help me {cap}?",
    "I need to {cap}.",
    "Hi, I'd like to {cap}.",
    "Could you {cap} for me?",
)
_ASKS = ("Of course! Could you tell me {needs}?", "Sure, I can help with that. Please give me {needs}.")
_REFUSALS = (
    "I'm sorry, but I can't {cap} — that's outside the functions I have. I can help you {listed} if you'd "
    "like.",
    "Unfortunately I'm not able to {cap}. My available functions only let me {listed}.",
    "I'm afraid I don't have a function to {cap}. I can, however, {listed}.",
)
_NO_ACCESS_REFUSALS = (
    "I'm sorry, but I can't {cap} because I don't have access to external functions or services. I'm happy "
    "to help with general questions, though.",
    "Unfortunately, I'm not able to {cap} — I have no access to external tools. Is there anything else I "
    "can help you with?",
)


# --------------------------------------------------------------------------------------- conversation shapes


@dataclass
class _Draft:
    """A conversation being built: the functions it lists and its messages after the system prompt."""

    listed: list[_Spec]
    messages: list[Message]
    system: str = GLAIVE_WITH_FUNCTIONS


def _sample_args(spec: _Spec, r: random.Random) -> dict[str, Any]:
    """Every required argument, and each optional one half the time (omitted ones teach defaults)."""
    args: dict[str, Any] = {}
    for p in spec.params:
        if p.required or r.random() < 0.5:
            args[p.name] = p.gen(r, args)
    return args


def _request(spec: _Spec, args: dict[str, Any], r: random.Random) -> str:
    """A user request stating every argument value: a template plus one sentence per optional value."""
    ctx = {k: _display(v) for k, v in args.items()}
    parts = [r.choice(spec.requests).format(**ctx)]
    for p in spec.params:
        if not p.required and p.name in args:
            phrase = p.phrase if isinstance(p.phrase, str) else p.phrase[args[p.name]]
            parts.append(phrase.format(**ctx))
    return " ".join(parts)


def _answer(spec: _Spec, args: dict[str, Any], result: dict[str, Any], r: random.Random) -> str:
    ctx = {**{k: _display(v) for k, v in args.items()}, **result}
    answer = r.choice(spec.answers)
    return answer(ctx) if callable(answer) else answer.format(**ctx)


def _result_text(result: dict[str, Any]) -> str:
    return json.dumps(result, ensure_ascii=False)


def _combine(first: str, second: str, r: random.Random) -> str:
    """Two requests in one message; the second starts lower-case unless it starts with "I"."""
    if not (second.startswith("I ") or second.startswith("I'")):
        second = second[0].lower() + second[1:]
    return f"{first} {r.choice(_CONNECTORS)}{second}"


def _call_turns(spec: _Spec, r: random.Random, user: str | None = None) -> list[Message]:
    """request -> call -> FUNCTION RESPONSE -> answer; ``user`` replaces the drawn request text."""
    args = _sample_args(spec, r)
    result = spec.result(args, r)
    preamble = r.choice(_PREAMBLES) if r.random() < 0.2 else ""
    return [
        Message("user", user if user is not None else _request(spec, args, r)),
        Message("assistant", preamble, (ToolCall(spec.name, args),)),
        Message("tool", _result_text(result)),
        Message("assistant", _answer(spec, args, result, r)),
    ]


def _pick(r: random.Random, count: int, exclude: Collection[str] = ()) -> list[_Spec]:
    """``count`` functions from different domains, none in ``exclude``."""
    chosen: list[_Spec] = []
    domains = set(exclude)
    for spec in r.sample(LIBRARY, len(LIBRARY)):
        if len(chosen) == count:
            break
        if spec.domain not in domains:
            chosen.append(spec)
            domains.add(spec.domain)
    return chosen


def _with_distractors(needed: list[_Spec], r: random.Random, most: int = 4) -> list[_Spec]:
    """``needed`` plus distractors from other domains, 1-``most`` functions in all, shuffled."""
    unique = list(dict.fromkeys(needed))
    total = r.randint(len(unique), max(len(unique), most))
    listed = unique + _pick(r, total - len(unique), {s.domain for s in unique})
    r.shuffle(listed)
    return listed


def _single(r: random.Random) -> _Draft:
    (spec,) = _pick(r, 1)
    return _Draft(_with_distractors([spec], r), _call_turns(spec, r))


def _parallel(r: random.Random) -> _Draft:
    """Two calls in one assistant turn: the same function twice (two cities) or two functions."""
    first = _pick(r, 1)[0]
    second = first if r.random() < 0.4 else _pick(r, 1, {first.domain})[0]
    args1 = _sample_args(first, r)
    args2 = _sample_args(second, r)
    for _ in range(10):  # the same function twice must be asked two different things
        if second is not first or args2 != args1:
            break
        args2 = _sample_args(second, r)
    res1, res2 = first.result(args1, r), second.result(args2, r)
    calls = (ToolCall(first.name, args1), ToolCall(second.name, args2))
    messages = [
        Message("user", _combine(_request(first, args1, r), _request(second, args2, r), r)),
        Message("assistant", r.choice(_PREAMBLES) if r.random() < 0.2 else "", calls),
        Message("tool", _result_text(res1)),
        Message("tool", _result_text(res2)),
        Message("assistant", f"{_answer(first, args1, res1, r)} {_answer(second, args2, res2, r)}"),
    ]
    return _Draft(_with_distractors([first, second], r), messages)


def _multi_turn(r: random.Random) -> _Draft:
    """Two requests in turn: two calls (same or another listed function), or a call then a refusal."""
    first = _pick(r, 1)[0]
    if r.random() < 0.2:
        listed = _with_distractors([first], r, most=3)
        out = _pick(r, 1, {s.domain for s in listed})[0]
        return _Draft(listed, _call_turns(first, r) + _refusal_turns(out, listed, r))
    second = first if r.random() < 0.4 else _pick(r, 1, {first.domain})[0]
    return _Draft(_with_distractors([first, second], r), _call_turns(first, r) + _call_turns(second, r))


def _clarify(r: random.Random) -> _Draft:
    """The user asks without details; the assistant asks for the required values, then calls."""
    spec = _pick(r, 1)[0]
    needs = _join([_ask(p) for p in spec.params if p.required])
    messages = [
        Message("user", r.choice(_ASK_OPENERS).format(cap=spec.capability)),
        Message("assistant", r.choice(_ASKS).format(needs=needs)),
        *_call_turns(spec, r),
    ]
    return _Draft(_with_distractors([spec], r), messages)


def _ask(param: _Param) -> str:
    desc = param.schema["description"].split(";")[0].split(", e.g.")[0]
    return desc[0].lower() + desc[1:] if desc.startswith("The ") else desc


def _refusal_turns(out: _Spec, listed: list[_Spec], r: random.Random) -> list[Message]:
    listed_caps = _join([s.capability for s in listed], "or")
    return [
        Message("user", _request(out, _sample_args(out, r), r)),
        Message("assistant", r.choice(_REFUSALS).format(cap=out.capability, listed=listed_caps)),
    ]


def _refusal(r: random.Random) -> _Draft:
    """A request no listed function can serve: a polite no, naming what the functions can do."""
    listed = _pick(r, r.randint(1, 3))
    out = _pick(r, 1, {s.domain for s in listed})[0]
    return _Draft(listed, _refusal_turns(out, listed, r))


def _no_access(r: random.Random) -> _Draft:
    """The "no access to external functions" prompt: general chat, or declining an action."""
    if r.random() < 0.35:
        spec = r.choice(LIBRARY)
        messages = [
            Message("user", _request(spec, _sample_args(spec, r), r)),
            Message("assistant", r.choice(_NO_ACCESS_REFUSALS).format(cap=spec.capability)),
        ]
    else:
        pairs = r.sample(_QA, 2 if r.random() < 0.3 else 1)
        messages = [
            m for q, a in pairs for m in (Message("user", r.choice(_GREETINGS) + q), Message("assistant", a))
        ]
    return _Draft([], messages, GLAIVE_NO_FUNCTIONS)


_BUILDERS: dict[str, Callable[[random.Random], _Draft]] = {
    "single": _single,
    "parallel": _parallel,
    "multi_turn": _multi_turn,
    "clarify": _clarify,
    "refusal": _refusal,
    "no_access": _no_access,
}


def _conversation(r: random.Random) -> Conversation:
    draft = _BUILDERS[r.choices(SHAPES, weights=_SHAPE_WEIGHTS)[0]](r)
    if draft.listed and draft.messages[-1].role == "assistant" and r.random() < 0.2:
        draft.messages += [Message("user", r.choice(_THANKS)), Message("assistant", r.choice(_WELCOME))]
    messages = (Message("system", draft.system), *draft.messages)
    return Conversation(messages, tuple(s.schema() for s in draft.listed))


# ---------------------------------------------------------------------------------------------- public API


def generate_conversations(n: int, seed: int) -> list[Conversation]:
    """``n`` conversations; the same ``seed`` gives the same list, and a longer list extends a shorter one."""
    r = random.Random(seed)
    return [_conversation(r) for _ in range(n)]


def to_glaive(conv: Conversation, rng: random.Random | None = None) -> dict[str, str]:
    """``conv`` as a Glaive v2 row. With ``rng``, ~15% of calls write their arguments as a plain object."""
    system = next((m.content for m in conv.messages if m.role == "system"), "")
    head = f"SYSTEM: {system}"
    if conv.tools:
        head += "\n" + "\n\n".join(json.dumps(t, indent=4, ensure_ascii=False) for t in conv.tools)
    turns = [_glaive_turn(m, rng) for m in conv.messages if m.role != "system"]
    return {"system": head + "\n\n", "chat": "".join(t + "\n\n\n" for t in turns)}


def _glaive_turn(message: Message, rng: random.Random | None) -> str:
    if message.role == "user":
        return f"USER: {message.content}"
    if message.role == "tool":
        return f"FUNCTION RESPONSE: {message.content}"
    calls = [f"{GLAIVE_CALL} {_glaive_call(c, rng)}" for c in message.tool_calls]
    # Text before the first call, parallel calls one per line, one end marker for the whole turn.
    body = " ".join(p for p in (message.content, "\n".join(calls)) if p)
    return f"ASSISTANT: {body} {GLAIVE_END}"


def _glaive_call(call: ToolCall, rng: random.Random | None) -> str:
    """Glaive's call object: arguments as single-quoted JSON text (apostrophes inside left as they are)."""
    args = json.dumps(call.arguments, ensure_ascii=False)
    as_object = rng is not None and rng.random() < 0.15
    # Glaive quotes the arguments string in single quotes and escapes nothing inside it.
    quoted = args if as_object else f"'{args}'"
    return f'{{"name": {json.dumps(call.name, ensure_ascii=False)}, "arguments": {quoted}}}'


def generate_glaive_rows(n: int, seed: int) -> list[dict[str, str]]:
    """``n`` Glaive v2 rows (``{"system", "chat"}``).

    ``parse_glaive(rows[i]) == generate_conversations(n, seed)[i]``: the rows add only the Glaive
    spelling of calls (a separate random stream picks quoted or object arguments).
    """
    style = random.Random(f"glaive-style:{seed}")  # how calls are quoted: apart from what is said
    return [to_glaive(conv, style) for conv in generate_conversations(n, seed)]


def write_jsonl(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """One JSON object per line, UTF-8 and unescaped (as the public dumps are)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
