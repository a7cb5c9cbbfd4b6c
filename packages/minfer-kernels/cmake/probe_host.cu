// The host-compiler probe (cmake/MinferCuda.cmake, minfer_probe_host_compiler). A host compiler newer than
// this CUDA supports fails inside the standard headers, so the probe includes some, as the kernels do.
#include <cmath>
#include <cstdint>
#include <cuda_fp16.h>

__global__ void minfer_host_probe(float* x) { x[threadIdx.x] = sqrtf(x[threadIdx.x]); }

float minfer_host_probe_cpu(float x) { return std::sqrt(x); }
