"""Hugging Face causal LMs with LoRA adapters (peft): loading, adapters, decoder layers, counts.

The base model comes from a local directory, a hub id that is already in the local cache (hpcpipe
never downloads: ``local_files_only``), or a GGUF file that transformers de-quantises (``gguf`` +
``accelerate``). LoRA is applied here, before any parallel wrapping: FSDP2 must see the adapter
parameters when it groups a decoder layer's parameters.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpcpipe.config import LoraConfig, ModelConfig
from hpcpipe.errors import ConfigError
from hpcpipe.models.hf_quiet import quiet_hf

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# What transformers raises for a model it cannot read: files missing (OSError), a directory or GGUF
# file it does not understand (ValueError: no backend tokenizer, no GGUF magic bytes), and a
# truncated GGUF file (the reader's struct.error).
UNREADABLE = (OSError, ValueError, struct.error)


@dataclass(frozen=True)
class ModelSource:
    """Where the base model and its tokenizer come from: ``from_pretrained(path, **kwargs)``."""

    path: str
    gguf_file: str | None
    random_weights: bool = False  # @random:<shape>: config only, weights initialised with seed 0
    cache_dir: str | None = None  # a GGUF file's de-quantised copies are kept here (gguf_cache.py)

    def named(self) -> str:
        """What an error names: the GGUF file, else the directory (or hub id)."""
        return str(Path(self.path) / self.gguf_file) if self.gguf_file else self.path

    def key(self) -> str:
        """The config key an error names."""
        return "model.gguf_file" if self.gguf_file else "model.name_or_path"

    def kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"local_files_only": True}
        if self.gguf_file:
            kwargs["gguf_file"] = self.gguf_file
        return kwargs


def resolve_source(cfg: ModelConfig, prepared_dir: str) -> ModelSource:
    """``model.name_or_path`` / ``model.gguf_file`` -> a source; ConfigError naming what is missing.

    ``@tiny-llama[-random]`` and ``@random:<shape>`` are built (once) under ``<prepared_dir>/models``;
    a GGUF file's de-quantised copy is kept once per machine (``gguf_cache.kept_root``).
    """
    from hpcpipe.models.random_lm import RANDOM_PREFIX, random_model_dir
    from hpcpipe.models.tiny_lm import TINY_NAME, TINY_RANDOM_NAME, default_tiny_dir

    name = cfg.name_or_path or ""
    if cfg.gguf_file and (name in (TINY_NAME, TINY_RANDOM_NAME) or name.startswith(RANDOM_PREFIX)):
        raise ConfigError(
            f"model.gguf_file: not read with model.name_or_path={name} (a model hpcpipe builds); "
            "set model.name_or_path to the GGUF file's directory, or null, or drop model.gguf_file"
        )
    if name in (TINY_NAME, TINY_RANDOM_NAME):
        return ModelSource(str(default_tiny_dir(Path(prepared_dir) / "models", name == TINY_NAME)), None)
    if name.startswith(RANDOM_PREFIX):
        return ModelSource(str(random_model_dir(name, Path(prepared_dir) / "models")), None, True)
    from hpcpipe.models.gguf_cache import kept_root

    gguf = cfg.gguf_file
    kept = kept_root(Path(prepared_dir) / "models")  # where a GGUF file's de-quantised copy is kept
    models = str(kept) if kept is not None else None
    if gguf and Path(gguf).is_file() and not name:
        return ModelSource(str(Path(gguf).parent), Path(gguf).name, cache_dir=models)
    if gguf:
        directory = Path(name) if name else Path(gguf).parent
        file = directory / Path(gguf).name
        if not file.is_file():
            raise ConfigError(f"model.gguf_file: {file} does not exist")
        return ModelSource(str(directory), Path(gguf).name, cache_dir=models)
    if Path(name).exists():
        if not (Path(name) / "config.json").is_file():
            raise ConfigError(f"model.name_or_path: {name} has no config.json (not a transformers model)")
        return ModelSource(name, None)
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise ConfigError(f"model.name_or_path: {name} does not exist")
    return ModelSource(name, None)  # a hub id: must be in the local cache


def load_tokenizer(source: ModelSource) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = _via_gguf_cache(
            source,
            "tokenizer",
            lambda: AutoTokenizer.from_pretrained(source.path, **source.kwargs()),
            lambda kept: AutoTokenizer.from_pretrained(kept, local_files_only=True),
        )
    except UNREADABLE as exc:
        raise ConfigError(
            f"{source.key()}: cannot load a tokenizer from {source.named()} ({_first_line(exc)})"
        ) from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def tokenizer_identity(tokenizer: Any) -> str:
    """SHA-256 of a tokenizer's vocabulary, rules and chat template: prepared data are keyed by it."""
    import hashlib

    tok = tokenizer
    backend = tok.backend_tokenizer.to_str() if hasattr(tok, "backend_tokenizer") else repr(tok.get_vocab())
    return hashlib.sha256((backend + str(tok.chat_template)).encode()).hexdigest()


