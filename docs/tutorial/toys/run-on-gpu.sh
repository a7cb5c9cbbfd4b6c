#!/usr/bin/env bash
# Every experiment of docs/tutorial/02-minimal-cuda.md, on a machine with an NVIDIA GPU, minfer-kernels and
# minfer-runtime installed: the toys (CUDA C++ and Python), then the §5 commands on a synthetic
# Qwen2.5-0.5B. Each experiment prints under a `=== name` header; the chapter's outputs are these sections.
# `tools/gpu-check.sh` runs it as its `toys` step.
#
#   docs/tutorial/toys/run-on-gpu.sh
#
# Knobs: PYTHON (default python3), TOY_ARCH (nvcc -arch, default sm_90: an H100/H200), TOY_BUILD (where the
# toys and the model go, default a new temporary directory). Needs nvcc, compute-sanitizer, ncu and
# cuobjdump (PATH, $CUDA_HOME/bin or /usr/local/cuda/bin); nsys is used where it exists.
# Exit status: 0 when every experiment did what the chapter says (each toy's own check included).
set -uo pipefail

cd "$(dirname "$0")"
TOYS=$PWD
PYTHON=${PYTHON:-python3}
ARCH=${TOY_ARCH:-sm_90}
BUILD=${TOY_BUILD:-$(mktemp -d /tmp/minfer-toys.XXXXXX)}
mkdir -p "$BUILD"
for dir in "${CUDA_HOME:-/nonexistent}/bin" /usr/local/cuda/bin; do
    if [ -d "$dir" ]; then PATH="$PATH:$dir"; fi
done
export PATH PYTHONUNBUFFERED=1
MODEL=$BUILD/qwen2.5-0.5b-Q4_0.gguf
FAILED=()

# step NAME COMMAND...: prints the header, runs COMMAND, records a failure.
step() {
    local name=$1
    shift
    echo
    echo "=== $name"
    echo "\$ $*"
    if ! "$@"; then
        FAILED+=("$name")
    fi
}

# sanitized NAME COMMAND...: COMMAND under memcheck must have an out-of-bounds global access reported (the
# in-place SiLU reads x[i] before it writes it, so the first report is the read).
sanitized() {
    local name=$1
    shift
    echo
    echo "=== $name"
    echo "\$ compute-sanitizer --tool memcheck $*"
    local log=$BUILD/$name.log
    compute-sanitizer --tool memcheck --print-limit 4 "$@" 2>&1 | tee "$log"
    if ! grep -Eq "Invalid __global__ (read|write)" "$log" || grep -q "ERROR SUMMARY: 0 errors" "$log"; then
        echo "expected memcheck to report the out-of-bounds accesses"
        FAILED+=("$name")
    fi
}

step machine nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.max.sm --format=csv
step nvcc nvcc --version

step "build silu.cu" nvcc -arch="$ARCH" -O2 -lineinfo -o "$BUILD/silu" "$TOYS/silu.cu"
step "build streams.cu" nvcc -arch="$ARCH" -O2 -lineinfo -o "$BUILD/streams" "$TOYS/streams.cu"
step "build errors.cu" nvcc -arch="$ARCH" -O2 -lineinfo -o "$BUILD/errors" "$TOYS/errors.cu"
step silu.cu "$BUILD/silu"
step "silu.cu 896" "$BUILD/silu" 896
step streams.cu "$BUILD/streams"
step errors.cu "$BUILD/errors"
step "errors.cu unguarded" "$BUILD/errors" unguarded
sanitized "memcheck errors.cu unguarded" "$BUILD/errors" unguarded

step silu.py "$PYTHON" "$TOYS/silu.py"
step streams.py "$PYTHON" "$TOYS/streams.py"
step errors.py "$PYTHON" "$TOYS/errors.py"
sanitized "memcheck errors.py overrun" "$PYTHON" "$TOYS/errors.py" overrun

EXTENSION=$("$PYTHON" -c "import minfer_kernels._C as c; print(c.__file__)")
step "cuobjdump list" cuobjdump --list-elf --list-ptx "$EXTENSION"
show_silu_sass() {
    cuobjdump --dump-sass "$EXTENSION" | grep -A 24 "Function : .*silu_f32"
}
step "cuobjdump sass silu_f32" show_silu_sass
no_libcuda() {
    ldd "$EXTENSION"
    if ldd "$EXTENSION" | grep -q "libcuda\.so"; then
        echo "the extension links libcuda: it must not (docs/BUILD.md, step 5)"
        return 1
    fi
    echo "no libcuda.so among them: cudart opens the driver at run time"
}
step ldd no_libcuda

step "synthetic model" "$PYTHON" -m minfer.testing.synthetic "$MODEL" --preset qwen2.5-0.5b --weight-type Q4_0
step "replay trace" "$PYTHON" "$TOYS/replay.py" "$MODEL"
step "replay trace, MINFER_NO_CUDA_GRAPH=1" env MINFER_NO_CUDA_GRAPH=1 "$PYTHON" "$TOYS/replay.py" "$MODEL" --steps 4
step "graph decode" "$PYTHON" -m minfer.cli graph "$MODEL" --tokens 1 --backend cuda --dot "$BUILD/decode.dot"
step "bench replay" "$PYTHON" -m minfer.cli bench "$MODEL" --backend cuda -p 64 -n 64 -r 2
step "bench no replay" env MINFER_NO_CUDA_GRAPH=1 "$PYTHON" -m minfer.cli bench "$MODEL" --backend cuda -p 64 -n 64 -r 2
step "op timing" env MINFER_OP_TIMING=1 "$PYTHON" -m minfer.cli bench "$MODEL" --backend cuda -p 16 -n 16 -r 1
step "ncu silu.cu" ncu --clock-control none --section SpeedOfLight -k regex:silu "$BUILD/silu"
step "ncu gemv_swiglu" ncu --clock-control none --kernel-name-base demangled -k regex:GemvGated --launch-skip 24 \
    --launch-count 1 --section SpeedOfLight --section LaunchStats \
    "$PYTHON" -m minfer.cli bench "$MODEL" --backend cuda -p 16 -n 8 -r 1
if command -v nsys >/dev/null; then
    step "nsys profile" nsys profile -o "$BUILD/decode" --force-overwrite=true \
        "$PYTHON" -m minfer.cli bench "$MODEL" --backend cuda -p 16 -n 32 -r 1
    step "nsys stats" nsys stats --report cuda_gpu_kern_sum "$BUILD/decode.nsys-rep"
else
    echo
    echo "=== nsys"
    echo "nsys is not installed here: the chapter's nsys commands are for a machine that has Nsight Systems"
fi

echo
echo "=== toys summary"
if [ ${#FAILED[@]} -eq 0 ]; then
    echo "every experiment did what the chapter says (outputs in $BUILD)"
    exit 0
fi
printf 'FAILED: %s\n' "${FAILED[@]}"
exit 1
