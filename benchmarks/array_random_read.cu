// SPDX-License-Identifier: MIT
// array_random_read: throughput of random 4 KiB reads through bam::array<float>
// (page cache + NVMe queues driven by GPU threads), for each medium of the
// software controller's GPU engine, next to the zero-copy ceiling measured in
// the same run: GPU threads gathering random 4 KiB blocks straight from
// pinned host memory.
//
//   array_random_read --json out.json
//   array_random_read --device emu-gpu:ram=8G --device emu-gpu:null=64G,iops=1M --json out.json
//
// Each warp reads one random 4 KiB page per step (32 lanes x 32 floats; the
// lanes share one cache reference). The working set is the whole namespace,
// many times the cache, so nearly every page is a miss and becomes one NVMe
// read. Reported: pages/s and GB/s of payload (4 KiB per page).
#include <bam/bam.cuh>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace {

__device__ std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void array_read_kernel(bam::array_ref<float> a, std::uint64_t pages, int steps, std::uint64_t seed,
                                  float* sink) {
  const std::uint64_t warp = (blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x) / 32;
  const unsigned lane = threadIdx.x % 32;
  float acc = 0;
  for (int s = 0; s < steps; ++s) {
    const std::uint64_t page = mix(seed ^ (warp * 1000003ull + s)) % pages;
    const std::uint64_t base = page * 1024;
#pragma unroll 4
    for (int k = 0; k < 32; ++k)
      acc += a[base + k * 32 + lane];
  }
  if (acc == 12345.0f) *sink = acc; // keeps the reads
}

// The ceiling: random 4 KiB blocks gathered from pinned host memory (zero-copy).
__global__ void gather_kernel(const uint4* src, std::uint64_t blocks, int steps, std::uint64_t seed, float* sink) {
  const std::uint64_t warp = (blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x) / 32;
  const unsigned lane = threadIdx.x % 32;
  unsigned acc = 0;
  for (int s = 0; s < steps; ++s) {
    const std::uint64_t b = mix(seed ^ (warp * 1000003ull + s)) % blocks;
    const uint4* p = src + b * 256; // 4 KiB = 256 x 16 B
    uint4 v[8];
#pragma unroll
    for (int k = 0; k < 8; ++k)
      v[k] = __ldcg(p + k * 32 + lane);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  if (acc == 0x12345678u) *sink = float(acc);
}

struct result {
  double seconds;
  double pages;
};

template <class Launch>
result measure(Launch&& launch, double pages_per_run, int reps) {
  launch(); // warm-up (and lazy module load)
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    launch();
    BAM_CUDA_TRY(cudaDeviceSynchronize());
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], pages_per_run};
}

std::string gpu_name() {
  cudaDeviceProp p{};
  int d = 0;
  cudaGetDevice(&d);
  cudaGetDeviceProperties(&p, d);
  return p.name;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"Random 4 KiB reads through bam::array<float>, per GPU-engine medium, next to the zero-copy ceiling"};
  std::vector<std::string> devices;
  std::string json_path;
  std::string commit = std::getenv("BAM_COMMIT") ? std::getenv("BAM_COMMIT") : "unknown";
  std::size_t cache_mib = 1024;
  int blocks = 2048, threads = 256, steps = 64, reps = 3;
  std::uint64_t ceiling_mib = 4096;
  app.add_option("--device", devices, "device strings (default: emu-gpu ram, hbm and null)");
  app.add_option("--json", json_path, "write the results as JSON here");
  app.add_option("--commit", commit, "commit id recorded in the JSON");
  app.add_option("--cache-mib", cache_mib, "page cache size");
  app.add_option("--blocks", blocks, "thread blocks");
  app.add_option("--threads", threads, "threads per block");
  app.add_option("--steps", steps, "pages read per warp");
  app.add_option("--reps", reps, "timed repetitions (median reported)");
  app.add_option("--ceiling-mib", ceiling_mib, "pinned host memory gathered by the ceiling kernel");
  CLI11_PARSE(app, argc, argv);
  if (devices.empty())
    devices = {"emu-gpu:ram=8G,queues=128,depth=256", "emu-gpu:hbm=8G,queues=128,depth=256",
               "emu-gpu:null=64G,queues=128,depth=256"};
  try {
    nlohmann::json out;
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    out["machine"] = host;
    out["gpu"] = gpu_name();
    out["commit"] = commit;
    out["benchmark"] = "array_random_read";
    out["page_bytes"] = 4096;
    out["cache_bytes"] = cache_mib << 20;
    out["threads"] = std::uint64_t(blocks) * threads;
    bam::device_buffer<float> sink(1);
    const std::uint64_t warps = std::uint64_t(blocks) * threads / 32;

    {
      // Ceiling: zero-copy random 4 KiB gathers from pinned host memory.
      bam::pinned_buffer<uint4> host(ceiling_mib << 16); // MiB / 16 B
      const std::uint64_t nblocks = (ceiling_mib << 20) / 4096;
      auto r = measure([&] { gather_kernel<<<blocks, threads>>>(host.get(), nblocks, steps, 1, sink.get()); },
                       double(warps) * steps, reps);
      const double bps = r.pages / r.seconds;
      std::printf("%-44s %10.2f M pages/s %8.2f GB/s\n", "ceiling: zero-copy gather, pinned host", bps / 1e6,
                  bps * 4096 / 1e9);
      out["ceiling"] = {{"what", "GPU zero-copy random 4 KiB gathers from pinned host memory"},
                        {"bytes", ceiling_mib << 20},
                        {"blocks_per_s", bps},
                        {"GB_per_s", bps * 4096 / 1e9}};
    }

    for (const auto& d : devices) {
      bam::storage dev(d);
      bam::page_cache cache({.page_size = 4096, .capacity = cache_mib << 20});
      const std::uint64_t n = dev.blocks_per_controller() * dev.controller_count() * dev.lba_size() / sizeof(float);
      bam::array<float> a(cache, dev, n);
      const std::uint64_t pages = n / 1024;
      std::uint64_t seed = 100;
      const std::uint64_t m0 = cache.counters().misses;
      auto r = measure([&] { array_read_kernel<<<blocks, threads>>>(a.ref(), pages, steps, ++seed, sink.get()); },
                       double(warps) * steps, reps);
      a.check();
      const std::uint64_t m1 = cache.counters().misses;
      const double runs = reps + 1;
      const double miss_ratio = double(m1 - m0) / (runs * warps * steps);
      const double pps = r.pages / r.seconds;
      std::printf("%-44s %10.2f M pages/s %8.2f GB/s  (misses %.1f%%)\n", d.c_str(), pps / 1e6, pps * 4096 / 1e9,
                  miss_ratio * 100);
      out["results"].push_back({{"device", d},
                                {"transport", dev.transport_name()},
                                {"media", bam::media_name(dev.spec().media)},
                                {"pages_per_s", pps},
                                {"GB_per_s", pps * 4096 / 1e9},
                                {"miss_ratio", miss_ratio},
                                {"seconds_median", r.seconds},
                                {"pages_per_run", r.pages}});
    }
    if (!json_path.empty()) {
      std::ofstream f(json_path);
      f << out.dump(2) << "\n";
      std::printf("wrote %s\n", json_path.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
