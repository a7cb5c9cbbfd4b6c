// Where a decode attention launch's time goes, phase by phase and block by block: the measurement a change to
// attention.cu's decode kernel starts from (docs/PERFORMANCE.md, session 58). The timeline (tools/timeline.py) gives
// what the kernel adds to a step, the microbenchmark (bench_kernels.py --attention) its time alone; neither says
// whether the blocks' walks, the merge's round trips or the launch's skew make it.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -Icsrc/kernels -o /tmp/decode_attention_phases bench/decode_attention_phases.cu \
//       csrc/runtime.cpp && /tmp/decode_attention_phases      (in packages/minfer-kernels; any sm_70+ -arch)
//
// This file compiles attention.cu itself with MINFER_DECODE_PHASES defined, so the kernel's DECODE_PHASE marks call
// decode_phase below: thread 0 of each block adds the SM clock cycles since the block's previous mark to the
// mark's own sum (a tile's marks sum over the tiles the block walks) and stamps the global timer at the block's
// start and end. After a barrier thread 0's mark is the slowest warp's; tile_v has no barrier after it, so its time
// is thread 0's V pass, the slowest warp's rest falling into the next tile's tile_loads.
//
// For each family's shape at the splits its graph has on 132 SMs (binders.decode_attention_splits) and each depth,
// on an f16 cache: the launch's µs (events over back-to-back launches, overlapped as in a step), then one launch's
// blocks: how many walk rows, the span from the first block's start to the last one's end, when the last walking
// block is done and when the merge is, and each phase's cycles, the median over walking blocks and the merging
// block's own.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "check.cuh"

namespace minfer {

// attention.cu's DECODE_PHASE marks, in the order a block passes them.
enum class DecodePhase {
    start,
    idle,  // a split past the cache's end: the block returns
    prefetched,
    waited,
    head_normed,
    tile_loads,
    tile_scores,
    tile_softmax,
    tile_v,
    reduced,
    fenced,
    counted,
    merged,
    end,
    count
};
constexpr int PHASES = static_cast<int>(DecodePhase::count);
constexpr const char* PHASE_NAMES[PHASES] = {"start",       "idle",        "prefetched",   "waited",  "head_normed",
                                             "tile_loads",  "tile_scores", "tile_softmax", "tile_v",  "reduced",
                                             "fenced",      "counted",     "merged",       "end"};
constexpr int MAX_BLOCKS = 1024;

struct BlockPhases {
    long long cycles[PHASES];  // the cycles that end at each mark, summed over its passes
    int passes[PHASES];
    unsigned long long start_ns, end_ns;  // the global timer at the block's start and end
};
__device__ BlockPhases block_phases[MAX_BLOCKS];

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    return now;
}

__device__ __noinline__ void decode_phase(DecodePhase mark) {
    __shared__ long long last;
    if (threadIdx.x != 0) return;
    BlockPhases& block = block_phases[blockIdx.y * gridDim.x + blockIdx.x];
    const long long now = clock64();
    const int at = static_cast<int>(mark);
    if (mark == DecodePhase::start) {
        block.start_ns = global_ns();
    } else {
        block.cycles[at] += now - last;
    }
    block.passes[at] += 1;
    if (mark == DecodePhase::end || mark == DecodePhase::idle) block.end_ns = global_ns();
    last = now;
}

}  // namespace minfer

#define MINFER_DECODE_PHASES
#include "attention.cu"

