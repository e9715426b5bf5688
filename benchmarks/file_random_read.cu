// SPDX-License-Identifier: MIT
// file_random_read: random 4 KiB reads within one large file, read by GPU
// threads through the file's extent map (`bam::array<T>(cache, storage,
// extent_map)`: a miss finds its page's blocks with a bisection over the
// file's runs), against the same pages read from the raw disk image by an
// array over the namespace (no lookup: the cost the lookup adds), and the
// same bytes in pinned host memory read zero-copy (the host link's
// ceiling). The file is written into a directory, packed into an ext4 image
// by mkfs.ext4 -d, its extents read from the image with libext2fs, and the
// image loaded onto a software controller's media (emu-gpu:ram, pinned host
// RAM served by the GPU engine: the stand-in for an SSD array). Every path
// reads the same pages in the same order; every word read is checked.
//
//   file_random_read --file-mib 4096 --cache-mib 256 --json out.json
#include <bam/bam.cuh>

#include "detail/file_corpus.hpp"
#include "detail/timing.cuh"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr std::uint64_t page_bytes = 4096;
constexpr std::uint64_t page_words = page_bytes / 4;

//! Words of a warp's page that differ from the file's (file page `fp`, copied to `buf`).
__device__ unsigned check_page(const std::uint32_t* buf, std::uint64_t fp, unsigned lane) {
  unsigned wrong = 0;
  for (std::uint64_t j = lane; j < page_words; j += 32)
    wrong += buf[j] != bench::large_file_word(fp * page_words + j);
  return wrong;
}

//! Warp k reads page k, k + warps, ... with fetch(k, buf, lane) (whole-warp,
//! false for a failed read) into its scratch page and checks it against
//! file page fp[k]; the words that differ are added to *bad.
template <class Fetch>
__device__ void read_and_check(const std::uint64_t* fp, std::uint64_t count, std::uint32_t* scratch,
                               unsigned long long* bad, Fetch fetch) {
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  std::uint32_t* buf = scratch + warp * page_words;
  unsigned long long wrong = 0;
  for (std::uint64_t k = warp; k < count; k += warps) {
    if (!fetch(k, buf, lane)) {
      wrong += page_words / 32; // a failed read: every word of the lane's share
      continue;
    }
    __syncwarp();
    wrong += check_page(buf, fp[k], lane);
    __syncwarp();
  }
  if (wrong != 0) atomicAdd(bad, wrong);
}

//! Pages at[k] of `a` through the cache (whole-warp copy_to).
__global__ void read_through_cache(bam::array_ref<std::uint32_t> a, const std::uint64_t* at, const std::uint64_t* fp,
                                   std::uint64_t count, std::uint32_t* scratch, unsigned long long* bad) {
  read_and_check(fp, count, scratch, bad, [&](std::uint64_t k, std::uint32_t* buf, unsigned) {
    return a.copy_to(at[k] * page_words, page_words, buf);
  });
}

//! The ceiling: the same pages straight from the file's bytes in pinned host memory.
__global__ void read_zero_copy(const uint4* host, const std::uint64_t* fp, std::uint64_t count, std::uint32_t* scratch,
                               unsigned long long* bad) {
  read_and_check(fp, count, scratch, bad, [&](std::uint64_t k, std::uint32_t* buf, unsigned lane) {
    const uint4* src = host + fp[k] * (page_bytes / 16);
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j)
      v[j] = __ldcg(src + j * 32 + lane);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      reinterpret_cast<uint4*>(buf)[j * 32 + lane] = v[j];
    return true;
  });
}

