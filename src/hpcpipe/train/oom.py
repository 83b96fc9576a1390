"""Out-of-memory recovery: every rank agrees, halves the micro-batch, doubles accumulation, retries.

The global batch (``micro x accum x world``) and therefore the update stay the same for a loss
averaged over samples, in a model without BatchNorm (whose statistics are then taken over half
the samples); only the number of forward/backward passes per step changes.

Why agreement needs a protocol
------------------------------
An OOM is raised on ONE rank. If that rank jumps to the agreement all-reduce while another rank
is inside a collective the OOMing rank skipped (a DDP gradient all-reduce in backward, an FSDP2
all-gather in forward), the two ranks wait in different collectives: a deadlock (or, on NCCL,
mismatched buffers). So an OOM is recovered in-process only where the ranks' collective
sequences still match, and every rank reaches the agreement at the same point of every
micro-step. The rule per strategy (``OOMGuard.attach`` infers it from the wrapped model):

=========  ==============================================  ======================================
strategy   forward OOM is recoverable when ...              backward OOM is recoverable when ...
=========  ==============================================  ======================================
single     always                                           always
DDP        raised after DDP's pre-forward collectives       the micro-step is not the last one
           (buffer broadcast, bucket rebuild): always in    (``no_sync``: no collective inside);
           the model's own code                             never on the last one (all-reduce)
FSDP2      raised after every FSDP unit issued its          never (all-gathers and reduce-scatters
           forward all-gather: in the last unit's compute,  run inside every backward)
           the final norm, the output head and the loss
           (where an LM's activation memory peaks)
=========  ==============================================  ======================================

The "after the collectives" condition is a *fence*: ``attach`` registers a forward pre-hook on
every module whose pre-forward issues collectives (DDP: the wrapped module, whose hook runs after
DDP's ``_pre_forward``; FSDP2: the root and every shard unit, after FSDP's own prepended hook);
the fence is passed once all of them ran in the current micro-step. An OOM outside the
recoverable regions is re-raised as ``OOMNotRecoverable``: the worker exits non-zero and the
elastic agent restarts every rank from the last checkpoint (the other ranks may be blocked in a
collective; the agent tears them down).

The protocol the trainer follows (``micro_step`` implements one micro-step of it)
------------------------------------------------------------------------------
At the start of a step: ``snapshot = loader.state_dict()``. Then, for each micro-step ``m`` of
``guard.accum_steps`` (``final = m == accum_steps - 1``), inside ``gradient_sync(model, final)``:

1. ``loss = forward()`` (the loss already divided by ``guard.accum_steps``), OOM caught.
2. If the backward is collective-free (table above): ``backward(loss)``, OOM caught; skipped
   when the forward ran out of memory.
3. AGREE: one all-reduce (MAX) of one int64 (``rank + 1`` if this rank ran out of memory, else
   0): every rank reaches it exactly once per micro-step, so the collective sequences match.
4. If the backward has collectives (DDP's last micro-step, FSDP2): ``backward(loss)`` now, after
   the agreement; an OOM here is escalated as ``OOMNotRecoverable``.

If the agreement says some rank ran out of memory, EVERY rank abandons the step and calls
``recover(step, optimizer, loader, snapshot)``: zero gradients, reset DDP's reducer / FSDP2's
iteration state (a forward without its backward leaves them armed), restore the loader to the
step's start, shrink, set the loader's micro-batch, free cached memory. Then the step is retried
from micro-step 0 with the new ``accum_steps``. ``recover`` returns the event for
``events.jsonl``.

Cost: one 1-element all-reduce per micro-step while recovery is enabled (none when disabled).
Reading the result on the host synchronises the device stream when the all-reduce runs on the
GPU; on CUDA pass ``max_over_ranks(gloo_group)`` with a CPU ``dist.new_group(backend="gloo")``
so the agreement costs one small TCP round trip and no device synchronisation.

Shrink rule: only an even micro-batch is halved (so ``micro x accum`` stays exactly the same);
an odd one greater than 1, or 1 itself, ends with a ``ConfigError`` naming
``train.micro_batch_size``. Powers of two therefore give the most retries.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from hpcpipe import compat
from hpcpipe.errors import ConfigError

if TYPE_CHECKING:
    from hpcpipe.train.distributed import DistContext

AllReduceMax = Callable[[torch.Tensor], torch.Tensor]
"""All-reduce a tensor with MAX over the ranks and return the result (in place or a new tensor)."""

# RuntimeError messages that mean "an allocation failed" when the exception type doesn't say so:
# older CUDA paths, cuBLAS/cuDNN workspace allocation, and the CPU allocator (CPU training).
_OOM_MARKERS = (
    "out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "can't allocate memory",
)


class SimulatedOOM(torch.OutOfMemoryError):
    """An injected out-of-memory error (``hpcpipe.chaos``), so recovery is tested on CPU.

    A subclass of ``torch.OutOfMemoryError``: any ``except torch.OutOfMemoryError`` treats it
    exactly like a real CUDA OOM.
    """


class OOMNotRecoverable(RuntimeError):
    """An OOM where the ranks cannot agree in-process (collectives in flight): restart instead."""


class _Loader(Protocol):
    """What recovery needs from the training loader (a subset of the Recipe's TrainLoader)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def set_micro_batch_size(self, micro_batch_size: int) -> None: ...


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is a device (or host allocator) out-of-memory error worth a retry."""
    if isinstance(exc, OOMNotRecoverable):
        return False  # already judged; never retried
    if isinstance(exc, torch.OutOfMemoryError):  # also torch.cuda.OutOfMemoryError, SimulatedOOM
        return True
    return isinstance(exc, RuntimeError) and any(marker in str(exc) for marker in _OOM_MARKERS)


def free_memory() -> None:
    """Drop unreachable tensors and return cached device blocks, so the retry starts clean."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def max_over_ranks(
    group: torch.distributed.ProcessGroup | None = None, device: torch.device | None = None
) -> AllReduceMax:
    """An ``AllReduceMax`` over ``group`` (default: the world), run on ``device`` (default: as is).

    The result comes back on the CPU. For a CUDA job, a gloo ``group`` keeps the tensor on the
    CPU: no device synchronisation per call.
    """
    import torch.distributed as dist

    def reduce(tensor: torch.Tensor) -> torch.Tensor:
        moved = tensor if device is None else tensor.to(device)
        dist.all_reduce(moved, op=dist.ReduceOp.MAX, group=group)
        return moved.cpu()

    return reduce


