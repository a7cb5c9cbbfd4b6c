// Attention over the KV cache, and the store that fills the cache.
//
// Layouts (contiguous; q and out float32, the caches float32 or f16: kv_cache.cuh):
//     q, out             [n_tokens][n_heads * head_dim]     (q after RoPE; decode may norm and rotate it itself)
//     k_cache, v_cache   [n_ctx][n_kv_heads * head_dim]     one pair per layer, alive for the whole session
// Query head h reads KV head h / (n_heads / n_kv_heads) (grouped-query attention). The query at
// position p attends to cache rows 0 .. p (causal by position) with scores scale * q.k (the model's scale:
// 1/sqrt(head_dim) for most) and a float32 softmax that subtracts the maximum score. With a sliding window
// w > 0 it sees only the last w of them, rows p - w + 1 .. p (llama.cpp's and transformers' rule: a row
// is masked once p - row >= w); w = 0 is no window.
//
// The softmax is computed online, in one pass over the rows: a running maximum m, denominator
// l = sum_j exp(s_j - m) and accumulator a = sum_j exp(s_j - m) v_j are rescaled by exp(m_old - m_new)
// whenever the maximum grows, and out = a / l at the end. Two such states over disjoint sets of rows
// merge by the same rescaling, which is what lets decode split a long cache over many blocks
// (flash-decoding); the last block to finish merges the pieces.
//
// The float32 kernels score a row with 8 lanes, each holding head_dim / 32 float4 chunks of it, so head_dim is
// a multiple of 32 and at most 256: the 8 lanes read a row's 128-byte lines together, and a score is their
// partial dot products summed by 3 shuffles. Prefill of head sizes 64 and 128 on sm_80+ runs on the tensor
// cores instead (attention_prefill_tensor_cores: f16 operands, float32 sums; the choice is made in
// launch_attention_prefill_f32).
//
// Positions (prefill) and the KV length (decode) are read from device buffers: a captured decode graph
// stays valid while the sequence grows, the host only rewrites those integers. A position or length
// outside the cache would read or write another buffer's memory, so the kernels __trap() instead: a
// sticky error that the host's next sync() reports as latched.
//
// For the families that RMS-norm every head of q and k before RoPE (Qwen3, Gemma 3), decode does that itself
// (attention_decode's HEAD_NORM): the QKV projection stores q and k raw, and a separate kernel between them
// would be one more launch a layer, on the decode step's critical path, for a few KB of work.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "common.cuh"
#include "kv_cache.cuh"
#include "launchers.h"
#include "mma.cuh"
#include "rope.cuh"

namespace minfer {
namespace {

constexpr int MAX_HEAD_DIM = 256;
constexpr int STORE_THREADS = 256;
constexpr int DECODE_THREADS = 256;
constexpr int DECODE_WARPS = DECODE_THREADS / WARP_SIZE;
constexpr int DECODE_LANES_PER_ROW = 8;                                      // lanes scoring one cache row
constexpr int DECODE_ROWS_PER_STEP = DECODE_THREADS / DECODE_LANES_PER_ROW;  // 32 rows scored at once
constexpr int DECODE_MAX_GROUP = 16;    // query heads per KV head that decode serves (an accumulator each)
constexpr int DECODE_HEAD_BATCH = 4;    // heads a V pass accumulates at once (their weight loads together)
constexpr int DECODE_REDUCE_HEADS = 4;  // heads per pass of the end-of-split reduction (16 KB of shared memory)
constexpr int DECODE_MERGE_BATCH = 16;  // partial states a merging thread loads at once
constexpr int MAX_SPLITS = 256;
constexpr int PREFILL_THREADS = 128;
constexpr int PREFILL_LANES_PER_QUERY = 8;  // lanes sharing one query: each holds head_dim / 8 dimensions
constexpr int PREFILL_QUERIES = PREFILL_THREADS / PREFILL_LANES_PER_QUERY;  // 16 queries per block
constexpr int PREFILL_TILE_FLOATS = 4096;   // floats of a K (and of a V) tile in shared memory: 16 KB each
constexpr int PREFILL_CHUNK = 16;           // rows scored between two softmax updates
constexpr int MMA_PREFILL_WARPS = 4;
constexpr int MMA_PREFILL_THREADS = MMA_PREFILL_WARPS * WARP_SIZE;
constexpr int MMA_WARP_QUERIES = 16;  // one warp's queries: the 16 rows of its m16 fragments
constexpr int MMA_PREFILL_QUERIES = MMA_PREFILL_WARPS * MMA_WARP_QUERIES;  // 64 queries per block
// A prefill split over the cache (prefill_splits): slices of whole 64-row steps, at least MIN_SPLIT_ROWS rows,
// at most MAX_PREFILL_SPLITS of them. A slice's block pays a pipeline fill (its first tile's loads, with no
// products to hide them, and q's) and a store of its 64 queries' partial state, head_dim + 2 floats per query,
// which the merge reads back: for 256 rows of head 64 that is 128 KB of float32 K and V read against 16.9 KB of
// state written and read again, and a fill of one tile in four; shorter slices would pay more of both than
// their extra blocks gain. At most 16: one query tile per head (a chat turn of up to 64 tokens) on 14 heads
// after 4096 cached rows then makes 224 blocks of 256 rows, and the merge's serial loop over the slices of an
// output stays short. (The slots / tiles rule keeps a split launch's workspace within 64 queries x (head_dim
// + 2) floats per block slot, whatever the cap: 6.7 MB on an H200 at head 64.)
constexpr int SPLIT_ALIGN_ROWS = 64;
constexpr int MIN_SPLIT_ROWS = 256;
constexpr int MAX_PREFILL_SPLITS = 16;
constexpr float LOG2_E = 1.4426950408889634f;

// K and V rows are written at their positions, in the cache's type T (kv_cache.cuh); rows other tokens wrote earlier
// stay as they are.
template <typename T>
__global__ void kv_store_f32(const float* __restrict__ k, const float* __restrict__ v, T* __restrict__ k_cache,
                             T* __restrict__ v_cache, const int* __restrict__ positions, int kv_dim, int n_ctx) {
    const int token = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= kv_dim) return;
    const int position = positions[token];
    if (position < 0 || position >= n_ctx) __trap();
    const std::size_t from = std::size_t(token) * kv_dim + i;
    const std::size_t to = std::size_t(position) * kv_dim + i;
    store_cache(k_cache + to, k[from]);
    store_cache(v_cache + to, v[from]);
}

__device__ __forceinline__ float warp_max(float value) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(FULL_WARP, value, offset));
    return value;
}

// The decode workspace: one counter per KV head (the splits of that head that are done), then each
// split's partial state: the accumulators acc[head][split][head_dim] (16-byte aligned, for float4 stores),
// then the statistics stats[head][split] = {max, denominator}.
std::size_t decode_counter_bytes(int n_heads) { return (std::size_t(n_heads) * sizeof(int) + 15) / 16 * 16; }

// The shape of decode's work on one tile of cache rows, per head size. Scoring: 8 lanes share a row, lane
// `slice` holding its float4 chunks slice, slice + 8, ...; so a step of the block's 256 threads scores 32
// rows, and a tile is 1 to 4 steps (4 float4 of K per thread below head_dim 128). Accumulating V: thread
// t holds float4 chunk t % ROW_CHUNKS of the rows t / ROW_CHUNKS, + ROW_GROUPS, ... of the tile.
template <int HEAD_DIM>
struct DecodeTile {
    static constexpr int ROW_CHUNKS = HEAD_DIM / 4;                              // float4 chunks of a row
    static constexpr int LANE_CHUNKS = ROW_CHUNKS / DECODE_LANES_PER_ROW;       // K chunks a lane scores a row
    static constexpr int STEPS = HEAD_DIM < 128 ? 128 / HEAD_DIM : 1;           // 32-row steps of a tile
    static constexpr int ROWS = STEPS * DECODE_ROWS_PER_STEP;                    // rows of a tile
    static constexpr int ROW_GROUPS = DECODE_THREADS / ROW_CHUNKS;              // threads sharing a V chunk
    static constexpr int V_ROWS = (ROWS + ROW_GROUPS - 1) / ROW_GROUPS;         // V rows a thread holds a tile
    static constexpr bool V_ROWS_EXACT = ROWS % ROW_GROUPS == 0;                // every thread's V rows inside
    // Query heads scored at once: as many as 32 q values a lane allow (8 at head 32, 4 at 64, 2 at 128, 1 from
    // 160), so that their q loads, dots and shuffles are independent instructions the warp interleaves.
    static constexpr int SCORE_HEADS = LANE_CHUNKS * 4 >= 32 ? 1 : 32 / (LANE_CHUNKS * 4);
    static_assert(DECODE_MAX_GROUP % SCORE_HEADS == 0, "a score batch stays inside q_scaled and weights");
};
static_assert(DECODE_MAX_GROUP % DECODE_HEAD_BATCH == 0, "a V batch stays inside acc, rescale and weights");

// What decode needs to norm and rotate q and the newest k row itself (attention_decode's HEAD_NORM): the
// weights of q's and k's per-head norms (head_dim each), their epsilon, and the rotation (rope.cuh).
struct DecodeHeadNorm {
    const float* q_norm;
    const float* k_norm;
    float eps;
    int n_rot;
    const double* inv_freq;  // [n_rot / 2] pair frequencies
    float mscale;
    int mode;
};

// A HEAD_NORM block's table for its step, filled before it waits for the previous kernel (none of it depends on
// that kernel): the norm weights, and each rotated pair's angle at the query's position (rope_angle's: the
// angles stay bit for bit rope_f32's). The norm and rotation after the wait then read only shared memory
// besides the head itself.
template <int HEAD_DIM>
struct DecodeHeadNormTable {
    float q_weight[HEAD_DIM];
    float k_weight[HEAD_DIM];       // loaded only by the block that norms the newest k row (zeros elsewhere)
    RopeAngle angle[HEAD_DIM / 2];  // pairs p < n_rot / 2, at position kv_len - 1
};

