"""Checkpoints across process groups (2 gloo ranks on CPU): DDP and FSDP2 saves that load at
another world size with identical parameters and optimizer state, and a rank SIGKILLed between
its shard writes and the commit."""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tests.helpers import start_ranks
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from hpcpipe.checkpoint import CheckpointStore, capture_rng_state
from hpcpipe.checkpoint.manifest import verify_dir
from hpcpipe.config import CheckpointConfig, ModelConfig
from hpcpipe.models.gpt import GPT
from hpcpipe.netutil import free_port

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

TINY = ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8)
VOCAB = 40
FULL = StateDictOptions(full_state_dict=True)  # every rank gets the whole state (CPU anyway)


# -- helpers shared by the test process and the workers -----------------------------------------


def make_model() -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT(TINY, VOCAB)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int, steps: int) -> None:
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    for _ in range(steps):
        idx = torch.randint(0, VOCAB, (2, 8), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Unsharded model + optimizer state by parameter name (collective under FSDP2)."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=FULL)
    return {"model": model_sd, "optim": optim_sd["state"]}


def load_reference(root: Path) -> dict[str, Any]:
    return torch.load(root / "reference.pt", weights_only=True)


def assert_states_equal(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["model"].keys() == b["model"].keys()
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    assert a["optim"].keys() == b["optim"].keys()
    for name, moments in a["optim"].items():
        for key, value in moments.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["optim"][name][key])), (name, key)


def store(root: Path, rank: int = 0, world: int = 1, **cfg: Any) -> CheckpointStore:
    return CheckpointStore(CheckpointConfig(**cfg), root / "ckpts", rank, world, config_hash="h")


def fsdp(model: GPT) -> GPT:
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


# -- worker plumbing ------------------------------------------------------------------------------


def _worker(rank: int, world: int, port: int, scenario: str, root: str) -> None:
    """Join the group, run the scenario, leave with os._exit (gloo may abort at interpreter exit)."""
    code = 0
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
        SCENARIOS[scenario](rank, world, Path(root))
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def spawn(scenario: str, root: Path, world: int = 2) -> None:
    port = free_port()
    start_ranks(_worker, (world, port, scenario, str(root)), world)


def _ddp_save(rank: int, world: int, root: Path) -> None:
    from torch.nn.parallel import DistributedDataParallel

    model, optimizer = make_model()
    ddp = DistributedDataParallel(model)
    ckpt = store(root, rank, world, **{"async": True})
    ckpt.cleanup_temporaries()
    train(ddp, optimizer, rank, 2)
    ckpt.save(2, ddp, optimizer, {"rank": rank, "rng": capture_rng_state()})
    train(ddp, optimizer, rank, 1)
    ckpt.save(3, ddp, optimizer, {"rank": rank})
    ckpt.close()
    reference = full_state(model, optimizer)
    if rank == 0:
        torch.save(reference, root / "reference.pt")


def _fsdp_save(rank: int, world: int, root: Path) -> None:
    model, optimizer = make_model()
    sharded = fsdp(model)
    optimizer = torch.optim.AdamW(sharded.parameters(), lr=1e-2)
    ckpt = store(root, rank, world, **{"async": True})  # stages DTensor shards to CPU
    train(sharded, optimizer, rank, 1)
    ckpt.save(1, sharded, optimizer, {"rank": rank})
    train(sharded, optimizer, rank, 1)
    ckpt.save(2, sharded, optimizer, {"rank": rank})
    ckpt.close()
    reference = full_state(sharded, optimizer)
    if rank == 0:
        torch.save(reference, root / "reference.pt")


def _fsdp_restore(rank: int, world: int, root: Path) -> None:
    model, _ = make_model()
    torch.manual_seed(1234)  # different initial weights: the load must overwrite all of them
    for param in model.parameters():
        torch.nn.init.normal_(param)
    sharded = fsdp(model)
    optimizer = torch.optim.AdamW(sharded.parameters(), lr=1e-2)
    extra = store(root, rank, world).restore(sharded, optimizer)
    assert extra == {"rank": 0}  # saved at world 1: both ranks get rank 0's
    assert_states_equal(full_state(sharded, optimizer), load_reference(root))


