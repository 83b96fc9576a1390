"""Benchmarks: collectives (nccl-tests' figures), compute ceilings, training throughput, scaling,
roofline and scaling-law analyses. Each module returns JSON-able results; the CLI prints and plots."""
