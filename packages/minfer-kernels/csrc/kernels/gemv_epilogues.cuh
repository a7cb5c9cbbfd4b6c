// The epilogues of the one-token GEMVs, shared by their two kernels: gemv.cu's, on the CUDA cores, and
// gemv_int8.cu's, on the integer tensor cores. An epilogue says which rows of which weights a launch
// multiplies by x and what becomes of their dot products; a kernel says how the products are computed.
//
// Each says how many groups there are, which ROWS rows of which weight group g reads (row(g, k): always a
// valid row, so no lane needs a bounds check; for the epilogues gemv_int8.cu takes, part_end(g, k): where the
// weight holding it ends), their row length and type, and what becomes of their dot products: prepare
// (run by the finishing thread right after the wait for the previous kernel: the epilogue's own loads) and
// finish (run by that thread with the group's sums).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common.cuh"
#include "kv_cache.cuh"
#include "rope.cuh"

namespace minfer {

// A weight as the kernels get it: GGUF bytes, type, rows of row_bytes bytes.
struct WeightPart {
    const std::uint8_t* data;
    long long row_bytes;
    int type;
    int n_rows;
    __device__ const std::uint8_t* row(int r) const { return data + std::size_t(min(r, n_rows - 1)) * row_bytes; }
    __host__ __device__ const std::uint8_t* end() const { return data + std::size_t(n_rows) * row_bytes; }
};

// y[row] = (W x)[row] (+ residual[row]) for ROWS consecutive rows. y may be residual itself (the add in
// place): each element is read and then written by the same thread, so neither pointer is __restrict__.
// Whether there is a residual is compiled in, so the output head (none) holds no registers for one.
template <int ROWS_PER_GROUP, bool ADD_RESIDUAL>
struct StoreRows {
    static constexpr int ROWS = ROWS_PER_GROUP;
    WeightPart weight;
    float* y;
    const float* residual;  // read only when ADD_RESIDUAL
    int n_groups;

    __device__ int type(int) const { return weight.type; }
    __device__ long long row_bytes(int) const { return weight.row_bytes; }
    __device__ const std::uint8_t* row(int group, int k) const { return weight.row(group * ROWS + k); }
    __device__ const std::uint8_t* part_end(int, int) const { return weight.end(); }

    struct Prepared {
        float residual[ADD_RESIDUAL ? ROWS : 1];
    };
    __device__ Prepared prepare(int group) const {
        Prepared prepared{};
        if constexpr (ADD_RESIDUAL) {
#pragma unroll
            for (int k = 0; k < ROWS; ++k) prepared.residual[k] = residual[min(group * ROWS + k, weight.n_rows - 1)];
        }
        return prepared;
    }
    __device__ void finish(int group, const float (&sums)[ROWS], const Prepared& prepared) const {
#pragma unroll
        for (int k = 0; k < ROWS; ++k) {
            const int row = group * ROWS + k;
            if (row >= weight.n_rows) continue;
            if constexpr (ADD_RESIDUAL) {
                y[row] = prepared.residual[k] + sums[k];
            } else {
                y[row] = sums[k];
            }
        }
    }
};

// out[i] = act(gate_i) * up_i, from row i of the gate weight and row i of the up weight (one type,
// checked at launch): gemv_swiglu (act silu) and gemv_geglu (act the tanh GELU). A group takes OUTPUTS
// consecutive outputs: their gate rows, then their up rows (two outputs per warp keep the 4864 warps of
// Qwen2.5-0.5B's FFN inside one wave of resident warps).
template <GateActivation ACTIVATION>
struct GemvGated {
    static constexpr int OUTPUTS = 2;
    static constexpr int ROWS = 2 * OUTPUTS;
    WeightPart gate, up;
    float* out;
    int n_groups;

    __device__ int type(int) const { return gate.type; }
    __device__ long long row_bytes(int) const { return gate.row_bytes; }
    __device__ const std::uint8_t* row(int group, int k) const {
        const int output = group * OUTPUTS + k % OUTPUTS;
        return k < OUTPUTS ? gate.row(output) : up.row(output);
    }
    __device__ const std::uint8_t* part_end(int, int k) const { return k < OUTPUTS ? gate.end() : up.end(); }
    struct Prepared {};
    __device__ Prepared prepare(int) const { return {}; }
    __device__ void finish(int group, const float (&sums)[ROWS], const Prepared&) const {
#pragma unroll
        for (int o = 0; o < OUTPUTS; ++o) {
            const int output = group * OUTPUTS + o;
            if (output < gate.n_rows) out[output] = activate<ACTIVATION>(sums[o]) * sums[OUTPUTS + o];
        }
    }
};

// The attention projections of one token: Wq, Wk and Wv (n_heads, n_kv_heads and n_kv_heads heads of
// head_dim rows; each its own type). Group g is one pair of dimensions of one head, counting q heads, then
// k heads, then v heads: the two dimensions RoPE rotates together (rope.cuh) for q and k, two adjacent
// ones for v. Its epilogue adds the biases, rotates q and k pairs by the position, and writes q to `q`, k
// and v to row `position` of the caches. With n_rot 0 no pair is rotated: a family that norms each head of q
// and k before RoPE (Qwen3, Gemma 3) has decode attention (attention.cu: attention_decode's HEAD_NORM) norm and
// rotate them afterwards, q as it reads it and k in its cache row. The position is read from device memory, so a captured graph serves every
// step; one outside the cache would write another buffer's memory, so the kernel traps.
struct GemvQkvRopeStore {
    static constexpr int ROWS = 2;
    WeightPart q_weight, k_weight, v_weight;
    const float* q_bias;  // each nullptr or [rows of its weight]
    const float* k_bias;
    const float* v_bias;
    float* q;             // [n_heads * head_dim]
    void* k_cache;        // [n_ctx][n_kv_heads * head_dim] of cache_type (kv_cache.cuh)
    void* v_cache;
    int cache_type;       // CACHE_F32 or CACHE_F16: one uniform branch a store, where templating every GEMV
                          // instantiation on it would double gemv.cu's and gemv_int8.cu's q|k|v kernels
    const int* positions;  // positions[0]: where this token's k and v go
    int n_heads, n_kv_heads, head_dim, n_rot, mode, n_ctx;
    const double* inv_freq;  // [n_rot / 2] pair frequencies (rope.cuh)
    float mscale;            // the factor on the rotation's cos and sin
    int n_groups;

