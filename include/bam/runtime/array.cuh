// SPDX-License-Identifier: MIT
//! `bam::array<T>`: an array of T on NVMe storage that GPU kernels index as if
//! it were memory, through a `bam::page_cache`. `bam::array_ref<T>` is its
//! trivially copyable handle, passed to kernels by value; it and the readers
//! and page handles it makes are declared, with their calling conventions,
//! in <bam/runtime/array_ref.cuh>.
//!
//!  - `a[i]` / `a.read(i)` (a value: `a[i] = v` does not compile),
//!    `a.write(i, v)`: element access. Threads of a warp that touch the same
//!    page share one cache reference (one leader per page).
//!  - `a.copy_to(begin, count, out)`: the whole warp copies a contiguous range
//!    into a buffer, up to 32 pages in flight at once.
//!  - `auto r = a.reader(); ... r[i]`: a reader remembers the cache slot of
//!    each lane's last page, so a warp walking through a page pays for the
//!    cache lookup once per page, not once per element (it holds no page
//!    between accesses: lanes may diverge or leave a loop at any point).
//!  - `auto pg = a.page(i); ... pg[j]`: pins each lane's page until `pg`
//!    goes out of scope; reads of that page are plain loads (see `array_page`).
//!  - Pages are striped over the storage's controllers; many arrays share one cache.
//!  - `array<T>::open(cache, "/data/features.bin")`: an array over a file,
//!    read through its blocks on the raw disk where that disk can be opened
//!    here, else through the file (said through `bam::warn`).
//!  - A bad index or a device error never corrupts anything: the first failure
//!    (index, LBA, controller, NVMe status) is recorded, the access yields
//!    `T{}`, and the host turns it into a `bam::error` in `check()`.
//!
//! Element types: trivially copyable, size a power of two dividing the page size.
//!
//! @code
//!   __global__ void sum(bam::array_ref<float> a, float* out) {
//!     const std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x;
//!     if (i < a.size()) atomicAdd(out, a[i]);
//!   }
//!   bam::array<float> a(cache, storage, n);
//!   sum<<<(n + 255) / 256, 256, 0, stream>>>(a.ref(), out);
//!   a.check(stream);
//! @endcode
#pragma once

#include <bam/cuda.cuh>
#include <bam/file/extent_map.hpp>
#include <bam/file/mapped_file.hpp>
#include <bam/runtime/array_ref.cuh>
#include <bam/runtime/page_cache.cuh>
#include <bam/file/fs_medium.hpp>
#include <bam/runtime/storage.cuh>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace bam {

namespace detail {
//! `bam::fs_image` once bam/file/fs_image.hpp is included (it needs
//! libext2fs): what `array::open(cache, path, storage)` reads file systems with.
template <class>
struct fs_image_type;

//! A file's extent map copied to device memory: its runs and a handle to them.
struct device_extent_map {
  device_buffer<std::uint64_t> start, lba;
  device_buffer<extent_map_ref> ref{1};
  device_extent_map(const extent_map_ref& host, cudaStream_t stream)
      : start(host.runs + 1), lba(host.runs == 0 ? 1 : host.runs) {
    extent_map_ref d = host;
    copy_to_device(start.get(), host.start, host.runs + 1, stream);
    if (host.runs != 0) copy_to_device(lba.get(), host.lba, host.runs, stream);
    d.start = start.get();
    d.lba = lba.get();
    copy_to_device(ref.get(), &d, 1, stream);
    BAM_CUDA_TRY(cudaStreamSynchronize(stream));
  }
};

//! Warps copy elements [begin, begin + count) of `a` into `out`, 4096 each.
template <class T>
__global__ void copy_range_kernel(array_ref<T> a, std::uint64_t begin, std::uint64_t count, T* out) {
  constexpr std::uint64_t per_warp = 4096;
  const std::uint64_t at = (static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32 * per_warp;
  if (at >= count) return; // the whole warp alike
  (void)a.copy_to(begin + at, count - at < per_warp ? count - at : per_warp, out + at);
}
} // namespace detail

//! Owning host object: attaches `n` elements at `start_lba` of a storage to a cache.
template <class T>
class array {
public:
  static_assert(std::is_trivially_copyable_v<array_ref<T>>, "array_ref must be trivially copyable");

