// Attention over the KV cache, and the store that fills the cache.
//
// Layouts (float32, contiguous):
//     q, out             [n_tokens][n_heads * head_dim]     (q after RoPE)
//     k_cache, v_cache   [n_ctx][n_kv_heads * head_dim]     one pair per layer, alive for the whole session
// Query head h reads KV head h / (n_heads / n_kv_heads) (grouped-query attention). The query at
// position p attends to cache rows 0 .. p (causal by position) with scores q.k / sqrt(head_dim) and a
// float32 softmax that subtracts the maximum score.
//
// The softmax is computed online, in one pass over the rows: a running maximum m, denominator
// l = sum_j exp(s_j - m) and accumulator a = sum_j exp(s_j - m) v_j are rescaled by exp(m_old - m_new)
// whenever the maximum grows, and out = a / l at the end. Two such states over disjoint sets of rows
// merge by the same rescaling, which is what lets decode split a long cache over many blocks
// (flash-decoding); the last block to finish merges the pieces.
//
// Inside a warp, head dimension d lives in lane d % 32, slot d / 32: head_dim / 32 slots, at most 8, so
// head_dim is a multiple of 32 and at most 256. A row of K or V is then head_dim / 32 coalesced 128-byte
// loads, and one score q.k is one warp_sum.
//
// Positions (prefill) and the KV length (decode) are read from device buffers: a captured decode graph
// stays valid while the sequence grows, the host only rewrites those integers. A position or length
// outside the cache would read or write another buffer's memory, so the kernels __trap() instead: a
// sticky error that the host's next sync() reports as latched.
#include <cmath>

#include "common.cuh"
#include "launchers.h"

namespace minfer {
namespace {

constexpr int MAX_SLOTS = 8;
constexpr int MAX_HEAD_DIM = MAX_SLOTS * WARP_SIZE;  // 256
constexpr int STORE_THREADS = 256;
constexpr int DECODE_MAX_GROUP = 16;   // query heads per KV head that decode serves (a warp each)
constexpr int DECODE_SPLIT_ROWS = 32;  // the fewest cache rows a decode split takes: one per lane
constexpr int MAX_SPLITS = 256;
constexpr int PREFILL_THREADS = 128;
constexpr int PREFILL_LANES_PER_QUERY = 8;  // lanes sharing one query: each holds head_dim / 8 dimensions
constexpr int PREFILL_QUERIES = PREFILL_THREADS / PREFILL_LANES_PER_QUERY;  // 16 queries per block
constexpr int PREFILL_TILE_FLOATS = 4096;   // floats of a K (and of a V) tile in shared memory: 16 KB each
constexpr int PREFILL_CHUNK = 16;           // rows scored between two softmax updates

// K and V rows are written at their positions; rows other tokens wrote earlier stay as they are.
__global__ void kv_store_f32(const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ k_cache,
                             float* __restrict__ v_cache, const int* __restrict__ positions, int kv_dim, int n_ctx) {
    const int token = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= kv_dim) return;
    const int position = positions[token];
    if (position < 0 || position >= n_ctx) __trap();
    const std::size_t from = std::size_t(token) * kv_dim + i;
    const std::size_t to = std::size_t(position) * kv_dim + i;
    k_cache[to] = k[from];
    v_cache[to] = v[from];
}

__device__ __forceinline__ float warp_max(float value) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(FULL_WARP, value, offset));
    return value;
}

// The decode workspace: one counter per KV head (the splits of that head that are done), then the
// partial states partials[head][split] = {max, denominator, acc[head_dim]}.
std::size_t decode_counter_bytes(int n_heads) { return (std::size_t(n_heads) * sizeof(int) + 15) / 16 * 16; }

