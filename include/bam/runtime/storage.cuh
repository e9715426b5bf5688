// SPDX-License-Identifier: MIT
//! `bam::storage`: what a device string names, brought up for GPU threads —
//! one namespace on each of one or more controllers, their I/O queues placed
//! for GPU submitters, a `bam::queue_set_ref` per controller. Arrays stripe
//! their pages over the controllers (page p on controller p % n).
//!
//! @code
//!   bam::storage s("emu-gpu:hbm=4G,ssds=2");       // or "/dev/bam-nvme0+/dev/bam-nvme1", "emu:file=..."
//!   bam::page_cache cache({.page_size = 4096, .capacity = 256 << 20});
//!   bam::array<float> a(cache, s, n);
//! @endcode
//!
//! A `storage` is a handle: copies share the same controllers, and arrays and
//! caches that use it keep it alive (dirty pages can always be written back).
//!
//! A storage belongs to one GPU: `storage_options::device`, by default the
//! device current when it is built. Its queues, PRP lists and the GPU
//! engine's memory are there, and GPU threads of that device submit to it;
//! its host operations make that device current themselves (and give the
//! caller's back). Several GPUs of one process: one storage per GPU, over
//! the same medium with `emu-gpu:shm=NAME` (one copy of the data), each
//! with a page cache on its GPU.
//!
//! @code
//!   for (int g = 0; g < gpus; ++g)
//!     storages.emplace_back("emu-gpu:shm=features,size=64G", bam::storage_options{.device = g});
//! @endcode
//!
//! The transport behind a device string is asked through the registry
//! (transport/open.hpp); the storage names none. `<bam/bam.cuh>` registers
//! the kernel module's transport and the software controller.
#pragma once

#include <bam/cuda.cuh>
#include <bam/detail/device_memory.cuh>
#include <bam/driver/controller.hpp>
#include <bam/runtime/queue_set.cuh>
#include <bam/transport/device_string.hpp>
#include <bam/transport/open.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace bam {

//! Largest single transfer of the GPU I/O path by default (what one command
//! id's PRP list describes).
inline constexpr std::uint32_t default_max_io_bytes = 64 * 1024;

struct storage_options {
  std::uint32_t nsid = 1;
  std::uint32_t max_io_bytes = default_max_io_bytes; //!< largest single transfer (PRP list size)
  int device = -1; //!< the CUDA device whose threads submit (-1: the one current at construction)
};

//! GPU memory mapped for every controller of a storage: per controller, the
//! bus address of each 4 KiB page, in GPU memory.
class storage_mapping {
public:
  //! Device array of `controllers` pointers, each to that controller's page bus addresses.
  const std::uint64_t* const* bus_tables() const { return tables_.get(); }
  //! Controller `i`'s table (a device pointer).
  const std::uint64_t* bus_table(std::uint32_t i) const { return bus_.at(i).get(); }

private:
  friend class storage;
  std::vector<std::unique_ptr<dma_region>> regions_;
  std::vector<device_buffer<std::uint64_t>> bus_;
  device_buffer<const std::uint64_t*> tables_;
};

namespace detail {

struct storage_state {
  //! Current while the members below are destroyed (see ~storage_state).
  device_scope on_device;
  int device = 0; //!< the CUDA device the queues and their memory belong to
  device_spec spec;
  storage_options opts;
  // Memory a timed-out GPU command may still write (a page cache's pages
  // and their mapping): freed last, once every controller is reset or
  // stopped and every engine has stopped.
  std::mutex quarantine_mutex;
  //! Released in the order kept (a mapping before the pages it maps).
  struct kept_in_order {
    std::vector<std::shared_ptr<void>> items;
    kept_in_order() = default;
    kept_in_order(const kept_in_order&) = delete;
    kept_in_order& operator=(const kept_in_order&) = delete;
    ~kept_in_order() {
      for (auto& i : items)
        i.reset();
    }
  } quarantine;
  std::string description; //!< what serves the I/O (the transport's words)
  // Destroyed bottom-up (reverse order): refs and lists, then the drivers
  // (which delete their queues), then the transports they own.
  std::vector<std::shared_ptr<controller>> ctrls;
  struct per_ctrl {
    device_buffer<nvme::queue_pair_ref> queues;
    std::unique_ptr<dma_region> lists;
    device_buffer<std::uint64_t> list_bus;
  };
  std::vector<per_ctrl> per;
  std::vector<queue_set_ref> host_refs;
  device_buffer<queue_set_ref> refs;
  std::uint32_t lba_size = 0;
  std::uint64_t blocks = 0;

