// The error toy of docs/tutorial/02-minimal-cuda.md: CUDA's two error worlds and the capture-window rule,
// each provoked on purpose.
//
//   nvcc -arch=sm_90 -O2 -lineinfo -o errors errors.cu
//   ./errors                                              # launch, capture, latched: each checked
//   compute-sanitizer --tool memcheck ./errors unguarded   # the overrun only the sanitizer sees
//
//   launch     a block of 2048 threads (the limit is 1024): the launch itself fails, cudaGetLastError()
//              says so at once, and the context stays usable
//   capture    a cudaStreamSynchronize inside a capture window: refused, and the capture is invalidated
//   latched    a kernel that __trap()s on a bad index, as minfer's kernels do: the launch succeeds, the
//              fault surfaces at the next synchronization, and every later call returns it (sticky)
//   unguarded  a SiLU without its `if (i >= n) return;` over n = 896: 4 blocks of 256 threads, so 128
//              threads write past the end of the buffer. Nothing reports it; memcheck does
//
// Exits 1 when a mode does not behave as described (the unguarded mode only runs: it has nothing to check).
#include <cstdio>
#include <cstring>

#include <cuda_runtime.h>

#define CHECK(call)                                                                                    \
    do {                                                                                               \
        const cudaError_t err_ = (call);                                                               \
        if (err_ != cudaSuccess) {                                                                     \
            std::printf("CUDA error %s (%s) at %s:%d: %s\n", cudaGetErrorName(err_),                   \
                        cudaGetErrorString(err_), __FILE__, __LINE__, #call);                          \
            return false;                                                                              \
        }                                                                                              \
    } while (0)

// Prints what `call` returned and whether that is `expected` (or `also`, where two CUDA versions differ).
bool expect(const char* call, cudaError_t got, cudaError_t expected, cudaError_t also = cudaSuccess) {
    const bool ok = got == expected || (also != cudaSuccess && got == also);
    std::printf("  %-44s -> %s %s\n", call, cudaGetErrorName(got), ok ? "(as expected)" : "(NOT as expected)");
    return ok;
}

__global__ void silu(float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = x[i] / (1.0f + expf(-x[i]));
}

// The bug the guard prevents: every thread of the ceil-div grid writes, including those past n.
__global__ void silu_unguarded(float* x) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i] = x[i] / (1.0f + expf(-x[i]));
}

// A device-side index check, like minfer's embed_rows and kv_store_f32: an index that only the device
// knows is outside the table, so the kernel traps instead of touching another buffer's memory.
__global__ void gather(const float* table, const int* index, float* out, int rows) {
    const int row = *index;
    if (row < 0 || row >= rows) __trap();
    *out = table[row];
}

bool launch_error() {
    std::printf("launch: silu<<<1, 2048>>> (at most 1024 threads per block)\n");
    float* x = nullptr;
    CHECK(cudaMalloc(&x, 2048 * sizeof(float)));
    silu<<<1, 2048>>>(x, 2048);
    bool ok = expect("cudaGetLastError() right after the launch", cudaGetLastError(),
                     cudaErrorInvalidConfiguration, cudaErrorInvalidValue);
    ok &= expect("cudaDeviceSynchronize() after it", cudaDeviceSynchronize(), cudaSuccess);  // nothing ran
    silu<<<8, 256>>>(x, 2048);
    ok &= expect("the next, valid launch", cudaGetLastError(), cudaSuccess);
    ok &= expect("cudaDeviceSynchronize()", cudaDeviceSynchronize(), cudaSuccess);
    CHECK(cudaFree(x));
    return ok;
}

bool capture_rule() {
    std::printf("capture: cudaStreamSynchronize inside cudaStreamBeginCapture ... EndCapture\n");
    float* x = nullptr;
    CHECK(cudaMalloc(&x, 896 * sizeof(float)));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    silu<<<4, 256, 0, stream>>>(x, 896);  // recorded, not run
    bool ok = expect("the launch inside the window", cudaGetLastError(), cudaSuccess);
    ok &= expect("cudaStreamSynchronize(stream) inside it", cudaStreamSynchronize(stream),
                 cudaErrorStreamCaptureUnsupported);
    cudaGraph_t graph = nullptr;
    ok &= expect("cudaStreamEndCapture(stream)", cudaStreamEndCapture(stream, &graph),
                 cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();  // both failures are reported above; clear the thread's last error
    if (graph != nullptr) CHECK(cudaGraphDestroy(graph));
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(x));
    return ok;
}

bool latched_error() {
    std::printf("latched: gather() traps on index 9 of a 4-row table\n");
    const int bad_index = 9;
    float *table = nullptr, *out = nullptr;
    int* index = nullptr;
    CHECK(cudaMalloc(&table, 4 * sizeof(float)));
    CHECK(cudaMalloc(&out, sizeof(float)));
    CHECK(cudaMalloc(&index, sizeof(int)));
    CHECK(cudaMemcpy(index, &bad_index, sizeof(int), cudaMemcpyHostToDevice));
    gather<<<1, 1>>>(table, index, out, 4);
    bool ok = expect("cudaGetLastError() right after the launch", cudaGetLastError(), cudaSuccess);
    // A trap reads as an unspecified launch failure (some drivers: an illegal instruction).
    ok &= expect("cudaDeviceSynchronize() (the drain point)", cudaDeviceSynchronize(), cudaErrorLaunchFailure,
                 cudaErrorIllegalInstruction);
    void* more = nullptr;
    ok &= expect("cudaMalloc afterwards (sticky: not its error)", cudaMalloc(&more, 16), cudaErrorLaunchFailure,
                 cudaErrorIllegalInstruction);
    return ok;  // the context is unusable now: nothing is freed, the process exits
}

int unguarded() {
    const int n = 896;
    std::printf("unguarded: silu_unguarded<<<4, 256>>> over %d floats (%zu bytes)\n", n, n * sizeof(float));
    float* x = nullptr;
    if (cudaMalloc(&x, n * sizeof(float)) != cudaSuccess) return 1;
    silu_unguarded<<<(n + 255) / 256, 256>>>(x);
    const cudaError_t launched = cudaGetLastError();
    const cudaError_t drained = cudaDeviceSynchronize();
    // Alone, the kernel reads and writes 128 floats past the end and both calls succeed; under memcheck the
    // first bad access stops the kernel, and the sync reports it.
    std::printf("  launch: %s, sync: %s: %s\n", cudaGetErrorName(launched), cudaGetErrorName(drained),
                drained == cudaSuccess ? "the 128 writes past the end went unnoticed" : "the kernel was stopped");
    cudaFree(x);
    return 0;
}

int main(int argc, char** argv) {
    if (argc > 1 && std::strcmp(argv[1], "unguarded") == 0) return unguarded();
    if (argc > 1) {
        std::printf("usage: %s [unguarded]\n", argv[0]);
        return 2;
    }
    const bool launch_ok = launch_error();
    const bool capture_ok = capture_rule();
    const bool latched_ok = latched_error();  // last: it leaves the context broken
    const bool pass = launch_ok && capture_ok && latched_ok;
    std::printf("%s\n", pass ? "PASS" : "FAIL");
    return pass ? 0 : 1;
}
