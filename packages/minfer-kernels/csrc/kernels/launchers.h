// Every kernel launcher of libminfer_cuda.a: the seam between the kernels (csrc/kernels/*.cu, compiled by
// nvcc) and the binding (csrc/module.cpp, compiled by the host C++ compiler). Each family file includes
// this header, so a definition that drifts from its declaration does not compile.
//
// The contract every launcher keeps:
//   - it takes device pointers, sizes and the cudaStream_t to enqueue on, and returns at once;
//   - it returns cudaErrorInvalidValue, without launching, for arguments its kernel cannot handle, after
//     leaving the reason through minfer_refuse() (common.cuh);
//   - otherwise it returns cudaGetLastError() right after the launch, so a launch-configuration error
//     (a grid too large, a zero-sized grid) surfaces at this launch and not at a later sync;
//   - an error while the kernel runs (an out-of-bounds access, a __trap) can only surface later, at the
//     next sync() or CUDA call: the binding reports that as a latched error (csrc/runtime.cpp).
//
// Activations are float32, token-major [n_tokens][d], contiguous. Sizes are element counts.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

extern "C" {

// elementwise.cu
cudaError_t launch_add_f32(const float* a, const float* b, float* out, int n, cudaStream_t stream);
cudaError_t launch_mul_f32(const float* a, const float* b, float* out, int n, cudaStream_t stream);
cudaError_t launch_scale_f32(const float* x, float* out, float scale, int n, cudaStream_t stream);
cudaError_t launch_silu_f32(float* x, int n, cudaStream_t stream);
cudaError_t launch_gelu_f32(float* x, int n, cudaStream_t stream);
cudaError_t launch_softcap_f32(float* x, float cap, int n, cudaStream_t stream);
cudaError_t launch_slice_f32(const float* x, float* out, int rows, int width, int in_stride, int start,
                             cudaStream_t stream);
cudaError_t launch_swiglu_f32(const float* gate, const float* up, float* out, int rows, int d, int in_stride,
                              cudaStream_t stream);
cudaError_t launch_geglu_f32(const float* gate, const float* up, float* out, int rows, int d, int in_stride,
                             cudaStream_t stream);
cudaError_t launch_add_bias_f32(float* y, const float* bias, int rows, int d, cudaStream_t stream);

// norm.cu
cudaError_t launch_rms_norm_f32(const float* x, const float* weight, float* out, int rows, int d, float eps,
                                cudaStream_t stream);
// y[r] += rms_norm(x[r]) * weight over [rows][d] (Gemma's post-block norms into the residual); x must not alias y.
cudaError_t launch_rms_norm_add_f32(const float* x, const float* weight, float* y, int rows, int d, float eps,
                                    cudaStream_t stream);

// rope.cu. inv_freq: the device table of n_rot/2 pair frequencies (rope.cuh), mscale: the factor on cos and sin.
cudaError_t launch_rope_f32(float* x, const int* positions, int n_tokens, int n_heads, int head_dim, int n_rot,
                            const double* inv_freq, float mscale, int mode, cudaStream_t stream);

// embed.cu
cudaError_t launch_embed_rows(const void* table, int type, const int* ids, float* out, int n_tokens, int d,
                              int n_rows, cudaStream_t stream);

// matmul.cu. The GGML types every kernel family reads (ggml_formats.cuh: KERNEL_TYPES), by index.
int minfer_kernel_type_count();
const char* minfer_kernel_type_name(int index);
int minfer_kernel_type_id(int index);
long long minfer_row_bytes(int type, long long n_values);
cudaError_t launch_matmul(const void* weight, int type, const float* x, float* y, int in_features,
                          int out_features, int n_tokens, cudaStream_t stream);

// gemm.cu. A group is up to three products of one x (weights of one type; out_features 0: the part and the
// ones after it are absent), in one launch. Each part's y = x W^T + bias (bias nullptr: none); launch_gemm's
// y = residual + (x W^T + bias) (residual nullptr: none; it may be y itself, the add in place), the order of
// gemm, add_bias_f32 and add_f32 one after the other, so the result is theirs to the bit. Where the launch's
// tiles leave the GPU's block slots empty, K is cut into gemm_splits(...) slices (1: none) whose partial sums
// meet in `workspace`, then are added in slice order (deterministic). The workspace holds x rounded to 16 bits
// (once per launch: every tile of output features reads it), those partial sums, and, for a prompt of 256 tokens
// or more whose weights are neither F16 nor BF16, the weights decoded once to f16 rows: the launch needs
// gemm_workspace_bytes(...) bytes there, 16-byte aligned, for the same type, parts, in_features and n_tokens and
// the device's multiprocessor count.
int gemm_splits(int out_features_0, int out_features_1, int out_features_2, int in_features, int n_tokens,
                int multiprocessors);
long long gemm_workspace_bytes(int type, int out_features_0, int out_features_1, int out_features_2, int in_features,
                               int n_tokens, int multiprocessors);
cudaError_t launch_gemm(const void* weight, int type, const float* x, const float* bias, const float* residual,
                        float* y, int in_features, int out_features, int n_tokens, void* workspace,
                        long long workspace_bytes, cudaStream_t stream);
cudaError_t launch_gemm_group(const void* weight_0, const float* bias_0, float* y_0, int out_features_0,
                              const void* weight_1, const float* bias_1, float* y_1, int out_features_1,
                              const void* weight_2, const float* bias_2, float* y_2, int out_features_2, int type,
                              const float* x, int in_features, int n_tokens, void* workspace,
                              long long workspace_bytes, cudaStream_t stream);
// h[t][f] = silu((x Wgate^T)[t][f]) * (x Wup^T)[t][f] over [n_tokens][d_ff], gate and up of one GGML type (d_ff
// rows each), silu as swiglu_f32's: gemm's products, both in one tile, and swiglu_f32 on them; never split, so its
// workspace (gemm_swiglu_workspace_bytes(...) bytes, 16-byte aligned) holds the rounded x and, where gemm's would,
// the gate's and up's rows decoded to f16. gemm_geglu is the same with geglu_f32's tanh GELU for silu (Gemma),
// and the same workspace.
long long gemm_swiglu_workspace_bytes(int type, int in_features, int d_ff, int n_tokens);
cudaError_t launch_gemm_swiglu(const void* gate, const void* up, int type, const float* x, float* h, int in_features,
                               int d_ff, int n_tokens, void* workspace, long long workspace_bytes,
                               cudaStream_t stream);
cudaError_t launch_gemm_geglu(const void* gate, const void* up, int type, const float* x, float* h, int in_features,
                              int d_ff, int n_tokens, void* workspace, long long workspace_bytes, cudaStream_t stream);

// gemv.cu: one token. norm_weight may be nullptr (x used as is), as may residual and the biases. The
// parts of the fused projections are separate weights; Q, K and V may each have their own type. gemv_swiglu
// and gemv_geglu differ only in the gate's activation (silu, the tanh GELU). gemv_qkv_rope_store with n_rot 0
// rotates nothing (inv_freq may then be nullptr).
cudaError_t launch_gemv(const void* weight, int type, const float* x, const float* norm_weight, float eps,
                        const float* residual, float* y, int in_features, int out_features, cudaStream_t stream);
cudaError_t launch_gemv_swiglu(const void* gate, const void* up, int type, const float* x, const float* norm_weight,
                               float eps, float* out, int in_features, int d_ff, cudaStream_t stream);
cudaError_t launch_gemv_geglu(const void* gate, const void* up, int type, const float* x, const float* norm_weight,
                              float eps, float* out, int in_features, int d_ff, cudaStream_t stream);
cudaError_t launch_gemv_qkv_rope_store(const void* wq, int q_type, const void* wk, int k_type, const void* wv,
                                       int v_type, const float* x, const float* norm_weight, float eps,
                                       const float* bq, const float* bk, const float* bv, float* q, void* k_cache,
                                       void* v_cache, const int* positions, int in_features, int n_heads,
                                       int n_kv_heads, int head_dim, int n_rot, const double* inv_freq,
                                       float mscale, int mode, int n_ctx, int cache_type, cudaStream_t stream);

// gemv_int8.cu: gemv's function on the integer tensor cores, for the quantized types on sm_90+ (gemv.cu's
// launchers send every launch it takes there themselves; this is the path alone).
cudaError_t launch_gemv_int8(const void* weight, int type, const float* x, const float* norm_weight, float eps,
                             const float* residual, float* y, int in_features, int out_features, cudaStream_t stream);

// attention.cu. The KV caches ([n_ctx][n_kv_heads * head_dim]) hold cache_type, a GGML type id: 0 F32, or 1 F16
// (kv_cache.cuh: stored rounded to nearest even; read widened to float32, but by the tensor-core prefill, whose
// operands are f16); any other is refused. The same id goes to gemv_qkv_rope_store, which stores k and v there too.
cudaError_t launch_kv_store_f32(const float* k, const float* v, void* k_cache, void* v_cache,
                                const int* positions, int n_tokens, int kv_dim, int n_ctx, int cache_type,
                                cudaStream_t stream);
std::size_t attention_decode_workspace_bytes(int n_heads, int head_dim, int n_splits);
// Decode: the one query (the newest token, at position kv_len[0] - 1) over cache rows 0..kv_len[0]-1 (the last
// `window` of them; 0: all), the rows cut into n_splits pieces merged through the workspace
// (attention_decode_workspace_bytes(...) bytes, zeroed once: the launch leaves it so). q_norm and k_norm both
// nullptr: q and the cache are read as they are, and k_cache is not written (the other arguments after n_splits
// are then ignored). Both given (Qwen3, Gemma 3: head_dim weights each): q and the newest row, k_cache[kv_len[0]
// - 1], hold raw projections; each head of both is first RMS-normed over its head_dim values with head_eps
// (x / sqrt(mean(x^2) + head_eps) * weight), then rotated as rope_f32 rotates at position kv_len[0] - 1 (n_rot:
// even, 0..head_dim, 0 rotating nothing; inv_freq: n_rot/2 doubles, nullptr only where n_rot is 0; mscale;
// mode 0 normal or 2 NeoX). q in device memory stays raw; the newest row is normed and rotated in place, so a
// second launch over the same kv_len would norm it twice: the row must be stored raw before each such launch.
cudaError_t launch_attention_decode_f32(const float* q, void* k_cache, const void* v_cache, float* out,
                                        const int* kv_len, float* workspace, int n_heads, int n_kv_heads,
                                        int head_dim, int n_ctx, float scale, int window, int n_splits,
                                        const float* q_norm, const float* k_norm, float head_eps, int n_rot,
                                        const double* inv_freq, float mscale, int mode, int cache_type,
                                        cudaStream_t stream);
// Prefill: query t over cache rows 0..positions[t] (the last `window` of them; 0: all). Where its query tiles
// leave the GPU's block slots empty, each tile's rows are cut into attention_prefill_splits(...) slices (1:
// none) whose partial states meet in `workspace`, then merge in slice order (deterministic; the workspace need
// not start zeroed); the launch needs attention_prefill_workspace_bytes(...) bytes there (0 when it does not
// split: workspace may then be nullptr), for the same n_tokens, n_heads, head_dim and max_rows and the device's
// multiprocessor count. max_rows, 1..n_ctx, bounds the rows any query sees (the largest position + 1, or n_ctx
// when the caller does not know it): it only sets the slice count, each slice's rows come from the positions on
// the device, so a smaller true depth leaves slices empty, never wrong. (Before sm_80 the float32 kernel takes
// every head size and splits nothing: the workspace then goes unused.)
int attention_prefill_splits(int n_tokens, int n_heads, int head_dim, int max_rows, int multiprocessors);
long long attention_prefill_workspace_bytes(int n_tokens, int n_heads, int head_dim, int max_rows,
                                            int multiprocessors);
cudaError_t launch_attention_prefill_f32(const float* q, const void* k_cache, const void* v_cache, float* out,
                                         const int* positions, int n_tokens, int n_heads, int n_kv_heads,
                                         int head_dim, int n_ctx, int max_rows, float scale, int window,
                                         float* workspace, long long workspace_bytes, int cache_type,
                                         cudaStream_t stream);

// sample.cu. argmax: out[r] = the index of row r's largest value (lowest on ties), -1 if the row holds NaN/+-Inf.
std::size_t argmax_workspace_bytes(int rows, int n);
cudaError_t launch_argmax_f32(const float* x, int* out, void* workspace, int rows, int n, cudaStream_t stream);
// greedy_advance: picks[*step] = token[0] (a -1 pick also makes token[0] 0), then *step, positions[0] and
// kv_len[0] grow by one: a greedy decode step's pick made the next step's inputs, on the device.
cudaError_t launch_greedy_advance(int* token, int* picks, int* step, int* positions, int* kv_len, int capacity,
                                  cudaStream_t stream);

// toys.cu: for the tutorial only (docs/tutorial/toys/streams.py); no graph op uses it.
cudaError_t launch_toy_busy(long long* out, long long cycles, int blocks, cudaStream_t stream);

}  // extern "C"
