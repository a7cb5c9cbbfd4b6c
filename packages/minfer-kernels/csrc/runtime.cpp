// The device runtime (runtime.hpp): every CUDA runtime call the package makes outside the kernel
// launchers, each one checked, and the error model that decides how a failure is reported.
//
// The two error worlds (docs/GPU_SAFETY.md):
//   - a call that fails by itself (an allocation too large, a launch with an impossible grid) raises at
//     once, naming the call;
//   - a fault inside a running kernel (an out-of-bounds access, a __trap) surfaces later, in whichever
//     call looks next: it is LATCHED. It is counted, reported with the name of the call that observed it,
//     and never blamed on that call or on the kernel that just ran.
#include "runtime.hpp"

#include <atomic>
#include <cstdlib>
#include <string>

extern "C" cudaError_t minfer_refuse(const char* reason);
extern "C" bool minfer_programmatic_launch();
extern "C" int minfer_compute_capability();
extern "C" bool minfer_int8_gemv();
extern "C" bool minfer_set_int8_gemv(bool enabled);

namespace minfer {
namespace {

std::atomic<long long> latched_errors{0};

// The reason the last launcher in this thread refused its arguments (kernels/common.cuh), if it did.
thread_local const char* refusal_reason = nullptr;

// The stream this thread is capturing into, if any (begin_capture .. end_capture).
thread_local cudaStream_t capturing_stream = nullptr;
thread_local bool capturing = false;

std::string describe(cudaError_t err) {
    return std::string(cudaGetErrorName(err)) + " (" + std::to_string(int(err)) + "): " + cudaGetErrorString(err);
}

// Errors after which the CUDA context is unusable: every later call returns them again. They come from
// a kernel that faulted, so whichever call sees one is only its observer.
bool is_sticky(cudaError_t err) {
    switch (err) {
        case cudaErrorIllegalAddress:
        case cudaErrorLaunchFailure:
        case cudaErrorIllegalInstruction:
        case cudaErrorMisalignedAddress:
        case cudaErrorInvalidAddressSpace:
        case cudaErrorInvalidPc:
        case cudaErrorHardwareStackError:
        case cudaErrorAssert:
        case cudaErrorLaunchTimeout:
        case cudaErrorECCUncorrectable:
            return true;
        default:
            return false;
    }
}

// Errors that say CUDA cannot run here at all (no GPU, no driver, a driver too old): every call
// returns them, so they are nobody's latched error. device_count() is 0 on such a machine.
bool is_unavailable(cudaError_t err) {
    switch (err) {
        case cudaErrorNoDevice:
        case cudaErrorInsufficientDriver:
        case cudaErrorInitializationError:
        case cudaErrorStubLibrary:
        case cudaErrorSystemDriverMismatch:
        case cudaErrorCompatNotSupportedOnDevice:
        case cudaErrorDevicesUnavailable:
            return true;
        default:
            return false;
    }
}

[[noreturn]] void throw_unavailable(cudaError_t err, const std::string& observer) {
    cudaGetLastError();
    throw CudaFailure(err, observer,
                      observer + " cannot run: CUDA is not usable on this machine: " + describe(err) +
                          " (minfer_kernels.device_count() is 0 here)",
                      false);
}

[[noreturn]] void throw_latched(cudaError_t err, const std::string& observer) {
    if (is_unavailable(err)) throw_unavailable(err, observer);
    const long long count = ++latched_errors;
    std::string message = observer + " found " + describe(err) +
                          ", latched by an earlier call or kernel: not evidence about " + observer +
                          " (latched errors so far: " + std::to_string(count) + ")";
    if (is_sticky(err))
        message += ". The error is sticky: a kernel faulted and this process's CUDA context is unusable; "
                   "find the kernel with compute-sanitizer (tools/gpu-check.sh runs it) and restart";
    throw CudaFailure(err, observer, message, true);
}

}  // namespace

void check(cudaError_t err, const std::string& call) {
    if (err == cudaSuccess) return;
    if (is_sticky(err)) throw_latched(err, call);
    // A failing call also leaves its error as this thread's "last error". This exception reports it, so
    // clear it: the next launch must not report the same error a second time, as latched.
    cudaGetLastError();
    throw CudaFailure(err, call, call + " failed: " + describe(err), false);
}

void raise_if_latched(const std::string& observer) {
    const cudaError_t pending = cudaGetLastError();
    if (pending != cudaSuccess) throw_latched(pending, observer);
}

void check_launch(cudaError_t err, const char* launcher) {
    if (err == cudaSuccess) return;
    if (refusal_reason != nullptr) {
        const std::string reason = refusal_reason;
        refusal_reason = nullptr;
        throw std::invalid_argument(std::string(launcher) + " refused its arguments: " + reason);
    }
    if (is_sticky(err)) throw_latched(err, launcher);
    throw CudaFailure(err, launcher, std::string(launcher) + " failed at launch: " + describe(err), false);
}

void sync(cudaStream_t stream) {
    refuse_inside_capture("sync()");
    const cudaError_t latched = cudaGetLastError();
    const cudaError_t drained = cudaStreamSynchronize(stream);
    if (latched != cudaSuccess) {
        if (is_unavailable(latched)) throw_unavailable(latched, "sync()");
        // Reported first because it happened first; the drain's own result rides along.
        const long long count = ++latched_errors;
        std::string message = "sync() found " + describe(latched) +
                              ", latched by an earlier call or kernel: not evidence about the last kernel launched"
                              " (latched errors so far: " +
                              std::to_string(count) + ")";
        if (drained != cudaSuccess) message += "; the stream then reported " + describe(drained);
        throw CudaFailure(latched, "sync()", message, true);
    }
    check(drained, "cudaStreamSynchronize (sync)");
}

long long latched_error_count() { return latched_errors.load(); }

void refuse_inside_capture(const char* what) {
    if (!capturing) return;
    throw CudaFailure(cudaErrorStreamCaptureUnsupported, what,
                      std::string(what) +
                          " refused: this thread is capturing a graph (begin_capture), and a synchronization "
                          "inside the capture window would invalidate the capture. Call end_capture first.",
                      false);
}

// --- Devices ---------------------------------------------------------------------------------------

int device_count() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();  // "no GPU" is an answer here, not a latched error for the next call
        return 0;
    }
    return count;
}

