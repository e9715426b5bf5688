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
//!    and its host operations make that GPU current themselves.
//!  - Several GPUs, one cache (`page_cache_config::devices`): the slots are
//!    spread over the GPUs' memory, in runs of slots placed on the GPUs in
//!    turn (`spread_run_bytes`: 2 MiB of pages, or a 64th of a GPU's part
//!    when that is more), so each GPU holds an equal part of the cache,
//!    within a run. A page's set, a hash of its key, decides its slot
//!    and so its home GPU: the node holds one copy of it, a warp on any GPU
//!    reads it where it is (over NVLink for another GPU's), and a miss loads
//!    it into its home slot through the missing GPU's own queues. Each GPU
//!    attaches arrays over a storage of its own (`storage_options::device`)
//!    on one medium (`emu-gpu:shm=NAME`, a file, the same SSDs:
//!    `storage::medium`): arrays of the same medium at the same place share
//!    their pages whichever GPU attached them. The GPUs need peer access to
//!    each other's memory (enabled here). In one process; arrays must start
//!    on a page boundary, and files by extent map are not served.
//!  - Several processes, one cache (`page_cache_config::group`): with one
//!    process per GPU (torchrun's layout), every process builds the cache
//!    with the same configuration and group name and its own rank. Each
//!    makes the runs whose index modulo the group's size is its rank on
//!    its own GPU and maps the others' runs (CUDA's shareable memory
//!    handles, handed over Unix sockets of the host: abstract names, same
//!    user only). The rest is as with several GPUs in one process: one copy
//!    of a page in the job, misses loaded through the missing process's
//!    own queues, media matched by `storage::medium` (shared media only:
//!    `emu-gpu:shm=NAME`, a file, SSDs; up to 127 per group). Each process
//!    writes back the dirty pages of the media it attached, whoever wrote
//!    them (`flush`, eviction, at destruction); detaching an array leaves
//!    its clean pages to the others. Counters count the process's own
//!    kernels. A process that dies while its kernels pin pages leaves them
//!    pinned: misses on their sets may then time out.
//!  - A miss evicts dirty pages only of media its GPU has queues for: a
//!    set full of another GPU's dirty pages waits for that GPU to write
//!    them back (its flush or misses), within the deadline.
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
#include <bam/detail/process_group.hpp>
#include <bam/detail/spread_memory.cuh>
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
  //! Two or more CUDA devices: one cache whose pages are spread over all of
  //! them (`device` is then ignored; the first of them runs the cache's own
  //! host work). See "Several GPUs, one cache" above.
  std::vector<int> devices;
  //! Several processes, one cache (one process per GPU, e.g. under
  //! torchrun): every process of the job builds the cache with the same
  //! configuration, the same `group.name` and its own `group.rank`; each
  //! brings the slots of its own GPU (`device`). See "Several processes,
  //! one cache" above.
  struct group_config {
    std::string name; //!< empty: no group. Unique on the host while the job runs (e.g. from the job's store)
    int rank = 0;     //!< this process's place, 0 .. size - 1
    int size = 0;     //!< processes in the group
    std::uint64_t timeout_ms = 120000; //!< how long building the cache waits for the other processes
  } group;
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
    group_ = !cfg.group.name.empty();
    if (group_ && !cfg.devices.empty())
      throw error::invalid_input("page_cache: a cache of several processes (group) takes its GPU from `device`, "
                                 "not `devices`: each process brings its own");
    devices_ = cfg.devices.size() >= 2 && !group_ ? cfg.devices
                                                  : std::vector<int>{cfg.device >= 0 ? cfg.device : current_device()};
    device_ = devices_[0];
    caller_ = device_;
    cfg_.device = device_;
    cfg_.devices = devices_;
    if (devices_.size() > 1) enable_peer_access(devices_);
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
    if (group_) {
      build_group_memory();
    } else if (devices_.size() == 1) {
      // Aligned and sized for any transport (64 KiB GPU pages for nvidia_p2p).
      data_ = aligned_device_memory(nslots * cfg.page_size, gpu_page_size);
      slots_ = device_buffer<std::uint64_t>(nslots);
      data_ptr_ = data_.data();
      data_bytes_ = data_.size();
      slots_ptr_ = slots_.get();
    } else {
      std::size_t gran = gpu_page_size;
      for (const int d : devices_)
        gran = std::max(gran, spread_granularity(d));
      const auto [page_run, state_run] = spread_runs(devices_.size(), gran);
      spread_data_ = std::make_shared<spread_device_memory>(nslots * cfg.page_size, page_run, devices_);
      spread_slots_ = std::make_shared<spread_device_memory>(nslots * sizeof(std::uint64_t), state_run, devices_);
      data_ptr_ = spread_data_->data();
      data_bytes_ = spread_data_->size();
      slots_ptr_ = reinterpret_cast<std::uint64_t*>(spread_slots_->data());
    }
    if (!group_) {
      // Touched by misses only: on the first GPU, reached by the others as peers.
      status_ = device_buffer<std::uint16_t>(nslots);
      sets_ = device_buffer<cache_set>(nslots / cfg.ways);
      status_ptr_ = status_.get();
      sets_ptr_ = sets_.get();
    }
    for (const int d : devices_) {
      const device_scope here(d);
      spaces_.emplace_back(max_spaces);
      counters_.emplace_back(2 * counter_stripes);
    }
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
          for (auto& m : sp.mapping)
            if (m) q->mappings.push_back(m);
        q->pages = std::move(data_);
        q->spread_pages = spread_data_;
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
      caller_ = device_;
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

  //! The handle for kernels on the cache's `i`-th device.
  page_cache_ref ref(std::size_t i = 0) const {
    return page_cache_ref(data_ptr_, slots_ptr_, status_ptr_, sets_ptr_, spaces_.at(i).get(), counters_.at(i).get(),
                          nslots_, nslots_ / cfg_.ways, cfg_.ways, page_shift_, cfg_.timeout_ns, spread());
  }
  const page_cache_config& config() const { return cfg_; }
  std::uint64_t slot_count() const { return nslots_; }
  int device() const { return device_; }
  const std::vector<int>& devices() const { return devices_; }
  //! The index of CUDA device `d` among the cache's devices.
  std::size_t device_index(int d) const {
    for (std::size_t i = 0; i < devices_.size(); ++i)
      if (devices_[i] == d) return i;
    std::string list;
    for (const int x : devices_)
      list += (list.empty() ? "" : ", ") + std::to_string(x);
    throw error("page_cache: CUDA device " + std::to_string(d) + " is not one of the cache's devices (" + list + ")");
  }
  //! The CUDA device that holds slot `slot`'s page (-1: another process's GPU).
  int slot_device(std::uint64_t slot) const {
    if (group_) return slot_part(slot) == static_cast<std::size_t>(cfg_.group.rank) ? device_ : -1;
    return devices_.size() == 1 ? device_ : devices_[slot_part(slot)];
  }
  //! Whose memory holds slot `slot`'s page: the index of its GPU in
  //! `devices`, or the rank of its process in a group.
  std::size_t slot_part(std::uint64_t slot) const {
    const std::size_t parts = group_ ? static_cast<std::size_t>(cfg_.group.size) : devices_.size();
    return parts == 1 ? 0 : static_cast<std::size_t>((slot / run_slots_) % parts);
  }
  //! The pages' memory: slot k's page at `k * page_size` bytes from here.
  std::uint8_t* data() const { return data_ptr_; }
  //! Slots per run of a spread cache (0: one GPU's cache).
  std::uint64_t run_slots() const { return spread() ? run_slots_ : 0; }
  //! Pages spread over several GPUs (of this process or of a group).
  bool spread() const { return devices_.size() > 1 || group_; }
  bool grouped() const { return group_; }

  //! Attach `npages` pages of an array at `start_lba` (on every controller of `s`).
  array_binding attach(const storage& s, std::uint64_t start_lba, std::uint64_t npages, cudaStream_t stream) {
    const int caller = caller_device(stream);
    const device_scope on(device_);
    std::lock_guard lock(mutex_);
    caller_ = caller;
    const std::string where = s.name();
    if (std::find(devices_.begin(), devices_.end(), s.device()) == devices_.end()) {
      if (devices_.size() == 1)
        throw error("page_cache: the cache is on CUDA device " + std::to_string(device_) + " and storage " + where +
                    " on device " + std::to_string(s.device()) +
                    " (a cache serves storages of its own GPU: build one per GPU, e.g. with "
                    "page_cache_config::device and storage_options::device, or one over several GPUs with "
                    "page_cache_config::devices)");
      (void)device_index(s.device()); // throws, naming the cache's devices
    }
    const std::size_t dev = device_index(s.device());
    if (cfg_.page_size % s.lba_size() != 0)
      throw error("page_cache: page size " + std::to_string(cfg_.page_size) + " is not a multiple of the LBA size " +
                  std::to_string(s.lba_size()) + " of " + where);
    for (std::uint32_t i = 0; i < s.controller_count(); ++i) {
      const queue_set_ref q = s.ref(i);
      if (cfg_.page_size > q.max_transfer_bytes())
        throw error("page_cache: pages of " + std::to_string(cfg_.page_size) + " bytes exceed the largest transfer (" +
                    std::to_string(q.max_transfer_bytes()) + " bytes) of controller " + s.controller_name(i));
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
    if (!aligned && spread())
      throw error("page_cache: on a cache over several GPUs an array starts on a page boundary (LBA " +
                  std::to_string(start_lba) + " is not a multiple of " + std::to_string(bpp) + " blocks)");
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
      std::uint32_t want = max_spaces;
      if (group_) {
        // The medium's number in the whole group: every process keys its pages alike.
        const std::string m = s.medium();
        if (m.rfind("storage@", 0) == 0)
          throw error("page_cache: a cache shared by several processes serves storages on a shared medium "
                      "(emu-gpu:shm=NAME, emu:file=PATH, SSDs); " +
                      where + " is this process's alone");
        want = directory_.number(m, std::chrono::milliseconds(cfg_.group.timeout_ms));
        if (host_spaces_[want].used) id = want;
      } else {
        for (std::uint32_t i = 0; i < max_spaces; ++i)
          if (host_spaces_[i].used && host_spaces_[i].shared && same_medium(host_spaces_[i], s)) id = i;
      }
      const std::uint64_t space_pages = blocks / bpp * nctrl;
      if (space_pages > key_page_mask)
        throw error("page_cache: " + where + " holds " + std::to_string(space_pages) + " pages of " +
                    std::to_string(cfg_.page_size) +
                    " bytes; a cache addresses at most 2^34 pages per storage: "
                    "use larger pages");
      if (id == max_spaces)
        id = new_space(s, true, 0, space_pages, bpp, stream, nullptr, want);
      else if (!host_spaces_[id].storage[dev])
        add_storage(id, s, stream);    // the first array of this medium on this GPU
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
    caller_ = device_;
    const std::string where = s.name();
    if (spread())
      throw error("page_cache: arrays over a file's extent map are not served by a cache over several GPUs");
    (void)device_index(s.device());
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
    const int caller = caller_device(stream);
    const device_scope on(device_);
    std::lock_guard lock(mutex_);
    caller_ = caller;
    auto forget = [&] { std::erase_if(extents_, [&](const extent& e) { return e.id == b.id; }); };
    space_host& sp = host_spaces_[b.space];
    if (!sp.used || sp.users == 0 || --sp.users != 0) {
      forget();
      return;
    }
    // A group's other processes may still read the pages: they stay.
    writeback_locked(b.space, !group_, stream);
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
    const int caller = caller_device(stream);
    const device_scope on(device_);
    std::lock_guard lock(mutex_);
    caller_ = caller;
    writeback_locked(~0u, false, stream);
    const std::vector<storage> storages = storages_in_use();
    std::vector<device_buffer<device_error_record>> errs;
    for (const auto& s : storages) {
      errs.emplace_back(1);
      on_device(device_index(s.device()), stream,
                [&](std::size_t, cudaStream_t st) { launch_nvme_flush(s, errs.back().get(), st); });
    }
    sync_caller(stream);
    std::optional<error> first;
    for (std::uint32_t id = 0; id < max_spaces; ++id) {
      if (!host_spaces_[id].used) continue;
      try {
        throw_space_error(id, "page cache write-back failed", stream);
        if (host_spaces_[id].zombie) { // its pages reached the storage at last
          writeback_locked(id, !group_, stream);
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
    const int caller = caller_device(stream);
    const device_scope on(device_);
    std::lock_guard lock(mutex_);
    caller_ = caller;
    launch_writeback(~0u, false, stream);
    for (const auto& s : storages_in_use()) {
      for (auto& sp : host_spaces_) {
        if (!sp.used || !holds(sp, s)) continue;
        // recorded with the storage's first space
        on_device(device_index(s.device()), stream,
                  [&](std::size_t, cudaStream_t st) { launch_nvme_flush(s, sp.flush_err.get(), st); });
        break;
      }
    }
  }

  //! Write back the dirty pages of `s`'s medium; with `forget`, then forget
  //! them, and throw if any stays (held by a kernel, or its write-back
  //! failed). Throws the first write-back failure of those pages.
  void write_back_medium(const storage& s, bool forget, cudaStream_t stream) {
    const int caller = caller_device(stream);
    const device_scope on(device_);
    std::lock_guard lock(mutex_);
    caller_ = caller;
    std::vector<std::uint32_t> ids;
    for (std::uint32_t id = 0; id < max_spaces; ++id)
      if (host_spaces_[id].used && same_medium(host_spaces_[id], s)) ids.push_back(id);
    // A group keys a medium's pages by its number in the group: they stay
    // after this process's last array over it went, and other processes
    // bring in more.
    const std::string medium = s.medium();
    if (group_ && forget) {
      const std::optional<std::uint32_t> n = directory_.find(medium);
      if (n && std::find(ids.begin(), ids.end(), *n) == ids.end()) ids.push_back(*n);
    }
    if (ids.empty()) return; // no page of it here
    std::optional<error> first;
    for (const std::uint32_t id : ids) {
      writeback_locked(id, forget, stream);
      if (!host_spaces_[id].used) continue;
      try {
        throw_space_error(id, "page cache write-back failed", stream);
        // A zombie whose pages reached the storage at last, and are gone from the cache.
        if (forget && host_spaces_[id].zombie && pages_of_spaces({id}) == 0) release_space(id, stream);
      } catch (const error& e) {
        if (!first) first = e;
      }
    }
    if (first) throw *first;
    if (!forget) return;
    const std::uint64_t kept = pages_of_spaces(ids);
    if (kept != 0)
      throw error("page_cache::invalidate: " + std::to_string(kept) + " page(s) of " + medium +
                  " stay in the cache: kernels hold them, or their write-back failed or is another process's to do "
                  "(invalidate when no kernel uses those arrays)");
  }

  //! Misses and write-backs of kernels on device `only` (-1: all the cache's devices).
  page_cache_counters counters(cudaStream_t stream, int only = -1) const {
    const int caller = caller_device(stream);
    const device_scope on(device_);
    page_cache_counters out;
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      if (only >= 0 && devices_[d] != only) continue;
      unsigned long long c[2 * counter_stripes];
      if (devices_[d] == caller) {
        const device_scope there(caller);
        copy_to_host(c, counters_[d].get(), 2 * counter_stripes, stream);
      } else {
        const device_scope there(devices_[d]);
        copy_to_host(c, counters_[d].get(), 2 * counter_stripes);
      }
      for (std::uint32_t i = 0; i < counter_stripes; ++i) {
        out.misses += c[2 * i];
        out.writebacks += c[2 * i + 1];
      }
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
    return any_storage(host_spaces_.at(id)).controller_name(ctrl);
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
    std::string medium; //!< `storage::medium` of its storages
    //! By device index: the storage whose queues that GPU's misses use, and
    //! its mapping of the cache's pages.
    std::vector<std::optional<bam::storage>> storage;
    std::vector<std::shared_ptr<storage_mapping>> mapping;
    device_buffer<device_error_record> err;
    device_buffer<device_error_record> flush_err; //!< an NVMe Flush of `flush_async`
    std::shared_ptr<void> file;                   //!< a file space's extent map in device memory
    const extent_map_ref* file_ref = nullptr;     //!< that map (device memory), or null
    std::uint64_t base_lba = 0;
    std::uint64_t npages = 0;
    std::uint32_t bpp = 0;
  };
  struct extent {
    std::uint64_t id;
    const storage_state* storage;
    std::uint64_t lo, hi; //!< LBAs on every controller
    bool aligned;
    std::uint32_t space;
  };

  std::uint32_t new_space(const storage& s, bool shared, std::uint64_t base_lba, std::uint64_t npages,
                          std::uint32_t bpp, cudaStream_t stream, const extent_map_ref* file = nullptr,
                          std::uint32_t want = max_spaces) {
    std::uint32_t id = want;
    if (id == max_spaces)
      for (id = 0; id < max_spaces && host_spaces_[id].used;)
        ++id;
    if (id == max_spaces) throw error("page_cache: too many arrays with pages of their own (127)");
    space_host& sp = host_spaces_[id];
    sp.storage.assign(devices_.size(), std::nullopt);
    sp.mapping.assign(devices_.size(), nullptr);
    sp.medium = s.medium();
    sp.err = device_buffer<device_error_record>(1);
    sp.flush_err = device_buffer<device_error_record>(1);
    sp.used = true;
    sp.shared = shared;
    sp.zombie = false;
    sp.users = 0;
    sp.base_lba = base_lba;
    sp.npages = npages;
    sp.bpp = bpp;
    sp.file = nullptr;
    sp.file_ref = file;
    try {
      add_storage(id, s, stream);
    } catch (...) {
      sp = space_host{}; // no space without a storage
      throw;
    }
    return id;
  }

  //! Serve space `id`'s misses on `s`'s GPU through `s`'s queues.
  void add_storage(std::uint32_t id, const storage& s, cudaStream_t stream) {
    space_host& sp = host_spaces_[id];
    const std::size_t dev = device_index(s.device());
    if (sp.storage[dev]) return;
    for (const auto& other : sp.storage)
      if (other && (other->controller_count() != s.controller_count() || other->lba_size() != s.lba_size() ||
                    other->blocks_per_controller() != s.blocks_per_controller()))
        throw error("page_cache: " + s.name() + " and " + other->name() + " are both " + sp.medium +
                    " but differ in controllers, LBA size or blocks");
    // One mapping of the cache's pages per storage, shared by its spaces.
    for (const auto& other : host_spaces_)
      if (other.used && other.storage.size() > dev && other.storage[dev] && other.storage[dev]->state() == s.state())
        sp.mapping[dev] = other.mapping[dev];
    if (!sp.mapping[dev]) sp.mapping[dev] = std::shared_ptr<storage_mapping>(s.map(data_ptr_, data_bytes_));
    sp.storage[dev] = s;
    remember(s);
    space_ref r;
    r.ctrls = s.device_refs();
    r.data_bus = sp.mapping[dev]->bus_tables();
    r.err = sp.err.get();
    r.file = sp.file_ref;
    r.base_lba = sp.base_lba;
    r.npages = sp.npages;
    r.nctrl = s.controller_count();
    r.blocks_per_page = sp.bpp;
    {
      const device_scope there(devices_[dev]);
      copy_to_device(spaces_[dev].get() + id, &r, 1);
    }
    sync_caller(stream);
  }

  //! Do the pages of `sp` come from `s`'s medium (a single-GPU cache of one process: from `s` itself)?
  bool same_medium(const space_host& sp, const storage& s) const {
    if (devices_.size() == 1 && !group_) return sp.storage[0] && sp.storage[0]->state() == s.state();
    return sp.medium == s.medium();
  }
  //! Is `s` one of the storages serving `sp`?
  static bool holds(const space_host& sp, const storage& s) {
    for (const auto& x : sp.storage)
      if (x && x->state() == s.state()) return true;
    return false;
  }
  //! A storage serving `sp` (for names in messages).
  static const storage& any_storage(const space_host& sp) {
    for (const auto& x : sp.storage)
      if (x) return *x;
    throw error("page_cache: a key space without storage");
  }

  //! Run `fn(i, st)` for the cache's device `i` on a stream `st` of that
  //! device, ordered after the work on the caller's `stream` so far, and
  //! the caller's stream after it (a stream of another device waits through
  //! events).
  template <class F>
  void on_device(std::size_t i, cudaStream_t stream, F&& fn) {
    const int caller = caller_;
    if (devices_[i] == caller) {
      const device_scope here(caller);
      fn(i, stream);
      return;
    }
    cudaEvent_t before = nullptr, after = nullptr;
    {
      const device_scope here(caller);
      BAM_CUDA_TRY(cudaEventCreateWithFlags(&before, cudaEventDisableTiming));
      BAM_CUDA_TRY(cudaEventRecord(before, stream));
    }
    struct events {
      cudaEvent_t& a;
      cudaEvent_t& b;
      ~events() {
        if (a != nullptr) BAM_CUDA_LOG(cudaEventDestroy(a));
        if (b != nullptr) BAM_CUDA_LOG(cudaEventDestroy(b));
      }
    } own{before, after};
    {
      const device_scope there(devices_[i]);
      const cudaStream_t side = side_stream();
      BAM_CUDA_TRY(cudaStreamWaitEvent(side, before, 0));
      fn(i, side);
      BAM_CUDA_TRY(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
      BAM_CUDA_TRY(cudaEventRecord(after, side));
    }
    const device_scope here(caller);
    BAM_CUDA_TRY(cudaStreamWaitEvent(stream, after, 0));
  }

  //! The device of the caller's `stream` (the legacy default stream: the
  //! current device's); the cache's device for a cache on one GPU.
  int caller_device(cudaStream_t stream) const {
    if (devices_.size() == 1) return device_;
#if CUDART_VERSION >= 12080
    if (stream != nullptr) {
      int d = 0;
      BAM_CUDA_TRY(cudaStreamGetDevice(stream, &d));
      return d;
    }
#endif
    (void)stream;
    return current_device();
  }
  //! Wait for the caller's `stream` (on its device: the legacy default stream is per device).
  void sync_caller(cudaStream_t stream) const {
    const device_scope here(caller_);
    BAM_CUDA_TRY(cudaStreamSynchronize(stream));
  }

  //! Let each of `devices` reach the others' memory (the sets, statuses and
  //! error records that live on the first of them).
  static void enable_peer_access(const std::vector<int>& devices) {
    // Once per pair and process (a second call is an error for CUDA).
    static std::mutex m;
    static std::vector<std::pair<int, int>> done;
    const std::lock_guard lock(m);
    for (const int a : devices) {
      const device_scope on(a);
      for (const int b : devices) {
        if (a == b || std::find(done.begin(), done.end(), std::pair{a, b}) != done.end()) continue;
        int can = 0;
        BAM_CUDA_TRY(cudaDeviceCanAccessPeer(&can, a, b));
        if (!can)
          throw error("page_cache: CUDA device " + std::to_string(a) + " cannot access the memory of device " +
                      std::to_string(b) + " (no peer access): a cache over several GPUs needs it between all of them");
        const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) // enabled by the program itself
          (void)cudaGetLastError();
        else
          BAM_CUDA_TRY(e);
        done.emplace_back(a, b);
      }
    }
  }

  //! Cuts the memory of a cache spread over `parts` GPUs into runs (sets
  //! `run_slots_`): the bytes of a run of pages, and of a run of state words.
  std::pair<std::size_t, std::size_t> spread_runs(std::size_t parts, std::size_t gran) {
    const std::size_t pages = spread_run_bytes(nslots_ * cfg_.page_size, parts, gran);
    run_slots_ = pages / cfg_.page_size;
    return {pages, spread_run_bytes(nslots_ * sizeof(std::uint64_t), parts, gran)};
  }

  //! A group's memory: this process's runs of state words and pages (and,
  //! on rank 0, the sets, statuses and the directory of media), handed to
  //! the other processes, theirs taken from them.
  void build_group_memory() {
    const auto& g = cfg_.group;
    if (g.size < 1 || g.rank < 0 || g.rank >= g.size)
      throw error::invalid_input("page_cache: group '" + g.name + "' of " + std::to_string(g.size) +
                                 " processes has no rank " + std::to_string(g.rank));
    const std::size_t gran = std::max(gpu_page_size, spread_granularity(device_));
    const auto [page_run, state_run] = spread_runs(static_cast<std::size_t>(g.size), gran);
    const spread_device_memory::group_part part{static_cast<std::size_t>(g.size), static_cast<std::size_t>(g.rank),
                                                device_};
    spread_slots_ = std::make_shared<spread_device_memory>(nslots_ * sizeof(std::uint64_t), state_run, part);
    spread_data_ = std::make_shared<spread_device_memory>(nslots_ * cfg_.page_size, page_run, part);
    // Sets, then statuses: one run, made by rank 0.
    const std::size_t sets_bytes = (nslots_ / cfg_.ways * sizeof(cache_set) + 255) / 256 * 256;
    const std::size_t meta_bytes = sets_bytes + nslots_ * sizeof(std::uint16_t);
    group_meta_ = std::make_shared<spread_device_memory>(meta_bytes, (meta_bytes + gran - 1) / gran * gran, part);
    if (g.rank == 0) directory_ = group_directory::create(g.name);

    // Files of rank r, in order: [the directory (rank 0)], state-word runs, page runs, [sets and statuses (rank 0)].
    spread_device_memory* const parts_of[] = {spread_slots_.get(), spread_data_.get(), group_meta_.get()};
    auto files_of = [&](int r) {
      std::size_t n = r == 0 ? 1 : 0;
      for (auto* m : parts_of)
        n += m->runs_of(static_cast<std::size_t>(r));
      return n;
    };
    // File i of rank r: (-1, 0) the directory, else (object, run).
    auto which = [&](int r, std::size_t i) -> std::pair<int, std::size_t> {
      if (r == 0) {
        if (i == 0) return {-1, 0};
        --i;
      }
      for (int o = 0; o < 3; ++o) {
        const std::size_t n = parts_of[o]->runs_of(static_cast<std::size_t>(r));
        if (i < n) return {o, static_cast<std::size_t>(r) + i * static_cast<std::size_t>(g.size)};
        i -= n;
      }
      throw error("page_cache: group file " + std::to_string(i) + " of rank " + std::to_string(r) + " out of range");
    };
    // Every rank must cut the memory alike: the runs' lengths are part of
    // what the ranks compare (they follow from each GPU's granularity).
    const std::string description = "pages of " + std::to_string(cfg_.page_size) + " B, " + std::to_string(nslots_) +
                                    " slots, " + std::to_string(cfg_.ways) + " ways, runs of " +
                                    std::to_string(run_slots_) + " slots and of " + std::to_string(state_run) +
                                    " B of state words, " + std::to_string(g.size) + " processes";
    detail::group_spec spec{g.name, g.rank, g.size, std::chrono::milliseconds(g.timeout_ms)};
    exchange_files(
        spec, description, files_of(g.rank),
        [&](std::size_t i) {
          const auto [o, k] = which(g.rank, i);
          if (o < 0) return ::dup(directory_.file());
          return parts_of[o]->export_run(k);
        },
        files_of,
        [&](int r, std::size_t i, int fd) {
          const auto [o, k] = which(r, i);
          if (o < 0)
            directory_ = group_directory::open(fd, g.name);
          else
            parts_of[o]->import_run(k, fd);
        });
    for (auto* m : parts_of)
      m->grant({device_});
    data_ptr_ = spread_data_->data();
    data_bytes_ = spread_data_->size();
    slots_ptr_ = reinterpret_cast<std::uint64_t*>(spread_slots_->data());
    sets_ptr_ = reinterpret_cast<cache_set*>(group_meta_->data());
    status_ptr_ = reinterpret_cast<std::uint16_t*>(group_meta_->data() + sets_bytes);
  }

  //! Pages a timed-out command may still write, with the mappings of them:
  //! the mappings are undone before the pages are freed.
  struct quarantined_pages {
    aligned_device_memory pages;
    std::shared_ptr<spread_device_memory> spread_pages;
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
  //! Slots whose page of one of the spaces `ids` may still be read (a failed load's are not).
  std::uint64_t pages_of_spaces(const std::vector<std::uint32_t>& ids) const {
    constexpr std::uint64_t chunk = 1u << 20;
    std::vector<std::uint64_t> words(static_cast<std::size_t>(std::min<std::uint64_t>(chunk, nslots_)));
    std::uint64_t found = 0;
    for (std::uint64_t first = 0; first < nslots_; first += chunk) {
      const std::uint64_t n = std::min<std::uint64_t>(chunk, nslots_ - first);
      copy_to_host(words.data(), slots_ptr_ + first, static_cast<std::size_t>(n));
      for (std::uint64_t k = 0; k < n; ++k) {
        // A slot whose load failed serves no read; one quarantined (busy) keeps its tag for good.
        const std::uint64_t tag = words[k] >> slot_tag_shift;
        if (tag == 0 || (words[k] & slot_error) != 0) continue;
        const auto space = static_cast<std::uint32_t>((tag - 1) >> key_page_bits);
        found += std::find(ids.begin(), ids.end(), space) != ids.end();
      }
    }
    return found;
  }
  bool any_slot_lost() const {
    constexpr std::uint64_t chunk = 1u << 20;
    std::vector<std::uint64_t> words(static_cast<std::size_t>(std::min<std::uint64_t>(chunk, nslots_)));
    for (std::uint64_t first = 0; first < nslots_; first += chunk) {
      const std::uint64_t n = std::min<std::uint64_t>(chunk, nslots_ - first);
      copy_to_host(words.data(), slots_ptr_ + first, static_cast<std::size_t>(n));
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
    for (std::size_t d = 0; d < sp.storage.size(); ++d)
      if (sp.storage[d] && sp.mapping[d] && queue_broken(*sp.storage[d]->state()))
        sp.storage[d]->quarantine(sp.mapping[d]);
    const space_ref none{};
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      const device_scope there(devices_[d]);
      copy_to_device(spaces_[d].get() + id, &none, 1);
    }
    sync_caller(stream);
    sp = space_host{};
  }

  void writeback_locked(std::uint32_t only, bool invalidate, cudaStream_t stream) {
    launch_writeback(only, invalidate, stream);
    sync_caller(stream);
  }
  //! The write-back kernel on every device with a storage in use: each
  //! writes back the pages of the spaces it has queues for (the first one
  //! to claim a page does).
  void launch_writeback(std::uint32_t only, bool invalidate, cudaStream_t stream) {
    constexpr unsigned threads = 256;
    const unsigned blocks = static_cast<unsigned>(std::min<std::uint64_t>((nslots_ + threads - 1) / threads, 4096));
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      bool serves = devices_.size() == 1;
      for (const auto& sp : host_spaces_)
        serves = serves || (sp.used && (only == ~0u || &sp == &host_spaces_[only]) && sp.storage[d]);
      if (!serves) continue;
      on_device(d, stream, [&](std::size_t i, cudaStream_t st) {
        cache_writeback_kernel<><<<blocks, threads, 0, st>>>(ref(i), only, invalidate);
        BAM_CUDA_TRY(cudaGetLastError());
      });
    }
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
      for (const auto& s : sp.storage)
        if (s && std::none_of(out.begin(), out.end(), [&](const storage& x) { return x.state() == s->state(); }))
          out.push_back(*s);
    }
    return out;
  }

  void throw_space_error(std::uint32_t id, const std::string& what, cudaStream_t stream) {
    const space_host& sp = host_spaces_[id];
    auto name = [&](std::uint32_t c) { return any_storage(sp).controller_name(c); };
    throw_if_recorded(sp.err.get(), what, name, stream);
    throw_if_recorded(sp.flush_err.get(), "NVMe Flush (page_cache::flush_async) failed", name, stream);
  }

  device_scope on_device_; // first: current while the other members are freed
  page_cache_config cfg_;
  std::vector<int> devices_; //!< the GPUs of the cache; the first is `device_`
  int device_ = 0;
  std::uint64_t nslots_ = 0;
  std::uint64_t run_slots_ = ~0ull; //!< slots per run, spread over the devices in turn
  unsigned page_shift_ = 0;
  // Freed after every mapping of them is undone (declared first).
  aligned_device_memory data_;                         // one GPU
  std::shared_ptr<spread_device_memory> spread_data_;  // several GPUs
  std::shared_ptr<spread_device_memory> spread_slots_; // several GPUs: the state words
  std::uint8_t* data_ptr_ = nullptr;
  std::size_t data_bytes_ = 0;
  std::uint64_t* slots_ptr_ = nullptr;
  device_buffer<std::uint64_t> slots_; // one GPU
  device_buffer<std::uint16_t> status_;
  device_buffer<cache_set> sets_;
  std::shared_ptr<spread_device_memory> group_meta_; // a group: sets and statuses, on rank 0's GPU
  std::uint16_t* status_ptr_ = nullptr;
  cache_set* sets_ptr_ = nullptr;
  bool group_ = false;                           //!< one cache of several processes (`page_cache_config::group`)
  group_directory directory_;                    //!< a group: the number of each medium
  std::vector<device_buffer<space_ref>> spaces_; //!< by device index: the table its kernels read
  std::vector<device_buffer<unsigned long long>> counters_; //!< by device index
  std::vector<space_host> host_spaces_;                     // holds the mappings: destroyed before data_
  std::vector<std::weak_ptr<storage_state>> served_;        // storages these pages served
  std::vector<extent> extents_;
  std::uint64_t next_array_id_ = 1;
  int caller_ = 0; //!< the device of the stream of the host operation under way (under `mutex_`)
  mutable std::mutex mutex_;
};

} // namespace detail

//! Owning host handle of a page cache in GPU memory. Copies share the cache;
//! arrays keep it alive.
class page_cache {
public:
  //! Build the cache (a group: together with the group's other processes,
  //! waiting for them at most `group.timeout_ms`).
  explicit page_cache(const page_cache_config& cfg) : s_(std::make_shared<detail::cache_state>(cfg)) {}

  //! The handle for kernels on the cache's device (on a cache over several
  //! GPUs: the first; arrays hand out the one of their own GPU).
  page_cache_ref ref() const { return s_->ref(); }
  std::size_t page_size() const { return s_->config().page_size; }
  std::uint64_t slot_count() const { return s_->slot_count(); }
  const page_cache_config& config() const { return s_->config(); }
  //! The CUDA device that holds the pages (and runs the kernels that use
  //! them); for a cache over several GPUs, the first of them.
  int device() const { return s_->device(); }
  //! The CUDA devices the pages are spread over (one for most caches).
  const std::vector<int>& devices() const { return s_->devices(); }
  //! The CUDA device whose memory holds slot `slot`'s page (its home; -1:
  //! the GPU of another process of the group).
  int slot_device(std::uint64_t slot) const { return s_->slot_device(slot); }
  //! The index in `config().devices` of that GPU, or the rank of the
  //! process whose GPU it is (a group).
  std::size_t slot_part(std::uint64_t slot) const { return s_->slot_part(slot); }
  //! A cache over several GPUs places its slots on them in runs of this
  //! many, in turn (0: a cache of one GPU).
  std::uint64_t run_slots() const { return s_->run_slots(); }
  //! GPU memory held by metadata (state words, statuses, sets, space table, counters).
  std::size_t metadata_bytes() const {
    return slot_count() * (sizeof(std::uint64_t) + sizeof(std::uint16_t)) +
           slot_count() / config().ways * sizeof(detail::cache_set) +
           devices().size() * (detail::max_spaces * sizeof(detail::space_ref) +
                               2 * detail::counter_stripes * sizeof(unsigned long long));
  }
  //! Misses (page loads) and write-backs so far (waits for `stream`).
  page_cache_counters counters(cuda::stream_ref stream = {}) const { return s_->counters(stream.get()); }
  //! Those of kernels on CUDA device `device` alone (a cache over several GPUs).
  page_cache_counters counters(int device, cuda::stream_ref stream = {}) const {
    (void)s_->device_index(device); // one of the cache's
    return s_->counters(stream.get(), device);
  }

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
  //! Write back the dirty pages of arrays over `s` (over its medium, for a
  //! cache over several GPUs), then forget those pages: the next reads load
  //! them from the storage. Call it after the storage was written around
  //! the cache (e.g. `bam::emu::write_media`), when no kernel uses those
  //! arrays; a page a kernel holds at the time stays. Runs on `stream` and
  //! waits for it.
  //! @throw bam::error for a failed write-back (that page stays, dirty).
  //! @throw bam::error also when a page of `s` stays (a kernel holds it,
  //! or, in a group, another process is loading it or has yet to write it
  //! back).
  void invalidate(const storage& s, cuda::stream_ref stream = {}) { s_->write_back_medium(s, true, stream.get()); }
  //! Write back the dirty pages of arrays over `s` (its medium) and keep
  //! them: `flush` for one storage, without the NVMe Flush. Runs on
  //! `stream` and waits for it.
  //! @throw bam::error for a failed write-back of those pages.
  void write_back(const storage& s, cuda::stream_ref stream = {}) { s_->write_back_medium(s, false, stream.get()); }

  //! The shared state (arrays keep it alive).
  std::shared_ptr<detail::cache_state> state() const { return s_; }

private:
  std::shared_ptr<detail::cache_state> s_;
};

} // namespace bam
