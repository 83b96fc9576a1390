"""The call threshold an adapter ships with, chosen on generated near-miss requests.

Greedy decoding calls when the call opener is the likeliest first token of the reply. Where that
boundary falls after a short fine-tune depends on the training mix and on luck: two seeds of one
mix differ by up to 13 points in BFCL irrelevance (benchmarks/README.md, p11 and p17), and
reweighting the mix moves call quality as much as the boundary. Calibration sets the boundary
after training instead, from data the generator makes, never from a benchmark:

- **Near misses.** Twin requests (``SyntheticMix.twins``): a single request whose matching
  function is swapped for a function of another domain of its own library, so that nothing listed
  fits while the request reads like one that a listed function served in training. Math and
  science functions each have a domain of their own ("integrals", "derivatives"), so their twins
  are as close as BFCL's irrelevance cases (a derivative asked, an integral listed). A seed that
  no training row was drawn from.
- **The threshold.** P(call) at the first token of each twin's reply (one forward pass each), and
  the smallest threshold at which ``target`` of the twins decline. ``CallDecision`` then decides
  by it: call when P(call) >= threshold.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from torch import nn

from hpcpipe.config.synthetic import SHAPE_FIELDS, SyntheticMix
from hpcpipe.data.function_calling.conversation import Conversation
from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout

SEED_OFFSET = 104_729  # calibration draws from seed + this: rows the training seed never drew
Saved = TypeVar("Saved")


@dataclass(frozen=True)
class Calibration:
    threshold: float  # call when P(call) >= this
    target: float  # the share of near misses that decline at the threshold
    cases: int  # near-miss requests scored
    seed: int  # the generator seed they were drawn from
    p_call_quantiles: dict[str, float]  # P(call) over the near misses: their 10th..90th percentiles
    adapter_sha256: str | None = (
        None  # adapter_sha256() of the adapter it was set on (None: before 2026-12-05)
    )

    def __post_init__(self) -> None:
        if not is_number(self.threshold):
            raise TypeError(f"threshold {self.threshold!r} is not a number")
        # As --call-threshold takes it: with NaN (P >= NaN is false) or 7 no reply calls, with -1 all do.
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold {self.threshold!r} is not a number from 0 to 1")

    def save(self, directory: Path) -> Path:
        path = directory / RunLayout.CALL_THRESHOLD  # beside the exported adapter
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path


def near_misses(n: int, seed: int, mix: SyntheticMix) -> list[Conversation]:
    """``n`` twin requests of ``mix``'s functions (science, names, places as it draws them), each
    cut before its reply: the system prompt, the listed functions and one user request."""
    only_singles = {shape: 0.0 for shape in SHAPE_FIELDS} | {"single": 1.0}
    twin_mix = mix.model_copy(update={**only_singles, "twins": 1.0, "follow_ups": 0.0, "restate": 0.0})
    from hpcpipe.data.function_calling.generator import generate_conversations

    drawn = generate_conversations(2 * n, seed, twin_mix)  # each single is followed by its twin
    twins = [conv for conv in drawn[1::2] if not any(m.tool_calls for m in conv.messages)]
    return [Conversation(c.messages[:2], c.tools, source="calibration") for c in twins[:n]]


def threshold_for(p_call: Sequence[float], target: float) -> float:
    """The smallest threshold at which at least ``target`` of ``p_call`` fall below it (decline)."""
    if not p_call or not 0 < target <= 1:
        raise ValueError(f"threshold_for: need scores and 0 < target <= 1, got {len(p_call)}, {target}")
    ranked = sorted(p_call)
    declining = math.ceil(target * len(ranked))  # this many must lie strictly below the threshold
    if declining >= len(ranked):
        return min(1.0, math.nextafter(ranked[-1], math.inf))
    return ranked[declining]


def calibrate(
    model: nn.Module, chat: Any, mix: SyntheticMix, seed: int, cases: int, target: float, batch_size: int = 8
) -> Calibration:
    """Score ``cases`` near misses (``near_misses``) and choose the threshold for ``target``."""
    from hpcpipe.data.function_calling.tokens import CALL_OPEN
    from hpcpipe.evaluate.generate import CallDecision, generate_replies

    convs = near_misses(cases, seed + SEED_OFFSET, mix)
    prompts = [chat.prompt(conv, len(conv.messages)) for conv in convs]
    decision = CallDecision(chat.tokenizer(CALL_OPEN, add_special_tokens=False)["input_ids"][0])
    generate_replies(
        model, chat.tokenizer, prompts, max_new_tokens=1, batch_size=batch_size, decision=decision
    )
    p = [decision.p_call[i] for i in range(len(prompts))]
    ranked = sorted(p)
    quantiles = {f"p{q}": round(ranked[min(len(p) - 1, q * len(p) // 100)], 6) for q in (10, 25, 50, 75, 90)}
    # Exact: a confident model's threshold (say 3e-7) rounded to 6 places is 0.0, and every reply
    # would call (P >= 0 always holds); JSON keeps the float as it is.
    return Calibration(threshold_for(p, target), target, len(p), seed + SEED_OFFSET, quantiles)


def read_calibration(adapter_dir: Path) -> Calibration | None:
    """The calibration saved beside an adapter, or None."""
    path = adapter_dir / RunLayout.CALL_THRESHOLD
    return read_saved(path, Calibration, "delete it, or evaluate with --call-threshold greedy or a number")


def adapter_sha256(adapter_dir: Path) -> str | None:
    """SHA-256 over the adapter's weights files (peft's ``adapter_model*``), None without one: what
    the files saved beside it were set on. Training again re-exports the adapter into the same
    folder and leaves them there, so a rule set on the old weights would judge the new ones."""
    files = sorted(p for p in adapter_dir.glob("adapter_model*") if p.is_file())
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def set_on_this_adapter(recorded: str | None, adapter_dir: Path) -> bool:
    """Whether a file saved beside ``adapter_dir`` that recorded the hash ``recorded`` was set on
    the weights there now. One written before hashes were (``recorded`` None) is trusted: file
    times cannot tell (cp -r, rsync without -t and kubectl cp set them in copy order), and such
    a file is named by ``unhashed_note`` instead."""
    return recorded is None or recorded == adapter_sha256(adapter_dir)


def unhashed_note(saved: Path) -> str:
    """One line saying that ``saved`` predates the check of ``set_on_this_adapter``."""
    return (
        f"{saved}: written before adapters were hashed (2026-12-05), so not checked against the "
        "adapter there now; delete it if the run was trained again since"
    )


def read_saved(path: Path, cls: type[Saved], remedy: str) -> Saved | None:
    """``cls`` from the JSON object saved at ``path``, None without the file; a damaged file is
    one line naming it and ``remedy`` (UserError)."""
    if not path.is_file():
        return None
    try:
        fields = json.loads(path.read_text())
        if not isinstance(fields, dict):
            raise TypeError("not a JSON object")
        return cls(**fields)
    except (ValueError, TypeError) as exc:  # not JSON, keys missing or unknown, a wrong type
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path}: cannot read it ({reason}); {remedy}") from None


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
