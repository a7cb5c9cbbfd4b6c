// A kernel that exists for the tutorial only (docs/tutorial/02-minimal-cuda.md, Toy #3 in Python:
// docs/tutorial/toys/streams.py): no graph op uses it.
//
// toy_busy keeps one warp per block busy for a given number of GPU clock cycles and does nothing else, so
// two launches on two streams can visibly run side by side where one stream runs them one after the other.
#include "common.cuh"
#include "launchers.h"

namespace minfer {
namespace {

// Spins `cycles` clocks of its SM, then lane 0 writes how many it spun: the work cannot be optimized away.
__global__ void toy_busy(long long* out, long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
    if (threadIdx.x == 0) out[blockIdx.x] = clock64() - start;
}

}  // namespace
}  // namespace minfer

using namespace minfer;

extern "C" cudaError_t launch_toy_busy(long long* out, long long cycles, int blocks, cudaStream_t stream) {
    if (cycles < 0) return minfer_refuse("cycles must not be negative");
    // grid.x: `blocks` blocks of one warp each; block b writes out[b].
    toy_busy<<<blocks, WARP_SIZE, 0, stream>>>(out, cycles);
    return cudaGetLastError();
}
