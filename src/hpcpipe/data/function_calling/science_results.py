"""What the math and science functions of ``science.json`` return, and their answer functions.

Registered in ``results.RESULTS`` and ``results.ANSWERS`` like the everyday ones (``schemas.py``
imports this module so that ``science.json`` validates against them). Every value is the real one:
the roots solve the equation, the integral is the polynomial's, the interest compounds.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from typing import Any

from hpcpipe.data.function_calling.draws import Pools
from hpcpipe.data.function_calling.results import Args, answer_function, join_words, result_function


def _sig(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant figures (0 stays 0)."""
    return 0.0 if x == 0 else round(x, digits - 1 - math.floor(math.log10(abs(x))))


def _whole(x: float) -> float | int:
    """A float that is a whole number as an int (12.0 -> 12), for answers people read."""
    return int(x) if float(x).is_integer() else x


def _horner(coefficients: Sequence[float], x: float) -> float:
    """The polynomial with ``coefficients`` (highest power first) at ``x``."""
    value = 0.0
    for c in coefficients:
        value = value * x + c
    return value


@result_function("sci_circle")
def _sci_circle(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    radius = a["radius"]
    if a["measure"] == "area":
        return {"measure": "area", "value": round(math.pi * radius**2, 2), "unit": "square centimeters"}
    return {"measure": "circumference", "value": round(2 * math.pi * radius, 2), "unit": "centimeters"}


@result_function("sci_cylinder")
def _sci_cylinder(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    radius, height = a["radius"], a["height"]
    return {
        "volume": round(math.pi * radius**2 * height, 2),
        "surface_area": round(2 * math.pi * radius * (radius + height), 2),
    }


@result_function("sci_hypotenuse")
def _sci_hypotenuse(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    return {"hypotenuse": _whole(round(math.hypot(a["leg_a"], a["leg_b"]), a.get("decimals", 2)))}


@result_function("sci_quadratic")
def _sci_quadratic(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    qa, qb, qc = a["a"], a["b"], a["c"]
    disc = qb * qb - 4 * qa * qc
    if disc > 0:
        roots: list[Any] = sorted(_whole(round((-qb + s * math.sqrt(disc)) / (2 * qa), 4)) for s in (1, -1))
        kind = "two real roots"
    elif disc == 0:
        roots, kind = [_whole(round(-qb / (2 * qa), 4))], "one repeated real root"
    else:
        re, im = _whole(round(-qb / (2 * qa), 4)), round(math.sqrt(-disc) / (2 * abs(qa)), 4)
        roots, kind = [f"{re}+{_whole(im)}i", f"{re}-{_whole(im)}i"], "two complex roots"
    return {"discriminant": disc, "root_type": kind, "roots": roots}


@answer_function("sci_quadratic")
def _sci_quadratic_answer(c: dict[str, Any]) -> str:
    roots = [str(x) for x in c["roots"]]
    if len(roots) == 1:
        return f"The discriminant is 0, so the equation has one repeated root: x = {roots[0]}."
    kind = "real" if c["discriminant"] > 0 else "complex"
    return f"The discriminant is {c['discriminant']}, so there are two {kind} roots: x = {join_words(roots)}."


@result_function("sci_gcd_lcm")
def _sci_gcd_lcm(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    first, second = a["first_number"], a["second_number"]
    return {"gcd": math.gcd(first, second), "lcm": math.lcm(first, second)}


@result_function("sci_prime_factors")
def _sci_prime_factors(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    n, factors, p = a["number"], [], 2
    while p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    factors += [n] if n > 1 else []
    return {"factors": factors, "is_prime": len(factors) == 1}


@answer_function("sci_prime_factors")
def _sci_prime_factors_answer(c: dict[str, Any]) -> str:
    if c["is_prime"]:
        return f"{c['number']} is a prime number, so its only prime factor is itself."
    return f"The prime factorization of {c['number']} is {' × '.join(str(f) for f in c['factors'])}."


@result_function("sci_selections")
def _sci_selections(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    n, k = a["total_items"], a["chosen"]
    if a.get("order_matters", False):
        return {"ways": math.perm(n, k), "counting": "permutations"}
    return {"ways": math.comb(n, k), "counting": "combinations"}


@result_function("sci_integral")
def _sci_integral(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    coefficients = a["coefficients"]
    degree = len(coefficients) - 1
    antiderivative = [c / (degree - i + 1) for i, c in enumerate(coefficients)] + [0.0]
    area = _horner(antiderivative, a["upper_bound"]) - _horner(antiderivative, a["lower_bound"])
    return {"integral": _whole(round(area, 4))}


@result_function("sci_derivative")
def _sci_derivative(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    coefficients, x = a["coefficients"], a["point"]
    degree = len(coefficients) - 1
    slope = _horner([c * (degree - i) for i, c in enumerate(coefficients[:-1])], x)
    return {"value": _whole(round(_horner(coefficients, x), 4)), "derivative": _whole(round(slope, 4))}


@result_function("sci_kinetic_energy")
def _sci_kinetic_energy(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    return {"energy_joules": round(0.5 * a["mass"] * a["velocity"] ** 2, 2)}


@result_function("sci_potential_energy")
def _sci_potential_energy(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    gravity = a.get("gravity", 9.81)
    return {"energy_joules": round(a["mass"] * gravity * a["height"], 2), "gravity": gravity}


_SPEED_PER_KMH = {"km/h": 1.0, "m/s": 1 / 3.6, "mph": 0.621371}


@result_function("sci_average_speed")
def _sci_average_speed(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    unit = a.get("unit", "km/h")
    return {"average_speed": round(a["distance_km"] / a["hours"] * _SPEED_PER_KMH[unit], 2), "unit": unit}


@result_function("sci_accelerated_motion")
def _sci_accelerated_motion(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    v0, acc, t = a["initial_velocity"], a["acceleration"], a["time"]
    return {"velocity_at_end": round(v0 + acc * t, 2), "distance": round(v0 * t + acc * t * t / 2, 2)}


@result_function("sci_resistor")
def _sci_resistor(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    volts, ohms = a["voltage"], a["resistance"]
    return {"current_amperes": _sig(volts / ohms), "power_watts": _sig(volts * volts / ohms)}


_REFRACTIVE_INDEX = {"vacuum": 1.0, "water": 1.333, "glass": 1.5}
_COLOURS = (
    (380, "ultraviolet"),
    (450, "violet"),
    (495, "blue"),
    (570, "green"),
    (590, "yellow"),
    (620, "orange"),
    (750, "red"),
)


@result_function("sci_light")
def _sci_light(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    """The wavelength is measured in the medium; frequency and colour are the medium's own."""
    vacuum_nm = a["wavelength_nm"] * _REFRACTIVE_INDEX[a.get("medium", "vacuum")]
    hertz = 299_792_458 / (vacuum_nm * 1e-9)
    colour = next((name for edge, name in _COLOURS if vacuum_nm < edge), "infrared")
    return {
        "frequency_thz": round(hertz / 1e12, 1),
        "photon_energy_ev": round(6.62607015e-34 * hertz / 1.602176634e-19, 3),
        "color": colour,
    }


def _formula_mass(formula: str, masses: Pools) -> float:
    """The molar mass of a formula such as ``Ca(OH)2``, from element masses in g/mol."""
    stack: list[float] = [0.0]
    i = 0
    while i < len(formula):
        if formula[i] == "(":
            stack.append(0.0)
            i += 1
            continue
        if formula[i] == ")":
            group, i = stack.pop(), i + 1
        else:
            j = i + 1 + (i + 1 < len(formula) and formula[i + 1].islower())
            group, i = masses[formula[i:j]], j
        digits = i
        while digits < len(formula) and formula[digits].isdigit():
            digits += 1
        stack[-1] += group * int(formula[i:digits] or 1)
        i = digits
    return stack[0]


@result_function("sci_molar_mass", "atomic_masses", "compounds")
def _sci_molar_mass(a: Args, _r: random.Random, pools: Pools) -> dict[str, Any]:
    molar = round(_formula_mass(a["formula"], pools["atomic_masses"]), 3)
    out: dict[str, Any] = {"compound": pools["compounds"][a["formula"]], "molar_mass_g_per_mol": molar}
    if "mass_grams" in a:
        out["moles"] = _sig(a["mass_grams"] / molar)
    return out


@answer_function("sci_molar_mass")
def _sci_molar_mass_answer(c: dict[str, Any]) -> str:
    text = f"The molar mass of {c['formula']} ({c['compound']}) is {c['molar_mass_g_per_mol']} g/mol."
    if "moles" in c:
        text += f" So {c['mass_grams']} g of it is {c['moles']} mol."
    return text


_PER_ATM = {"atm": 1.0, "kPa": 101.325, "mmHg": 760.0}


@result_function("sci_ideal_gas")
def _sci_ideal_gas(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    unit = a.get("pressure_unit", "atm")
    atm = a["moles"] * 0.0820574 * a["temperature_k"] / a["volume_l"]
    return {"pressure": _sig(atm * _PER_ATM[unit]), "unit": unit}


@result_function("sci_compound_growth")
def _sci_compound_growth(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    n = a.get("compounds_per_year", 12)
    final = a["principal"] * (1 + a["annual_rate"] / 100 / n) ** (n * a["years"])
    return {"final_amount": round(final, 2), "interest_earned": round(final - a["principal"], 2)}


@result_function("sci_investment_return")
def _sci_investment_return(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    start, end = a["amount_invested"], a["current_value"]
    out: dict[str, Any] = {
        "gain": round(end - start, 2),
        "roi_percent": round((end - start) / start * 100, 2),
    }
    if "years" in a:
        out["annualized_return_percent"] = round(((end / start) ** (1 / a["years"]) - 1) * 100, 2)
    return out


@answer_function("sci_investment_return")
def _sci_investment_return_answer(c: dict[str, Any]) -> str:
    verb = "gained" if c["gain"] >= 0 else "lost"
    text = f"Your investment has {verb} {abs(c['gain']):,.2f}, a return of {c['roi_percent']}%."
    if "annualized_return_percent" in c:
        text += f" Over {c['years']} years that's {c['annualized_return_percent']}% a year."
    return text


_DEPRECIATION_METHODS = {
    "straight_line": "straight-line",
    "double_declining_balance": "double-declining balance",
}


@result_function("sci_depreciation")
def _sci_depreciation(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    """Straight-line, or double-declining balance that reaches the salvage value in the last year."""
    cost, salvage, life = a["cost"], a["salvage_value"], a["useful_life_years"]
    method = a.get("method", "straight_line")
    book, values = float(cost), []
    for year in range(1, life + 1):
        step = (cost - salvage) / life if method == "straight_line" else book * 2 / life
        step = book - salvage if year == life else min(step, book - salvage)
        book -= step
        values.append(round(book, 2))
    return {
        "method": _DEPRECIATION_METHODS[method],
        "first_year_depreciation": round(cost - values[0], 2),
        "book_values": values,
    }


@result_function("sci_summary_statistics")
def _sci_summary_statistics(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    data = a["data"]
    spread = statistics.stdev(data) if a.get("sample", True) else statistics.pstdev(data)
    return {
        "mean": round(statistics.fmean(data), 2),
        "median": _whole(round(statistics.median(data), 2)),
        "std_dev": round(spread, 2),
        "min": min(data),
        "max": max(data),
    }


@result_function("sci_binomial")
def _sci_binomial(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    n, k, p = a["trials"], a["successes"], a["success_probability"]
    at_least = a.get("at_least", False)
    total = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in (range(k, n + 1) if at_least else [k]))
    return {"probability": _sig(total), "event": f"{'at least' if at_least else 'exactly'} {k}"}


@result_function("sci_z_score")
def _sci_z_score(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    z = (a["value"] - a["mean"]) / a["std_dev"]
    return {"z_score": round(z, 3), "percentile": round(50 * (1 + math.erf(z / math.sqrt(2))), 1)}


# scale -> (kelvin per degree, kelvin at zero on the scale)
_KELVIN = {"celsius": (1.0, 273.15), "fahrenheit": (5 / 9, 273.15 - 32 * 5 / 9), "kelvin": (1.0, 0.0)}


@result_function("sci_temperature")
def _sci_temperature(a: Args, _r: random.Random, _pools: Pools) -> dict[str, Any]:
    (per_from, zero_from), (per_to, zero_to) = _KELVIN[a["from_scale"]], _KELVIN[a["to_scale"]]
    value = (a["temperature"] * per_from + zero_from - zero_to) / per_to
    return {"converted_temperature": round(value, 2), "scale": a["to_scale"]}
