"""Image batches: every sample once per epoch over the ranks, exact resume with workers, evaluation
that covers the test split once with equal batch counts, and ResNet shapes and metrics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hpcpipe.config import DataConfig, load_config
from hpcpipe.data.images.formats import read_splits
from hpcpipe.data.images.generator import write_dataset
from hpcpipe.data.images.loader import IGNORE_LABEL, ImageEvalBatches, ImageSamples, ImageTrainLoader
from hpcpipe.data.order import SampleOrder


@pytest.fixture(scope="module")
def cifar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset("cifar10", tmp_path_factory.mktemp("img") / "c", n_train=60, n_test=21)


def test_no_sample_is_duplicated_or_dropped_across_ranks_in_an_epoch() -> None:
    n, world, global_batch = 53, 2, 8
    orders = [SampleOrder(n, 2, global_batch, rank, world, seed=5) for rank in range(world)]
    for epoch in range(3):
        served: list[int] = []
        for order in orders:
            positions = np.concatenate([order.step_positions(s) for s in range(20)])
            in_epoch = positions[(positions >= epoch * n) & (positions < (epoch + 1) * n)]
            served += order.items(in_epoch).tolist()
        assert sorted(served) == list(range(n)), f"epoch {epoch}"
    single = SampleOrder(n, 2, global_batch, 0, 1, seed=5)
    both = np.concatenate(
        [orders[0].items(orders[0].step_positions(3)), orders[1].items(orders[1].step_positions(3))]
    )
    assert np.array_equal(both, single.items(single.step_positions(3)))


def test_augmentation_depends_on_seed_and_position_only(cifar: Path) -> None:
    split = read_splits("cifar10", cifar)["train"]
    samples = ImageSamples(split, seed=1, augment=True)
    a, _ = samples[(3, 17)]
    b, _ = samples[(3, 17)]
    assert torch.equal(a, b) and a.shape == (3, 32, 32) and a.dtype == torch.uint8
    others = [samples[(3, p)][0] for p in range(18, 30)]
    assert any(not torch.equal(a, o) for o in others)
    plain, label = ImageSamples(split, seed=1, augment=False)[(3, 17)]
    assert torch.equal(plain, torch.from_numpy(split.images[3])) and label == split.labels[3]  # type: ignore[index]


def _loader(
    cifar: Path, workers: int, rank: int = 0, world: int = 1, persistent: bool = False
) -> ImageTrainLoader:
    split = read_splits("cifar10", cifar)["train"]
    cfg = DataConfig(format="cifar10", root=str(cifar), num_workers=workers, persistent_workers=persistent)
    return ImageTrainLoader(
        split, cfg, micro_batch_size=4, global_batch_size=16, rank=rank, world_size=world, seed=7
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("persistent", [False, True])
def test_resume_with_workers_is_bitwise_exact_across_epochs(cifar: Path, persistent: bool) -> None:
    reference = _loader(cifar, workers=0)
    expected = [reference.next_microbatch() for _ in range(40)]  # 160 samples: 2.7 epochs of 60
    first = _loader(cifar, workers=2, persistent=persistent)
    got = [first.next_microbatch() for _ in range(13)]
    state = first.state_dict()
    first.close()
    resumed = _loader(cifar, workers=2, persistent=persistent)
    resumed.load_state_dict(state)
    got += [resumed.next_microbatch() for _ in range(27)]
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        assert torch.equal(x, ex) and torch.equal(y, ey)
    resumed.close()


def test_oom_shrink_mid_epoch_serves_the_same_samples(cifar: Path) -> None:
    loader = _loader(cifar, workers=0)
    start = loader.state_dict()
    whole = torch.cat([loader.next_microbatch()[1] for _ in range(4)])
    loader.load_state_dict(start)
    loader.set_micro_batch_size(2)
    halves = torch.cat([loader.next_microbatch()[1] for _ in range(8)])
    assert torch.equal(whole, halves)


def test_eval_batches_cover_the_test_split_once_with_equal_counts(cifar: Path) -> None:
    split = read_splits("cifar10", cifar)["test"]  # 21 samples over 4 ranks: 6, 6, 6, 3
    per_rank = [list(ImageEvalBatches(split, micro_batch_size=4, rank=r, world_size=4)) for r in range(4)]
    assert {len(batches) for batches in per_rank} == {2}
    labels = torch.cat([y for batches in per_rank for _, y in batches])
    valid = labels[labels != IGNORE_LABEL]
    assert len(valid) == 21 and torch.equal(
        torch.sort(valid).values, torch.sort(torch.as_tensor(split.labels)).values
    )
    tiny = list(ImageEvalBatches(split.subset(1), micro_batch_size=4, rank=1, world_size=2))
    assert len(tiny) == 1 and tiny[0][1].tolist() == [IGNORE_LABEL]


def _forward_flops(variant: str, channels: int, size: int) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    from hpcpipe.models.resnet import build_resnet18

    model = build_resnet18(variant, channels, num_classes=7)
    with FlopCounterMode(display=False) as counter:
        assert model(torch.randn(2, channels, size, size)).shape == (2, 7)
    return counter.get_total_flops() / 2


def test_resnet_shapes_and_forward_flops() -> None:
    from hpcpipe.models.resnet import build_resnet18, stages

    # The CIFAR ResNet-18's published cost: 0.56 GMACs per 32x32 image (FLOPs = 2 x MACs).
    assert _forward_flops("resnet18", 3, 32) == pytest.approx(2 * 0.556e9, rel=0.02)
    # The ImageNet stem shrinks the feature map 4x before layer1: >10x cheaper on 28x28 images.
    assert _forward_flops("resnet18", 1, 28) > 10 * _forward_flops("resnet18-imagenet", 1, 28)
    small = build_resnet18("resnet18", 1, 10)
    assert small.conv1.kernel_size == (3, 3) and small.conv1.stride == (1, 1) and small.conv1.in_channels == 1
    assert isinstance(small.maxpool, torch.nn.Identity) and len(stages(small)) == 4
    big = build_resnet18("resnet18-imagenet", 3, 10)
    assert big.conv1.kernel_size == (7, 7) and isinstance(big.maxpool, torch.nn.MaxPool2d)


def test_recipe_eval_sums_skip_padding_and_count_top1(cifar: Path, tmp_path: Path) -> None:
    from hpcpipe.recipes.resnet import ResNetRecipe

    job = load_config("resnet-tiny", [f"data.root={cifar}", f"data.prepared_dir={tmp_path}"])
    recipe = ResNetRecipe.from_job(job)

    class Fixed(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tensor([[5.0, 0.0], [0.0, 5.0], [5.0, 0.0]])

    images = torch.zeros((3, 3, 32, 32), dtype=torch.uint8)
    sums = recipe.eval_sums(Fixed(), (images, torch.tensor([0, 0, IGNORE_LABEL])))
    assert (int(sums["correct"]), int(sums["count"])) == (1, 2)
    metrics = recipe.eval_metrics({k: float(v) for k, v in sums.items()})
    assert metrics["val_acc"] == 0.5 and metrics["val_loss"] == pytest.approx(sums["loss"].item() / 2)
    assert recipe.samples_per_epoch() == 60 and recipe.flops_per_sample() == pytest.approx(
        3 * _forward_flops("resnet18-imagenet", 3, 32), rel=1e-3
    )
