// Greedy sampling on the device: out[r] = argmax_i x[r][i], the index of the largest logit of each row.
//
// Reading back one int32 instead of the whole vocabulary row (151936 floats for Qwen2.5) is the point.
// Ties go to the lowest index, as numpy.argmax does. NaN compares false with everything and is never
// chosen; a row of NaN only yields index 0.
//
// One block per row: each thread scans a strided slice keeping its best (value, index), then the pairs
// are reduced with warp shuffles and, one pair per warp, through shared memory. The scan reads float4s,
// four of them per thread before comparing any, so a 151936-value row is ~10 memory round trips, not 150.
#include <cfloat>

#include "common.cuh"
#include "launchers.h"

namespace minfer {
namespace {

constexpr int ARGMAX_THREADS = 1024;

struct Best {
    float value;
    int index;
};

// The better of two candidates: the larger value, or on a tie the lower index.
__device__ __forceinline__ Best better(Best a, Best b) {
    if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
    return a;
}

__device__ __forceinline__ Best warp_best(Best best) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) {
        const Best other{__shfl_xor_sync(FULL_WARP, best.value, offset), __shfl_xor_sync(FULL_WARP, best.index, offset)};
        best = better(best, other);
    }
    return best;
}

// Candidate (value, index) against the best so far, for indices visited in increasing order per thread:
// `>` keeps the first of equal values.
__device__ __forceinline__ void consider(Best& best, float value, int index) {
    if (value > best.value || (value == best.value && best.index > index)) best = Best{value, index};
}

constexpr int ARGMAX_LOADS = 4;  // float4 loads a thread issues before it compares

__global__ void __launch_bounds__(ARGMAX_THREADS) argmax_f32(const float* __restrict__ x, int* __restrict__ out, int n) {
    const float* row = x + std::size_t(blockIdx.x) * n;
    // Start from "worse than anything": -FLT_MAX loses to every finite value and to +inf, and the index
    // n loses every tie.
    Best best{-FLT_MAX, n};
    const bool vectors = n % 4 == 0 && reinterpret_cast<std::uintptr_t>(row) % 16 == 0;
    const int n_vectors = vectors ? n / 4 : 0;
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (int first = threadIdx.x; first < n_vectors; first += ARGMAX_LOADS * blockDim.x) {
        float4 v[ARGMAX_LOADS];
#pragma unroll
        for (int u = 0; u < ARGMAX_LOADS; ++u) {
            const int i = first + u * blockDim.x;
            v[u] = i < n_vectors ? row4[i] : make_float4(-FLT_MAX, -FLT_MAX, -FLT_MAX, -FLT_MAX);
        }
#pragma unroll
        for (int u = 0; u < ARGMAX_LOADS; ++u) {
            const int i = 4 * (first + u * blockDim.x);
            consider(best, v[u].x, i);
            consider(best, v[u].y, i + 1);
            consider(best, v[u].z, i + 2);
            consider(best, v[u].w, i + 3);
        }
    }
    for (int i = 4 * n_vectors + threadIdx.x; i < n; i += blockDim.x) consider(best, row[i], i);
    best = warp_best(best);

    __shared__ Best per_warp[ARGMAX_THREADS / WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    if (lane == 0) per_warp[warp] = best;
    __syncthreads();
    if (warp == 0) {
        best = lane < int(blockDim.x / WARP_SIZE) ? per_warp[lane] : Best{-FLT_MAX, n};
        best = warp_best(best);
        if (lane == 0) out[blockIdx.x] = best.index < n ? best.index : 0;
    }
}

}  // namespace
}  // namespace minfer

using namespace minfer;

extern "C" cudaError_t launch_argmax_f32(const float* x, int* out, int rows, int n, cudaStream_t stream) {
    // grid.x: the row, one block of 1024 threads each; the threads stride over the row's n values.
    argmax_f32<<<rows, ARGMAX_THREADS, 0, stream>>>(x, out, n);
    return cudaGetLastError();
}
