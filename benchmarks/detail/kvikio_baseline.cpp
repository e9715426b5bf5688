// SPDX-License-Identifier: MIT
// The KvikIO baseline of the block benchmark, in a translation unit of its
// own (KvikIO's headers are built with a plain C++ compiler).
#include "host_baselines.hpp"

#if defined(BAM_WITH_KVIKIO)
#include <kvikio/file_handle.hpp>
#endif

#include <cuda_runtime_api.h>

#include <future>
#include <string>

namespace bench {

host_result kvikio_baseline(const std::string& path, std::uint64_t file_bytes, std::uint32_t io, unsigned threads,
                            unsigned inflight, std::uint64_t ops_total) {
  host_result r;
#if defined(BAM_WITH_KVIKIO)
  void* dev = nullptr;
  try {
    // Its defaults are one worker thread, small reads on the caller's thread
    // and buffered reads in compat mode:
    // give it the pread baseline's threads, and O_DIRECT, so that it reads
    // the disk and not the host's page cache.
    kvikio::defaults::set_thread_pool_nthreads(threads);
    kvikio::defaults::set_auto_direct_io_read(true);
    // Reads below the GDS threshold (16 KiB) run synchronously on the calling
    // thread, one at a time: 0 sends every read to the pool.
    kvikio::defaults::set_gds_threshold(0);
    kvikio::FileHandle f(path, "r");
    const std::uint64_t units = file_bytes / io;
    if (cudaMalloc(&dev, static_cast<std::size_t>(inflight) * io) != cudaSuccess)
      throw std::runtime_error("cudaMalloc");
    std::vector<std::future<std::size_t>> futures;
    std::vector<std::uint64_t> placed(inflight);
    const auto t0 = std::chrono::steady_clock::now();
    std::uint64_t done = 0, bad = 0;
    for (std::uint64_t i = 0; i < ops_total; i += inflight) {
      futures.clear();
      const unsigned n = static_cast<unsigned>(std::min<std::uint64_t>(inflight, ops_total - i));
      for (unsigned k = 0; k < n; ++k) {
        placed[k] = host_mix(i + k) % units;
        futures.push_back(f.pread(static_cast<char*>(dev) + std::size_t{k} * io, io, placed[k] * io));
      }
      for (auto& fu : futures)
        done += fu.get() == io;
      // Check the first word of one block per batch.
      std::uint32_t first = 0;
      cudaMemcpy(&first, dev, sizeof first, cudaMemcpyDeviceToHost);
      bad += first != pattern_word(0, placed[0] * io);
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.ran = true;
    r.ops = done;
    r.bad = bad;
    r.ops_per_s = static_cast<double>(done) / r.seconds;
    r.gb_per_s = r.ops_per_s * io / 1e9;
    r.why_not = (f.get_compat_mode_manager().is_compat_mode_preferred() ? std::string("compat mode (POSIX read + copy)")
                                                                        : std::string("GPUDirect Storage (cuFile)")) +
                ", " + std::to_string(threads) + " threads, " + std::to_string(inflight) + " reads in flight";
  } catch (const std::exception& e) {
    r.why_not = std::string("KvikIO failed: ") + e.what();
  }
  if (dev != nullptr) cudaFree(dev);
#else
  (void)path, (void)file_bytes, (void)io, (void)threads, (void)inflight, (void)ops_total;
  r.why_not = "built without KvikIO (configure with -DBAM_KVIKIO_ROOT=<site-packages with libkvikio>)";
#endif
  return r;
}

} // namespace bench