// The table lives in a function's static shared memory, so that only the HEAD_NORM instantiations, which call
// this, have it: the others' shared memory, and so their code, stay as they were.
template <int HEAD_DIM>
__device__ __forceinline__ DecodeHeadNormTable<HEAD_DIM>& decode_head_norm_table() {
    __shared__ DecodeHeadNormTable<HEAD_DIM> table;
    return table;
}

// Phase marks of decode attention, for bench/decode_attention_phases.cu: that tool compiles this file with
// MINFER_DECODE_PHASES defined and a decode_phase(DecodePhase) of its own, which stamps the SM's clock at each mark
// (thread 0 of the block: after a barrier, the slowest warp's time). Everywhere else the marks compile to nothing.
#ifdef MINFER_DECODE_PHASES
#define DECODE_PHASE(mark) decode_phase(DecodePhase::mark)
#else
#define DECODE_PHASE(mark) ((void)0)
#endif

// Decode: one query token. Block (split, kv_head) serves the group_size query heads that share KV head
// kv_head (or a part of them, where a short cache leaves blocks over: head_parts below), over one split of the
// cache rows it sees, 0 .. kv_len - 1 or the window's last rows of them
// (kv_len is read here, so a captured graph serves every step). A split is at least a tile (DecodeTile::ROWS), so
// a cache of a tile or less is one split and one block per KV head, and a long one is cut into up to gridDim.x
// splits of whole tiles but the last. At tg128's depths a block then walks one whole tile where two or more
// blocks took part of one each and merged them: tg128 +2-4% at head 64 (Qwen2.5-0.5B, Llama-3.2-1B, SmolLM2), level
// at depth 2048 (docs/PERFORMANCE.md, session 39).
//
// The block walks its split a tile at a time. Every K and V load of a tile is issued first (one memory
// round trip per tile; the first tile's overlaps staging q in shared memory, except under HEAD_NORM, below,
// which stages q before the loop). Each K row is read once and scored against every query head of the group
// (q from shared memory, DecodeTile::SCORE_HEADS heads at once); the scores go to shared memory, a warp per head
// takes the tile's maximum and turns them into weights exp2(score - max) with the online-softmax rescaling; then
// each thread adds its V rows, weighted, into one float4 accumulator per head (DECODE_HEAD_BATCH heads at once).
// Scoring one head after another, each head's q loads and shuffles waited for the last head's, ~120-130 cycles
// a head (docs/PERFORMANCE.md, row 85). At the end the threads holding the same chunk sum their
// accumulators through shared memory.
//
// With one split the block writes the output. With several, each writes its partial state; the last
// block of a KV head to finish (a counter in the workspace, reset by that block for the next launch)
// merges them: the workspace must start zeroed, as every DeviceBuffer does.
//
// HEAD_NORM (Qwen3, Gemma 3; head_norm's pointers are then set): q and the newest cache row, kv_len - 1, were
// stored raw by the QKV projection; this launch norms and rotates both (rope.cuh: head_norm_rope) at the
// query's position kv_len - 1, keeping what follows the wait for the previous kernel as short as the separate
// norm kernel's it replaces. Before the wait, the block fills its DecodeHeadNormTable (weights, angles). After
// it, one phase: a warp a head, the warps load the group's q heads raw from global memory, norm, rotate and
// scale them into q_scaled (q in global memory stays raw); meanwhile, in the block whose split holds the newest
// row, the last warp (the one with the fewest q heads, often none) norms and rotates the KV head's part of that
// row in place. The newest row lies in the last active split alone (the splits cut visible_from .. kv_len - 1
// in order, and a tile never reads past its split's end), so only that block reads it, and only after a
// __syncthreads() that follows the in-place write: this step and every later one read it normed, as if a
// kernel before had done it. The other KV heads' blocks write other parts of the row (kv_head * HEAD_DIM on).
// The other blocks need no barrier there: q_scaled is read only after the first tile's barrier, and their warps
// with no q head issue their first tile's loads meanwhile. Without HEAD_NORM none of this is compiled: the
// instantiations the other families run are unchanged.
// In an f16 cache (T = __half) the raw row was rounded as the projection stored it and the normed one is rounded
// again here: two roundings where the CPU backend, which norms before it stores, has one (a raw value past
// 65504 would also become infinite before its norm: session 35's branch wrote raw k to a float32 row beside q
// instead, and stored the normed row once; docs/PERFORMANCE.md).
// One block an SM (the binder's splits make the grid about a wave of them), so the bounds let a thread have any
// registers: with the block size alone ptxas kept some instantiations to 128 and spilled (head 128 96 bytes).
template <int HEAD_DIM, bool HEAD_NORM, typename T>
__global__ void __launch_bounds__(DECODE_THREADS, 1)
    attention_decode(const float* __restrict__ q, T* __restrict__ k_cache, const T* __restrict__ v_cache,
                     float* __restrict__ out, const int* __restrict__ kv_len_ptr, int* __restrict__ counters,
                     float4* __restrict__ partial_acc, float2* __restrict__ partial_stats, int group_size, int kv_dim,
                     int n_ctx, float score_scale, int window, DecodeHeadNorm head_norm) {
    using Tile = DecodeTile<HEAD_DIM>;
    constexpr int ROW_CHUNKS = Tile::ROW_CHUNKS;
    const int n_splits = gridDim.x;
    const int kv_head = blockIdx.y;
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    const int group_first_head = kv_head * group_size;
    DECODE_PHASE(start);

    // The host writes kv_len before the step (or greedy_advance, sample.cu, at the end of the step before: a plain
    // launch, complete before this graph's first kernel starts); never the kernel this one overlaps, so it may
    // be read before the wait: the L2 prefetch below and HEAD_NORM's angles use it there.
    const int kv_len = *kv_len_ptr;
    if (kv_len < 1 || kv_len > n_ctx) __trap();
    // The one query is the newest token, at position kv_len - 1: it sees rows visible_from .. kv_len - 1.
    const int visible_from = window > 0 ? max(0, kv_len - window) : 0;
    const int visible = kv_len - visible_from;
    const int rows_per_split = max(Tile::ROWS, ceil_div(visible, n_splits));
    const int n_active = ceil_div(visible, rows_per_split);
    // Where the active splits leave blocks over, each split's query heads are shared among head_parts blocks
    // (block x: split x / head_parts, part x % head_parts), so that each block's chain scores, weighs and reduces
    // fewer heads: a short cache is then up to a block a query head, not a block a KV head. Not under HEAD_NORM,
    // where the last split's one block norms the newest k row in place before it reads it (see below).
    const int head_parts = HEAD_NORM ? 1 : min(group_size, n_splits / n_active);
    const int part_heads = ceil_div(group_size, head_parts);  // query heads a part's block serves, the last fewer
    const int parts_used = ceil_div(group_size, part_heads);
    const int split = blockIdx.x / head_parts;
    const int head_part = blockIdx.x % head_parts;
    const int first_head = group_first_head + head_part * part_heads;  // the block's first query head
    const int block_heads = min(part_heads, group_size - head_part * part_heads);
    if (split >= n_active || head_part >= parts_used) {  // a short cache leaves most blocks empty
        DECODE_PHASE(idle);
        return;
    }
    const int first = visible_from + split * rows_per_split;
    const int end = min(kv_len, first + rows_per_split);
    T* k_head = k_cache + std::size_t(kv_head) * HEAD_DIM;
    const T* v_head = v_cache + std::size_t(kv_head) * HEAD_DIM;

    // The cache rows before the newest do not depend on the previous kernel: fetch them into L2 meanwhile (a
    // row's 128-byte lines; head 32's f16 row is half of one).
    constexpr int lines_per_row = ceil_div(HEAD_DIM * int(sizeof(T)), 128);
    constexpr int values_per_line = 128 / int(sizeof(T));
    for (int i = threadIdx.x; i < (end - first) * lines_per_row; i += DECODE_THREADS) {
        const std::size_t at = std::size_t(first + i / lines_per_row) * kv_dim + (i % lines_per_row) * values_per_line;
        prefetch_l2(k_head + at);
        prefetch_l2(v_head + at);
    }
    // The block whose split ends at the newest row norms that row (see above).
    const bool norms_k = HEAD_NORM && split == n_active - 1;
    if constexpr (HEAD_NORM) {
        // The step's table: weights and angles depend on no kernel, so their loads and the angles' double
        // arithmetic and sincosf run while the previous kernel finishes. Thread i loads weight i of each norm
        // and pair i's frequency, the three loads in flight at once.
        static_assert(HEAD_DIM <= DECODE_THREADS, "a thread a weight");
        const int i = threadIdx.x;
        const bool holds_weight = i < HEAD_DIM, holds_pair = i < head_norm.n_rot / 2;
        const float q_weight = holds_weight ? head_norm.q_norm[i] : 0.0f;
        const float k_weight = holds_weight && norms_k ? head_norm.k_norm[i] : 0.0f;
        const double frequency = holds_pair ? head_norm.inv_freq[i] : 0.0;
        DecodeHeadNormTable<HEAD_DIM>& table = decode_head_norm_table<HEAD_DIM>();
        if (holds_weight) {
            table.q_weight[i] = q_weight;
            table.k_weight[i] = k_weight;  // read only where norms_k
        }
        if (holds_pair) table.angle[i] = rope_angle(kv_len - 1, frequency, head_norm.mscale);
        __syncthreads();  // the table is filled before any warp reads it
    }
    DECODE_PHASE(prefetched);
    wait_for_previous_kernel();
    allow_next_kernel();
    DECODE_PHASE(waited);

    __shared__ __align__(16) float4 q_scaled[DECODE_MAX_GROUP * ROW_CHUNKS];
    __shared__ float weights[DECODE_MAX_GROUP][Tile::ROWS];  // a tile's scores, then its softmax weights
    __shared__ float running_max[DECODE_MAX_GROUP], denominator[DECODE_MAX_GROUP], rescale[DECODE_MAX_GROUP];
    __shared__ float4 to_reduce[DECODE_REDUCE_HEADS][DECODE_THREADS];
    if (threadIdx.x < DECODE_MAX_GROUP) {
        running_max[threadIdx.x] = -INFINITY;
        denominator[threadIdx.x] = 0.0f;
    }
    if constexpr (HEAD_NORM) {
        // The one phase after the wait (see above): q heads global -> registers -> q_scaled, the newest row in
        // place, at once. The row's warp norms it before its own q heads: the row gates the tiles' loads.
        const DecodeHeadNormTable<HEAD_DIM>& table = decode_head_norm_table<HEAD_DIM>();
        if (norms_k && warp == DECODE_WARPS - 1) {
            T* newest = k_head + std::size_t(kv_len - 1) * kv_dim;
            head_norm_rope<HEAD_DIM>(newest, newest, table.k_weight, table.angle, head_norm.eps, head_norm.n_rot,
                                     head_norm.mode, 1.0f);
        }
        float* q_heads = reinterpret_cast<float*>(q_scaled);
        for (int h = warp; h < block_heads; h += DECODE_WARPS)
            head_norm_rope<HEAD_DIM>(q + std::size_t(first_head + h) * HEAD_DIM, q_heads + h * HEAD_DIM,
                                     table.q_weight, table.angle, head_norm.eps, head_norm.n_rot, head_norm.mode,
                                     score_scale);
        // The row is written before the tiles load it: the block's own global writes are visible to its loads
        // after the barrier (plain loads, not the read-only cache: no stale cached copy).
        if (norms_k) __syncthreads();
        DECODE_PHASE(head_normed);
    }

    const int slice = lane % DECODE_LANES_PER_ROW;
    const int step_row = threadIdx.x / DECODE_LANES_PER_ROW;  // the row of a 32-row step this lane scores
    const int v_chunk = threadIdx.x % ROW_CHUNKS;
    const int v_group = threadIdx.x / ROW_CHUNKS;  // >= ROW_GROUPS: no V rows (a head size not dividing 1024)
    float4 acc[DECODE_MAX_GROUP] = {};
    for (int tile = first; tile < end; tile += Tile::ROWS) {
        // Rows past the split's end load its last row, then get weight 0: no thread reads outside the split.
        float4 k[Tile::STEPS][Tile::LANE_CHUNKS];
#pragma unroll
        for (int step = 0; step < Tile::STEPS; ++step) {
            const int row = min(tile + step * DECODE_ROWS_PER_STEP + step_row, end - 1);
            const T* k_row = k_head + std::size_t(row) * kv_dim;
#pragma unroll
            for (int c = 0; c < Tile::LANE_CHUNKS; ++c)
                k[step][c] = load_cache_quad(k_row, c * DECODE_LANES_PER_ROW + slice);
        }
        float4 v[Tile::V_ROWS];
#pragma unroll
        for (int i = 0; i < Tile::V_ROWS; ++i) {
            const int row = min(tile + v_group + i * Tile::ROW_GROUPS, end - 1);
            v[i] = load_cache_quad(v_head + std::size_t(row) * kv_dim, v_chunk);
        }
        if (!HEAD_NORM && tile == first) {  // HEAD_NORM staged q before the loop
            const float4* q_group = reinterpret_cast<const float4*>(q) + std::size_t(first_head) * ROW_CHUNKS;
            for (int i = threadIdx.x; i < block_heads * ROW_CHUNKS; i += DECODE_THREADS) {
                const float4 value = q_group[i];
                q_scaled[i] = make_float4(value.x * score_scale, value.y * score_scale, value.z * score_scale,
                                          value.w * score_scale);
            }
        }
        __syncthreads();  // q is staged, and the previous tile's V pass is done with `weights`
        DECODE_PHASE(tile_loads);

#pragma unroll
        for (int step = 0; step < Tile::STEPS; ++step) {
            const int tile_row = step * DECODE_ROWS_PER_STEP + step_row;
            const bool inside = tile + tile_row < end;
            // SCORE_HEADS heads at once: a batch past block_heads reads q_scaled's unused heads (DECODE_MAX_GROUP
            // divides into batches) and stores nothing for them.
            for (int batch = 0; batch < block_heads; batch += Tile::SCORE_HEADS) {
                float dot[Tile::SCORE_HEADS] = {};
#pragma unroll
                for (int c = 0; c < Tile::LANE_CHUNKS; ++c) {
#pragma unroll
                    for (int j = 0; j < Tile::SCORE_HEADS; ++j) {
                        const float4 qc = q_scaled[(batch + j) * ROW_CHUNKS + c * DECODE_LANES_PER_ROW + slice];
                        const float4 kc = k[step][c];
                        dot[j] += (kc.x * qc.x + kc.y * qc.y) + (kc.z * qc.z + kc.w * qc.w);
                    }
                }
#pragma unroll
                for (int offset = DECODE_LANES_PER_ROW / 2; offset > 0; offset /= 2) {
#pragma unroll
                    for (int j = 0; j < Tile::SCORE_HEADS; ++j) dot[j] += __shfl_xor_sync(FULL_WARP, dot[j], offset);
                }
                if (slice == 0) {
#pragma unroll
                    for (int j = 0; j < Tile::SCORE_HEADS; ++j)
                        if (batch + j < block_heads) weights[batch + j][tile_row] = inside ? dot[j] : -INFINITY;
                }
            }
        }
        __syncthreads();
        DECODE_PHASE(tile_scores);

        for (int h = warp; h < block_heads; h += DECODE_WARPS) {
            const float old_max = running_max[h];
            float tile_max = -INFINITY;
            for (int r = lane; r < Tile::ROWS; r += WARP_SIZE) tile_max = fmaxf(tile_max, weights[h][r]);
            const float new_max = fmaxf(old_max, warp_max(tile_max));  // finite: the tile's first row is inside
            float sum = 0.0f;
            for (int r = lane; r < Tile::ROWS; r += WARP_SIZE) {
                const float weight = exp2f(weights[h][r] - new_max);  // 0 for the rows past the end
                weights[h][r] = weight;
                sum += weight;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                const float scale = exp2f(old_max - new_max);  // 0 on the first tile (old_max = -inf)
                rescale[h] = scale;
                denominator[h] = denominator[h] * scale + sum;
                running_max[h] = new_max;
            }
        }
        __syncthreads();
        DECODE_PHASE(tile_softmax);

        if (v_group < Tile::ROW_GROUPS) {
            // DECODE_HEAD_BATCH heads at once, their rescales and weights loaded together before the products. A
            // batch's heads past block_heads are computed from shared memory no pass wrote and never read. A thread's
            // last V row may lie past the tile where the row groups do not divide it (head 96, 160, 192): the check
            // compiles away for the other head sizes.
            const auto holds_row = [&](int i) {
                return Tile::V_ROWS_EXACT || v_group + i * Tile::ROW_GROUPS < Tile::ROWS;
            };
#pragma unroll
            for (int batch = 0; batch < DECODE_MAX_GROUP; batch += DECODE_HEAD_BATCH) {
                if (batch >= block_heads) break;
                float scale[DECODE_HEAD_BATCH], w[DECODE_HEAD_BATCH][Tile::V_ROWS];
#pragma unroll
                for (int j = 0; j < DECODE_HEAD_BATCH; ++j) {
                    scale[j] = rescale[batch + j];
#pragma unroll
                    for (int i = 0; i < Tile::V_ROWS; ++i) {
                        const int tile_row = v_group + i * Tile::ROW_GROUPS;
                        w[j][i] = holds_row(i) ? weights[batch + j][tile_row] : 0.0f;
                    }
                }
#pragma unroll
                for (int j = 0; j < DECODE_HEAD_BATCH; ++j) {
                    float4& a = acc[batch + j];
                    a = make_float4(a.x * scale[j], a.y * scale[j], a.z * scale[j], a.w * scale[j]);
#pragma unroll
                    for (int i = 0; i < Tile::V_ROWS; ++i) {
                        if (!holds_row(i)) continue;  // the clamped row past the tile is not added, even times 0
                        a.x += w[j][i] * v[i].x;
                        a.y += w[j][i] * v[i].y;
                        a.z += w[j][i] * v[i].z;
                        a.w += w[j][i] * v[i].w;
                    }
                }
            }
        }
        DECODE_PHASE(tile_v);
    }

    // Sum the accumulators of a chunk's row groups, DECODE_REDUCE_HEADS heads a pass; thread (head, chunk)
    // then writes the output (one split) or its partial.
    float4* const out4 = reinterpret_cast<float4*>(out);
#pragma unroll
    for (int pass = 0; pass < DECODE_MAX_GROUP / DECODE_REDUCE_HEADS; ++pass) {
        const int pass_head = pass * DECODE_REDUCE_HEADS;
        if (pass_head >= block_heads) break;
        __syncthreads();  // the previous pass's readers are done with to_reduce
        if (v_group < Tile::ROW_GROUPS) {
#pragma unroll
            for (int i = 0; i < DECODE_REDUCE_HEADS; ++i) to_reduce[i][threadIdx.x] = acc[pass_head + i];
        }
        __syncthreads();
        const int h = pass_head + threadIdx.x / ROW_CHUNKS;
        if (threadIdx.x < DECODE_REDUCE_HEADS * ROW_CHUNKS && h < block_heads) {
            float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int g = 0; g < Tile::ROW_GROUPS; ++g) {
                const float4 part = to_reduce[threadIdx.x / ROW_CHUNKS][g * ROW_CHUNKS + v_chunk];
                sum.x += part.x;
                sum.y += part.y;
                sum.z += part.z;
                sum.w += part.w;
            }
            const int head = first_head + h;
            if (n_active == 1) {
                const float inverse = 1.0f / denominator[h];
                out4[std::size_t(head) * ROW_CHUNKS + v_chunk] =
                    make_float4(sum.x * inverse, sum.y * inverse, sum.z * inverse, sum.w * inverse);
            } else {
                partial_acc[(std::size_t(head) * n_splits + split) * ROW_CHUNKS + v_chunk] = sum;
            }
        }
    }
    DECODE_PHASE(reduced);
    if (n_active == 1) {
        DECODE_PHASE(end);
        return;
    }
    if (threadIdx.x < block_heads)
        partial_stats[std::size_t(first_head + threadIdx.x) * n_splits + split] =
            make_float2(running_max[threadIdx.x], denominator[threadIdx.x]);

    // Publish the partials, then count this split done; the block that completes the count merges. One thread
    // counts, with an atomic that both releases and acquires at the GPU's scope, as a grid-wide barrier of
    // cooperative groups does: the barrier before it orders every thread's partial writes before its release, and
    // the barrier after it orders its acquire, in the merging block, before every thread's loads of the other
    // blocks' partials. So no thread fences alone (each thread's __threadfence waited out its own writes: 0.8 µs
    // of every splitting block, session 58's phases).
    __shared__ bool merges;
    __syncthreads();
    DECODE_PHASE(fenced);
    if (threadIdx.x == 0) {
        int done;
        asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(done) : "l"(counters + kv_head) : "memory");
        merges = done == n_active * parts_used - 1;
        if (merges) counters[kv_head] = 0;  // ready for the next launch, which reads it after this grid is done
    }
    __syncthreads();
    DECODE_PHASE(counted);
    if (!merges) {
        DECODE_PHASE(end);
        return;
    }

    // The merge: `parts` adjacent lanes share one (head, chunk) pair, each merging every parts-th split in
    // batches whose loads are in flight together, then they merge their states by shuffles. __ldcg reads
    // through L2, where the other blocks' partials are (never a stale line of this SM's L1).
    const int pairs = group_size * ROW_CHUNKS;
    int parts = 1;
    while (parts < WARP_SIZE && 2 * parts * pairs <= DECODE_THREADS) parts *= 2;
    const int part = threadIdx.x % parts;
    for (int first_pair = 0; first_pair < pairs; first_pair += DECODE_THREADS / parts) {
        const int pair = first_pair + threadIdx.x / parts;
        const int head = group_first_head + min(pair, pairs - 1) / ROW_CHUNKS;  // past the last pair: shuffle along
        const int chunk = min(pair, pairs - 1) % ROW_CHUNKS;
        const float2* stats = partial_stats + std::size_t(head) * n_splits;
        const float4* accs = partial_acc + std::size_t(head) * n_splits * ROW_CHUNKS + chunk;
        float merged_max = -INFINITY, merged_denominator = 0.0f;
        float4 merged = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int batch = part; batch < n_active; batch += parts * DECODE_MERGE_BATCH) {
            float2 stat[DECODE_MERGE_BATCH];
            float4 piece[DECODE_MERGE_BATCH];
#pragma unroll
            for (int b = 0; b < DECODE_MERGE_BATCH; ++b) {
                const int s = min(batch + b * parts, n_active - 1);
                stat[b] = __ldcg(stats + s);
                piece[b] = __ldcg(accs + std::size_t(s) * ROW_CHUNKS);
            }
            float batch_max = merged_max;
#pragma unroll
            for (int b = 0; b < DECODE_MERGE_BATCH; ++b) batch_max = fmaxf(batch_max, stat[b].x);
            const float scale = exp2f(merged_max - batch_max);  // 0 on the first batch
            merged_denominator *= scale;
            merged = make_float4(merged.x * scale, merged.y * scale, merged.z * scale, merged.w * scale);
#pragma unroll
            for (int b = 0; b < DECODE_MERGE_BATCH; ++b) {
                // A split past the last one was loaded as the last one: weight 0, not counted twice.
                const float w = batch + b * parts < n_active ? exp2f(stat[b].x - batch_max) : 0.0f;
                merged_denominator += w * stat[b].y;
                merged.x += w * piece[b].x;
                merged.y += w * piece[b].y;
                merged.z += w * piece[b].z;
                merged.w += w * piece[b].w;
            }
            merged_max = batch_max;
        }
        for (int offset = 1; offset < parts; offset *= 2) {
            const float other_max = __shfl_xor_sync(FULL_WARP, merged_max, offset);
            const float other_denominator = __shfl_xor_sync(FULL_WARP, merged_denominator, offset);
            float4 other;
            other.x = __shfl_xor_sync(FULL_WARP, merged.x, offset);
            other.y = __shfl_xor_sync(FULL_WARP, merged.y, offset);
            other.z = __shfl_xor_sync(FULL_WARP, merged.z, offset);
            other.w = __shfl_xor_sync(FULL_WARP, merged.w, offset);
            const float new_max = fmaxf(merged_max, other_max);
            // A part with no split (max -inf) weighs 0; at least one part of the pair has one.
            const float mine = merged_max == -INFINITY ? 0.0f : exp2f(merged_max - new_max);
            const float theirs = other_max == -INFINITY ? 0.0f : exp2f(other_max - new_max);
            merged_denominator = mine * merged_denominator + theirs * other_denominator;
            merged = make_float4(mine * merged.x + theirs * other.x, mine * merged.y + theirs * other.y,
                                 mine * merged.z + theirs * other.z, mine * merged.w + theirs * other.w);
            merged_max = new_max;
        }
        if (part == 0 && pair < pairs) {
            const float inverse = 1.0f / merged_denominator;
            out4[std::size_t(head) * ROW_CHUNKS + chunk] =
                make_float4(merged.x * inverse, merged.y * inverse, merged.z * inverse, merged.w * inverse);
        }
    }
    DECODE_PHASE(merged);
    DECODE_PHASE(end);
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
template <int HEAD_DIM, typename T>
__global__ void __launch_bounds__(PREFILL_THREADS)
    attention_prefill_tiled(const float* __restrict__ q, const T* __restrict__ k_cache,
                            const T* __restrict__ v_cache, float* __restrict__ out,
                            const int* __restrict__ positions, int n_tokens, int n_heads, int group_size, int kv_dim,
                            int n_ctx, float score_scale, int window) {
    constexpr int CHUNKS_PER_LANE = HEAD_DIM / (4 * PREFILL_LANES_PER_QUERY);  // float4 chunks each lane holds
    constexpr int ROW_CHUNKS = HEAD_DIM / 4;                                   // float4 chunks of one row
    constexpr int TILE_ROWS = PREFILL_TILE_FLOATS / HEAD_DIM / PREFILL_CHUNK * PREFILL_CHUNK;
    static_assert(TILE_ROWS >= PREFILL_CHUNK, "a tile holds at least one chunk of rows");
    __shared__ __align__(16) float4 k_tile[TILE_ROWS * ROW_CHUNKS];
    __shared__ __align__(16) float4 v_tile[TILE_ROWS * ROW_CHUNKS];
    __shared__ int block_rows, block_first_row;

    const int head = blockIdx.x;
    const int query_tile = gridDim.y - 1 - blockIdx.y;  // the last queries, which see the most rows, start first
    const int slice = threadIdx.x % PREFILL_LANES_PER_QUERY;
    const int token = query_tile * PREFILL_QUERIES + threadIdx.x / PREFILL_LANES_PER_QUERY;
    const bool active = token < n_tokens;  // the last tile's extra queries go along, see nothing, write nothing
    const int position = active ? positions[token] : -1;
    if (active && (position < 0 || position >= n_ctx)) __trap();

    // The block walks the rows its queries see: from the first row the earliest one's window starts at
    // (0 without a window) to the last query's position.
    const int first_visible = window > 0 ? max(0, position - window + 1) : 0;
    if (threadIdx.x == 0) {
        block_rows = 0;
        block_first_row = n_ctx;
    }
    __syncthreads();
    if (active && slice == 0) {
        atomicMax(&block_rows, position + 1);
        atomicMin(&block_first_row, first_visible);
    }
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
    for (int first_row = block_first_row; first_row < rows; first_row += TILE_ROWS) {
        const int tile_rows = min(TILE_ROWS, rows - first_row);
        __syncthreads();  // every thread is done with the previous tile
        for (int i = threadIdx.x; i < TILE_ROWS * ROW_CHUNKS; i += PREFILL_THREADS) {
            const int row = i / ROW_CHUNKS;
            const std::size_t from = (first_row + row) * std::size_t(kv_dim) + kv_offset;
            const bool inside = row < tile_rows;  // rows past the block's last visible row are zeros, not read
            k_tile[i] = inside ? load_cache_quad(k_cache + from, i % ROW_CHUNKS) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            v_tile[i] = inside ? load_cache_quad(v_cache + from, i % ROW_CHUNKS) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
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
                const int row = first_row + chunk_row + r;
                scores[r] = row <= position && row >= first_visible ? dot : -INFINITY;
                chunk_max = fmaxf(chunk_max, scores[r]);
            }
            const float new_max = fmaxf(max_score, chunk_max);
            if (new_max == -INFINITY) continue;  // no visible row yet (before its window, or a query past n_tokens)
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

template <int HEAD_DIM, typename T>
cudaError_t launch_prefill(const float* q, const T* k_cache, const T* v_cache, float* out,
                           const int* positions, int n_tokens, int n_heads, int n_kv_heads, int n_ctx, float scale,
                           int window, cudaStream_t stream) {
    const float score_scale = LOG2_E * scale;  // scores in log2 units: exp2f weights
    // grid.x: the query head; grid.y: ceil(n_tokens / 16) tiles of 16 queries (n_tokens <= 16 * 65535), run
    // last tile first. Consecutive blocks are the heads of one query tile: the heads sharing a KV head read
    // the same K/V rows at about the same time, from L2.
    const dim3 grid(n_heads, ceil_div(n_tokens, PREFILL_QUERIES));
    attention_prefill_tiled<HEAD_DIM, T><<<grid, PREFILL_THREADS, 0, stream>>>(
        q, k_cache, v_cache, out, positions, n_tokens, n_heads, n_heads / n_kv_heads, n_kv_heads * HEAD_DIM, n_ctx,
        score_scale, window);
    return cudaGetLastError();
}

// The tensor-core prefill's K/V tiles, per head size. A tile holds 4096 values of K (and of V): 64 rows of
// head size 64, 32 of 128, so either way a thread carries 8 float4 of K, then 8 of V (32 registers each), from
// its global loads to its f16 stores: the registers the pipeline keeps in flight across a tile's products.
// Shared memory, two buffers of a K and a V tile: 4 x 64 x 72 x 2 = 36,864 bytes (head 64) and
// 4 x 32 x 136 x 2 = 34,816 bytes (head 128), under the 48 KB a block gets without opting in. 64-row tiles of
// head 128 would need 69,632 bytes (dynamic shared memory, opted in per kernel) and 64 registers of loads in
// flight besides its 64 accumulators, 32 of q and 32 of scores: half the rows per tile costs twice the
// barriers and rescales per row, but keeps two blocks per SM.
//
// Blocks per SM: __launch_bounds__ holds the registers per thread to what MIN_BLOCKS_PER_SM blocks of 128
// threads leave: 65536 / (3 x 128) = 170, so 168, for head 64 (32 accumulators, 16 registers of q, 32 of
// scores, 32 of loads in flight; ptxas spills a few loop-invariant values to L1 there, rather than drop to two
// blocks), and 255 for two blocks of head 128 (64 accumulators, 32 of q, 16 of scores, 32 of loads; 248
// used). Shared memory holds that many on sm_80 (164 KB per SM) and sm_90 (228 KB): 3 x 36.9 KB, 2 x 34.8 KB;
// sm_86 and sm_89 (100 KB) hold two blocks of head 64, so prefill_splits' one wave becomes a full wave and a
// shorter second one there.
template <int HEAD_DIM>
struct PrefillTile {
    static constexpr int ROWS = 4096 / HEAD_DIM;
    static constexpr int STRIDE = HEAD_DIM + 8;  // f16 per shared-memory row: padding keeps ldmatrix free of
                                                 // bank conflicts, rows stay 16-byte aligned
    static constexpr int ROW_VECTORS = HEAD_DIM / 4;                               // float4 of one cache row
    static constexpr int LOAD_VECTORS = ROWS * ROW_VECTORS / MMA_PREFILL_THREADS;  // of K (and V) per thread
    static constexpr int PASS_ROWS = MMA_PREFILL_THREADS / ROW_VECTORS;  // rows the block's threads load at once
    static constexpr int MIN_BLOCKS_PER_SM = HEAD_DIM == 64 ? 3 : 2;
    static_assert(LOAD_VECTORS * MMA_PREFILL_THREADS == ROWS * ROW_VECTORS, "a tile splits evenly over the threads");
    static_assert(PASS_ROWS * ROW_VECTORS == MMA_PREFILL_THREADS, "a pass of the threads loads whole rows");
    static_assert(STRIDE * sizeof(__half) % 16 == 0, "16-byte aligned shared-memory rows, as ldmatrix reads them");
    static_assert(SPLIT_ALIGN_ROWS % ROWS == 0, "a slice of the cache rows is whole tiles");
};

// One thread's share of a tile's K or V, from its global loads to its f16 stores: float4 from a float32 cache,
// rounded to f16 as it is stored; from an f16 cache the f16 bits themselves (uint2), stored as they came, with no
// widening and rounding back.
template <int HEAD_DIM, typename T>
struct PrefillLoads {
    using Vector = std::conditional_t<std::is_same_v<T, float>, float4, uint2>;
    Vector vectors[PrefillTile<HEAD_DIM>::LOAD_VECTORS];
};

// Vector i of a tile is row i / ROW_VECTORS, values 4 (i % ROW_VECTORS) .. + 3: consecutive threads read
// consecutive 16 bytes of a row (8 of an f16 row: coalesced either way) and store consecutive 8 bytes of f16, and
// a thread's vectors are PASS_ROWS rows apart in one column. Rows from `end` on are zeros, not read. `head`
// points at the KV head's first value of cache row 0.
template <int HEAD_DIM, typename T>
__device__ __forceinline__ void load_prefill_tile(PrefillLoads<HEAD_DIM, T>& loads, const T* head, int first_row,
                                                  int end, int kv_dim) {
    using Tile = PrefillTile<HEAD_DIM>;
    using Vector = typename PrefillLoads<HEAD_DIM, T>::Vector;
    const int row = first_row + threadIdx.x / Tile::ROW_VECTORS;
    const T* from = head + std::size_t(row) * kv_dim + 4 * (threadIdx.x % Tile::ROW_VECTORS);
    const std::size_t pass = std::size_t(Tile::PASS_ROWS) * kv_dim;
#pragma unroll
    for (int n = 0; n < Tile::LOAD_VECTORS; ++n)
        loads.vectors[n] = row + n * Tile::PASS_ROWS < end ? *reinterpret_cast<const Vector*>(from + n * pass)
                                                           : Vector{};  // zero bits: +0 in both types
}

// Four values as f16 bits: a float32 cache's rounded, an f16 cache's as they are.
__device__ __forceinline__ uint2 f16_bits(float4 value) {
    return make_uint2(half2_to_bits(__floats2half2_rn(value.x, value.y)),
                      half2_to_bits(__floats2half2_rn(value.z, value.w)));
}
__device__ __forceinline__ uint2 f16_bits(uint2 bits) { return bits; }

template <int HEAD_DIM, typename T>
__device__ __forceinline__ void store_prefill_tile(const PrefillLoads<HEAD_DIM, T>& loads, __half* tile) {
    using Tile = PrefillTile<HEAD_DIM>;
    __half* to = tile + (threadIdx.x / Tile::ROW_VECTORS) * Tile::STRIDE + 4 * (threadIdx.x % Tile::ROW_VECTORS);
#pragma unroll
    for (int n = 0; n < Tile::LOAD_VECTORS; ++n)
        *reinterpret_cast<uint2*>(to + n * Tile::PASS_ROWS * Tile::STRIDE) = f16_bits(loads.vectors[n]);
}

// Prefill on the tensor cores, in FlashAttention-2's schedule: a block takes 64 consecutive queries of one
// head, 16 per warp, and walks the cache rows they see in tiles (PrefillTile: 64 rows of head size 64, 32 of
// 128). The block converts a tile's K and V rows to f16 into shared memory (a float32 cache's rounded, an f16
// one's as they are); then each warp, on its own,
//   1. computes its 16 x ROWS scores S = Q K^T with mma.m16n8k16: Q (16 x head_dim, multiplied by
//      scale * log2(e) and rounded to f16 once) is the A operand, held in registers for the whole walk; K's
//      rows are B's columns (as W's rows are in gemm.cu's x W^T), read with ldmatrix;
//   2. masks each score by its own query's position and window (-inf), and updates each query's running
//      maximum and denominator in log2 units (the weights are exp2f(s - max)), rescaling its output row;
//   3. adds P V into its 16 x head_dim float32 output: the weights P, rounded to f16, are taken from S's
//      accumulators as the A operand (two adjacent 16 x 8 C fragments are one 16 x 16 A fragment, mma.cuh),
//      and V's rows, the k of this product, are read transposed (ldmatrix.trans) as B's fragments.
// At the end each query's row is divided by its denominator.
//
// Lane l holds two queries of its warp, the rows g = l / 4 and g + 8 of every fragment, and of S and of the
// output the columns 2t, 2t + 1 of each 8-column block (t = l % 4; mma.cuh). A row's maximum is reduced
// over its quad (lanes 4g .. 4g + 3) with two shuffles; its denominator is kept per lane (the lane's share
// of the row) and summed over the quad once, at the end.
//
// Rounding, which the kernel tests model: q * scale * log2(e), K and V are rounded to f16 once each
// (relative error <= 2^-11; a value beyond f16's 65504 becomes infinite and shows in the output), their
// products are exact and summed in float32; the weights exp2f(s - max) <= 1 are summed in float32 for the
// denominator and rounded to f16 for P V.
//
// The rows a block's queries see run from the first one its earliest query's window shows (0 without a
// window) to its largest position. Split over the cache (grid.z > 1, prefill_splits), the block takes one
// slice of them (split-KV, flash-decoding's cut applied to a prompt): slices of rows_per_split rows from
// that first row, rows_per_split the block's rows / gridDim.z rounded up to SPLIT_ALIGN_ROWS and at least
// MIN_SPLIT_ROWS. The slice size comes from the positions the block reads, not from the host's max_rows, so
// the split is right for whatever positions are there: the early query tiles of a causal prompt, or a prompt
// far below max_rows, see fewer rows and leave their last slices empty (such a block writes its queries'
// statistics as "nothing seen" and returns). A slice's rows are whole tiles but for the last slice's last
// tile, whose rows past the block's last position are stored as zeros, not read. Each slice block then keeps
// its queries' unnormalised state (running maximum and denominator in log2 units, the head_dim accumulator)
// in the workspace, and attention_prefill_merge combines the slices in slice order; with one slice the block
// writes `out` itself.
//
// The pipeline, one barrier per tile (gemm.cu's, with one register stage): while the warps work on tile t
// (shared buffer t % 2), the next tile's rows are in flight in registers (PrefillLoads), then stored as f16
// into the other buffer, which was last read in tile t - 1, before the barrier that ended it. K's loads go out
// before the products S = Q K^T and are stored after them; V's go out in their registers' place and are stored
// after the softmax and P V: each half of the tile's loads has a half of its math to arrive in, with 32
// registers of float32 loads in flight rather than 64 (16 of an f16 cache's; see PrefillTile). The first
// tile's loads overlap staging q. A warp skips the products of a tile none of its queries sees (one before all
// their windows, or a last one past all their positions), but loads and stores its share of every tile: the
// barriers are the block's.
template <int HEAD_DIM, typename T>
__global__ void __launch_bounds__(MMA_PREFILL_THREADS, PrefillTile<HEAD_DIM>::MIN_BLOCKS_PER_SM)
    attention_prefill_tensor_cores(const float* __restrict__ q, const T* __restrict__ k_cache,
                                   const T* __restrict__ v_cache, float* __restrict__ out,
                                   float* __restrict__ partial_acc, float2* __restrict__ partial_stats,
                                   const int* __restrict__ positions, int n_tokens, int n_heads, int group_size,
                                   int kv_dim, int n_ctx, float score_scale, int window) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    using Tile = PrefillTile<HEAD_DIM>;
    constexpr int TILE_ROWS = Tile::ROWS;
    constexpr int STRIDE = Tile::STRIDE;
    constexpr int DIM_STEPS = HEAD_DIM / 16;     // k16 steps of Q K^T over the head
    constexpr int ROW_BLOCKS = TILE_ROWS / 8;    // 8-column blocks of a warp's scores (16 x TILE_ROWS)
    constexpr int ROW_STEPS = TILE_ROWS / 16;    // k16 steps of P V over the tile's rows
    constexpr int DIM_BLOCKS = HEAD_DIM / 8;     // 8-column blocks of a warp's output (16 x head_dim)
    static_assert(HEAD_DIM % 16 == 0, "whole k16 steps, and 8-column output blocks in pairs");
    static_assert(ROW_BLOCKS % 2 == 0, "score blocks in pairs: one ldmatrix brings two");
    __shared__ __align__(16) __half k_tiles[2][TILE_ROWS * STRIDE];
    __shared__ __align__(16) __half v_tiles[2][TILE_ROWS * STRIDE];
    __shared__ int block_end, block_first_row;

    const int head = blockIdx.x;
    const int query_tile = gridDim.y - 1 - blockIdx.y;  // the last queries, which see the most rows, start first
    const int split = blockIdx.z;
    const int n_splits = gridDim.z;
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    const int group = lane / 4;       // this lane's rows of every fragment: group and group + 8
    const int pair = 2 * (lane % 4);  // its columns of every 8-column block: pair and pair + 1
    const int warp_token = query_tile * MMA_PREFILL_QUERIES + warp * MMA_WARP_QUERIES;

    // Half h of the lane's fragments (h = 0: row group, h = 1: row group + 8) is query warp_token + group + 8 h.
    int position[2], first_visible[2];
    bool active[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int token = warp_token + group + 8 * h;
        active[h] = token < n_tokens;  // the last tile's extra queries go along, see nothing, write nothing
        position[h] = active[h] ? positions[token] : -1;
        if (active[h] && (position[h] < 0 || position[h] >= n_ctx)) __trap();
        first_visible[h] = !active[h] ? n_ctx : (window > 0 ? max(0, position[h] - window + 1) : 0);
    }
    // Query h's row of q and out, and of this slice's partial state ([split][token][head]).
    const auto query_row = [&](int h) { return std::size_t(warp_token + group + 8 * h) * n_heads + head; };
    const auto partial_row = [&](int h) { return std::size_t(split) * n_tokens * n_heads + query_row(h); };
    if (threadIdx.x == 0) {
        block_end = 0;
        block_first_row = n_ctx;
    }
    __syncthreads();
    if (lane % 4 == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
            if (active[h]) {
                atomicMax(&block_end, position[h] + 1);
                atomicMin(&block_first_row, first_visible[h]);
            }
    }
    // The rows this warp's queries see (none for a warp past n_tokens: end 0).
    const int warp_end = __reduce_max_sync(FULL_WARP, max(position[0], position[1]) + 1);
    const int warp_first_row = __reduce_min_sync(FULL_WARP, min(first_visible[0], first_visible[1]));
    __syncthreads();
    // This block's slice of the rows its queries see (the same for every thread: the returns below are the
    // whole block's). A block holds at least one query, so it sees at least one row.
    const int rows_start = block_first_row;
    const int rows_per_split = max(
        MIN_SPLIT_ROWS, ceil_div(ceil_div(block_end - rows_start, n_splits), SPLIT_ALIGN_ROWS) * SPLIT_ALIGN_ROWS);
    const int start = rows_start + split * rows_per_split;
    const int end = min(block_end, start + rows_per_split);
    if (start >= end) {  // an empty slice: its queries saw nothing here, which the merge reads as weight 0
        if (lane % 4 == 0) {
#pragma unroll
            for (int h = 0; h < 2; ++h)
                if (active[h]) partial_stats[partial_row(h)] = make_float2(-INFINITY, 0.0f);
        }
        return;
    }

    // The first tile's loads are in flight while q is staged.
    const std::size_t kv_offset = std::size_t(head / group_size) * HEAD_DIM;
    const T* k_head = k_cache + kv_offset;
    const T* v_head = v_cache + kv_offset;
    PrefillLoads<HEAD_DIM, T> next_k, next_v;
    load_prefill_tile(next_k, k_head, start, end, kv_dim);
    load_prefill_tile(next_v, v_head, start, end, kv_dim);

    // Q as A fragments, one per k16 step: a[0], a[2] of row group, a[1], a[3] of row group + 8; a[2], a[3]
    // at the step's columns 8 .. 15 (mma.cuh).
    std::uint32_t q_frags[DIM_STEPS][4];
#pragma unroll
    for (int step = 0; step < DIM_STEPS; ++step)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int h = r % 2;
            const int column = 16 * step + 8 * (r / 2) + pair;
            const float2 value = active[h] ? *reinterpret_cast<const float2*>(q + query_row(h) * HEAD_DIM + column)
                                           : make_float2(0.0f, 0.0f);
            q_frags[step][r] = half2_to_bits(__floats2half2_rn(value.x * score_scale, value.y * score_scale));
        }
    store_prefill_tile(next_k, k_tiles[0]);
    store_prefill_tile(next_v, v_tiles[0]);
    __syncthreads();

    float acc[DIM_BLOCKS][4] = {};
    float running_max[2] = {-INFINITY, -INFINITY};
    float denominator[2] = {0.0f, 0.0f};  // this lane's share of each row's sum
    const int n_tiles = ceil_div(end - start, TILE_ROWS);
    for (int tile = 0; tile < n_tiles; ++tile) {
        const int first_row = start + tile * TILE_ROWS;
        const __half* k_tile = k_tiles[tile % 2];
        const __half* v_tile = v_tiles[tile % 2];
        const bool more = tile + 1 < n_tiles;
        if (more) load_prefill_tile(next_k, k_head, first_row + TILE_ROWS, end, kv_dim);

        const bool sees = first_row < warp_end && first_row + TILE_ROWS > warp_first_row;  // the whole warp's
        float scores[ROW_BLOCKS][4] = {};
        if (sees) {
            // S = Q K^T. Each ldmatrix brings the B fragments of two 8-row blocks j, j + 1 of the tile: matrices
            // (rows of j, dims 0-7 of the step) = b[0] of j, (rows of j, dims 8-15) = b[1] of j, then those of
            // j + 1.
#pragma unroll
            for (int step = 0; step < DIM_STEPS; ++step)
#pragma unroll
                for (int j = 0; j < ROW_BLOCKS; j += 2) {
                    std::uint32_t k_frags[4];
                    const int row = 8 * j + lane % 8 + (lane / 16) * 8;
                    load_matrix_x4(k_frags, k_tile + row * STRIDE + 16 * step + ((lane / 8) % 2) * 8);
                    const std::uint32_t left[2] = {k_frags[0], k_frags[1]};
                    const std::uint32_t right[2] = {k_frags[2], k_frags[3]};
                    mma_16x8x16(scores[j], q_frags[step], left);
                    mma_16x8x16(scores[j + 1], q_frags[step], right);
                }
        }
        // The next K tile goes to shared memory once this one's products are done, and its V loads go out in
        // its registers' place: they arrive during the softmax and P V.
        if (more) {
            store_prefill_tile(next_k, k_tiles[(tile + 1) % 2]);
            load_prefill_tile(next_v, v_head, first_row + TILE_ROWS, end, kv_dim);
        }
        if (sees) {
            // The mask, then the online softmax: c[0], c[1] of a block are row group's, c[2], c[3] row group + 8's.
            float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int j = 0; j < ROW_BLOCKS; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int h = e / 2;
                    const int row = first_row + 8 * j + pair + e % 2;
                    if (row < first_visible[h] || row > position[h]) scores[j][e] = -INFINITY;
                    tile_max[h] = fmaxf(tile_max[h], scores[j][e]);
                }
            float base[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(FULL_WARP, tile_max[h], 1));
                tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(FULL_WARP, tile_max[h], 2));
                const float new_max = fmaxf(running_max[h], tile_max[h]);
                // A query that sees no row yet (before its window, or past n_tokens) subtracts 0 rather than
                // -inf: its weights are exp2f(-inf) = 0, not NaN.
                base[h] = new_max == -INFINITY ? 0.0f : new_max;
                const float rescale = exp2f(running_max[h] - base[h]);  // 0 the first time (running_max = -inf)
                running_max[h] = new_max;
                denominator[h] *= rescale;
#pragma unroll
                for (int d = 0; d < DIM_BLOCKS; ++d) {
                    acc[d][2 * h] *= rescale;
                    acc[d][2 * h + 1] *= rescale;
                }
            }

            // O += P V, k16 step s over the tile's rows 16 s .. 16 s + 15: P's A fragment is score blocks 2 s
            // (a[0] its row group, a[1] its row group + 8) and 2 s + 1 (a[2], a[3]). Each ldmatrix.trans brings
            // the B fragments of two 8-dim blocks d, d + 1 of V: matrices (rows 0-7 of the step, dims of d) =
            // b[0] of d, (rows 8-15, dims of d) = b[1] of d, then those of d + 1.
