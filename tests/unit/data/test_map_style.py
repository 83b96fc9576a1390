"""hpcpipe's loader over a user's map-style dataset (``DatasetRecipe``): the same micro-batches from
the same (seed, step, rank), whatever ran before, whichever DataLoader worker reads them and at
any world size; resumable from its state; evaluation shards every sample exactly once, with the
same number of batches on every rank."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from hpcpipe.config import DataConfig, apply_values, load_config
from hpcpipe.data.map_style import MapStyleEvalBatches, MapStyleTrainLoader, SeededSamples, collate_tuple
from hpcpipe.errors import DataError
from hpcpipe.recipes import build_recipe
from hpcpipe.recipes.base import PaddingBatch

N = 40


class Augmented(Dataset[Any]):
    """Item i: (i, a random draw from torch's global generator, as an augmentation would)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(i), torch.rand(())


def _loader(rank: int = 0, world: int = 1, workers: int = 0, seed: int = 3) -> MapStyleTrainLoader:
    cfg = DataConfig(num_workers=workers)
    return MapStyleTrainLoader(SeededSamples(Augmented(), seed), N, cfg, 4, 8, rank, world, seed)


def _take(loader: MapStyleTrainLoader, n: int) -> list[tuple[torch.Tensor, ...]]:
    return [loader.next_microbatch() for _ in range(n)]


def test_the_same_seed_gives_the_same_batches_and_augmentations_whatever_ran_before() -> None:
    first = _take(_loader(), 12)  # 6 steps: past the end of the first epoch (5 steps)
    torch.rand(100)  # the trainer's own random stream moves on
    second = _take(_loader(), 12)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    items = torch.cat([b[0] for b in first[:10]])
    assert sorted(items.tolist()) == list(range(N))  # one epoch: every item once
    assert not torch.equal(_take(_loader(seed=4), 1)[0][0], first[0][0])


def test_dataloader_workers_read_the_same_samples_and_draws() -> None:
    in_process = _take(_loader(), 6)
    with_workers = _take(_loader(workers=2), 6)
    for a, b in zip(in_process, with_workers, strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


class Unreadable(Augmented):
    """Items Pillow cannot decode (``undecodable``), or that are not tensors."""

    def __init__(self, undecodable: bool) -> None:
        self.undecodable = undecodable

    def __getitem__(self, i: int) -> Any:
        if self.undecodable:
            raise DataError(f"/data/train/{i}.png: cannot decode image (truncated)")
        return {"not": "tensors"}


@pytest.mark.parametrize("workers", [0, 1])
def test_a_data_error_in_a_worker_is_its_own_one_line(workers: int) -> None:
    """torch re-raises a worker's exception with the worker's traceback as its message: the run
    ended with that text as its "one line" instead of the file to fix."""
    for undecodable, needle in [(True, ".png: cannot decode image (truncated)"), (False, "collates to dict")]:
        cfg = DataConfig(num_workers=workers)
        loader = MapStyleTrainLoader(SeededSamples(Unreadable(undecodable), 0), N, cfg, 1, 1, 0, 1, seed=0)
        with pytest.raises(DataError) as err:
            loader.next_microbatch()
        message = str(err.value)
        assert message.startswith("/data/train/" if undecodable else "a dataset item") and needle in message
        assert "\n" not in message and "Traceback" not in message
        loader.close()


def test_a_loader_resumes_from_its_state_and_the_global_batch_is_the_same_at_two_ranks() -> None:
    loader = _loader()
    _take(loader, 4)  # two steps
    state = loader.state_dict()
    expected = _take(loader, 4)
    resumed = _loader()
    resumed.load_state_dict(state)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(expected, _take(resumed, 4), strict=True))
    one = torch.cat([b[0] for b in _take(_loader(), 2)])  # step 1, one rank
    two = torch.cat([b[0] for rank in range(2) for b in _take(_loader(rank, 2), 1)])
    assert torch.equal(one, two)


@pytest.mark.parametrize(("n", "world"), [(10, 3), (2, 4), (8, 2)])
def test_evaluation_counts_every_sample_once_with_as_many_batches_on_every_rank(n: int, world: int) -> None:
    data = TensorDataset(torch.arange(n))
    per_rank = [list(MapStyleEvalBatches(data, 3, rank, world, collate_tuple)) for rank in range(world)]
    assert len({len(batches) for batches in per_rank}) == 1
    counted = [
        int(v) for batches in per_rank for b in batches if not isinstance(b, PaddingBatch) for v in b[0]
    ]
    assert sorted(counted) == list(range(n))


def test_a_dataset_recipe_checks_its_datasets_before_training() -> None:
    job = apply_values(load_config("tiny"), {"run.recipe": "tests.recipes_for_tests:EmptyData"})
    with pytest.raises(DataError, match="recipe 'empty-data': the train dataset is empty"):
        build_recipe(job).prepare(progress=False)


def test_a_dataset_recipe_counts_its_flops_on_the_meta_device() -> None:
    job = apply_values(
        load_config("tiny"), {"run.recipe": "tests.recipes_for_tests:Tiny", "recipe.hidden": 8}
    )
    recipe = build_recipe(job)
    # forward: (1 x 4) @ (4 x 8) and (1 x 8) @ (8 x 1), 2 FLOPs per multiply-add; training: 3x that
    assert recipe.flops_per_sample() == 3 * 2 * (4 * 8 + 8 * 1)
