#!/usr/bin/env bash
# One point of the training-mix sweep (README: "The training mix"; benchmarks/README.md: "The
# training-mix sweep"): fine-tune the lora-fc-smollm2 preset with the given overrides as runs/NAME,
# then score it on 30 BFCL cases of each default category (240 cases, no held-out ones, so
# "overall" is BFCL's). Prints the training and evaluation seconds; the tables are in
# runs/NAME/eval/eval.md, and `hpcpipe eval compare BASE runs/NAME/eval` sets them against the base.
#
#   make fc-assets
#   hpcpipe eval function-calling data/external/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
#       --limit 30 --heldout-limit 0 --out runs/fc-base-eval                 # the base, once
#   benchmarks/fc_mix_sweep.sh fc-default                                     # the preset as shipped
#   benchmarks/fc_mix_sweep.sh fc-classic $(benchmarks/fc_mix_sweep.sh --classic)
#   benchmarks/fc_mix_sweep.sh fc-refusals --set data.synthetic_mix.refusal=40
#   FC_CONSTRAIN=1 benchmarks/fc_mix_sweep.sh fc-default   # also scored with --constrain
#                                                          # (runs/NAME/eval-constrained)
#   benchmarks/fc_mix_sweep.sh --smoke [--set ...]   # the same commands at toy size (a check)
#
# --smoke (the test suite runs it): the point "smoke" with the classic mix's overrides, trained for
# one step on the random 2-layer Llama in a temporary directory and scored on one case of each
# category of the repository's sample BFCL files; the JSON line then says "smoke": true.
set -euo pipefail

CLASSIC=(single=30 parallel=12 multi_turn=14 clarify=10 refusal=17 no_access=17 parallel_multiple=0
    irrelevant=0 max_parallel_calls=2 same_function_parallel=0.4 compact_parallel=0 inline_lists=0
    optional_args=0.5 written_numbers=0 copy_values=0 call_only=0 enum_nested=1 science=0 dotted_names=0
    api_namespaces=0 twins=0 restate=0 follow_ups=0 place_formats=0 place_functions=1 near_misses=0
    close_distractors=0)
if [[ "${1:-}" == "--classic" ]]; then  # the overrides that give SyntheticMix.classic()
    for knob in "${CLASSIC[@]}"; do printf -- '--set data.synthetic_mix.%s ' "$knob"; done
    echo
    exit 0
fi
runs=runs
eval_sets=(--limit 30 --heldout-limit 0)
smoke=false
if [[ "${1:-}" == "--smoke" ]]; then
    shift
    runs=$(mktemp -d)
    trap 'rm -rf "$runs"' EXIT
    here=$(cd "$(dirname "$0")" && pwd)
    toy=(model.name_or_path=@tiny-llama-random model.gguf_file=null model.seq_len=256
        data.synthetic_rows=40 train.steps=1 train.global_batch_size=1 "run.out_dir=$runs"
        "data.prepared_dir=$runs/prepared")
    sets=()
    for knob in "${CLASSIC[@]}"; do sets+=(--set "data.synthetic_mix.$knob"); done
    for value in "${toy[@]}"; do sets+=(--set "$value"); done
    set -- smoke "${sets[@]}" "$@"
    eval_sets=(--limit 1 --heldout-limit 0 --max-new-tokens 8 --bfcl-dir "$here/../tests/data/bfcl")
    smoke=true
fi
if [[ $# -lt 1 || "$1" == -* ]]; then
    echo "usage: $0 NAME [--set KEY=VALUE ...]   (or: $0 --classic, $0 --smoke)" >&2
    exit 2
fi
name=$1
shift
hpcpipe=${HPCPIPE:-hpcpipe}
start=$(date +%s)
"$hpcpipe" train lora-fc-smollm2 --set "run.name=$name" --set observe.progress=false "$@"
trained=$(date +%s)
"$hpcpipe" eval function-calling "$runs/$name" "${eval_sets[@]}"
evaluated=$(date +%s)
constrained_s=null
if [[ "${FC_CONSTRAIN:-0}" == 1 ]]; then
    "$hpcpipe" eval function-calling "$runs/$name" "${eval_sets[@]}" --constrain
    constrained_s=$(($(date +%s) - evaluated))
fi
# The context no figure is quoted without (harness.run_context's), from the interpreter hpcpipe runs on.
python=$(head -1 "$(command -v "$hpcpipe")" | sed 's/^#!//')
context=$("$python" -c 'import json, os, platform, datetime, torch, hpcpipe
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), None)
print(json.dumps({"torch": torch.__version__, "cores": os.cpu_count(), "python": platform.python_version(),
    "hpcpipe": hpcpipe.__version__, "cpu_model": model, "date": datetime.date.today().isoformat()})[1:-1])' \
    2>/dev/null || echo '"context": null')
echo "{\"name\": \"$name\", \"train_s\": $((trained - start)), \"eval_s\": $((evaluated - trained)), \"eval_constrained_s\": $constrained_s, \"smoke\": $smoke, $context}"
