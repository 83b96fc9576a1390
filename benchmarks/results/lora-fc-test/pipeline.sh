#!/bin/bash
# Issue 50 item 1: the preset as shipped on the test split, 3 seeds + the base. Resumable.
# Run from anywhere in a checkout with `make install` done; as run on 2026-12-01, with that machine's
# absolute paths replaced by the repository's own (and the training step's marker lora_summary.json:
# seed 0 ran with one training does not write, which only matters when resuming).
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
export PATH=$PWD/.venv/bin:$PATH
mkdir -p runs/fc-test
LOG=runs/fc-test/pipeline.log
log() { echo "$(date -u +%FT%TZ) $*" >> $LOG; }
step() { # name marker cmd...
  local name=$1 marker=$2; shift 2
  if [ -e "$marker" ]; then log "skip $name ($marker exists)"; return 0; fi
  log "start $name: $*"
  local t0=$(date +%s)
  "$@" > runs/fc-test/$name.out 2>&1; local rc=$?
  log "end $name rc=$rc $(( $(date +%s) - t0 )) s"
  return $rc
}
for s in 0 1 2; do
  step train-s$s runs/fc-test-s$s/lora_summary.json \
    hpcpipe train lora-fc-smollm2 --set run.name=fc-test-s$s --set run.seed=$s || exit 1
  step eval-s$s runs/fc-test-s$s/eval-constrained/eval.json \
    hpcpipe eval function-calling runs/fc-test-s$s --split test --heldout-limit 0 --constrain || exit 1
  step decline-s$s runs/fc-test-s$s/eval-constrained-declined/eval.json \
    hpcpipe eval decline runs/fc-test-s$s || exit 1
done
step base runs/fc-test-s0/eval-base-constrained/eval.json \
  hpcpipe eval function-calling runs/fc-test-s0 --base --split test --heldout-limit 0 --constrain || exit 1
log "all done"
