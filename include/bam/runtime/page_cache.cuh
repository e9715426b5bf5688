// SPDX-License-Identifier: MIT
//! `bam::page_cache`: a software page cache in GPU memory in front of NVMe
//! storage, filled and written back by GPU threads through their own queues.
//!
//!  - Page size 512 B – 64 KiB (a power of two, at least the LBA size);
//!    capacity chosen by the user. Metadata exists for cache slots only (an
//!    8-byte state word and a 2-byte status per slot, 24 bytes per set of
//!    `ways` slots), so the size of the storage does not matter.
//!  - Set-associative: a page maps to one set (hash of its key) and lives in
//!    any of its ways; clock eviction inside the set; a pinned, loading or
//!    written-back page is never evicted; dirty pages are written back before
//!    their slot is reused, and on `flush()`.
//!  - Many arrays share one cache. Arrays over the same storage that start
//!    on a page boundary share pages (an overlap is coherent); an array that
//!    does not start on a page boundary gets pages of its own and may not
//!    overlap another array (refused at attach).
//!  - Forward progress: a cache of N slots sustains N loads in flight (`ways`
//!    per set); a warp never waits for a slot while it holds one; misses on a
//!    set claim slots in arrival order. More warps than slots costs
//!    throughput, never correctness; deadlines measure the controller's lack
//!    of progress, not queueing (detail/page_cache_ref.inl says how).
//!  - Every wait has a deadline (`page_cache_config::timeout_ns`).
//!  - A slot whose load or write-back timed out stays out of use for the
//!    cache's lifetime (the command may still land in it or read it), also
//!    while readers pin its page; once every slot of a set is such (or holds
//!    a page whose write-back failed), misses on that set fail at once with
//!    a timeout status. A `timeout_ns` too large to add to the clock is no
//!    deadline at all for the cache's waits. A miss whose
//!    set changed in nothing for a whole deadline fails, and so do the
//!    misses queued behind it on that set, when their turn comes.
//!  - A cache belongs to one GPU (`page_cache_config::device`, by default
//!    the one current when it is built): its pages are there, it serves
//!    storages of that GPU (`storage::device`; another is refused at attach),
//!    and its host operations make that GPU current themselves. Several GPUs:
//!    a cache per GPU, each in front of that GPU's storage.
//!  - After a timeout the cache's GPU memory outlives the cache: when a
//!    slot was lost or a queue of a storage it served broke, the memory is
//!    handed to every such storage still alive (`storage::quarantine`) and
//!    freed once their controllers and engines are gone.
//!
//! @code
//!   bam::page_cache cache({.page_size = 4096, .capacity = 1ull << 30});
//!   bam::array<float> a(cache, storage, n);      // see array.cuh
//!   my_kernel<<<g, b, 0, stream>>>(a.ref());
//!   a.check(stream);                             // throws bam::error on a device-side failure
//!   cache.flush(stream);                         // write back dirty pages, NVMe Flush
//! @endcode
#pragma once

#include <bam/cuda.cuh>
#include <bam/error.hpp>
#include <bam/detail/device_memory.cuh>
#include <bam/runtime/detail/page_cache_kernels.cuh>
#include <bam/runtime/error_record.cuh>
#include <bam/runtime/page_cache_ref.cuh>
#include <bam/runtime/storage.cuh>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace bam {

struct page_cache_config {
  std::size_t page_size = 4096;                              //!< 512 B .. 64 KiB, power of two
  std::size_t capacity = 64ull << 20;                        //!< bytes of GPU memory for page data
  std::uint32_t ways = 8;                                    //!< slots per set
  std::uint64_t timeout_ns = nvme::default_queue_timeout_ns; //!< bound of every wait without progress
  int device = -1;                                           //!< its CUDA device (-1: the one current at construction)
};

//! Misses and write-backs so far.
struct page_cache_counters {
  std::uint64_t misses = 0;     //!< pages loaded
  std::uint64_t writebacks = 0; //!< pages written back
};

