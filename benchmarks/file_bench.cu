// SPDX-License-Identifier: MIT
// Many files read whole, by index, in random batches: the data loader of an
// image corpus (ImageNet-shaped by default: 110 KiB files on average, sizes
// log-normal). The files are made in a directory, packed into an ext4 image
// by mkfs.ext4 -d, and the image is loaded onto a software controller's media
// (emu-gpu:ram, pinned host RAM served by the GPU engine). Measured in the
// same run, over the same files and the same batches:
//   bam          bam::file_array::gather_files through the page cache, cold
//                (every page a miss: the cache is smaller than an epoch);
//   zero-copy    a warp per file copying its bytes from pinned host memory
//                where they lie packed (the host link's ceiling for the same
//                bytes, knowing where every file is);
//   cpu-loader   host threads open, read and close each file of the batch
//                from the file system (files hot in the OS page cache) into
//                pinned memory, then one copy to the GPU per batch: what a
//                PyTorch DataLoader does, at its best;
//   kvikio       KvikIO (when the build has it) opening each file of the
//                batch and reading it whole into GPU memory with its thread
//                pool (as many threads as the CPU loader), every read of the
//                batch in flight at once: the GPUDirect Storage family's
//                loader (compat mode where GDS is absent).
// With --cold the CPU loader and KvikIO run again after the OS page cache
// is dropped (needs root, and --dir on a disk: tmpfs stays in memory): the
// files then come from the machine's disk.
// Every byte bam, zero-copy and KvikIO deliver is checked on the GPU; the
// CPU loader's on the host.
//
//   file_bench --files 10000 --batch 512 --json out.json
#include <bam/bam.cuh>

#include "detail/file_corpus.hpp"
#include "detail/kvikio_files.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

struct options {
  bench::corpus_options corpus;
  std::uint64_t batch = 512;
  std::uint64_t cache_mib = 256;
  std::uint32_t page_size = 65536;
  unsigned threads = 16;
  bool cold = false;
  std::string device = "emu-gpu:ram";
  std::string json;
  std::string commit;
};

//! Bytes of the batch's files that differ from corpus_byte (file k at out + offsets[k]).
__global__ void check_batch(const std::uint8_t* out, const std::uint64_t* offsets, const std::uint64_t* sizes,
                            const std::uint64_t* ids, std::uint64_t count, unsigned long long* bad) {
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  unsigned long long wrong = 0;
  for (std::uint64_t k = warp; k < count; k += warps)
    for (std::uint64_t b = lane; b < sizes[k]; b += 32)
      wrong += out[offsets[k] + b] != bench::corpus_byte(ids[k], b);
  if (wrong != 0) atomicAdd(bad, wrong);
}

//! The zero-copy ceiling: a warp per file, its bytes from pinned host memory (`host + where[k]`).
__global__ void zero_copy_batch(const std::uint8_t* host, const std::uint64_t* where, const std::uint64_t* sizes,
                                std::uint64_t count, std::uint8_t* out, const std::uint64_t* offsets) {
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  for (std::uint64_t k = warp; k < count; k += warps) {
    const std::uint8_t* src = host + where[k];
    std::uint8_t* dst = out + offsets[k];
    const std::uint64_t n = sizes[k];
    const std::uint64_t words = n / 16; // both 16-byte aligned
    for (std::uint64_t w = lane; w < words; w += 32)
      reinterpret_cast<uint4*>(dst)[w] = reinterpret_cast<const uint4*>(src)[w];
    for (std::uint64_t b = words * 16 + lane; b < n; b += 32)
      dst[b] = src[b];
  }
}

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

struct batch_plan {
  std::vector<std::vector<std::uint64_t>> ids;     //!< set indices per batch
  std::vector<std::vector<std::uint64_t>> offsets; //!< where each file goes in the batch's buffer
  std::vector<std::uint64_t> bytes;                //!< the buffer's bytes per batch
  std::uint64_t max_bytes = 0;
  std::uint64_t file_bytes = 0; //!< of every file read
};

nlohmann::json path_json(const std::string& what, double seconds, const batch_plan& p, std::uint64_t files,
                         std::uint64_t bad) {
  return {{"what", what},
          {"seconds", seconds},
          {"files_per_s", static_cast<double>(files) / seconds},
          {"GB_per_s", static_cast<double>(p.file_bytes) / seconds / 1e9},
          {"bad_bytes", bad}};
}