  storage_state() = default;
  storage_state(const storage_state&) = delete;
  storage_state& operator=(const storage_state&) = delete;
  //! Controllers delete their queues and engines free their memory with the
  //! storage's device current, whichever thread drops the last handle.
  ~storage_state() { on_device.enter_quietly(device); }
};

//! The device `opts` names, or the current one.
inline int storage_device(const storage_options& opts) {
  if (opts.device < 0) return current_device();
  int count = 0;
  BAM_CUDA_TRY(cudaGetDeviceCount(&count));
  if (opts.device >= count)
    throw error("storage: CUDA device " + std::to_string(opts.device) + " does not exist (" + std::to_string(count) +
                " device(s))");
  return opts.device;
}

//! Controller options that put I/O queue rings where `rings` says (GPU
//! memory, or pinned host memory mapped into the GPU) and submitter state in
//! GPU memory, and hand GPU threads the doorbells.
inline controller_options gpu_queue_options(controller_options o = {},
                                            queue_ring_memory rings = queue_ring_memory::gpu) {
  static_assert(nvme::queue_state_alignment <= 256, "cudaMalloc aligns to 256 bytes");
  if (rings == queue_ring_memory::gpu)
    o.ring_alloc = [](transport& t, std::size_t bytes) { return device_region::make(t, bytes); };
  else
    o.ring_alloc = [](transport& t, std::size_t bytes) { return pinned_region::make(t, bytes); };
  o.state_alloc = [](std::size_t bytes) { return alloc_queue_state(bytes); };
  o.state_free = [](void* p) { BAM_CUDA_LOG(cudaFree(p)); };
  o.device_doorbells = true;
  return o;
}

//! True when a GPU thread's command on one of `s`'s I/O queues timed out
//! (see `storage::any_queue_broken`).
inline bool any_queue_broken(const storage_state& s) {
  const device_scope on(s.device);
  // On a stream of its own: waits for no kernel of the caller's.
  cudaStream_t st = nullptr;
  BAM_CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> owner(
      st, [](cudaStream_t x) { BAM_CUDA_LOG(cudaStreamDestroy(x)); });
  std::vector<std::uint32_t> broken;
  std::vector<const std::uint32_t*> words;
  for (const auto& c : s.ctrls)
    for (std::uint32_t q = 0; q < c->io_queue_count(); ++q)
      if (const auto* counters = c->io_queue(q).counters; counters != nullptr) words.push_back(&counters->broken);
  broken.resize(words.size());
  for (std::size_t k = 0; k < words.size(); ++k)
    BAM_CUDA_TRY(cudaMemcpyAsync(&broken[k], words[k], sizeof(std::uint32_t), cudaMemcpyDefault, st));
  BAM_CUDA_TRY(cudaStreamSynchronize(st));
  return std::any_of(broken.begin(), broken.end(), [](std::uint32_t b) { return b != 0; });
}

//! Keep `memory` until `s`'s controllers and engines are gone.
inline void quarantine(storage_state& s, std::shared_ptr<void> memory) {
  std::lock_guard lock(s.quarantine_mutex);
  s.quarantine.items.push_back(std::move(memory));
}

} // namespace detail

class storage {
public:
  //! Open what `device_string` names (see device_string.hpp) and place its
  //! I/O queues for GPU threads.
  explicit storage(const std::string& device_string, storage_options opts = {})
      : storage(parse_device(device_string), opts) {}
  explicit storage(const device_spec& spec, storage_options opts = {}) : s_(std::make_shared<detail::storage_state>()) {
    s_->device = detail::storage_device(opts);
    const device_scope on(s_->device);
    s_->spec = spec;
    s_->opts = opts;
    controller_options copts;
    copts.io_queues = spec.io_queues;
    copts.queue_depth = spec.queue_depth;
    copts.io_timeout_ns = spec.timeout_ns;
    gpu_transports g = open_gpu_transports(spec);
    s_->description = std::move(g.description);
    for (auto& t : g.controllers)
      s_->ctrls.push_back(std::make_shared<controller>(std::move(t), detail::gpu_queue_options(copts, g.rings)));
    build_queue_sets();
  }
  //! Controllers already brought up with their I/O queues placed for GPU
  //! submitters (`detail::gpu_queue_options`).
  explicit storage(std::vector<std::shared_ptr<controller>> ctrls, storage_options opts = {})
      : s_(std::make_shared<detail::storage_state>()) {
    s_->device = detail::storage_device(opts);
    const device_scope on(s_->device);
    s_->opts = opts;
    s_->description = "controllers given by the caller";
    s_->ctrls = std::move(ctrls);
    build_queue_sets();
  }

