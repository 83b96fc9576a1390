"""Loader: a deterministic global sample order that ranks share out, resume exactly, and reshard."""

from __future__ import annotations

import copy
import hashlib
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcpipe.config import DataConfig
from hpcpipe.data.tokens.loader import EvalWindows, TokenWindowLoader, WindowStore
from hpcpipe.data.tokens.shards import PreparedDataset, prepare_dataset
from hpcpipe.errors import ConfigError, DataError

T = 16  # seq_len in these tests


@pytest.fixture(scope="module")
def dataset(tiny_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> PreparedDataset:
    cfg = DataConfig(
        sources=[str(tiny_corpus)],
        tokenizer="bytes",
        shard_tokens=1024,  # many shards, so windows must respect shard ends
        val_fraction=0.05,
        prepared_dir=str(tmp_path_factory.mktemp("prepared")),
    )
    return prepare_dataset(cfg)


def _loader(
    ds: PreparedDataset,
    micro: int = 2,
    global_: int = 8,
    rank: int = 0,
    world: int = 1,
    seed: int = 7,
    seq_len: int = T,
) -> TokenWindowLoader:
    return TokenWindowLoader(ds, "train", seq_len, micro, global_, rank, world, seed)


def _draw(loader: TokenWindowLoader, n: int) -> torch.Tensor:
    """n micro-batches' inputs stacked: (n * micro, T)."""
    return torch.cat([loader.next_microbatch()[0] for _ in range(n)])


def _step(loaders: list[TokenWindowLoader]) -> torch.Tensor:
    """One optimizer step over all ranks, concatenated in rank order: (G, T)."""
    return torch.cat([_draw(ld, ld.grad_accum_steps) for ld in loaders])


def test_batches_are_shifted_windows_inside_one_shard(dataset: PreparedDataset) -> None:
    loader = _loader(dataset)
    x, y = loader.next_microbatch()
    assert x.shape == y.shape == (2, T) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    shards = [np.fromfile(p, dtype="<u2") for p in dataset.shard_paths("train")]
    per_shard = [(len(s) - 1) // T for s in shards]
    assert loader.num_windows == sum(per_shard)
    starts = np.cumsum([0, *per_shard])
    for row, window in enumerate(loader.step_windows(0)[:2].tolist()):
        shard = int(np.searchsorted(starts, window, side="right") - 1)
        local = (window - starts[shard]) * T
        tokens = torch.from_numpy(shards[shard][local : local + T + 1].astype(np.int64))
        assert torch.equal(x[row], tokens[:-1]) and torch.equal(y[row], tokens[1:])


def test_an_empty_shard_has_no_windows_and_shifts_none(dataset: PreparedDataset, tmp_path: Path) -> None:
    """A 0-token shard counted -1 windows: the shard starts went down, and window i was read from
    the shard of window i + 1 without a word."""
    shutil.copytree(dataset.path, tmp_path / "ds")
    (tmp_path / "ds" / "empty.bin").write_bytes(b"")
    manifest = copy.deepcopy(dataset.manifest)
    shards = manifest["splits"]["train"]["shards"]
    shards[1:1] = [{"file": "empty.bin", "tokens": 0, "sha256": hashlib.sha256(b"").hexdigest()}]
    with_empty = WindowStore(replace(dataset, path=tmp_path / "ds", manifest=manifest), "train", T)
    plain = WindowStore(dataset, "train", T)
    assert with_empty.num_windows == plain.num_windows
    every = np.arange(plain.num_windows)
    assert all(torch.equal(a, b) for a, b in zip(with_empty.gather(every), plain.gather(every), strict=True))


def test_same_seed_step_rank_give_the_same_batch(dataset: PreparedDataset) -> None:
    a, b = _loader(dataset), _loader(dataset)
    assert torch.equal(_draw(a, 12), _draw(b, 12))
    assert not torch.equal(_draw(_loader(dataset, seed=8), 4), _draw(_loader(dataset), 4))


def test_each_epoch_visits_every_window_once(dataset: PreparedDataset) -> None:
    loader = _loader(dataset, seq_len=400)  # few windows: several epochs in a few steps
    n = loader.num_windows
    seen = np.concatenate([loader.step_windows(s) for s in range(3 * n // 8 + 1)])
    for epoch in range(3):
        assert sorted(seen[epoch * n : (epoch + 1) * n].tolist()) == list(range(n))
    assert not np.array_equal(seen[:n], seen[n : 2 * n])  # a fresh order per epoch


def test_state_restores_exactly_mid_step_and_across_epochs(dataset: PreparedDataset) -> None:
    loader = _loader(dataset, seq_len=400)
    full_steps = loader.num_windows // 8  # in epoch 0
    _draw(loader, 4 * (full_steps - 1) + 2)  # mid-step, in the last full step of epoch 0
    state = loader.state_dict()
    assert state["offset"] == 4 and all(type(v) is int for v in state.values())
    resumed = _loader(dataset, seq_len=400)
    resumed.load_state_dict(state)
    assert torch.equal(_draw(resumed, 12), _draw(loader, 12))  # crosses into epoch 1
    assert loader.step * 8 > loader.num_windows


def test_ranks_split_the_global_batch_without_overlap(dataset: PreparedDataset) -> None:
    single = _loader(dataset, micro=2, global_=8)
    ranks = [_loader(dataset, micro=2, global_=8, rank=r, world=2) for r in range(2)]
    for step in range(3):
        w0, w1 = (ld.step_windows(step) for ld in ranks)
        assert not set(w0.tolist()) & set(w1.tolist())
        assert np.array_equal(np.concatenate([w0, w1]), single.step_windows(step))
        assert torch.equal(_step(ranks), _step([single]))


def test_state_from_two_ranks_resumes_on_one(dataset: PreparedDataset) -> None:
    ranks = [_loader(dataset, rank=r, world=2) for r in range(2)]
    for _ in range(3):
        _step(ranks)
    state = ranks[0].state_dict()
    assert state == ranks[1].state_dict()  # at a step boundary every rank holds the same state
    expected = _step(ranks)
    single = _loader(dataset, micro=4)
    single.load_state_dict(state)
    assert single.step == 3 and torch.equal(_step([single]), expected)


def test_mid_step_state_cannot_change_world_size(dataset: PreparedDataset) -> None:
    two = _loader(dataset, rank=0, world=2)
    two.next_microbatch()
    with pytest.raises(DataError, match="mid-step"):
        _loader(dataset).load_state_dict(two.state_dict())
    with pytest.raises(DataError, match="seed is 7, this run has 9"):
        _loader(dataset, seed=9).load_state_dict(two.state_dict())


def test_smaller_micro_batches_serve_the_same_samples(dataset: PreparedDataset) -> None:
    big, small = _loader(dataset, micro=4), _loader(dataset, micro=4)
    small.next_microbatch()  # an OOM on the second micro-batch: retry the step smaller
    small.rewind_step()
    small.set_micro_batch_size(1)
    assert small.grad_accum_steps == 8
    assert torch.equal(_draw(small, 8), _draw(big, 2))
    assert torch.equal(_draw(small, 8), _draw(big, 2))
    with pytest.raises(ConfigError, match="must divide"):
        small.set_micro_batch_size(3)


def test_batch_arithmetic_and_small_split_errors(dataset: PreparedDataset) -> None:
    with pytest.raises(ConfigError, match=r"train.global_batch_size \(10\)"):
        _loader(dataset, micro=4, global_=10)
    val_tokens = dataset.tokens("val")
    with pytest.raises(DataError, match=f"'val' split has {val_tokens} tokens.*seq_len"):
        TokenWindowLoader(dataset, "val", 5000, 1, 1, 0, 1, 0)


def test_eval_windows_are_fixed_and_sharded(dataset: PreparedDataset) -> None:
    single = EvalWindows(dataset, "val", T, 2, 4, 0, 1)
    first = [x for x, _ in single]
    assert len(single) == 4 and len(first) == 4
    assert all(torch.equal(a, b) for a, b in zip(first, [x for x, _ in single], strict=True))
    ranks = [EvalWindows(dataset.path, "val", T, 2, 2, r, 2) for r in range(2)]
    assert torch.equal(torch.cat([x for ev in ranks for x, _ in ev]), torch.cat(first))
    x, y = next(iter(single))
    assert torch.equal(x[:, 1:], y[:, :-1])