// Decode: one query token. Block (split, kv_head) holds the group_size query heads that share KV head
// kv_head, one warp each, over one split of the cache rows 0 .. kv_len - 1 (kv_len is read here, so a
// captured graph serves every step). A split is at least 32 rows, so a short cache is one split and one
// block per KV head; a long one is cut into gridDim.x splits.
//
// A warp walks its split 32 rows at a time: lane r scores row r (the whole q.k over head_dim, reading the
// row's K with float4 loads against q in shared memory), the warp takes the batch's maximum and the
// weights exp2(score - max), then every lane adds the 32 weighted V rows for its dimensions (lane l holds
// dimension l, l + 32, ...). All 32 rows' loads of a batch are independent, so they are in flight
// together; the warps of a block read the same K and V rows, which the first one brings into L1.
//
// With one split the block writes the output. With several, each writes its partial state; the last
// block of a KV head to finish (a counter in the workspace, reset by that block for the next launch)
// merges them: the workspace must start zeroed, as every DeviceBuffer does.
template <int HEAD_DIM>
__global__ void __launch_bounds__(DECODE_MAX_GROUP * WARP_SIZE)
    attention_decode(const float* __restrict__ q, const float* __restrict__ k_cache, const float* __restrict__ v_cache,
                     float* __restrict__ out, const int* __restrict__ kv_len_ptr, int* __restrict__ counters,
                     float* __restrict__ partials, int kv_dim, int n_ctx, float score_scale) {
    constexpr int head_dim = HEAD_DIM;
    constexpr int n_slots = HEAD_DIM / WARP_SIZE;  // dimensions per lane
    // Loads a lane keeps in flight (~64 registers): K in float4 chunks of its row (a whole 64-wide row),
    // V in rows of its dimensions (all 32 rows of a batch at head_dim 64); the merge likewise in splits.
    constexpr int K_LOADS = HEAD_DIM / 4 < 16 ? HEAD_DIM / 4 : 16;
    constexpr int V_ROWS = 64 / n_slots < 4 ? 4 : (64 / n_slots > 32 ? 32 : 64 / n_slots);
    const int split = blockIdx.x;
    const int n_splits = gridDim.x;
    const int kv_head = blockIdx.y;
    const int group_size = blockDim.x / WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    const int head = kv_head * group_size + warp;

    // The host writes kv_len before the step; no kernel does, so it may be read before the wait.
    const int kv_len = *kv_len_ptr;
    if (kv_len < 1 || kv_len > n_ctx) __trap();
    const int rows_per_split = max(DECODE_SPLIT_ROWS, ceil_div(kv_len, n_splits));
    const int n_active = ceil_div(kv_len, rows_per_split);
    if (split >= n_active) return;  // a short cache leaves most splits empty
    const int first = split * rows_per_split;
    const int end = min(kv_len, first + rows_per_split);
    const std::size_t head_offset = std::size_t(kv_head) * head_dim;

    // The cache rows before the newest do not depend on the previous kernel: fetch them into L2 meanwhile.
    constexpr int lines_per_row = HEAD_DIM * int(sizeof(float)) / 128;
    for (int i = threadIdx.x; i < (end - first) * lines_per_row; i += blockDim.x) {
        const std::size_t at = std::size_t(first + i / lines_per_row) * kv_dim + head_offset + (i % lines_per_row) * 32;
        prefetch_l2(k_cache + at);
        prefetch_l2(v_cache + at);
    }
    wait_for_previous_kernel();
    allow_next_kernel();

    __shared__ __align__(16) float q_scaled[DECODE_MAX_GROUP][MAX_HEAD_DIM];
    for (int d = lane; d < head_dim; d += WARP_SIZE) q_scaled[warp][d] = q[std::size_t(head) * head_dim + d] * score_scale;
    __syncwarp();
    const float4* q4 = reinterpret_cast<const float4*>(q_scaled[warp]);

    float max_score = -INFINITY, denominator = 0.0f, acc[n_slots] = {};
    for (int base = first; base < end; base += WARP_SIZE) {
        // Lanes past the end score a valid row (the last) and then drop it: no lane reads outside the split.
        const float4* k = reinterpret_cast<const float4*>(k_cache + std::size_t(min(base + lane, end - 1)) * kv_dim +
                                                          head_offset);
        float score = 0.0f;
        // Loads first, products after, K_LOADS float4 at a time: the loads of a batch are in flight together.
#pragma unroll
        for (int c0 = 0; c0 < HEAD_DIM / 4; c0 += K_LOADS) {
            float4 kc[K_LOADS];
#pragma unroll
            for (int c = 0; c < K_LOADS; ++c) kc[c] = k[c0 + c];
#pragma unroll
            for (int c = 0; c < K_LOADS; ++c) {
                const float4 qc = q4[c0 + c];
                score += (kc[c].x * qc.x + kc[c].y * qc.y) + (kc[c].z * qc.z + kc[c].w * qc.w);
            }
        }
        if (base + lane >= end) score = -INFINITY;
        const float new_max = fmaxf(max_score, warp_max(score));  // finite: lane 0's row is always in the split
        const float weight = exp2f(score - new_max);               // 0 for the dropped rows
        const float rescale = exp2f(max_score - new_max);          // 0 on the first batch (max_score = -inf)
        denominator = denominator * rescale + warp_sum(weight);
#pragma unroll
        for (int s = 0; s < n_slots; ++s) acc[s] *= rescale;
#pragma unroll
        for (int r0 = 0; r0 < WARP_SIZE; r0 += V_ROWS) {
            float v[V_ROWS][n_slots];
#pragma unroll
            for (int r = 0; r < V_ROWS; ++r) {
                const float* row = v_cache + std::size_t(min(base + r0 + r, end - 1)) * kv_dim + head_offset;
#pragma unroll
                for (int s = 0; s < n_slots; ++s) v[r][s] = row[s * WARP_SIZE + lane];
            }
#pragma unroll
            for (int r = 0; r < V_ROWS; ++r) {
                const float w = __shfl_sync(FULL_WARP, weight, r0 + r);
#pragma unroll
                for (int s = 0; s < n_slots; ++s) acc[s] += w * v[r][s];
            }
        }
        max_score = new_max;
    }

    float* head_out = out + std::size_t(head) * head_dim;
    if (n_active == 1) {
        const float inverse = 1.0f / denominator;
#pragma unroll
        for (int s = 0; s < n_slots; ++s) head_out[s * WARP_SIZE + lane] = acc[s] * inverse;
        return;
    }

    const int stride = head_dim + 2;
    float* head_partials = partials + std::size_t(head) * n_splits * stride;
    float* partial = head_partials + std::size_t(split) * stride;
#pragma unroll
    for (int s = 0; s < n_slots; ++s) partial[2 + s * WARP_SIZE + lane] = acc[s];
    if (lane == 0) {
        partial[0] = max_score;
        partial[1] = denominator;
    }

    // Publish the partials, then count this split done; the block that completes the count merges.
    __shared__ bool merges;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        merges = atomicAdd(&counters[kv_head], 1) == n_active - 1;
        if (merges) atomicExch(&counters[kv_head], 0);  // ready for the next launch
    }
    __syncthreads();
    if (!merges) return;
    __threadfence();

    // __ldcg reads through L2, where the other blocks' partials are (never a stale line of this SM's L1).
    __shared__ float split_weight[DECODE_MAX_GROUP][MAX_SPLITS];
    float merged_max = -INFINITY;
    for (int s = lane; s < n_active; s += WARP_SIZE) merged_max = fmaxf(merged_max, __ldcg(head_partials + s * stride));
    merged_max = warp_max(merged_max);
    float merged_denominator = 0.0f;
    for (int s = lane; s < n_active; s += WARP_SIZE) {
        const float w = exp2f(__ldcg(head_partials + s * stride) - merged_max);
        split_weight[warp][s] = w;
        merged_denominator += w * __ldcg(head_partials + s * stride + 1);
    }
    merged_denominator = warp_sum(merged_denominator);
    __syncwarp();
    float merged[n_slots] = {};
    for (int first_split = 0; first_split < n_active; first_split += V_ROWS) {
        float pieces[V_ROWS][n_slots];
#pragma unroll
        for (int i = 0; i < V_ROWS; ++i) {
            const float* piece = head_partials + std::size_t(min(first_split + i, n_active - 1)) * stride + 2;
#pragma unroll
            for (int s = 0; s < n_slots; ++s) pieces[i][s] = __ldcg(piece + s * WARP_SIZE + lane);
        }
#pragma unroll
        for (int i = 0; i < V_ROWS; ++i) {
            const float w = first_split + i < n_active ? split_weight[warp][first_split + i] : 0.0f;
#pragma unroll
            for (int s = 0; s < n_slots; ++s) merged[s] += w * pieces[i][s];
        }
    }
    const float inverse = 1.0f / merged_denominator;
