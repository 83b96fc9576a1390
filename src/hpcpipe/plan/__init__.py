"""Capacity planning from a run's measured costs: `hpcpipe plan goodput`.

Goodput is the share of GPU time that trains. Checkpoints cost time to write, and failures cost
the work since the last checkpoint plus a restart and a restore; failures grow with the number of
GPUs. One concern per module:

- ``closed_form.py``: Young's and Daly's optimal intervals and the expected goodput of a periodic
  checkpoint schedule under exponential failures (Daly 2006).
- ``simulate.py``: a seeded Monte-Carlo simulation of the same model, as an independent check.
- ``failures.py``: the failure rate: per-GPU MTBF (default from Llama 3), divided by the GPUs.
- ``headroom.py``: the largest checkpoint and restart costs at which the optimum still loses only
  5% of the time.
- ``measured.py``: save, restore, restart and step times read from a run directory.
- ``inputs.py``: which time comes from where (given on the command line, measured, defaulted).
- ``goodput.py``: the plan itself, one row per cluster size and checkpoint tier.
- ``plot.py``: goodput against checkpoint interval, the optimal points marked.
"""
