// Greedy sampling on the device: out[r] = argmax_i x[r][i], the index of the largest logit of each row.
//
// Reading back one int32 instead of the whole vocabulary row (151936 floats for Qwen2.5) is the point.
// Ties go to the lowest index, as numpy.argmax does. A row holding any NaN or +-Inf yields -1: NaN compares
// false with everything, so it would otherwise be skipped silently and a broken model would look greedy.
// The check is one more compare per value (the scan is bound by memory, not by compares) and one
// __syncthreads_or per block reduction.
//
// A row is split over up to ARGMAX_MAX_BLOCKS blocks (one block could only pull ~60 GB/s out of memory:
// 10 us for a 600 KB row). Each thread scans a strided slice with float4 loads, four in flight before it
// compares any, keeping its best (value, index); the block reduces its threads' candidates (warp shuffles,
// then one candidate per warp through shared memory) and writes one candidate to the workspace; the last
// block of the row to finish (a counter in the workspace, which it resets for the next launch) reduces
// those and writes the index.
//
// greedy_advance turns one greedy decode step's pick into the next step's inputs on the device, so that steps
// replay back to back with no host round trip between them (the CUDA backend's greedy_steps): it records the
// pick, and the next step reads it as its token, one position further.
#include <algorithm>
#include <cfloat>

#include "common.cuh"
#include "launchers.h"