namespace detail {

//! Where an array's pages are in the cache's key space.
struct array_binding {
  std::uint32_t space = 0;
  std::uint64_t first_page = 0; //!< the array's page 0 within the space
  std::uint64_t id = 0;
};

class cache_state {
public:
  explicit cache_state(const page_cache_config& cfg) : cfg_(cfg) {
    device_ = cfg.device >= 0 ? cfg.device : current_device();
    cfg_.device = device_;
    const device_scope on(device_);
    if (cfg.page_size < min_page_size || cfg.page_size > max_page_size || (cfg.page_size & (cfg.page_size - 1)))
      throw error("page_cache: page size must be a power of two in [512, 65536] (got " + std::to_string(cfg.page_size) +
                  ")");
    if (cfg.ways == 0 || cfg.ways > max_ways) throw error("page_cache: ways must be 1.." + std::to_string(max_ways));
    std::uint64_t nslots = cfg.capacity / cfg.page_size;
    nslots = nslots / cfg.ways * cfg.ways;
    if (nslots == 0)
      throw error("page_cache: capacity " + std::to_string(cfg.capacity) + " holds no set of " +
                  std::to_string(cfg.ways) + " pages of " + std::to_string(cfg.page_size) + " bytes");
    if (nslots > 0xffffffffull) throw error("page_cache: more than 2^32 slots");
    nslots_ = nslots;
    unsigned p = 0;
    while ((std::size_t{1} << p) < cfg.page_size)
      ++p;
    page_shift_ = p;
    // Aligned and sized for any transport (64 KiB GPU pages for nvidia_p2p).
    data_ = aligned_device_memory(nslots * cfg.page_size, gpu_page_size);
    slots_ = device_buffer<std::uint64_t>(nslots);
    status_ = device_buffer<std::uint16_t>(nslots);
    sets_ = device_buffer<cache_set>(nslots / cfg.ways);
    spaces_ = device_buffer<space_ref>(max_spaces);
    counters_ = device_buffer<unsigned long long>(2 * counter_stripes);
    host_spaces_.resize(max_spaces);
  }

  ~cache_state() {
    on_device_.enter_quietly(device_); // also while the members are freed
    write_back_at_destruction();
    // A slot whose command timed out may still be written by that command,
    // and so may a slot whose waiter gave up because its queue broke (a
    // timeout of another command): the pages (and their mappings) then stay
    // allocated until every storage that used them is gone.
    try {
      bool keep = false;
      for (const auto& w : served_)
        if (auto st = w.lock()) keep = keep || queue_broken(*st);
      if (keep || any_slot_lost_or_unknown()) {
        auto q = std::make_shared<quarantined_pages>();
        for (auto& sp : host_spaces_)
          if (sp.mapping) q->mappings.push_back(sp.mapping);
        q->pages = std::move(data_);
        for (const auto& w : served_)
          if (auto st = w.lock()) detail::quarantine(*st, q);
      }
    } catch (const std::exception& e) {
      warn(std::string("page cache destruction: ") + e.what());
    }
  }

  //! Dirty pages still here (a write-back failed, or no array detached them)
  //! get a last chance.
  void write_back_at_destruction() noexcept {
    bool any = false;
    for (const auto& s : host_spaces_)
      any |= s.used;
    if (!any) return;
    try {
      std::lock_guard lock(mutex_);
      writeback_locked(~0u, false, nullptr);
      for (std::uint32_t id = 0; id < max_spaces; ++id) {
        if (!host_spaces_[id].used) continue;
        try {
          throw_space_error(id, "page cache write-back at destruction failed: data of those pages is lost", nullptr);
        } catch (const std::exception& e) {
          warn(e.what());
        }
      }
    } catch (const std::exception& e) {
      warn(std::string("page cache destruction: ") + e.what());
    }
  }