def resolve_base_dtype(base_dtype: str) -> str:
    """``model.base_dtype`` as loaded: ``auto`` becomes bf16 where the device the workers will
    use (CUDA when present, else the CPU) multiplies bf16 natively, fp32 elsewhere."""
    if base_dtype != "auto":
        return base_dtype
    from hpcpipe.compat import cpu_has_native_bf16

    if torch.cuda.is_available():
        native = torch.cuda.is_bf16_supported(including_emulation=False)
    else:
        native = cpu_has_native_bf16()
    return "bf16" if native else "fp32"


def load_base_model(source: ModelSource, base_dtype: str) -> nn.Module:
    """The frozen base as ``AutoModelForCausalLM`` in ``base_dtype`` (``auto``: see
    ``resolve_base_dtype``), attention through SDPA."""
    from transformers import AutoModelForCausalLM

    base_dtype = resolve_base_dtype(base_dtype)
    if source.random_weights:
        return _random_model(source, base_dtype)

    def load(path: str | Path, dtype: str, **kwargs: Any) -> nn.Module:
        with quiet_hf():
            return AutoModelForCausalLM.from_pretrained(
                path, dtype=DTYPES[dtype], attn_implementation="sdpa", **kwargs
            )

    from hpcpipe.models.hf_save import save_plain_model

    try:
        if source.gguf_file and source.cache_dir:
            # GGUF de-quantises to fp32 whatever the dtype asked (the whole model, in memory):
            # that exact copy is kept, and every dtype is cast from it.
            model = _via_gguf_cache(
                source,
                "model",
                lambda: load(source.path, "fp32", **source.kwargs()),
                lambda kept: load(kept, base_dtype, local_files_only=True),
                save_plain_model,
            ).to(DTYPES[base_dtype])
        else:
            model = load(source.path, base_dtype, **source.kwargs())
    except ImportError as exc:  # gguf / accelerate missing
        raise ConfigError(f"model.gguf_file: {_first_line(exc)} (pip install 'hpcpipe[lora]')") from None
    except UNREADABLE as exc:
        raise ConfigError(f"{source.key()}: cannot load {source.named()} ({_first_line(exc)})") from None
    model.config.use_cache = False  # training: no KV cache
    model.config._name_or_path = source.path  # an adapter names the model it was trained on
    return model


def _via_gguf_cache(source: ModelSource, part: str, load_file: Any, load_kept: Any, save: Any = None) -> Any:
    """``load_file()``, or for a GGUF source its de-quantised copy (``gguf_cache.py``)."""
    if not source.gguf_file:
        return load_file()
    from hpcpipe.models.gguf_cache import cached_load

    gguf = Path(source.path) / source.gguf_file
    cache = Path(source.cache_dir) if source.cache_dir else None
    return cached_load(gguf, cache, part, load_file, load_kept, save)


def _kept_model(source: ModelSource) -> Path | None:
    """The kept de-quantised copy of ``source``'s GGUF model (``gguf_cache.py``), or None."""
    if not (source.gguf_file and source.cache_dir):
        return None
    from hpcpipe.models.gguf_cache import kept_copy

    return kept_copy(Path(source.path) / source.gguf_file, Path(source.cache_dir), "model")