#pragma unroll
            for (int s = 0; s < ROW_STEPS; ++s) {
                std::uint32_t p[4];
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int h = r % 2;
                    const float* c = scores[2 * s + r / 2];
                    const float w0 = exp2f(c[2 * h] - base[h]);  // 0 for a masked row
                    const float w1 = exp2f(c[2 * h + 1] - base[h]);
                    denominator[h] += w0 + w1;
                    p[r] = half2_to_bits(__floats2half2_rn(w0, w1));
                }
#pragma unroll
                for (int d = 0; d < DIM_BLOCKS; d += 2) {
                    std::uint32_t v_frags[4];
                    const int row = 16 * s + lane % 8 + ((lane / 8) % 2) * 8;
                    load_matrix_x4_transposed(v_frags, v_tile + row * STRIDE + 8 * d + (lane / 16) * 8);
                    const std::uint32_t left[2] = {v_frags[0], v_frags[1]};
                    const std::uint32_t right[2] = {v_frags[2], v_frags[3]};
                    mma_16x8x16(acc[d], p, left);
                    mma_16x8x16(acc[d + 1], p, right);
                }
            }
        }

        if (more) {
            store_prefill_tile(next_v, v_tiles[(tile + 1) % 2]);
            __syncthreads();
        }
    }

    // One slice: out = acc / denominator. Several: this slice's state, unnormalised, for the merge (a query
    // that saw none of the slice's rows leaves maximum -inf, denominator 0 and zeros).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float sum = denominator[h];
        sum += __shfl_xor_sync(FULL_WARP, sum, 1);
        sum += __shfl_xor_sync(FULL_WARP, sum, 2);
        if (!active[h]) continue;
        if (n_splits == 1) {
            const float inverse = 1.0f / sum;  // >= 1: the row at the query's own position has weight 1 or more
#pragma unroll
            for (int d = 0; d < DIM_BLOCKS; ++d)
                *reinterpret_cast<float2*>(out + query_row(h) * HEAD_DIM + 8 * d + pair) =
                    make_float2(acc[d][2 * h] * inverse, acc[d][2 * h + 1] * inverse);
        } else {
            float* to = partial_acc + partial_row(h) * HEAD_DIM;
#pragma unroll
            for (int d = 0; d < DIM_BLOCKS; ++d)
                *reinterpret_cast<float2*>(to + 8 * d + pair) = make_float2(acc[d][2 * h], acc[d][2 * h + 1]);
            if (lane % 4 == 0) partial_stats[partial_row(h)] = make_float2(running_max[h], sum);
        }
    }
