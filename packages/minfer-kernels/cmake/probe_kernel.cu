// The architecture probe (cmake/MinferCuda.cmake, minfer_probe_archs): compiled once per candidate sm_NN.
__global__ void minfer_arch_probe() {}
