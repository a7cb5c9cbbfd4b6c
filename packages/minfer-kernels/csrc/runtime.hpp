// The device runtime: thin RAII wrappers over the CUDA runtime API and the error model. No policy lives
// here (which buffer, which stream, when to capture): that is the engine's job. What does live here is
// the rule that every CUDA call is checked and every failure names the call that observed it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

namespace minfer {

// A failed CUDA call. The binding turns it into minfer_kernels.CudaError with the same fields.
class CudaFailure : public std::runtime_error {
public:
    CudaFailure(cudaError_t code, std::string call, const std::string& message, bool latched)
        : std::runtime_error(message), code(code), call(std::move(call)), latched(latched) {}

    cudaError_t code;
    std::string call;  // the call that observed the error
    bool latched;      // true when the error was left by an earlier call, not caused by `call`
};

// --- The error model -------------------------------------------------------------------------------
// Throws CudaFailure when `err` is not cudaSuccess. A sticky error (the context is broken by an earlier
// kernel fault) is reported as latched: the call that observed it did not cause it.
void check(cudaError_t err, const std::string& call);
// Before a launch: an error already pending in this thread was left by an earlier call; report it as
// latched (and count it) rather than let the launch about to happen take the blame.
void raise_if_latched(const std::string& observer);
// After a launch: `err` is the launcher's return (cudaGetLastError() right after <<<>>>, or a refusal).
void check_launch(cudaError_t err, const char* launcher);
// The drain point: picks up any latched error, waits for `stream` to finish, reports what happened.
void sync(cudaStream_t stream);
// How many latched errors have been observed in this process.
long long latched_error_count();

// --- Kernel paths ----------------------------------------------------------------------------------
// Whether the one-token GEMVs may run on the integer tensor cores (kernels/gemv_int8.cu) for this process;
// set_int8_gemv returns the setting it replaces.
bool int8_gemv();
bool set_int8_gemv(bool enabled);
// Refuses (with a CudaFailure, before any CUDA call) an operation that synchronizes while this thread
// is capturing a graph: a sync inside a capture window would invalidate the capture.
void refuse_inside_capture(const char* what);

// --- Devices ---------------------------------------------------------------------------------------
struct DeviceProperties {
    int index;
    std::string name;
    int major, minor;
    int sm_count;
    std::size_t total_memory;
    int l2_cache_bytes;
    int max_shared_memory_per_block;
};
int device_count();                       // 0, never an exception, without a GPU or driver
std::string unavailable_reason();         // why device_count() is 0 ("" when it is not)
DeviceProperties device_properties(int index);
void set_device(int index);
std::pair<std::size_t, std::size_t> mem_info();  // (free, total) bytes on the current device
int runtime_version();                    // cudart's version, e.g. 13000
int driver_version();                     // the driver's CUDA version, 0 without a driver

// --- Memory ----------------------------------------------------------------------------------------
class DeviceBuffer {
public:
    explicit DeviceBuffer(std::size_t nbytes);
    ~DeviceBuffer();
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    std::uintptr_t ptr() const { return reinterpret_cast<std::uintptr_t>(ptr_); }
    std::size_t nbytes() const { return nbytes_; }

    // Copies `nbytes` between host memory and this buffer at byte `offset`, enqueued on `stream`. With
    // `wait`, returns once the copy is done (a synchronize of `stream`); without, returns at once and the
    // host memory must stay untouched until the stream gets there. A copy that does not fit is refused
    // with std::invalid_argument before any CUDA call.
    void copy_from_host(const void* src, std::size_t nbytes, std::size_t offset, cudaStream_t stream, bool wait);
    void copy_to_host(void* dst, std::size_t nbytes, std::size_t offset, cudaStream_t stream, bool wait) const;

private:
    void check_fits(std::size_t nbytes, std::size_t offset, const char* what) const;
    void* ptr_ = nullptr;
    std::size_t nbytes_;
};

class PinnedBuffer {
public:
    explicit PinnedBuffer(std::size_t nbytes);
    ~PinnedBuffer();
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;

    void* data() const { return ptr_; }
    std::uintptr_t ptr() const { return reinterpret_cast<std::uintptr_t>(ptr_); }
    std::size_t nbytes() const { return nbytes_; }

private:
    void* ptr_ = nullptr;
    std::size_t nbytes_;
};

// Device-to-device copy between raw pointers, enqueued on `stream` (the alias rule's staging copy).
void copy_device_to_device(std::uintptr_t dst, std::uintptr_t src, std::size_t nbytes, cudaStream_t stream);

// --- Streams, events, graphs -----------------------------------------------------------------------
class Event;

class Stream {
public:
    Stream();  // non-blocking: no implicit synchronization with the legacy default stream
    ~Stream();
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;

    cudaStream_t get() const { return stream_; }
    std::uintptr_t handle() const { return reinterpret_cast<std::uintptr_t>(stream_); }
    void wait(const Event& event);  // later work on this stream waits until `event` has completed

private:
    cudaStream_t stream_ = nullptr;
};

class Event {
public:
    explicit Event(bool timing);
    ~Event();
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;

    cudaEvent_t get() const { return event_; }
    void record(cudaStream_t stream);
    void synchronize();
    float elapsed_ms(const Event& end) const;  // GPU time from this event to `end`, both recorded

private:
    cudaEvent_t event_ = nullptr;
};

class CudaGraph {
public:
    CudaGraph(cudaGraphExec_t exec, std::size_t node_count) : exec_(exec), node_count_(node_count) {}
    ~CudaGraph();
    CudaGraph(const CudaGraph&) = delete;
    CudaGraph& operator=(const CudaGraph&) = delete;

    void launch(cudaStream_t stream);
    std::size_t node_count() const { return node_count_; }

private:
    cudaGraphExec_t exec_;
    std::size_t node_count_;
};

// Capture in thread-local mode: only this thread's unsafe calls (a sync, say) invalidate the capture, so
// another thread may keep working on its own stream meanwhile.
void begin_capture(cudaStream_t stream);
std::unique_ptr<CudaGraph> end_capture(cudaStream_t stream);
bool is_capturing(cudaStream_t stream);

}  // namespace minfer
