"""Function-calling data, prepared once: read -> normalise -> hold out -> encode -> pack -> cache.

``data.sources`` are JSONL files (or globs, or directories of ``*.jsonl``) in ``data.format``, or
``@synthetic`` (``data.synthetic_rows`` generated Glaive v2 rows). Malformed rows are counted by
reason, never fatal; conversations longer than ``model.seq_len`` tokens are counted as
``too_long`` and left out. A conversation is held out for evaluation by a hash of its content
(``data.val_fraction``), the same on every machine.

The result lives in ``<data.prepared_dir>/fc-<fingerprint>/``: ``train.npz`` and ``eval.npz``
(packed token rows, plain arrays), ``heldout.jsonl`` (the held-out conversations, normalised, for
generation-based evaluation) and ``data_report.json`` (counts by reason, tokens, packing fill, and
the SHA-256 of the three data files, which ``verify_prepared`` checks: ``hpcpipe data verify``).
The fingerprint covers the sources' bytes, the tokenizer and every setting that changes the rows,
so a changed input prepares again and an unchanged one is reused.
"""

from __future__ import annotations

import glob
import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcpipe.config import DataConfig
from hpcpipe.data.function_calling.conversation import Conversation, Message, ToolCall
from hpcpipe.data.function_calling.pack import pack
from hpcpipe.data.function_calling.schemas import shipped_digest
from hpcpipe.data.function_calling.tokens import ChatFormat, Encoded, RenderError
from hpcpipe.errors import DataError
from hpcpipe.fsutil import atomic_replace_dir
from hpcpipe.recipes.base import DataSummary

SYNTHETIC = "@synthetic"
_VERSION = 2  # 2: the packed rows mark each conversation's system prompt (Packed.context)
REPORT_FILE = "data_report.json"
DATA_FILES = ("train.npz", "eval.npz", "heldout.jsonl")  # hashed in the report's "files"


@dataclass(frozen=True)
class Conversations:
    train: list[Conversation]
    heldout: list[Conversation]
    malformed: Counter[str]
    rows: int


def source_paths(cfg: DataConfig) -> list[Path]:
    """The files ``data.sources`` names (DataError naming a source that matches nothing)."""
    paths: list[Path] = []
    for source in cfg.sources:
        if source == SYNTHETIC:
            continue
        path = Path(source).expanduser()
        if path.is_dir():
            found = sorted(path.glob("*.jsonl")) + sorted(path.glob("*.json"))
        elif any(ch in source for ch in "*?["):
            found = sorted(Path(p) for p in glob.glob(str(path)))
        else:
            found = [path] if path.is_file() else []
        if not found:
            raise DataError(f"data.sources: {source} does not exist or holds no .jsonl files")
        paths.extend(found)
    return paths


def read_split(cfg: DataConfig, seed: int) -> Conversations:
    """Every source's conversations, split into training and held-out ones."""
    from hpcpipe.data.function_calling.formats import parse_glaive
    from hpcpipe.data.function_calling.row_files import held_out, read_conversations

    convs: list[Conversation] = []
    malformed: Counter[str] = Counter()
    rows = 0
    if SYNTHETIC in cfg.sources:
        from hpcpipe.data.function_calling.glaive_rows import generate_glaive_rows

        for i, row in enumerate(generate_glaive_rows(cfg.synthetic_rows, seed, cfg.synthetic_mix)):
            conv = parse_glaive(row)
            convs.append(Conversation(conv.messages, conv.tools, source=f"{SYNTHETIC}:{i + 1}"))
        rows += cfg.synthetic_rows
    paths = source_paths(cfg)
    if paths:
        found, bad = read_conversations(paths, cfg.format)  # type: ignore[arg-type]
        convs += found
        malformed += bad
        rows += len(found) + sum(bad.values())
    train = [c for c in convs if not held_out(c, cfg.val_fraction, seed)]
    heldout = [c for c in convs if held_out(c, cfg.val_fraction, seed)]
    return Conversations(train[: cfg.max_train_samples], heldout[: cfg.max_eval_samples], malformed, rows)


