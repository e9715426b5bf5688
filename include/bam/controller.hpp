// SPDX-License-Identifier: MIT
//! The host controller driver: brings up any NVMe controller by the spec over
//! a `bam::transport`, creates I/O queue pairs where the caller says, and
//! offers synchronous block I/O from host threads.
//!
//! @code
//!   auto t = bam::emu::make_controller(cfg);          // or a pci_transport
//!   bam::controller ctrl(t, {.io_queues = 4, .queue_depth = 256});
//!   std::printf("%s, %llu blocks\n", ctrl.model().c_str(),
//!               (unsigned long long)ctrl.ns(1).blocks);
//!   auto buf = ctrl.transport_ref().alloc(8 * ctrl.ns(1).lba_size);
//!   ctrl.write(1, /*lba=*/100, /*nblocks=*/8, *buf);
//!   ctrl.read(1, 100, 8, *buf, 0, /*queue=*/2);
//! @endcode
#pragma once

#include <bam/error.hpp>
#include <bam/nvme/identify.hpp>
#include <bam/nvme/prp.hpp>
#include <bam/nvme/queue.hpp>
#include <bam/nvme/spec.hpp>
#include <bam/transport.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace bam {

//! What the driver creates and where it places it.
struct controller_options {
  std::uint32_t io_queues = 4;     //!< I/O queue pairs wanted (fewer if the controller allows fewer)
  std::uint32_t queue_depth = 256; //!< entries per I/O queue, clamped to CAP.MQES+1
  std::uint32_t admin_depth = 32;  //!< admin queue entries
  std::uint64_t io_timeout_ns = nvme::default_queue_timeout_ns;
  std::uint64_t admin_timeout_ns = nvme::default_queue_timeout_ns;
  //! Zeroed memory for one I/O queue's SQ and CQ rings, reachable by the
  //! controller. Default: host memory from `transport::alloc`.
  std::function<std::unique_ptr<dma_region>(transport&, std::size_t bytes)> ring_alloc;
  //! Zeroed submitter-side state (`nvme::queue_state_bytes`). Default: host heap.
  std::function<void*(std::size_t bytes)> state_alloc;
  std::function<void(void*)> state_free;
  //! Put `transport::device_doorbell` pointers in the I/O queue handles, so
  //! GPU threads can submit.
  bool device_doorbells = false;
  //! Send CC.SHN (normal shutdown) when the driver is destroyed.
  bool shutdown_on_destroy = true;
};

//! One active namespace.
struct namespace_info {
  std::uint32_t nsid = 0;
  std::uint64_t blocks = 0;   //!< NSZE
  std::uint32_t lba_size = 0; //!< bytes per logical block
  nvme_id_ns id{};
};

//! Bring-up states, each with a name for messages and a timeout from CAP.TO.
enum class controller_state {
  disable,
  wait_not_ready,
  configure_admin_queue,
  enable,
  wait_ready,
  identify_controller,
  identify_namespaces,
  set_number_of_queues,
  create_io_queues,
  ready,
  failed,
};

inline const char* state_name(controller_state s) {
  switch (s) {
  case controller_state::disable: return "disable";
  case controller_state::wait_not_ready: return "wait for CSTS.RDY=0";
  case controller_state::configure_admin_queue: return "configure admin queue";
  case controller_state::enable: return "enable";
  case controller_state::wait_ready: return "wait for CSTS.RDY=1";
  case controller_state::identify_controller: return "identify controller";
  case controller_state::identify_namespaces: return "identify namespaces";
  case controller_state::set_number_of_queues: return "set number of queues";
  case controller_state::create_io_queues: return "create I/O queues";
  case controller_state::ready: return "ready";
  case controller_state::failed: return "failed";
  }
  return "?";
}

class controller {
public:
  explicit controller(std::shared_ptr<transport> t, controller_options opts = {})
      : transport_(std::move(t)), opts_(std::move(opts)) {
    if (!transport_) throw error("controller needs a transport");
    if (!opts_.ring_alloc)
      opts_.ring_alloc = [](transport& tr, std::size_t bytes) { return tr.alloc(bytes); };
    if (static_cast<bool>(opts_.state_alloc) != static_cast<bool>(opts_.state_free))
      throw error("controller_options: state_alloc and state_free must be given together");
    host_state_ = !opts_.state_alloc;
    if (!opts_.state_alloc) {
      opts_.state_alloc = [](std::size_t bytes) { return host_state_alloc(bytes); };
      opts_.state_free = [](void* p) { std::free(p); };
    }
    try {
      bring_up();
    } catch (...) {
      state_ = controller_state::failed;
      // Stop the controller before its queue memory goes back to the allocator.
      reset_quietly();
      release_queues();
      throw;
    }
  }

