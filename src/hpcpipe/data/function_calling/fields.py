"""Fields: functions of different domains that answer neighbouring questions (a derivative and an
integral, kinetic and potential energy, a stock's price and a coin's).

Distractors and refusals are drawn from other domains, so by chance an unrelated one ("send
emails" beside a derivative asked). Benchmarks' irrelevance cases are the neighbours: the
freezing point asked where only a boiling-point function is listed. ``data.synthetic_mix.near_misses``
declines requests beside a function of their field, and ``close_distractors`` lists one beside the
function a call needs, so that a model learns to read what a function computes, not only its topic.

A field only groups functions none of which can serve another's request: a mortgage and a loan
payment (one domain), a reminder and a to-do, an average and summary statistics are left apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcpipe.data.function_calling.library import Spec

FIELDS: dict[str, tuple[str, ...]] = {
    "geometry": ("circle_measurements", "cylinder_volume_and_area", "right_triangle_hypotenuse"),
    "numbers": (
        "quadratic_equation_roots",
        "common_divisor_and_multiple",
        "prime_factorization_of",
        "count_selections",
    ),
    "calculus": ("integrate_polynomial_between", "polynomial_slope_at_point"),
    "mechanics": (
        "kinetic_energy_of_body",
        "gravitational_energy_at_height",
        "average_speed_of_trip",
        "velocity_after_constant_acceleration",
    ),
    "physics_and_chemistry": (
        "resistor_current_and_power",
        "light_frequency_and_photon_energy",
        "molar_mass_of_compound",
        "ideal_gas_pressure_from_state",
    ),
    "money": (
        "compound_growth_of_deposit",
        "investment_gain_percentage",
        "asset_depreciation_schedule",
        "calculate_loan_payment",
        "tip_for_bill",
        "calculate_discount",
    ),
    "statistics": ("binomial_success_probability", "standard_score_of_value", "summary_statistics_of_data"),
    "markets": ("stock_quote", "get_crypto_price", "exchange_currency"),
    "travel": ("search_flights", "reserve_hotel_room", "book_taxi", "distance_between_cities"),
    "media": ("search_movies", "create_playlist", "lookup_books", "get_news_headlines", "get_sports_scores"),
    "food_and_health": (
        "search_recipes",
        "search_restaurants",
        "get_nutrition_info",
        "body_mass_index",
        "log_workout",
    ),
    "words": ("translate_phrase", "get_definition"),
    "time": ("convert_timezone", "age_from_birth_date", "create_calendar_event"),
}
_FIELD_OF: dict[str, str] = {name: field for field, names in FIELDS.items() for name in names}


def field_of(name: str) -> str | None:
    return _FIELD_OF.get(name)


def siblings(spec: Spec, library: Sequence[Spec]) -> list[Spec]:
    """The functions of ``library`` in ``spec``'s field and outside its domain (none if it has no field)."""
    field = _FIELD_OF.get(spec.name)
    if field is None:
        return []
    return [s for s in library if _FIELD_OF.get(s.name) == field and s.domain != spec.domain]