  //! @param cache the page cache that serves the array (it keeps the cache alive)
  //! @param s the storage holding the elements (pages striped over its controllers)
  //! @param n elements
  //! @param start_lba where the array begins on every controller of `s`
  //! @param stream the cache's tables are updated on it (waited for; no other stream is)
  //! @throw bam::error if the array does not fit, or overlaps an array it
  //! cannot share pages with.
  array(page_cache& cache, const storage& s, std::uint64_t n, std::uint64_t start_lba = 0, cuda::stream_ref stream = {})
      : cache_(cache.state()), storage_(s), n_(n) {
    const device_scope on(s.device());
    check_element_size(cache);
    if (n == 0) throw error("bam::array: an array needs at least one element");
    const std::uint64_t per_page = cache.page_size() / sizeof(T);
    npages_ = (n + per_page - 1) / per_page;
    err_ = device_buffer<device_error_record>(1);
    binding_ = cache_->attach(s, start_lba, npages_, stream.get());
    attached_ = true;
    ref_ = array_ref<T>(cache_->ref(cache_->device_index(s.device())), n, binding_.first_page, binding_.space,
                        elem_shift(cache), err_.get());
  }

  //! An array over a file on `s`, read by GPU threads themselves: a miss
  //! finds its page's blocks in the file's extent map (`file`, from
  //! `bam::fs_image::map` for a file system on the storage, or
  //! `bam::extent_map::of_file` for a mounted one) and reads them from the
  //! storage's controller, a page that spans several runs of the file with
  //! one command per run; blocks in holes and past the file's end read as
  //! zeroes. file_size / sizeof(T) elements; read-only (a write is reported
  //! by check()).
  //! @param cache the page cache that serves the array
  //! @param s the storage whose one controller holds the file system (its namespace is the disk the map names)
  //! @param file the file's extent map, in blocks of `s`'s LBA size
  //! @param stream the cache's tables and the map's device copy are written on it (waited for)
  //! @throw bam::error if the map's block size is not the storage's LBA size, a run lies past the end
  //! of the storage, the storage has more than one controller, or the file is not a whole number
  //! (> 0) of elements.
  array(page_cache& cache, const storage& s, const extent_map& file, cuda::stream_ref stream = {})
      : cache_(cache.state()), storage_(s), n_(file.file_size() / sizeof(T)) {
    const device_scope on(s.device());
    check_element_size(cache);
    const extent_map_ref host = file.ref();
    if (file.lba_size() != s.lba_size())
      throw error("bam::array: the file's extent map counts blocks of " + std::to_string(file.lba_size()) + " bytes; " +
                  s.name() + " has " + std::to_string(s.lba_size()) + "-byte LBAs");
    if (file.file_size() == 0 || file.file_size() % sizeof(T) != 0)
      throw error("bam::array: a file of " + std::to_string(file.file_size()) +
                  " bytes is not a whole number (> 0) of " + std::to_string(sizeof(T)) + "-byte elements");
    for (std::uint64_t i = 0; i < host.runs; ++i)
      if (host.lba[i] != extent_hole && (host.lba[i] > s.blocks_per_controller() ||
                                         host.start[i + 1] - host.start[i] > s.blocks_per_controller() - host.lba[i])) {
        error_context c;
        c.lba = host.lba[i];
        c.controller = s.name();
        throw error("bam::array: the file's run " + std::to_string(i) + " at LBA " + std::to_string(host.lba[i]) +
                        " lies past the end of " + s.name() + " (" + std::to_string(s.blocks_per_controller()) +
                        " blocks)",
                    c);
      }
    auto map = std::make_shared<detail::device_extent_map>(host, stream.get());
    const std::uint64_t per_page = cache.page_size() / sizeof(T);
    npages_ = (n_ + per_page - 1) / per_page;
    err_ = device_buffer<device_error_record>(1);
    binding_ = cache_->attach_file(s, map->ref.get(), map, npages_, stream.get());
    attached_ = true;
    ref_ = array_ref<T>(cache_->ref(cache_->device_index(s.device())), n_, binding_.first_page, binding_.space,
                        elem_shift(cache), err_.get());
    source_ =
        s.name() + ": GPU threads read the file's " + std::to_string(host.runs) + " run(s) through its extent map";
  }

  //! An array over the file `path`: its size / sizeof(T) elements, read by
  //! the software controller's CPU engine either from the file's blocks on
  //! its raw disk, through the file's extent map (`emu:extents=PATH`, when
  //! the disk can be opened here), or from the file itself
  //! (`emu:file=PATH,ro`, said through `bam::warn` with the reason).
  //! `source()` tells which. Read-only: a write is reported by check().
  //! `options` go into the device string (e.g. "queues=32,threads=8").
  //! Throws `bam::error` for a file bam cannot read correctly (holes, data
  //! not yet on disk: see extent_map) or whose size is not a whole number
  //! of elements.
  static array open(page_cache& cache, const std::string& path, const std::string& options = "",
                    cuda::stream_ref stream = {}) {
    const device_scope on(cache.device()); // the storage's queues on the cache's GPU
    const file_access a = plan_file_access(path);
    if (a.kind == file_access::path::via_file) warn(path + ": " + a.reason);
    const std::uint64_t bytes = a.map ? a.map->file_size() : std::filesystem::file_size(path);
    if (bytes == 0 || bytes % sizeof(T) != 0) {
      error_context c;
      c.errnum = EINVAL;
      throw error("bam::array::open: " + path + " holds " + std::to_string(bytes) +
                      " bytes, not a whole number (> 0) of " + std::to_string(sizeof(T)) + "-byte elements",
                  c);
    }
    const bam::storage s(a.device + (options.empty() ? "" : "," + options));
    array arr(cache, s, bytes / sizeof(T), 0, stream);
    arr.source_ = a.device + ": " + a.reason;
    return arr;
  }

