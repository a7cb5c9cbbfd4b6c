"""The kernel launchers of ``minfer_kernels._C``, one per ``extern "C"`` launcher in ``csrc/kernels``.

Every launcher takes device pointers as ints (``DeviceBuffer.ptr``, plus a byte offset if you like; None
where a launcher allows an absent one: no norm weight, no bias, no residual), sizes as element counts,
and the stream to enqueue on as an int (``Stream.handle``; 0 is the legacy default stream). It returns
at once. It raises ``ValueError`` for arguments its kernel cannot handle (before launching),
``CudaError`` for a launch CUDA refuses, and ``CudaError(latched=True)`` when an earlier call or kernel
left an error behind. ``help(kernels.matmul)`` shows each one's signature; every argument has its C
parameter's name, so a call by name cannot pass one in another's place.

Activations are float32 and token-major ``[n_tokens][d]``; weights and embedding tables are raw GGUF
bytes with their GGML type id (``GGMLType``, built from ``TYPES``: the one list of the types every kernel
family reads). Rows on a grid's y axis (``rows``, ``n_tokens``) are at most 65535 per launch.
"""

from __future__ import annotations

from ._C import kernels as _kernels

#: ``mode`` of ``rope_f32``: llama.cpp's LLAMA rope (adjacent pairs 2i, 2i+1).
ROPE_NORMAL = 0
#: ``mode`` of ``rope_f32``: GGML_ROPE_TYPE_NEOX (pairs i, i + n_rot/2).
ROPE_NEOX = 2
#: ``attention_decode_f32``'s arguments after ``n_splits`` (q_norm, k_norm, head_eps, n_rot, inv_freq, mscale,
#: mode) where it norms nothing: q and the cache are read as they are.
NO_HEAD_NORM = (None, None, 0.0, 0, None, 1.0, ROPE_NORMAL)

add_f32 = _kernels.add_f32
mul_f32 = _kernels.mul_f32
scale_f32 = _kernels.scale_f32
silu_f32 = _kernels.silu_f32
gelu_f32 = _kernels.gelu_f32
softcap_f32 = _kernels.softcap_f32
slice_f32 = _kernels.slice_f32
swiglu_f32 = _kernels.swiglu_f32
geglu_f32 = _kernels.geglu_f32
add_bias_f32 = _kernels.add_bias_f32
rms_norm_f32 = _kernels.rms_norm_f32
rms_norm_add_f32 = _kernels.rms_norm_add_f32
rope_f32 = _kernels.rope_f32
embed_rows = _kernels.embed_rows
matmul = _kernels.matmul
gemv = _kernels.gemv
gemv_int8 = _kernels.gemv_int8
gemv_swiglu = _kernels.gemv_swiglu
gemv_geglu = _kernels.gemv_geglu
gemv_qkv_rope_store = _kernels.gemv_qkv_rope_store
gemm = _kernels.gemm
gemm_group = _kernels.gemm_group
gemm_splits = _kernels.gemm_splits
gemm_swiglu = _kernels.gemm_swiglu
gemm_geglu = _kernels.gemm_geglu
gemm_swiglu_workspace_bytes = _kernels.gemm_swiglu_workspace_bytes
gemm_workspace_bytes = _kernels.gemm_workspace_bytes
kv_store_f32 = _kernels.kv_store_f32
attention_decode_f32 = _kernels.attention_decode_f32
attention_decode_workspace_bytes = _kernels.attention_decode_workspace_bytes
attention_prefill_f32 = _kernels.attention_prefill_f32
attention_prefill_splits = _kernels.attention_prefill_splits
attention_prefill_workspace_bytes = _kernels.attention_prefill_workspace_bytes
argmax_f32 = _kernels.argmax_f32
argmax_workspace_bytes = _kernels.argmax_workspace_bytes
greedy_advance = _kernels.greedy_advance
toy_busy = _kernels.toy_busy  # for the tutorial only (csrc/kernels/toys.cu)
TYPES = _kernels.TYPES

__all__ = [
    "NO_HEAD_NORM",
    "ROPE_NEOX",
    "ROPE_NORMAL",
    "TYPES",
    "add_bias_f32",
    "add_f32",
    "argmax_f32",
    "argmax_workspace_bytes",
    "attention_decode_f32",
    "attention_decode_workspace_bytes",
    "attention_prefill_f32",
    "attention_prefill_splits",
    "attention_prefill_workspace_bytes",
    "embed_rows",
    "geglu_f32",
    "gelu_f32",
    "gemm",
    "gemm_geglu",
    "gemm_group",
    "gemm_splits",
    "gemm_swiglu",
    "gemm_swiglu_workspace_bytes",
    "gemm_workspace_bytes",
    "gemv",
    "gemv_geglu",
    "gemv_int8",
    "gemv_qkv_rope_store",
    "gemv_swiglu",
    "greedy_advance",
    "kv_store_f32",
    "matmul",
    "mul_f32",
    "rms_norm_add_f32",
    "rms_norm_f32",
    "rope_f32",
    "scale_f32",
    "silu_f32",
    "slice_f32",
    "softcap_f32",
    "swiglu_f32",
    "toy_busy",
]