std::string unavailable_reason() {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return "cudaGetDeviceCount failed: " + describe(err);
    }
    return count == 0 ? "cudaGetDeviceCount found no CUDA device" : "";
}

DeviceProperties device_properties(int index) {
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
    DeviceProperties out{};
    out.index = index;
    out.name = prop.name;
    out.total_memory = prop.totalGlobalMem;
    const auto attribute = [index](cudaDeviceAttr attr) {
        int value = 0;
        check(cudaDeviceGetAttribute(&value, attr, index), "cudaDeviceGetAttribute");
        return value;
    };
    out.major = attribute(cudaDevAttrComputeCapabilityMajor);
    out.minor = attribute(cudaDevAttrComputeCapabilityMinor);
    out.sm_count = attribute(cudaDevAttrMultiProcessorCount);
    out.l2_cache_bytes = attribute(cudaDevAttrL2CacheSize);
    out.max_shared_memory_per_block = attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    return out;
}

void set_device(int index) { check(cudaSetDevice(index), "cudaSetDevice"); }

std::pair<std::size_t, std::size_t> mem_info() {
    std::size_t free_bytes = 0, total_bytes = 0;
    check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    return {free_bytes, total_bytes};
}

int runtime_version() {
    int version = 0;
    check(cudaRuntimeGetVersion(&version), "cudaRuntimeGetVersion");
    return version;
}

int driver_version() {
    int version = 0;
    check(cudaDriverGetVersion(&version), "cudaDriverGetVersion");
    return version;
}

// --- Memory ----------------------------------------------------------------------------------------
// Destructors cannot raise. A failing cudaFree / cudaFreeHost / ...Destroy means the context is already
// broken (a sticky error the next checked call reports) or the process is exiting (cudart unloading).