  ~controller() {
    bool stopped = false;
    try {
      if (state_ == controller_state::ready && !any_queue_broken()) {
        delete_io_queues();
        if (opts_.shutdown_on_destroy) shutdown();
        stopped = true;
      }
    } catch (...) {
    }
    // A queue with commands that never completed (or a failed teardown): reset
    // the controller so that nothing DMAs into memory freed below.
    if (!stopped) reset_quietly();
    quarantine_.clear(); // timed-out commands: the controller is stopped now
    release_queues();
  }

  controller(const controller&) = delete;
  controller& operator=(const controller&) = delete;

  transport& transport_ref() const { return *transport_; }
  const std::string& name() const { return name_; }
  controller_state state() const { return state_; }

  nvme::cap_register cap() const { return cap_; }
  const nvme_id_ctrl& identify_data() const { return id_ctrl_; }
  std::string model() const { return trim(id_ctrl_.mn, sizeof id_ctrl_.mn); }
  std::string serial() const { return trim(id_ctrl_.sn, sizeof id_ctrl_.sn); }
  std::string firmware() const { return trim(id_ctrl_.fr, sizeof id_ctrl_.fr); }

  const std::vector<namespace_info>& namespaces() const { return namespaces_; }
  const namespace_info& ns(std::uint32_t nsid) const {
    for (const auto& n : namespaces_)
      if (n.nsid == nsid) return n;
    error_context c;
    c.controller = name_;
    throw error("no active namespace " + std::to_string(nsid), c);
  }

  std::uint32_t io_queue_count() const { return static_cast<std::uint32_t>(io_.size()); }
  std::uint32_t io_queue_depth() const { return io_depth_; }
  //! Handle of I/O queue `i` (queue id i + 1).
  nvme::queue_pair_ref io_queue(std::uint32_t i) const {
    check_queue_index(i);
    return io_[i].ref;
  }
  nvme::queue_pair_ref admin_queue() const { return admin_.ref; }

  //! Largest transfer one command may move (MDTS, and what one PRP list
  //! chain of the driver describes).
  std::size_t max_transfer_bytes() const { return max_transfer_; }
  //! Controller memory page size (CC.MPS); bam uses 4 KiB.
  static constexpr std::size_t page_size() { return dma_page_size; }

  // ---- synchronous I/O from host threads -------------------------------

  void read(std::uint32_t nsid, std::uint64_t lba, std::uint32_t nblocks, const dma_region& buf,
            std::size_t offset = 0, std::uint32_t queue = 0) {
    block_io(nvme::nvm_opcode::read, nsid, lba, nblocks, buf, offset, queue);
  }
  void write(std::uint32_t nsid, std::uint64_t lba, std::uint32_t nblocks, const dma_region& buf,
             std::size_t offset = 0, std::uint32_t queue = 0) {
    block_io(nvme::nvm_opcode::write, nsid, lba, nblocks, buf, offset, queue);
  }
  void flush(std::uint32_t nsid, std::uint32_t queue = 0) {
    run_io(queue, nvme::make_flush(nsid), std::nullopt);
  }
  void write_zeroes(std::uint32_t nsid, std::uint64_t lba, std::uint32_t nblocks,
                    std::uint32_t queue = 0) {
    check_range(nsid, lba, nblocks);
    const std::uint32_t max_blocks = 65536; // NLB is 16 bits
    for (std::uint64_t done = 0; done < nblocks;) {
      const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(nblocks - done, max_blocks));
      run_io(queue, nvme::make_write_zeroes(nsid, lba + done, n), lba + done);
      done += n;
    }
  }
  //! Dataset Management / deallocate of one range.
  void deallocate(std::uint32_t nsid, std::uint64_t lba, std::uint32_t nblocks,
                  std::uint32_t queue = 0) {
    check_range(nsid, lba, nblocks);
    auto range = transport_->alloc(dma_page_size);
    auto* r = range->as<nvme::dsm_range>();
    r->attributes = 0;
    r->nblocks = nblocks;
    r->slba = lba;
    run_io(queue, nvme::make_dsm_deallocate(nsid, 1, range->bus_address(0)), lba);
  }

  //! Run one admin command; `data` (if any) is the transfer buffer. Returns
  //! completion dword 0; throws `bam::error` on a failed status.
  std::uint32_t admin(nvme::command cmd, const dma_region* data = nullptr, std::size_t bytes = 0) {
    if (data != nullptr) {
      if (bytes == 0) bytes = data->size();
      set_prps(cmd, *data, 0, bytes, nullptr, nullptr, 0);
    }
    std::uint32_t dw0 = 0;
    const nvme::status st =
        admin_.ref.execute(cmd, [&](nvme::command& c, std::uint32_t) { cmd = c; }, &dw0);
    if (!st.ok()) throw command_error("admin command failed", 0, cmd, st, std::nullopt);
    return dw0;
  }

  //! Get Log Page into `buf` (`bytes`, a multiple of 4, at most one page here).
  void get_log_page(nvme::log_page_id lid, std::uint32_t nsid, const dma_region& buf,
                    std::uint32_t bytes) {
    admin(nvme::make_get_log_page(lid, nsid, bytes, 0), &buf, bytes);
  }

