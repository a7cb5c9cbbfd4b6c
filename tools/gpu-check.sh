#!/usr/bin/env bash
# THE check for a machine with an NVIDIA GPU: `nox -s gpu` runs it, and so does one call of the device tool.
#
#   1. install the Python wheels the machine lacks, when ./.whl/ holds some (a machine without network)
#   2. build and install minfer-kernels for this GPU (MINFER_CUDA_ARCHS, default native), no build isolation
#   3. the kernel test suite, with MINFER_REQUIRE_GPU=1: a GPU test may not skip
#   4. the same suite under compute-sanitizer --tool memcheck, leaving out the tests marked
#      provokes_cuda_error (they make CUDA calls fail on purpose, and memcheck counts every failed call)
#   5. a microbenchmark of the kernels at Qwen2.5-0.5B decode shapes (packages/minfer-kernels/bench)
#   6. the runtime and minfer-chat: their CUDA tests (pytest -m cuda), `minfer run --backend cuda` under memcheck,
#      a bench table
#   7. the tutorial's toys and try-it commands (docs/tutorial/toys/run-on-gpu.sh), each toy checking its output
#
# Logs: $MINFER_GPU_CHECK_LOGS, else build/gpu-check; when the device tool runs this ($OUT set), which brings back at
# most 8 files, /tmp/gpu-check-logs, and $OUT gets summary.txt and every log in gpu-check-logs.tar.gz.
# Knobs: MINFER_CUDA_ARCHS (default native), PYTHON (default python3), MINFER_TEST_WORKERS (pytest-xdist processes
# of the test steps, default 4, used where xdist is installed), MINFER_TEST_TIMEOUT and
# MINFER_MEMCHECK_TIMEOUT (seconds per pass), MINFER_MEMCHECK_SELECT (pytest -m expression of the memcheck pass),
# MINFER_MEMCHECK_TEST_TIMEOUT (seconds per test of the memcheck pass, default 240, where pytest-timeout is installed),
# MINFER_GPU_CHECK_ONLY (a comma-separated subset of the steps after the build, for a quick iteration:
# kernels, memcheck, microbench, runtime, run-memcheck, bench, bench-eager, depth, op-timing, llama-bench,
# profile, toys;
# default: every step), MINFER_BENCH_TYPES (weight types of the benchmark models, default Q4_0 Q8_0),
# LLAMA_BENCH (a llama-bench binary: the llama-bench step runs it on the same models, for a same-call
# comparison; the step is skipped without it).
# Exit status: 0 when every step passed.
set -uo pipefail

cd "$(dirname "$0")/.."
LOGS=${MINFER_GPU_CHECK_LOGS:-build/gpu-check}
if [ -n "${OUT:-}" ]; then
    LOGS=/tmp/gpu-check-logs
    rm -rf "$LOGS"
fi
mkdir -p "$LOGS"
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
for dir in "${CUDA_HOME:-/nonexistent}/bin" /usr/local/cuda/bin; do
    if [ -d "$dir" ]; then PATH="$PATH:$dir"; fi
done
export PATH

SUMMARY=()
STATUS=0

# wanted STEP: whether MINFER_GPU_CHECK_ONLY leaves STEP in (it is unset for the full check).
wanted() {
    [ -z "${MINFER_GPU_CHECK_ONLY:-}" ] || [[ ",$MINFER_GPU_CHECK_ONLY," == *",$1,"* ]]
}

# run_step NAME LOG COMMAND...: runs COMMAND, its output to the terminal and to $LOGS/LOG, and records
# PASS or FAIL in the summary.
run_step() {
    local name=$1 log=$2
    shift 2
    echo
    echo "=== $name: $*"
    local start=$SECONDS
    "$@" 2>&1 | tee "$LOGS/$log"
    local rc=${PIPESTATUS[0]}
    local took=$((SECONDS - start))
    if [ "$rc" -eq 0 ]; then
        SUMMARY+=("PASS  $name (${took}s)")
    else
        SUMMARY+=("FAIL  $name (exit $rc after ${took}s; log $log)")
        STATUS=1
    fi
    return "$rc"
}

