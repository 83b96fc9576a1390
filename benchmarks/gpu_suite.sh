#!/usr/bin/env bash
# The GPU checklist in one command: a thin wrapper of benchmarks/gpu_suite.py (every option passes
# through; `benchmarks/gpu_suite.sh --help` explains them). The interpreter: $PYTHON, else the
# project's .venv, else python3 (a GPU machine with `pip install --no-deps -e .`).
#   benchmarks/gpu_suite.sh                       # on a GPU machine: ~8 minutes, table + JSON
#   benchmarks/gpu_suite.sh --cpu-dry-run         # the same steps at toy size on a CPU
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
    if [[ -x "$here/../.venv/bin/python" ]]; then python="$here/../.venv/bin/python"; else python=python3; fi
fi
exec "$python" "$here/gpu_suite.py" "$@"
