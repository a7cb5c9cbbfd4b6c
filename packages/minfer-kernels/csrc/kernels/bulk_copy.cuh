// The copy engine's bulk copies into shared memory and the barriers (mbarrier) that say when they have landed
// (sm_90): a producer warp announces a stage's bytes on its `full` barrier and issues cp.async.bulk copies that
// complete on it; consumer warps wait on `full`, read the stage and arrive on its `empty` barrier, which the
// producer waits on before it refills the stage. Used by the integer tensor-core GEMV (gemv_int8.cu) and by
// the persistent-step probe (bench/layer_stream.cu).
//
// Each wrapper compiles to its instruction on sm_90+ and to a trap elsewhere: the kernels are compiled for
// every architecture of the fat binary, and their launchers launch them only on sm_90+.
#pragma once

#include <cstdint>

#include "common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MINFER_SM90 1
#else
#define MINFER_SM90 0
#endif

namespace minfer {

// A stage's barrier expecting `count` arrivals a phase (and, for `full`, the bytes its copies bring). Made
// visible to the copy engine by the fence, and to the other threads by a block barrier that follows.
__device__ __forceinline__ void init_arrival(std::uint64_t* barrier, unsigned count) {
#if MINFER_SM90
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(barrier)), "r"(count));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
    __trap();
#endif
}

// The stage's one arrival, announcing the bytes its copies will bring (before any of them is issued).
__device__ __forceinline__ void expect_bytes(std::uint64_t* barrier, unsigned bytes) {
#if MINFER_SM90
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)), "r"(bytes)
                 : "memory");
#else
    __trap();
#endif
}

// One arrival on `barrier` (a consumer warp's, done with a stage).
__device__ __forceinline__ void arrive(std::uint64_t* barrier) {
#if MINFER_SM90
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(barrier)) : "memory");
#else
    __trap();
#endif
}

// `bytes` (a multiple of 16) from `source` to `target` (both 16-byte aligned), completing on `barrier`.
__device__ __forceinline__ void copy_async(std::uint8_t* target, const std::uint8_t* source, unsigned bytes,
                                           std::uint64_t* barrier) {
#if MINFER_SM90
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            shared_address(target)),
        "l"(source), "r"(bytes), "r"(shared_address(barrier))
        : "memory");
#else
    __trap();
#endif
}

// Until `barrier` has completed the phase of parity `parity` (0, 1, 0, ... as the stage is reused).
__device__ __forceinline__ void wait_arrival(std::uint64_t* barrier, unsigned parity) {
#if MINFER_SM90
    unsigned done = 0;
    do {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(shared_address(barrier)), "r"(parity)
            : "memory");
    } while (!done);
#else
    __trap();
#endif
}

}  // namespace minfer
