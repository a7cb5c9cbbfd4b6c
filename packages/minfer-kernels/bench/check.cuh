// CHECK(call): the standalone probes' (layer_stream.cu, wgmma_probe.cu) one way to stop on a failed CUDA call,
// naming the call, its file and line, and CUDA's error string.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                                                        \
    do {                                                                                                   \
        const cudaError_t status = (call);                                                                 \
        if (status != cudaSuccess) {                                                                       \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(status)); \
            std::exit(1);                                                                                  \
        }                                                                                                  \
    } while (0)