std::string gpu_name() {
  cudaDeviceProp p{};
  int d = 0;
  BAM_CUDA_TRY(cudaGetDevice(&d));
  BAM_CUDA_TRY(cudaGetDeviceProperties(&p, d));
  return p.name;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"file_random_read: random 4 KiB reads in one file through GPU-side extent lookups, against the raw "
               "image and zero-copy"};
  std::uint64_t file_mib = 4096, cache_mib = 256, pages_per_rep = 1u << 20;
  std::string dir, json_path, device = "emu-gpu:ram";
  unsigned blocks = 1024, threads = 256;
  int reps = 5;
  app.add_option("--file-mib", file_mib, "the file's size (default 4096)")->check(CLI::PositiveNumber);
  app.add_option("--cache-mib", cache_mib, "page cache of 4 KiB pages (default 256: mostly misses)");
  app.add_option("--pages", pages_per_rep, "random pages read per repetition (default 1 Mi)")
      ->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed repetitions after one warm-up (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--blocks", blocks, "thread blocks (default 1024)")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "threads per block, a multiple of 32 (default 256)")
      ->check(CLI::Validator(
          [](std::string& v) {
            const unsigned long t = std::strtoul(v.c_str(), nullptr, 10);
            return t > 0 && t <= 1024 && t % 32 == 0 ? std::string() : std::string("a multiple of 32 up to 1024");
          },
          "MULTIPLE OF 32"));
  app.add_option("--dir", dir, "scratch directory for the file and the image (default: a new one in /tmp)");
  app.add_option("--json", json_path, "write the results here");
  CLI11_PARSE(app, argc, argv);
  const std::string commit = std::getenv("BAM_COMMIT") ? std::getenv("BAM_COMMIT") : "unknown";
  namespace fs = std::filesystem;
  bool own_dir = false;
  if (dir.empty()) {
    std::string t = (fs::temp_directory_path() / "bam-file-random-XXXXXX").string();
    if (::mkdtemp(t.data()) == nullptr) bam::throw_errno("mkdtemp");
    dir = t;
    own_dir = true;
  }
  int rc = 0;
  try {
    const bench::large_file lf = bench::make_large_file(dir, file_mib << 20, 512);
    const bam::extent_map_ref m = lf.map.ref();
    const std::uint64_t file_pages = (file_mib << 20) / page_bytes;
    std::printf("file: %llu MiB in %llu run(s) of an ext4 image of %llu MiB\n",
                static_cast<unsigned long long>(file_mib), static_cast<unsigned long long>(m.runs),
                static_cast<unsigned long long>(lf.image_bytes >> 20));

    bam::storage st(device + "=" + std::to_string(lf.image_bytes >> 20) + "M");
    {
      std::ifstream f(lf.image, std::ios::binary);
      std::vector<char> chunk(64ull << 20);
      for (std::uint64_t at = 0; at < lf.image_bytes;) {
        f.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
        const auto got = static_cast<std::uint64_t>(f.gcount());
        if (got == 0) break;
        bam::emu::write_media(st, 0, at, chunk.data(), got);
        at += got;
      }
    }

    // The pages: uniform over the file; where each lies in the image, from the map on the host.
    const std::uint64_t count = pages_per_rep;
    std::vector<std::uint64_t> fp(count), ip(count);
    std::mt19937_64 rng(7);
    const std::uint64_t per_page = page_bytes / 512;
    for (std::uint64_t k = 0; k < count; ++k) {
      fp[k] = rng() % file_pages;
      const auto w = m.find(fp[k] * per_page);
      if (w.lba == bam::extent_hole || w.lba % per_page != 0 || w.blocks < per_page)
        throw bam::error("file page " + std::to_string(fp[k]) + " is not one aligned 4 KiB block of the image");
      ip[k] = w.lba / per_page;
    }
    bam::device_buffer<std::uint64_t> d_fp(count), d_ip(count);
    bam::copy_to_device(d_fp.get(), fp.data(), count);
    bam::copy_to_device(d_ip.get(), ip.data(), count);
    const std::uint64_t warps = static_cast<std::uint64_t>(blocks) * threads / 32;
    bam::device_buffer<std::uint32_t> scratch(warps * page_words);
    bam::device_buffer<unsigned long long> bad(1);

    nlohmann::json paths = nlohmann::json::array();
    auto run = [&](const std::string& what, auto launch, const bam::page_cache* cache) {
      BAM_CUDA_TRY(cudaMemset(bad.get(), 0, sizeof(unsigned long long)));
      launch(); // warm-up: the cache reaches its steady state
      BAM_CUDA_TRY(cudaDeviceSynchronize());
      const auto before = cache ? cache->counters() : bam::page_cache_counters{};
      std::vector<double> each; // seconds
      for (int r = 0; r < reps; ++r)
        each.push_back(bench::time_launch_ms(launch) / 1e3);
      std::vector<double> sorted = each;
      std::sort(sorted.begin(), sorted.end());
      const double s = sorted[sorted.size() / 2];
      unsigned long long wrong = 0;
      bam::copy_to_host(&wrong, bad.get(), 1);
      nlohmann::json p{{"what", what},
                       {"seconds", s},
                       {"seconds_each", each},
                       {"pages_per_s", static_cast<double>(count) / s},
                       {"GB_per_s", static_cast<double>(count * page_bytes) / s / 1e9},
                       {"bad_words", wrong}};
      if (cache) {
        const auto after = cache->counters();
        const double reads = static_cast<double>(count) * reps;
        p["hit_rate"] = 1.0 - static_cast<double>(after.misses - before.misses) / reads;
      }
      paths.push_back(p);
      rc |= wrong != 0;
    };

    const bam::page_cache_config cfg{.page_size = page_bytes, .capacity = cache_mib << 20};
    {
      bam::page_cache cache(cfg);
      bam::array<std::uint32_t> file(cache, st, lf.map);
      run(
          "bam: the file through its extent map (GPU-side lookup on each miss)",
          [&] {
            read_through_cache<<<blocks, threads>>>(file.ref(), d_fp.get(), d_fp.get(), count, scratch.get(),
                                                    bad.get());
          },
          &cache);
      file.check();
    }
    {
      bam::page_cache cache(cfg);
      bam::array<std::uint32_t> raw(cache, st, lf.image_bytes / 4);
      run(
          "bam: the same pages of the raw image (no lookup)",
          [&] {
            read_through_cache<<<blocks, threads>>>(raw.ref(), d_ip.get(), d_fp.get(), count, scratch.get(), bad.get());
          },
          &cache);
      raw.check();
    }
    {
      bam::pinned_buffer<std::uint32_t> host((file_mib << 20) / 4);
      std::ifstream f(lf.path, std::ios::binary);
      f.read(reinterpret_cast<char*>(host.get()), static_cast<std::streamsize>(file_mib << 20));
      if (static_cast<std::uint64_t>(f.gcount()) != (file_mib << 20)) throw bam::error("reading back " + lf.path);
      run(
          "zero-copy: the same pages from the file's bytes in pinned host memory",
          [&] {
            read_zero_copy<<<blocks, threads>>>(reinterpret_cast<const uint4*>(host.get()), d_fp.get(), count,
                                                scratch.get(), bad.get());
          },
          nullptr);
    }

    const double file_rate = paths[0]["GB_per_s"].get<double>();
    const double raw_rate = paths[1]["GB_per_s"].get<double>();
    const double zc_rate = paths[2]["GB_per_s"].get<double>();
    std::printf("%-72s %10s %8s %7s %9s\n", "path", "pages/s", "GB/s", "hits", "bad words");
    for (const auto& p : paths)
      std::printf("%-72s %10.3g %8.2f %6.1f%% %9llu\n", p["what"].get<std::string>().c_str(),
                  p["pages_per_s"].get<double>(), p["GB_per_s"].get<double>(),
                  p.contains("hit_rate") ? 100 * p["hit_rate"].get<double>() : 0.0,
                  static_cast<unsigned long long>(p["bad_words"].get<std::uint64_t>()));
    std::printf("file / raw image: %.3f; file / zero-copy: %.3f; raw / zero-copy: %.3f\n", file_rate / raw_rate,
                file_rate / zc_rate, raw_rate / zc_rate);

    if (!json_path.empty()) {
      nlohmann::json j;
      int driver = 0;
      BAM_CUDA_TRY(cudaDriverGetVersion(&driver));
      char date[64];
      const std::time_t now = std::time(nullptr);
      std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
      j["benchmark"] = "file_random_read";
      j["gpu"] = gpu_name();
      j["gpu_count"] = 1;
      j["driver"] = driver;
      j["commit"] = commit;
      j["date"] = date;
      j["device"] = device + "=" + std::to_string(lf.image_bytes >> 20) + "M";
      j["transport"] = st.transport_name();
      j["file_bytes"] = file_mib << 20;
      j["file_runs"] = m.runs;
      j["image_bytes"] = lf.image_bytes;
      j["page_size"] = page_bytes;
      j["cache_bytes"] = cache_mib << 20;
      j["pages_per_rep"] = count;
      j["reps"] = reps;
      j["blocks"] = blocks;
      j["threads"] = threads;
      j["paths"] = paths;
      j["file_over_raw"] = file_rate / raw_rate;
      j["file_over_zero_copy"] = file_rate / zc_rate;
      j["raw_over_zero_copy"] = raw_rate / zc_rate;
      std::ofstream(json_path) << j.dump(1) << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "file_random_read: %s\n", e.what());
    rc = 1;
  }
  if (own_dir) fs::remove_all(dir);
  return rc;
}
