// SPDX-License-Identifier: MIT
// The CUDA half of the Python extension (see gpu.hpp).
#include "gpu.hpp"

#include <bam/bam.cuh>
#include <bam/runtime/row_gather.cuh>

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace bam::python {

namespace {

cudaStream_t as_stream(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

//! A failure recorded for a row id outside the array becomes a row_index_error.
[[noreturn]] void rethrow_row_error(const error& e, std::uint64_t row_width, std::uint64_t rows) {
  const error_context& c = e.context();
  if (c.status && c.status->raw == nvme::status_out_of_range.raw && c.index && !c.lba) {
    const std::uint64_t first = *c.index;
    const std::uint64_t row = first / row_width;
    std::string what;
    if (first == std::numeric_limits<std::uint64_t>::max() ||
        row > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      what = "a negative row id";
    else
      what = "row id " + std::to_string(row);
    throw row_index_error(what + " is outside [0, " + std::to_string(rows) + ") of the array (" + e.what() + ")");
  }
  throw e;
}

} // namespace

bool gpu_compiled() { return true; }

std::string gpu_unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA GPU: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  }
  if (n == 0) return "no CUDA GPU: the CUDA driver reports no device";
  return {};
}

void require_gpu() {
  const std::string why = gpu_unavailable_reason();
  if (!why.empty()) {
    error_context c;
    c.errnum = ENODEV;
    throw error(why, c);
  }
}

struct gpu_storage_state {
  explicit gpu_storage_state(const std::string& s) : storage(s) {}
  bam::storage storage;
  //! The caches arrays over this storage were made in (host transfers keep them coherent).
  std::mutex mutex;
  std::vector<std::weak_ptr<gpu_cache_state>> caches;

  void add_cache(const std::shared_ptr<gpu_cache_state>& c) {
    std::lock_guard lock(mutex);
    std::erase_if(caches, [](const auto& w) { return w.expired(); });
    for (const auto& w : caches)
      if (w.lock() == c) return;
    caches.push_back(c);
  }
  std::vector<std::shared_ptr<gpu_cache_state>> live_caches() {
    std::lock_guard lock(mutex);
    std::vector<std::shared_ptr<gpu_cache_state>> out;
    for (const auto& w : caches)
      if (auto c = w.lock()) out.push_back(std::move(c));
    return out;
  }
};

gpu_storage::gpu_storage(const std::string& device_string) {
  require_gpu();
  state = std::make_shared<gpu_storage_state>(device_string);
}
std::uint32_t gpu_storage::controller_count() const { return state->storage.controller_count(); }
std::uint32_t gpu_storage::lba_size() const { return state->storage.lba_size(); }
std::uint64_t gpu_storage::blocks_per_controller() const { return state->storage.blocks_per_controller(); }
std::string gpu_storage::name() const { return state->storage.name(); }
std::string gpu_storage::transport_name() const { return state->storage.transport_name(); }
void gpu_storage::write_media(std::uint32_t ctrl, std::uint64_t offset, const void* src, std::size_t bytes) const {
  bam::emu::write_media(state->storage, ctrl, offset, src, bytes);
}
void gpu_storage::read_media(std::uint32_t ctrl, std::uint64_t offset, void* dst, std::size_t bytes) const {
  bam::emu::read_media(state->storage, ctrl, offset, dst, bytes);
}

struct gpu_cache_state {
  explicit gpu_cache_state(const page_cache_config& c) : cache(c) {}
  bam::page_cache cache;
};

// On the legacy default stream: after the work of every blocking stream
// (torch's default stream is one).
void gpu_storage::before_host_read() const {
  for (const auto& c : state->live_caches())
    c->cache.write_back(state->storage, cudaStream_t{});
}
void gpu_storage::before_host_write() const {
  for (const auto& c : state->live_caches())
    c->cache.invalidate(state->storage, cudaStream_t{});
}

gpu_cache::gpu_cache(std::size_t page_size, std::size_t capacity, std::uint32_t ways, const std::string& group_name,
                     int group_rank, int group_size, std::uint64_t group_timeout_ms) {
  require_gpu();
  page_cache_config c;
  c.page_size = page_size;
  c.capacity = capacity;
  c.ways = ways;
  c.group.name = group_name;
  c.group.rank = group_rank;
  c.group.size = group_size;
  c.group.timeout_ms = group_timeout_ms;
  state = std::make_shared<gpu_cache_state>(c);
}
std::size_t gpu_cache::page_size() const { return state->cache.page_size(); }
std::uint64_t gpu_cache::slot_count() const { return state->cache.slot_count(); }
cache_counters gpu_cache::counters(std::uintptr_t stream) const {
  const page_cache_counters c = state->cache.counters(as_stream(stream));
  return {c.misses, c.writebacks};
}
void gpu_cache::flush(std::uintptr_t stream) { state->cache.flush(as_stream(stream)); }

//! One array of any element size: the bindings see bytes and an element size.
struct gpu_array_state {
  virtual ~gpu_array_state() = default;
  virtual void gather(const std::int64_t* ids, std::uint64_t count, std::uint64_t row_width, void* out,
                      cudaStream_t stream) = 0;
  virtual void write_rows(const std::int64_t* ids, std::uint64_t count, std::uint64_t row_width, const void* in,
                          cudaStream_t stream) = 0;
  virtual void check(cudaStream_t stream) = 0;
  virtual std::uint64_t size() const = 0;
};

namespace {

template <class T>
struct typed_array final : gpu_array_state {
  typed_array(gpu_cache& cache, const gpu_storage& s, std::uint64_t n, std::uint64_t start_lba, cudaStream_t stream)
      : keep_cache(cache.state), keep_storage(s.state), a(cache.state->cache, s.state->storage, n, start_lba, stream) {
    s.state->add_cache(cache.state);
  }

  void gather(const std::int64_t* ids, std::uint64_t count, std::uint64_t row_width, void* out,
              cudaStream_t stream) override {
    bam::gather_rows(a, ids, count, row_width, static_cast<T*>(out), stream);
    checked(row_width, stream);
  }

  void write_rows(const std::int64_t* ids, std::uint64_t count, std::uint64_t row_width, const void* in,
                  cudaStream_t stream) override {
    if (row_width == 0 || row_width > a.size())
      throw error("bam.Array: row width " + std::to_string(row_width) + " (1 to the array's " +
                  std::to_string(a.size()) + " elements)");
    bam::scatter_rows(a, ids, count, row_width, static_cast<const T*>(in), stream);
    checked(row_width, stream);
  }

  void check(cudaStream_t stream) override { a.check(stream); }
  std::uint64_t size() const override { return a.size(); }

  void checked(std::uint64_t row_width, cudaStream_t stream) {
    try {
      a.check(stream);
    } catch (const error& e) {
      rethrow_row_error(e, row_width, a.size() / row_width);
    }
  }

  std::shared_ptr<gpu_cache_state> keep_cache;     // the array's cache outlives it
  std::shared_ptr<gpu_storage_state> keep_storage; // and so does its storage (a closed bam.Storage lets it go)
  bam::array<T> a;
};

} // namespace

gpu_array::gpu_array(gpu_cache& cache, const gpu_storage& storage, std::uint64_t elements, std::uint32_t element_size,
                     std::uint64_t start_lba, std::uintptr_t stream) {
  const cudaStream_t s = as_stream(stream);
  switch (element_size) {
  case 1: state = std::make_shared<typed_array<std::uint8_t>>(cache, storage, elements, start_lba, s); break;
  case 2: state = std::make_shared<typed_array<std::uint16_t>>(cache, storage, elements, start_lba, s); break;
  case 4: state = std::make_shared<typed_array<std::uint32_t>>(cache, storage, elements, start_lba, s); break;
  case 8: state = std::make_shared<typed_array<std::uint64_t>>(cache, storage, elements, start_lba, s); break;
  default: throw error("bam.Array: element size " + std::to_string(element_size) + " (1, 2, 4 or 8 bytes)");
  }
}
void gpu_array::gather(const std::int64_t* ids, std::uint64_t count, std::uint64_t row_width, void* out,
                       std::uintptr_t stream) {
  state->gather(ids, count, row_width, out, as_stream(stream));
}
void gpu_array::write_rows(const std::int64_t* ids, std::uint64_t count, std::uint64_t row_width, const void* in,
                           std::uintptr_t stream) {
  state->write_rows(ids, count, row_width, in, as_stream(stream));
}
void gpu_array::check(std::uintptr_t stream) { state->check(as_stream(stream)); }
std::uint64_t gpu_array::size() const { return state->size(); }

} // namespace bam::python
