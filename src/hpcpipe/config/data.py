"""The ``data:`` section, and the one list of data formats (by kind of data)."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, model_validator

from hpcpipe.config.section import Section
from hpcpipe.config.synthetic import SyntheticMix

# The one list of the data formats hpcpipe's data packages read, by kind of data; a recipe
# declares the formats it reads (its data_formats) and each data package dispatches on its own
# kind's formats.
# Text read into token shards: tokens (text files, directories, JSON lines with data.text_field),
# parquet (data.text_field's column), chat (JSON lines of data.messages_field, rendered with the
# model's chat template: recipe hf-causal-lm).
TokenFormat = Literal["tokens", "parquet", "chat"]
ImageFormat = Literal[
    "cifar10", "cifar100", "cifar10-binary", "cifar100-binary", "idx", "fashion-mnist", "imagefolder"
]
FunctionCallingFormat = Literal["glaive", "openai", "hermes"]
DataFormat = Literal[TokenFormat, ImageFormat, FunctionCallingFormat]

TOKEN_FORMATS: tuple[str, ...] = get_args(TokenFormat)
IMAGE_FORMATS: tuple[str, ...] = get_args(ImageFormat)
FUNCTION_CALLING_FORMATS: tuple[str, ...] = get_args(FunctionCallingFormat)


class DataConfig(Section):
    """The data: its format and sources, the tokenizer, and how the prepared dataset is split,
    cached and staged."""

    format: DataFormat = Field(
        "tokens",
        description="tokens: text sources -> token shards (recipes gpt, hf-causal-lm); parquet: the "
        "data.text_field column of Parquet files; chat: JSON lines whose data.messages_field "
        "(a list of {role, content}) is rendered with the model's chat template (hf-causal-lm). "
        "Images (recipes resnet-cifar, torchvision-classifier), "
        "read from data.root: cifar10/cifar100 (the python-pickle batches, read with a restricted "
        "unpickler), cifar10-binary/cifar100-binary, idx (MNIST-style train-/t10k- IDX files, gzipped "
        "or not), fashion-mnist (idx; data.root defaults to Debian's dataset-fashion-mnist), "
        "imagefolder (root/train/<class>/*.png and root/test/<class>/*). Function-calling "
        "conversations (recipe lora-function-calling) from data.sources (JSONL): glaive (Glaive v2 "
        "system + chat rows), openai (messages + tools + tool_calls), hermes (<tool_call> conversations).",
    )
    synthetic_rows: int = Field(
        2000,
        ge=1,
        description="Function calling: rows the '@synthetic' source generates (realistic "
        "Glaive v2 rows, deterministic from run.seed).",
    )
    synthetic_mix: SyntheticMix = Field(
        default_factory=SyntheticMix,
        description="Function calling: what the '@synthetic' rows hold: relative weights of each "
        "conversation shape and the generator's knobs (docs/lora-function-calling.md: the training mix).",
    )
    packing: bool = Field(
        True,
        description="Function calling: pack several conversations into one model.seq_len "
        "sequence; attention never crosses a conversation boundary (block-diagonal mask, positions "
        "restart per conversation). false: one conversation per sequence, padded.",
    )
    root: str | None = Field(
        None, min_length=1, description="Directory of an image dataset (formats other than tokens)."
    )
    augment: bool = Field(
        True, description="Images: random crop with 4-pixel padding and horizontal flip in training."
    )
    max_train_samples: int | None = Field(
        None, ge=1, description="Images: train on the first N training samples only (null: all)."
    )
    max_eval_samples: int | None = Field(
        None, ge=1, description="Images: evaluate on the first N test samples (null: the whole test set)."
    )
    num_workers: int = Field(
        0,
        ge=0,
        description="Images, DatasetRecipe: DataLoader worker processes per rank "
        "(0: load in the training process).",
    )
    pin_memory: bool = Field(
        False, description="Images, DatasetRecipe: page-locked batches for faster host-to-GPU copies."
    )
    persistent_workers: bool = Field(
        False,
        description="Images, DatasetRecipe: keep DataLoader workers alive between epochs "
        "(needs num_workers > 0).",
    )
    prefetch_factor: int | None = Field(
        None,
        ge=1,
        description="Images, DatasetRecipe: batches each worker loads ahead (null: torch's default, 2; "
        "needs num_workers > 0).",
    )
    sources: list[str] = Field(
        default_factory=lambda: ["@stdlib"],
        description="Text files, directories, globs or JSONL files; '@stdlib' is the Python "
        "standard library source of the running interpreter.",
    )
    extensions: list[str] = Field(
        default_factory=lambda: [".py", ".txt", ".md", ".rst", ".jsonl"],
        description="File suffixes taken when a source is a directory.",
    )
    text_field: str = Field(
        "text", description="Field holding the text in JSONL sources; the column of Parquet ones."
    )
    messages_field: str = Field(
        "messages",
        min_length=1,
        description="format chat: the field of each JSON line holding the conversation, a list "
        "of {role, content} messages.",
    )
    max_bytes: int | None = Field(
        None, ge=1, description="Stop reading the corpus after this many bytes (null: all)."
    )
    tokenizer: Literal["bpe", "bytes"] = Field(
        "bpe", description="bpe: byte-level BPE trained locally; bytes: raw UTF-8 bytes."
    )
    vocab_size: int = Field(4096, ge=260, le=1 << 20, description="BPE vocabulary size.")
    val_fraction: float = Field(
        0.02, gt=0.0, lt=0.5, description="Fraction of documents held out for validation."
    )
    shard_tokens: int = Field(16 * 1024 * 1024, ge=1024, description="Tokens per .bin shard file.")
    prepared_dir: str = Field(
        "data/prepared",
        min_length=1,
        description="Where prepared datasets live; each in a sub-directory named by the hash "
        "of its inputs, so preparing again with the same inputs reuses it. Image datasets keep "
        "their hash manifest (written on first read) here too.",
    )
    cache_dir: str | None = Field(
        None,
        min_length=1,
        description="Node-local directory (NVMe) to read the dataset from: the prepared token "
        "shards (gpt) or the image files (resnet-cifar) are copied there once per node, into a "
        "sub-directory named by their manifest's SHA-256, verified, and read from there "
        "(`hpcpipe data stage`). null: read where they are.",
    )

    @model_validator(mode="after")
    def _workers_for_worker_options(self) -> DataConfig:
        if self.num_workers == 0 and (self.persistent_workers or self.prefetch_factor is not None):
            key = "persistent_workers" if self.persistent_workers else "prefetch_factor"
            raise ValueError(f"data.{key} needs data.num_workers > 0")
        return self
