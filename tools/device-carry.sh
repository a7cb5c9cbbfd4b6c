#!/usr/bin/env bash
# What a GPU session carries to the device machine, which reaches no network and takes 64 MiB a call (the working
# tree, ~8 MB, included). The real models are larger than that (the default model 98 MB, Gemma 3 270M 253 MB), so
# they travel xz-compressed and cut into parts, over several calls of one warm machine; a machine idle for 30 s is
# given back, and with it what the earlier calls left there.
#
#   tools/device-carry.sh pack   here: fills .device/ (ignored): the Python wheels the machine lacks (.whl/, as
#                                ../shared/tools/fetch-device-wheels would, plus llguidance's manylinux_2_31 wheel),
#                                llama.cpp's source without what its build does not read (llama-src.tar.xz, from
#                                .reference/, which `nox -s tests` fills), and each real model found here (the
#                                default model, and Gemma 3 270M where `minfer pull gemma3` or `nox -s tests` put it
#                                in minfer's cache) as xz parts (MODEL.xz.K, with MODEL.xz.sums: the part count and
#                                the model's sha256), cut so that each call's carry fills CALL_BYTES; prints each
#                                call's carry (each call's command: tools/device-call.sh, which runs keep and join)
#   tools/device-carry.sh keep   there, every call: copies what the call carried (wheels, parts) to /tmp/keep; the
#                                call that carries llama.cpp's source unpacks it and starts building llama-bench and
#                                llama-quantize in the background into /tmp/llama-build (bin/ when done; log
#                                /tmp/llama-build.log)
#   tools/device-carry.sh join   there, after keep: each model whose parts are all in /tmp/keep joined into
#                                $MINFER_HOME/models (sha256 checked), the wheels put back in .whl/ if the call did
#                                not carry them; a model still missing parts is named, not an error
set -uo pipefail

cd "$(dirname "$0")/.."
DEVICE=.device
KEEP=/tmp/keep
LLAMA_SOURCE=.reference/llama-cpp-python-0.3.36-llama.cpp
CALL_BYTES=${CALL_BYTES:-54000000}  # a call's carry beside the tree (~8 MB), under the device's 64 MiB