#pragma unroll
    for (int s = 0; s < n_slots; ++s) head_out[s * WARP_SIZE + lane] = merged[s] * inverse;
}

// Prefill: a block takes 16 consecutive queries of one head and walks the cache rows they can see in
// tiles: the block loads a tile of K and V rows into shared memory once, and all 16 queries read it from
// there (the rows of a causal prompt are read once per 16 queries instead of once per query).
//
// Each query belongs to 8 consecutive lanes; lane s holds the float4 chunks s, s + 8, ... of the head (so
// the 8 lanes read one row's 128 bytes of shared memory together, without bank conflicts). A score is
// 8 partial dot products summed by 3 shuffles. Rows are scored 16 at a time, then the online softmax
// rescales once per 16 rows rather than once per row. Scores are kept in log2 units (q is multiplied by
// scale * log2(e) once), so the weights are exp2f(score - max).
//
// A query at position p sees rows 0 .. p; a block reads rows up to the largest position among its queries,
// and the rows past a query's own position get the score -inf (weight 0). The block's row loop and the
// chunk loop are the same for every thread, so the shuffles always find their whole warp.
template <int HEAD_DIM>
__global__ void __launch_bounds__(PREFILL_THREADS)
    attention_prefill_tiled(const float* __restrict__ q, const float* __restrict__ k_cache,
                            const float* __restrict__ v_cache, float* __restrict__ out,
                            const int* __restrict__ positions, int n_tokens, int n_heads, int group_size, int kv_dim,
                            int n_ctx, float score_scale) {
    constexpr int CHUNKS_PER_LANE = HEAD_DIM / (4 * PREFILL_LANES_PER_QUERY);  // float4 chunks each lane holds
    constexpr int ROW_CHUNKS = HEAD_DIM / 4;                                   // float4 chunks of one row
    constexpr int TILE_ROWS = PREFILL_TILE_FLOATS / HEAD_DIM / PREFILL_CHUNK * PREFILL_CHUNK;
    static_assert(TILE_ROWS >= PREFILL_CHUNK, "a tile holds at least one chunk of rows");
    __shared__ __align__(16) float4 k_tile[TILE_ROWS * ROW_CHUNKS];
    __shared__ __align__(16) float4 v_tile[TILE_ROWS * ROW_CHUNKS];
    __shared__ int block_rows;

    const int head = blockIdx.x;
    const int query_tile = gridDim.y - 1 - blockIdx.y;  // the last queries, which see the most rows, start first
    const int slice = threadIdx.x % PREFILL_LANES_PER_QUERY;
    const int token = query_tile * PREFILL_QUERIES + threadIdx.x / PREFILL_LANES_PER_QUERY;
    const bool active = token < n_tokens;  // the last tile's extra queries go along, see nothing, write nothing
    const int position = active ? positions[token] : -1;
    if (active && (position < 0 || position >= n_ctx)) __trap();

    if (threadIdx.x == 0) block_rows = 0;
    __syncthreads();
    if (active && slice == 0) atomicMax(&block_rows, position + 1);
    __syncthreads();
    const int rows = block_rows;

    const std::size_t row_offset = (std::size_t(token) * n_heads + head) * HEAD_DIM;
    float4 q_chunks[CHUNKS_PER_LANE];
    float4 acc[CHUNKS_PER_LANE];
#pragma unroll
    for (int c = 0; c < CHUNKS_PER_LANE; ++c) {
        const int chunk = c * PREFILL_LANES_PER_QUERY + slice;
        const float4 value = active ? reinterpret_cast<const float4*>(q + row_offset)[chunk]
                                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        q_chunks[c] = make_float4(value.x * score_scale, value.y * score_scale, value.z * score_scale,
                                  value.w * score_scale);
        acc[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float max_score = -INFINITY;
    float denominator = 0.0f;

    const std::size_t kv_offset = std::size_t(head / group_size) * HEAD_DIM;
    for (int first_row = 0; first_row < rows; first_row += TILE_ROWS) {
        const int tile_rows = min(TILE_ROWS, rows - first_row);
        __syncthreads();  // every thread is done with the previous tile
        for (int i = threadIdx.x; i < TILE_ROWS * ROW_CHUNKS; i += PREFILL_THREADS) {
            const int row = i / ROW_CHUNKS;
            const std::size_t from = (first_row + row) * std::size_t(kv_dim) + kv_offset;
            const bool inside = row < tile_rows;  // rows past the block's last visible row are zeros, not read
            k_tile[i] = inside ? reinterpret_cast<const float4*>(k_cache + from)[i % ROW_CHUNKS]
                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            v_tile[i] = inside ? reinterpret_cast<const float4*>(v_cache + from)[i % ROW_CHUNKS]
                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        __syncthreads();

        for (int chunk_row = 0; chunk_row < tile_rows; chunk_row += PREFILL_CHUNK) {
            float scores[PREFILL_CHUNK];
            float chunk_max = -INFINITY;
#pragma unroll
            for (int r = 0; r < PREFILL_CHUNK; ++r) {
                const float4* k = k_tile + (chunk_row + r) * ROW_CHUNKS;
                float dot = 0.0f;
#pragma unroll
                for (int c = 0; c < CHUNKS_PER_LANE; ++c) {
                    const float4 key = k[c * PREFILL_LANES_PER_QUERY + slice];
                    dot += q_chunks[c].x * key.x + q_chunks[c].y * key.y + q_chunks[c].z * key.z +
                           q_chunks[c].w * key.w;
                }
#pragma unroll
                for (int offset = PREFILL_LANES_PER_QUERY / 2; offset > 0; offset /= 2)
                    dot += __shfl_xor_sync(FULL_WARP, dot, offset);
                scores[r] = first_row + chunk_row + r <= position ? dot : -INFINITY;
                chunk_max = fmaxf(chunk_max, scores[r]);
            }
            const float new_max = fmaxf(max_score, chunk_max);
            if (new_max == -INFINITY) continue;  // no visible row yet (only a query past n_tokens): nothing to add
            const float rescale = exp2f(max_score - new_max);  // exp2(-inf) = 0 the first time
            denominator *= rescale;
#pragma unroll
            for (int c = 0; c < CHUNKS_PER_LANE; ++c) {
                acc[c].x *= rescale;
                acc[c].y *= rescale;
                acc[c].z *= rescale;
                acc[c].w *= rescale;
            }
#pragma unroll
            for (int r = 0; r < PREFILL_CHUNK; ++r) {
                const float weight = exp2f(scores[r] - new_max);  // 0 for a row past this query's position
                denominator += weight;
                const float4* v = v_tile + (chunk_row + r) * ROW_CHUNKS;
#pragma unroll
                for (int c = 0; c < CHUNKS_PER_LANE; ++c) {
                    const float4 value = v[c * PREFILL_LANES_PER_QUERY + slice];
                    acc[c].x += weight * value.x;
                    acc[c].y += weight * value.y;
                    acc[c].z += weight * value.z;
                    acc[c].w += weight * value.w;
                }
            }
            max_score = new_max;
        }
    }

    if (!active) return;
    const float inverse = 1.0f / denominator;
#pragma unroll
    for (int c = 0; c < CHUNKS_PER_LANE; ++c)
        reinterpret_cast<float4*>(out + row_offset)[c * PREFILL_LANES_PER_QUERY + slice] =
            make_float4(acc[c].x * inverse, acc[c].y * inverse, acc[c].z * inverse, acc[c].w * inverse);
}

template <int HEAD_DIM>
cudaError_t launch_prefill(const float* q, const float* k_cache, const float* v_cache, float* out,
                           const int* positions, int n_tokens, int n_heads, int n_kv_heads, int n_ctx,
                           cudaStream_t stream) {
    constexpr float LOG2_E = 1.4426950408889634f;
    const float score_scale = LOG2_E / std::sqrt(float(HEAD_DIM));
    // grid.x: the query head; grid.y: ceil(n_tokens / 16) tiles of 16 queries (n_tokens <= 16 * 65535), run
    // last tile first. Consecutive blocks are the heads of one query tile: the heads sharing a KV head read
    // the same K/V rows at about the same time, from L2.
    const dim3 grid(n_heads, ceil_div(n_tokens, PREFILL_QUERIES));
    attention_prefill_tiled<HEAD_DIM><<<grid, PREFILL_THREADS, 0, stream>>>(
        q, k_cache, v_cache, out, positions, n_tokens, n_heads, n_heads / n_kv_heads, n_kv_heads * HEAD_DIM, n_ctx,
        score_scale);
    return cudaGetLastError();
}

// The preconditions both attention launchers share.
cudaError_t check_heads(int n_heads, int n_kv_heads, int head_dim) {
    if (head_dim % WARP_SIZE != 0 || head_dim <= 0 || head_dim > MAX_HEAD_DIM)
        return minfer_refuse("head_dim must be a multiple of 32 between 32 and 256");
    if (n_kv_heads <= 0 || n_heads <= 0 || n_heads % n_kv_heads != 0)
        return minfer_refuse("n_heads must be a positive multiple of n_kv_heads");
    return cudaSuccess;
}

}  // namespace
}  // namespace minfer

using namespace minfer;

extern "C" cudaError_t launch_kv_store_f32(const float* k, const float* v, float* k_cache, float* v_cache,
                                           const int* positions, int n_tokens, int kv_dim, int n_ctx,
                                           cudaStream_t stream) {
    // grid.x: ceil(kv_dim / 256) blocks over a row's values, one thread per value (it copies the K and
    // the V value); grid.y: the token, so n_tokens <= 65535.
    const dim3 grid(ceil_div(kv_dim, STORE_THREADS), n_tokens);
    kv_store_f32<<<grid, STORE_THREADS, 0, stream>>>(k, v, k_cache, v_cache, positions, kv_dim, n_ctx);
    return cudaGetLastError();
}

extern "C" std::size_t attention_decode_workspace_bytes(int n_heads, int head_dim, int n_splits) {
    return decode_counter_bytes(n_heads) + std::size_t(n_heads) * n_splits * (head_dim + 2) * sizeof(float);
}

extern "C" cudaError_t launch_attention_decode_f32(const float* q, const float* k_cache, const float* v_cache,
                                                   float* out, const int* kv_len, float* workspace, int n_heads,
                                                   int n_kv_heads, int head_dim, int n_ctx, int n_splits,
                                                   cudaStream_t stream) {
    if (const cudaError_t refused = check_heads(n_heads, n_kv_heads, head_dim); refused != cudaSuccess) return refused;
    if (n_splits < 1 || n_splits > MAX_SPLITS) return minfer_refuse("n_splits must be between 1 and 256");
    if (n_heads / n_kv_heads > DECODE_MAX_GROUP) return minfer_refuse("n_heads / n_kv_heads must be at most 16");
    if (!is_aligned(k_cache, 16) || !is_aligned(v_cache, 16) || !is_aligned(workspace, 16))
        return minfer_refuse("k_cache, v_cache and workspace must be 16-byte aligned (float4 loads)");
    constexpr float LOG2_E = 1.4426950408889634f;
    const float score_scale = LOG2_E / std::sqrt(float(head_dim));  // scores in log2 units: exp2f weights
    int* counters = reinterpret_cast<int*>(workspace);
    float* partials = reinterpret_cast<float*>(reinterpret_cast<char*>(workspace) + decode_counter_bytes(n_heads));
    // grid.x: the split of the cache rows (fixed here, so a captured graph is valid for every kv_len; the
    // splits a short cache does not need return at once); grid.y: the KV head. Block: one warp per query
    // head of that KV head.
    const dim3 grid(n_splits, n_kv_heads);
    const dim3 block(n_heads / n_kv_heads * WARP_SIZE);
    const int kv_dim = n_kv_heads * head_dim;
    // One kernel per head size, so a lane's dimensions and a row's float4 loads are compile-time counts.
    decltype(&attention_decode<32>) kernel = nullptr;
    switch (head_dim) {
        case 32: kernel = attention_decode<32>; break;
        case 64: kernel = attention_decode<64>; break;
        case 96: kernel = attention_decode<96>; break;
        case 128: kernel = attention_decode<128>; break;
        case 160: kernel = attention_decode<160>; break;
        case 192: kernel = attention_decode<192>; break;
        case 224: kernel = attention_decode<224>; break;
        default: kernel = attention_decode<256>; break;
    }
    return launch_overlapped(kernel, grid, block, 0, stream, q, k_cache, v_cache, out, kv_len, counters, partials,
                             kv_dim, n_ctx, score_scale);
}

extern "C" cudaError_t launch_attention_prefill_f32(const float* q, const float* k_cache, const float* v_cache,
                                                    float* out, const int* positions, int n_tokens, int n_heads,
                                                    int n_kv_heads, int head_dim, int n_ctx, cudaStream_t stream) {
    if (const cudaError_t refused = check_heads(n_heads, n_kv_heads, head_dim); refused != cudaSuccess) return refused;
    if (n_tokens <= 0) return minfer_refuse("n_tokens must be positive");
    if (!is_aligned(q, 16) || !is_aligned(k_cache, 16) || !is_aligned(v_cache, 16) || !is_aligned(out, 16))
        return minfer_refuse("q, k_cache, v_cache and out must be 16-byte aligned (float4 loads)");
    // One kernel per head size, so each lane's share of a row (head_dim / 8 values) sits in registers.
    decltype(&launch_prefill<32>) launch = nullptr;
    switch (head_dim) {
        case 32: launch = launch_prefill<32>; break;
        case 64: launch = launch_prefill<64>; break;
        case 96: launch = launch_prefill<96>; break;
        case 128: launch = launch_prefill<128>; break;
        case 160: launch = launch_prefill<160>; break;
        case 192: launch = launch_prefill<192>; break;
        case 224: launch = launch_prefill<224>; break;
        default: launch = launch_prefill<256>; break;
    }
    return launch(q, k_cache, v_cache, out, positions, n_tokens, n_heads, n_kv_heads, n_ctx, stream);
}
