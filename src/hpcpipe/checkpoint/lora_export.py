"""Export a committed checkpoint of the ``lora-function-calling`` recipe: adapter or merged model.

The checkpoint holds the adapters only; the base is rebuilt from the run's model source (the
same directory, hub cache entry or GGUF file), the adapters are read from the verified DCP files
through the safe reader (no pickles run), then written as a peft adapter directory
(``PeftModel.from_pretrained(base, DIR)``) or a merged transformers model
(``AutoModelForCausalLM.from_pretrained(DIR)``) in fp32 or bf16.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from hpcpipe.checkpoint.manifest import CheckpointError
from hpcpipe.checkpoint.safe_dcp import SafeFileSystemReader, SafeLoadPlanner
from hpcpipe.config import JobConfig

LoraFormat = Literal["adapter", "merged"]


def export_lora(ckpt: Path, job: JobConfig, fmt: LoraFormat, out: Path, dtype: str) -> Path:
    import torch.distributed.checkpoint as dcp

    from hpcpipe.models.hf_lm import apply_lora, load_base_model, load_tokenizer, resolve_source
    from hpcpipe.models.lora_export import save_adapter, save_merged

    source = resolve_source(job.model, job.data.prepared_dir)
    model = apply_lora(load_base_model(source, "fp32"), job.lora)
    state = {name: p.data for name, p in model.named_parameters() if p.requires_grad}
    try:
        dcp.load(
            {"model": state},
            storage_reader=SafeFileSystemReader(ckpt),
            planner=SafeLoadPlanner(),
            no_dist=True,
        )
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        if type(exc).__name__ != "CheckpointException":
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{ckpt}: adapters do not fit the run's lora config ({first})") from None
    tokenizer = load_tokenizer(source)
    if fmt == "adapter":
        return save_adapter(model, state, out, tokenizer)
    return save_merged(model, out, dtype, tokenizer)
