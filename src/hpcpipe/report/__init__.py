"""Plots and rendered reports, read from run directories."""
