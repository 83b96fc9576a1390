"""``@tiny-llama``: a 2-layer Llama and a byte-level BPE tokenizer trained on generated texts.

Tests and the ``lora-fc-tiny`` preset need a real transformers model directory without a hub:
this writes one (``config.json``, ``model.safetensors``, ``tokenizer.json``...) that
``AutoModelForCausalLM`` / ``AutoTokenizer`` load like any other. It has no chat template on
purpose, so hpcpipe's own documented template is exercised. Same texts and seed, same directory
contents.

Two flavours:
- ``@tiny-llama-random``: random weights, built in a second; for mechanics (masking, sharding,
  checkpoints, export), where what the model knows does not matter.
- ``@tiny-llama``: the same model pre-trained for a minute on *raw* Glaive text from a separate
  seed (``SYSTEM: ... USER: ... ASSISTANT: <functioncall> ...``), never on hpcpipe's chat template
  and never on the run's own rows. Like a real base model it has seen calls but not the format it
  is asked for, so LoRA has something to teach and can learn it in a test's time: a random base
  only learns to refuse (measured: 49% call/no-call after 120 steps, all refusals). Pre-training
  takes 1.5 to 4 minutes on 2 cores, which a fresh machine (CI's) paid on every run, so the one
  this code builds ships with hpcpipe (``models/tiny_llama/``, 2.7 MB, written by
  ``scripts/build_tiny_llama.py``) and every machine copies the same weights into a new
  ``prepared_dir``. The shipped copy is used only while it is what this code would build: its
  name hashes the inputs and its ``BUILD.json`` the code that builds it; otherwise it is
  pre-trained here and kept once per machine (``fsutil.machine_cache_dir``,
  ``~/.cache/hpcpipe`` by default).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch

from hpcpipe.fsutil import atomic_replace_dir, machine_cache_dir

TINY_NAME = "@tiny-llama"
TINY_RANDOM_NAME = "@tiny-llama-random"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_VOCAB = 4096
_PRETRAIN_ROWS, _PRETRAIN_SEED = 1000, 7919  # a stream apart from any run's rows (run.seed)
_PRETRAIN_STEPS, _PRETRAIN_BATCH, _PRETRAIN_LEN, _PRETRAIN_LR = 200, 16, 512, 3e-3


@functools.cache  # every recipe and check in a process asks again; 600 rows take about 0.5 s
def _glaive_texts(n: int, seed: int) -> tuple[str, ...]:
    from hpcpipe.config.synthetic import SyntheticMix
    from hpcpipe.data.function_calling.glaive_rows import generate_glaive_rows

    # The classic mix: the pre-training text does not move with data.synthetic_mix's defaults.
    rows = generate_glaive_rows(n, seed, SyntheticMix.classic())
    return tuple(row["system"] + "\n" + row["chat"] for row in rows)


def default_tiny_dir(root: Path, pretrained: bool = False) -> Path:
    """The tiny model of a fixed text sample (not a run's data): every run and rank finds the same."""
    return tiny_llama_dir(root, *_default_inputs(pretrained))


def default_tiny_name(pretrained: bool = False) -> str:
    """The directory name ``default_tiny_dir`` gives its model (a hash of its inputs)."""
    return model_name(*_default_inputs(pretrained))


def _default_inputs(pretrained: bool) -> tuple[tuple[str, ...], int, tuple[str, ...]]:
    pretrain = _glaive_texts(_PRETRAIN_ROWS, _PRETRAIN_SEED) if pretrained else ()
    return _glaive_texts(600, seed=0), 0, pretrain


def model_name(texts: Sequence[str], seed: int, pretrain_texts: Sequence[str] = ()) -> str:
    """``tiny-llama-<hash of the inputs>``: the same inputs, the same name."""
    key = hashlib.sha256(f"{seed}\0{_VOCAB}\0".encode() + "\0".join(texts).encode())
    if pretrain_texts:
        recipe = (_PRETRAIN_STEPS, _PRETRAIN_BATCH, _PRETRAIN_LEN, _PRETRAIN_LR)
        key.update(f"\0pretrain{recipe}\0".encode() + "\0".join(pretrain_texts).encode())
    return f"tiny-llama-{key.hexdigest()[:16]}"


def tiny_llama_dir(root: Path, texts: Sequence[str], seed: int, pretrain_texts: Sequence[str] = ()) -> Path:
    """Build (once) the tiny model for ``texts`` under ``root``; returns its directory.

    ``pretrain_texts``: also train every weight on them as a plain language model (1.5 to 4
    minutes on 2 cores): the shipped copy when it is this one, else trained and kept per machine.
    """
    out = root / model_name(texts, seed, pretrain_texts)
    if (out / "model.safetensors").is_file():
        return out
    # The pre-trained flavour costs minutes: shipped, else built once per machine, then copied (same
    # inputs, same name: the name is their hash). The random one takes a second and is not kept.
    kept = (shipped_copy(out.name) or _machine_copy(out.name)) if pretrain_texts else None
    with atomic_replace_dir(out) as tmp:
        if kept is not None:
            shutil.copytree(kept, tmp, dirs_exist_ok=True)
        else:
            _write_tokenizer(texts, tmp)
            _write_model(tmp, seed)
            if pretrain_texts:
                _pretrain(tmp, pretrain_texts, seed)
    if pretrain_texts and kept is None:
        _keep_on_machine(out)
    return out


SHIPPED = Path(__file__).with_name("tiny_llama")  # the pre-trained base this code builds


@functools.cache
def build_code_stamp() -> str:
    """A hash of the code that decides the pre-trained weights beyond the inputs the name hashes
    (the tokenizer's training, the model's shape, the pre-training loop): a shipped copy built by
    other code is not used."""
    from hpcpipe.data.tokens.tokenizer import train_byte_level_bpe

    try:
        code = [inspect.getsource(f) for f in (train_byte_level_bpe, *_BUILDERS)]
    except (OSError, TypeError):  # installed without its sources: nothing to compare, pre-train
        return "no-source"
    return hashlib.sha256("\0".join(code).encode()).hexdigest()[:16]


def shipped_copy(name: str) -> Path | None:
    """The shipped pre-trained model ``name``, if there is one and this code would build it."""
    entry = SHIPPED / name
    try:
        built = json.loads((entry / "BUILD.json").read_text())
    except (OSError, ValueError):
        return None
    complete = (entry / "model.safetensors").is_file()
    return entry if complete and built.get("code") == build_code_stamp() else None


def _machine_entry(name: str) -> Path | None:
    """Where this machine keeps the model ``name`` (fsutil.machine_cache_dir), None if caching is
    off. ``name`` hashes the inputs; the entry also carries what else decides the weights (torch,
    transformers, this module's code), so an upgrade or an edit never serves a stale model."""
    import transformers

    cache = machine_cache_dir()
    if cache is None:
        return None
    stamp = hashlib.sha256(f"{torch.__version__}\0{transformers.__version__}\0".encode())
    stamp.update(Path(__file__).read_bytes())
    return cache / "models" / f"{name}-{stamp.hexdigest()[:8]}"


def _machine_copy(name: str) -> Path | None:
    """This machine's kept copy of the model ``name``, if complete."""
    kept = _machine_entry(name)
    return kept if kept is not None and (kept / "model.safetensors").is_file() else None


def _keep_on_machine(built: Path) -> None:
    """Copy a built model into the machine cache; best effort (a read-only home only costs time)."""
    entry = _machine_entry(built.name)
    if entry is None:
        return
    with contextlib.suppress(OSError), atomic_replace_dir(entry) as tmp:
        shutil.copytree(built, tmp, dirs_exist_ok=True)


def _write_tokenizer(texts: Sequence[str], out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    from hpcpipe.data.tokens.tokenizer import train_byte_level_bpe

    tok = train_byte_level_bpe(texts, _VOCAB, SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.save_pretrained(out)


def _write_model(out: Path, seed: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=_VOCAB,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        eos_token_id=2,
        pad_token_id=0,
        bos_token_id=None,
    )
    from hpcpipe.models.hf_quiet import quiet_hf
    from hpcpipe.models.hf_save import save_plain_model

    torch.manual_seed(seed)
    with quiet_hf():
        save_plain_model(LlamaForCausalLM(config), out)


def _pretrain(out: Path, texts: Sequence[str], seed: int) -> None:
    """Full-parameter next-token training of the model in ``out`` on ``texts`` (packed, EOS-joined)."""
    import sys

    from transformers import AutoTokenizer, LlamaForCausalLM

    from hpcpipe.models.hf_quiet import quiet_hf

    note = f"{_PRETRAIN_STEPS} steps, about 1.5 min on 2 cores"
    print(f"@tiny-llama: pre-training the base once ({note})", file=sys.stderr)
    with quiet_hf():
        tok = AutoTokenizer.from_pretrained(out)
        model = LlamaForCausalLM.from_pretrained(out)
    ids = [i for text in texts for i in [*tok(text)["input_ids"], tok.eos_token_id]]
    rows = len(ids) // _PRETRAIN_LEN
    data = torch.tensor(ids[: rows * _PRETRAIN_LEN]).view(rows, _PRETRAIN_LEN)  # (rows, L)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=_PRETRAIN_LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, _PRETRAIN_LR, total_steps=_PRETRAIN_STEPS, pct_start=0.05
    )
    model.train()
    for _ in range(_PRETRAIN_STEPS):
        batch = data[torch.randint(0, rows, (_PRETRAIN_BATCH,), generator=gen)]  # (B, L)
        model(input_ids=batch, labels=batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
    with quiet_hf():
        model.save_pretrained(out)


# The builders as this module defines them (build_code_stamp hashes their source; a test that
# replaces one on the module does not change what the shipped copy is checked against).
_BUILDERS = (_write_tokenizer, _write_model, _pretrain)