def fingerprint(cfg: DataConfig, seq_len: int, tokenizer_key: str, seed: int) -> str:
    """Hash of everything the prepared rows depend on (source bytes, not their names)."""
    digest = hashlib.sha256()
    for path in source_paths(cfg):
        with path.open("rb") as fh:
            digest.update(hashlib.file_digest(fh, "sha256").digest())
    settings = {
        "version": _VERSION,
        "format": cfg.format,
        "synthetic": cfg.synthetic_rows if SYNTHETIC in cfg.sources else 0,
        "mix": cfg.synthetic_mix.model_dump() if SYNTHETIC in cfg.sources else None,
        "library": shipped_digest() if SYNTHETIC in cfg.sources else None,
        "seq_len": seq_len,
        "packing": cfg.packing,
        "val_fraction": cfg.val_fraction,
        "max_train": cfg.max_train_samples,
        "max_eval": cfg.max_eval_samples,
        "seed": seed,
        "tokenizer": tokenizer_key,
    }
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:20]


DROPPED = ("too_long", "no_supervised_tokens")  # valid conversations the packed rows cannot use


def encode_all(
    convs: list[Conversation], fmt: ChatFormat, seq_len: int, malformed: Counter[str]
) -> list[Encoded]:
    """Encoded conversations that fit; the rest are counted in ``malformed`` by reason."""
    out = []
    for conv in convs:
        try:
            enc = fmt.encode(conv)
        except RenderError as exc:
            malformed[exc.reason] += 1
            continue
        if len(enc.input_ids) > seq_len:
            malformed["too_long"] += 1
        elif enc.supervised == 0:
            malformed["no_supervised_tokens"] += 1
        else:
            out.append(enc)
    return out


