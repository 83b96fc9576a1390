"""Hyper-parameter search: Optuna studies whose trials are ordinary hpcpipe runs."""