#else
    __trap();  // launch_attention_prefill_f32 starts it on sm_80+ only
#endif
}

// The merge of a prefill split over the cache: for each query and head, the slices' states (m_s, l_s, a_s:
// maximum, denominator, accumulator) combine as out = sum_s w_s a_s / sum_s w_s l_s with w_s = exp2(m_s - m),
// m the largest m_s, the slices taken in order (the same bits every run: no atomics, no race). A slice the
// query saw nothing of (m_s = -inf, whether its block wrote zeros or only the statistics) weighs 0, and its
// accumulator, which may be stale workspace, is not read. The slice holding the query's own row has a finite
// m_s, so m is finite and the denominator at least 1. Thread i: float4 i of out, chunk i % row_vectors of the
// query-head pair i / row_vectors; the pairs' statistics it reads are the same for row_vectors neighbours (L1).
__global__ void attention_prefill_merge(const float4* __restrict__ partial_acc,
                                        const float2* __restrict__ partial_stats, float4* __restrict__ out,
                                        int pairs, int row_vectors, int n_splits) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pairs * row_vectors) return;
    const int query_head = i / row_vectors;
    float most = -INFINITY;
    for (int s = 0; s < n_splits; ++s) most = fmaxf(most, partial_stats[std::size_t(s) * pairs + query_head].x);
    float denominator = 0.0f;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < n_splits; ++s) {
        const float2 stat = partial_stats[std::size_t(s) * pairs + query_head];
        if (stat.x == -INFINITY) continue;
        const float w = exp2f(stat.x - most);
        const float4 a = partial_acc[(std::size_t(s) * pairs) * row_vectors + i];
        denominator += w * stat.y;
        sum.x += w * a.x;
        sum.y += w * a.y;
        sum.z += w * a.z;
        sum.w += w * a.w;
    }
    const float inverse = 1.0f / denominator;
    out[i] = make_float4(sum.x * inverse, sum.y * inverse, sum.z * inverse, sum.w * inverse);
}