def agree_any(flag: int, all_reduce_max: AllReduceMax | None) -> int:
    """The maximum of ``flag`` over ranks (``flag`` itself for a single process)."""
    if all_reduce_max is None:
        return flag
    return int(all_reduce_max(torch.tensor([flag], dtype=torch.int64)).item())


class OOMGuard:
    """The current micro-batch / accumulation split, and micro-steps run under the protocol above.

    ``micro_batch_size x accum_steps`` is this rank's share of the global batch and never
    changes; a shrink only moves samples from the micro-batch to the accumulation count. The
    split never grows back within a run (the same batch would run out of memory again); save
    ``state_dict()`` with the trainer state so a resumed run starts from the shrunk split.
    """

    def __init__(
        self, micro_batch_size: int, accum_steps: int, enabled: bool = True, *, rank: int = 0
    ) -> None:
        if micro_batch_size < 1 or accum_steps < 1:
            raise ValueError(f"micro-batch {micro_batch_size} and accumulation {accum_steps} must be >= 1")
        self.micro_batch_size = micro_batch_size
        self.accum_steps = accum_steps
        self.configured = (micro_batch_size, accum_steps)  # the config's split, before any shrink
        self.enabled = enabled
        self.rank = rank
        self.strategy = "single"  # set by attach(): "single", "ddp" or "fsdp"
        self.events: list[dict[str, Any]] = []  # one dict per recovery, ready for events.jsonl
        self.oom_rank: int | None = None  # highest rank that ran out of memory at the last agreement
        self._model: nn.Module | None = None
        self._hooks: list[Any] = []
        self._fence_needed = 0
        self._fence_seen: set[int] = set()
        self._resettable = True
        self._local_oom: str | None = None  # region of this rank's OOM in the current micro-step
        self._failed_micro: int | None = None

    # -- set-up --------------------------------------------------------------------------------

    def attach(self, model: nn.Module, shard_units: Sequence[nn.Module] = ()) -> None:
        """Infer the strategy from the wrapped ``model`` and install the collective fence hooks.

        ``shard_units``: the modules FSDP2 sharded one by one (``Recipe.shard_units``); ignored
        for DDP and a single process.
        """
        from torch.distributed.fsdp import FSDPModule
        from torch.nn.parallel import DistributedDataParallel

        self.detach()
        fences: list[nn.Module] = []
        if isinstance(model, DistributedDataParallel):
            self.strategy, fences = "ddp", [model.module]  # its hook runs after DDP's _pre_forward
        elif isinstance(model, FSDPModule):
            self.strategy = "fsdp"
            fences = [model, *(unit for unit in shard_units if isinstance(unit, FSDPModule))]
            self._resettable = compat.fsdp_can_reset_iter_state(model)
        else:
            self.strategy = "single"
        unique = list({id(module): module for module in fences}.values())
        for index, module in enumerate(unique):
            self._hooks.append(module.register_forward_pre_hook(self._fence_hook(index)))
        self._fence_needed = len(unique)
        self._model = model

    def detach(self) -> None:
        """Remove the fence hooks (the guard can be attached to another model)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        self._fence_needed = 0
        self._model = None

    def _fence_hook(self, index: int) -> Callable[[nn.Module, Any], None]:
        @torch.compiler.disable  # a plain Python side effect: never traced into a compiled graph
        def hook(module: nn.Module, args: Any) -> None:
            self._fence_seen.add(index)

        return hook

    # -- one micro-step ------------------------------------------------------------------------

    def micro_step(
        self,
        forward: Callable[[], torch.Tensor],
        backward: Callable[[torch.Tensor], None],
        *,
        final: bool,
        all_reduce_max: AllReduceMax | None,
        step: int,
        micro: int,
    ) -> torch.Tensor | None:
        """Forward and backward of one micro-step; the detached loss, or None when a rank ran OOM.

        Call it inside ``gradient_sync(model, enabled=final)`` on every rank. None means every
        rank got None: call ``recover`` and retry the step. ``forward`` returns the loss already
        divided by ``accum_steps``; ``backward`` runs the (scaled) backward of that loss.
        """
        if not self.enabled:
            loss = forward()
            backward(loss)
            return loss.detach()
        if self._model is None:
            raise RuntimeError("OOMGuard.attach(model) must be called before micro_step()")
        self._fence_seen.clear()
        self._local_oom = None
        where = (step, micro)
        result = self._forward(forward, where)
        local_backward = self._backward_is_local(final)
        if local_backward and result is not None and not self._backward(backward, result, where):
            result = None
        if self.agree(self._local_oom is not None, all_reduce_max):
            self._failed_micro = micro
            return None  # the loss (and its graph) is dropped on every rank
        if result is None:  # unreachable: no rank ran out of memory, so this one has a loss
            raise RuntimeError("OOMGuard: no loss although no rank ran out of memory")
        if not local_backward:
            self._escalating_backward(backward, result, where)
        return result.detach()

    def agree(self, local_oom: bool, all_reduce_max: AllReduceMax | None) -> bool:
        """Whether any rank ran out of memory: one int64 all-reduce (MAX) of ``rank + 1`` or 0."""
        top = agree_any(self.rank + 1 if local_oom else 0, all_reduce_max)
        self.oom_rank = top - 1 if top else None
        return top > 0

    def _forward(self, forward: Callable[[], torch.Tensor], where: tuple[int, int]) -> torch.Tensor | None:
        try:
            return forward()
        except Exception as exc:
            if not is_oom(exc):
                raise
            self._absorb(exc, "forward", self._fence_passed() and self._resettable, where)
        free_memory()  # after the handler: the traceback (and the activations it pins) is gone
        return None

    def _backward(
        self, backward: Callable[[torch.Tensor], None], loss: torch.Tensor, where: tuple[int, int]
    ) -> bool:
        try:
            backward(loss)
            return True
        except Exception as exc:
            if not is_oom(exc):
                raise
            self._absorb(exc, "backward", True, where)
        free_memory()
        return False

    def _escalating_backward(
        self, backward: Callable[[torch.Tensor], None], loss: torch.Tensor, where: tuple[int, int]
    ) -> None:
        try:
            backward(loss)
        except Exception as exc:
            if is_oom(exc):
                self._absorb(exc, "backward", False, where)
            raise

    def _absorb(self, exc: BaseException, region: str, recoverable: bool, where: tuple[int, int]) -> None:
        """Record a recoverable OOM of this rank, or escalate one the ranks cannot agree on."""
        if not recoverable:
            step, micro = where
            raise OOMNotRecoverable(
                f"out of memory in the {region} of step {step}, micro-step {micro} on rank {self.rank} "
                f"({self.strategy}) while collectives are in flight, so the ranks cannot agree in-process; "
                f"the elastic agent restarts from the last checkpoint. Lower train.micro_batch_size "
                f"(now {self.micro_batch_size}) to avoid it. Cause: {exc}"
            ) from exc
        self._local_oom = region

    def _fence_passed(self) -> bool:
        return len(self._fence_seen) == self._fence_needed

    def _backward_is_local(self, final: bool) -> bool:
        """Whether this micro-step's backward runs no collective (see the module table)."""
        if self.strategy == "single":
            return True
        return self.strategy == "ddp" and not final

    # -- recovery ------------------------------------------------------------------------------

    def shrink(self) -> tuple[int, int]:
        """Halve the micro-batch and double accumulation; ``(micro_batch_size, accum_steps)``."""
        micro = self.micro_batch_size
        if micro <= 1:
            raise ConfigError(
                f"train.micro_batch_size: out of memory at a micro-batch of {micro}, which cannot be "
                "halved; use a smaller model or sequence length, parallel.strategy=fsdp or "
                "train.precision=bf16"
            )
        if micro % 2:
            raise ConfigError(
                f"train.micro_batch_size: out of memory at a micro-batch of {micro}, which is odd; "
                "OOM recovery only halves even micro-batches (so the global batch stays the same). "
                "Set train.micro_batch_size to a smaller value, ideally a power of two"
            )
        self.micro_batch_size, self.accum_steps = micro // 2, self.accum_steps * 2
        return self.micro_batch_size, self.accum_steps

    def recover(
        self,
        step: int,
        optimizer: torch.optim.Optimizer,
        loader: _Loader,
        loader_state: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Every rank, after ``micro_step`` returned None: reset, shrink, rewind; the event row.

        ``loader_state`` is ``loader.state_dict()`` taken at the start of the step: restoring it
        rewinds the loader even when the failed micro-step was the step's last one (the loader
        has then already moved on to the next step).
        """
        model = self._model
        if model is None:
            raise RuntimeError("OOMGuard.attach(model) must be called before recover()")
        old = (self.micro_batch_size, self.accum_steps)
        new_micro, new_accum = self.shrink()
        _reset_parallel_state(model)
        optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        loader.load_state_dict(dict(loader_state))
        loader.set_micro_batch_size(new_micro)
        free_memory()
        event = {
            "step": step,
            "micro_step": self._failed_micro,
            "rank": self.oom_rank,  # the highest rank that ran out of memory
            "strategy": self.strategy,
            "old_micro_batch_size": old[0],
            "old_accum_steps": old[1],
            "new_micro_batch_size": new_micro,
            "new_accum_steps": new_accum,
        }
        self.events.append(event)
        return event

    def state_dict(self) -> dict[str, int]:
        configured_micro, configured_accum = self.configured
        return {
            "micro_batch_size": self.micro_batch_size,
            "accum_steps": self.accum_steps,
            "configured_micro_batch_size": configured_micro,
            "configured_accum_steps": configured_accum,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> bool:
        """Resume a shrunk split; False (this run's split kept) when the config's split changed
        since the save, since a user lowers train.micro_batch_size after an out-of-memory exit,
        and the checkpoint's larger split would run out of memory again. Refused when it would
        change this rank's samples per step."""
        micro, accum = int(state["micro_batch_size"]), int(state["accum_steps"])
        if "configured_micro_batch_size" in state:  # absent from states saved before 2026-12-04
            configured = (int(state["configured_micro_batch_size"]), int(state["configured_accum_steps"]))
            if configured != self.configured:
                return False
        if micro * accum != self.micro_batch_size * self.accum_steps:
            raise ConfigError(
                f"train.micro_batch_size: the checkpoint's split {micro} x {accum} does not match this "
                f"run's {self.micro_batch_size} x {self.accum_steps} samples per rank and step"
            )
        self.micro_batch_size, self.accum_steps = micro, accum
        return True


def _reset_parallel_state(model: nn.Module) -> None:
    """Disarm what an abandoned forward left armed, on every rank, before the retry.

    The ranks abandoned the step at different points (the OOMing rank inside its forward), so
    state set at the end of a forward differs between them and must be made equal again.
    DDP: a synchronised forward arms the reducer for a backward that never came (the next
    ``no_sync`` backward would launch bucket all-reduces on this rank only) and sets
    ``require_forward_param_sync`` (the next forward broadcasts buffers only on ranks where it
    is set): the reducer is reset, and ``require_forward_param_sync`` goes back to True, its
    value at the start of every step. FSDP2: every unit is resharded and the iteration state
    cleared; the gradients that the abandoned ``no_sync`` micro-steps accumulated on the
    unsharded parameters are dropped too (``zero_grad`` cannot reach them). The torch-specific
    parts live in ``hpcpipe.compat``.
    """
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        compat.ddp_reset_reducer(model)
        model.require_forward_param_sync = True
    elif isinstance(model, FSDPModule):
        compat.fsdp_reset_iter_state(model)
        compat.fsdp_drop_unsharded_grads(model)


def agreement_all_reduce(ctx: DistContext) -> AllReduceMax | None:
    """The MAX all-reduce used for OOM and preemption agreement (None for one process).

    On NCCL it runs on a separate CPU gloo group: reading a GPU result on the host would
    synchronise the stream at every micro-step.
    """
    import torch.distributed as dist

    if not ctx.is_distributed:
        return None
    if ctx.backend != "nccl":
        return max_over_ranks()
    group = dist.new_group(backend="gloo")
    assert isinstance(group, dist.ProcessGroup)
    return max_over_ranks(group=group)


def oom_recovery_on(
    configured: bool | None, strategy: str, pipeline: bool = False, tensor_parallel: bool = False
) -> bool:
    """``fault.oom_recovery``; null means on, except under DeepSpeed (a ZeRO step cannot be
    rolled back half-way through its partitioned gradients), a pipeline (its schedule runs
    every micro-batch in one call) and tensor parallelism (a rank out of memory inside a block
    leaves its peers in that block's collective, which no agreement can reach)."""
    if configured is not None:
        return configured
    return strategy != "deepspeed" and not pipeline and not tensor_parallel