private:
  struct queue_resources {
    nvme::queue_pair_ref ref;
    std::unique_ptr<dma_region> rings; // SQ at 0, CQ after it (page aligned)
    void* state = nullptr;
    bool created_cq = false;
    bool created_sq = false;
  };

  //! One host command in flight in `block_io`.
  struct inflight {
    std::uint32_t pool_entry;
    nvme::command cmd;
    std::uint64_t lba;
    nvme::completion_record record; // several in flight: completions delivered here
  };

  //! PRP list pages for host-submitted transfers, shared by all queues.
  struct prp_pool {
    std::unique_ptr<dma_region> pages;
    std::size_t pages_per_entry = 0;
    std::vector<std::uint32_t> free;
    std::mutex m;
    std::condition_variable cv;
  };

  // ---- bring-up ---------------------------------------------------------

  void bring_up() {
    name_ = transport_->name();
    cap_.raw = transport_->read64(nvme::reg::cap);
    if (static_cast<std::uint32_t>(cap_.raw) == nvme::register_gone &&
        static_cast<std::uint32_t>(cap_.raw >> 32) == nvme::register_gone)
      fail("controller is not responding (CAP reads all ones)");
    if ((cap_.bits.css & 1u) == 0) fail("controller does not support the NVM command set");
    if (cap_.bits.mpsmin > 0) fail("controller needs memory pages larger than 4 KiB (CAP.MPSMIN)");
    dstrd_ = static_cast<std::uint32_t>(cap_.bits.dstrd);
    // CAP.TO is the worst case for CSTS.RDY to change; 0 would mean no wait at all.
    state_timeout_ns_ = std::max<std::uint64_t>(cap_.bits.to, 1) * nvme::cap_timeout_unit_ms *
                        1'000'000ull;

    state_ = controller_state::disable;
    nvme::cc_register cc{transport_->read32(nvme::reg::cc)};
    if (cc.bits.en) {
      cc.bits.en = 0;
      transport_->write32(nvme::reg::cc, cc.raw);
    }
    state_ = controller_state::wait_not_ready;
    wait_csts([](nvme::csts_register s) { return s.bits.rdy == 0; }, false);

    state_ = controller_state::configure_admin_queue;
    const std::uint32_t mqes = static_cast<std::uint32_t>(cap_.bits.mqes) + 1;
    const std::uint32_t admin_depth =
        std::clamp<std::uint32_t>(opts_.admin_depth, 2, std::min(mqes, nvme::max_admin_queue_entries));
    admin_ = make_queue(0, admin_depth, opts_.admin_timeout_ns, /*on_device=*/false);
    nvme::aqa_register aqa{};
    aqa.bits.asqs = admin_depth - 1;
    aqa.bits.acqs = admin_depth - 1;
    transport_->write32(nvme::reg::aqa, aqa.raw);
    transport_->write64(nvme::reg::asq, admin_.rings->bus_address(0));
    transport_->write64(nvme::reg::acq, admin_.rings->bus_address(cq_offset(admin_depth)));

    state_ = controller_state::enable;
    cc.raw = 0;
    cc.bits.css = 0;
    cc.bits.mps = 0; // 4 KiB
    cc.bits.ams = 0;
    cc.bits.iosqes = nvme::sq_entry_log2;
    cc.bits.iocqes = nvme::cq_entry_log2;
    cc.bits.en = 1;
    transport_->write32(nvme::reg::cc, cc.raw);
    state_ = controller_state::wait_ready;
    wait_csts([](nvme::csts_register s) { return s.bits.rdy == 1; }, true);

    state_ = controller_state::identify_controller;
    {
      auto page = transport_->alloc(nvme::identify_data_size);
      admin(nvme::make_identify(nvme::identify_cns::controller, 0, 0), page.get());
      std::memcpy(&id_ctrl_, page->data(), sizeof id_ctrl_);
    }
    // MDTS is in units of the minimum memory page size; 0 means no limit.
    const std::size_t pool_limit = 2u << 20; // what the driver's PRP lists describe
    max_transfer_ = (id_ctrl_.mdts == 0 || id_ctrl_.mdts >= 20)
                        ? pool_limit
                        : std::min<std::size_t>(pool_limit, dma_page_size << id_ctrl_.mdts);
    setup_prp_pool();

    state_ = controller_state::identify_namespaces;
    identify_namespaces();

    state_ = controller_state::set_number_of_queues;
    std::uint32_t want = std::max<std::uint32_t>(opts_.io_queues, 1);
    want = std::min<std::uint32_t>(want, 65535);
    const std::uint32_t dw0 = admin(nvme::make_set_num_queues(want, want));
    const std::uint32_t nsq = (dw0 & 0xffffu) + 1, ncq = (dw0 >> 16) + 1;
    const std::uint32_t nqueues = std::min({want, nsq, ncq});

    state_ = controller_state::create_io_queues;
    io_depth_ = std::clamp<std::uint32_t>(opts_.queue_depth, 2, std::min(mqes, nvme::max_cids + 1));
    io_.reserve(nqueues);
    for (std::uint32_t i = 0; i < nqueues; ++i) {
      const auto qid = static_cast<std::uint16_t>(i + 1);
      io_.push_back(make_queue(qid, io_depth_, opts_.io_timeout_ns, opts_.device_doorbells));
      auto& q = io_.back();
      admin(nvme::make_create_io_cq(qid, io_depth_, q.rings->bus_address(cq_offset(io_depth_))));
      q.created_cq = true;
      admin(nvme::make_create_io_sq(qid, io_depth_, q.rings->bus_address(0), qid));
      q.created_sq = true;
    }
    state_ = controller_state::ready;
  }

  static std::size_t cq_offset(std::uint32_t depth) {
    return transport::round_up(sizeof(nvme::command) * depth);
  }

  queue_resources make_queue(std::uint16_t qid, std::uint32_t depth, std::uint64_t timeout_ns,
                             bool on_device) {
    queue_resources q;
    const std::size_t bytes = cq_offset(depth) + transport::round_up(sizeof(nvme::completion) * depth);
    q.rings = qid == 0 ? transport_->alloc(bytes) : opts_.ring_alloc(*transport_, bytes);
    // Queues are created physically contiguous (PC=1; CAP.CQR may demand it):
    // each ring must be one run of bus addresses.
    check_contiguous(*q.rings, 0, cq_offset(depth), qid, "submission");
    check_contiguous(*q.rings, cq_offset(depth), bytes - cq_offset(depth), qid, "completion");
    const std::size_t state_bytes = nvme::queue_state_bytes(depth);
    q.state = qid == 0 ? host_state_alloc(state_bytes) : opts_.state_alloc(state_bytes);
    if (q.state == nullptr) throw_errno("allocating queue state", ENOMEM, name_);
    auto& r = q.ref;
    r.sq = q.rings->as<nvme::command>();
    r.cq = reinterpret_cast<nvme::completion*>(q.rings->as<unsigned char>() + cq_offset(depth));
    r.sq_depth = depth;
    r.cq_depth = depth;
    r.qid = qid;
    r.timeout_ns = timeout_ns;
    const auto sq_db = nvme::sq_doorbell_offset(qid, dstrd_);
    const auto cq_db = nvme::cq_doorbell_offset(qid, dstrd_);
    if (on_device) {
      r.sq_doorbell = transport_->device_doorbell(sq_db);
      r.cq_doorbell = transport_->device_doorbell(cq_db);
      if (r.sq_doorbell == nullptr || r.cq_doorbell == nullptr) {
        error_context c;
        c.controller = name_;
        throw error("this transport gives GPU threads no doorbells (device_doorbells requested)", c);
      }
    } else {
      r.sq_doorbell = transport_->doorbell(sq_db);
      r.cq_doorbell = transport_->doorbell(cq_db);
    }
    // The state block may be device memory: compute pointers without touching it.
    r.attach_state(q.state);
    return q;
  }

  void check_contiguous(const dma_region& r, std::size_t offset, std::size_t bytes, std::uint16_t qid,
                        const char* which) const {
    const auto& bus = r.page_bus();
    const std::size_t first = offset / dma_page_size, pages = (bytes + dma_page_size - 1) / dma_page_size;
    for (std::size_t i = 1; i < pages; ++i) {
      if (bus[first + i] != bus[first] + i * dma_page_size) {
        error_context c;
        c.controller = name_;
        c.queue = qid;
        throw error(std::string(which) + " queue memory is not contiguous in bus address space (page " +
                        std::to_string(i) + " of " + std::to_string(pages) +
                        "): queues are created physically contiguous; allocate them with "
                        "transport::alloc or a ring_alloc that returns contiguous memory",
                    c);
      }
    }
  }

  void release_queues() {
    auto release = [&](queue_resources& q, bool admin_queue) {
      if (q.state != nullptr) {
        if (admin_queue) std::free(q.state);
        else opts_.state_free(q.state);
        q.state = nullptr;
      }
      q.rings.reset();
    };
    for (auto& q : io_) release(q, false);
    io_.clear();
    release(admin_, true);
  }

  template <class Pred>
  void wait_csts(Pred pred, bool enabling) {
    const std::uint64_t deadline = detail::now_ns() + state_timeout_ns_;
    for (;;) {
      nvme::csts_register s{transport_->read32(nvme::reg::csts)};
      if (s.raw == nvme::register_gone) fail("controller is not responding (CSTS reads all ones)");
      if (enabling && s.bits.cfs) fail("controller reports a fatal status (CSTS.CFS) while enabling");
      if (pred(s)) return;
      if (detail::now_ns() > deadline)
        fail(std::string("timed out in state '") + state_name(state_) + "' after " +
             std::to_string(state_timeout_ns_ / 1'000'000) + " ms (CAP.TO)");
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  void identify_namespaces() {
    auto page = transport_->alloc(nvme::identify_data_size);
    std::vector<std::uint32_t> ids;
    try {
      admin(nvme::make_identify(nvme::identify_cns::active_ns_list, 0, 0), page.get());
      const auto* list = page->as<std::uint32_t>();
      for (std::size_t i = 0; i < nvme::identify_data_size / 4 && list[i] != 0; ++i)
        ids.push_back(list[i]);
    } catch (const error& e) {
      // NVMe 1.0 controllers lack CNS 2 (Invalid Field): every NSID up to NN
      // is a candidate. Any other failure is reported as it is.
      const auto st = e.status();
      const bool unsupported =
          st && st->sct() == nvme::status_type::generic &&
          (st->sc() == nvme::generic_status::invalid_field || st->sc() == nvme::generic_status::invalid_opcode);
      if (!unsupported) throw;
      for (std::uint32_t n = 1; n <= id_ctrl_.nn && n <= 1024; ++n) ids.push_back(n);
    }
    for (std::uint32_t nsid : ids) {
      std::memset(page->data(), 0, nvme::identify_data_size);
      admin(nvme::make_identify(nvme::identify_cns::ns, nsid, 0), page.get());
      namespace_info info;
      std::memcpy(&info.id, page->data(), sizeof info.id);
      if (info.id.nsze == 0) continue; // inactive
      info.nsid = nsid;
      info.blocks = info.id.nsze;
      // FLBAS bits 3:0 and, with more than 16 formats, bits 6:5 as the upper bits.
      const unsigned fmt = (info.id.flbas & 0xfu) | (((info.id.flbas >> 5) & 0x3u) << 4);
      info.lba_size = 1u << info.id.lbaf[fmt].ds;
      namespaces_.push_back(info);
    }
  }

  void setup_prp_pool() {
    const std::size_t pages = max_transfer_ / dma_page_size + 1;
    prp_.pages_per_entry =
        std::max<std::size_t>(1, nvme::prp_list_pages_needed(pages, dma_page_size));
    const std::size_t entries = 64;
    prp_.pages = transport_->alloc(entries * prp_.pages_per_entry * dma_page_size);
    for (std::uint32_t i = 0; i < entries; ++i) prp_.free.push_back(i);
  }

  //! Fill PRP1/PRP2; `list_virt/list_bus` hold the list pages of a pool entry.
  void set_prps(nvme::command& cmd, const dma_region& buf, std::size_t offset, std::size_t bytes,
                std::uint64_t* const* list_virt, const std::uint64_t* list_bus,
                std::size_t list_pages) {
    if (offset + bytes > buf.size()) {
      error_context c;
      c.controller = name_;
      c.errnum = ERANGE;
      throw error("transfer of " + std::to_string(bytes) + " bytes at offset " +
                      std::to_string(offset) + " overruns a " + std::to_string(buf.size()) +
                      "-byte buffer",
                  c);
    }
    nvme::prp_pair prp;
    if (!nvme::build_prp(buf.page_bus().data(), offset, bytes, dma_page_size, list_virt, list_bus,
                         list_pages, prp)) {
      error_context c;
      c.controller = name_;
      c.errnum = EINVAL;
      throw error("cannot describe a transfer of " + std::to_string(bytes) + " bytes at offset " +
                      std::to_string(offset) + " with PRPs (unaligned or too long)",
                  c);
    }
    cmd.prp1 = prp.prp1;
    cmd.prp2 = prp.prp2;
  }

  void check_range(std::uint32_t nsid, std::uint64_t lba, std::uint64_t nblocks) const {
    const auto& n = ns(nsid);
    if (nblocks == 0 || lba >= n.blocks || nblocks > n.blocks - lba) {
      error_context c;
      c.controller = name_;
      c.lba = lba;
      c.status = nvme::status_out_of_range;
      throw error("block range [" + std::to_string(lba) + ", +" + std::to_string(nblocks) +
                      ") outside namespace " + std::to_string(nsid) + " of " +
                      std::to_string(n.blocks) + " blocks",
                  c);
    }
  }

  void check_queue_index(std::uint32_t i) const {
    if (i >= io_.size()) {
      error_context c;
      c.controller = name_;
      throw error("I/O queue index " + std::to_string(i) + " out of range (" +
                      std::to_string(io_.size()) + " queues)",
                  c);
    }
  }

  const queue_resources& io_queue_res(std::uint32_t queue) const {
    check_queue_index(queue);
    if (opts_.device_doorbells) {
      error_context c;
      c.controller = name_;
      c.queue = static_cast<std::uint16_t>(queue + 1);
      throw error("host I/O on queues placed for GPU submitters", c);
    }
    return io_[queue];
  }

  error command_error(const std::string& what, std::uint16_t qid, const nvme::command& cmd,
                      nvme::status st, std::optional<std::uint64_t> lba) const {
    error_context c;
    c.controller = name_;
    c.queue = qid;
    c.opcode = cmd.opcode;
    c.cid = cmd.cid;
    c.lba = lba;
    c.status = st;
    return error(what, c);
  }

  void run_io(std::uint32_t queue, nvme::command cmd, std::optional<std::uint64_t> lba) {
    const auto& q = io_queue_res(queue);
    std::uint64_t ticket = 0;
    nvme::status st = q.ref.submit(cmd, ticket, [&](nvme::command& c, std::uint32_t) { cmd = c; });
    if (st.ok()) st = q.ref.wait(ticket);
    if (!st.ok()) throw command_error("I/O command failed", q.ref.qid, cmd, st, lba);
  }

  void block_io(nvme::nvm_opcode op, std::uint32_t nsid, std::uint64_t lba, std::uint32_t nblocks,
                const dma_region& buf, std::size_t offset, std::uint32_t queue) {
    check_range(nsid, lba, nblocks);
    const auto& q = io_queue_res(queue);
    const std::uint32_t lba_size = ns(nsid).lba_size;
    const std::uint64_t total = static_cast<std::uint64_t>(nblocks) * lba_size;
    if (offset % 4 != 0 || offset + total > buf.size()) {
      error_context c;
      c.controller = name_;
      c.lba = lba;
      c.errnum = EINVAL;
      throw error("buffer of " + std::to_string(buf.size()) + " bytes cannot take " +
                      std::to_string(total) + " bytes at offset " + std::to_string(offset) +
                      " (dword-aligned offset required)",
                  c);
    }
    const std::uint32_t max_blocks = static_cast<std::uint32_t>(
        std::min<std::uint64_t>(max_transfer_ / lba_size, 65536));
    // Keep a few chunks in flight per call; each holds one PRP pool entry.
    constexpr std::size_t window = 8;
    std::vector<std::unique_ptr<inflight>> pending;
    std::optional<error> first_error;
    auto finish_one = [&]() {
      std::unique_ptr<inflight> f = std::move(pending.front());
      pending.erase(pending.begin());
      const nvme::status st = q.ref.wait(f->record);
      if (st == nvme::status_timeout || st == nvme::status_queue_broken) {
        // The command may still complete: its record and PRP lists stay
        // reserved until the controller is reset, never reused before.
        if (!first_error)
          first_error.emplace(command_error(op == nvme::nvm_opcode::read ? "read failed" : "write failed",
                                            q.ref.qid, f->cmd, st, f->lba));
        std::lock_guard<std::mutex> lock(quarantine_mutex_);
        quarantine_.push_back(std::move(f));
        return;
      }
      release_prp(f->pool_entry);
      if (!st.ok() && !first_error)
        first_error.emplace(command_error(op == nvme::nvm_opcode::read ? "read failed" : "write failed",
                                          q.ref.qid, f->cmd, st, f->lba));
    };
    for (std::uint64_t done = 0; done < nblocks && !first_error;) {
      const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(nblocks - done, max_blocks));
      if (pending.size() == window) finish_one();
      // Never block on the shared pool while holding entries: give ours back first.
      std::optional<std::uint32_t> got = try_acquire_prp();
      while (!got && !pending.empty()) {
        finish_one();
        got = try_acquire_prp();
      }
      if (first_error) break;
      const std::uint32_t entry = got ? *got : acquire_prp(q.ref.timeout_ns);
      std::uint64_t* list_virt[64];
      std::uint64_t list_bus[64];
      const std::size_t lp = std::min<std::size_t>(prp_.pages_per_entry, 64);
      for (std::size_t i = 0; i < lp; ++i) {
        const std::size_t off = (entry * prp_.pages_per_entry + i) * dma_page_size;
        list_virt[i] = reinterpret_cast<std::uint64_t*>(prp_.pages->as<unsigned char>() + off);
        list_bus[i] = prp_.pages->bus_address(off);
      }
      nvme::command cmd = nvme::make_rw(op, nsid, lba + done, n, 0, 0);
      try {
        set_prps(cmd, buf, offset + done * lba_size, static_cast<std::size_t>(n) * lba_size,
                 list_virt, list_bus, lp);
      } catch (...) {
        release_prp(entry);
        while (!pending.empty()) finish_one();
        throw;
      }
      auto f = std::make_unique<inflight>();
      f->pool_entry = entry;
      f->lba = lba + done;
      std::uint64_t ticket = 0;
      const nvme::status st = q.ref.submit(
          cmd, ticket, [&](nvme::command& c, std::uint32_t) { f->cmd = c; }, nvme::detail::no_idle{},
          &f->record);
      if (!st.ok()) {
        release_prp(entry);
        first_error.emplace(command_error("submission failed", q.ref.qid, cmd, st, lba + done));
        break;
      }
      pending.push_back(std::move(f));
      done += n;
    }
    while (!pending.empty()) finish_one();
    if (first_error) throw *first_error;
  }

  std::optional<std::uint32_t> try_acquire_prp() {
    std::lock_guard<std::mutex> lock(prp_.m);
    if (prp_.free.empty()) return std::nullopt;
    const std::uint32_t e = prp_.free.back();
    prp_.free.pop_back();
    return e;
  }
  //! Wait for a pool entry, holding none; bounded like every wait.
  std::uint32_t acquire_prp(std::uint64_t timeout_ns) {
    std::unique_lock<std::mutex> lock(prp_.m);
    if (!prp_.cv.wait_for(lock, std::chrono::nanoseconds(timeout_ns), [&] { return !prp_.free.empty(); })) {
      error_context c;
      c.controller = name_;
      c.status = nvme::status_timeout;
      throw error("no PRP list memory became free (commands that timed out keep theirs)", c);
    }
    const std::uint32_t e = prp_.free.back();
    prp_.free.pop_back();
    return e;
  }
  void release_prp(std::uint32_t e) {
    {
      std::lock_guard<std::mutex> lock(prp_.m);
      prp_.free.push_back(e);
    }
    prp_.cv.notify_one();
  }

  void delete_io_queues() {
    for (auto it = io_.rbegin(); it != io_.rend(); ++it) {
      if (it->created_sq) admin(nvme::make_delete_io_sq(it->ref.qid));
      it->created_sq = false;
      if (it->created_cq) admin(nvme::make_delete_io_cq(it->ref.qid));
      it->created_cq = false;
    }
  }

  void shutdown() {
    nvme::cc_register cc{transport_->read32(nvme::reg::cc)};
    cc.bits.shn = static_cast<std::uint32_t>(nvme::shutdown_notification::normal);
    transport_->write32(nvme::reg::cc, cc.raw);
    // RTD3E (microseconds) is the controller's own shutdown latency; never
    // less than CAP.TO or a few seconds.
    const std::uint64_t min_shutdown_ns = 5'000'000'000ull;
    const std::uint64_t timeout_ns = std::max({static_cast<std::uint64_t>(id_ctrl_.rtd3e) * 1000,
                                               state_timeout_ns_, min_shutdown_ns});
    const std::uint64_t deadline = detail::now_ns() + timeout_ns;
    for (;;) {
      nvme::csts_register s{transport_->read32(nvme::reg::csts)};
      if (s.raw == nvme::register_gone) return;
      if (s.bits.shst == static_cast<std::uint32_t>(nvme::shutdown_status::complete)) return;
      if (detail::now_ns() > deadline) {
        std::fprintf(stderr, "bam: controller %s did not complete shutdown within %llu ms (CSTS.SHST)\n",
                     name_.c_str(), static_cast<unsigned long long>(timeout_ns / 1'000'000));
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  bool any_queue_broken() const {
    if (admin_.state != nullptr && admin_.ref.broken()) return true;
    if (!host_state_) return false; // state placed by the caller (GPU memory): not readable here
    for (const auto& q : io_)
      if (q.state != nullptr && q.ref.broken()) return true;
    return false;
  }

  //! CC.EN=0 and wait (bounded by CAP.TO) for CSTS.RDY=0: the controller stops
  //! all DMA and forgets its queues. Never throws.
  void reset_quietly() noexcept {
    try {
      nvme::cc_register cc{transport_->read32(nvme::reg::cc)};
      if (cc.raw == nvme::register_gone) return;
      cc.bits.en = 0;
      transport_->write32(nvme::reg::cc, cc.raw);
      const std::uint64_t deadline = detail::now_ns() + std::max<std::uint64_t>(state_timeout_ns_, 1'000'000);
      for (;;) {
        nvme::csts_register s{transport_->read32(nvme::reg::csts)};
        if (s.raw == nvme::register_gone || s.bits.rdy == 0) return;
        if (detail::now_ns() > deadline) {
          std::fprintf(stderr, "bam: controller %s did not stop (CSTS.RDY=1 after CC.EN=0)\n", name_.c_str());
          return;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    } catch (...) {
    }
  }

  [[noreturn]] void fail(const std::string& what) const {
    error_context c;
    c.controller = name_;
    throw error("controller bring-up failed in state '" + std::string(state_name(state_)) + "': " + what,
                c);
  }

  //! Zeroed, aligned as the queue counters require.
  static void* host_state_alloc(std::size_t bytes) {
    constexpr std::size_t align = alignof(nvme::detail::queue_counters);
    void* p = std::aligned_alloc(align, (bytes + align - 1) / align * align);
    if (p != nullptr) std::memset(p, 0, bytes);
    return p;
  }

  static std::string trim(const char* s, std::size_t n) {
    std::string out(s, strnlen(s, n));
    while (!out.empty() && (out.back() == ' ' || out.back() == '\0')) out.pop_back();
    return out;
  }

  std::shared_ptr<transport> transport_;
  controller_options opts_;
  std::string name_;
  controller_state state_ = controller_state::disable;
  nvme::cap_register cap_{};
  std::uint32_t dstrd_ = 0;
  std::uint64_t state_timeout_ns_ = 0;
  nvme_id_ctrl id_ctrl_{};
  std::vector<namespace_info> namespaces_;
  queue_resources admin_;
  std::vector<queue_resources> io_;
  std::uint32_t io_depth_ = 0;
  std::mutex quarantine_mutex_;
  std::vector<std::unique_ptr<inflight>> quarantine_; //!< timed out, may still complete
  bool host_state_ = true; //!< I/O queue state in host memory (the default allocator)
  std::size_t max_transfer_ = 0;
  prp_pool prp_;
};

} // namespace bam