template <int HEAD_DIM, typename T>
cudaError_t launch_prefill_tensor_cores(const float* q, const T* k_cache, const T* v_cache, float* out,
                                        const int* positions, float* workspace, int n_tokens, int n_heads,
                                        int n_kv_heads, int n_ctx, float scale, int window, int n_splits,
                                        cudaStream_t stream) {
    const float score_scale = LOG2_E * scale;  // scores in log2 units: exp2f weights
    const int pairs = n_tokens * n_heads;     // query-head pairs (a split launch has fewer than 64 x its slots)
    float* partial_acc = n_splits > 1 ? workspace : nullptr;
    auto* partial_stats =
        n_splits > 1 ? reinterpret_cast<float2*>(workspace + std::size_t(n_splits) * pairs * HEAD_DIM) : nullptr;
    // grid.x: the query head; grid.y: ceil(n_tokens / 64) tiles of 64 queries, 16 per warp (n_tokens <= 64 *
    // 65535), run last tile first; grid.z: the slices of the cache rows (prefill_splits). Consecutive blocks
    // are the heads of one query tile, as in launch_prefill.
    const dim3 grid(n_heads, ceil_div(n_tokens, MMA_PREFILL_QUERIES), n_splits);
    attention_prefill_tensor_cores<HEAD_DIM, T><<<grid, MMA_PREFILL_THREADS, 0, stream>>>(
        q, k_cache, v_cache, out, partial_acc, partial_stats, positions, n_tokens, n_heads, n_heads / n_kv_heads,
        n_kv_heads * HEAD_DIM, n_ctx, score_scale, window);
    if (n_splits == 1) return cudaGetLastError();
    if (const cudaError_t failed = cudaGetLastError(); failed != cudaSuccess) return failed;
    // grid.x: ceil(n_tokens * n_heads * head_dim / 4 / 256) blocks, one thread per float4 of out.
    constexpr int MERGE_THREADS = 256;
    constexpr int ROW_VECTORS = HEAD_DIM / 4;
    attention_prefill_merge<<<ceil_div(pairs * ROW_VECTORS, MERGE_THREADS), MERGE_THREADS, 0, stream>>>(
        reinterpret_cast<const float4*>(partial_acc), partial_stats, reinterpret_cast<float4*>(out), pairs,
        ROW_VECTORS, n_splits);
    return cudaGetLastError();
}

