#!/usr/bin/env bash
# One device call's command, on the GPU machine: tools/device-call.sh STEP [STEP...] (or: eval CMD).
#
# Every call first keeps what it carried and joins each real model whose parts are all there (tools/device-carry.sh
# keep and join), installs the carried wheels into /tmp/site, and sets what the steps share: MINFER_HOME
# (/tmp/minfer-home, where join puts the models), SKBUILD_BUILD_DIR (build/skbuild: gpu-check.sh's build and
# gpu-ab.sh's working tree reuse one warm build folder across the calls of one machine), MINFER_TEST_WORKERS (12)
# and MINFER_CUDA_ARCHS (90: the device's H100s and H200s; override for another GPU).
#
#   suite          tools/gpu-check.sh's build, kernel tests and the kernel tests under memcheck (~8.5 min on an
#                  H100: a call of its own); like suite2 it needs the carried wheels (.whl, this call's or an
#                  earlier call's on this machine) and stops at once without them
#   suite2         the rest of tools/gpu-check.sh (microbench, the runtime's and chat's CUDA tests with the real
#                  models joined so far, `minfer run` under memcheck, bench, depth, op timing, the toys)
#   models SPEC... write these synthetic models in the background, on through the call's end, for a later call's
#                  ab (SPEC: PRESET:TYPE or PRESET:TYPE:HEAD, HEAD the output head's type; the file is
#                  /tmp/minfer-bench/PRESET-TYPE[-head-HEAD].gguf, gpu-ab.sh's name)
#   ab SPEC...     tools/gpu-ab.sh run on those models (written first where missing, after any background writer
#                  is done); its knobs pass through (MINFER_AB_ROUNDS defaults to 2 here); with MINFER_AB_KERNELS
#                  set, no SPEC: the microbenchmark instead of models; the call's ab steps each add their table to
#                  $OUT/ab.md
#   table SHAPE... issue 17's table (tools/bench-vs-llamacpp.sh) on these synthetic shapes (none: only the files
#                  that MINFER_TABLE_ARGS names, `--models FILE,...`; its other flags pass through it too): this tree
#                  built and installed as for timeline, the models written while llama.cpp's background build
#                  (started by the call that carried .device/llama-src.tar.xz: tools/device-carry.sh keep; on every
#                  core where that call opens with table) runs on, then benched; the output also in $OUT/table.log,
#                  row by row
#   timeline SPEC...
#                  this tree built and installed (gpu-check.sh's build and install, none of its steps), then
#                  tools/timeline.py on each model at each of MINFER_TIMELINE_DEPTHS (default "0 2048"): the decode
#                  step's kernels as the GPU overlaps them; with MINFER_TIMELINE_TREES (say "main exp-..."), on each
#                  of those trees in turn, as an earlier ab step of this machine built them (/tmp/ab-site/NAME;
#                  "this": this tree, built and installed as above), so a same-call A/B shows which kernel moved
#   profile SPEC...
#                  this tree built and installed as for timeline, then Nsight Compute (ncu, clocks as they run) on
#                  each model's first decode kernels at each of MINFER_PROFILE_DEPTHS (default "0 2048"): the kernels
#                  whose names match MINFER_PROFILE_KERNELS (default attention_decode|gemv: decode's own; add
#                  rms_norm_add for Gemma 3's norms), the first MINFER_PROFILE_COUNT (default 12: two layers) of
#                  them, each alone, with its speed of light, warp states (ncu's rule names the stall that
#                  dominates), launch and occupancy; the whole report into $OUT/profile-SPEC-dDEPTH.txt, its
#                  durations, throughputs and stall lines printed
#   source SPEC... as profile, ncu's source page instead of its sections: each SASS instruction's warp-stall samples
#                  (tools/sass_hotspots.py), for the first MINFER_SOURCE_COUNT (default 4) matching kernels, sampled
#                  every 2^(5 + MINFER_SOURCE_INTERVAL) cycles (default auto: ncu's choice; 0 for short kernels); the
#                  page into $OUT/source-SPEC-dDEPTH.csv, its summary (the MINFER_SOURCE_TOP busiest instructions,
#                  default 25, a kernel) printed
#   phases TREE... packages/minfer-kernels/bench/decode_attention_phases.cu of each tree ("this", or one that
#                  tools/gpu-ab.sh prepare put in .device/ab), built for the first of MINFER_CUDA_ARCHS, all at once,
#                  then run in turn, each for at most MINFER_PHASES_TIMEOUT s (default 60: a launch that never ends
#                  ends there, the next tree still runs); each output also into $OUT/phases-TREE.txt
#   eval CMD       CMD in this environment
#
# A call that must chain with the next one (a machine idle for 30 s is given back) should leave nothing to decide
# between them: prepare every tree the next call may run (tools/gpu-ab.sh prepare) before the first, and check that
# the working tree is the one meant before a suite call. On the device `git log -1` names the commit the session
# started from, whatever is checked out here: the commits since show as changes (`git status --short`, or grep a
# changed line), so check here (git log -1, git status) and there with those.
set -uo pipefail

