"""A prepared token dataset in a few figures: ``hpcpipe data prepare`` / ``verify`` print them."""

from __future__ import annotations

from typing import Any

from hpcpipe.data.tokens.shards import SPLITS, PreparedDataset
from hpcpipe.recipes.base import DataSummary


def dataset_details(dataset: PreparedDataset) -> dict[str, Any]:
    """Where it is, its identity, its tokenizer, and documents, tokens and shards per split."""
    manifest = dataset.manifest
    return {
        "path": str(dataset.path),
        "fingerprint": dataset.fingerprint,
        "manifest_sha256": dataset.manifest_sha256,
        "dtype": manifest["dtype"],
        "tokenizer": {key: manifest["tokenizer"][key] for key in ("kind", "name", "vocab_size", "eos_id")},
        "splits": {
            split: {
                "documents": dataset.documents(split),
                "tokens": dataset.tokens(split),
                "shards": len(dataset.shards(split)),
            }
            for split in SPLITS
        },
    }


def dataset_summary(dataset: PreparedDataset) -> DataSummary:
    """``dataset_details`` with a headline and a table per split."""
    tok = dataset.manifest["tokenizer"]
    details = dataset_details(dataset)
    rows = tuple(
        (split, f"{c['documents']:,}", f"{c['tokens']:,}", str(c["shards"]))
        for split, c in details["splits"].items()
    )
    verb = "reused" if dataset.reused else "prepared"
    return DataSummary(
        headline=f"{verb} [bold]{dataset.path}[/]",
        columns=("split", "documents", "tokens", "shards"),
        rows=rows,
        title=f"tokenizer {tok['name']} (EOS {tok['eos_id']})",
        details=details | {"reused": dataset.reused},
    )
