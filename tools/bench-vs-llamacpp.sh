#!/usr/bin/env bash
# Issue 17's evidence on a GPU machine: minfer against llama.cpp on the same files, one markdown table.
#
#   tools/bench-vs-llamacpp.sh [ARGS of tools/bench_vs_llamacpp.py]
#
# llama.cpp comes from the llama-cpp-python sdist's vendor/llama.cpp: LLAMA_CPP names that folder (default
# .reference/llama-cpp-python-0.3.36-llama.cpp, which `nox -s tests` downloads and unpacks; the GPU machine has
# no network, so carry it), or a tarball of it, built for this GPU with CUDA into LLAMA_BUILD (default
# build/llama.cpp) by tools/build-llamacpp.sh, in the background while the synthetic F16 models are written. The
# folder is 176 MB, mostly what the build does not read; where a carry has a size limit, pack it without that
# (7.5 MB):
#   tar -cJf llama-src.tar.xz -C .reference $(for d in models docs tests examples gguf-py benches media scripts \
#       conversion skills pocs ci requirements .github .devops; do echo --exclude=llama-cpp-python-0.3.36-llama.cpp/$d; \
#       done) llama-cpp-python-0.3.36-llama.cpp
# and set LLAMA_CPP=llama-src.tar.xz. LLAMA_BIN, a folder holding llama-bench and
# llama-quantize already built, skips the build; LLAMA_BUILDING, a file holding the pid of a build into LLAMA_BIN
# still running elsewhere (tools/device-carry.sh keep's), is waited for once the models are written, and
# LLAMA_BUILD_LOG, that build's log, is shown if it made no binaries. minfer must be installed (tools/gpu-check.sh
# builds it).
# Knobs: CUDA_ARCHS (default native), JOBS (default: every core), SHAPES (default qwen2.5-0.5b llama3.2-1b; any
# preset of minfer.testing.synthetic, qwen3-0.6b and gemma3-270m among them; empty: none, only the --models files),
# WORKDIR (default /tmp/minfer-vs-llamacpp), PYTHON (default python3). Real GGUF files, benched as they are:
# --models FILE,...
set -uo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WORKDIR=${WORKDIR:-/tmp/minfer-vs-llamacpp}
SHAPES=${SHAPES-qwen2.5-0.5b llama3.2-1b}
mkdir -p "$WORKDIR"
start=$SECONDS

if [ -z "${LLAMA_BIN:-}" ]; then
    source_dir=${LLAMA_CPP:-.reference/llama-cpp-python-0.3.36-llama.cpp}
    build_dir=${LLAMA_BUILD:-build/llama.cpp}
    if [ -f "$source_dir" ]; then  # a tarball of the folder: unpacked beside the models
        mkdir -p "$WORKDIR/llama-src" && tar -xf "$source_dir" -C "$WORKDIR/llama-src" --strip-components=1 || exit 1
        source_dir=$WORKDIR/llama-src
    fi
    if [ ! -f "$source_dir/CMakeLists.txt" ]; then
        echo "bench-vs-llamacpp: no llama.cpp source in $source_dir (set LLAMA_CPP, or LLAMA_BIN to built binaries)" >&2
        exit 1
    fi
    tools/build-llamacpp.sh "$source_dir" "$build_dir" > "$WORKDIR/llama-build.log" 2>&1 &
    build=$!
    LLAMA_BIN=$build_dir/bin
fi

# The F16 sources, written while llama.cpp compiles, one process a shape at once (each a single core's numpy;
# bench_vs_llamacpp.py writes any that are missing).
writers=()
for shape in $SHAPES; do
    model="$WORKDIR/$shape-F16.gguf"
    [ -f "$model" ] && continue
    "$PYTHON" -m minfer.testing.synthetic "$model" --preset "$shape" --weight-type F16 \
        > "$WORKDIR/synthetic-$shape.log" 2>&1 &
    writers+=("$!:$shape")
done
for writer in "${writers[@]}"; do
    wait "${writer%%:*}" || { tail -20 "$WORKDIR/synthetic-${writer#*:}.log" >&2; exit 1; }
done

if [ -n "${build:-}" ]; then
    if ! wait "$build"; then
        tail -20 "$WORKDIR/llama-build.log" >&2
        echo "bench-vs-llamacpp: the llama.cpp build failed (log: $WORKDIR/llama-build.log)" >&2
        exit 1
    fi
fi
if [ -n "${LLAMA_BUILDING:-}" ]; then
    # Running: there, and not a zombie (a finished process that no parent has reaped yet still takes signals).
    running() { kill -0 "$1" 2>/dev/null && ! grep -qs '^State:[[:space:]]*Z' "/proc/$1/status"; }
    while [ -f "$LLAMA_BUILDING" ] && running "$(cat "$LLAMA_BUILDING")"; do sleep 1; done
    if [ ! -x "$LLAMA_BIN/llama-bench" ] || [ ! -x "$LLAMA_BIN/llama-quantize" ]; then
        [ -f "${LLAMA_BUILD_LOG:-}" ] && tail -20 "$LLAMA_BUILD_LOG" >&2
        echo "bench-vs-llamacpp: the build named by $LLAMA_BUILDING left no llama-bench and llama-quantize in" \
            "$LLAMA_BIN${LLAMA_BUILD_LOG:+ (log: $LLAMA_BUILD_LOG)}" >&2
        exit 1
    fi
fi
echo "bench-vs-llamacpp: llama.cpp and the models ready after $((SECONDS - start)) s" >&2
"$PYTHON" tools/bench_vs_llamacpp.py --llama-bin "$LLAMA_BIN" --shapes "$(echo $SHAPES | tr ' ' ',')" \
    --workdir "$WORKDIR" "$@"
status=$?
echo "bench-vs-llamacpp: $((SECONDS - start)) s" >&2
exit $status