  page_cache_ref ref() const {
    return page_cache_ref(data_.data(), slots_.get(), status_.get(), sets_.get(), spaces_.get(), counters_.get(),
                          nslots_, nslots_ / cfg_.ways, cfg_.ways, page_shift_, cfg_.timeout_ns);
  }
  const page_cache_config& config() const { return cfg_; }
  std::uint64_t slot_count() const { return nslots_; }
  int device() const { return device_; }

  //! Attach `npages` pages of an array at `start_lba` (on every controller of `s`).
  array_binding attach(const storage& s, std::uint64_t start_lba, std::uint64_t npages, cudaStream_t stream) {
    const device_scope on(device_);
    std::lock_guard lock(mutex_);
    const std::string where = s.name();
    if (s.device() != device_)
      throw error("page_cache: the cache is on CUDA device " + std::to_string(device_) + " and storage " + where +
                  " on device " + std::to_string(s.device()) +
                  " (a cache serves storages of its own GPU: build one per GPU, e.g. with "
                  "page_cache_config::device and storage_options::device)");
    if (cfg_.page_size % s.lba_size() != 0)
      throw error("page_cache: page size " + std::to_string(cfg_.page_size) + " is not a multiple of the LBA size " +
                  std::to_string(s.lba_size()) + " of " + where);
    for (std::uint32_t i = 0; i < s.controller_count(); ++i) {
      const queue_set_ref q = s.ref(i);
      if (cfg_.page_size > q.max_transfer_bytes)
        throw error("page_cache: pages of " + std::to_string(cfg_.page_size) + " bytes exceed the largest transfer (" +
                    std::to_string(q.max_transfer_bytes) + " bytes) of controller " + s.controller_name(i));
    }
    const std::uint32_t bpp = static_cast<std::uint32_t>(cfg_.page_size / s.lba_size());
    const std::uint32_t nctrl = s.controller_count();
    const std::uint64_t per_ctrl_pages = (npages + nctrl - 1) / nctrl;
    const std::uint64_t blocks = s.blocks_per_controller();
    if (npages == 0 || start_lba > blocks || per_ctrl_pages > (blocks - start_lba) / bpp) {
      error_context c;
      c.controller = where;
      c.lba = start_lba;
      c.status = nvme::status_out_of_range;
      throw error("page_cache: " + std::to_string(npages) + " pages of " + std::to_string(cfg_.page_size) +
                      " bytes from LBA " + std::to_string(start_lba) + " do not fit on " + std::to_string(nctrl) +
                      " controller(s) of " + std::to_string(blocks) + " blocks",
                  c);
    }
    const bool aligned = start_lba % bpp == 0;
    const std::uint64_t lo = start_lba, hi = start_lba + per_ctrl_pages * bpp;
    for (const auto& e : extents_) {
      if (e.storage != s.state().get() || e.hi <= lo || hi <= e.lo) continue;
      if (aligned && e.aligned) continue; // both on page boundaries: they share the pages
      error_context c;
      c.controller = where;
      c.lba = std::max(lo, e.lo);
      throw error("page_cache: an array over LBAs [" + std::to_string(lo) + ", " + std::to_string(hi) +
                      ") overlaps one over [" + std::to_string(e.lo) + ", " + std::to_string(e.hi) +
                      ") on the same storage; arrays that share blocks must both start on a page boundary (a "
                      "multiple of " +
                      std::to_string(bpp) + " blocks)",
                  c);
    }
    array_binding b;
    std::uint32_t id = max_spaces;
    if (aligned) {
      for (std::uint32_t i = 0; i < max_spaces; ++i)
        if (host_spaces_[i].used && host_spaces_[i].shared && host_spaces_[i].storage->state() == s.state()) id = i;
      const std::uint64_t space_pages = blocks / bpp * nctrl;
      if (space_pages > key_page_mask)
        throw error("page_cache: " + where + " holds " + std::to_string(space_pages) + " pages of " +
                    std::to_string(cfg_.page_size) +
                    " bytes; a cache addresses at most 2^34 pages per storage: "
                    "use larger pages");
      if (id == max_spaces) id = new_space(s, true, 0, space_pages, bpp, stream);
      host_spaces_[id].zombie = false; // an array over its pages again: they get written back as usual
      b.first_page = start_lba / bpp * nctrl;
    } else {
      id = new_space(s, false, start_lba, npages, bpp, stream);
      b.first_page = 0;
    }
    host_spaces_[id].users++;
    b.space = id;
    b.id = next_array_id_++;
    extents_.push_back({b.id, s.state().get(), lo, hi, aligned, id});
    return b;
  }