  //! An array over the file `path` of the ext2/3/4 file system on `s` (its
  //! one controller's namespace, the file system from byte `fs_offset`),
  //! read by GPU threads through the file's extent map as the constructor
  //! over an `extent_map` does: for a file system on an SSD bound to bam's
  //! driver, which the kernel cannot mount, or on a software controller's
  //! media that hold a disk image. The file system itself (superblock,
  //! inodes, extent trees) is read from `s` through `cache` first, by an
  //! array of the namespace's bytes (whole pages of the cache) that is
  //! detached once the map is made. The array does not watch the file
  //! afterwards; `source()` says where it reads. Include
  //! bam/file/fs_image.hpp (libext2fs: BAM_HAVE_LIBEXT2FS) to use it.
  //! @throw bam::error for a storage of several controllers, a cache over
  //! several GPUs, a namespace without an ext2/3/4 file system, a path that
  //! is not a regular file there, a file system that uses the namespace's
  //! last blocks when they are not a whole page of the cache, every refusal
  //! of `fs_image::map` and of the constructor over a map.
  template <class Image = void>
  static array open(page_cache& cache, const std::string& path, const bam::storage& s, std::uint64_t fs_offset = 0,
                    cuda::stream_ref stream = {}) {
    using fs_image = typename detail::fs_image_type<Image>::type;
    const device_scope on(s.device());
    if (s.controller_count() != 1)
      throw error("bam::array::open: " + s.name() + " has " + std::to_string(s.controller_count()) +
                  " controllers; a file system lies on one controller's namespace");
    if (cache.devices().size() != 1)
      throw error("bam::array::open: arrays over a file system's files are not served by a cache over several GPUs "
                  "yet; use a cache of one GPU");
    const extent_map file = [&] {
      // The namespace as bytes, whole pages of the cache.
      if (cache.page_size() % s.lba_size() != 0)
        throw error("bam::array::open: pages of " + std::to_string(cache.page_size()) +
                    " bytes are not a multiple of " + s.name() + "'s " + std::to_string(s.lba_size()) + "-byte LBAs");
      const std::uint64_t page_blocks = cache.page_size() / s.lba_size();
      const std::uint64_t whole = s.blocks_per_controller() / page_blocks * cache.page_size();
      if (whole == 0) throw error("bam::array::open: " + s.name() + " is smaller than one page of the cache");
      constexpr std::uint64_t chunk = 1ull << 20;
      std::shared_ptr<array<std::uint8_t>> disk;
      try {
        disk = std::make_shared<array<std::uint8_t>>(cache, s, whole, 0, stream);
      } catch (const error& e) {
        throw error::wrap("bam::array::open: reading the file system on " + s.name() + " through the cache", e);
      }
      auto staging = std::make_shared<device_buffer<std::uint8_t>>(chunk);
      fs_medium medium;
      medium.name = s.name();
      medium.bytes = s.blocks_per_controller() * s.lba_size();
      medium.lba_size = s.lba_size();
      medium.read = [disk, staging, stream, chunk, whole, name = s.name()](std::uint64_t offset, void* dst,
                                                                           std::size_t n) {
        if (offset + n > whole)
          throw error("the file system reads the last " + std::to_string(offset + n - whole) + " bytes of " + name +
                      ", past its last whole page of the cache: use pages that divide the namespace");
        auto* out = static_cast<std::uint8_t*>(dst);
        for (std::uint64_t done = 0; done < n;) {
          const std::uint64_t take = std::min<std::uint64_t>(n - done, chunk);
          const auto warps = static_cast<unsigned>((take + 4095) / 4096);
          detail::copy_range_kernel<<<(warps + 7) / 8, 256, 0, stream.get()>>>(disk->ref(), offset + done, take,
                                                                               staging->get());
          BAM_CUDA_TRY(cudaGetLastError());
          copy_to_host(out + done, staging->get(), static_cast<std::size_t>(take), stream.get());
          BAM_CUDA_TRY(cudaStreamSynchronize(stream.get()));
          disk->check(stream); // a failed read throws here, naming the LBA
          done += take;
        }
      };
      const fs_image image(std::move(medium), fs_offset);
      return image.map(path);
    }();
    array arr(cache, s, file, stream);
    arr.source_ = s.name() + ": " + path + " of the file system on it, its " + std::to_string(file.runs()) +
                  " run(s) read by GPU threads through its extent map";
    return arr;
  }

