"""What `hpcpipe eval function-calling` and `hpcpipe eval decline` evaluate: a run directory (its
base model and adapter, held-out conversations), a transformers model directory or a GGUF file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout


def load_target(
    target: Path, base: bool, constrain: bool = False, split: str = "dev"
) -> tuple[Any, Any, list[Any], dict[str, Any], Path]:
    """(model, chat format, held-out conversations, meta, default output dir) for TARGET; the
    output dir of a ``--constrain`` evaluation, or of BFCL's ``split`` other than dev, sits
    beside the free dev one's (``RunLayout.fc_eval_dir``)."""
    from hpcpipe.data.function_calling.tokens import ChatFormat
    from hpcpipe.models.hf_lm import ModelSource, load_base_model, load_tokenizer

    if RunLayout(target).config.is_file():
        return load_run(target, base, constrain, split)
    if target.suffix == ".gguf":
        if not target.is_file():
            raise UserError(f"{target}: no such GGUF file")
        from hpcpipe.models.gguf_cache import kept_root

        kept = kept_root(None)  # the machine's de-quantised copy, shared with training runs
        source = ModelSource(str(target.parent), target.name, cache_dir=str(kept) if kept else None)
    elif (target / "config.json").is_file():
        source = ModelSource(str(target), None)
    else:
        raise UserError(
            f"{target}: not a run directory (config.yaml), a model directory (config.json) or a .gguf file"
        )
    chat = ChatFormat(load_tokenizer(source))
    meta = {"model": str(target), "adapter": None}
    return load_base_model(source, "fp32"), chat, [], meta, default_out(target, base, constrain, split)


def default_out(target: Path, base: bool, constrain: bool, split: str) -> Path:
    """Where an evaluation of TARGET goes without --out: RUN/eval... for a run directory (RUN/eval-base
    with ``base``), else ./eval, ./eval-test-constrained... (``RunLayout.fc_eval_dir``)."""
    run = RunLayout(target)
    return (
        run.fc_eval_dir(base, constrain, split)
        if run.config.is_file()
        else RunLayout(Path()).fc_eval_dir(False, constrain, split)
    )


def load_run(
    run_dir: Path, base: bool, constrain: bool, split: str = "dev"
) -> tuple[Any, Any, list[Any], dict[str, Any], Path]:
    from hpcpipe.config import load_config
    from hpcpipe.data.function_calling.prepare import read_heldout
    from hpcpipe.models.lora_export import load_with_adapter
    from hpcpipe.recipes import build_recipe
    from hpcpipe.recipes.registry import names_where, recipe_class

    layout = RunLayout(run_dir)
    job = load_config(layout.config)
    if "function-calling" not in recipe_class(job.run.recipe).evaluations:
        supported = " or ".join(names_where(lambda cls: "function-calling" in cls.evaluations))
        raise UserError(f"{run_dir}: run.recipe is {job.run.recipe!r}, not {supported}")
    recipe: Any = build_recipe(job)
    recipe.prepare(progress=False)  # the held-out split (reused when already prepared)
    heldout = read_heldout(recipe.data_dir / "heldout.jsonl")
    adapter = layout.adapter
    if base:
        from hpcpipe.models.hf_lm import load_base_model

        model = load_base_model(recipe.source, "fp32")
    else:
        require_adapter(adapter)
        model = load_with_adapter(recipe.source, adapter)
    meta = {"model": job.model.name_or_path, "run": str(run_dir), "adapter": None if base else str(adapter)}
    return model, recipe.chat, heldout, meta, layout.fc_eval_dir(base, constrain, split)


def require_adapter(adapter: Path) -> None:
    """UserError unless ``adapter`` holds an exported adapter, its config and its weights: a
    training run cut off before its export leaves neither, or (re-exporting) the config alone."""
    if not (adapter / "adapter_config.json").is_file():
        raise UserError(f"{adapter}: no adapter (train the run to the end, or pass --base)")
    if not any(p.is_file() for p in adapter.glob("adapter_model*")):
        raise UserError(
            f"{adapter}: no adapter weights (adapter_model*; train the run to the end, or pass --base)"
        )