namespace {

struct Family {
    const char* name;
    int n_heads, n_kv_heads, head_dim;
    bool head_norm;  // Qwen3 and Gemma 3: decode norms and rotates q and the newest k row itself
    int n_splits;    // binders.decode_attention_splits on 132 SMs
};

constexpr Family FAMILIES[] = {
    {"Qwen2.5-0.5B", 14, 2, 64, false, 64},
    {"Llama-3.2-1B", 32, 8, 64, false, 16},
    {"Qwen3-0.6B", 16, 8, 128, true, 16},
    {"Gemma 3 270M", 4, 1, 256, true, 128},
};
// tg128's middle rows at depth 0, 2048 and 8192.
constexpr int DEPTHS[] = {64, 2112, 8256};
constexpr int TIMED_LAUNCHES = 200;

double median(std::vector<double> values) {
    if (values.empty()) return 0.0;
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
}

template <typename T>
T* device_copy(const std::vector<T>& host) {
    T* device = nullptr;
    CHECK(cudaMalloc(&device, host.size() * sizeof(T)));
    CHECK(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    return device;
}

void measure(const Family& family, int kv_len, double cycles_per_us) {
    std::mt19937 random(1234);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int kv_dim = family.n_kv_heads * family.head_dim;
    std::vector<float> q(std::size_t(family.n_heads) * family.head_dim);
    for (float& value : q) value = normal(random);
    std::vector<__half> cache(std::size_t(kv_len) * kv_dim);
    for (__half& value : cache) value = __float2half(normal(random));
    std::vector<float> ones(family.head_dim, 1.0f);
    std::vector<double> inv_freq(family.head_dim / 2);
    for (int p = 0; p < family.head_dim / 2; ++p) inv_freq[p] = std::pow(1e6, -2.0 * p / family.head_dim);

    float* d_q = device_copy(q);
    __half* d_k = device_copy(cache);
    __half* d_v = device_copy(cache);
    int* d_kv_len = device_copy(std::vector<int>{kv_len});
    float* d_norm = family.head_norm ? device_copy(ones) : nullptr;
    double* d_inv_freq = family.head_norm ? device_copy(inv_freq) : nullptr;
    float* d_out = nullptr;
    CHECK(cudaMalloc(&d_out, q.size() * sizeof(float)));
    const std::size_t workspace_bytes =
        attention_decode_workspace_bytes(family.n_heads, family.head_dim, family.n_splits);
    float* d_workspace = nullptr;
    CHECK(cudaMalloc(&d_workspace, workspace_bytes));
    CHECK(cudaMemset(d_workspace, 0, workspace_bytes));

    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    const auto launch = [&] {
        const float scale = 1.0f / std::sqrt(float(family.head_dim));
        const int n_rot = family.head_norm ? family.head_dim : 0, mode = family.head_norm ? 2 : 0;  // NeoX
        CHECK(launch_attention_decode_f32(d_q, d_k, d_v, d_out, d_kv_len, d_workspace, family.n_heads,
                                          family.n_kv_heads, family.head_dim, kv_len, scale, 0, family.n_splits,
                                          d_norm, d_norm, 1e-6f, n_rot, d_inv_freq, 1.0f, mode, minfer::CACHE_F16,
                                          stream));
    };
    for (int i = 0; i < 20; ++i) launch();
    cudaEvent_t before, after;
    CHECK(cudaEventCreate(&before));
    CHECK(cudaEventCreate(&after));
    CHECK(cudaEventRecord(before, stream));
    for (int i = 0; i < TIMED_LAUNCHES; ++i) launch();
    CHECK(cudaEventRecord(after, stream));
    CHECK(cudaEventSynchronize(after));
    float elapsed_ms = 0.0f;
    CHECK(cudaEventElapsedTime(&elapsed_ms, before, after));

    // One launch's phases, from zeroed sums.
    const int blocks = family.n_splits * family.n_kv_heads;
    std::vector<minfer::BlockPhases> phases(blocks);
    CHECK(cudaMemcpyToSymbol(minfer::block_phases, phases.data(), blocks * sizeof(minfer::BlockPhases)));
    launch();
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemcpyFromSymbol(phases.data(), minfer::block_phases, blocks * sizeof(minfer::BlockPhases)));

    using minfer::DecodePhase;
    const auto at = [](DecodePhase mark) { return static_cast<int>(mark); };
    unsigned long long first_start = ~0ull, last_end = 0, last_walk_end = 0, merge_end = 0;
    int walking = 0, tiles = 0;
    const minfer::BlockPhases* merger = nullptr;
    std::vector<std::vector<double>> walker_cycles(minfer::PHASES);
    for (const minfer::BlockPhases& block : phases) {
        first_start = std::min(first_start, block.start_ns);
        last_end = std::max(last_end, block.end_ns);
        if (block.passes[at(DecodePhase::idle)] > 0) continue;
        ++walking;
        tiles = std::max(tiles, block.passes[at(DecodePhase::tile_loads)]);
        if (block.passes[at(DecodePhase::merged)] > 0) {
            merger = &block;
            merge_end = std::max(merge_end, block.end_ns);
        } else {
            last_walk_end = std::max(last_walk_end, block.end_ns);
        }
        for (int p = 0; p < minfer::PHASES; ++p) walker_cycles[p].push_back(double(block.cycles[p]));
    }
    std::printf("\n%s, %d rows, %d splits x %d KV heads: %.2f us a launch; %d blocks walk (at most %d tiles)\n",
                family.name, kv_len, family.n_splits, family.n_kv_heads, elapsed_ms * 1e3 / TIMED_LAUNCHES, walking,
                tiles);
    std::printf("  one launch: span %.2f us; the last walk done at %.2f us, the merge at %.2f us\n",
                (last_end - first_start) * 1e-3, last_walk_end ? (last_walk_end - first_start) * 1e-3 : 0.0,
                merge_end ? (merge_end - first_start) * 1e-3 : 0.0);
    std::printf("  %-13s %14s %14s\n", "phase", "walkers (med)", "the merger");
    for (int p = 1; p < minfer::PHASES; ++p) {
        if (p == at(DecodePhase::idle)) continue;
        const double walker = median(walker_cycles[p]);
        const double merging = merger ? double(merger->cycles[p]) : 0.0;
        if (walker == 0.0 && merging == 0.0) continue;
        std::printf("  %-13s %7.0f %5.2fus %7.0f %5.2fus\n", minfer::PHASE_NAMES[p], walker, walker / cycles_per_us,
                    merging, merging / cycles_per_us);
    }

    for (void* pointer : {static_cast<void*>(d_q), static_cast<void*>(d_k), static_cast<void*>(d_v),
                          static_cast<void*>(d_kv_len), static_cast<void*>(d_norm), static_cast<void*>(d_inv_freq),
                          static_cast<void*>(d_out), static_cast<void*>(d_workspace)})
        CHECK(cudaFree(pointer));
    CHECK(cudaEventDestroy(before));
    CHECK(cudaEventDestroy(after));
    CHECK(cudaStreamDestroy(stream));
}

}  // namespace

int main() {
    cudaDeviceProp properties{};
    CHECK(cudaGetDeviceProperties(&properties, 0));
    int clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    const double cycles_per_us = clock_khz * 1e-3;
    std::printf("decode attention's phases on %s (%d SMs; cycles, and us at its %.0f MHz clock), f16 cache\n",
                properties.name, properties.multiProcessorCount, cycles_per_us);
    for (const Family& family : FAMILIES)
        for (int kv_len : DEPTHS) measure(family, kv_len, cycles_per_us);
    return 0;
}
