#!/usr/bin/env bash
# A same-call before/after benchmark on a GPU machine: docs/PERFORMANCE.md's rule for every optimisation.
#
#   tools/gpu-ab.sh prepare REV   here: the packages of git revision REV into .device/base (ignored), to be
#                                 carried to the GPU machine beside the working tree (the device tool's carry)
#   tools/gpu-ab.sh run           there: build REV's packages into /tmp/base-site and this tree's into the
#                                 environment, then alternate `minfer bench` between the two, round by round
#
# Knobs of `run`: MINFER_AB_TYPES (weight types of the synthetic models, default Q4_0 Q8_0 Q4_K_M),
# MINFER_AB_PRESET (their shapes, default qwen2.5-0.5b), MINFER_AB_MODELS (GGUF files to bench instead of the
# synthetic models: llama-quantize's presets that tools/bench-vs-llamacpp.sh leaves in its WORKDIR, say),
# MINFER_AB_ROUNDS (default 4), MINFER_AB_REPS (-r,
# default 10), MINFER_AB_ARGS (more bench flags, default -p 512 -n 128), MINFER_AB_BACKEND (default cuda; cpu
# builds no kernels), MINFER_CUDA_ARCHS (default native), PYTHON (default python3). Wheels in ./.whl/ are installed
# first, as tools/gpu-check.sh does. Logs and the table: $OUT when the device tool runs this, else build/gpu-ab.
set -uo pipefail

cd "$(dirname "$0")/.."
BASE=.device/base

if [ "${1:-}" = prepare ]; then
    rev=${2:?usage: tools/gpu-ab.sh prepare REV}
    # The packages without their tests (the runtime's fixtures are most of its bytes): the carry is 64 MiB a call.
    rm -rf "$BASE" && mkdir -p "$BASE" && git archive "$rev" -- packages ':(exclude)packages/*/tests/*' \
        | tar -x -C "$BASE" || exit 1
    git rev-parse "$rev" > "$BASE/REVISION"
    echo "gpu-ab: $(cat "$BASE/REVISION") in $BASE; carry .device to the GPU machine and run: tools/gpu-ab.sh run"
    exit 0
fi
if [ "${1:-}" != run ]; then
    echo "usage: tools/gpu-ab.sh prepare REV | run" >&2
    exit 2
fi
if [ ! -f "$BASE/REVISION" ]; then
    echo "gpu-ab: no $BASE/REVISION: run 'tools/gpu-ab.sh prepare REV' on the checkout first" >&2
    exit 1
fi

# shellcheck disable=SC2206 # MINFER_AB_MODELS is a list of paths
MODELS=(${MINFER_AB_MODELS:-})
for model in "${MODELS[@]}"; do
    [ -f "$model" ] || { echo "gpu-ab: MINFER_AB_MODELS: $model does not exist" >&2; exit 1; }
done

LOGS=${OUT:-build/gpu-ab}
mkdir -p "$LOGS"
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 MINFER_CUDA_ARCHS=${MINFER_CUDA_ARCHS:-native}
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
BACKEND=${MINFER_AB_BACKEND:-cuda}
PACKAGES="./packages/minfer-runtime"
[ "$BACKEND" = cuda ] && PACKAGES="./packages/minfer-kernels $PACKAGES"
# shellcheck disable=SC2086 # PACKAGES is a list of paths
"$PYTHON" -m pip install -q --no-build-isolation --no-deps $PACKAGES > "$LOGS/build-after.log" 2>&1 \
    || { tail -30 "$LOGS/build-after.log"; exit 1; }