print_summary() {
    {  # the tables first, the steps and the test counts last: a caller that keeps only the output's tail keeps these
        for log in "$LOGS"/bench.log "$LOGS"/bench-*.log; do
            if [ -f "$log" ]; then
                echo "--- $(basename "$log")"
                grep -E "^\|" "$log" || cat "$log"
            fi
        done
        if [ -f "$LOGS/op-timing.log" ]; then
            echo "--- op-timing.log"
            grep -E "^\||per-op" "$LOGS/op-timing.log" | tail -20
        fi
        echo
        echo "=== gpu-check summary"
        printf '%s\n' "${SUMMARY[@]}"
        for log in tests.log memcheck.log runtime-cuda.log run-memcheck.log; do
            if [ -f "$LOGS/$log" ]; then
                echo "--- $log"
                grep -E "[0-9]+ (passed|failed|errors?|skipped|deselected).* in [0-9.]+s|ERROR SUMMARY|^FAIL  shard" \
                    "$LOGS/$log" || true
            fi
        done
        if [ "$STATUS" -eq 0 ]; then echo "gpu-check: OK"; else echo "gpu-check: FAILED"; fi
    } | tee "$LOGS/summary.txt"
    if [ -n "${OUT:-}" ]; then
        cp "$LOGS/summary.txt" "$OUT/" && tar -czf "$OUT/gpu-check-logs.tar.gz" -C "$LOGS" .
    fi
}

echo "=== machine"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv || true
"$PYTHON" --version
"$PYTHON" -m pip list 2>/dev/null | grep -iE "^(nanobind|scikit.build.core|cmake|ninja|numpy|pytest|gguf) " || true

# 1. A machine without network gets the Python packages it lacks as wheels, carried in ./.whl/.
if compgen -G ".whl/*.whl" >/dev/null; then
    run_step "install carried wheels" wheels.log \
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

# 2. Build for this GPU. Without build isolation: the machine's scikit-build-core, nanobind, cmake, ninja. The build
# folder stays (SKBUILD_BUILD_DIR, default build/skbuild, ignored): a later call on the same machine recompiles only
# what changed (5-7 s on the H200 instead of 60-75 s).
export MINFER_CUDA_ARCHS=${MINFER_CUDA_ARCHS:-native}
export SKBUILD_BUILD_DIR=${SKBUILD_BUILD_DIR:-$PWD/build/skbuild}
if ! run_step "build minfer-kernels (MINFER_CUDA_ARCHS=$MINFER_CUDA_ARCHS)" build.log \
    "$PYTHON" -m pip install -v --no-build-isolation --no-deps ./packages/minfer-kernels; then
    print_summary
    exit 1
fi

# The test steps run on MINFER_TEST_WORKERS pytest-xdist processes where xdist is installed (default 4; on 8, the
# H200 took 121 s over the kernel suite, 343 s under memcheck, 143 s over the runtime's CUDA tests). The runtime's conftest pins each worker to its own slice of the CPUs
# (minfer.testing.workers), so the CPU references' BLAS threads do not oversubscribe the machine.
WORKERS=()
if "$PYTHON" -c "import xdist" 2>/dev/null; then
    WORKERS=(-n "${MINFER_TEST_WORKERS:-4}")
fi

# 3. The kernel tests. MINFER_REQUIRE_GPU=1 turns "no GPU" into a failure instead of skips.
wanted kernels && run_step "kernel tests" tests.log \
    env MINFER_REQUIRE_GPU=1 timeout "${MINFER_TEST_TIMEOUT:-600}" \
    "$PYTHON" -m pytest -q -ra -p no:cacheprovider "${WORKERS[@]}" packages/minfer-kernels/tests

# 4. The memcheck pass: any invalid device memory access fails it (--error-exitcode). One process alone takes longer
# than a 10-minute device call over the whole suite, and pytest-xdist's workers under one sanitizer
# (--target-processes all) hang before their first test (session 21: 4 or 12 workers, even over 12 tests), so
# tools/memcheck_shards.py deals the tests into MINFER_TEST_WORKERS shards, each one pytest process under its own
# sanitizer; a shard still running at MINFER_MEMCHECK_TIMEOUT is killed with its children and named with the test
# it was in. A test that hangs is ended sooner by pytest-timeout's thread method, which prints every thread's stack.
if ! wanted memcheck; then
    :