# The plan: CALLS holds each call's carry (paths, space-separated), every call up to CALL_BYTES; `room` is what the
# last call has left.
CALLS=()
room=0
new_call() {
    CALLS+=("")
    room=$CALL_BYTES
}
add_to_plan() {  # add_to_plan PATH BYTES: into the last call, or a new one where it does not fit
    if [ ${#CALLS[@]} -eq 0 ] || [ "$2" -gt "$room" ]; then new_call; fi
    CALLS[-1]+=" $1"
    room=$((room - $2))
}

# pack_model NAME FILE: FILE (a real model) xz-compressed into parts that fill the plan's calls.
pack_model() {
    local name=$1 file=$2 packed="$DEVICE/$(basename "$2").xz"
    rm -f "$packed".*
    xz -T0 -6 -c "$file" > "$packed" || return 1
    local size offset=0 part=0 take
    size=$(stat -c %s "$packed")
    while [ "$offset" -lt "$size" ]; do
        if [ ${#CALLS[@]} -eq 0 ] || [ "$room" -lt 1000000 ]; then new_call; fi
        take=$((size - offset < room ? size - offset : room))  # the part fills what the call has left
        dd if="$packed" of="$packed.$part" bs=1M iflag=skip_bytes,count_bytes skip="$offset" count="$take" \
            status=none || return 1
        [ "$part" -eq 0 ] && add_to_plan "$packed.sums" 0
        add_to_plan "$packed.$part" "$take"
        offset=$((offset + take))
        part=$((part + 1))
    done
    printf '%s %s\n' "$part" "$(sha256sum "$file" | cut -d' ' -f1)" > "$packed.sums"
    rm "$packed"
    echo "device-carry: $name in $part parts ($size bytes compressed)"
}

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
    add_to_plan .whl "$(du -sb .whl | cut -f1)"
    add_to_plan "$DEVICE/llama-src.tar.xz" "$(stat -c %s "$DEVICE/llama-src.tar.xz")"
    # The models are found by minfer itself: nox -s run's environment has it on a fresh checkout, where python3
    # has not (PYTHON names another).
    local name file python=python3
    [ -x .nox/run/bin/python ] && python=.nox/run/bin/python
    python=${PYTHON:-$python}
    for name in smollm2 gemma3; do
        file=$("$python" -c "from minfer.model_store import resolve_model; print(resolve_model('$name'))" \
            2>/dev/null) || {
            echo "device-carry: $name is not installed for $python (nox -s run installs the default model, minfer" \
                "pull gemma3 the other; PYTHON names a python with minfer): not packed" >&2
            continue
        }
        pack_model "$name" "$file" || return 1
    done
    local call=1 paths
    for paths in "${CALLS[@]}"; do
        # shellcheck disable=SC2086 # a call's paths, one word each
        echo "device-carry: call $call carry [$(printf '"%s", ' $paths | sed 's/, $//')]"
        call=$((call + 1))
    done
    echo "device-carry: every call's command is tools/device-call.sh STEP... (it keeps what the call carried and" \
        "joins each model whose parts are all there into \$MINFER_HOME/models)"
}

keep() {
    mkdir -p "$KEEP" || return 1
    if [ -d .whl ]; then rm -rf "$KEEP/whl" && cp -r .whl "$KEEP/whl" || return 1; fi
    compgen -G "$DEVICE/*.xz.*" >/dev/null && { cp "$DEVICE"/*.xz.* "$KEEP/" || return 1; }
    if [ -f "$DEVICE/llama-src.tar.xz" ] && [ ! -d /tmp/llama-src ]; then
        mkdir -p /tmp/llama-src && tar -xf "$DEVICE/llama-src.tar.xz" -C /tmp/llama-src --strip-components=1 || return 1
        # Niced, and on LLAMA_BUILD_JOBS cores (default 6 of the 16: minfer's build and tests run beside it). The
        # script runs from /tmp/keep: the next call's copy of the tree replaces tools/. Its pid in
        # /tmp/llama-build.pid while it runs (the `table` step of tools/device-call.sh waits for it).
        cp tools/build-llamacpp.sh "$KEEP/" || return 1
        CUDA_ARCHS=90-real JOBS=${LLAMA_BUILD_JOBS:-6} setsid nohup nice bash "$KEEP/build-llamacpp.sh" /tmp/llama-src \
            /tmp/llama-build > /tmp/llama-build.log 2>&1 < /dev/null &
        echo $! > /tmp/llama-build.pid
        echo "device-carry: llama.cpp building into /tmp/llama-build (log /tmp/llama-build.log)"
    fi
    echo "device-carry: kept in $KEEP: $(cd "$KEEP" && ls | tr '\n' ' ')"
}

join() {
    local models=${MINFER_HOME:?set MINFER_HOME}/models
    mkdir -p "$models" || return 1
    [ -d .whl ] || [ ! -d "$KEEP/whl" ] || cp -r "$KEEP/whl" .whl || return 1
    local sums target parts sha part missing
    for sums in "$KEEP"/*.xz.sums; do
        [ -f "$sums" ] || continue
        target=$(basename "$sums" .xz.sums)
        [ -f "$models/$target" ] && continue
        read -r parts sha < "$sums"
        missing=()
        for ((part = 0; part < parts; part++)); do
            [ -f "$KEEP/$target.xz.$part" ] || missing+=("$part")
        done
        if [ ${#missing[@]} -gt 0 ]; then
            echo "device-carry: $target waits for parts ${missing[*]} of $parts"
            continue
        fi
        for ((part = 0; part < parts; part++)); do cat "$KEEP/$target.xz.$part"; done | xz -d > "$models/$target.tmp" \
            || return 1
        if [ "$(sha256sum "$models/$target.tmp" | cut -d' ' -f1)" != "$sha" ]; then
            echo "device-carry: the joined $target does not have its sha256" >&2
            rm -f "$models/$target.tmp"
            return 1
        fi
        mv "$models/$target.tmp" "$models/$target" && echo "device-carry: $models/$target"
    done
}

case "${1:-}" in
    pack) pack ;;
    keep) keep ;;
    join) join ;;
    *) echo "usage: tools/device-carry.sh pack | keep | join" >&2; exit 2 ;;
esac