//! Writes back dirty pages and drops the OS page cache (root only) so that
//! the files under `dir` are read from their disk: returns "" when done,
//! else why not (also when `dir` is in memory, which no drop makes cold).
std::string drop_os_page_cache(const std::string& dir) {
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0) return dir + ": " + std::strerror(errno);
  if (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC)
    return dir + " is on a file system in memory (tmpfs or ramfs), which dropping the page cache does not make "
                 "cold: give --dir on a disk";
  ::sync();
  const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return std::string("/proc/sys/vm/drop_caches: ") + std::strerror(errno);
  const bool ok = ::write(fd, "3\n", 2) == 2;
  const int e = errno;
  ::close(fd);
  return ok ? "" : std::string("/proc/sys/vm/drop_caches: ") + std::strerror(e);
}

} // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"file_bench: many files read whole, by index, in random batches (bam, zero-copy, a CPU loader, KvikIO)"};
  app.add_option("--files", o.corpus.files, "files in the corpus (default 20000)");
  app.add_option("--mean-bytes", o.corpus.mean_bytes, "mean file size in bytes (default 112640)");
  app.add_option("--seed", o.corpus.seed, "seed of the sizes and the batches");
  app.add_option("--dir", o.corpus.dir, "scratch directory for the files and the image (default: a new one in /tmp)");
  app.add_option("--batch", o.batch, "files per batch (default 512)");
  app.add_option("--cache-mib", o.cache_mib, "page cache (default 256 MiB: far less than an epoch)");
  app.add_option("--page-size", o.page_size, "cache page size (default 65536)");
  app.add_option("--threads", o.threads, "threads of the CPU loader and of KvikIO's pool (default 16)");
  app.add_flag("--cold", o.cold, "also run the CPU loader and KvikIO after dropping the OS page cache (root)");
  app.add_option("--json", o.json, "write the results here");
  CLI11_PARSE(app, argc, argv);
  o.commit = std::getenv("BAM_COMMIT") ? std::getenv("BAM_COMMIT") : "unknown";
  // KvikIO holds a descriptor per file of a batch until the batch ends.
  if (rlimit nofile{}; ::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &nofile);
  }
  namespace fs = std::filesystem;
  bool own_dir = false;
  if (o.corpus.dir.empty()) {
    std::string t = (fs::temp_directory_path() / "bam-file-bench-XXXXXX").string();
    if (::mkdtemp(t.data()) == nullptr) bam::throw_errno("mkdtemp");
    o.corpus.dir = t;
    own_dir = true;
  }
  try {
    auto t0 = clock_type::now();
    const bench::corpus c = bench::make_corpus(o.corpus, 512);
    const double make_s = seconds_since(t0);
    const std::uint64_t n = c.set.size();
    std::printf("corpus: %llu files, %.2f GiB of file bytes, image %.2f GiB (made in %.1f s)\n",
                static_cast<unsigned long long>(n), static_cast<double>(c.set.total_bytes()) / (1ull << 30),
                static_cast<double>(c.image_bytes) / (1ull << 30), make_s);

    // The image onto the software controller's media.
    const std::uint64_t media = (c.image_bytes + (1ull << 20) - 1) / (1ull << 20);
    bam::storage st(o.device + "=" + std::to_string(media) + "M");
    {
      std::ifstream f(c.image, std::ios::binary);
      std::vector<char> chunk(64ull << 20);
      for (std::uint64_t at = 0; at < c.image_bytes;) {
        f.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
        const auto got = static_cast<std::uint64_t>(f.gcount());
        if (got == 0) break;
        bam::emu::write_media(st, 0, at, chunk.data(), got);
        at += got;
      }
    }

    // The batches: every file once, in a random order.
    batch_plan plan;
    std::vector<std::uint64_t> order(n);
    std::iota(order.begin(), order.end(), std::uint64_t{0});
    std::shuffle(order.begin(), order.end(), std::mt19937_64(o.corpus.seed + 1));
    bam::page_cache cache({.page_size = o.page_size, .capacity = o.cache_mib << 20});
    bam::file_array files(cache, st, c.set);
    for (std::uint64_t b = 0; b < n; b += o.batch) {
      plan.ids.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(b),
                            order.begin() + static_cast<std::ptrdiff_t>(std::min(n, b + o.batch)));
      plan.offsets.emplace_back();
      plan.bytes.push_back(files.packed_offsets(plan.ids.back(), plan.offsets.back()));
      plan.max_bytes = std::max(plan.max_bytes, plan.bytes.back());
      for (const auto i : plan.ids.back())
        plan.file_bytes += files.size(i);
    }
    const std::uint64_t nb = plan.ids.size();
    // Per batch on the GPU: ids, offsets, sizes and corpus ids (for the check).
    std::vector<std::uint64_t> flat_ids, flat_off, flat_size, flat_cid, first{0};
    for (std::uint64_t b = 0; b < nb; ++b) {
      for (std::size_t k = 0; k < plan.ids[b].size(); ++k) {
        flat_ids.push_back(plan.ids[b][k]);
        flat_off.push_back(plan.offsets[b][k]);
        flat_size.push_back(files.size(plan.ids[b][k]));
        flat_cid.push_back(c.file_ids[plan.ids[b][k]]);
      }
      first.push_back(flat_ids.size());
    }
    bam::device_buffer<std::uint64_t> d_ids(n), d_off(n), d_size(n), d_cid(n);
    bam::copy_to_device(d_ids.get(), flat_ids.data(), n);
    bam::copy_to_device(d_off.get(), flat_off.data(), n);
    bam::copy_to_device(d_size.get(), flat_size.data(), n);
    bam::copy_to_device(d_cid.get(), flat_cid.data(), n);
    bam::device_buffer<std::uint8_t> out(plan.max_bytes);
    bam::device_buffer<unsigned long long> bad(1);
    cudaStream_t s = nullptr;
    BAM_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    BAM_CUDA_TRY(cudaEventCreate(&e0));
    BAM_CUDA_TRY(cudaEventCreate(&e1));
    constexpr unsigned threads = 256;
    auto grid = [&](std::uint64_t count) {
      return static_cast<unsigned>(std::min<std::uint64_t>((count * 32 + threads - 1) / threads, 1u << 15));
    };
    auto bad_bytes = [&] {
      unsigned long long v = 0;
      bam::copy_to_host(&v, bad.get(), 1, s);
      return static_cast<std::uint64_t>(v);
    };
    // One epoch: `read(b)` fills `out` with batch b; each batch is checked on the GPU after it.
    auto epoch = [&](auto read) {
      BAM_CUDA_TRY(cudaMemsetAsync(bad.get(), 0, sizeof(unsigned long long), s));
      float ms_total = 0;
      for (std::uint64_t b = 0; b < nb; ++b) {
        const std::uint64_t f = first[b], cnt = first[b + 1] - first[b];
        BAM_CUDA_TRY(cudaEventRecord(e0, s));
        read(b, f, cnt);
        BAM_CUDA_TRY(cudaEventRecord(e1, s));
        check_batch<<<grid(cnt), threads, 0, s>>>(out.get(), d_off.get() + f, d_size.get() + f, d_cid.get() + f, cnt,
                                                  bad.get());
        BAM_CUDA_TRY(cudaEventSynchronize(e1));
        float ms = 0;
        BAM_CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
        ms_total += ms;
      }
      BAM_CUDA_TRY(cudaStreamSynchronize(s));
      return static_cast<double>(ms_total) / 1e3;
    };

    nlohmann::json paths = nlohmann::json::array();
    // bam: a cold cache each epoch (the cache is smaller than the files: every page a miss).
    const double bam_s = epoch([&](std::uint64_t, std::uint64_t f, std::uint64_t cnt) {
      files.gather_files(d_ids.get() + f, cnt, out.get(), d_off.get() + f, s);
    });
    files.check(s);
    const auto counters = cache.counters(s);
    paths.push_back(path_json("bam::file_array::gather_files through the page cache", bam_s, plan, n, bad_bytes()));
    paths.back()["cache_misses"] = counters.misses;

    // zero-copy: the files packed 16-byte aligned in pinned host memory.
    {
      std::vector<std::uint64_t> where(n);
      std::uint64_t at = 0;
      for (std::uint64_t i = 0; i < n; ++i) {
        where[i] = at;
        at = (at + files.size(i) + 15) & ~std::uint64_t{15};
      }
      bam::pinned_buffer<std::uint8_t> host(at);
      for (std::uint64_t i = 0; i < n; ++i)
        for (std::uint64_t k = 0; k < files.size(i); ++k)
          host.get()[where[i] + k] = bench::corpus_byte(c.file_ids[i], k);
      std::vector<std::uint64_t> flat_where(n);
      for (std::uint64_t k = 0; k < n; ++k)
        flat_where[k] = where[flat_ids[k]];
      bam::device_buffer<std::uint64_t> d_where(n);
      bam::copy_to_device(d_where.get(), flat_where.data(), n);
      const double zc_s = epoch([&](std::uint64_t, std::uint64_t f, std::uint64_t cnt) {
        zero_copy_batch<<<grid(cnt), threads, 0, s>>>(host.get(), d_where.get() + f, d_size.get() + f, cnt, out.get(),
                                                      d_off.get() + f);
      });
      paths.push_back(path_json("zero-copy: a warp per file from pinned host memory (the files packed)", zc_s, plan, n,
                                bad_bytes()));
    }

    // The CPU loader: threads read the batch's files into pinned memory, one copy to the GPU.
    bam::pinned_buffer<std::uint8_t> staging(plan.max_bytes);
    auto cpu_loader = [&](const std::string& how) {
      std::atomic<std::uint64_t> host_bad{0};
      const auto t = clock_type::now();
      for (std::uint64_t b = 0; b < nb; ++b) {
        std::atomic<std::uint64_t> next{0};
        std::vector<std::thread> pool;
        for (unsigned w = 0; w < o.threads; ++w)
          pool.emplace_back([&] {
            for (std::uint64_t k; (k = next.fetch_add(1)) < plan.ids[b].size();) {
              const std::uint64_t i = plan.ids[b][k];
              const int fd = ::open(c.paths[i].c_str(), O_RDONLY | O_CLOEXEC);
              std::uint64_t got = 0;
              if (fd >= 0) {
                for (ssize_t r; got < files.size(i) && (r = ::pread(fd, staging.get() + plan.offsets[b][k] + got,
                                                                    files.size(i) - got, static_cast<off_t>(got))) > 0;)
                  got += static_cast<std::uint64_t>(r);
                ::close(fd);
              }
              if (got != files.size(i)) host_bad.fetch_add(files.size(i) - got);
            }
          });
        for (auto& th : pool)
          th.join();
        BAM_CUDA_TRY(cudaMemcpyAsync(out.get(), staging.get(), plan.bytes[b], cudaMemcpyHostToDevice, s));
        BAM_CUDA_TRY(cudaStreamSynchronize(s));
      }
      const double cpu_s = seconds_since(t);
      // Its bytes: checked on the host for the last batch (the others went the same way).
      std::uint64_t wrong = host_bad.load();
      const std::uint64_t lb = nb - 1;
      for (std::size_t k = 0; k < plan.ids[lb].size(); ++k)
        for (std::uint64_t x = 0; x < files.size(plan.ids[lb][k]); ++x)
          wrong += staging.get()[plan.offsets[lb][k] + x] != bench::corpus_byte(c.file_ids[plan.ids[lb][k]], x);
      paths.push_back(path_json("CPU loader: threads open/read/close each file (" + how +
                                    ") into pinned memory, one copy per batch",
                                cpu_s, plan, n, wrong));
    };
    // KvikIO: its pool reads the batch's files into GPU memory; each batch checked on the GPU (not timed).
    const std::string kvikio_why = bench::kvikio_files_setup(o.threads);
    auto kvikio_loader = [&](const std::string& how) {
      const std::string what = "KvikIO: FileHandle::pread of each file (" + how + ") into GPU memory, " +
                               std::to_string(o.threads) + " threads, a batch in flight";
      if (!kvikio_why.empty()) {
        paths.push_back({{"what", what}, {"skipped", kvikio_why}});
        return;
      }
      BAM_CUDA_TRY(cudaMemsetAsync(bad.get(), 0, sizeof(unsigned long long), s));
      BAM_CUDA_TRY(cudaStreamSynchronize(s));
      std::string mode;
      std::uint64_t missing = 0;
      double secs = 0;
      std::vector<std::uint64_t> sizes;
      try {
        for (std::uint64_t b = 0; b < nb; ++b) {
          const std::uint64_t f = first[b], cnt = first[b + 1] - first[b];
          sizes.assign(flat_size.begin() + static_cast<std::ptrdiff_t>(f),
                       flat_size.begin() + static_cast<std::ptrdiff_t>(f + cnt));
          const auto t = clock_type::now();
          missing += bench::kvikio_read_files(c.paths, plan.ids[b], sizes, out.get(), plan.offsets[b], mode);
          secs += seconds_since(t);
          check_batch<<<grid(cnt), threads, 0, s>>>(out.get(), d_off.get() + f, d_size.get() + f, d_cid.get() + f, cnt,
                                                    bad.get());
          BAM_CUDA_TRY(cudaStreamSynchronize(s));
        }
      } catch (const std::exception& e) {
        paths.push_back({{"what", what}, {"failed", std::string("KvikIO failed: ") + e.what()}});
        return;
      }
      // Bytes that never arrived fail the run too (exit status 1).
      paths.push_back(path_json(what, secs, plan, n, bad_bytes()));
      paths.back()["missing_bytes"] = missing;
      paths.back()["kvikio_mode"] = mode;
    };
    cpu_loader("OS page cache, hot");
    kvikio_loader("OS page cache, hot");
    if (o.cold) {
      for (const bool kvikio : {false, true}) {
        const std::string why = drop_os_page_cache(o.corpus.dir);
        if (!why.empty()) {
          paths.push_back({{"what", std::string(kvikio ? "KvikIO" : "CPU loader") + " (cold)"}, {"skipped", why}});
          continue;
        }
        if (kvikio)
          kvikio_loader("cold: the OS page cache dropped first");
        else
          cpu_loader("cold: the OS page cache dropped first");
      }
    }

    nlohmann::json j;
    int driver = 0, dev = 0;
    cudaDeviceProp prop{};
    BAM_CUDA_TRY(cudaGetDevice(&dev));
    BAM_CUDA_TRY(cudaGetDeviceProperties(&prop, dev));
    BAM_CUDA_TRY(cudaDriverGetVersion(&driver));
    char date[64];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    j["benchmark"] = "file_bench";
    j["gpu"] = prop.name;
    j["gpu_count"] = 1;
    j["driver"] = driver;
    j["commit"] = o.commit;
    j["date"] = date;
    j["device"] = st.name();
    j["transport"] = st.transport_name();
    j["files"] = n;
    j["file_bytes"] = plan.file_bytes;
    j["mean_file_bytes"] = static_cast<double>(plan.file_bytes) / static_cast<double>(n);
    j["batch"] = o.batch;
    j["batches"] = nb;
    j["page_size"] = o.page_size;
    j["cache_bytes"] = o.cache_mib << 20;
    j["cpu_threads"] = o.threads;
    const double zc = paths[1]["GB_per_s"].get<double>();
    const double bam_rate = paths[0]["GB_per_s"].get<double>();
    for (auto& p : paths)
      if (p.contains("GB_per_s")) {
        p["ratio_to_zero_copy"] = p["GB_per_s"].get<double>() / zc;
        p["bam_over_this"] = bam_rate / p["GB_per_s"].get<double>();
      }
    j["paths"] = paths;
    std::printf("%-110s %10s %8s %9s %7s %6s\n", "path", "files/s", "GB/s", "vs 0-copy", "bam/it", "bad");
    for (const auto& p : paths) {
      if (!p.contains("GB_per_s")) {
        const bool failed = p.contains("failed");
        std::printf("%-110s %s: %s\n", p["what"].get<std::string>().c_str(), failed ? "FAILED" : "skipped",
                    p[failed ? "failed" : "skipped"].get<std::string>().c_str());
        continue;
      }
      std::printf("%-110s %10.0f %8.2f %8.2fx %6.2fx %6llu\n", p["what"].get<std::string>().c_str(),
                  p["files_per_s"].get<double>(), p["GB_per_s"].get<double>(), p["ratio_to_zero_copy"].get<double>(),
                  p["bam_over_this"].get<double>(),
                  static_cast<unsigned long long>(p["bad_bytes"].get<std::uint64_t>()));
    }
    if (!o.json.empty()) std::ofstream(o.json) << j.dump(1) << "\n";
    BAM_CUDA_TRY(cudaStreamDestroy(s));
    if (own_dir) fs::remove_all(o.corpus.dir);
    std::uint64_t all_bad = 0;
    bool any_failed = false;
    for (const auto& p : paths) {
      if (p.contains("bad_bytes")) all_bad += p["bad_bytes"].get<std::uint64_t>();
      if (p.contains("missing_bytes")) all_bad += p["missing_bytes"].get<std::uint64_t>();
      any_failed = any_failed || p.contains("failed");
    }
    return all_bad == 0 && !any_failed ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "file_bench: %s\n", e.what());
    if (own_dir) fs::remove_all(o.corpus.dir);
    return 1;
  }
}
