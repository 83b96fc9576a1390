"""Helpers for tests and tools: run the real CLI, write a deterministic corpus."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path

import pytest


def run_cli(
    *args: str,
    cwd: Path | None = None,
    timeout: float = 240,
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m hpcpipe ARGS`` as a user would (after ``prefix``, e.g. ``nice``); returns
    the completed process. It is forked from this test process's zygote (``hpcpipe.launch.zygote``:
    torch, the trainer and the recipes' heavy libraries imported once), or a fresh interpreter with
    a ``prefix`` or with ``HPCPIPE_FRESH_INTERPRETERS=1``."""
    full_env = without_ranks({**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    if prefix is None:
        from hpcpipe.launch.zygote import Launch, run_hpcpipe

        return run_hpcpipe(
            list(args),
            cwd or Path.cwd(),
            full_env,
            Launch(timeout=timeout),
            preload=CLI_PRELOAD,
            zygote_cwd=REPO,
            zygote_name=CLI_ZYGOTE,
        )
    return subprocess.run(
        [*(prefix or []), sys.executable, "-m", "hpcpipe", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# What the CLI runs of the tests import besides hpcpipe.launch.zygote.PRELOAD (the first run_cli of
# a test process starts its zygote with them): the CLI, the recipes' heavy libraries, and this package, so
# that its recipes (tests.recipes_for_tests:Tiny) resolve from any working directory, as an
# installed recipe package's do.
CLI_PRELOAD = ("hpcpipe.cli.app", "torchvision", "transformers", "tests")
REPO = Path(__file__).resolve().parent.parent
CLI_ZYGOTE = "tests"  # run_cli's own zygote: the product's callers in a test process keep theirs


def needs_package(name: str, extra: str) -> pytest.MarkDecorator:
    """Skip unless ``name`` is installed, without importing it: a module-level
    ``pytest.importorskip`` would import the package during collection in every xdist worker
    (DeepSpeed 1.3 s, MLflow 1.2 s, xgrammar 0.6 s each)."""
    return pytest.mark.skipif(find_spec(name) is None, reason=f"needs {name} (the {extra} extra)")


# What the ranks of start_ranks import on their way to training (none of these starts a thread).
RANK_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "hpcpipe.train.trainer",
    "torchvision",
    "transformers",
)


def start_ranks(fn: Callable[..., None], args: tuple[object, ...], nprocs: int) -> None:
    """``fn(rank, *args)`` on ``nprocs`` processes, joined; a failed rank raises.

    The ranks fork from multiprocessing's fork server, which imports torch, the trainer and its
    heavy libraries (``RANK_PRELOAD``) and ``fn``'s module once per test process, instead of each
    being a fresh interpreter (~3.7 CPU-s of imports per rank, measured: 24 such ranks cost the
    suite 88 CPU-s; with torch alone preloaded, the ranks' own imports of the trainer, its compiler
    stack and torchvision were still 86 CPU-s under py-spy, 2026-12-02). The server never computes,
    so forking from it is safe where forking the test process after its own torch work (OpenMP) is
    not. The preload is the first call's (the server then runs on): later modules are imported by
    their ranks. A rank gets the environment the server started with: pass what it needs in
    ``args``."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload([*RANK_PRELOAD, fn.__module__])
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


WORDS = [
    "the",
    "model",
    "trains",
    "on",
    "tokens",
    "and",
    "the",
    "loss",
    "falls",
    "while",
    "the",
    "gradient",
    "flows",
    "through",
    "every",
    "layer",
    "of",
    "attention",
    "and",
    "the",
    "optimizer",
    "steps",
    "with",
    "a",
    "learning",
    "rate",
    "that",
    "warms",
    "up",
    "then",
    "decays",
    "along",
    "a",
    "cosine",
    "curve",
    "so",
    "that",
    "each",
    "rank",
    "sees",
    "its",
    "own",
    "shard",
    "of",
    "the",
    "data",
    "in",
    "a",
    "fixed",
    "order",
]


def write_synthetic_corpus(path: Path, n_sentences: int = 6000, seed: int = 0) -> Path:
    """Deterministic text with learnable structure, identical on every Python and platform."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n_sentences):
        start = int(rng.integers(0, len(WORDS) - 12))
        length = int(rng.integers(5, 12))
        lines.append(" ".join(WORDS[start : start + length]).capitalize() + ".")
    path.write_text("\n".join(lines) + "\n")
    return path


# For a test about a run's processes (a deadline, a session, a kill), not its training: each rank
# sleeps in its data path instead of training flat out on the cores the other tests need (two
# such tests used 18 and 23 CPU-s for a 12-15 s deadline).
IDLE_RANKS = {"HPCPIPE_CHAOS_SLOW": "where=data,seconds=0.5"}


def tiny_job_sets(tmp: Path, name: str, *extra: str) -> list[str]:
    """``--set`` arguments for the tiny preset on the synthetic corpus in ``tmp``, logging every step."""
    corpus = tmp / "corpus.txt"
    if not corpus.exists():
        write_synthetic_corpus(corpus)
    sets = [
        f"run.name={name}",
        f"run.out_dir={tmp}",
        f"data.prepared_dir={tmp}/prepared",
        "observe.log_every=1",
        f"data.sources=[{corpus}]",
        "data.max_bytes=null",
        *extra,
    ]
    return [arg for s in sets for arg in ("--set", s)]


def run_shipped_chaos(out: Path, *scenarios: str, timeout: float) -> list[dict[str, object]]:
    """One trial (seed 0) of each named shipped chaos scenario; asserts every one recovered."""
    import json

    only = [arg for name in scenarios for arg in ("--only", name)]
    proc = run_cli(
        "chaos", "run", "shipped", *only, "--trials", "1", "--out", str(out), "--no-progress", timeout=timeout
    )
    rows = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    failed = [f"{r['scenario']}: {r['detail']} ({r['replay']})" for r in rows if not r["recovered"]]
    assert proc.returncode == 0 and not failed, "\n".join(failed) + proc.stderr[-2000:]
    assert sorted(str(r["scenario"]) for r in rows) == sorted(scenarios)
    return rows


def tiny_llama(packed: bool = True, train: bool = False):  # type: ignore[no-untyped-def]
    """A 2-layer Llama with grouped-query attention (4 heads, 2 key/value heads, 64 tokens, 32
    wide), seeded weights; ``packed``: attention per conversation span (models/packed_attention.py)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from hpcpipe.models.packed_attention import use_packed_attention

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").train(train)
    if packed:
        use_packed_attention(model)
    return model


ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_RECIPE = ROOT / "examples" / "recipes" / "stdlib-classifier"


def uv_binary() -> str:
    """The project's pinned uv (``make`` puts it in .tools/bin), or one on PATH."""
    import shutil

    pinned = ROOT / ".tools" / "bin" / "uv"
    found = str(pinned) if pinned.is_file() else shutil.which("uv")
    if found is None:
        raise RuntimeError("uv not found: run make install-test (it installs .tools/bin/uv)")
    return found


def install_into(target: Path, package: Path) -> Path:
    """Build and install ``package`` (a directory with pyproject.toml) into the directory
    ``target``, without its dependencies (this environment has them): a real install, with its
    dist-info and entry points, that a process sees once ``target`` is on its PYTHONPATH."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # built from a copy: no build/ left in the source tree
        source = Path(tmp) / package.name
        shutil.copytree(package, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        subprocess.run(
            [
                uv_binary(),
                "pip",
                "install",
                "--quiet",
                "--python",
                sys.executable,
                "--target",
                str(target),
                "--no-deps",
                "--no-build-isolation",
                "--no-cache",
                str(source),
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
    return target


def with_site(site: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this one) with ``site`` first on PYTHONPATH and no rank variables."""
    full = without_ranks({**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"})
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), full.get("PYTHONPATH", "")) if p)
    return full


def without_ranks(env: dict[str, str]) -> dict[str, str]:
    """``env`` without the variables that would make a process join this one's group."""
    ranks = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID")
    return {k: v for k, v in env.items() if k not in ranks}


def run_fresh_cli(
    *args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m hpcpipe ARGS`` in a fresh interpreter (it sees ``env``'s PYTHONPATH: an
    installed recipe package; ``run_cli``'s zygote would not)."""
    return subprocess.run(
        [sys.executable, "-m", "hpcpipe", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_events(run_dir: Path, kind: str) -> list[dict[str, object]]:
    """The ``kind`` events of a run's events.jsonl, in order."""
    import json

    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def assert_steps_close(run: dict[int, float], reference: dict[int, float], rel: float) -> None:
    """Every step of ``run`` is in ``reference`` and equal to it within ``rel``."""
    steps = sorted(run)
    assert steps and all(s in reference for s in steps)
    assert [run[s] for s in steps] == pytest.approx([reference[s] for s in steps], rel=rel)


FOLLOWED = ("loss", "grad_norm", "val_loss")  # what "a layout follows one process" compares


def metric_rows(run_dir: Path, key: str) -> dict[int, float]:
    """``key`` by step, from the metrics rows of ``run_dir`` that carry it."""
    from hpcpipe.observe.metrics import read_metrics

    return {r["step"]: r[key] for r in read_metrics(run_dir) if key in r}


def assert_follows(
    run_dir: Path, reference_dir: Path, rel: float, grad_norm_rel: float | None = None
) -> None:
    """Every step's loss, gradient norm (clipping sees the same norm) and validation loss of
    ``run_dir`` equal ``reference_dir``'s within ``rel`` (the norm within ``grad_norm_rel`` where
    given). The caller makes both runs evaluate the same windows: a token recipe evaluates
    ``eval_batches x micro_batch_size x dp`` of them."""
    for key in FOLLOWED:
        tolerance = grad_norm_rel if key == "grad_norm" and grad_norm_rel is not None else rel
        assert_steps_close(metric_rows(run_dir, key), metric_rows(reference_dir, key), tolerance)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs: not gone, not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def gone_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` stops running within ``seconds`` (polled every 50 ms)."""
    deadline = time.monotonic() + seconds
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not process_alive(pid)
