"""``data.synthetic_mix``: what the ``@synthetic`` function-calling generator writes, and how often.

The defaults were chosen by a measured sweep on SmolLM2-135M against BFCL
(docs/lora-function-calling.md, "The training mix"; benchmarks/README.md, "The training-mix
sweep"). ``SyntheticMix.classic()`` is the mix the generator wrote before these knobs existed: the
same draws, so the same rows but for the sixteen functions renamed because BFCL uses their names.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from hpcpipe.config.section import Section

# Conversation shapes, in the order the generator draws them (weights are relative, not shares).
SHAPE_FIELDS = (
    "single",
    "parallel",
    "multi_turn",
    "clarify",
    "refusal",
    "no_access",
    "parallel_multiple",
    "irrelevant",
)
NO_CALL_SHAPES = ("refusal", "no_access", "irrelevant")  # the first assistant turn makes no call


def _weight(default: float, what: str) -> float:
    return Field(default, ge=0, description=f"Relative weight of {what}.")


def _share(default: float, description: str) -> float:
    return Field(default, ge=0, le=1, description=description)


class SyntheticMix(Section):
    """Relative weights of the synthetic function-calling conversations' kinds (recipe lora-
    function-calling): each kind's share of the generated rows."""

    single: float = _weight(20, "one request -> one call (-> result -> answer)")
    parallel: float = _weight(
        10, "one turn of 2..max_parallel_calls calls (one function on several values, or two functions)"
    )
    multi_turn: float = _weight(2, "two requests in turn: two calls, or a call then a refusal")
    clarify: float = _weight(2, "a vague request -> a question for the missing values -> the call")
    refusal: float = _weight(
        45, "a request no listed function can serve -> a polite no, naming what they can do"
    )
    no_access: float = _weight(8, "the 'no access to external functions' prompt: chat or declining")
    parallel_multiple: float = _weight(
        6, "one turn calling two or three different functions, the first of them twice"
    )
    irrelevant: float = _weight(
        12, "functions listed, but the user asks a general question -> a plain answer, no call"
    )
    max_parallel_calls: int = Field(
        4, ge=2, le=6, description="Most calls of one function in a parallel turn (2 to this, uniformly)."
    )
    same_function_parallel: float = _share(
        0.6, "Share of parallel turns that call one function on several values."
    )
    compact_parallel: float = _share(
        0.5,
        "Share of those whose request states the first call in full and the other values in "
        "a few words ('... in Paris? Do the same for Lima and Oslo.'); the calls differ in that one value.",
    )
    inline_lists: float = _share(
        0.5,
        "Share of those compact requests that name every value in the one sentence instead "
        "('What's the weather in Paris, Lima and Oslo?').",
    )
    optional_args: float = _share(0.5, "Chance that a request states each optional argument (else omitted).")
    written_numbers: float = _share(
        0.3,
        "Share of numbers a request writes as people type them: thousands separators "
        "('125,000') and a currency sign on amounts of money ('$89.90'); the call holds the plain number.",
    )
    copy_values: float = _share(
        0.3,
        "Share of free-text values (names, titles, items) replaced by made-up words, which a "
        "model can only get right by copying them from the user's words.",
    )
    call_only: float = _share(
        1.0,
        "Share of single, parallel and parallel_multiple conversations that end at the assistant's "
        "call, as BFCL's cases do (no function response and answer): more calls per trained token.",
    )
    enum_nested: float = Field(
        2.0,
        ge=0.1,
        le=10,
        description="How much more often functions with enum or nested-object arguments are drawn "
        "(1: as often as the others).",
    )
    science: float = Field(
        1.5,
        ge=0,
        le=10,
        description="How often each math and science function (science.json: geometry, physics, "
        "finance and statistics formulas) is drawn, relative to an everyday one; 0 leaves them out.",
    )
    place_functions: float = Field(
        1.0,
        ge=0.1,
        le=10,
        description="How much more often functions that take a city (weather, forecast, hotels, "
        "restaurants) are drawn (1: as often as the others); see place_formats.",
    )
    dotted_names: float = _share(
        0.3,
        "Share of conversations whose function names carry a dotted namespace "
        "('weather.current_weather_report'), as many real APIs name them.",
    )
    api_namespaces: float = _share(
        0.5,
        "Share of those whose functions share one made-up API namespace instead "
        "('KaloMer.current_weather_report', 'KaloMer.search_flights'): the model must tell them "
        "apart by the rest of the name.",
    )

    twins: float = _share(
        0,
        "Share of single conversations followed by their twin: the same request, with the matching "
        "function swapped for another of its library (everyday or science) from another domain, "
        "and a reply that declines. Only whether the matching function is listed tells the pair apart.",
    )
    restate: float = _share(
        0,
        "Share of conversations whose replies to a request first say what the user wants and what "
        "the listed functions can do ('You'd like to check the weather. The functions here can "
        "search for flights or check the weather.'), then call or decline: the call/no-call "
        "decision comes after both are written out, not at the reply's first token.",
    )
    follow_ups: float = _share(
        0,
        "Share of single and refusal conversations that go on with one to three more requests "
        "against the same listed functions, each served by one of them (a call) or by none (a "
        "refusal), as often as single is weighed against refusal: more call/no-call decisions per "
        "trained token, and both answers beside the same functions.",
    )
    near_misses: float = _share(
        0,
        "Share of refusals whose request asks for a function of the same field as a listed one "
        "(a derivative asked, an integral listed; data/function_calling/fields.py) instead of "
        "one from an unrelated domain: declining then takes reading what the function computes.",
    )
    close_distractors: float = _share(
        0,
        "Share of conversations that call functions whose distractors include one of a called "
        "function's field (an integral beside the derivative called), where the field has one.",
    )
    place_formats: float = _share(
        0,
        "Share of conversations calling a function that takes a city (weather, forecast, hotels, "
        "restaurants) whose city parameter asks for 'City, ST' in the US and 'City, Country' elsewhere: "
        "the call writes it so whether the user did, wrote the state out, or named the city alone.",
    )

    @model_validator(mode="after")
    def _some_shape(self) -> SyntheticMix:
        if not any(self.shape_weights()):
            raise ValueError(f"every shape weight is 0: give one of {', '.join(SHAPE_FIELDS)} a weight")
        return self

    def shape_weights(self) -> tuple[float, ...]:
        return tuple(float(getattr(self, name)) for name in SHAPE_FIELDS)

    @classmethod
    def classic(cls) -> SyntheticMix:
        """The generator's mix before the knobs (the same draws, so the same rows but for names)."""
        return cls(
            single=30,
            parallel=12,
            multi_turn=14,
            clarify=10,
            refusal=17,
            no_access=17,
            parallel_multiple=0,
            irrelevant=0,
            max_parallel_calls=2,
            same_function_parallel=0.4,
            compact_parallel=0,
            inline_lists=0,
            optional_args=0.5,
            written_numbers=0,
            copy_values=0,
            call_only=0,
            enum_nested=1,
            science=0,
            dotted_names=0,
            api_namespaces=0,
            restate=0,
            twins=0,
            follow_ups=0,
            place_formats=0,
            place_functions=1,
            near_misses=0,
            close_distractors=0,
        )
