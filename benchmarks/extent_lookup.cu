// SPDX-License-Identifier: MIT
// extent_lookup: what translating file offsets to disk LBAs costs on the GPU
// (`bam::extent_map_ref::find`, a bisection over the file's runs), for maps
// of a few to many millions of runs. Every thread looks up random file
// blocks; the first lookup of every thread is checked on the host against
// a search written independently (std::upper_bound over the same runs).
//
//   extent_lookup                               # 1, 1 K, 1 M and 16 M runs
//   extent_lookup --runs 1000000 --json out.json
#include "detail/timing.cuh"

#include <bam/bam.cuh>
#include <bam/file/extent_map_ref.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

namespace {

BAM_HD std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

__global__ void lookup_kernel(bam::extent_map_ref m, std::uint32_t ops, std::uint64_t seed, std::uint64_t* first,
                              unsigned long long* sum) {
  const std::uint64_t tid = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  const std::uint64_t blocks = m.blocks();
  std::uint64_t acc = 0;
  for (std::uint32_t k = 0; k < ops; ++k) {
    const std::uint64_t b = mix(seed ^ (tid * 0x100000001b3ull + k)) % blocks;
    const bam::extent_map_ref::where w = m.find(b);
    if (k == 0) first[tid] = w.lba;
    acc += w.lba + w.blocks;
  }
  atomicAdd(sum, static_cast<unsigned long long>(acc)); // keeps the lookups
}

struct map_data {
  std::vector<std::uint64_t> start, lba;
};

//! `runs` runs of 1..256 blocks each, scattered over the disk; one in a
//! hundred a hole.
map_data make_map(std::uint64_t runs) {
  map_data d;
  d.start.reserve(runs + 1);
  d.lba.reserve(runs);
  std::uint64_t at = 0;
  for (std::uint64_t i = 0; i < runs; ++i) {
    d.start.push_back(at);
    d.lba.push_back(mix(i * 7 + 1) % 100 == 0 ? bam::extent_hole : (mix(i * 7 + 2) % (1ull << 40)) & ~7ull);
    at += 1 + mix(i * 7 + 3) % 256;
  }
  d.start.push_back(at);
  return d;
}

//! The LBA of `block` by the standard library's search (the reference).
std::uint64_t reference_lba(const map_data& d, std::uint64_t block) {
  const auto it = std::upper_bound(d.start.begin(), d.start.end(), block);
  const std::size_t r = static_cast<std::size_t>(it - d.start.begin()) - 1;
  return d.lba[r] == bam::extent_hole ? bam::extent_hole : d.lba[r] + (block - d.start[r]);
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"bam extent lookup: file offsets to disk LBAs on the GPU"};
  std::vector<std::uint64_t> run_counts = {1, 1000, 1000000, 16000000};
  std::uint64_t threads = 262144;
  std::uint32_t ops = 64;
  int reps = 5;
  std::string json;
  app.add_option("--runs", run_counts, "runs (extents) in the map; several values (1000,1000000) measure each")
      ->delimiter(',');
  app.add_option("--threads", threads, "GPU threads")->check(CLI::Range(256ull, 1ull << 26));
  app.add_option("--ops", ops, "lookups per thread per launch")->check(CLI::Range(1u, 1u << 20));
  app.add_option("--reps", reps, "timed launches (the median is reported)")->check(CLI::Range(1, 100));
  app.add_option("--json", json, "write the results here as JSON");
  CLI11_PARSE(app, argc, argv);
  try {
    nlohmann::json out;
    cudaDeviceProp prop{};
    int dev = 0, driver = 0;
    BAM_CUDA_TRY(cudaGetDevice(&dev));
    BAM_CUDA_TRY(cudaGetDeviceProperties(&prop, dev));
    BAM_CUDA_TRY(cudaDriverGetVersion(&driver));
    out["benchmark"] = "extent_lookup";
    out["gpu"] = prop.name;
    out["driver"] = driver;
    out["commit"] = std::getenv("BAM_COMMIT") ? std::getenv("BAM_COMMIT") : "unknown";
    char date[64];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    out["date"] = date;
    std::printf("%12s %12s %14s %10s %10s\n", "runs", "map MB", "lookups/s", "ns/lookup", "wrong");
    const unsigned block_threads = 256;
    const unsigned blocks = static_cast<unsigned>(threads / block_threads);
    threads = std::uint64_t{blocks} * block_threads;
    for (const std::uint64_t runs : run_counts) {
      if (runs == 0) throw std::runtime_error("--runs must be at least 1");
      const map_data d = make_map(runs);
      bam::device_buffer<std::uint64_t> start(d.start.size()), lba(d.lba.size()), first(threads);
      bam::device_buffer<unsigned long long> sum(1);
      BAM_CUDA_TRY(cudaMemcpy(start.get(), d.start.data(), d.start.size() * 8, cudaMemcpyHostToDevice));
      BAM_CUDA_TRY(cudaMemcpy(lba.get(), d.lba.data(), d.lba.size() * 8, cudaMemcpyHostToDevice));
      bam::extent_map_ref m;
      m.start = start.get();
      m.lba = lba.get();
      m.runs = runs;
      m.file_size = d.start.back() * 512;
      std::vector<float> times;
      std::uint64_t seed = 1;
      std::uint64_t wrong = 0;
      for (int r = -1; r < reps; ++r) {           // launch -1: the warm-up
        seed = mix(seed + 0x9e3779b97f4a7c15ull); // new blocks every launch
        const float ms = bench::time_launch_ms(
            [&] { lookup_kernel<<<blocks, block_threads>>>(m, ops, seed, first.get(), sum.get()); });
        if (r >= 0) times.push_back(ms / 1000.0f);
        std::vector<std::uint64_t> got(threads);
        bam::copy_to_host(got.data(), first.get(), threads);
        for (std::uint64_t t = 0; t < threads; ++t)
          wrong += got[t] != reference_lba(d, mix(seed ^ (t * 0x100000001b3ull)) % d.start.back());
      }
      std::sort(times.begin(), times.end());
      const double s = times[times.size() / 2];
      const double per_s = static_cast<double>(threads) * ops / s;
      const double map_mb = (d.start.size() + d.lba.size()) * 8 / 1e6;
      std::printf("%12llu %12.1f %14.3e %10.3f %10llu\n", static_cast<unsigned long long>(runs), map_mb, per_s,
                  1e9 / per_s, static_cast<unsigned long long>(wrong));
      out["results"].push_back({{"runs", runs},
                                {"map_bytes", (d.start.size() + d.lba.size()) * 8},
                                {"threads", threads},
                                {"lookups_per_launch", threads * ops},
                                {"seconds", s},
                                {"lookups_per_s", per_s},
                                {"checked", threads * (reps + 1)},
                                {"wrong", wrong}});
      if (wrong != 0) {
        std::fprintf(stderr, "extent_lookup: %llu lookups disagree with the reference\n",
                     static_cast<unsigned long long>(wrong));
        return 1;
      }
    }
    if (!json.empty()) std::ofstream(json) << out.dump(2) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