  //! Attach an array over a file: `npages` pages of the file whose extent
  //! map `file` (device memory, kept alive by `keep`) places on `s`'s one
  //! controller. The pages get a space of their own, read-only; blocks in
  //! holes and past the file's end read as zeroes.
  array_binding attach_file(const storage& s, const extent_map_ref* file, std::shared_ptr<void> keep,
                            std::uint64_t npages, cudaStream_t stream) {
    std::lock_guard lock(mutex_);
    const std::string where = s.name();
    if (s.controller_count() != 1)
      throw error("page_cache: a file lies on one disk; " + where + " has " + std::to_string(s.controller_count()) +
                  " controllers");
    if (cfg_.page_size % s.lba_size() != 0)
      throw error("page_cache: page size " + std::to_string(cfg_.page_size) + " is not a multiple of the LBA size " +
                  std::to_string(s.lba_size()) + " of " + where);
    if (npages == 0 || npages > key_page_mask)
      throw error("page_cache: a file of " + std::to_string(npages) + " pages (1 to 2^34)");
    const std::uint32_t bpp = static_cast<std::uint32_t>(cfg_.page_size / s.lba_size());
    const std::uint32_t id = new_space(s, false, 0, npages, bpp, stream, file);
    host_spaces_[id].file = std::move(keep);
    host_spaces_[id].users++;
    array_binding b;
    b.space = id;
    b.first_page = 0;
    b.id = next_array_id_++;
    return b;
  }

  //! Write back and forget an array's pages when it is its space's last
  //! user. If the write-back fails, the pages stay (the space lives on, its
  //! storage kept alive) and the error is thrown; `flush` tries again.
  void detach(const array_binding& b, cudaStream_t stream) {
    const device_scope on(device_);
    std::lock_guard lock(mutex_);
    auto forget = [&] { std::erase_if(extents_, [&](const extent& e) { return e.id == b.id; }); };
    space_host& sp = host_spaces_[b.space];
    if (!sp.used || sp.users == 0 || --sp.users != 0) {
      forget();
      return;
    }
    writeback_locked(b.space, true, stream);
    try {
      throw_space_error(b.space,
                        "page cache write-back on detach failed (the dirty pages stay in the cache; "
                        "page_cache::flush retries)",
                        stream);
    } catch (...) {
      // The space lives on with its dirty pages (and its storage); its LBAs
      // stay claimed, so no other array reads around them.
      sp.zombie = true;
      throw;
    }
    forget();
    release_space(b.space, stream);
  }

  //! Write back every dirty page, then NVMe Flush every controller of every
  //! storage in use. Throws the first failure (also one recorded by an
  //! earlier `flush_async`).
  void flush(cudaStream_t stream) {
    const device_scope on(device_);
    std::lock_guard lock(mutex_);
    writeback_locked(~0u, false, stream);
    const std::vector<storage> storages = storages_in_use();
    std::vector<device_buffer<device_error_record>> errs;
    for (const auto& s : storages) {
      errs.emplace_back(1);
      launch_nvme_flush(s, errs.back().get(), stream);
    }
    BAM_CUDA_TRY(cudaStreamSynchronize(stream));
    std::optional<error> first;
    for (std::uint32_t id = 0; id < max_spaces; ++id) {
      if (!host_spaces_[id].used) continue;
      try {
        throw_space_error(id, "page cache write-back failed", stream);
        if (host_spaces_[id].zombie) { // its pages reached the storage at last
          writeback_locked(id, true, stream);
          release_space(id, stream);
        }
      } catch (const error& e) {
        if (!first) first = e;
      }
    }
    for (std::size_t i = 0; i < storages.size(); ++i) {
      try {
        const storage& s = storages[i];
        throw_if_recorded(
            errs[i].get(), "NVMe Flush failed", [&](std::uint32_t c) { return s.controller_name(c); }, stream);
      } catch (const error& e) {
        if (!first) first = e;
      }
    }
    if (first) throw *first;
  }