# The synthetic models that are not there yet are written at once, one process a type (each a single core's numpy
# for 15-60 s), while REV's packages install.
WRITERS=()
if [ -z "${MINFER_AB_MODELS:-}" ]; then
    mkdir -p /tmp/minfer-bench
    for weight_type in ${MINFER_AB_TYPES:-Q4_0 Q8_0 Q4_K_M}; do
        model="/tmp/minfer-bench/${MINFER_AB_PRESET:-qwen2.5-0.5b}-$weight_type.gguf"
        MODELS+=("$model")
        [ -f "$model" ] && continue
        "$PYTHON" -m minfer.testing.synthetic "$model" --preset "${MINFER_AB_PRESET:-qwen2.5-0.5b}" \
            --weight-type "$weight_type" > "$LOGS/synthetic-$weight_type.log" 2>&1 &
        WRITERS+=("$!:$weight_type")
    done
fi

# REV's build gets a folder of its own where SKBUILD_BUILD_DIR keeps this tree's (one CMake folder serves one source).
BEFORE_BUILD=()
[ -n "${SKBUILD_BUILD_DIR:-}" ] && BEFORE_BUILD=(env "SKBUILD_BUILD_DIR=$SKBUILD_BUILD_DIR-before")
# shellcheck disable=SC2086
(cd "$BASE" && "${BEFORE_BUILD[@]}" "$PYTHON" -m pip install -q --no-build-isolation --no-deps --upgrade \
    --target /tmp/base-site $PACKAGES) > "$LOGS/build-before.log" 2>&1 || { tail -30 "$LOGS/build-before.log"; exit 1; }
BEFORE_PATH=/tmp/base-site${PYTHONPATH:+:$PYTHONPATH}
for writer in "${WRITERS[@]}"; do
    wait "${writer%%:*}" || { tail -30 "$LOGS/synthetic-${writer#*:}.log"; exit 1; }
done

# bench TREE MODEL ROUND: one `minfer bench` of one tree, its result rows tagged with the tree, the round and the
# model's file name.
bench() {
    local tree=$1 model=$2 round=$3 path=${PYTHONPATH:-}
    [ "$tree" = before ] && path=$BEFORE_PATH
    # shellcheck disable=SC2086 # MINFER_AB_ARGS is a list of flags
    PYTHONPATH=$path "$PYTHON" -m minfer.cli bench -m "$model" --backend "$BACKEND" \
        ${MINFER_AB_ARGS:--p 512 -n 128} -r "${MINFER_AB_REPS:-10}" -o csv 2>> "$LOGS/bench-errors.log" \
        | tail -n +2 | sed "s/^/$tree,$round,$(basename "$model"),/"
}

for round in $(seq 1 "${MINFER_AB_ROUNDS:-4}"); do
    for model in "${MODELS[@]}"; do
        if [ $((round % 2)) = 1 ]; then order="after before"; else order="before after"; fi  # alternate who goes first
        for tree in $order; do bench "$tree" "$model" "$round"; done
    done
done > "$LOGS/ab.csv"

"$PYTHON" - "$LOGS/ab.csv" "$(cat "$BASE/REVISION")" <<'EOF' | tee "$LOGS/ab.md"
"""The A/B table: per model and test, each tree's t/s per round, their means and the change."""
import csv
import statistics
import sys

rows = list(csv.reader(open(sys.argv[1])))
# bench -o csv's columns after the three tags: avg_ts is column 14, test 16 (llama-bench's order)
runs: dict[tuple[str, str], dict[str, list[float]]] = {}
for tree, _round, model, *record in rows:
    runs.setdefault((model, record[16]), {"before": [], "after": []})[tree].append(float(record[14]))
print(f"before = {sys.argv[2][:12]}, after = this tree; t/s per round, rounds alternating which tree goes first")
print("| model | test | before | after | change |")
print("| --- | ---: | --- | --- | ---: |")
for (model, test), trees in runs.items():
    before, after = (statistics.mean(trees[t]) for t in ("before", "after"))
    cells = [" / ".join(f"{v:.0f}" for v in trees[t]) for t in ("before", "after")]
    print(f"| {model} | {test} | {cells[0]} | {cells[1]} | {100 * (after / before - 1):+.1f}% |")
EOF
