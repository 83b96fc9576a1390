"""Export a committed checkpoint of a LoRA run (adapters only): a peft adapter or a merged model.

The checkpoint holds the adapters only; the base is rebuilt from the run's model source (the
same directory, hub cache entry or GGUF file), the adapters are read from the verified DCP files
through the safe reader (no pickles run; a DeepSpeed checkpoint is read with ``weights_only`` and
consolidated by DeepSpeed's ``zero_to_fp32``), then written as a peft adapter directory
(``PeftModel.from_pretrained(base, DIR)``) or a merged transformers model
(``AutoModelForCausalLM.from_pretrained(DIR)``) in fp32 or bf16.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from hpcpipe.checkpoint.deepspeed_io import is_deepspeed_checkpoint, load_consolidated_into
from hpcpipe.checkpoint.safe_dcp import load_state_safely
from hpcpipe.config import JobConfig

LoraFormat = Literal["adapter", "merged"]


def export_lora(ckpt: Path, job: JobConfig, fmt: LoraFormat, out: Path, dtype: str) -> Path:
    from hpcpipe.models.hf_lm import apply_lora, load_base_model, load_tokenizer, resolve_source
    from hpcpipe.models.lora_export import save_adapter, save_merged

    source = resolve_source(job.model, job.data.prepared_dir)
    model = apply_lora(load_base_model(source, "fp32"), job.lora)
    state = {name: p.data for name, p in model.named_parameters() if p.requires_grad}
    misfit = "adapters do not fit the run's lora config"
    if is_deepspeed_checkpoint(ckpt):
        load_consolidated_into(ckpt, state, misfit, trainable_only=True)
    else:
        load_state_safely(ckpt, {"model": state}, misfit)
    tokenizer = load_tokenizer(source)
    if fmt == "adapter":
        return save_adapter(model, state, out, tokenizer)
    return save_merged(model, out, dtype, tokenizer)