  //! The write-back and NVMe Flush of `flush`, enqueued on `stream` without
  //! waiting for them. A failure is recorded: the next `flush`, `detach` or
  //! `check_space` (`array::check`) of an array on that storage throws it.
  void flush_async(cudaStream_t stream) {
    const device_scope on(device_);
    std::lock_guard lock(mutex_);
    launch_writeback(~0u, false, stream);
    for (const auto& s : storages_in_use()) {
      for (auto& sp : host_spaces_) {
        if (!sp.used || sp.storage->state() != s.state()) continue;
        launch_nvme_flush(s, sp.flush_err.get(), stream); // recorded with the storage's first space
        break;
      }
    }
  }

  page_cache_counters counters(cudaStream_t stream) const {
    const device_scope on(device_);
    unsigned long long c[2 * counter_stripes];
    copy_to_host(c, counters_.get(), 2 * counter_stripes, stream);
    page_cache_counters out;
    for (std::uint32_t i = 0; i < counter_stripes; ++i) {
      out.misses += c[2 * i];
      out.writebacks += c[2 * i + 1];
    }
    return out;
  }

  //! Throw a recorded write-back failure of space `id`'s pages, if any.
  void check_space(std::uint32_t id, cudaStream_t stream) {
    const device_scope on(device_);
    std::lock_guard lock(mutex_);
    if (id < max_spaces && host_spaces_[id].used) throw_space_error(id, "page cache write-back failed", stream);
  }

  //! Name of controller `ctrl` of the storage behind space `id`.
  std::string controller_name(std::uint32_t id, std::uint32_t ctrl) const {
    return host_spaces_.at(id).storage->controller_name(ctrl);
  }

  static constexpr std::size_t min_page_size = 512;
  static constexpr std::size_t max_page_size = 64 * 1024;
  static constexpr std::uint32_t max_ways = 64;

private:
  struct space_host {
    bool used = false;
    bool shared = false; //!< the page-aligned space of a storage (shared by arrays)
    bool zombie = false; //!< no array left, dirty pages not written back yet
    std::uint32_t users = 0;
    std::optional<bam::storage> storage;
    std::shared_ptr<storage_mapping> mapping;
    device_buffer<device_error_record> err;
    device_buffer<device_error_record> flush_err; //!< an NVMe Flush of `flush_async`
    std::shared_ptr<void> file;                   //!< a file space's extent map in device memory
  };
  struct extent {
    std::uint64_t id;
    const storage_state* storage;
    std::uint64_t lo, hi; //!< LBAs on every controller
    bool aligned;
    std::uint32_t space;
  };

  std::uint32_t new_space(const storage& s, bool shared, std::uint64_t base_lba, std::uint64_t npages,
                          std::uint32_t bpp, cudaStream_t stream, const extent_map_ref* file = nullptr) {
    std::uint32_t id = 0;
    while (id < max_spaces && host_spaces_[id].used)
      ++id;
    if (id == max_spaces) throw error("page_cache: too many arrays with pages of their own (127)");
    space_host& sp = host_spaces_[id];
    // One mapping of the cache's pages per storage, shared by its spaces.
    for (const auto& other : host_spaces_)
      if (other.used && other.storage->state() == s.state()) sp.mapping = other.mapping;
    if (!sp.mapping) sp.mapping = std::shared_ptr<storage_mapping>(s.map(data_.data(), data_.size()));
    sp.storage = s;
    remember(s);
    sp.err = device_buffer<device_error_record>(1);
    sp.flush_err = device_buffer<device_error_record>(1);
    sp.used = true;
    sp.shared = shared;
    sp.zombie = false;
    sp.users = 0;
    space_ref r;
    r.ctrls = s.device_refs();
    r.data_bus = sp.mapping->bus_tables();
    r.err = sp.err.get();
    r.file = file;
    r.base_lba = base_lba;
    r.npages = npages;
    r.nctrl = s.controller_count();
    r.blocks_per_page = bpp;
    copy_to_device(spaces_.get() + id, &r, 1, stream);
    BAM_CUDA_TRY(cudaStreamSynchronize(stream));
    return id;
  }

