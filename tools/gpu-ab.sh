#!/usr/bin/env bash
# A same-call benchmark of several trees on a GPU machine: docs/PERFORMANCE.md's rule for every optimisation.
#
#   tools/gpu-ab.sh prepare REV [REV...]   here: the packages of each git revision into .device/ab/NAME
#                                          (ignored; NAME is REV with / as -), to be carried to the GPU machine
#                                          beside the working tree (the device tool's carry: the one path
#                                          .device/ab); the first REV is the baseline unless MINFER_AB_TREES
#                                          names another
#   tools/gpu-ab.sh run                    there: build each prepared revision's packages into /tmp/ab-site/NAME
#                                          and this tree's into the environment, all at once, then alternate
#                                          `minfer bench` between the trees round by round, each round starting
#                                          one tree later
#
# So one call measures several candidate branches against one baseline (this tree one of them, named "this").
# Knobs of `run`: MINFER_AB_TREES (the trees that take part, in order, the baseline first: prepared ones by NAME,
# the working tree as "this"; default every prepared tree in prepare's order, then this), MINFER_AB_TYPES
# (weight types of the synthetic models, default Q4_0 Q8_0 Q4_K_M; Q4_0, Q4_1, Q5_0 and Q5_1 with llama-quantize's
# Q6_K head), MINFER_AB_PRESET (their shapes, default qwen2.5-0.5b), MINFER_AB_MODELS (GGUF files to bench
# instead of the synthetic models: llama-quantize's presets that tools/bench-vs-llamacpp.sh leaves in its WORKDIR,
# say), MINFER_AB_ROUNDS (default 4), MINFER_AB_REPS (-r, default 10), MINFER_AB_ARGS (more bench flags, default
# -p 512 -n 128), MINFER_AB_BACKEND (default cuda; cpu builds no kernels), MINFER_CUDA_ARCHS (default native),
# PYTHON (default python3), MINFER_AB_KERNELS (set: each round runs the working tree's kernel microbenchmark,
# packages/minfer-kernels/bench/bench_kernels.py, on each tree's kernels instead of `minfer bench` on models; its
# value is the microbenchmark's flags, `--dram` for the table of decode's products with their weights in DRAM, or
# `all` for every table; the table then compares microseconds a launch, row by row). Wheels in ./.whl/ are
# installed first, as tools/gpu-check.sh does. Logs and the tables: $OUT when the device tool runs this, else
# build/gpu-ab; each run adds its table to ab.md there, followed by what its benches wrote to bench-errors.log
# (each distinct line once), and its measurements to ab.csv (ab-kernels.tsv).
set -uo pipefail

cd "$(dirname "$0")/.."
TREES=.device/ab