def _killed_mid_save(rank: int, world: int, root: Path) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from hpcpipe.checkpoint import safe_dcp

    model, optimizer = make_model()
    ddp = DistributedDataParallel(model)
    ckpt = store(root, rank, world)
    train(ddp, optimizer, rank, 1)
    ckpt.save(1, ddp, optimizer, {})
    real_write_data = safe_dcp.HashedFileSystemWriter.write_data

    def write_then_die(self: Any, plan: Any, planner: Any) -> Any:
        result = real_write_data(self, plan, planner)
        if rank == 1:  # shards written and fsynced; the commit has not happened
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    safe_dcp.HashedFileSystemWriter.write_data = write_then_die
    train(ddp, optimizer, rank, 1)
    ckpt.save(2, ddp, optimizer, {})


SCENARIOS: dict[str, Callable[[int, int, Path], None]] = {
    "ddp_save": _ddp_save,
    "fsdp_save": _fsdp_save,
    "fsdp_restore": _fsdp_restore,
    "killed_mid_save": _killed_mid_save,
}


# -- tests ----------------------------------------------------------------------------------------


def test_ddp_world_2_async_save_restores_at_world_1(tmp_path: Path) -> None:
    spawn("ddp_save", tmp_path)
    model, optimizer = make_model()
    torch.nn.init.normal_(model.tok_emb.weight)
    ckpt = store(tmp_path)
    extra = ckpt.restore(model, optimizer)
    assert extra == {"rank": 0}
    assert ckpt.restored is not None and ckpt.restored.step == 3 and ckpt.restored.saved_world_size == 2
    assert_states_equal(full_state(model, optimizer), load_reference(tmp_path))
    assert verify_dir(tmp_path / "ckpts" / "step-00000002")[1] == []
    assert (tmp_path / "ckpts" / "step-00000003" / "extra" / "rank-00001.pt").is_file()


def test_fsdp2_world_2_async_save_restores_at_world_1(tmp_path: Path) -> None:
    spawn("fsdp_save", tmp_path)
    model, optimizer = make_model()
    ckpt = store(tmp_path)
    assert ckpt.restore(model, optimizer) == {"rank": 0}
    assert_states_equal(full_state(model, optimizer), load_reference(tmp_path))


def test_world_1_restores_at_fsdp2_world_2(tmp_path: Path) -> None:
    model, optimizer = make_model()
    train(model, optimizer, 0, 2)
    ckpt = store(tmp_path)
    ckpt.save(2, model, optimizer, {"rank": 0})
    ckpt.close()
    torch.save(full_state(model, optimizer), tmp_path / "reference.pt")
    spawn("fsdp_restore", tmp_path)  # each rank asserts equality of the full state


def test_sigkill_between_shards_and_commit_leaves_only_verified_checkpoints(tmp_path: Path) -> None:
    with pytest.raises(mp.ProcessExitedException):
        spawn("killed_mid_save", tmp_path)
    ckpts = tmp_path / "ckpts"
    committed = sorted(p.name for p in ckpts.iterdir() if not p.name.startswith("."))
    assert committed == ["step-00000001"]
    assert verify_dir(ckpts / "step-00000001")[1] == []
    leftovers = [p for p in ckpts.iterdir() if p.name.startswith(".tmp-step-00000002-")]
    assert leftovers and any(leftovers[0].glob("__1_*.distcp"))  # rank 1 did write its shards
    assert not (leftovers[0] / "manifest.json").exists()
    restarted = store(tmp_path)
    assert [name for name in restarted.cleanup_temporaries() if "00000002" in name]
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-00000001"]
    model, optimizer = make_model()
    assert restarted.restore(model, optimizer) == {}
    assert restarted.restored is not None and restarted.restored.step == 1