    // Picked by value with selects: indexing an array of kernel parameters would copy it to local memory.
    __device__ WeightPart weight(int part) const { return part == 0 ? q_weight : (part == 1 ? k_weight : v_weight); }
    __device__ const float* bias(int part) const { return part == 0 ? q_bias : (part == 1 ? k_bias : v_bias); }

    struct Pair {
        int part;                   // 0 q, 1 k, 2 v
        int first_row, second_row;  // rows of that part
        int rope_pair;              // the RoPE pair index p, or -1 for a pair that is not rotated
    };

    __device__ Pair pair(int group) const {
        const int pairs_per_head = head_dim / 2;
        int head = group / pairs_per_head;
        const int p = group % pairs_per_head;
        const int part = head < n_heads ? 0 : (head < n_heads + n_kv_heads ? 1 : 2);
        head -= part == 0 ? 0 : (part == 1 ? n_heads : n_heads + n_kv_heads);
        const bool rotated = part < 2 && p < n_rot / 2;
        const bool neox = rotated && mode == ROPE_NEOX;
        const int first = neox ? p : 2 * p;
        const int second = neox ? p + n_rot / 2 : 2 * p + 1;
        return {part, head * head_dim + first, head * head_dim + second, rotated ? p : -1};
    }

    __device__ int type(int group) const { return weight(pair(group).part).type; }
    __device__ long long row_bytes(int group) const { return weight(pair(group).part).row_bytes; }
    __device__ const std::uint8_t* row(int group, int k) const {
        const Pair rows = pair(group);
        return weight(rows.part).row(k == 0 ? rows.first_row : rows.second_row);
    }

    struct Prepared {
        int position;
        float bias_first, bias_second;
        double frequency;  // the pair's inv_freq; the angle itself is computed in finish
    };
    __device__ Prepared prepare(int group) const {
        const Pair rows = pair(group);
        // Loads only, all independent: nothing here waits for them, so the warp's loads of x go out beside
        // them (a position check here, the compiler moving no load across its trap, held x's loads back by a
        // round trip to memory: docs/PERFORMANCE.md, session 32; it is in finish). The angle waits for finish
        // too: computed here, its float and double temporaries stayed live across the whole reduction and
        // spilled (ptxas: 16 bytes of stack, +0.6 us per launch for Q4_0 on the H200).
        Prepared prepared{};
        prepared.position = positions[0];
        if (const float* part_bias = bias(rows.part)) {
            prepared.bias_first = part_bias[rows.first_row];
            prepared.bias_second = part_bias[rows.second_row];
        }
        if (rows.rope_pair >= 0) prepared.frequency = inv_freq[rows.rope_pair];
        return prepared;
    }

    __device__ void finish(int group, const float (&sums)[ROWS], const Prepared& prepared) const {
        if (prepared.position < 0 || prepared.position >= n_ctx) __trap();  // before any store it places
        const Pair rows = pair(group);
        float a = sums[0] + prepared.bias_first, b = sums[1] + prepared.bias_second;
        if (rows.rope_pair >= 0) rope_rotate(a, b, rope_angle(prepared.position, prepared.frequency, mscale));
        if (rows.part == 0) {
            q[rows.first_row] = a;
            q[rows.second_row] = b;
            return;
        }
        const std::size_t kv_at = std::size_t(prepared.position) * n_kv_heads * head_dim;
        void* cache = rows.part == 1 ? k_cache : v_cache;
        if (cache_type == CACHE_F16) {
            __half* row = static_cast<__half*>(cache) + kv_at;
            store_cache(row + rows.first_row, a);
            store_cache(row + rows.second_row, b);
        } else {
            float* row = static_cast<float*>(cache) + kv_at;
            store_cache(row + rows.first_row, a);
            store_cache(row + rows.second_row, b);
        }
    }
};

// gemv_int8.cu: the same products on the integer tensor cores, for StoreRows<1, *> and GemvGated<*>.
// gemv_int8_takes: the GPU, the weights' types, their alignment and the row length allow it;
// gemv_int8_prefers: it does, and the product is one where the tensor cores stream the weights faster than
// gemv.cu's kernel (docs/PERFORMANCE.md, session 24: many weights an SM). gemv.cu's launchers ask the latter.
template <class Epilogue>
bool gemv_int8_takes(const Epilogue& epilogue, int in_features);
template <class Epilogue>
bool gemv_int8_prefers(const Epilogue& epilogue, int in_features);
template <class Epilogue>
cudaError_t launch_gemv_int8_epilogue(const Epilogue& epilogue, const float* x, const float* norm_weight, float eps,
                                      int in_features, cudaStream_t stream);

}  // namespace minfer
