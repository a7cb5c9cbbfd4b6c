// The 16-bit tensor-core instructions shared by the prefill GEMM (gemm.cu) and prefill attention (attention.cu):
// mma.sync.m16n8k16 (f16 or bf16 operands, float32 accumulators) and the ldmatrix loads that feed it from
// shared memory. They exist from sm_75 for f16 (where the k16 product is two k8 halves) and from sm_80 for
// bf16 (tensor_cores_multiply says which); a caller guards its uses with
// `#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750` or later, as these definitions are.
//
// Fragment layouts of mma.m16n8k16 with .f16 or .bf16 operands (the same for both) and .f32 accumulators
// (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"). Lane l of the warp has group
// g = l / 4 and thread-in-group t = l % 4; a 32-bit register holds two 16-bit values, the lower column (or k)
// index in its low half.
//   A, 16 x 16 (rows m, columns k), four registers:
//     a[0] = A[g][2t, 2t+1]       a[1] = A[g+8][2t, 2t+1]
//     a[2] = A[g][2t+8, 2t+9]     a[3] = A[g+8][2t+8, 2t+9]
//   B, 16 x 8 (rows k, columns n), two registers:
//     b[0] = B[2t, 2t+1][g]       b[1] = B[2t+8, 2t+9][g]
//   C and D, 16 x 8 float32, four registers:
//     c[0], c[1] = C[g][2t], C[g][2t+1]       c[2], c[3] = C[g+8][2t], C[g+8][2t+1]
// So each row of C lives in the four lanes of one quad (lanes 4g .. 4g + 3), and the C fragments of two
// n-adjacent 16 x 8 products, packed to f16 pairs, are exactly the A fragment of a 16 x 16 matrix:
// a[0] = C_left[0..1], a[1] = C_left[2..3], a[2] = C_right[0..1], a[3] = C_right[2..3].
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common.cuh"

namespace minfer {

__device__ __forceinline__ std::uint32_t half2_to_bits(__half2 pair) {
    return *reinterpret_cast<std::uint32_t*>(&pair);
}

// Whether the tensor cores of the architecture being compiled multiply Operand (__half or __nv_bfloat16):
// f16 from sm_75, bf16 from sm_80; false in the host pass.
template <class Operand>
__host__ __device__ constexpr bool tensor_cores_multiply() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return true;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
    return std::is_same_v<Operand, __half>;
#else
    return false;
#endif
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750

// Four 8 x 8 16-bit matrices from shared memory, each row 16 contiguous bytes (16-byte aligned). Lane l gives
// the address of row l % 8 of matrix l / 8 and receives in out[i], of matrix i, the two values of row l / 4
// at columns 2 (l % 4), 2 (l % 4) + 1.
__device__ __forceinline__ void load_matrix_x4(std::uint32_t (&out)[4], const void* row_address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
                 : "r"(shared_address(row_address)));
}

// The same four matrices transposed: lane l gives the same addresses and receives in out[i], of matrix i,
// the values of rows 2 (l % 4) and 2 (l % 4) + 1 at column l / 4 (the lower row in the low half).
__device__ __forceinline__ void load_matrix_x4_transposed(std::uint32_t (&out)[4], const void* row_address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
                 : "r"(shared_address(row_address)));
}

// acc (16 x 8, float32) += a (16 x 16, row-major fragment) * b (16 x 8, column-major fragment), both of
// Operand, f16 by default; bf16 where tensor_cores_multiply<__nv_bfloat16>() (sm_80 and later).
template <class Operand = __half>
__device__ __forceinline__ void mma_16x8x16(float (&acc)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
    static_assert(tensor_cores_multiply<Operand>(), "this architecture's tensor cores do not multiply Operand");
    if constexpr (std::is_same_v<Operand, __nv_bfloat16>) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
#if __CUDA_ARCH__ >= 800
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
        // sm_75: the same product as two k8 halves; a[0..1] and b[0] hold k 0-7, a[2..3] and b[1] hold k 8-15.
        asm volatile(
            "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
            : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
            : "r"(a[0]), "r"(a[1]), "r"(b[0]));
        asm volatile(
            "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
            : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
            : "r"(a[2]), "r"(a[3]), "r"(b[1]));
#endif
    }
}

#endif

}  // namespace minfer