// A new buffer holds zeros: kernels that keep counters in a workspace (attention.cu) rely on it, and a
// stray read of a fresh buffer then sees zeros rather than another tensor's leftovers. cudaMemset runs on
// the legacy stream, which the backends' non-blocking streams do not wait for: the synchronize makes the
// zeros land before any later work on any stream.
DeviceBuffer::DeviceBuffer(std::size_t nbytes) : nbytes_(nbytes) {
    check(cudaMalloc(&ptr_, nbytes), "cudaMalloc(" + std::to_string(nbytes) + " bytes)");
    cudaError_t zeroed = cudaMemset(ptr_, 0, nbytes);
    if (zeroed == cudaSuccess) zeroed = cudaStreamSynchronize(nullptr);
    if (zeroed != cudaSuccess) cudaFree(ptr_);  // the constructor throws: no destructor will free it
    check(zeroed, "cudaMemset(" + std::to_string(nbytes) + " bytes) of a new DeviceBuffer");
}

DeviceBuffer::~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
}

void DeviceBuffer::check_fits(std::size_t nbytes, std::size_t offset, const char* what) const {
    if (offset > nbytes_ || nbytes > nbytes_ - offset)
        throw std::invalid_argument(std::string(what) + ": " + std::to_string(nbytes) + " bytes at offset " +
                                    std::to_string(offset) + " do not fit a DeviceBuffer of " +
                                    std::to_string(nbytes_) + " bytes");
}

void DeviceBuffer::copy_from_host(const void* src, std::size_t nbytes, std::size_t offset, cudaStream_t stream,
                                  bool wait) {
    check_fits(nbytes, offset, "DeviceBuffer.copy_from_host");
    if (wait) refuse_inside_capture("DeviceBuffer.copy_from_host");
    check(cudaMemcpyAsync(static_cast<char*>(ptr_) + offset, src, nbytes, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync(host to device, " + std::to_string(nbytes) + " bytes)");
    if (wait) check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (DeviceBuffer.copy_from_host)");
}

void DeviceBuffer::copy_to_host(void* dst, std::size_t nbytes, std::size_t offset, cudaStream_t stream,
                                bool wait) const {
    check_fits(nbytes, offset, "DeviceBuffer.copy_to_host");
    if (wait) refuse_inside_capture("DeviceBuffer.copy_to_host");
    check(cudaMemcpyAsync(dst, static_cast<const char*>(ptr_) + offset, nbytes, cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync(device to host, " + std::to_string(nbytes) + " bytes)");
    if (wait) check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (DeviceBuffer.copy_to_host)");
}

PinnedBuffer::PinnedBuffer(std::size_t nbytes) : nbytes_(nbytes) {
    check(cudaHostAlloc(&ptr_, nbytes, cudaHostAllocDefault), "cudaHostAlloc(" + std::to_string(nbytes) + " bytes)");
}

PinnedBuffer::~PinnedBuffer() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
}

void copy_device_to_device(std::uintptr_t dst, std::uintptr_t src, std::size_t nbytes, cudaStream_t stream) {
    check(cudaMemcpyAsync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), nbytes,
                          cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync(device to device, " + std::to_string(nbytes) + " bytes)");
}

// --- Streams, events, graphs -----------------------------------------------------------------------

Stream::Stream() { check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }

Stream::~Stream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);  // returns at once; queued work still completes
}

void Stream::wait(const Event& event) { check(cudaStreamWaitEvent(stream_, event.get(), 0), "cudaStreamWaitEvent"); }

Event::Event(bool timing) {
    check(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming),
          "cudaEventCreateWithFlags");
}

Event::~Event() {
    if (event_ != nullptr) cudaEventDestroy(event_);
}

// Inside a capture a plain record only marks a point for another stream to fork from, and the graph holds no
// node for it; recorded as external it becomes a node, recorded again by each replay, so events timed around a
// captured span time it in every replay (the runtime's op timer). The cost: such an event cannot fork or join
// another stream inside the capture, which nothing here does.
void Event::record(cudaStream_t stream) {
    const unsigned int flags = is_capturing(stream) ? cudaEventRecordExternal : cudaEventRecordDefault;
    check(cudaEventRecordWithFlags(event_, stream, flags), "cudaEventRecordWithFlags");
}

