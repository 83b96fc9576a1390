"""The failure rate a plan assumes: per GPU, scaled to the job (no numpy: the CLI's --help uses it).

Any GPU's failure (with its share of host, network and software faults) stops a synchronous job,
so the job's MTBF is the per-GPU MTBF divided by the number of GPUs. The default per-GPU MTBF
comes from Llama 3 (Meta, 2024, "The Llama 3 Herd of Models", section 3.3.4): 419 unexpected
interruptions in 54 days of pre-training on up to 16,384 GPUs.
"""

from __future__ import annotations

LLAMA3_INTERRUPTIONS = 419
LLAMA3_GPU_HOURS = 54 * 24 * 16_384
DEFAULT_GPU_MTBF_HOURS = LLAMA3_GPU_HOURS / LLAMA3_INTERRUPTIONS  # ≈ 50,677 h per GPU


def job_mtbf_s(gpu_mtbf_hours: float, gpus: int) -> float:
    """Seconds between failures of a job on ``gpus`` GPUs."""
    return gpu_mtbf_hours * 3600.0 / gpus