cd "$(dirname "$0")/.."
export MINFER_CUDA_ARCHS=${MINFER_CUDA_ARCHS:-90} MINFER_HOME=${MINFER_HOME:-/tmp/minfer-home} PYTHONUNBUFFERED=1
export SKBUILD_BUILD_DIR=${SKBUILD_BUILD_DIR:-$PWD/build/skbuild} MINFER_TEST_WORKERS=${MINFER_TEST_WORKERS:-12}
PYTHON=${PYTHON:-python3}
BENCH_DIR=/tmp/minfer-bench
WRITING=$BENCH_DIR/writing  # there while a background writer runs
mkdir -p "$MINFER_HOME" "$BENCH_DIR"
# A call that opens with `table` waits for llama.cpp's build: that build takes every core.
[ "${1:-}" = table ] && export LLAMA_BUILD_JOBS=${LLAMA_BUILD_JOBS:-$(nproc)}
tools/device-carry.sh keep >/dev/null && tools/device-carry.sh join || exit 1
if compgen -G ".whl/*.whl" >/dev/null && [ ! -d /tmp/site/gguf ]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}

# model_path SPEC: the file of a synthetic model
model_path() {
    local preset type head
    IFS=: read -r preset type head <<< "$1"
    echo "$BENCH_DIR/$preset-$type${head:+-head-$head}.gguf"
}

# write_model SPEC: writes it unless it is there (a file appears whole: written aside, then renamed)
write_model() {
    local preset type head path
    IFS=: read -r preset type head <<< "$1"
    path=$(model_path "$1")
    [ -f "$path" ] && return 0
    PYTHONPATH=packages/minfer-runtime/src:$PYTHONPATH "$PYTHON" -m minfer.testing.synthetic "$path.part" \
        --preset "$preset" --weight-type "$type" ${head:+--output-tensor-type "$head"} \
        > "$BENCH_DIR/$preset-$type.log" 2>&1 && mv "$path.part" "$path"
}

# install_this_tree STEP: this tree built and installed (gpu-check.sh's build and install, none of its steps), the
# log in the bench folder, its tail printed if it fails
install_this_tree() {
    MINFER_GPU_CHECK_ONLY=none bash tools/gpu-check.sh > "$BENCH_DIR/$1-build.log" 2>&1 \
        || { tail -30 "$BENCH_DIR/$1-build.log"; return 1; }
}

# ncu_on_decode SPEC DEPTH COUNT REPORT [NCU FLAG...]: ncu (clocks as they run) on the first COUNT decode kernels
# of SPEC's model at DEPTH whose names match MINFER_PROFILE_KERNELS, each alone; its output into REPORT
ncu_on_decode() {
    local spec=$1 depth=$2 count=$3 report=$4
    shift 4
    ncu --clock-control none "$@" -k "regex:${MINFER_PROFILE_KERNELS:-attention_decode|gemv}" -c "$count" \
        "$PYTHON" -m minfer.cli bench "$(model_path "$spec")" --backend cuda -p 0 -n 4 -d "$depth" \
        --ctx-size $((depth + 64)) -r 1 > "$report" 2>&1
}