if [ "${1:-}" = prepare ]; then
    shift
    [ $# -ge 1 ] || { echo "usage: tools/gpu-ab.sh prepare REV [REV...]" >&2; exit 2; }
    rm -rf "$TREES" && mkdir -p "$TREES" || exit 1
    for rev in "$@"; do
        name=${rev//\//-}
        [ "$name" != this ] || { echo "gpu-ab: 'this' names the working tree, not a revision" >&2; exit 2; }
        [ ! -e "$TREES/$name" ] || { echo "gpu-ab: $rev is given twice" >&2; exit 2; }
        # The packages without their tests (the runtime's fixtures are most of its bytes): the carry is 64 MiB a call.
        mkdir -p "$TREES/$name" && git archive "$rev" -- packages ':(exclude)packages/*/tests/*' \
            | tar -x -C "$TREES/$name" || exit 1
        git rev-parse "$rev" > "$TREES/$name/REVISION" || exit 1
        echo "$name" >> "$TREES/ORDER"
        echo "gpu-ab: $rev ($(cut -c1-12 "$TREES/$name/REVISION")) in $TREES/$name"
    done
    echo "gpu-ab: carry $TREES to the GPU machine and run: tools/gpu-ab.sh run (baseline $1, or MINFER_AB_TREES' first)"
    exit 0
fi
if [ "${1:-}" != run ]; then
    echo "usage: tools/gpu-ab.sh prepare REV [REV...] | run" >&2
    exit 2
fi
if [ ! -f "$TREES/ORDER" ]; then
    echo "gpu-ab: no $TREES/ORDER: run 'tools/gpu-ab.sh prepare REV [REV...]' on the checkout first" >&2
    exit 1
fi
# The trees that take part, the baseline first.
if [ -n "${MINFER_AB_TREES:-}" ]; then
    read -ra NAMES <<< "$MINFER_AB_TREES"
else
    mapfile -t NAMES < "$TREES/ORDER"
    NAMES+=(this)
fi
for name in "${NAMES[@]}"; do
    [ "$name" = this ] || [ -f "$TREES/$name/REVISION" ] \
        || { echo "gpu-ab: MINFER_AB_TREES: no prepared tree $name in $TREES" >&2; exit 1; }
done
[ ${#NAMES[@]} -ge 2 ] || { echo "gpu-ab: MINFER_AB_TREES: at least two trees" >&2; exit 1; }

# shellcheck disable=SC2206 # MINFER_AB_MODELS is a list of paths
MODELS=(${MINFER_AB_MODELS:-})
for model in "${MODELS[@]}"; do
    [ -f "$model" ] || { echo "gpu-ab: MINFER_AB_MODELS: $model does not exist" >&2; exit 1; }
done

LOGS=${OUT:-build/gpu-ab}
# The builds' and model writers' logs go back as one archive: the device tool returns at most 8 files a call, and
# a call may hold two A/Bs.
JOB_LOGS=$(mktemp -d)
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

# Every tree builds at once, each in a CMake folder of its own where SKBUILD_BUILD_DIR keeps this tree's (one CMake
# folder serves one source), the cores shared among them (CMAKE_BUILD_PARALLEL_LEVEL: seven builds of 18 nvcc
# processes each would not fit the memory); the synthetic models that are not there yet are written meanwhile, one
# process a type (each a single core's numpy for 15-60 s).
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(( ($(nproc) + ${#NAMES[@]} - 1) / ${#NAMES[@]} ))}
JOBS=()
build() {  # build NAME: a tree's packages, this tree's into the environment, a prepared one's into its site
    local name=$1
    if [ "$name" = this ]; then
        # shellcheck disable=SC2086 # PACKAGES is a list of paths
        "$PYTHON" -m pip install -q --no-build-isolation --no-deps $PACKAGES
    else
        local build_dir=()
        [ -n "${SKBUILD_BUILD_DIR:-}" ] && build_dir=(env "SKBUILD_BUILD_DIR=$SKBUILD_BUILD_DIR-$name")
        # shellcheck disable=SC2086
        (cd "$TREES/$name" && "${build_dir[@]}" "$PYTHON" -m pip install -q --no-build-isolation --no-deps --upgrade \
            --target "/tmp/ab-site/$name" $PACKAGES)
    fi
}
for name in "${NAMES[@]}"; do
    build "$name" > "$JOB_LOGS/build-$name.log" 2>&1 &
    JOBS+=("$!:build-$name")
done
if [ -z "${MINFER_AB_MODELS:-}" ] && [ -z "${MINFER_AB_KERNELS:-}" ]; then
    mkdir -p /tmp/minfer-bench
    for weight_type in ${MINFER_AB_TYPES:-Q4_0 Q8_0 Q4_K_M}; do
        # The files issue 17's table measures are llama-quantize's, whose Q4_0, Q4_1, Q5_0 and Q5_1 models have a
        # Q6_K output head (Q8_0 where rows are not whole super-blocks): these have it too.
        head=()
        case $weight_type in Q4_0 | Q4_1 | Q5_0 | Q5_1) head=(--output-tensor-type Q6_K) ;; esac
        model="/tmp/minfer-bench/${MINFER_AB_PRESET:-qwen2.5-0.5b}-$weight_type${head[*]:+-head-Q6_K}.gguf"
        MODELS+=("$model")
        [ -f "$model" ] && continue
        PYTHONPATH=packages/minfer-runtime/src${PYTHONPATH:+:$PYTHONPATH} "$PYTHON" -m minfer.testing.synthetic \
            "$model" --preset "${MINFER_AB_PRESET:-qwen2.5-0.5b}" --weight-type "$weight_type" "${head[@]}" \
            > "$JOB_LOGS/synthetic-$weight_type.log" 2>&1 &
        JOBS+=("$!:synthetic-$weight_type")
    done
fi
failed=
for job in "${JOBS[@]}"; do
    wait "${job%%:*}" || { tail -30 "$JOB_LOGS/${job#*:}.log"; failed=${job#*:}; }
done
tar czf "$LOGS/job-logs.tar.gz" -C "$JOB_LOGS" .
[ -z "$failed" ] || exit 1

# bench TREE MODEL ROUND: one `minfer bench` of one tree, its header and result rows tagged with the tree, the round
# and the model's file name (each tree's own header: a tree's bench may write fields another's does not).
bench() {
    local tree=$1 model=$2 round=$3 path=${PYTHONPATH:-}
    [ "$tree" != this ] && path=/tmp/ab-site/$tree${PYTHONPATH:+:$PYTHONPATH}
    # shellcheck disable=SC2086 # MINFER_AB_ARGS is a list of flags
    PYTHONPATH=$path "$PYTHON" -m minfer.cli bench -m "$model" --backend "$BACKEND" \
        ${MINFER_AB_ARGS:--p 512 -n 128} -r "${MINFER_AB_REPS:-10}" -o csv 2>> "$LOGS/bench-errors.log" \
        | sed "s/^/$tree,$round,$(basename "$model"),/"
}

# microbench TREE ROUND: the kernel microbenchmark on one tree's kernels, each row's name and microseconds a launch
# (the two numbers that end a row: microseconds, then a rate) tagged with the tree and the round, tab-separated.
microbench() {
    local tree=$1 round=$2 path=${PYTHONPATH:-} flags=()
    [ "$tree" != this ] && path=/tmp/ab-site/$tree${PYTHONPATH:+:$PYTHONPATH}
    [ "$MINFER_AB_KERNELS" != all ] && read -ra flags <<< "$MINFER_AB_KERNELS"
    PYTHONPATH=$path "$PYTHON" packages/minfer-kernels/bench/bench_kernels.py "${flags[@]}" \
        2>> "$LOGS/bench-errors.log" | awk -v tree="$tree" -v round="$round" \
        '$NF ~ /^[0-9.]+$/ && $(NF - 1) ~ /^[0-9.]+$/ { name = $0; sub(/[ ]+[0-9.]+[ ]+[0-9.]+$/, "", name);
         gsub(/[ ]+/, " ", name); print tree "\t" round "\t" name "\t" $(NF - 1) }'
}

# What this run's benches write to bench-errors.log, each distinct line once, after its table (in ab.md too): a
# flag that `minfer bench` refuses leaves a model with no rows at all, which the table cannot mark "no result"
# (session 58: `-d 8192` without `--ctx-size` gave an empty table).
ERRORS_FROM=$(($(cat "$LOGS/bench-errors.log" 2>/dev/null | wc -c) + 1))
report_errors() {
    local said
    said=$(tail -c "+$ERRORS_FROM" "$LOGS/bench-errors.log" 2>/dev/null | sort -u | head -5)
    [ -z "$said" ] || printf 'gpu-ab: the benches wrote to bench-errors.log (distinct lines, at most 5):\n%s\n' "$said"
}

# This run's measurements, from which its table is made; both are then added to what the earlier runs with these
# logs left (ab.csv or ab-kernels.tsv, and ab.md), so the A/Bs of one device call keep every table: the call returns
# at most 8 files, and its output only its last 12,000 characters.
RUN_DATA=$(mktemp)
REVISIONS=()
for name in "${NAMES[@]}"; do
    if [ "$name" = this ]; then REVISIONS+=("this=the working tree"); else
        REVISIONS+=("$name=$(cut -c1-12 "$TREES/$name/REVISION")"); fi
done

if [ -n "${MINFER_AB_KERNELS:-}" ]; then
    for round in $(seq 1 "${MINFER_AB_ROUNDS:-4}"); do
        for i in "${!NAMES[@]}"; do  # who goes first rotates, as below
            microbench "${NAMES[$(((i + round - 1) % ${#NAMES[@]}))]}" "$round"
        done
    done > "$RUN_DATA"
    cat "$RUN_DATA" >> "$LOGS/ab-kernels.tsv"
    "$PYTHON" - "$RUN_DATA" "${REVISIONS[@]}" <<'PY' | tee -a "$LOGS/ab.md"
"""The table: per microbenchmark row, each tree's microseconds a launch per round, their mean and its change
against the baseline (the first tree; negative is faster)."""
import statistics
import sys

trees = [arg.split("=", 1) for arg in sys.argv[2:]]
runs: dict[str, dict[str, list[float]]] = {}
for line in open(sys.argv[1]):
    tree, _, row, us = line.rstrip("\n").split("\t")
    runs.setdefault(row, {name: [] for name, _ in trees})[tree].append(float(us))
print("trees: " + ", ".join(f"{name} ({revision})" for name, revision in trees))
print(f"µs a launch per round, the order of the trees rotating each round; changes against {trees[0][0]}")
print("| kernel | tree | µs per round | mean | change |")
print("| --- | --- | --- | ---: | ---: |")
for row, by_tree in runs.items():
    base = by_tree[trees[0][0]]
    baseline = statistics.mean(base) if base else float("nan")
    for name, _ in trees:
        times = by_tree[name]
        if not times:
            print(f"| {row} | {name} | no result (bench-errors.log) | | |")
            continue
        mean = statistics.mean(times)
        change = "" if name == trees[0][0] else f"{100 * (mean / baseline - 1):+.1f}%"
        print(f"| {row} | {name} | {' / '.join(f'{t:.2f}' for t in times)} | {mean:.2f} | {change} |")
print()  # the next run's table starts apart
PY
    table=$?
    report_errors | tee -a "$LOGS/ab.md"
    exit "$table"
fi

for round in $(seq 1 "${MINFER_AB_ROUNDS:-4}"); do
    for model in "${MODELS[@]}"; do
        for i in "${!NAMES[@]}"; do  # round r starts with tree r - 1 (modulo the trees): who goes first rotates
            bench "${NAMES[$(((i + round - 1) % ${#NAMES[@]}))]}" "$model" "$round"
        done
    done
done > "$RUN_DATA"
cat "$RUN_DATA" >> "$LOGS/ab.csv"
"$PYTHON" - "$RUN_DATA" "${REVISIONS[@]}" <<'PY' | tee -a "$LOGS/ab.md"
"""The table: per model and test, each tree's t/s per round (with the bench's own standard deviation over its
repetitions), their mean and its change against the baseline (the first tree)."""
import csv
import statistics
import sys

trees = [arg.split("=", 1) for arg in sys.argv[2:]]
# bench -o csv's rows after the three tags, read by the field names of the header before them (llama-bench's
# cpu_info first). Each tree runs its own defaults (a KV cache type among them): a test a tree gives twice in a round
# (a list of -ctk values) would be two measurements under one name, so it is refused.
runs: dict[tuple[str, str], dict[str, list[tuple[float, float]]]] = {}
header: list[str] = []
seen: set[tuple[str, ...]] = set()
for tree, round_, model, *record in csv.reader(open(sys.argv[1])):
    if record[0] == "cpu_info":
        header = record
        continue
    fields = dict(zip(header, record, strict=True))
    if (tree, round_, model, fields["test"]) in seen:
        sys.exit(f"gpu-ab: {tree} gave {fields['test']} twice in round {round_}: one value a flag (no -ctk lists)")
    seen.add((tree, round_, model, fields["test"]))
    rate = (float(fields["avg_ts"]), float(fields["stddev_ts"]))
    runs.setdefault((model, fields["test"]), {name: [] for name, _ in trees})[tree].append(rate)
print("trees: " + ", ".join(f"{name} ({revision})" for name, revision in trees))
print(f"t/s per round ± the bench's standard deviation, the order of the trees rotating each round; changes against "
      f"{trees[0][0]}")
print("| model | test | tree | t/s per round | mean | change |")
print("| --- | ---: | --- | --- | ---: | ---: |")
for (model, test), by_tree in runs.items():
    baseline = statistics.mean(r for r, _ in by_tree[trees[0][0]]) if by_tree[trees[0][0]] else float("nan")
    for name, _ in trees:
        rates = by_tree[name]
        if not rates:
            print(f"| {model} | {test} | {name} | no result (bench-errors.log) | | |")
            continue
        mean = statistics.mean(r for r, _ in rates)
        change = "" if name == trees[0][0] else f"{100 * (mean / baseline - 1):+.1f}%"
        per_round = " / ".join(f"{r:.0f} ± {sd:.0f}" for r, sd in rates)
        print(f"| {model} | {test} | {name} | {per_round} | {mean:.0f} | {change} |")
print()  # the next run's table starts apart
PY
table=$?
report_errors | tee -a "$LOGS/ab.md"
exit "$table"