elif command -v compute-sanitizer >/dev/null; then
    TEST_TIMEOUT=()
    if "$PYTHON" -c "import pytest_timeout" 2>/dev/null; then
        TEST_TIMEOUT=(-p pytest_timeout --timeout "${MINFER_MEMCHECK_TEST_TIMEOUT:-240}" --timeout-method thread)
    fi
    # What else holds the GPU (a killed pass's sanitized processes can outlive it): listed, for the record.
    echo "GPU processes before the memcheck pass:"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader || true
    run_step "kernel tests under compute-sanitizer memcheck" memcheck.log \
        env MINFER_REQUIRE_GPU=1 "$PYTHON" tools/memcheck_shards.py --shards "${MINFER_TEST_WORKERS:-4}" \
        --timeout "${MINFER_MEMCHECK_TIMEOUT:-1200}" --logs "$LOGS/memcheck" \
        -m "${MINFER_MEMCHECK_SELECT:-not provokes_cuda_error}" packages/minfer-kernels/tests \
        -- -ra --durations=5 "${TEST_TIMEOUT[@]}"
else
    SUMMARY+=("FAIL  memcheck: compute-sanitizer not found (looked on PATH, \$CUDA_HOME/bin, /usr/local/cuda/bin)")
    STATUS=1
fi

# 5. Kernel timings: a table, for the record (it fails only if a kernel fails).
wanted microbench && run_step "kernel microbench" bench.log "$PYTHON" packages/minfer-kernels/bench/bench_kernels.py