def _random_model(source: ModelSource, base_dtype: str) -> nn.Module:
    """The architecture of ``source``'s config.json with seeded random weights (every rank alike)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(source.path, local_files_only=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[base_dtype], attn_implementation="sdpa")
    model.config.use_cache = False
    return model


def require_peft() -> Any:
    """The peft module, or one line saying how to install it (it is an optional extra)."""
    try:
        import peft
    except ImportError:
        raise ConfigError(
            "run.recipe lora-function-calling needs the peft package: pip install 'hpcpipe[lora]'"
        ) from None
    return peft


def adapted_layers(model: nn.Module, cfg: LoraConfig) -> list[int] | None:
    """The indices of the decoder layers that get adapters: the last ``lora.top_layers``, or
    None for every layer; ConfigError when the model has fewer layers than that."""
    if cfg.top_layers is None:
        return None
    n = len(decoder_layers(model))
    if cfg.top_layers > n:
        raise ConfigError(f"lora.top_layers: {cfg.top_layers} is more than the model's {n} decoder layers")
    return list(range(n - cfg.top_layers, n))


def check_target_modules(model: nn.Module, cfg: LoraConfig) -> None:
    """ConfigError unless every ``lora.target_modules`` name is a module of ``model`` and
    ``lora.top_layers`` fits its decoder layers."""
    adapted_layers(model, cfg)
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    unknown = [t for t in cfg.target_modules if t not in names]
    if unknown:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise ConfigError(
            f"lora.target_modules: {', '.join(unknown)} match no module of this model "
            f"(its Linear modules: {', '.join(linear)})"
        )


def check_source(source: ModelSource, cfg: LoraConfig) -> None:
    """Before any worker starts: the config loads and the target modules exist.

    The model is built on the meta device (no weights read, no memory), so a typo in a target
    module of a 7B model costs a second, not a load on every rank.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    kept = _kept_model(source)  # a GGUF file's de-quantised copy: read its config.json, not the file
    try:
        if kept is not None:
            config = AutoConfig.from_pretrained(kept, local_files_only=True)
        else:
            config = AutoConfig.from_pretrained(source.path, **source.kwargs())
    except UNREADABLE as exc:
        raise ConfigError(f"{source.key()}: cannot load {source.named()} ({_first_line(exc)})") from None
    with torch.device("meta"), quiet_hf():
        model = AutoModelForCausalLM.from_config(config)
    check_target_modules(model, cfg)


def apply_lora(model: nn.Module, cfg: LoraConfig) -> nn.Module:
    """Wrap ``model`` in a peft LoRA model; only adapter weights require grad afterwards.

    Every ``lora.target_modules`` name must match a module: peft alone accepts a list where some
    names match nothing, and a typo would silently train fewer adapters than asked for.
    """
    peft = require_peft()
    PeftLoraConfig, get_peft_model = peft.LoraConfig, peft.get_peft_model
    check_target_modules(model, cfg)
    peft_cfg = PeftLoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        layers_to_transform=adapted_layers(model, cfg),
        bias="none",
        task_type="CAUSAL_LM",
    )
    # autocast_adapter_dtype=False: we set the adapter dtype ourselves (lora.adapter_dtype).
    with quiet_hf():
        peft_model = get_peft_model(model, peft_cfg, autocast_adapter_dtype=False)
    adapter_dtype = DTYPES[cfg.adapter_dtype]
    for param in peft_model.parameters():
        if param.requires_grad:
            param.data = param.data.to(adapter_dtype)
    return peft_model


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Non-reentrant recomputation per decoder layer (works with frozen inputs and with FSDP2)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[operator]


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers (the FSDP2 units): the longest ModuleList in the model."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        raise ConfigError("model: no decoder layers found (no nn.ModuleList in the model)")
    return list(max(lists, key=lambda layers: len(list(layers))))


@dataclass(frozen=True)
class ParamCounts:
    trainable: int
    frozen: int
    lookup_trainable: int = 0  # of those, an input embedding not tied to the LM head: a lookup
    lookup_frozen: int = 0

    @property
    def fraction(self) -> float:
        return self.trainable / max(self.trainable + self.frozen, 1)

    def training_flops_per_token(self) -> float:
        """Model FLOPs for MFU (``observe/flops.py``: recomputation not credited): 6N for weights
        that train (forward 2N, input and weight gradients 4N), 4N for frozen ones (no weight
        gradients), over the matmul weights only: an untied input embedding is a lookup.
        Attention scores are left out."""
        return 4.0 * (self.frozen - self.lookup_frozen) + 6.0 * (self.trainable - self.lookup_trainable)


def param_counts(model: nn.Module) -> ParamCounts:
    """Trainable and frozen parameter counts (full sizes, also under FSDP2: DTensor numel is global),
    and the input embedding's when it is not the LM head's weight."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    lookup = _untied_input_embedding(model)
    if lookup is None:
        return ParamCounts(trainable, frozen)
    size = lookup.numel()
    return ParamCounts(
        trainable, frozen, size if lookup.requires_grad else 0, 0 if lookup.requires_grad else size
    )


def _untied_input_embedding(model: nn.Module) -> nn.Parameter | None:
    """A Hugging Face model's input embedding weight, None when the LM head shares it (or no such
    accessors)."""
    try:
        inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()  # type: ignore[operator]
    except (AttributeError, NotImplementedError, TypeError):
        return None
    weight = getattr(inputs, "weight", None)
    if not isinstance(weight, nn.Parameter) or weight is getattr(outputs, "weight", None):
        return None
    return weight


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
