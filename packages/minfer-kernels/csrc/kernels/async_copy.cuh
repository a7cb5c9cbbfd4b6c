// Copies from global to shared memory that run while the thread goes on: sm_80's cp.async, 16 bytes each. The
// prompt GEMM (gemm.cu) fills its shared-memory stages of operands that need no decoding this way (x rounded to
// 16 bits, F16 and BF16 weights): no registers hold them on the way, so the copies can run several steps ahead.
//
// A thread issues a stage's copies, closes them into a group (commit_copies), and later waits until at most N of
// its groups are still in flight (wait_for_copies<N>); only a barrier after that wait makes every thread's copies
// visible to the whole block. Before sm_80 the copy is a plain 16-byte load and store, finished when it returns,
// and commit and wait do nothing: the same results, without the overlap.
#pragma once

#include <cstdint>

#include "common.cuh"

namespace minfer {

// 16 bytes from `global` to `shared` (both 16-byte aligned), or 16 zero bytes where !valid: cp.async's zero fill,
// a source size of 0, which reads nothing at `global` (callers still pass an address inside the tensor).
__device__ __forceinline__ void copy_16_async(void* shared, const void* global, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
                 "r"(valid ? 16 : 0)
                 : "memory");
#else
    *reinterpret_cast<uint4*>(shared) = valid ? *reinterpret_cast<const uint4*>(global) : make_uint4(0, 0, 0, 0);
#endif
}

// Closes the copies this thread issued since the last commit into one group (an empty group if none).
__device__ __forceinline__ void commit_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Returns once at most N of this thread's committed groups are still in flight: the older ones have landed.
template <int N>
__device__ __forceinline__ void wait_for_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

}  // namespace minfer