  //! Pages a timed-out command may still write, with the mappings of them:
  //! the mappings are undone before the pages are freed.
  struct quarantined_pages {
    aligned_device_memory pages;
    std::vector<std::shared_ptr<storage_mapping>> mappings; // destroyed first
  };

  //! A storage these pages served (kept weakly: a storage that is gone has
  //! stopped its controllers and engines).
  void remember(const storage& s) {
    for (const auto& w : served_)
      if (w.lock() == s.state()) return;
    std::erase_if(served_, [](const std::weak_ptr<storage_state>& w) { return w.expired(); });
    served_.push_back(s.state());
  }

  //! Does `s` say that one of its queues broke? A failed look says yes:
  //! keeping memory is the safe side.
  static bool queue_broken(const storage_state& s) {
    try {
      return any_queue_broken(s);
    } catch (const std::exception&) {
      return true;
    }
  }

  //! Is any slot out of use for good (its load or write-back timed out)?
  //! A failed look says yes: keeping memory is the safe side.
  bool any_slot_lost_or_unknown() const noexcept {
    try {
      return any_slot_lost();
    } catch (const std::exception&) {
      return true;
    }
  }
  bool any_slot_lost() const {
    constexpr std::uint64_t chunk = 1u << 20;
    std::vector<std::uint64_t> words(static_cast<std::size_t>(std::min<std::uint64_t>(chunk, nslots_)));
    for (std::uint64_t first = 0; first < nslots_; first += chunk) {
      const std::uint64_t n = std::min<std::uint64_t>(chunk, nslots_ - first);
      copy_to_host(words.data(), slots_.get() + first, static_cast<std::size_t>(n));
      for (std::uint64_t k = 0; k < n; ++k)
        if (slot_lost(words[k])) return true;
    }
    return false;
  }

  void release_space(std::uint32_t id, cudaStream_t stream) {
    std::erase_if(extents_, [&](const extent& e) { return e.space == id; });
    space_host& sp = host_spaces_[id];
    // The mapping of the pages for that storage ends here, unless one of its
    // commands timed out (it may still reach them): then it stays with it.
    if (sp.storage && sp.mapping && queue_broken(*sp.storage->state())) sp.storage->quarantine(sp.mapping);
    const space_ref none{};
    copy_to_device(spaces_.get() + id, &none, 1, stream);
    BAM_CUDA_TRY(cudaStreamSynchronize(stream));
    sp = space_host{};
  }

  void writeback_locked(std::uint32_t only, bool invalidate, cudaStream_t stream) {
    launch_writeback(only, invalidate, stream);
    BAM_CUDA_TRY(cudaStreamSynchronize(stream));
  }
  void launch_writeback(std::uint32_t only, bool invalidate, cudaStream_t stream) {
    constexpr unsigned threads = 256;
    const unsigned blocks = static_cast<unsigned>(std::min<std::uint64_t>((nslots_ + threads - 1) / threads, 4096));
    cache_writeback_kernel<><<<blocks, threads, 0, stream>>>(ref(), only, invalidate);
    BAM_CUDA_TRY(cudaGetLastError());
  }
  static void launch_nvme_flush(const storage& s, device_error_record* err, cudaStream_t stream) {
    const std::uint32_t n = s.controller_count();
    const unsigned blocks = (n + flush_threads_per_block - 1) / flush_threads_per_block;
    flush_controllers_kernel<><<<blocks, flush_threads_per_block, 0, stream>>>(s.device_refs(), n, err);
    BAM_CUDA_TRY(cudaGetLastError());
  }
  //! Each storage with a space in use, once.
  std::vector<storage> storages_in_use() const {
    std::vector<storage> out;
    for (const auto& sp : host_spaces_) {
      if (!sp.used) continue;
      if (std::none_of(out.begin(), out.end(), [&](const storage& x) { return x.state() == sp.storage->state(); }))
        out.push_back(*sp.storage);
    }
    return out;
  }

