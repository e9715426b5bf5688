// SPDX-License-Identifier: MIT
//! The GPU half of the Python extension behind a plain C++ interface: the
//! bindings (module.cpp, compiled by the host compiler) never see CUDA types,
//! and the CUDA half (gpu.cu, compiled by nvcc) never sees Python. Without
//! CUDA at build time gpu_absent.cpp implements the same interface by
//! throwing.
//!
//! Streams cross as integers (a `cudaStream_t`, 0 for the legacy default
//! stream), as `torch.cuda.current_stream().cuda_stream` gives them.
#pragma once

#include <bam/error.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace bam::python {

//! A row id in a gather or write outside [0, rows) (Python: `bam.RowIndexError`).
class row_index_error : public error {
public:
  using error::error;
};

//! True when the CUDA half was compiled in.
bool gpu_compiled();
//! Empty when a CUDA GPU can be used here; otherwise why it cannot.
std::string gpu_unavailable_reason();
//! Throws `bam::error` ("no CUDA GPU: ...") unless a CUDA GPU can be used.
void require_gpu();

struct gpu_storage_state;
struct gpu_cache_state;
struct gpu_array_state;

//! `bam::storage`: the controllers a device string names, queues placed for GPU threads.
class gpu_storage {
public:
  explicit gpu_storage(const std::string& device_string);
  std::uint32_t controller_count() const;
  std::uint32_t lba_size() const;
  std::uint64_t blocks_per_controller() const;
  std::string name() const;
  std::string transport_name() const;
  //! Host access straight to the media of software controller `ctrl`.
  void write_media(std::uint32_t ctrl, std::uint64_t offset, const void* src, std::size_t bytes) const;
  void read_media(std::uint32_t ctrl, std::uint64_t offset, void* dst, std::size_t bytes) const;
  //! Before the host reads the media: every cache with an array over this
  //! storage writes its dirty pages of it back (`page_cache::write_back`).
  void before_host_read() const;
  //! Before the host writes the media: every such cache writes back and
  //! forgets its pages of this storage (`page_cache::invalidate`), so its
  //! arrays read what the host writes and no later write-back undoes it.
  void before_host_write() const;

  std::shared_ptr<gpu_storage_state> state;
};

struct cache_counters {
  std::uint64_t misses = 0;
  std::uint64_t writebacks = 0;
};

//! `bam::page_cache`.
class gpu_cache {
public:
  //! `group_name` non-empty: one cache shared by `group_size` processes (`page_cache_config::group`).
  gpu_cache(std::size_t page_size, std::size_t capacity, std::uint32_t ways, const std::string& group_name,
            int group_rank, int group_size, std::uint64_t group_timeout_ms);
  std::size_t page_size() const;
  std::uint64_t slot_count() const;
  cache_counters counters(std::uintptr_t stream) const;
  void flush(std::uintptr_t stream);

  std::shared_ptr<gpu_cache_state> state;
};

//! `bam::array<T>` of `elements` elements of `element_size` bytes (1, 2, 4
//! or 8: the element's bytes are moved, whatever type they hold).
class gpu_array {
public:
  gpu_array(gpu_cache& cache, const gpu_storage& storage, std::uint64_t elements, std::uint32_t element_size,
            std::uint64_t start_lba, std::uintptr_t stream);
  //! Rows `ids[0..count)` (rows of `row_width` elements) into `out`; waits
  //! for `stream` and throws `row_index_error` for an id outside [0, rows).
  void gather(const std::int64_t* ids, std::uint64_t count, std::uint64_t row_width, void* out, std::uintptr_t stream);
  //! Rows of `in` to rows `ids[0..count)` through the cache; waits and checks as gather.
  void write_rows(const std::int64_t* ids, std::uint64_t count, std::uint64_t row_width, const void* in,
                  std::uintptr_t stream);
  //! Throws a failure the device recorded since the last check.
  void check(std::uintptr_t stream);
  std::uint64_t size() const;

  std::shared_ptr<gpu_array_state> state;
};

} // namespace bam::python
