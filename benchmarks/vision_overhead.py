"""hpcpipe's ResNet-18 DDP training vs a hand-written torchvision DDP loop, side by side in one run.

Two gloo ranks (``--nproc``) each build both: hpcpipe's Trainer on the ``resnet-cifar`` recipe,
and what a researcher writes by hand: torchvision ``resnet18`` with the same stem, a torch
``DataLoader`` with ``DistributedSampler`` and torchvision v2 transforms (random crop with
padding 4, horizontal flip, normalisation), DDP, SGD with Nesterov momentum and the same LR
schedule. Same images (a generated CIFAR-10 on disk), same batch, same threads. Timed blocks
alternate (hpcpipe, raw, raw, hpcpipe, ...) so drift hits both; the ratio of the median
images/s is the result (target >= 0.95).

``--knobs`` then measures hpcpipe alone with one setting changed against its baseline, in
alternating blocks too: DataLoader workers (with pinned memory off on CPU, persistent workers,
prefetch), channels_last, and bf16 autocast; it prints each gain over the baseline.

    .venv/bin/python benchmarks/vision_overhead.py [--repeats 7] [--steps 4] [--knobs]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddp_harness import SampledBatches, finish, join_group, ranks_fork_from_here, spawn, trainer_for
from harness import block_parser, compare_loops, parse_with_smoke, report_pair, trainer_loop
from hpcpipe.config import JobConfig, load_config
from hpcpipe.data.images.generator import write_dataset
from hpcpipe.netutil import free_port
from hpcpipe.train.schedule import lr_at

KNOBS = {
    "workers=2, persistent, prefetch 4": [
        "data.num_workers=2",
        "data.persistent_workers=true",
        "data.prefetch_factor=4",
    ],
    "workers=1, persistent": ["data.num_workers=1", "data.persistent_workers=true"],
    "channels_last": ["train.channels_last=true"],
    "bf16 autocast": ["train.precision=bf16"],
}


def job_for(args: argparse.Namespace, root: Path, out: Path, extra: list[str]) -> JobConfig:
    return load_config(
        "resnet-tiny",
        [
            f"data.root={root}",
            f"data.prepared_dir={out}/prepared",
            "data.max_train_samples=null",
            f"model.variant={args.variant}",
            f"train.steps={10**6}",
            f"train.micro_batch_size={args.batch}",
            f"train.global_batch_size={args.batch * args.nproc}",
            "train.eval_every=0",
            "observe.progress=false",
            f"observe.log_every={10**6}",
            f"parallel.nproc={args.nproc}",
            f"run.out_dir={out}",
            *extra,
        ],
    )


class RawLoop:
    """Hand-written torchvision + DDP training, the way the torchvision references do it."""

    def __init__(self, job: JobConfig, root: Path, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        from torch.nn.parallel import DistributedDataParallel
        from torchvision.models import resnet18
        from torchvision.transforms import v2

        from hpcpipe.data.images.formats import read_splits

        torch.manual_seed(job.run.seed)
        model = resnet18(num_classes=10)
        if job.model.variant == "resnet18":
            model.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
            model.maxpool = torch.nn.Identity()
        self.model = DistributedDataParallel(model)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        rest = [p for p in model.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.SGD(
            [
                {"params": decay, "weight_decay": job.train.weight_decay},
                {"params": rest, "weight_decay": 0.0},
            ],
            lr=job.train.lr,
            momentum=job.train.momentum,
            nesterov=True,
        )
        split = read_splits("cifar10", root)["train"]
        transform = v2.Compose(
            [
                v2.RandomCrop(32, padding=4),
                v2.RandomHorizontalFlip(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(list(mean), list(std)),
            ]
        )
        dataset = [(torch.from_numpy(img), int(y)) for img, y in zip(split.images, split.labels, strict=True)]  # type: ignore[arg-type]
        self.batches = SampledBatches(
            _Transformed(dataset, transform),
            job.train.micro_batch_size,
            dist.get_rank(),
            dist.get_world_size(),
            job.run.seed,
        )
        self.job, self.step = job, 0

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step += 1
            for group in self.optimizer.param_groups:
                group["lr"] = lr_at(self.step, self.job.train)
            x, y = self.batches.next()
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)


class _Transformed(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, items: list[tuple[torch.Tensor, int]], transform: Any) -> None:
        self.items, self.transform = items, transform

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, label = self.items[index]
        return self.transform(image), label


def worker(rank: int, args: argparse.Namespace, port: int, root: Path, out: Path) -> None:
    job = job_for(args, root, out, [])
    ctx = join_group(rank, args.nproc, port, job.parallel)
    images = args.batch * args.nproc
    trainer = trainer_for(job, ctx, out / "hpcpipe")
    info = trainer.recipe.info  # type: ignore[attr-defined]
    raw = RawLoop(job, root, info.mean, info.std)
    ours = trainer_loop(trainer)
    loops = {"hpcpipe": ours, "raw": raw.run}
    result: dict[str, Any] = compare_loops(loops, args.repeats, args.steps, images)
    if args.knobs:
        result["knobs"] = {}
        for name in args.knob:
            sets = KNOBS[name]
            other = trainer_for(job_for(args, root, out, sets), ctx, out / name.replace(" ", "_"))
            pair = {"baseline": ours, "changed": trainer_loop(other)}
            result["knobs"][name] = compare_loops(pair, args.knob_repeats, args.steps, images)
            other.close()
    trainer.close()
    finish(rank, result, out)


def main() -> None:
    parser = block_parser(__doc__, repeats=7, steps=4)
    parser.add_argument("--nproc", type=int, default=2, help="DDP ranks (gloo on CPU)")
    parser.add_argument("--knob-repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32, help="images per rank per step")
    parser.add_argument("--variant", default="resnet18-imagenet", choices=["resnet18", "resnet18-imagenet"])
    parser.add_argument(
        "--knobs", action="store_true", help="also measure DataLoader workers, channels_last, bf16"
    )
    parser.add_argument("--images", type=int, default=2048, help="training images generated")
    parser.add_argument(
        "--knob", nargs="+", choices=list(KNOBS), default=list(KNOBS), help="with --knobs: these only"
    )
    # --smoke: the knobs' path too (make bench measures them), on 64 images, with the knob that
    # starts DataLoader workers inside a rank: the one path of --knobs that once hung while every
    # smoke run passed (the ranks' fork server handed them a held lock, launch/fork_server.py)
    toy = {"repeats": 1, "steps": 1, "batch": 2, "images": 64}
    toy |= {"knobs": True, "knob_repeats": 1, "knob": ["workers=1, persistent"]}
    args = parse_with_smoke(parser, toy)
    ranks_fork_from_here()

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        root = write_dataset("cifar10", out / "cifar10", n_train=args.images, n_test=64)
        result = spawn(worker, (args, free_port(), root, out), args.nproc, out)

    print(
        f"{args.nproc} gloo ranks, {args.variant}, {args.batch} images/rank/step, "
        f"{args.repeats} repeats x {args.steps} steps, interleaved"
    )
    knobs = {}
    for name, runs in result.get("knobs", {}).items():
        knobs[name] = round(statistics.median(runs["changed"]) / statistics.median(runs["baseline"]), 4)
    notes = [f"knob {name:<36} {gain:.3f}x over num_workers=0/fp32/NCHW" for name, gain in knobs.items()]
    fields = {
        "nproc": args.nproc,
        "variant": args.variant,
        "batch_per_rank": args.batch,
        "repeats": args.repeats,
        "steps": args.steps,
        "knob_gains": knobs,
    }
    report_pair("vision_overhead", result, ("img/s", "images_per_s"), 0.95, fields, notes=notes)


if __name__ == "__main__":
    main()