def build(cfg: DataConfig, data: Conversations, fmt: ChatFormat, seq_len: int, out: Path) -> None:
    """Encode, pack and write one prepared directory (``out`` is a fresh temporary directory)."""
    malformed = Counter(data.malformed)
    train = encode_all(data.train, fmt, seq_len, malformed)
    heldout = encode_all(data.heldout, fmt, seq_len, Counter())
    if not train:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(malformed.items())) or "no rows"
        raise DataError(
            f"data.sources: no valid training conversations in {', '.join(cfg.sources)} ({reasons})"
        )
    pad_id = int(fmt.tokenizer.pad_token_id)
    packed_train = pack(train, seq_len, cfg.packing, pad_id)
    packed_eval = pack(heldout, seq_len, cfg.packing, pad_id)
    packed_train.save(out / "train.npz")
    packed_eval.save(out / "eval.npz")
    with (out / "heldout.jsonl").open("w", encoding="utf-8") as fh:
        for conv in data.heldout:
            fh.write(json.dumps(conversation_to_json(conv), ensure_ascii=False) + "\n")
    report = {
        "rows": data.rows,
        "conversations": {"train": len(data.train), "heldout": len(data.heldout)},
        "encoded": {"train": len(train), "heldout": len(heldout)},
        # Rows that could not be read (by reason), and readable ones left out (too long, nothing
        # to learn from): both are counted, neither stops the job.
        "malformed": {k: v for k, v in sorted(malformed.items()) if k not in DROPPED},
        "dropped": {k: v for k, v in sorted(malformed.items()) if k in DROPPED},
        "tokens": {
            "train": int(sum(len(e.input_ids) for e in train)),
            "train_supervised": int(sum(e.supervised for e in train)),
        },
        "sequences": {"train": len(packed_train), "eval": len(packed_eval)},
        "packing": {"enabled": cfg.packing, "fill": round(packed_train.fill, 4)},
        "template": "own (ChatML)" if fmt.own_template else "tokenizer",
        "tools_rendering": "template" if fmt.native_tools else "hpcpipe <tools>/<tool_call>",
        "files": {name: _sha256(out / name) for name in DATA_FILES},
    }
    (out / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")


def prepared_path(prepared_dir: str | Path, key: str) -> Path:
    """The directory of the prepared data whose ``fingerprint`` is ``key``."""
    return Path(prepared_dir) / f"fc-{key}"


def prepare(cfg: DataConfig, data: Conversations, fmt: ChatFormat, seq_len: int, root: Path) -> Path:
    """``root`` (named by the fingerprint) complete on disk; built unless already there."""
    if not (root / REPORT_FILE).is_file():
        with atomic_replace_dir(root) as tmp:
            build(cfg, data, fmt, seq_len, tmp)
    return root


def read_report(root: Path) -> dict[str, Any]:
    """A prepared directory's ``data_report.json``; DataError when it is missing or not JSON."""
    path = Path(root) / REPORT_FILE
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{root}: not a prepared function-calling dataset (no {REPORT_FILE})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: cannot read ({exc})") from None
    if not isinstance(report, dict):
        raise DataError(f"{path}: not a data report (a JSON object)")
    return report


def verify_prepared(root: Path, older_ok: bool = False) -> dict[str, Any]:
    """The report, after checking every data file against its SHA-256 in it; DataError names the
    first missing or changed file, or says how to prepare again when no hashes were recorded
    (``older_ok``: a directory an older hpcpipe prepared, without hashes, passes unchecked)."""
    report = read_report(root)
    files = report.get("files")
    if older_ok and "files" not in report:
        return report
    if not isinstance(files, dict) or set(files) != set(DATA_FILES):
        raise DataError(
            f"{root}: {REPORT_FILE} records no file hashes (prepared by an older hpcpipe); delete the "
            "directory and run `hpcpipe data prepare JOB` to prepare it again"
        )
    for name in DATA_FILES:
        path = Path(root) / name
        again = f"delete {root} and run again to prepare it anew"
        if not path.is_file():
            raise DataError(f"{path}: missing; {again}")
        if _sha256(path) != files[name]:
            raise DataError(f"{path}: corrupted (SHA-256 does not match {REPORT_FILE}); {again}")
    return report


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def conversation_to_json(conv: Conversation) -> dict[str, Any]:
    return {
        "tools": list(conv.tools),
        "messages": [
            {"role": m.role, "content": m.content, "tool_calls": [c.to_json() for c in m.tool_calls]}
            for m in conv.messages
        ],
        "source": conv.source,
    }


def conversation_from_json(row: dict[str, Any]) -> Conversation:
    messages = tuple(
        Message(m["role"], m["content"], tuple(ToolCall(c["name"], c["arguments"]) for c in m["tool_calls"]))
        for m in row["messages"]
    )
    return Conversation(messages, tuple(row["tools"]), source=row.get("source", ""))


def read_heldout(path: Path) -> list[Conversation]:
    with path.open(encoding="utf-8") as fh:
        return [conversation_from_json(json.loads(line)) for line in fh if line.strip()]


def prepared_summary(root: Path, reused: bool, key: str) -> DataSummary:
    """``hpcpipe data prepare``'s account of prepared conversations: rows kept and skipped,
    supervised tokens, packing, and conversations and sequences per split."""
    report = read_report(root)
    lost = {**report["malformed"], **report["dropped"]}
    skipped = ", ".join(f"{k} {v}" for k, v in lost.items()) or "none"
    title = (
        f"{report['rows']:,} rows, skipped: {skipped}; "
        f"{report['tokens']['train_supervised']:,} of {report['tokens']['train']:,} training tokens "
        f"supervised, packing fill {report['packing']['fill']:.0%}"
    )
    rows = tuple(
        (
            split,
            f"{report['conversations'][split]:,}",
            f"{report['encoded'][split]:,}",
            f"{report['sequences'][packed]:,}",
        )
        for split, packed in (("train", "train"), ("heldout", "eval"))
    )
    return DataSummary(
        headline=f"{'reused' if reused else 'prepared'} [bold]{root}[/]",
        columns=("split", "conversations", "encoded", "sequences"),
        rows=rows,
        title=title,
        details={"path": str(root), "fingerprint": key, "reused": reused} | report,
    )