# profile_report SPEC DEPTH REPORT: ncu's sections on the decode kernels into REPORT, the lines that say where
# their time went printed
profile_report() {
    ncu_on_decode "$1" "$2" "${MINFER_PROFILE_COUNT:-12}" "$3" --section SpeedOfLight --section WarpStateStats \
        --section LaunchStats --section Occupancy || { tail -20 "$3"; return 1; }
    # the kernels' header lines (name, grid, block), then the lines that say where time went
    grep -E -e "^  [A-Za-z_].*\(|Duration|DRAM Throughput|Memory Throughput|Registers Per Thread" \
        -e "Achieved Occupancy|being stalled" "$3" \
        || { echo "device-call: no kernel profiled in $3; its end:" >&2; tail -5 "$3" >&2; return 1; }
}

# source_report SPEC DEPTH REPORT: ncu's source page of the decode kernels into REPORT, its summary printed
source_report() {
    ncu_on_decode "$1" "$2" "${MINFER_SOURCE_COUNT:-4}" "$3" --section SourceCounters --section WarpStateStats \
        --page source --print-source sass --csv --warp-sampling-interval "${MINFER_SOURCE_INTERVAL:-auto}" \
        || { tail -20 "$3"; return 1; }
    "$PYTHON" tools/sass_hotspots.py "$3" --top "${MINFER_SOURCE_TOP:-25}" || { tail -5 "$3" >&2; return 1; }
}

