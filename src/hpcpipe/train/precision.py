"""Mixed precision: autocast for bf16/fp16, a gradient scaler for fp16; under DeepSpeed, its engine's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

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
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