// The cache slices of a prefill launch (its grid.z), the one rule launch_attention_prefill_f32 and
// attention_prefill_workspace_bytes share; 1 for the head sizes the float32 kernel takes (it does not split).
// A launch has n_heads x ceil(n_tokens / 64) query tiles, one block each; where they leave block slots
// (multiprocessors x PrefillTile::MIN_BLOCKS_PER_SM) empty, each tile's rows are cut into as many slices as
// the slots hold in one wave (Qwen2.5-0.5B's 512-token prompt on an H200: 112 tiles for 396 slots, 3
// slices), so every block of the launch runs at once and the longest one walks a third of the rows; the
// blocks past one wave that more slices would add only queue behind the first. max_rows (at least the
// largest position + 1) caps the slices at one per MIN_SPLIT_ROWS rows, MAX_PREFILL_SPLITS at most.
int prefill_splits(int n_tokens, int n_heads, int head_dim, int max_rows, int multiprocessors) {
    if ((head_dim != 64 && head_dim != 128) || n_tokens <= 0 || n_heads <= 0 || multiprocessors <= 0) return 1;
    const int blocks_per_sm =
        head_dim == 64 ? PrefillTile<64>::MIN_BLOCKS_PER_SM : PrefillTile<128>::MIN_BLOCKS_PER_SM;
    const long long tiles = static_cast<long long>(n_heads) * ceil_div(n_tokens, MMA_PREFILL_QUERIES);
    const long long slots = static_cast<long long>(multiprocessors) * blocks_per_sm;
    const long long most = std::min(MAX_PREFILL_SPLITS, max_rows / MIN_SPLIT_ROWS);
    return static_cast<int>(std::max(1LL, std::min(slots / tiles, most)));
}