namespace minfer {
namespace {

constexpr int ARGMAX_THREADS = 256;
constexpr int ARGMAX_MAX_BLOCKS = 64;
constexpr int ARGMAX_VALUES_PER_BLOCK = 4096;  // a block's share of a row, at least
constexpr int ARGMAX_LOADS = 4;                // float4 loads a thread issues before it compares

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

// The best candidate of the block, in thread 0. Contains __syncthreads(): every thread must call it.
__device__ __forceinline__ Best block_best(Best best, int n) {
    __shared__ Best per_warp[ARGMAX_THREADS / WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    best = warp_best(best);
    __syncthreads();  // a previous call's readers are done with per_warp
    if (lane == 0) per_warp[warp] = best;
    __syncthreads();
    best = lane < ARGMAX_THREADS / WARP_SIZE ? per_warp[lane] : Best{-FLT_MAX, n};
    return warp_best(best);
}

// Candidate (value, index) against the best so far, for indices visited in increasing order per thread:
// `>` keeps the first of equal values. `non_finite` becomes true at a NaN (every comparison with it is false,
// so |NaN| <= FLT_MAX is too) or an infinity.
__device__ __forceinline__ void consider(Best& best, bool& non_finite, float value, int index) {
    non_finite |= !(fabsf(value) <= FLT_MAX);
    if (value > best.value || (value == best.value && best.index > index)) best = Best{value, index};
}

// Block (blockIdx.x, row blockIdx.y) scans float4 chunks blockIdx.x * 256 + thread, then + gridDim.x * 256,
// ... of the row.
__global__ void __launch_bounds__(ARGMAX_THREADS)
    argmax_f32(const float* __restrict__ x, int* __restrict__ out, Best* __restrict__ partials,
               int* __restrict__ counters, int n) {
    const int row_index = blockIdx.y;
    const float* row = x + std::size_t(row_index) * n;
    // Start from "worse than anything": -FLT_MAX loses to every finite value and to +inf, and the index
    // n loses every tie.
    Best best{-FLT_MAX, n};
    bool non_finite = false;
    const bool vectors = n % 4 == 0 && reinterpret_cast<std::uintptr_t>(row) % 16 == 0;
    const int n_vectors = vectors ? n / 4 : 0;
    const float4* row4 = reinterpret_cast<const float4*>(row);
    const int stride = gridDim.x * blockDim.x;
    for (int first = blockIdx.x * blockDim.x + threadIdx.x; first < n_vectors; first += ARGMAX_LOADS * stride) {
        float4 v[ARGMAX_LOADS];
#pragma unroll
        for (int u = 0; u < ARGMAX_LOADS; ++u) {
            const int i = first + u * stride;
            v[u] = i < n_vectors ? row4[i] : make_float4(-FLT_MAX, -FLT_MAX, -FLT_MAX, -FLT_MAX);
        }
#pragma unroll
        for (int u = 0; u < ARGMAX_LOADS; ++u) {
            const int i = 4 * (first + u * stride);
            consider(best, non_finite, v[u].x, i);
            consider(best, non_finite, v[u].y, i + 1);
            consider(best, non_finite, v[u].z, i + 2);
            consider(best, non_finite, v[u].w, i + 3);
        }
    }
    for (int i = 4 * n_vectors + blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        consider(best, non_finite, row[i], i);
    }
    best = block_best(best, n);
    non_finite = __syncthreads_or(non_finite);

    // One candidate per block (index -1 when its slice held NaN or +-Inf); the block that completes the
    // row's count reduces them.
    __shared__ bool merges;
    Best* row_partials = partials + std::size_t(row_index) * gridDim.x;
    if (threadIdx.x == 0) {
        row_partials[blockIdx.x] = non_finite ? Best{best.value, -1} : best;
        __threadfence();
        merges = atomicAdd(&counters[row_index], 1) == int(gridDim.x) - 1;
        if (merges) atomicExch(&counters[row_index], 0);  // ready for the next launch
    }
    __syncthreads();
    if (!merges) return;
    __threadfence();
    best = Best{-FLT_MAX, n};
    non_finite = false;
    for (int b = threadIdx.x; b < int(gridDim.x); b += blockDim.x) {
        // Read through L2, where the other blocks' candidates are.
        const Best other{__ldcg(&row_partials[b].value), __ldcg(&row_partials[b].index)};
        non_finite |= other.index < 0;
        best = better(best, other);
    }
    best = block_best(best, n);
    non_finite = __syncthreads_or(non_finite);
    // Every value of a finite row beats the starting -FLT_MAX or ties it at a lower index: best.index < n.
    if (threadIdx.x == 0) out[row_index] = non_finite ? -1 : best.index;
}

int argmax_blocks(int n) { return std::max(1, std::min(ARGMAX_MAX_BLOCKS, ceil_div(n, ARGMAX_VALUES_PER_BLOCK))); }

std::size_t argmax_counter_bytes(int rows) { return (std::size_t(rows) * sizeof(int) + 15) / 16 * 16; }

// One thread. picks[*step] = the pick in token[0] (argmax_f32's output: -1 for a row holding NaN or Inf),
// then *step, positions[0] and kv_len[0] grow by one. A -1 pick becomes token 0 for the next step, a row the
// embedding can read: the steps after it compute nothing that is kept (the host reads the -1 in picks and
// stops there). Past `capacity` picks the kernel records nothing.
__global__ void greedy_advance(int* token, int* picks, int* step, int* positions, int* kv_len, int capacity) {
    const int pick = token[0];
    const int s = step[0];
    if (s < capacity) picks[s] = pick;
    step[0] = s + 1;
    if (pick < 0) token[0] = 0;
    positions[0] += 1;
    kv_len[0] += 1;
}

}  // namespace
}  // namespace minfer

using namespace minfer;

extern "C" std::size_t argmax_workspace_bytes(int rows, int n) {
    return argmax_counter_bytes(rows) + std::size_t(rows) * argmax_blocks(n) * sizeof(Best);
}

extern "C" cudaError_t launch_argmax_f32(const float* x, int* out, void* workspace, int rows, int n,
                                         cudaStream_t stream) {
    if (rows <= 0 || n <= 0) return minfer_refuse("rows and n must be positive");
    if (!is_aligned(workspace, 16)) return minfer_refuse("workspace must be 16-byte aligned");
    auto* counters = static_cast<int*>(workspace);
    auto* partials = reinterpret_cast<Best*>(static_cast<char*>(workspace) + argmax_counter_bytes(rows));
    // grid.x: the blocks sharing a row (up to 64, each at least 4096 values); grid.y: the row, so
    // rows <= 65535. The workspace must start zeroed (every DeviceBuffer does; the kernel leaves it so).
    const dim3 grid(argmax_blocks(n), rows);
    argmax_f32<<<grid, ARGMAX_THREADS, 0, stream>>>(x, out, partials, counters, n);
    return cudaGetLastError();
}

extern "C" cudaError_t launch_greedy_advance(int* token, int* picks, int* step, int* positions, int* kv_len,
                                             int capacity, cudaStream_t stream) {
    if (capacity <= 0) return minfer_refuse("capacity must be positive");
    // One block of one thread: five scalars.
    greedy_advance<<<1, 1, 0, stream>>>(token, picks, step, positions, kv_len, capacity);
    return cudaGetLastError();
}