void Event::synchronize() {
    refuse_inside_capture("Event.synchronize");
    check(cudaEventSynchronize(event_), "cudaEventSynchronize");
}

float Event::elapsed_ms(const Event& end) const {
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, event_, end.get()), "cudaEventElapsedTime");
    return ms;
}

CudaGraph::~CudaGraph() { cudaGraphExecDestroy(exec_); }

void CudaGraph::launch(cudaStream_t stream) {
    raise_if_latched("cudaGraphLaunch");
    check(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
}

void begin_capture(cudaStream_t stream) {
    if (capturing)
        throw CudaFailure(cudaErrorStreamCaptureUnsupported, "begin_capture",
                          "begin_capture refused: this thread is already capturing; call end_capture first", false);
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    capturing = true;
    capturing_stream = stream;
}

std::unique_ptr<CudaGraph> end_capture(cudaStream_t stream) {
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (capturing && stream == capturing_stream) capturing = false;  // the stream has left capture mode
    check(ended, "cudaStreamEndCapture");

    std::size_t node_count = 0;
    const cudaError_t counted = cudaGraphGetNodes(graph, nullptr, &node_count);
    cudaGraphExec_t exec = nullptr;
    const cudaError_t instantiated = counted == cudaSuccess ? cudaGraphInstantiate(&exec, graph, 0) : counted;
    cudaGraphDestroy(graph);  // the executable graph no longer needs the graph it was made from
    check(counted, "cudaGraphGetNodes");
    check(instantiated, "cudaGraphInstantiate");
    return std::make_unique<CudaGraph>(exec, node_count);
}

bool is_capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
}

}  // namespace minfer

extern "C" cudaError_t minfer_refuse(const char* reason) {
    minfer::refusal_reason = reason;
    return cudaErrorInvalidValue;
}

// Asked at launches, so it must be cheap: the answer per device is read once.
extern "C" int minfer_compute_capability() {
    constexpr int MAX_DEVICES = 64;
    static std::atomic<int> answer[MAX_DEVICES] = {};  // 0 not read yet, -1 unreadable, else 10 * major + minor
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= MAX_DEVICES) return 0;
    int known = answer[device].load(std::memory_order_relaxed);
    if (known == 0) {
        int major = 0, minor = 0;
        const bool read = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                          cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess;
        known = read ? 10 * major + minor : -1;
        answer[device].store(known, std::memory_order_relaxed);
    }
    return known > 0 ? known : 0;
}

// MINFER_NO_INT8_GEMV sets the start; minfer_set_int8_gemv changes it (a process-wide switch, as the env is).
namespace {
std::atomic<int> int8_gemv_setting{-1};  // -1: not read yet, 0 off, 1 on
}  // namespace

extern "C" bool minfer_int8_gemv() {
    int setting = int8_gemv_setting.load(std::memory_order_relaxed);
    if (setting < 0) {
        const char* off = std::getenv("MINFER_NO_INT8_GEMV");
        setting = off != nullptr && off[0] != '\0' && std::string(off) != "0" ? 0 : 1;
        int expected = -1;
        int8_gemv_setting.compare_exchange_strong(expected, setting, std::memory_order_relaxed);
        setting = int8_gemv_setting.load(std::memory_order_relaxed);
    }
    return setting == 1;
}

extern "C" bool minfer_set_int8_gemv(bool enabled) {
    const bool previous = minfer_int8_gemv();
    int8_gemv_setting.store(enabled ? 1 : 0, std::memory_order_relaxed);
    return previous;
}

namespace minfer {
bool int8_gemv() { return minfer_int8_gemv(); }
bool set_int8_gemv(bool enabled) { return minfer_set_int8_gemv(enabled); }
}  // namespace minfer

// MINFER_NO_PDL, read once, only exists to measure the difference (docs/PERFORMANCE.md).
extern "C" bool minfer_programmatic_launch() {
    static const bool disabled = [] {
        const char* off = std::getenv("MINFER_NO_PDL");
        return off != nullptr && off[0] != '\0' && std::string(off) != "0";
    }();
    return !disabled && minfer_compute_capability() >= 90;
}
