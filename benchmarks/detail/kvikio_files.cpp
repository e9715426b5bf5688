// SPDX-License-Identifier: MIT
// KvikIO as a file loader, in a translation unit of its own (KvikIO's
// headers are built with a plain C++ compiler).
#include "kvikio_files.hpp"

#if defined(BAM_WITH_KVIKIO)
#include <kvikio/file_handle.hpp>

#include <exception>
#include <future>
#endif

namespace bench {

std::string kvikio_files_setup(unsigned threads) {
#if defined(BAM_WITH_KVIKIO)
  try {
    kvikio::defaults::set_thread_pool_nthreads(threads);
    // Reads below the GDS threshold (16 KiB) would run on the calling
    // thread, one after another: 0 sends every file to the pool.
    kvikio::defaults::set_gds_threshold(0);
    // Buffered reads: files hot in the OS page cache are its best case.
    kvikio::defaults::set_auto_direct_io_read(false);
    return "";
  } catch (const std::exception& e) {
    return std::string("KvikIO failed: ") + e.what();
  }
#else
  (void)threads;
  return "built without KvikIO (configure with -DBAM_KVIKIO_ROOT=<site-packages with libkvikio>)";
#endif
}

std::uint64_t kvikio_read_files(const std::vector<std::string>& paths, const std::vector<std::uint64_t>& ids,
                                const std::vector<std::uint64_t>& sizes, void* gpu,
                                const std::vector<std::uint64_t>& offsets, std::string& mode) {
  std::uint64_t missing = 0;
#if defined(BAM_WITH_KVIKIO)
  // Reserved: the handles stay where their reads were started from, and
  // outlive them: every read started is waited for, even after a failure.
  std::vector<kvikio::FileHandle> handles;
  handles.reserve(ids.size());
  std::vector<std::future<std::size_t>> reads(ids.size());
  std::exception_ptr failed;
  try {
    for (std::size_t k = 0; k < ids.size(); ++k) {
      handles.emplace_back(paths.at(ids[k]), "r");
      if (sizes[k] != 0) reads[k] = handles.back().pread(static_cast<char*>(gpu) + offsets[k], sizes[k], 0);
    }
  } catch (...) {
    failed = std::current_exception();
  }
  for (std::size_t k = 0; k < ids.size(); ++k) {
    std::size_t got = 0;
    try {
      got = reads[k].valid() ? reads[k].get() : 0;
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
    missing += got < sizes[k] ? sizes[k] - got : 0;
  }
  if (failed) std::rethrow_exception(failed);
  if (mode.empty() && !handles.empty())
    mode = handles.front().get_compat_mode_manager().is_compat_mode_preferred() ? "compat mode (POSIX read + copy)"
                                                                                : "GPUDirect Storage (cuFile)";
#else
  (void)paths, (void)gpu, (void)offsets, (void)mode;
  for (std::size_t k = 0; k < ids.size(); ++k)
    missing += sizes[k];
#endif
  return missing;
}

} // namespace bench
