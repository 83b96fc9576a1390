"""Tokenizers: byte-level BPE trained locally, raw UTF-8 bytes, or a model's own (pre-trained,
``PretrainedTokenizer``); one small protocol for all.

Training code and the model only need ``vocab_size`` and ``eos_id``; sampling and evaluation
need ``encode``/``decode``. ``encode_batch`` exists because Hugging Face ``tokenizers`` encodes a
batch in parallel in Rust, which is what keeps ``data prepare`` fast on a laptop.

Text that happens to contain ``<|endoftext|>`` is encoded as ordinary text, never as the EOS id:
only the data pipeline places EOS (after each document), so corpora cannot forge boundaries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from hpcpipe.errors import DataError

EOS_TOKEN = "<|endoftext|>"
BPE_FILE = "tokenizer.json"
BYTE_VOCAB_SIZE = 257  # 256 byte values + EOS


@runtime_checkable
class Tokenizer(Protocol):
    """What the rest of hpcpipe needs from a tokenizer."""

    kind: str  # "bpe" | "bytes" | "pretrained": the manifest's tokenizer.kind
    name: str  # human-readable, e.g. "bpe-4096"
    vocab_size: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """Token i < 256 is the byte i of the UTF-8 text; 256 is EOS. Needs no training or file."""

    kind = "bytes"
    name = "bytes"
    vocab_size = BYTE_VOCAB_SIZE
    eos_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(text.encode("utf-8")) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """Bytes back to text; EOS shows as ``<|endoftext|>``, broken UTF-8 as U+FFFD."""
        pieces: list[str] = []
        run = bytearray()
        for token in ids:
            if token == self.eos_id:
                pieces.append(run.decode("utf-8", errors="replace") + EOS_TOKEN)
                run.clear()
            elif 0 <= token < 256:
                run.append(token)
            else:
                raise ValueError(f"token id {token} is outside the byte vocabulary (0..256)")
        pieces.append(run.decode("utf-8", errors="replace"))
        return "".join(pieces)


class _HFBacked:
    """A tokenizer backed by a Hugging Face ``tokenizers.Tokenizer``: saving and encoding (never
    adding special tokens: only the data pipeline places EOS)."""

    _hf: HFTokenizer

    @staticmethod
    def _read(path: Path) -> HFTokenizer:
        try:
            return HFTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises bare Exception for unreadable files
            raise DataError(f"{path}: not a readable tokenizer file ({exc})") from None

    def save(self, path: Path) -> None:
        self._hf.save(str(path))

    def encode(self, text: str) -> list[int]:
        return list(self._hf.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self._hf.encode_batch(list(texts), add_special_tokens=False)
        return [list(enc.ids) for enc in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return self._hf.decode(list(ids), skip_special_tokens=False)


class BPETokenizer(_HFBacked):
    """Byte-level BPE (GPT-2 style pre-tokenization) wrapping a Hugging Face ``Tokenizer``."""

    kind = "bpe"

    def __init__(self, hf: HFTokenizer) -> None:
        eos_id = hf.token_to_id(EOS_TOKEN)
        if eos_id is None:
            raise DataError(f"the BPE tokenizer has no {EOS_TOKEN} token")
        hf.encode_special_tokens = True  # not saved in tokenizer.json: set on every load
        self._hf = hf
        self.eos_id: int = eos_id
        self.vocab_size: int = hf.get_vocab_size(with_added_tokens=True)
        self.name = f"bpe-{self.vocab_size}"

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, length: int | None = None) -> BPETokenizer:
        """Train on ``texts`` (streamed); every byte is in the alphabet, so nothing is unknown."""
        return cls(train_byte_level_bpe(texts, vocab_size, [EOS_TOKEN], length))

    @classmethod
    def from_file(cls, path: Path) -> BPETokenizer:
        return cls(cls._read(path))


class PretrainedTokenizer(_HFBacked):
    """A model's own tokenizer (a Hugging Face fast tokenizer's ``tokenizers.Tokenizer``), saved
    with the prepared shards as ``tokenizer.json``. Special tokens written in the text (a chat
    template's ``<|im_start|>``) encode as the special tokens they are; EOS is the model's."""

    kind = "pretrained"

    def __init__(self, hf: HFTokenizer, eos_id: int, name: str) -> None:
        self._hf = hf
        self.eos_id = eos_id
        self.vocab_size: int = hf.get_vocab_size(with_added_tokens=True)
        self.name = name

    @classmethod
    def from_file(cls, path: Path, eos_id: int, name: str) -> PretrainedTokenizer:
        return cls(cls._read(path), eos_id, name)


def train_byte_level_bpe(
    texts: Iterable[str], vocab_size: int, special_tokens: list[str], length: int | None = None
) -> HFTokenizer:
    """A byte-level BPE (GPT-2 style pre-tokenization, every byte in the alphabet) trained on
    ``texts``; the special tokens take the first ids, in order. Shared by token datasets and the
    tiny test models."""
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        show_progress=False,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    hf.train_from_iterator(texts, trainer=trainer, length=length)
    return hf


def train_tokenizer(kind: str, texts: Iterable[str], vocab_size: int, length: int | None = None) -> Tokenizer:
    """A tokenizer of ``kind`` ("bpe" trains on ``texts``; "bytes" ignores them)."""
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "bpe":
        return BPETokenizer.train(texts, vocab_size, length)
    raise DataError(f"data.tokenizer: unknown kind {kind!r} (bpe, bytes)")


def tokenizer_from_spec(spec: dict[str, Any], directory: Path) -> Tokenizer:
    """The tokenizer a manifest's ``tokenizer`` entry describes, its file under ``directory``."""
    kind = spec.get("kind")
    if kind == "bytes":
        return ByteTokenizer()
    if kind in ("bpe", "pretrained"):
        path = directory / str(spec.get("file", BPE_FILE))
        if kind == "bpe":
            tok: BPETokenizer | PretrainedTokenizer = BPETokenizer.from_file(path)
        else:
            tok = PretrainedTokenizer.from_file(path, int(spec.get("eos_id", -1)), str(spec.get("name")))
        if tok.vocab_size != spec.get("vocab_size") or tok.eos_id != spec.get("eos_id"):
            raise DataError(f"{path}: does not match the manifest's tokenizer entry")
        return tok
    raise DataError(f"{directory}/manifest.json: unknown tokenizer kind {kind!r}")
