// SPDX-License-Identifier: MIT
// The GPU interface of the Python extension when it was built without CUDA:
// every GPU object refuses to be made, saying why.
#include "gpu.hpp"

namespace bam::python {

namespace {
[[noreturn]] void absent() {
  error_context c;
  c.errnum = ENODEV;
  throw error("no CUDA GPU support: this bam extension was built without CUDA (install the CUDA toolkit "
              "and reinstall: pip install --force-reinstall ./python)",
              c);
}
} // namespace

bool gpu_compiled() { return false; }
std::string gpu_unavailable_reason() { return "no CUDA GPU support: this bam extension was built without CUDA"; }
void require_gpu() { absent(); }

gpu_storage::gpu_storage(const std::string&) { absent(); }
std::uint32_t gpu_storage::controller_count() const { absent(); }
std::uint32_t gpu_storage::lba_size() const { absent(); }
std::uint64_t gpu_storage::blocks_per_controller() const { absent(); }
std::string gpu_storage::name() const { absent(); }
std::string gpu_storage::transport_name() const { absent(); }
void gpu_storage::write_media(std::uint32_t, std::uint64_t, const void*, std::size_t) const { absent(); }
void gpu_storage::read_media(std::uint32_t, std::uint64_t, void*, std::size_t) const { absent(); }
void gpu_storage::before_host_read() const { absent(); }
void gpu_storage::before_host_write() const { absent(); }

gpu_cache::gpu_cache(std::size_t, std::size_t, std::uint32_t, const std::string&, int, int, std::uint64_t) { absent(); }
std::size_t gpu_cache::page_size() const { absent(); }
std::uint64_t gpu_cache::slot_count() const { absent(); }
cache_counters gpu_cache::counters(std::uintptr_t) const { absent(); }
void gpu_cache::flush(std::uintptr_t) { absent(); }

gpu_array::gpu_array(gpu_cache&, const gpu_storage&, std::uint64_t, std::uint32_t, std::uint64_t, std::uintptr_t) {
  absent();
}
void gpu_array::gather(const std::int64_t*, std::uint64_t, std::uint64_t, void*, std::uintptr_t) { absent(); }
void gpu_array::write_rows(const std::int64_t*, std::uint64_t, std::uint64_t, const void*, std::uintptr_t) { absent(); }
void gpu_array::check(std::uintptr_t) { absent(); }
std::uint64_t gpu_array::size() const { absent(); }

} // namespace bam::python
