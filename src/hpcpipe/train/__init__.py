"""The training loop and what it is built from: distributed init, parallelism, precision, schedule."""
