"""``hpcpipe recipes check``: the properties every recipe must have, run at test size on the CPU.

- ``job.py``: the job a recipe is checked with (its ``check_preset`` and ``check_overrides``,
  shrunk to a few steps that split over 1 and 2 ranks).
- ``loader.py``: the loader gives the same batches from the same (seed, step, rank), resumes from
  its state, and serves the same global batch at 1 and 2 ranks (in this process).
- ``training.py``: real runs of ``hpcpipe train`` (1 process, 2 DDP ranks, 2 FSDP2 ranks, and
  2 DDP ranks whose rank 1 is SIGKILLed and the group restarted), compared step by step; the
  checkpoint store's round trip; exports loaded back; evaluation metrics; bad recipe arguments.
- ``runner.py``: the properties in order, the report (``hpcpipe.testing`` gives the same to pytest).
"""
