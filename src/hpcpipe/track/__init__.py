"""What stays after a run, outside its directory: TensorBoard event files, MLflow runs and the
MLflow model registry. Every sink here runs on rank 0 only and never fails or stalls training;
the run directory stays the source of truth (``hpcpipe track sync`` replays it)."""