# on_each_decode STEP EXTENSION SPEC...: this tree built and installed, then for each model at each of
# MINFER_PROFILE_DEPTHS (default "0 2048") STEP_report's ncu output into $OUT/STEP-SPEC-dDEPTH.EXTENSION
on_each_decode() {
    local name=$1 extension=$2 spec depth report failed=0
    shift 2
    install_this_tree "$name" || return 1
    command -v ncu >/dev/null || { echo "device-call: $name needs Nsight Compute's ncu" >&2; return 1; }
    while [ -f "$WRITING" ]; do sleep 2; done
    for spec; do
        write_model "$spec" || { echo "device-call: $(model_path "$spec") was not written" >&2; return 1; }
        for depth in ${MINFER_PROFILE_DEPTHS:-0 2048}; do
            report=${OUT:-$BENCH_DIR}/$name-${spec//:/-}-d$depth.$extension
            echo "--- $spec at depth $depth ($report)"
            "${name}_report" "$spec" "$depth" "$report" || failed=1
        done
    done
    return $failed
}

# wheels_installed STEP: the carried wheels are importable (the tests' conftests import gguf), or STEP fails now,
# before its build, saying what to carry
wheels_installed() {
    "$PYTHON" -c "import gguf" 2>/dev/null && return 0
    echo "device-call: $1 needs the carried wheels (no gguf in /tmp/site): carry .whl in this call or an earlier" \
        "call on this machine" >&2
    return 1
}

step() {
    local name=$1
    shift
    case $name in
        suite)
            wheels_installed suite && MINFER_GPU_CHECK_ONLY=kernels,memcheck bash tools/gpu-check.sh ;;
        suite2)
            wheels_installed suite2 \
                && MINFER_GPU_CHECK_ONLY=microbench,runtime,run-memcheck,bench,depth,op-timing,toys \
                    bash tools/gpu-check.sh ;;
        models)
            touch "$WRITING"
            export -f model_path write_model
            export BENCH_DIR PYTHON
            # shellcheck disable=SC2016 # expanded by the background shell
            setsid nohup nice bash -c 'for spec; do write_model "$spec" & done; wait; rm -f "$BENCH_DIR/writing"' \
                writer "$@" > "$BENCH_DIR/writer.log" 2>&1 < /dev/null & ;;
        ab)
            while [ -f "$WRITING" ]; do sleep 2; done
            local spec path paths=() failed=0
            for spec; do
                write_model "$spec" &
                paths+=("$(model_path "$spec")")
            done
            wait
            for path in "${paths[@]}"; do
                [ -f "$path" ] || { echo "device-call: $path was not written (its log in $BENCH_DIR)" >&2; failed=1; }
            done
            [ "$failed" -eq 0 ] || return 1
            MINFER_AB_MODELS="${paths[*]}" MINFER_AB_ROUNDS=${MINFER_AB_ROUNDS:-2} bash tools/gpu-ab.sh run ;;
        table)
            if [ ! -f /tmp/llama-build.pid ]; then
                echo "device-call: llama.cpp was not built on this machine: carry .device/llama-src.tar.xz in this" \
                    "call or an earlier one of this machine" >&2
                return 1
            fi
            install_this_tree table || return 1
            # The models are written while llama.cpp's build runs on; each row is in $OUT/table.log as it comes,
            # so a call cut off at its limit still returns the rows done.
            # shellcheck disable=SC2086 # MINFER_TABLE_ARGS is a list of flags
            LLAMA_BIN=/tmp/llama-build/bin LLAMA_BUILDING=/tmp/llama-build.pid LLAMA_BUILD_LOG=/tmp/llama-build.log \
                SHAPES="$*" bash tools/bench-vs-llamacpp.sh ${MINFER_TABLE_ARGS:-} 2>&1 \
                | tee "${OUT:-$BENCH_DIR}/table.log" ;;
        timeline)
            local trees=${MINFER_TIMELINE_TREES:-this} tree spec depth failed=0
            for tree in $trees; do
                [ "$tree" = this ] || [ -d "/tmp/ab-site/$tree" ] || {
                    echo "device-call: no /tmp/ab-site/$tree: an ab step of this machine builds the prepared trees" >&2
                    return 1
                }
            done
            if [[ " $trees " == *" this "* ]]; then install_this_tree timeline || return 1; fi
            while [ -f "$WRITING" ]; do sleep 2; done
            for spec; do
                write_model "$spec" || { echo "device-call: $(model_path "$spec") was not written" >&2; return 1; }
                for depth in ${MINFER_TIMELINE_DEPTHS:-0 2048}; do
                    for tree in $trees; do
                        echo "--- $spec at depth $depth${MINFER_TIMELINE_TREES:+ ($tree)}"
                        if [ "$tree" = this ]; then
                            "$PYTHON" tools/timeline.py "$(model_path "$spec")" -d "$depth" || failed=1
                        else
                            PYTHONPATH=/tmp/ab-site/$tree:$PYTHONPATH "$PYTHON" tools/timeline.py \
                                "$(model_path "$spec")" -d "$depth" || failed=1
                        fi
                    done
                done
            done
            return $failed ;;
        phases)
            local tree root code arch=${MINFER_CUDA_ARCHS%%[;, ]*} failed=0 kernels=packages/minfer-kernels
            [ "$arch" = 90 ] && arch=90a  # as the build compiles sm_90
            for tree; do
                root=.device/ab/$tree
                [ "$tree" = this ] && root=.
                nvcc -std=c++17 -O3 -arch="sm_$arch" -I"$root/$kernels/csrc/kernels" -o "/tmp/phases-$tree" \
                    "$root/$kernels/bench/decode_attention_phases.cu" "$root/$kernels/csrc/runtime.cpp" \
                    > "$BENCH_DIR/phases-$tree-build.log" 2>&1 &
            done
            wait
            for tree; do
                echo "--- phases: $tree"
                if [ ! -x "/tmp/phases-$tree" ]; then
                    tail -20 "$BENCH_DIR/phases-$tree-build.log"
                    failed=1
                    continue
                fi
                timeout "${MINFER_PHASES_TIMEOUT:-60}" "/tmp/phases-$tree" 2>&1 \
                    | tee "${OUT:-$BENCH_DIR}/phases-$tree.txt"
                code=${PIPESTATUS[0]}  # 124: timed out
                [ "$code" -eq 0 ] || { echo "device-call: phases of $tree ended with $code" >&2; failed=1; }
            done
            return $failed ;;
        profile) on_each_decode profile txt "$@" ;;
        source) on_each_decode source csv "$@" ;;
        *)
            echo "device-call: no step $name (suite, suite2, models, ab, table, timeline, phases, profile, source," \
                "eval)" >&2
            return 2 ;;
    esac
}

if [ "${1:-}" = eval ]; then
    shift
    eval "$*"
    exit
fi
[ $# -ge 1 ] || { echo "usage: tools/device-call.sh STEP [ARGS] | eval CMD (see its header)" >&2; exit 2; }
# The steps and their arguments: a step's name starts each group, the words after it are its arguments.
status=0
args=()
current=""
run_current() {
    [ -n "$current" ] || return 0
    echo "=== device-call: $current ${args[*]} ($(date +%T))"
    step "$current" "${args[@]}" || status=1
}
for word; do
    case $word in
        suite | suite2 | models | ab | table | timeline | phases | profile | source)
            run_current
            current=$word
            args=() ;;
        *) args+=("$word") ;;
    esac
done
run_current
exit $status
