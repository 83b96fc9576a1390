"""A user's datasets as lineage sees them (``hpcpipe.DatasetRecipe.dataset_hash``), and what the
loader and the trainer say about items and losses they cannot use."""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils.data import TensorDataset

from hpcpipe.data.fingerprint import datasets_fingerprint
from hpcpipe.data.map_style import collate_tuple
from hpcpipe.errors import DataError, UserError
from hpcpipe.recipes.base import checked_loss


class Augmented(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A random augmentation in __getitem__ (torch's and Python's generators)."""

    def __init__(self, order: list[int]) -> None:
        self.order = order

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.full((3,), float(self.order[index])) + torch.rand(3) + random.random()
        return x, torch.tensor(self.order[index])


def test_the_fingerprint_sees_other_data_and_not_a_random_augmentation() -> None:
    """No fingerprint: a resume in a process whose data came out in another order (a set of
    strings under another PYTHONHASHSEED) trained on without a word."""
    order = list(range(20))
    first = datasets_fingerprint([Augmented(order), Augmented(order[:5])])
    state = (torch.random.get_rng_state(), random.getstate())
    assert datasets_fingerprint([Augmented(order), Augmented(order[:5])]) == first  # augmentation seeded
    assert torch.equal(torch.random.get_rng_state(), state[0]) and random.getstate() == state[1]
    assert datasets_fingerprint([Augmented(order[::-1]), Augmented(order[:5])]) != first
    assert datasets_fingerprint([Augmented(order[:19]), Augmented(order[:5])]) != first
    plain = TensorDataset(torch.arange(8.0).reshape(4, 2), torch.arange(4))
    assert len(datasets_fingerprint([plain, plain])) == 64


def test_items_the_trainer_cannot_move_and_a_loss_per_sample_are_named() -> None:
    """A dict item failed in the trainer's _to_device ("'dict' object has no attribute 'to'"); a
    loss with reduction='none' failed in the first evaluation ("shape '[]' is invalid")."""
    with pytest.raises(DataError, match="collates to dict, not tensors: return a tuple"):
        collate_tuple([{"x": torch.zeros(2)}, {"x": torch.ones(2)}])
    assert len(collate_tuple([(torch.zeros(2), 1), (torch.ones(2), 0)])) == 2
    with pytest.raises(UserError, match=r"loss\(\) returned \(8, 1\): return one number"):
        checked_loss(torch.zeros(8, 1))
    assert checked_loss(torch.tensor(1.5)).item() == 1.5
    assert checked_loss(torch.tensor([1.5])).shape == ()  # one number in another shape trains


def test_the_fingerprint_reads_images_by_their_pixels_and_leaves_the_gpus_generators(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A PIL image was hashed by its repr ('... at 0x7F...'): another fingerprint in every process,
    a false dataset_changed note on every resume. torch.manual_seed(0) reseeded every GPU: rank 0's
    dropout then ignored run.seed and the checkpoint's random state."""
    from PIL import Image

    class Opaque:  # a default repr, with its address
        pass

    def images(value: int) -> list[tuple[Image.Image, Opaque]]:
        return [(Image.new("L", (4, 4), color=value), Opaque()) for _ in range(3)]

    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: pytest.fail("reseeded the GPUs"))
    assert datasets_fingerprint([images(7)]) == datasets_fingerprint([images(7)])
    assert datasets_fingerprint([images(7)]) != datasets_fingerprint([images(8)])
