#!/usr/bin/env bash
# What a GPU session carries to the device machine, which reaches no network and takes 64 MiB a call (the working
# tree, ~8 MB, included). The default model alone is 98 MB, so it travels xz-compressed (92 MB) and cut in two, over
# two calls of one warm machine; a machine idle for 30 s is given back, and with it what the first call left there.
#
#   tools/device-carry.sh pack   here: fills .device/ (ignored): the Python wheels the machine lacks (.whl/, as
#                                ../shared/tools/fetch-device-wheels would, plus llguidance's manylinux_2_31 wheel),
#                                llama.cpp's source without what its build does not read (llama-src.tar.xz, from
#                                .reference/, which `nox -s tests` fills), the default model's two parts
#                                (model.xz.part.a: 39 MB, model.xz.part.b: the rest); prints each call's carry
#   tools/device-carry.sh keep   there, first call: copies the wheels and part a to /tmp/keep, unpacks llama.cpp and
#                                starts building llama-bench and llama-quantize in the background into
#                                /tmp/llama-build (bin/ when done; log /tmp/llama-build.log)
#   tools/device-carry.sh join   there, second call: joins part a (from /tmp/keep) and the carried part b into
#                                $MINFER_HOME/models (sha256 checked), and puts the wheels back in .whl/ if the call
#                                did not carry them
set -uo pipefail

cd "$(dirname "$0")/.."
DEVICE=.device
KEEP=/tmp/keep
MODEL=SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
LLAMA_SOURCE=.reference/llama-cpp-python-0.3.36-llama.cpp
PART_A_BYTES=39000000  # part a + the wheels (~11 MB) + llama.cpp's source (~8 MB) + the tree fit one call

pack() {
    mkdir -p "$DEVICE" || return 1
    local wheels=(gguf jinja2 MarkupSafe tokenizers regex jsonschema jsonschema-specifications referencing rpds-py
        attrs "textual==8.2.8" pytest-textual-snapshot syrupy pytest-timeout pytest-xdist execnet rich markdown-it-py
        mdurl pygments platformdirs typing-extensions linkify-it-py uc-micro-py "llguidance>=1.7")
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d .whl "${wheels[@]}" || return 1
    if [ ! -f "$LLAMA_SOURCE/CMakeLists.txt" ]; then
        echo "device-carry: no llama.cpp source in $LLAMA_SOURCE (nox -s tests downloads it)" >&2
        return 1
    fi
    local excluded=()
    for dir in models docs tests examples gguf-py benches media scripts conversion skills pocs ci requirements \
        .github .devops; do
        excluded+=("--exclude=$(basename "$LLAMA_SOURCE")/$dir")
    done
    tar -cJf "$DEVICE/llama-src.tar.xz" -C "$(dirname "$LLAMA_SOURCE")" "${excluded[@]}" "$(basename "$LLAMA_SOURCE")" \
        || return 1
    local model
    model=$("${PYTHON:-python3}" -c "from minfer.model_store import resolve_model; print(resolve_model('smollm2'))") || {
        echo "device-carry: the default model is not installed here (nox -s run installs it)" >&2
        return 1
    }
    xz -T0 -1 -c "$model" > "$DEVICE/model.xz" || return 1
    head -c "$PART_A_BYTES" "$DEVICE/model.xz" > "$DEVICE/model.xz.part.a"
    tail -c +"$((PART_A_BYTES + 1))" "$DEVICE/model.xz" > "$DEVICE/model.xz.part.b"
    rm "$DEVICE/model.xz"
    du -b .whl "$DEVICE"/llama-src.tar.xz "$DEVICE"/model.xz.part.*
    echo "device-carry: call 1 carry [\".whl\", \"$DEVICE/llama-src.tar.xz\", \"$DEVICE/model.xz.part.a\"]," \
        "command starting: tools/device-carry.sh keep &&"
    echo "device-carry: call 2 carry [\"$DEVICE/model.xz.part.b\"], command starting: tools/device-carry.sh join &&"
}

keep() {
    mkdir -p "$KEEP" && rm -rf "$KEEP/whl" && cp -r .whl "$KEEP/whl" && cp "$DEVICE/model.xz.part.a" "$KEEP/" || return 1
    mkdir -p /tmp/llama-src && tar -xf "$DEVICE/llama-src.tar.xz" -C /tmp/llama-src --strip-components=1 || return 1
    # Niced, and on 6 of the 16 cores: minfer's build and tests run beside it.
    setsid nohup bash -c 'cmake -S /tmp/llama-src -B /tmp/llama-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DGGML_NATIVE=OFF && nice ninja -C /tmp/llama-build -j 6 llama-bench llama-quantize' \
        > /tmp/llama-build.log 2>&1 < /dev/null &
    echo "device-carry: kept in $KEEP; llama.cpp building into /tmp/llama-build (log /tmp/llama-build.log)"
}

join() {
    local models=${MINFER_HOME:?set MINFER_HOME}/models
    mkdir -p "$models" || return 1
    [ -d .whl ] || cp -r "$KEEP/whl" .whl || return 1
    cat "$KEEP/model.xz.part.a" "$DEVICE/model.xz.part.b" | xz -d > "$models/$MODEL.tmp" || return 1
    if [ "$(sha256sum "$models/$MODEL.tmp" | cut -d' ' -f1)" != "$MODEL_SHA256" ]; then
        echo "device-carry: the joined $MODEL does not have its sha256" >&2
        rm -f "$models/$MODEL.tmp"
        return 1
    fi
    mv "$models/$MODEL.tmp" "$models/$MODEL" && echo "device-carry: $models/$MODEL"
}

case "${1:-}" in
    pack) pack ;;
    keep) keep ;;
    join) join ;;
    *) echo "usage: tools/device-carry.sh pack | keep | join" >&2; exit 2 ;;
esac
