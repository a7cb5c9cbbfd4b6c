// Hopper's warpgroup matrix multiply (wgmma.mma_async), for the prompt GEMM's warpgroup tiles (gemm.cu): four
// warps together (a warpgroup, 128 threads) multiply a 64 x 16 tile of A by a 16 x 128 tile of B into 64 x 128
// float32 accumulators in their registers, both operands read by the tensor cores straight from shared memory.
// It exists on sm_90a only, the arch-specific target of the H100 and H200 (MINFER_WGMMA below; the build compiles
// sm_90 as sm_90a, MinferCuda.cmake), and runs beside the threads: a caller arrives, issues, commits, may do other
// work that touches neither the accumulators nor the tiles being read, and waits.
//
// The operands' shared-memory layout (PTX ISA, "Matrix Descriptor Format", "Shared Memory Matrix Layout"): both
// K-major (a row of A is a token's values of x, a row of B one output feature's weights), a step's 32 values of
// a row in 64 bytes, rows 64 bytes apart, in the 64-byte swizzle: the 16-byte chunk c of row r sits at chunk
// c ^ ((r / 2) % 4) of its row, which repeats every 8 rows (512 bytes, the tile's start aligned to them). The
// swizzle puts the 8 rows' same chunk in 8 different bank groups, so neither the threads' 16-byte stores nor the
// tensor cores' reads of a column of chunks conflict (swizzled_chunk).
//
// Accumulator j (0..63) of lane l in warp w of the warpgroup holds row 16 w + l / 4 + 8 ((j / 2) % 2) and column
// 8 (j / 4) + 2 (l % 4) + j % 2 of the 64 x 128 tile: mma.m16n8's C fragment (mma.cuh), once per 8 columns, so
// a warp's accumulators are the [1][16][4] fragments of a 16 x 128 piece (gemm.cu's WarpgroupTiles).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MINFER_WGMMA 1
#endif

namespace minfer {

constexpr int SWIZZLED_ROW_BYTES = 64;    // a step's 32 16-bit values of a row
constexpr int SWIZZLE_ATOM_BYTES = 512;   // 8 rows: the swizzle's period, and a tile's alignment

// The chunk (16 bytes, 8 values) that holds chunk `chunk` (0..3) of row `row` in the 64-byte swizzle.
__host__ __device__ constexpr int swizzled_chunk(int row, int chunk) { return chunk ^ ((row / 2) % 4); }

#if defined(MINFER_WGMMA)

// The descriptor of a K-major operand tile in the 64-byte swizzle at shared address `address` (512-byte aligned,
// plus 32 bytes for the second 16 values of K): the start address, the leading-dimension offset (unused by a
// swizzled K-major operand: 1), the stride offset from one 8-row group to the next (512 bytes), all in 16-byte
// units, and the layout (2: the 64-byte swizzle).
__device__ __forceinline__ std::uint64_t swizzled_descriptor(unsigned address) {
    return static_cast<std::uint64_t>((address >> 4) & 0x3FFF) | (std::uint64_t(1) << 16) |
           (std::uint64_t(SWIZZLE_ATOM_BYTES >> 4) << 32) | (std::uint64_t(2) << 62);
}

// Orders this thread's earlier writes to shared memory (stores, cp.async's) before the tensor cores' reads of
// it by wgmma, which go through the async proxy; a barrier after it then covers every thread's.
__device__ __forceinline__ void shared_writes_to_async_proxy() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Before a warpgroup's first wgmma of a batch: its accumulator registers are ready to be read by the tensor cores.
__device__ __forceinline__ void warpgroup_arrive() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// Closes the wgmmas issued since the last commit into one group; they run on while the threads go on.
__device__ __forceinline__ void warpgroup_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Waits until every committed group has finished, then pins the accumulators: the empty asm "writes" each of
// them after the wait, so the compiler moves no read or copy of one to before it (the registers belong to the
// tensor cores until then).
__device__ __forceinline__ void warpgroup_wait(float (&d)[64]) {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define MINFER_WGMMA_64X128X16(TYPE)                                                                            \
    asm volatile(                                                                                               \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                          \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {"                                      \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                      \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                      \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                        \
        "}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                                                     \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),      \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),            \
          "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),            \
          "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),            \
          "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),            \
          "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),            \
          "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),            \
          "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                          \
        : "l"(a), "l"(b), "r"(1))

// d (this warpgroup's 64 x 128 float32) += A (64 x 16, descriptor a) * B^T (B: 128 rows x 16, descriptor b),
// Operand f16 or bf16 (both operands the same type), accumulating (the predicate scale-d true), neither operand
// transposed.
template <class Operand>
__device__ __forceinline__ void wgmma_64x128x16(float (&d)[64], std::uint64_t a, std::uint64_t b) {
    if constexpr (std::is_same_v<Operand, __nv_bfloat16>) {
        MINFER_WGMMA_64X128X16("bf16");
    } else {
        MINFER_WGMMA_64X128X16("f16");
    }
}

#undef MINFER_WGMMA_64X128X16

#endif  // MINFER_WGMMA

}  // namespace minfer
