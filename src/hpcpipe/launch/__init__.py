"""Where workers come from: local elastic agent, torchrun, Slurm, Kubernetes."""