  std::uint32_t controller_count() const { return static_cast<std::uint32_t>(s_->ctrls.size()); }
  controller& controller_at(std::uint32_t i) const { return *s_->ctrls.at(i); }
  //! Device array of `controller_count()` handles.
  const queue_set_ref* device_refs() const { return s_->refs.get(); }
  //! Host copy of handle i (pass by value to a kernel).
  queue_set_ref ref(std::uint32_t i) const { return s_->host_refs.at(i); }
  std::uint32_t lba_size() const { return s_->lba_size; }
  //! Blocks usable on every controller (the smallest namespace).
  std::uint64_t blocks_per_controller() const { return s_->blocks; }
  std::uint32_t nsid() const { return s_->opts.nsid; }
  std::string name() const {
    std::string n;
    for (const auto& c : s_->ctrls)
      n += (n.empty() ? "" : "+") + c->name();
    return n;
  }
  //! Name of controller `i` for messages (the whole storage's name for an unknown index).
  std::string controller_name(std::uint32_t i) const { return i < s_->ctrls.size() ? s_->ctrls[i]->name() : name(); }
  //! What serves the I/O, for reports (the transport's description).
  const std::string& transport_name() const { return s_->description; }
  //! What holds the blocks, as far as bam can tell: storages opened on the
  //! same shared memory (`shm=NAME`), the same file or the same SSDs say the
  //! same, so that a page cache spread over several GPUs keeps one copy of
  //! their pages. Any other storage (RAM of its own, controllers given by
  //! the caller) is a medium of its own.
  std::string medium() const {
    const device_spec& d = s_->spec;
    const std::string geometry = ",ssds=" + std::to_string(d.ssds) + ",lba=" + std::to_string(d.lba_size);
    if (!d.text.empty() && d.media == media_kind::shm) return "shm:" + d.shm_name + geometry;
    if (!d.text.empty() && d.kind == device_kind::pci) {
      std::string m = "pci:";
      for (const auto& p : d.devices)
        m += p + ";";
      return m + "nsid=" + std::to_string(s_->opts.nsid);
    }
    if (!d.text.empty() && d.media == media_kind::file && !d.path.empty()) {
      std::error_code ec;
      const auto p = std::filesystem::weakly_canonical(d.path, ec);
      return "file:" + (ec ? d.path : p.string()) + geometry;
    }
    char b[40];
    std::snprintf(b, sizeof b, "storage@%p", static_cast<const void*>(s_.get()));
    return b;
  }
  const device_spec& spec() const { return s_->spec; }
  //! The CUDA device whose threads submit to this storage's queues (kernels
  //! that use it, and the page caches in front of it, run there).
  int device() const { return s_->device; }

  //! Map GPU memory `[ptr, ptr + bytes)` for every controller. `ptr` and
  //! `bytes` must be multiples of `gpu_page_size` (64 KiB) for a real controller.
  std::unique_ptr<storage_mapping> map(void* ptr, std::size_t bytes) const {
    const device_scope on(s_->device);
    auto m = std::make_unique<storage_mapping>();
    std::vector<const std::uint64_t*> tables;
    for (const auto& c : s_->ctrls) {
      auto r = c->transport().map(ptr, bytes, memory_kind::device);
      device_buffer<std::uint64_t> bus(r->page_bus().size());
      copy_to_device(bus.get(), r->page_bus().data(), r->page_bus().size());
      tables.push_back(bus.get());
      m->regions_.push_back(std::move(r));
      m->bus_.push_back(std::move(bus));
    }
    m->tables_ = device_buffer<const std::uint64_t*>(tables.size());
    copy_to_device(m->tables_.get(), tables.data(), tables.size());
    return m;
  }