# 6. The runtime on the GPU: install it and minfer-chat (their dependencies come from the machine or .whl/),
# then their CUDA tests (CUDA backend == CPU backend on synthetic and real models, against transformers,
# replay on/off, multi-turn; minfer-chat on the real Gemma 3), one short `minfer run --backend cuda` under
# memcheck, and a bench table of synthetic Qwen2.5-0.5B models.
# The real models (the default, Gemma 3 270M) are used when installed or in $MINFER_HOME/models (the device
# tool carries them in parts: see docs/PERFORMANCE.md); their tests skip with the reason otherwise.
if run_step "install minfer-runtime and minfer-chat" runtime-install.log \
    "$PYTHON" -m pip install -q --no-build-isolation --no-deps ./packages/minfer-runtime ./packages/minfer-chat; then
    wanted runtime && run_step "runtime and chat CUDA tests" runtime-cuda.log \
        env MINFER_REQUIRE_GPU=1 timeout "${MINFER_TEST_TIMEOUT:-600}" \
        "$PYTHON" -m pytest -q -ra -p no:cacheprovider "${WORKERS[@]}" --durations=10 -m cuda \
        packages/minfer-runtime/tests packages/minfer-chat/tests
    if wanted run-memcheck && command -v compute-sanitizer >/dev/null; then
        run_step "minfer run --backend cuda under compute-sanitizer memcheck" run-memcheck.log \
            compute-sanitizer --tool memcheck --error-exitcode 86 --print-limit 20 \
            "$PYTHON" -m minfer.cli run "${MINFER_MEMCHECK_MODEL:-smollm2}" "What is the capital of France?" \
            --backend cuda --temp 0 -n 8
    fi
    BENCH_DIR=${MINFER_BENCH_DIR:-/tmp/minfer-bench}
    mkdir -p "$BENCH_DIR"
    for weight_type in ${MINFER_BENCH_TYPES:-Q4_0 Q8_0}; do
        model="$BENCH_DIR/qwen2.5-0.5b-$weight_type.gguf"
        if ! wanted bench && ! wanted bench-eager && ! wanted depth && ! wanted op-timing && ! wanted llama-bench \
            && ! wanted profile; then
            continue  # no step below reads the benchmark models
        fi
        [ -f "$model" ] || "$PYTHON" -m minfer.testing.synthetic "$model" --preset qwen2.5-0.5b --weight-type "$weight_type"
        if wanted bench; then
            run_step "bench $weight_type, graph replay" "bench-$weight_type-replay.log" \
                "$PYTHON" -m minfer.cli bench "$model" --backend cuda -p 512 -n 128 -r "${MINFER_BENCH_REPS:-5}"
            # The same, each kernel waiting for the previous one to finish (no programmatic dependent launch).
            run_step "bench $weight_type, graph replay, no PDL" "bench-$weight_type-nopdl.log" \
                env MINFER_NO_PDL=1 "$PYTHON" -m minfer.cli bench "$model" --backend cuda -p 512 -n 128 \
                -r "${MINFER_BENCH_REPS:-5}"
        fi
        if wanted bench-eager; then
            run_step "bench $weight_type, no graph replay" "bench-$weight_type-eager.log" \
                env MINFER_NO_CUDA_GRAPH=1 "$PYTHON" -m minfer.cli bench "$model" --backend cuda -p 512 -n 128 \
                -r "${MINFER_BENCH_REPS:-5}"
        fi
        if wanted llama-bench && [ -n "${LLAMA_BENCH:-}" ]; then
            run_step "llama-bench $weight_type (llama.cpp, flash attention on)" "bench-$weight_type-llama.cpp.log" \
                "$LLAMA_BENCH" -m "$model" -p 512 -n 128 -fa 1 -ngl 99 -r "${MINFER_BENCH_REPS:-5}"
        fi
    done
    # Decode deep in the context: llama.cpp's reference decode number (docs/PERFORMANCE.md) is tg128 at depth 2048.
    wanted depth && run_step "bench Q4_0 at depth 2048, graph replay" bench-Q4_0-depth.log \
        "$PYTHON" -m minfer.cli bench "$BENCH_DIR/qwen2.5-0.5b-Q4_0.gguf" --backend cuda -p 512 -n 128 -d 2048 \
        --ctx-size 4096 -r "${MINFER_BENCH_REPS:-5}"
    if wanted llama-bench && [ -n "${LLAMA_BENCH:-}" ]; then
        run_step "llama-bench Q4_0 at depth 2048 (llama.cpp)" bench-Q4_0-depth-llama.cpp.log \
            "$LLAMA_BENCH" -m "$BENCH_DIR/qwen2.5-0.5b-Q4_0.gguf" -p 512 -n 128 -d 2048 -fa 1 -ngl 99 \
            -r "${MINFER_BENCH_REPS:-5}"
    fi
    # Where a decode step's GPU time goes, kernel by kernel (Nsight Compute times each decode kernel alone,
    # without the overlap of programmatic dependent launch): at an empty cache and at depth 2048.
    if wanted profile && command -v ncu >/dev/null; then
        for depth in 0 2048; do
            run_step "ncu kernel times, Q4_0 decode at depth $depth" "profile-d$depth.log" \
                ncu --clock-control none --print-summary per-kernel --metrics gpu__time_duration.sum \
                -k "regex:gemv|attention_decode|argmax|embed" -c 400 \
                "$PYTHON" -m minfer.cli bench "$BENCH_DIR/qwen2.5-0.5b-Q4_0.gguf" --backend cuda -p 16 -n 16 \
                -d "$depth" --ctx-size 4096 -r 1
        done
    fi
    wanted op-timing && run_step "op timing, Q4_0 decode" op-timing.log \
        env MINFER_OP_TIMING=1 "$PYTHON" -m minfer.cli bench "$BENCH_DIR/qwen2.5-0.5b-Q4_0.gguf" --backend cuda \
        -p 16 -n 32 -r 1
    # 7. Every experiment of docs/tutorial/02-minimal-cuda.md (its sections are the chapter's pasted outputs;
    # the toys and their model go to the bench folder, not to the logs).
    wanted toys && run_step "tutorial toys" toys.log env PYTHON="$PYTHON" TOY_BUILD="$BENCH_DIR/toys" \
        docs/tutorial/toys/run-on-gpu.sh
fi

print_summary
exit "$STATUS"