  void throw_space_error(std::uint32_t id, const std::string& what, cudaStream_t stream) {
    const space_host& sp = host_spaces_[id];
    auto name = [&](std::uint32_t c) { return sp.storage->controller_name(c); };
    throw_if_recorded(sp.err.get(), what, name, stream);
    throw_if_recorded(sp.flush_err.get(), "NVMe Flush (page_cache::flush_async) failed", name, stream);
  }

  device_scope on_device_; // first: current while the other members are freed
  page_cache_config cfg_;
  int device_ = 0;
  std::uint64_t nslots_ = 0;
  unsigned page_shift_ = 0;
  aligned_device_memory data_; // freed after every mapping of it is undone (declared first)
  device_buffer<std::uint64_t> slots_;
  device_buffer<std::uint16_t> status_;
  device_buffer<cache_set> sets_;
  device_buffer<space_ref> spaces_;
  device_buffer<unsigned long long> counters_;
  std::vector<space_host> host_spaces_;              // holds the mappings: destroyed before data_
  std::vector<std::weak_ptr<storage_state>> served_; // storages these pages served
  std::vector<extent> extents_;
  std::uint64_t next_array_id_ = 1;
  mutable std::mutex mutex_;
};

} // namespace detail

//! Owning host handle of a page cache in GPU memory. Copies share the cache;
//! arrays keep it alive.
class page_cache {
public:
  explicit page_cache(const page_cache_config& cfg) : s_(std::make_shared<detail::cache_state>(cfg)) {}

  page_cache_ref ref() const { return s_->ref(); }
  std::size_t page_size() const { return s_->config().page_size; }
  std::uint64_t slot_count() const { return s_->slot_count(); }
  const page_cache_config& config() const { return s_->config(); }
  //! The CUDA device that holds the pages (and runs the kernels that use them).
  int device() const { return s_->device(); }
  //! GPU memory held by metadata (state words, statuses, sets, space table, counters).
  std::size_t metadata_bytes() const {
    return slot_count() * (sizeof(std::uint64_t) + sizeof(std::uint16_t)) +
           slot_count() / config().ways * sizeof(detail::cache_set) + detail::max_spaces * sizeof(detail::space_ref) +
           2 * detail::counter_stripes * sizeof(unsigned long long);
  }
  //! Misses (page loads) and write-backs so far (waits for `stream`).
  page_cache_counters counters(cuda::stream_ref stream = {}) const { return s_->counters(stream.get()); }

  //! Write back every dirty page, then NVMe Flush every controller involved.
  //! Runs on `stream` and waits for it (call it when the kernels that write
  //! through the cache are done).
  //! @throw bam::error for a failed write-back or NVMe Flush, also one that
  //! an earlier `flush_async` recorded.
  void flush(cuda::stream_ref stream = {}) { s_->flush(stream.get()); }
  //! The same work enqueued on `stream`, without waiting for it: data
  //! written by kernels before it on `stream` reaches the storage. A failure
  //! is recorded, and thrown by the next `flush`, or by `check`/`detach` of
  //! an array on that storage.
  void flush_async(cuda::stream_ref stream = {}) { s_->flush_async(stream.get()); }

  //! The shared state (arrays keep it alive).
  std::shared_ptr<detail::cache_state> state() const { return s_; }

private:
  std::shared_ptr<detail::cache_state> s_;
};

} // namespace bam