  //! True when a GPU thread's command on one of the I/O queues timed out:
  //! that queue is broken, and its commands may still complete, writing
  //! the memory they name.
  bool any_queue_broken() const { return detail::any_queue_broken(*s_); }
  //! Keep `memory` until this storage's controllers and engines are gone
  //! (for memory a timed-out command may still write).
  void quarantine(std::shared_ptr<void> memory) const { detail::quarantine(*s_, std::move(memory)); }

  //! The shared state (arrays and caches keep it alive).
  std::shared_ptr<detail::storage_state> state() const { return s_; }

private:
  void build_queue_sets() {
    auto& s = *s_;
    if (s.ctrls.empty()) throw error("a storage needs at least one controller");
    const std::uint32_t max_io = s.opts.max_io_bytes;
    if (max_io < dma_page_size || (max_io & (max_io - 1)) != 0)
      throw error("storage: max_io_bytes must be a power of two >= 4096 (got " + std::to_string(max_io) + ")");
    int sms = 1;
    BAM_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, s.device));
    std::vector<queue_set_ref> refs;
    for (std::size_t i = 0; i < s.ctrls.size(); ++i) {
      controller& c = *s.ctrls[i];
      const namespace_info& ns = c.ns(s.opts.nsid);
      if (i == 0) s.lba_size = ns.lba_size;
      if (ns.lba_size != s.lba_size)
        throw error("storage: controllers differ in LBA size (" + std::to_string(s.lba_size) + " vs " +
                    std::to_string(ns.lba_size) + " on " + c.name() + ")");
      s.blocks = i == 0 ? ns.blocks : std::min(s.blocks, ns.blocks);
      if (c.io_queue_count() == 0) throw error("storage: controller " + c.name() + " has no I/O queues");
      detail::storage_state::per_ctrl pc;
      std::vector<nvme::queue_pair_ref> qs;
      for (std::uint32_t q = 0; q < c.io_queue_count(); ++q)
        qs.push_back(c.io_queue(q));
      pc.queues = device_buffer<nvme::queue_pair_ref>(qs.size());
      copy_to_device(pc.queues.get(), qs.data(), qs.size());
      queue_set_layout r;
      r.queues = pc.queues.get();
      r.nqueues = static_cast<std::uint32_t>(qs.size());
      r.nsid = s.opts.nsid;
      r.lba_size = ns.lba_size;
      r.lba_shift = static_cast<std::uint32_t>(std::countr_zero(ns.lba_size));
      r.nblocks = ns.blocks;
      r.num_sms = static_cast<std::uint32_t>(sms);
      r.index = static_cast<std::uint32_t>(i);
      r.progress = c.transport().device_progress_hook();
      const std::uint32_t max_bytes = static_cast<std::uint32_t>(std::min<std::size_t>(max_io, c.max_transfer_bytes()));
      // Entries per command id: a power of two, so that no list crosses a 4 KiB page.
      std::uint32_t entries = 1;
      while (entries * 2 <= std::min<std::uint32_t>(max_bytes / dma_page_size, 512))
        entries *= 2;
      r.list_entries = entries;
      r.max_transfer_bytes = std::min<std::uint32_t>(max_bytes, entries * static_cast<std::uint32_t>(dma_page_size));
      r.cids_per_queue = c.io_queue_depth() - 1;
      const std::size_t list_bytes =
          static_cast<std::size_t>(r.nqueues) * r.cids_per_queue * r.list_entries * sizeof(std::uint64_t);
      pc.lists = detail::device_region::make(c.transport(), list_bytes);
      pc.list_bus = device_buffer<std::uint64_t>(pc.lists->page_bus().size());
      copy_to_device(pc.list_bus.get(), pc.lists->page_bus().data(), pc.lists->page_bus().size());
      r.prp_lists = pc.lists->as<std::uint64_t>();
      r.prp_list_bus = pc.list_bus.get();
      refs.emplace_back(r);
      s.per.push_back(std::move(pc));
    }
    s.host_refs = refs;
    s.refs = device_buffer<queue_set_ref>(refs.size());
    copy_to_device(s.refs.get(), refs.data(), refs.size());
  }

  std::shared_ptr<detail::storage_state> s_;
};

} // namespace bam