// Bytes of the workspace of a launch of `n_splits` slices: the accumulators [splits][n_tokens][n_heads]
// [head_dim] floats, then the statistics [splits][n_tokens][n_heads] float2; none for one slice.
long long prefill_workspace_bytes(int n_tokens, int n_heads, int head_dim, int n_splits) {
    if (n_splits == 1) return 0;
    return static_cast<long long>(n_splits) * n_tokens * n_heads * (head_dim + 2) * static_cast<long long>(sizeof(float));
}

// The decode kernel of a head size (one each, so a tile's loads per thread are compile-time counts), with or
// without the head norm, over a cache of T.
template <bool HEAD_NORM, typename T>
decltype(&attention_decode<32, HEAD_NORM, T>) decode_kernel(int head_dim) {
    switch (head_dim) {
        case 32: return attention_decode<32, HEAD_NORM, T>;
        case 64: return attention_decode<64, HEAD_NORM, T>;
        case 96: return attention_decode<96, HEAD_NORM, T>;
        case 128: return attention_decode<128, HEAD_NORM, T>;
        case 160: return attention_decode<160, HEAD_NORM, T>;
        case 192: return attention_decode<192, HEAD_NORM, T>;
        case 224: return attention_decode<224, HEAD_NORM, T>;
        default: return attention_decode<256, HEAD_NORM, T>;
    }
}

