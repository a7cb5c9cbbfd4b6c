#!/usr/bin/env bash
# llama-bench and llama-quantize, built with CUDA from llama.cpp's source (the llama-cpp-python sdist's
# vendor/llama.cpp: what issue 17's table measures minfer against):
#
#   tools/build-llamacpp.sh SOURCE BUILD   SOURCE: the source folder; the binaries land in BUILD/bin
#
# Knobs: CUDA_ARCHS (default native), JOBS (ninja's parallel jobs, default every core). Run by
# tools/bench-vs-llamacpp.sh (in the background while it writes the models) and by tools/device-carry.sh keep (in
# the background through a GPU machine's later calls).
set -uo pipefail

[ $# -eq 2 ] || { echo "usage: tools/build-llamacpp.sh SOURCE BUILD" >&2; exit 2; }
source_dir=$1
build_dir=$2
if [ ! -f "$source_dir/CMakeLists.txt" ]; then
    echo "build-llamacpp: no llama.cpp source in $source_dir" >&2
    exit 1
fi
cmake -S "$source_dir" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-native}" -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DGGML_NATIVE=OFF && ninja -C "$build_dir" -j "${JOBS:-$(nproc)}" llama-bench llama-quantize
