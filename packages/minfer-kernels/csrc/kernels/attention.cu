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
// (flash-decoding) and merge the pieces in a second kernel.
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
constexpr int DECODE_WARPS = 4;    // warps sharing one split of the cache
constexpr int COMBINE_THREADS = 128;
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

// One warp's softmax state over the rows it has read so far; acc holds this lane's slots.
struct OnlineSoftmax {
    float max_score = -INFINITY;
    float denominator = 0.0f;
    float acc[MAX_SLOTS] = {};
};

// This lane's slots of the query row, multiplied by the score scale once here rather than per row.
__device__ __forceinline__ void load_query(const float* q_head, int n_slots, float scale, float (&q_slots)[MAX_SLOTS]) {
    const int lane = threadIdx.x % WARP_SIZE;
#pragma unroll
    for (int s = 0; s < MAX_SLOTS; ++s) q_slots[s] = s < n_slots ? q_head[s * WARP_SIZE + lane] * scale : 0.0f;
}

// One warp folds cache rows first, first + step, ... (below end) into `state`. k_head and v_head point
// at the KV head's first dimension in row 0; rows are kv_dim floats apart. The loop bounds are the same
// for every lane, so the warp stays converged for warp_sum.
__device__ __forceinline__ void attend_rows(OnlineSoftmax& state, const float (&q_slots)[MAX_SLOTS], const float* k_head,
                                            const float* v_head, int kv_dim, int n_slots, int first, int end,
                                            int step) {
    const int lane = threadIdx.x % WARP_SIZE;
    for (int row = first; row < end; row += step) {
        const float* k = k_head + std::size_t(row) * kv_dim;
        const float* v = v_head + std::size_t(row) * kv_dim;
        float dot = 0.0f;
#pragma unroll
        for (int s = 0; s < MAX_SLOTS; ++s)
            if (s < n_slots) dot += q_slots[s] * k[s * WARP_SIZE + lane];
        const float score = warp_sum(dot);
        const float new_max = fmaxf(state.max_score, score);
        const float rescale = expf(state.max_score - new_max);  // exp(-inf) = 0 on the first row
        const float weight = expf(score - new_max);
        state.denominator = state.denominator * rescale + weight;
#pragma unroll
        for (int s = 0; s < MAX_SLOTS; ++s)
            if (s < n_slots) state.acc[s] = state.acc[s] * rescale + weight * v[s * WARP_SIZE + lane];
        state.max_score = new_max;
    }
}

// The weight of a partial state with maximum `max_score` once merged under the maximum `merged_max`;
// a state that saw no rows (maximum -inf) weighs nothing.
__device__ __forceinline__ float merge_weight(float max_score, float merged_max) {
    return max_score == -INFINITY ? 0.0f : expf(max_score - merged_max);
}

