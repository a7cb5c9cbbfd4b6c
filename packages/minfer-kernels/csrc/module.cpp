// minfer_kernels._C: the nanobind module, the FFI seam between Python and the device layer.
//
// Keep it thin: every function here converts its arguments, calls one runtime.hpp function or one
// launcher, and converts the result. No decision is taken here.
//
// Conventions of the Python side:
//   - device pointers and streams are Python ints (DeviceBuffer.ptr, Stream.handle; 0 is the legacy
//     default stream);
//   - host memory is a C-contiguous numpy array, never converted or copied behind the caller's back;
//   - CUDA failures raise minfer_kernels.CudaError (defined in Python, _errors.py); arguments a launcher
//     refuses, and copies that do not fit, raise ValueError before any CUDA call.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include "launchers.h"
#include "minfer_build_info.h"
#include "runtime.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

cudaStream_t as_stream(std::uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

using HostArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using MutableHostArray = nb::ndarray<nb::c_contig, nb::device::cpu>;

// How a launcher parameter looks from Python: pointers (cudaStream_t is one too) are ints, or None for
// nullptr (an absent bias, no norm); the rest (int, float) stays as it is.
template <typename T>
struct PyParam {
    using type = T;
    static T to_c(type value) { return value; }
};
template <typename T>
struct PyParam<T*> {
    using type = std::optional<std::uintptr_t>;
    static T* to_c(type value) { return value ? reinterpret_cast<T*>(*value) : nullptr; }
};

// Binds one launcher. Around the call, the error model: an error already pending is latched (reported
// as such, not blamed on this launch); the launcher's own return is checked right after the launch.
template <typename... Params, typename... Extra>
void def_launcher(nb::module_& module, const char* name, const char* launcher_name,
                  cudaError_t (*launcher)(Params...), const char* doc, const Extra&... extra) {
    module.def(
        name,
        [launcher, launcher_name](typename PyParam<Params>::type... args) {
            minfer::raise_if_latched(launcher_name);
            minfer::check_launch(launcher(PyParam<Params>::to_c(args)...), launcher_name);
        },
        extra..., doc);
}

#define MINFER_LAUNCHER(module, name, launcher, doc, ...) \
    def_launcher(module, name, #launcher, &launcher, doc, __VA_ARGS__)

nb::dict build_info() {
    nb::dict info;
    info["archs_sass"] = MINFER_BUILD_ARCHS_SASS;
    info["archs_ptx"] = MINFER_BUILD_ARCHS_PTX;
    info["archs_probed"] = MINFER_BUILD_ARCHS_PROBED;
    info["arch_request"] = MINFER_BUILD_ARCH_REQUEST;
    info["nvcc"] = MINFER_BUILD_NVCC;
    info["nvcc_version"] = MINFER_BUILD_NVCC_VERSION;
    info["host_compiler"] = MINFER_BUILD_HOST_COMPILER;
    info["cudart"] = MINFER_BUILD_CUDART;
    info["cudart_path"] = MINFER_BUILD_CUDART_PATH;
    info["runtime_version"] = minfer::runtime_version();
    info["driver_version"] = minfer::driver_version();
    return info;
}

nb::dict device_properties(int index) {
    const minfer::DeviceProperties p = minfer::device_properties(index);
    nb::dict out;
    out["index"] = p.index;
    out["name"] = p.name;
    out["compute_capability"] = nb::make_tuple(p.major, p.minor);
    out["sm_count"] = p.sm_count;
    out["total_memory"] = p.total_memory;
    out["l2_cache_bytes"] = p.l2_cache_bytes;
    out["max_shared_memory_per_block"] = p.max_shared_memory_per_block;
    return out;
}

void bind_runtime(nb::module_& m) {
    m.def("build_info", &build_info, "The build's facts (archs, nvcc, host compiler, cudart) as strings.");
    m.def("device_count", &minfer::device_count, "Number of CUDA devices; 0 without a GPU or driver.");
    m.def("unavailable_reason", &minfer::unavailable_reason, "Why device_count() is 0; '' when it is not.");
    m.def("device_properties", &device_properties, "index"_a, "Name, capability, SMs, memory of one device.");
    m.def("set_device", &minfer::set_device, "index"_a, "Make `index` this thread's current device.");
    m.def("mem_info", &minfer::mem_info, "(free, total) bytes of the current device.");
    m.def("latched_errors", &minfer::latched_error_count, "How many latched errors this process observed.");
    m.def("int8_gemv", &minfer::int8_gemv, "Whether the one-token GEMVs may take the integer tensor cores.");
    m.def("set_int8_gemv", &minfer::set_int8_gemv, "enabled"_a,
          "Let the one-token GEMVs take the integer tensor cores (True) or keep them on the CUDA cores; returns "
          "the setting before. MINFER_NO_INT8_GEMV=1 starts a process with it off.");
    m.def(
        "sync",
        [](std::uintptr_t stream) {
            nb::gil_scoped_release released;
            minfer::sync(as_stream(stream));
        },
        "stream"_a = 0,
        "The drain point: report any latched error, wait for `stream` to finish, report its errors.");
    m.def(
        "copy_d2d",
        [](std::uintptr_t dst, std::uintptr_t src, std::size_t nbytes, std::uintptr_t stream) {
            minfer::copy_device_to_device(dst, src, nbytes, as_stream(stream));
        },
        "dst"_a, "src"_a, "nbytes"_a, "stream"_a, "Enqueue a device-to-device copy of raw pointers on `stream`.");

    nb::class_<minfer::DeviceBuffer>(m, "DeviceBuffer", "Device memory (cudaMalloc), freed when dropped.")
        .def(nb::init<std::size_t>(), "nbytes"_a)
        .def_prop_ro("ptr", &minfer::DeviceBuffer::ptr, "The device address, for the launchers.")
        .def_prop_ro("nbytes", &minfer::DeviceBuffer::nbytes)
        .def(
            "copy_from_host",
            [](minfer::DeviceBuffer& self, const HostArray& src, std::uintptr_t stream, std::size_t offset) {
                const void* data = src.data();
                const std::size_t nbytes = src.nbytes();
                nb::gil_scoped_release released;
                self.copy_from_host(data, nbytes, offset, as_stream(stream), true);
            },
            "src"_a.noconvert(), "stream"_a = 0, "offset"_a = 0,
            "Copy `src` into the buffer at byte `offset`, ordered after earlier work on `stream`; returns "
            "when the copy is done.")
        .def(
            "copy_to_host",
            [](const minfer::DeviceBuffer& self, const MutableHostArray& dst, std::uintptr_t stream,
               std::size_t offset) {
                void* data = dst.data();
                const std::size_t nbytes = dst.nbytes();
                nb::gil_scoped_release released;
                self.copy_to_host(data, nbytes, offset, as_stream(stream), true);
            },
            "dst"_a.noconvert(), "stream"_a = 0, "offset"_a = 0,
            "Fill `dst` from the buffer at byte `offset`, ordered after earlier work on `stream`; returns "
            "when the copy is done.")
        .def(
            "copy_from_host_async",
            [](minfer::DeviceBuffer& self, const HostArray& src, std::uintptr_t stream, std::size_t offset) {
                self.copy_from_host(src.data(), src.nbytes(), offset, as_stream(stream), false);
            },
            "src"_a.noconvert(), "stream"_a, "offset"_a = 0,
            "Enqueue the copy of `src` on `stream` and return. Keep `src` alive and unchanged until the "
            "stream has passed the copy (use a PinnedBuffer's array for a truly asynchronous copy).")
        .def(
            "copy_to_host_async",
            [](const minfer::DeviceBuffer& self, const MutableHostArray& dst, std::uintptr_t stream,
               std::size_t offset) { self.copy_to_host(dst.data(), dst.nbytes(), offset, as_stream(stream), false); },
            "dst"_a.noconvert(), "stream"_a, "offset"_a = 0,
            "Enqueue the copy into `dst` on `stream` and return; `dst` is valid after a sync of `stream`.");

    nb::class_<minfer::PinnedBuffer>(m, "PinnedBuffer", "Page-locked host memory (cudaHostAlloc), freed when dropped.")
        .def(nb::init<std::size_t>(), "nbytes"_a)
        .def_prop_ro("ptr", &minfer::PinnedBuffer::ptr)
        .def_prop_ro("nbytes", &minfer::PinnedBuffer::nbytes)
        .def(
            "numpy",
            [](minfer::PinnedBuffer& self) {
                return nb::ndarray<nb::numpy, std::uint8_t, nb::ndim<1>>(self.data(), {self.nbytes()});
            },
            nb::rv_policy::reference_internal,
            "A uint8 numpy view of the memory; it keeps the PinnedBuffer alive. Use .view(dtype) to retype.");

    nb::class_<minfer::Event>(m, "Event", "A CUDA event: a marker recorded into a stream.")
        .def(nb::init<bool>(), "timing"_a = true)
        .def(
            "record", [](minfer::Event& self, std::uintptr_t stream) { self.record(as_stream(stream)); },
            "stream"_a = 0,
            "Record the event: it completes when the work enqueued before it on `stream` has. Inside a capture it "
            "is a node of the graph, recorded by each replay.")
        .def(
            "synchronize",
            [](minfer::Event& self) {
                nb::gil_scoped_release released;
                self.synchronize();
            },
            "Wait until the event has completed.")
        .def("elapsed_ms", &minfer::Event::elapsed_ms, "end"_a, "GPU milliseconds from this event to `end`.");

    nb::class_<minfer::Stream>(m, "Stream", "A non-blocking CUDA stream, destroyed when dropped.")
        .def(nb::init<>())
        .def_prop_ro("handle", &minfer::Stream::handle, "The cudaStream_t as an int, for every stream argument.")
        .def(
            "synchronize",
            [](minfer::Stream& self) {
                nb::gil_scoped_release released;
                minfer::sync(self.get());
            },
            "sync(self.handle): the drain point for this stream.")
        .def("wait", &minfer::Stream::wait, "event"_a, "Later work on this stream waits for `event`.");

    nb::class_<minfer::CudaGraph>(m, "CudaGraph", "An instantiated CUDA graph (from end_capture), destroyed when dropped.")
        .def(
            "launch", [](minfer::CudaGraph& self, std::uintptr_t stream) { self.launch(as_stream(stream)); }, "stream"_a,
            "Replay every captured operation on `stream` as one launch.")
        .def_prop_ro("node_count", &minfer::CudaGraph::node_count, "Operations captured (kernels, copies).");

    m.def(
        "begin_capture", [](std::uintptr_t stream) { minfer::begin_capture(as_stream(stream)); }, "stream"_a,
        "Start recording the work enqueued on `stream` (thread-local capture mode) instead of running it.");
    m.def(
        "end_capture", [](std::uintptr_t stream) { return minfer::end_capture(as_stream(stream)); }, "stream"_a,
        "Stop recording and return the instantiated CudaGraph.");
    m.def(
        "is_capturing", [](std::uintptr_t stream) { return minfer::is_capturing(as_stream(stream)); }, "stream"_a,
        "Whether `stream` is in capture mode.");
}

void bind_kernels(nb::module_& k) {
    nb::dict types;
    for (int i = 0; i < minfer_kernel_type_count(); ++i) types[minfer_kernel_type_name(i)] = minfer_kernel_type_id(i);
    k.attr("TYPES") = types;
    k.def("row_bytes", &minfer_row_bytes, "type"_a, "n_values"_a,
          "Bytes of one GGUF row of n_values values of GGML type `type`; -1 when unsupported or not whole blocks.");
    k.def("argmax_workspace_bytes", &argmax_workspace_bytes, "rows"_a, "n"_a,
          "Bytes of the workspace argmax_f32 needs.");
    k.def("gemm_splits", &gemm_splits, "out_features_0"_a, "out_features_1"_a, "out_features_2"_a, "in_features"_a,
          "n_tokens"_a, "multiprocessors"_a,
          "Slices of K gemm_group cuts a launch of these parts into on a GPU of `multiprocessors` SMs (1: none).");
    k.def("gemm_workspace_bytes", &gemm_workspace_bytes, "type"_a, "out_features_0"_a, "out_features_1"_a,
          "out_features_2"_a, "in_features"_a, "n_tokens"_a, "multiprocessors"_a,
          "Bytes of the workspace gemm_group (gemm: out_features_1 = out_features_2 = 0) of weights of GGML type "
          "`type` needs: x rounded to 16 bits, the slices' partial sums where it splits K, and the weights decoded "
          "to f16 where a long prompt stages them.");
    k.def("gemm_swiglu_workspace_bytes", &gemm_swiglu_workspace_bytes, "type"_a, "in_features"_a, "d_ff"_a,
          "n_tokens"_a,
          "Bytes of the workspace gemm_swiglu needs: x rounded to 16 bits, and the gate and up weights decoded to "
          "f16 where a long prompt stages them.");
    k.def("attention_decode_workspace_bytes", &attention_decode_workspace_bytes, "n_heads"_a, "head_dim"_a,
          "n_splits"_a, "Bytes of the workspace attention_decode_f32 needs.");
    k.def("attention_prefill_splits", &attention_prefill_splits, "n_tokens"_a, "n_heads"_a, "head_dim"_a,
          "max_rows"_a, "multiprocessors"_a,
          "Slices of the cache rows attention_prefill_f32 cuts a launch into on a GPU of `multiprocessors` SMs "
          "(1: none).");
    k.def("attention_prefill_workspace_bytes", &attention_prefill_workspace_bytes, "n_tokens"_a, "n_heads"_a,
          "head_dim"_a, "max_rows"_a, "multiprocessors"_a,
          "Bytes of the workspace attention_prefill_f32 needs; 0 when it does not split the cache rows.");

    MINFER_LAUNCHER(k, "add_f32", launch_add_f32, "out[i] = a[i] + b[i]; out may alias a or b.", "a"_a, "b"_a,
                    "out"_a, "n"_a, "stream"_a);
    MINFER_LAUNCHER(k, "mul_f32", launch_mul_f32, "out[i] = a[i] * b[i]; out may alias a or b.", "a"_a, "b"_a,
                    "out"_a, "n"_a, "stream"_a);
    MINFER_LAUNCHER(k, "scale_f32", launch_scale_f32, "out[i] = x[i] * scale; out may alias x.", "x"_a, "out"_a,
                    "scale"_a, "n"_a, "stream"_a);
    MINFER_LAUNCHER(k, "silu_f32", launch_silu_f32, "x[i] = x[i] / (1 + exp(-x[i])), in place.", "x"_a, "n"_a,
                    "stream"_a);
    MINFER_LAUNCHER(k, "gelu_f32", launch_gelu_f32,
                    "x[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the tanh GELU, in place.", "x"_a,
                    "n"_a, "stream"_a);
    MINFER_LAUNCHER(k, "softcap_f32", launch_softcap_f32, "x[i] = cap * tanh(x[i] / cap), in place; cap > 0.",
                    "x"_a, "cap"_a, "n"_a, "stream"_a);
    MINFER_LAUNCHER(k, "slice_f32", launch_slice_f32,
                    "out[r][i] = x[r*in_stride + start + i] for rows x width: columns start..start+width-1 of each "
                    "row; rows <= 65535.",
                    "x"_a, "out"_a, "rows"_a, "width"_a, "in_stride"_a, "start"_a, "stream"_a);
    MINFER_LAUNCHER(k, "swiglu_f32", launch_swiglu_f32,
                    "out[r][i] = silu(gate[r*in_stride + i]) * up[r*in_stride + i] for rows x d; rows <= 65535.",
                    "gate"_a, "up"_a, "out"_a, "rows"_a, "d"_a, "in_stride"_a, "stream"_a);
    MINFER_LAUNCHER(k, "geglu_f32", launch_geglu_f32,
                    "out[r][i] = gelu_tanh(gate[r*in_stride + i]) * up[r*in_stride + i] (gelu_f32's GELU), otherwise "
                    "as swiglu_f32.",
                    "gate"_a, "up"_a, "out"_a, "rows"_a, "d"_a, "in_stride"_a, "stream"_a);
    MINFER_LAUNCHER(k, "add_bias_f32", launch_add_bias_f32, "y[r][i] += bias[i] over [rows][d]; rows <= 65535.",
                    "y"_a, "bias"_a, "rows"_a, "d"_a, "stream"_a);
    MINFER_LAUNCHER(k, "rms_norm_f32", launch_rms_norm_f32,
                    "out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight over [rows][d]; out may alias x.", "x"_a,
                    "weight"_a, "out"_a, "rows"_a, "d"_a, "eps"_a, "stream"_a);
    MINFER_LAUNCHER(k, "rms_norm_add_f32", launch_rms_norm_add_f32,
                    "y[r] += x[r] / sqrt(mean(x[r]^2) + eps) * weight over [rows][d]; x must not alias y.", "x"_a,
                    "weight"_a, "y"_a, "rows"_a, "d"_a, "eps"_a, "stream"_a);
    MINFER_LAUNCHER(k, "rope_f32", launch_rope_f32,
                    "Rotate x [n_tokens][n_heads*head_dim] in place: pair p by positions[t] * inv_freq[p] "
                    "(device int32 [n_tokens], device float64 [n_rot/2]), cos and sin times mscale; mode 0 = "
                    "normal (adjacent pairs), 2 = NeoX (halves); n_rot <= head_dim, even.",
                    "x"_a, "positions"_a, "n_tokens"_a, "n_heads"_a, "head_dim"_a, "n_rot"_a, "inv_freq"_a,
                    "mscale"_a, "mode"_a, "stream"_a);
    MINFER_LAUNCHER(k, "embed_rows", launch_embed_rows,
                    "out[t] = dequantized table[ids[t]] for a GGUF table of n_rows rows of d values (GGML type "
                    "`type`); ids: device int32 [n_tokens]; an id outside the table traps.",
                    "table"_a, "type"_a, "ids"_a, "out"_a, "n_tokens"_a, "d"_a, "n_rows"_a, "stream"_a);
    MINFER_LAUNCHER(k, "matmul", launch_matmul,
                    "y[t][o] = sum_i W[o][i] * x[t][i]; W: GGUF bytes, out_features rows of in_features values of "
                    "GGML type `type`; x [n_tokens][in_features], y [n_tokens][out_features], f32.",
                    "weight"_a, "type"_a, "x"_a, "y"_a, "in_features"_a, "out_features"_a, "n_tokens"_a,
                    "stream"_a);
    MINFER_LAUNCHER(k, "gemm", launch_gemm,
                    "matmul's product on the tensor cores, for many tokens: W and x rounded to f16 (BF16 weights: "
                    "x to bf16), float32 sums; y = residual + (x W^T + bias), the order of gemm, add_bias_f32 and "
                    "add_f32 (bias, residual None: none; residual may be y); in_features a multiple of 32 (of 256 "
                    "for the K-quants and IQ4_XS), x 16-byte aligned; `workspace`: gemm_workspace_bytes(type, "
                    "out_features, 0, 0, ...) bytes, 16-byte aligned.",
                    "weight"_a, "type"_a, "x"_a, "bias"_a, "residual"_a, "y"_a, "in_features"_a, "out_features"_a,
                    "n_tokens"_a, "workspace"_a, "workspace_bytes"_a, "stream"_a);
    MINFER_LAUNCHER(k, "gemm_group", launch_gemm_group,
                    "gemm's products of one x by up to three weights of one GGML type in one launch: y_p[t][o] = "
                    "sum_i W_p[o][i] * x[t][i] + bias_p[o] (bias_p None: none); out_features_p 0 (pointers None): "
                    "part p and the ones after it are absent; `workspace`: gemm_workspace_bytes(...) bytes, 16-byte "
                    "aligned.",
                    "weight_0"_a, "bias_0"_a, "y_0"_a, "out_features_0"_a, "weight_1"_a, "bias_1"_a, "y_1"_a,
                    "out_features_1"_a, "weight_2"_a, "bias_2"_a, "y_2"_a, "out_features_2"_a, "type"_a, "x"_a,
                    "in_features"_a, "n_tokens"_a, "workspace"_a, "workspace_bytes"_a, "stream"_a);
    MINFER_LAUNCHER(k, "gemm_swiglu", launch_gemm_swiglu,
                    "gemm's products of x by the gate and up weights (d_ff rows each, one GGML type) in one tile, "
                    "then swiglu_f32 on them: h[t][f] = silu((x Wgate^T)[t][f]) * (x Wup^T)[t][f], h [n_tokens][d_ff]; "
                    "K never cut into slices; `workspace`: gemm_swiglu_workspace_bytes(...) bytes, 16-byte aligned.",
                    "gate"_a, "up"_a, "type"_a, "x"_a, "h"_a, "in_features"_a, "d_ff"_a, "n_tokens"_a, "workspace"_a,
                    "workspace_bytes"_a, "stream"_a);
    MINFER_LAUNCHER(k, "gemm_geglu", launch_gemm_geglu,
                    "h[t][f] = gelu_tanh((x Wgate^T)[t][f]) * (x Wup^T)[t][f] (geglu_f32's GELU), otherwise as "
                    "gemm_swiglu (its workspace: gemm_swiglu_workspace_bytes(...) bytes).",
                    "gate"_a, "up"_a, "type"_a, "x"_a, "h"_a, "in_features"_a, "d_ff"_a, "n_tokens"_a, "workspace"_a,
                    "workspace_bytes"_a, "stream"_a);
    MINFER_LAUNCHER(k, "gemv", launch_gemv,
                    "One token: y[o] = sum_i W[o][i] * h[i] (+ residual[o]), h = x, or RMSNorm(x) * norm_weight when "
                    "norm_weight is not None; W: GGUF bytes, out_features rows of in_features values (a multiple of 8) "
                    "of GGML type `type`; y may be residual (the add in place); residual None: none.",
                    "weight"_a, "type"_a, "x"_a, "norm_weight"_a, "eps"_a, "residual"_a, "y"_a, "in_features"_a,
                    "out_features"_a, "stream"_a);
    MINFER_LAUNCHER(k, "gemv_int8", launch_gemv_int8,
                    "gemv's function on the integer tensor cores (gemv and the fused one-token launchers take this "
                    "path themselves where it reads the weights, unless set_int8_gemv(False)): x times the norm "
                    "weight in three int8 parts per 32-value block; W of type Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, "
                    "Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or IQ4_XS, 16-byte aligned, staged through shared memory by the copy "
                    "engine; refused on GPUs older than sm_90.",
                    "weight"_a, "type"_a, "x"_a, "norm_weight"_a, "eps"_a, "residual"_a, "y"_a, "in_features"_a,
                    "out_features"_a, "stream"_a);
    MINFER_LAUNCHER(k, "gemv_swiglu", launch_gemv_swiglu,
                    "One token: out[i] = silu((G h)[i]) * (U h)[i], G and U the gate and up weights (d_ff rows "
                    "each, one GGML type), h = x or RMSNorm(x) * norm_weight (norm_weight None: none).",
                    "gate"_a, "up"_a, "type"_a, "x"_a, "norm_weight"_a, "eps"_a, "out"_a, "in_features"_a, "d_ff"_a,
                    "stream"_a);
    MINFER_LAUNCHER(k, "gemv_geglu", launch_gemv_geglu,
                    "One token: out[i] = gelu_tanh((G h)[i]) * (U h)[i] (gelu_f32's GELU), otherwise as gemv_swiglu.",
                    "gate"_a, "up"_a, "type"_a, "x"_a, "norm_weight"_a, "eps"_a, "out"_a, "in_features"_a, "d_ff"_a,
                    "stream"_a);
    MINFER_LAUNCHER(k, "gemv_qkv_rope_store", launch_gemv_qkv_rope_store,
                    "One token: q = Wq h + bq, k = Wk h + bk, v = Wv h + bv (each weight its own GGML type; a bias "
                    "None: none); RoPE (inv_freq, mscale and mode as rope_f32; n_rot 0: none, inv_freq may then be "
                    "None) on the q and k heads at positions[0]; q to `q`, k and v to row positions[0] of the caches "
                    "([n_ctx][n_kv_heads*head_dim] of cache_type, a GGML type id: 0 F32, 1 F16, rounded to nearest "
                    "even); a position outside 0..n_ctx-1 traps. h = x or RMSNorm(x) * norm_weight (norm_weight "
                    "None: none).",
                    "wq"_a, "q_type"_a, "wk"_a, "k_type"_a, "wv"_a, "v_type"_a, "x"_a, "norm_weight"_a, "eps"_a,
                    "bq"_a, "bk"_a, "bv"_a, "q"_a, "k_cache"_a, "v_cache"_a, "positions"_a, "in_features"_a,
                    "n_heads"_a, "n_kv_heads"_a, "head_dim"_a, "n_rot"_a, "inv_freq"_a, "mscale"_a, "mode"_a,
                    "n_ctx"_a, "cache_type"_a, "stream"_a);
    MINFER_LAUNCHER(k, "kv_store_f32", launch_kv_store_f32,
                    "k_cache[positions[t]] = k[t], v_cache[positions[t]] = v[t] (float32 rows of kv_dim values, "
                    "stored in cache_type: 0 F32, or 1 F16 rounded to nearest even); positions: device int32 "
                    "[n_tokens]; a position outside 0..n_ctx-1 traps.",
                    "k"_a, "v"_a, "k_cache"_a, "v_cache"_a, "positions"_a, "n_tokens"_a, "kv_dim"_a, "n_ctx"_a,
                    "cache_type"_a, "stream"_a);
    MINFER_LAUNCHER(k, "attention_decode_f32", launch_attention_decode_f32,
                    "One query token over cache rows 0..kv_len-1 (the last `window` of them; 0: all), kv_len read "
                    "from a device int32, scores scale * q.k: q/out [n_heads*head_dim], caches "
                    "[n_ctx][n_kv_heads*head_dim]; the cache is cut in n_splits pieces merged through `workspace` "
                    "(attention_decode_workspace_bytes). q_norm and k_norm (head_dim weights each; both or None): "
                    "q and cache row kv_len-1 are raw, each of their heads is first RMS-normed (head_eps) and "
                    "rotated as rope_f32 rotates at position kv_len-1 (n_rot, inv_freq, mscale, mode), that row "
                    "in place. The caches hold cache_type (0 F32, 1 F16), widened to float32 as read.",
                    "q"_a, "k_cache"_a, "v_cache"_a, "out"_a, "kv_len"_a, "workspace"_a, "n_heads"_a,
                    "n_kv_heads"_a, "head_dim"_a, "n_ctx"_a, "scale"_a, "window"_a, "n_splits"_a, "q_norm"_a,
                    "k_norm"_a, "head_eps"_a, "n_rot"_a, "inv_freq"_a, "mscale"_a, "mode"_a, "cache_type"_a,
                    "stream"_a);
    MINFER_LAUNCHER(k, "attention_prefill_f32", launch_attention_prefill_f32,
                    "Causal attention: query t (q/out [n_tokens][n_heads*head_dim]) over cache rows "
                    "0..positions[t] (the last `window` of them; 0: all), scores scale * q.k; positions: device "
                    "int32 [n_tokens]; max_rows (1..n_ctx) bounds the rows a query sees and sets the slices of the "
                    "cache rows; `workspace`: attention_prefill_workspace_bytes(...) bytes (None when that is 0). "
                    "The caches hold cache_type (0 F32, 1 F16), widened to float32 as read, but where the "
                    "tensor cores take the prompt (head_dim 64 or 128, sm_80+): their operands are f16.",
                    "q"_a, "k_cache"_a, "v_cache"_a, "out"_a, "positions"_a, "n_tokens"_a, "n_heads"_a,
                    "n_kv_heads"_a, "head_dim"_a, "n_ctx"_a, "max_rows"_a, "scale"_a, "window"_a, "workspace"_a,
                    "workspace_bytes"_a, "cache_type"_a, "stream"_a);
    MINFER_LAUNCHER(k, "argmax_f32", launch_argmax_f32,
                    "out[r] = argmax x[r] over [rows][n] (int32, lowest on ties; -1 if x[r] has NaN/Inf); `workspace`: "
                    "argmax_workspace_bytes(rows, n) zeroed bytes (a new DeviceBuffer), left zeroed.",
                    "x"_a, "out"_a, "workspace"_a, "rows"_a, "n"_a, "stream"_a);
    MINFER_LAUNCHER(k, "greedy_advance", launch_greedy_advance,
                    "picks[step[0]] = token[0] (below `capacity` picks; a -1 pick also sets token[0] = 0), then "
                    "step[0], positions[0] and kv_len[0] grow by one (all device int32).",
                    "token"_a, "picks"_a, "step"_a, "positions"_a, "kv_len"_a, "capacity"_a, "stream"_a);
    MINFER_LAUNCHER(k, "toy_busy", launch_toy_busy,
                    "For the tutorial only (toys.cu): `blocks` blocks of one warp spin `cycles` GPU clocks; "
                    "out[b] = the clocks block b spun.",
                    "out"_a, "cycles"_a, "blocks"_a, "stream"_a);
}

// The Python class minfer_kernels.CudaError, held for the life of the process: never released, since
// the interpreter may already be finalizing when C++ statics are destroyed.
PyObject* cuda_error_type = nullptr;

void translate_cuda_failure(const std::exception_ptr& exception, void*) {
    try {
        std::rethrow_exception(exception);
    } catch (const minfer::CudaFailure& failure) {
        const nb::handle type(cuda_error_type);
        try {
            const nb::object instance =
                type(failure.what(), int(failure.code), cudaGetErrorName(failure.code), failure.call, failure.latched);
            PyErr_SetObject(type.ptr(), instance.ptr());
        } catch (nb::python_error& error) {
            error.restore();
        }
    }
}

}  // namespace

NB_MODULE(_C, m) {
    m.doc() = "minfer's CUDA kernels and device runtime (see the minfer_kernels package for the public API).";

    // CudaError is a Python class (minfer_kernels/_errors.py): typed fields, constructible in tests.
    cuda_error_type = nb::object(nb::module_::import_("minfer_kernels._errors").attr("CudaError")).release().ptr();
    nb::register_exception_translator(&translate_cuda_failure);

    // Objects still referenced when the interpreter exits (by a test runner's records, a module global)
    // are never collected; nanobind would list them as leaks. They are not: the process is ending.
    nb::set_leak_warnings(false);

    bind_runtime(m);
    nb::module_ kernels = m.def_submodule("kernels", "The kernel launchers: device pointers and streams as ints.");
    bind_kernels(kernels);
}
