// Embedding lookup: out[t][i] = table[ids[t]][i], the row dequantized to float32 on the fly.
//
// The table is the GGUF tensor as it is in the file (token_embd.weight: n_rows rows of d values, in any
// of the formats of ggml_formats.cuh); only the n_tokens requested rows are ever read. Token ids come
// from a device buffer, so one launch serves every step of a captured decode graph.
//
// One thread per output value: thread i of row t finds the block that holds value i and decodes that one
// value. Neighbouring threads read neighbouring bytes of the same blocks, and the writes are coalesced.
#include "common.cuh"
#include "ggml_formats.cuh"
#include "launchers.h"

namespace minfer {
namespace {

constexpr int EMBED_THREADS = 256;

template <int TYPE>
__global__ void embed_rows(const std::uint8_t* table, long long row_bytes, const int* ids, float* out, int d,
                           int n_rows) {
    const int token = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d) return;
    const int id = ids[token];
    // A token id outside the table would read another tensor's bytes: stop the kernel instead. The trap
    // is a sticky error the host sees at its next sync(), reported as latched.
    if (id < 0 || id >= n_rows) __trap();
    out[std::size_t(token) * d + i] = dequantize_value<TYPE>(table + id * row_bytes, i);
}

template <int TYPE>
cudaError_t launch(const void* table, const int* ids, float* out, int n_tokens, int d, int n_rows,
                   cudaStream_t stream) {
    // grid.x: ceil(d / 256) blocks over the row's values, one thread per value; grid.y: the token, so
    // n_tokens <= 65535.
    const dim3 grid(ceil_div(d, EMBED_THREADS), n_tokens);
    embed_rows<TYPE><<<grid, EMBED_THREADS, 0, stream>>>(static_cast<const std::uint8_t*>(table),
                                                          row_bytes(TYPE, d), ids, out, d, n_rows);
    return cudaGetLastError();
}

}  // namespace
}  // namespace minfer

using namespace minfer;

extern "C" cudaError_t launch_embed_rows(const void* table, int type, const int* ids, float* out, int n_tokens,
                                         int d, int n_rows, cudaStream_t stream) {
    if (row_bytes(type, d) < 0) return minfer_refuse(MINFER_TYPES_AND_ROWS ", d the row length");
    if (!is_aligned(table, 4)) return minfer_refuse("table must be 4-byte aligned");
    switch (type) {
        case GGML_F32: return launch<GGML_F32>(table, ids, out, n_tokens, d, n_rows, stream);
        case GGML_F16: return launch<GGML_F16>(table, ids, out, n_tokens, d, n_rows, stream);
        case GGML_Q4_0: return launch<GGML_Q4_0>(table, ids, out, n_tokens, d, n_rows, stream);
        case GGML_Q4_1: return launch<GGML_Q4_1>(table, ids, out, n_tokens, d, n_rows, stream);
        case GGML_Q5_0: return launch<GGML_Q5_0>(table, ids, out, n_tokens, d, n_rows, stream);
        case GGML_Q5_1: return launch<GGML_Q5_1>(table, ids, out, n_tokens, d, n_rows, stream);
        case GGML_Q8_0: return launch<GGML_Q8_0>(table, ids, out, n_tokens, d, n_rows, stream);
        case GGML_Q2_K: return launch<GGML_Q2_K>(table, ids, out, n_tokens, d, n_rows, stream);
        case GGML_Q3_K: return launch<GGML_Q3_K>(table, ids, out, n_tokens, d, n_rows, stream);
        case GGML_Q4_K: return launch<GGML_Q4_K>(table, ids, out, n_tokens, d, n_rows, stream);
        case GGML_Q5_K: return launch<GGML_Q5_K>(table, ids, out, n_tokens, d, n_rows, stream);
        case GGML_Q6_K: return launch<GGML_Q6_K>(table, ids, out, n_tokens, d, n_rows, stream);
        case GGML_IQ4_NL: return launch<GGML_IQ4_NL>(table, ids, out, n_tokens, d, n_rows, stream);
        case GGML_IQ4_XS: return launch<GGML_IQ4_XS>(table, ids, out, n_tokens, d, n_rows, stream);
        case GGML_BF16: return launch<GGML_BF16>(table, ids, out, n_tokens, d, n_rows, stream);
        default: return minfer_refuse("no embedding kernel for this GGML type");
    }
}
