"""The same-layout restore across 2 gloo ranks (DDP): taken only when every rank's state has the
checkpoint's layout, and a changed byte makes every rank fall back together."""

from __future__ import annotations

import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from tests.distributed.test_checkpoint_dist import full_state, make_model, store, train
from tests.helpers import start_ranks

from hpcpipe.checkpoint import dcp_load, same_layout
from hpcpipe.netutil import free_port

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]


def _spy(taken: list[str]) -> None:
    real_load, real_dcp = same_layout.load, dcp_load._load_through_dcp

    def spy_load(*args: Any, **kwargs: Any) -> None:
        taken.append("same_layout")
        real_load(*args, **kwargs)

    def spy_dcp(*args: Any, **kwargs: Any) -> None:
        taken.append("dcp")
        real_dcp(*args, **kwargs)

    same_layout.load = spy_load  # type: ignore[assignment]  # this rank's process only
    dcp_load._load_through_dcp = spy_dcp  # type: ignore[assignment]


def _scenario(rank: int, world: int, root: Path) -> None:
    from torch.nn.parallel import DistributedDataParallel

    taken: list[str] = []
    _spy(taken)
    model, optimizer = make_model()
    ddp = DistributedDataParallel(model)
    ckpt = store(root, rank, world)
    train(ddp, optimizer, rank, 1)
    ckpt.save(1, ddp, optimizer, {"rank": rank})
    at_step_1 = {key: value.clone() for key, value in full_state(model, optimizer)["model"].items()}
    train(ddp, optimizer, rank, 1)
    ckpt.save(2, ddp, optimizer, {"rank": rank})
    ckpt.close()
    dist.barrier()
    if rank == 0:  # one byte of one rank's shard: both ranks read it (DDP saves each tensor once)
        shard = sorted((root / "ckpts" / "step-00000002").glob("__1_*.distcp"))[0]
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
    dist.barrier()

    fresh, fresh_optimizer = make_model()
    torch.nn.init.normal_(fresh.tok_emb.weight)
    restoring = store(root, rank, world)
    assert restoring.restore(DistributedDataParallel(fresh), fresh_optimizer) == {"rank": rank}
    assert restoring.restored is not None and restoring.restored.step == 1
    assert taken == ["same_layout", "same_layout"], taken  # step 2 failed on every rank, then step 1
    restored = full_state(fresh, fresh_optimizer)
    for key, value in at_step_1.items():
        assert torch.equal(value, restored["model"][key]), key
    restoring.close()

    taken.clear()  # rank 1 holds float64 parameters: no rank may take the same-layout path
    other, _ = make_model()
    if rank == 1:
        other = other.double()
    other_optimizer = torch.optim.AdamW(other.parameters(), lr=1e-2)
    again = store(root, rank, world)
    assert again.restore(other, other_optimizer) == {"rank": rank}
    assert taken == ["dcp", "dcp"], taken  # step 2 (still damaged), then step 1
    for key, value in at_step_1.items():
        assert torch.equal(value.to(other.state_dict()[key].dtype), other.state_dict()[key]), key
    again.close()


def _worker(rank: int, world: int, port: int, root: str) -> None:
    code = 0
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
        _scenario(rank, world, Path(root))
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def test_ranks_agree_on_the_path_and_fall_back_together(tmp_path: Path) -> None:
    start_ranks(_worker, (2, free_port(), str(tmp_path)), 2)