  //! Where an array made by open() reads from, and why; empty otherwise.
  const std::string& source() const { return source_; }

  //! Writes dirty pages back (when no other array shares them) and detaches.
  //! A failure is reported through `bam::warn`; the pages stay in the cache
  //! and `page_cache::flush` tries again.
  ~array() {
    if (!attached_) return;
    device_scope on;
    on.enter_quietly(storage_->device());
    try {
      try {
        check(cuda::stream_ref{});
      } catch (const std::exception& e) {
        warn(std::string(e.what()) + " (reported by ~array)");
      }
      detach(cuda::stream_ref{});
    } catch (const std::exception& e) {
      warn(std::string("~array: ") + e.what());
    }
  }
  array(const array&) = delete;
  array& operator=(const array&) = delete;
  array(array&& o) noexcept
      : cache_(std::move(o.cache_)), storage_(std::move(o.storage_)), n_(o.n_), npages_(o.npages_),
        binding_(o.binding_), err_(std::move(o.err_)), ref_(o.ref_), attached_(std::exchange(o.attached_, false)),
        source_(std::move(o.source_)) {}
  array& operator=(array&& o) noexcept {
    if (this != &o) {
      this->~array();
      new (this) array(std::move(o));
    }
    return *this;
  }

  array_ref<T> ref() const { return ref_; }
  operator array_ref<T>() const { return ref_; }
  std::uint64_t size() const { return n_; }
  std::uint64_t pages() const { return npages_; }
  const bam::storage& storage() const { return *storage_; }
  //! The CUDA device of the array's storage (and of its cache, or one of
  //! them for a cache over several GPUs): kernels that use ref() run there,
  //! and the host calls above make it current for their work (any device may
  //! be current when they are called).
  int device() const { return storage_->device(); }

  //! Report a failure a kernel recorded since the last check. Waits for
  //! `stream` (the one the kernels ran on) and no other.
  //! @throw bam::error for the first failure recorded (bad index, NVMe error
  //! status, timeout, a failed write-back or `flush_async` of the array's pages).
  void check(cuda::stream_ref stream = {}) {
    const device_scope on(storage_->device());
    BAM_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    auto name = [&](std::uint32_t c) { return storage_->controller_name(c); };
    throw_if_recorded(err_.get(), "bam::array access failed", name, stream.get());
    if (attached_) cache_->check_space(binding_.space, stream.get());
  }
  //! Write back the cache's dirty pages and NVMe Flush (for every array on
  //! the cache), on `stream`, waiting for it (see `page_cache::flush`).
  //! @throw bam::error for a failed write-back or NVMe Flush.
  void flush(cuda::stream_ref stream = {}) { cache_->flush(stream.get()); }
  //! The same, enqueued on `stream` without waiting; `check` reports a
  //! failure (see `page_cache::flush_async`).
  void flush_async(cuda::stream_ref stream = {}) { cache_->flush_async(stream.get()); }

  //! Detach now (the destructor does it otherwise), on `stream`, waiting for it.
  //! @throw bam::error if the write-back of its pages fails; the array is
  //! detached either way and the pages stay in the cache until a flush writes them.
  void detach(cuda::stream_ref stream = {}) {
    if (!attached_) return;
    const device_scope on(storage_->device());
    attached_ = false;
    cache_->detach(binding_, stream.get());
  }

private:
  static void check_element_size(const page_cache& cache) {
    if (cache.page_size() % sizeof(T) != 0 || (sizeof(T) & (sizeof(T) - 1)) != 0)
      throw error("bam::array: element size " + std::to_string(sizeof(T)) +
                  " must be a power of two dividing the page size " + std::to_string(cache.page_size()));
  }
  //! log2 of the elements per page.
  static unsigned elem_shift(const page_cache& cache) {
    unsigned shift = 0;
    while ((1ull << shift) < cache.page_size() / sizeof(T))
      ++shift;
    return shift;
  }

  std::shared_ptr<detail::cache_state> cache_;
  std::optional<bam::storage> storage_;
  std::uint64_t n_ = 0;
  std::uint64_t npages_ = 0;
  detail::array_binding binding_;
  device_buffer<device_error_record> err_;
  array_ref<T> ref_{};
  bool attached_ = false;
  std::string source_;
};

} // namespace bam