// Decode, step 1: the softmax state of one query head over one split of the cache rows 0 .. kv_len - 1.
// The rows are cut into gridDim.x contiguous splits at run time (kv_len is read here, not passed), the
// block's 4 warps interleave over its split's rows, and the warps' states merge through shared memory.
// Writes partials[head][split] = {max, denominator, acc[head_dim]}.
__global__ void __launch_bounds__(DECODE_WARPS * WARP_SIZE)
    attention_decode_split(const float* __restrict__ q, const float* __restrict__ k_cache,
                           const float* __restrict__ v_cache, float* __restrict__ partials,
                           const int* __restrict__ kv_len_ptr, int group_size, int head_dim, int kv_dim, int n_ctx,
                           float scale) {
    const int split = blockIdx.x;
    const int n_splits = gridDim.x;
    const int head = blockIdx.y;
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    const int n_slots = head_dim / WARP_SIZE;

    const int kv_len = *kv_len_ptr;
    if (kv_len < 1 || kv_len > n_ctx) __trap();
    const int rows_per_split = ceil_div(kv_len, n_splits);
    const int first = split * rows_per_split;
    const int end = min(kv_len, first + rows_per_split);  // first >= end: an empty split (short caches)

    float q_slots[MAX_SLOTS];
    load_query(q + std::size_t(head) * head_dim, n_slots, scale, q_slots);
    const int kv_offset = (head / group_size) * head_dim;
    OnlineSoftmax state;
    attend_rows(state, q_slots, k_cache + kv_offset, v_cache + kv_offset, kv_dim, n_slots, first + warp, end,
                DECODE_WARPS);

    __shared__ float warp_max[DECODE_WARPS];
    __shared__ float warp_denominator[DECODE_WARPS];
    __shared__ float warp_acc[DECODE_WARPS][MAX_HEAD_DIM];
    if (lane == 0) {
        warp_max[warp] = state.max_score;
        warp_denominator[warp] = state.denominator;
    }
#pragma unroll
    for (int s = 0; s < MAX_SLOTS; ++s)
        if (s < n_slots) warp_acc[warp][s * WARP_SIZE + lane] = state.acc[s];
    __syncthreads();

    float block_max = -INFINITY;
    for (int w = 0; w < DECODE_WARPS; ++w) block_max = fmaxf(block_max, warp_max[w]);
    float weights[DECODE_WARPS];
    for (int w = 0; w < DECODE_WARPS; ++w) weights[w] = merge_weight(warp_max[w], block_max);

    float* partial = partials + (std::size_t(head) * n_splits + split) * (head_dim + 2);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int w = 0; w < DECODE_WARPS; ++w) acc += weights[w] * warp_acc[w][d];
        partial[2 + d] = acc;
    }
    if (threadIdx.x == 0) {
        float denominator = 0.0f;
        for (int w = 0; w < DECODE_WARPS; ++w) denominator += weights[w] * warp_denominator[w];
        partial[0] = block_max;
        partial[1] = denominator;
    }
}

// Decode, step 2: merge one head's split states into its output row.
__global__ void __launch_bounds__(COMBINE_THREADS)
    attention_decode_combine(const float* __restrict__ partials, float* __restrict__ out, int n_splits,
                             int head_dim) {
    const int head = blockIdx.x;
    const int stride = head_dim + 2;
    const float* head_partials = partials + std::size_t(head) * n_splits * stride;

    float merged_max = -INFINITY;
    for (int s = 0; s < n_splits; ++s) merged_max = fmaxf(merged_max, head_partials[s * stride]);
    __shared__ float split_weight[MAX_SPLITS];
    for (int s = threadIdx.x; s < n_splits; s += blockDim.x)
        split_weight[s] = merge_weight(head_partials[s * stride], merged_max);
    __syncthreads();

    float denominator = 0.0f;
    for (int s = 0; s < n_splits; ++s) denominator += split_weight[s] * head_partials[s * stride + 1];
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float numerator = 0.0f;
        for (int s = 0; s < n_splits; ++s) numerator += split_weight[s] * head_partials[s * stride + 2 + d];
        out[std::size_t(head) * head_dim + d] = numerator / denominator;
    }
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
    return std::size_t(n_heads) * n_splits * (head_dim + 2) * sizeof(float);
}

extern "C" cudaError_t launch_attention_decode_f32(const float* q, const float* k_cache, const float* v_cache,
                                                   float* out, const int* kv_len, float* workspace, int n_heads,
                                                   int n_kv_heads, int head_dim, int n_ctx, int n_splits,
                                                   cudaStream_t stream) {
    if (const cudaError_t refused = check_heads(n_heads, n_kv_heads, head_dim); refused != cudaSuccess) return refused;
    if (n_splits < 1 || n_splits > MAX_SPLITS) return minfer_refuse("n_splits must be between 1 and 256");
    const float scale = 1.0f / std::sqrt(float(head_dim));
    // grid.x: the split of the cache rows (fixed here, so a captured graph is valid for every kv_len);
    // grid.y: the query head. 4 warps per block interleave over the split's rows.
    const dim3 split_grid(n_splits, n_heads);
    attention_decode_split<<<split_grid, DECODE_WARPS * WARP_SIZE, 0, stream>>>(
        q, k_cache, v_cache, workspace, kv_len, n_heads / n_kv_heads, head_dim, n_kv_heads * head_dim, n_ctx, scale);
    if (const cudaError_t launched = cudaGetLastError(); launched != cudaSuccess) return launched;
    // grid.x: the query head; 128 threads stride over its head_dim outputs.
    attention_decode_combine<<<n_heads, COMBINE_THREADS, 0, stream>>>(workspace, out, n_splits, head_dim);
    return cudaGetLastError();
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
