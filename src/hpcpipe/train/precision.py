"""Mixed precision: autocast for bf16/fp16, a gradient scaler for fp16; under DeepSpeed, its engine's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from hpcpipe.compat import grad_scaler_scale
from hpcpipe.errors import ConfigError

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """Wraps autocast + loss scaling so the loop reads the same for fp32, bf16 and fp16."""

    def __init__(self, precision: str, device: torch.device, sharded: bool, engine: Any = None) -> None:
        if precision not in ("fp32", *_DTYPES):
            raise ConfigError(f"train.precision: unknown precision {precision!r}")
        if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError("train.precision=bf16 is not supported by this GPU; use fp16 or fp32")
        self.name = precision
        self.device = device
        self.dtype = _DTYPES.get(precision)
        self.scaler: torch.amp.GradScaler | None = None
        # A DeepSpeed engine casts the model to bf16/fp16 itself, keeps fp32 master weights and
        # scales fp16 losses: no scaler here, backward through the engine. Autocast stays: it
        # casts floating inputs (images) to the parameters' dtype at each matmul/convolution.
        self.engine = engine
        self.skips = SkippedSteps()
        if precision == "fp16" and engine is None:
            if sharded:
                # Sharded gradients need the inf/nan check all-reduced across ranks.
                from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

                self.scaler = ShardedGradScaler(device.type)
            else:
                self.scaler = torch.amp.GradScaler(device.type)

    @property
    def skips_overflows(self) -> bool:
        """fp16's loss scaling (the GradScaler's, or DeepSpeed's) skips a step whose gradients are
        not finite and lowers the scale: such a gradient norm is no divergence."""
        return self.name == "fp16"

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.dtype is None:
            yield
            return
        with torch.autocast(device_type=self.device.type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        if self.engine is not None:
            # The loop already divided the loss by the accumulation steps.
            self.engine.backward(loss, scale_wrt_gas=False)
        elif self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to true scale before clipping."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None:
            if self.skips.starting:  # this process's first update: the scale it starts from
                self.skips.copy_scale(self.scaler)
            self.scaler.step(optimizer)
            self.scaler.update()
            self.skips.copy_scale(self.scaler)
        else:
            optimizer.step()

    @property
    def skipped_steps(self) -> int:
        """Steps whose update the GradScaler skipped, up to the last one (0 without a scaler)."""
        return self.skips.count() if self.scaler is not None else 0

    def skipped_row(self) -> dict[str, int]:
        """For a metrics row: the skipped steps so far, under a GradScaler."""
        return {"skipped_steps": self.skipped_steps} if self.scaler is not None else {}


class SkippedSteps:
    """The optimizer steps fp16's GradScaler skipped (gradients not finite). They must not count
    as updates: the LR schedule follows the updates taken, as Megatron-LM's, or a run whose first
    steps overflow (a large initial scale) used up its warm-up without a single update. A skip is
    read off the scale, which update() lowers after a skipped step only. The scale stays on the
    device: each step's is copied to the host without waiting and read when the count is next
    asked for (the next step's LR, a log, a save). On CUDA that read waits for the copy's event:
    every step, setting the LR waits for the previous step's update, once this step's forward
    and backward are queued behind it. The device works through those meanwhile, so it idles
    only when they take it less time than the host takes to queue the optimizer step (a model
    small enough for the host to be the limit anyway); the host stays within a step of the
    device."""

    def __init__(self) -> None:
        self.skipped = 0
        self.in_a_row = 0  # the skips since the last update (train/divergence.py stops at too many)
        self.starting = True  # no scale copied yet: the first one is the scale before any update
        self.scale: float | None = None  # the last one read
        self._pending: list[tuple[torch.Tensor, Any]] = []  # (copy, its event on CUDA)

    def restart(self, skipped: int) -> None:
        """A resume: the checkpoint's count, from this process's first update on."""
        self.skipped, self.starting, self.scale, self._pending = skipped, True, None, []
        self.in_a_row = 0

    def copy_scale(self, scaler: torch.amp.GradScaler) -> None:
        scale = grad_scaler_scale(scaler)  # the device tensor (get_scale() would wait for it)
        if scale is None:  # not in use yet: nothing to count against
            return
        self.starting = False
        copy = scale.detach().to("cpu", non_blocking=True, copy=True)  # (on CPU too: update() is in place)
        done = None
        if scale.is_cuda:
            done = torch.cuda.Event()
            done.record()
        self._pending.append((copy, done))

    def count(self) -> int:
        for copy, done in self._pending:
            if done is not None:
                done.synchronize()
            scale = float(copy)
            if self.scale is not None:  # each copy after the first follows one update() (a step)
                skipped = scale < self.scale
                self.skipped += skipped
                self.in_a_row = self.in_a_row + 1 if skipped else 0
            self.scale = scale
        self._pending.clear()
        return self.skipped
