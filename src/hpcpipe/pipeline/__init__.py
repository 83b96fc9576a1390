"""``hpcpipe run`` as a DAG of steps over the run directory: prepare → stage → train → evaluate →
export → register → report. ``engine`` decides what to run and records it in ``lineage.json``;
``steps`` holds the seven plain functions."""
