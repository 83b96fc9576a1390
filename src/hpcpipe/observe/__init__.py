"""Observability: metrics files, lineage, progress, FLOPs and device peaks."""