// The preconditions both attention launchers share.
cudaError_t check_attention(int n_heads, int n_kv_heads, int head_dim, float scale, int window) {
    if (head_dim % WARP_SIZE != 0 || head_dim <= 0 || head_dim > MAX_HEAD_DIM)
        return minfer_refuse("head_dim must be a multiple of 32 between 32 and 256");
    if (n_kv_heads <= 0 || n_heads <= 0 || n_heads % n_kv_heads != 0)
        return minfer_refuse("n_heads must be a positive multiple of n_kv_heads");
    if (!(scale > 0.0f) || !std::isfinite(scale)) return minfer_refuse("scale must be a positive finite number");
    if (window < 0) return minfer_refuse("window must be 0 (none) or positive");
    return cudaSuccess;
}

}  // namespace
}  // namespace minfer

using namespace minfer;

extern "C" cudaError_t launch_kv_store_f32(const float* k, const float* v, void* k_cache, void* v_cache,
                                           const int* positions, int n_tokens, int kv_dim, int n_ctx, int cache_type,
                                           cudaStream_t stream) {
    return with_cache_type(cache_type, [&](auto element) {
        using T = decltype(element);
        // grid.x: ceil(kv_dim / 256) blocks over a row's values, one thread per value (it stores the K and
        // the V value); grid.y: the token, so n_tokens <= 65535.
        const dim3 grid(ceil_div(kv_dim, STORE_THREADS), n_tokens);
        kv_store_f32<T><<<grid, STORE_THREADS, 0, stream>>>(k, v, static_cast<T*>(k_cache), static_cast<T*>(v_cache),
                                                            positions, kv_dim, n_ctx);
        return cudaGetLastError();
    });
}

extern "C" std::size_t attention_decode_workspace_bytes(int n_heads, int head_dim, int n_splits) {
    return decode_counter_bytes(n_heads) + std::size_t(n_heads) * n_splits * (head_dim + 2) * sizeof(float);
}

extern "C" cudaError_t launch_attention_decode_f32(const float* q, void* k_cache, const void* v_cache, float* out,
                                                   const int* kv_len, float* workspace, int n_heads, int n_kv_heads,
                                                   int head_dim, int n_ctx, float scale, int window, int n_splits,
                                                   const float* q_norm, const float* k_norm, float head_eps,
                                                   int n_rot, const double* inv_freq, float mscale, int mode,
                                                   int cache_type, cudaStream_t stream) {
    if (const cudaError_t refused = check_attention(n_heads, n_kv_heads, head_dim, scale, window);
        refused != cudaSuccess)
        return refused;
    if (n_splits < 1 || n_splits > MAX_SPLITS) return minfer_refuse("n_splits must be between 1 and 256");
    if (n_heads / n_kv_heads > DECODE_MAX_GROUP) return minfer_refuse("n_heads / n_kv_heads must be at most 16");
    if (!is_aligned(q, 16) || !is_aligned(k_cache, 16) || !is_aligned(v_cache, 16) || !is_aligned(out, 16) ||
        !is_aligned(workspace, 16))
        return minfer_refuse("q, k_cache, v_cache, out and workspace must be 16-byte aligned (vector loads)");
    if ((q_norm == nullptr) != (k_norm == nullptr)) return minfer_refuse("q_norm and k_norm go together: both or neither");
    const bool head_norm = q_norm != nullptr;
    if (head_norm) {
        if (mode != ROPE_NORMAL && mode != ROPE_NEOX) return minfer_refuse("mode must be 0 (normal) or 2 (NeoX)");
        if (n_rot < 0 || n_rot % 2 != 0 || n_rot > head_dim)
            return minfer_refuse("n_rot must be even, between 0 and head_dim");
        if (n_rot > 0 && inv_freq == nullptr) return minfer_refuse("inv_freq must be given where n_rot > 0");
    }
    const float score_scale = LOG2_E * scale;  // scores in log2 units: exp2f weights
    int* counters = reinterpret_cast<int*>(workspace);
    auto* partial_acc = reinterpret_cast<float4*>(reinterpret_cast<char*>(workspace) + decode_counter_bytes(n_heads));
    auto* partial_stats = reinterpret_cast<float2*>(partial_acc + std::size_t(n_heads) * n_splits * (head_dim / 4));
    // grid.x: the split of the cache rows, and at a short cache the part of the group's query heads (fixed here,
    // so a captured graph is valid for every kv_len; the blocks a short cache does not need return at once; with
    // the head norms, the last active one's block also norms the KV head's part of the newest row); grid.y: the KV
    // head. Block: 256 threads that share the split's rows among them (see DecodeTile), and with the head norms a
    // warp a q head of the group.
    const dim3 grid(n_splits, n_kv_heads);
    const int kv_dim = n_kv_heads * head_dim;
    const DecodeHeadNorm norms{q_norm, k_norm, head_eps, n_rot, inv_freq, mscale, mode};
    return with_cache_type(cache_type, [&](auto element) {
        using T = decltype(element);
        const auto kernel = head_norm ? decode_kernel<true, T>(head_dim) : decode_kernel<false, T>(head_dim);
        return launch_overlapped(kernel, grid, dim3(DECODE_THREADS), 0, stream, q, static_cast<T*>(k_cache),
                                 static_cast<const T*>(v_cache), out, kv_len, counters, partial_acc, partial_stats,
                                 n_heads / n_kv_heads, kv_dim, n_ctx, score_scale, window, norms);
    });
}

extern "C" int attention_prefill_splits(int n_tokens, int n_heads, int head_dim, int max_rows, int multiprocessors) {
    return prefill_splits(n_tokens, n_heads, head_dim, max_rows, multiprocessors);
}

extern "C" long long attention_prefill_workspace_bytes(int n_tokens, int n_heads, int head_dim, int max_rows,
                                                       int multiprocessors) {
    return prefill_workspace_bytes(n_tokens, n_heads, head_dim,
                                   prefill_splits(n_tokens, n_heads, head_dim, max_rows, multiprocessors));
}

extern "C" cudaError_t launch_attention_prefill_f32(const float* q, const void* k_cache, const void* v_cache,
                                                    float* out, const int* positions, int n_tokens, int n_heads,
                                                    int n_kv_heads, int head_dim, int n_ctx, int max_rows, float scale,
                                                    int window, float* workspace, long long workspace_bytes,
                                                    int cache_type, cudaStream_t stream) {
    if (const cudaError_t refused = check_attention(n_heads, n_kv_heads, head_dim, scale, window);
        refused != cudaSuccess)
        return refused;
    if (n_tokens <= 0) return minfer_refuse("n_tokens must be positive");
    if (max_rows < 1 || max_rows > n_ctx)
        return minfer_refuse("max_rows must be between 1 and n_ctx (at least the largest position + 1)");
    if (!is_aligned(q, 16) || !is_aligned(k_cache, 16) || !is_aligned(v_cache, 16) || !is_aligned(out, 16))
        return minfer_refuse("q, k_cache, v_cache and out must be 16-byte aligned (vector loads)");
    // The tensor cores on sm_80+, where mma.m16n8k16 is one instruction, for the head sizes of the models whose
    // long prompts are measured: 64 (Qwen2.5, Llama 3.2 1B, SmolLM2) and 128 (Qwen3). The float32 kernel keeps
    // the rest: at 256 (Gemma 3) a lane would hold 128 output accumulators and 64 registers of q besides the
    // scores, past what a thread's registers hold without spilling; 32, 96, 160, 192 and 224 would each be one
    // more kernel to compile and check against the f16 bound for no model measured. sm_75 would run each
    // product as two k8 halves and older GPUs have no such instruction: they keep the float32 kernel too.
    if ((head_dim == 64 || head_dim == 128) && minfer_compute_capability() >= 80) {
        int multiprocessors = 0;
        if (const cudaError_t failed = device_multiprocessors(multiprocessors); failed != cudaSuccess) return failed;
        const int n_splits = prefill_splits(n_tokens, n_heads, head_dim, max_rows, multiprocessors);
        const long long needed = prefill_workspace_bytes(n_tokens, n_heads, head_dim, n_splits);
        if (needed > 0 && (workspace == nullptr || workspace_bytes < needed || !is_aligned(workspace, 16)))
            return minfer_refuse(
                "this launch splits the cache rows: workspace must hold attention_prefill_workspace_bytes(...) "
                "bytes, 16-byte aligned");
        return with_cache_type(cache_type, [&](auto element) {
            using T = decltype(element);
            const auto launch_tensor_cores =
                head_dim == 64 ? launch_prefill_tensor_cores<64, T> : launch_prefill_tensor_cores<128, T>;
            return launch_tensor_cores(q, static_cast<const T*>(k_cache), static_cast<const T*>(v_cache), out,
                                       positions, workspace, n_tokens, n_heads, n_kv_heads, n_ctx, scale, window,
                                       n_splits, stream);
        });
    }
    // One kernel per head size, so each lane's share of a row (head_dim / 8 values) sits in registers.
    return with_cache_type(cache_type, [&](auto element) {
        using T = decltype(element);
        decltype(&launch_prefill<32, T>) launch = nullptr;
        switch (head_dim) {
            case 32: launch = launch_prefill<32, T>; break;
            case 64: launch = launch_prefill<64, T>; break;
            case 96: launch = launch_prefill<96, T>; break;
            case 128: launch = launch_prefill<128, T>; break;
            case 160: launch = launch_prefill<160, T>; break;
            case 192: launch = launch_prefill<192, T>; break;
            case 224: launch = launch_prefill<224, T>; break;
            default: launch = launch_prefill<256, T>; break;
        }
        return launch(q, static_cast<const T*>(k_cache), static_cast<const T*>(v_cache), out, positions, n_tokens,
                      n_heads, n_kv_heads, n_ctx, scale, window, stream);
    });
}
