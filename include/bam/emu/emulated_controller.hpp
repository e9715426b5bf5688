// SPDX-License-Identifier: MIT
//! `bam::emu::emulated_controller`: a software NVMe controller inside the process. It
//! implements the NVMe 2.0 register and queue protocol — CAP/VS/CC/CSTS/AQA/
//! ASQ/ACQ, doorbells, admin and NVM command sets, PRPs — over RAM, a file or
//! a block device, so the whole library runs and is tested with no SSD.
//!
//! DMA is modelled: `map` hands out fake bus addresses (far from any virtual
//! address) and every PRP the controller follows is translated; an address
//! that was never mapped completes the command with Data Transfer Error, which
//! catches drivers that pass virtual addresses. With `identity_dma` the bus
//! address is the virtual address (for engines that run on the GPU).
//!
//! The controller is a `bam::transport`: the driver above brings it up like
//! an SSD. It owns the register file, the admin command set and the
//! namespaces; an *engine* serves the I/O queues (engine.hpp) and runs every
//! fetched command through the one executor (nvm_executor.hpp) with the one
//! fault table (fault_table.hpp).
//!
//! @code
//!   bam::emu::controller_config cfg;
//!   cfg.namespaces.push_back({.blocks = 1 << 20, .lba_size = 512});   // 512 MiB of RAM
//!   auto ctrl = bam::emu::make_emulated_controller(cfg);
//!   ctrl->write32(bam::nvme::reg::aqa, ...);            // bring-up as on hardware
//!   auto* db = ctrl->doorbell(bam::nvme::sq_doorbell_offset(0, 0));
//!   ctrl->faults().set_global_latency_ns(80'000);       // an SSD-like 80 us
//! @endcode
#pragma once

#include <bam/emu/cpu_engine.hpp>
#include <bam/emu/detail/dma_table.hpp>
#include <bam/emu/engine.hpp>
#include <bam/emu/fault_table.hpp>
#include <bam/emu/media.hpp>
#include <bam/emu/nvm_executor.hpp>
#include <bam/error.hpp>
#include <bam/nvme/prp.hpp>
#include <bam/nvme/spec.hpp>
#include <bam/transport/transport.hpp>

#include <nvme/types.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

namespace bam::emu {

//! One namespace (NSIDs are 1, 2, ... in order).
struct namespace_config {
  std::uint64_t blocks = 0;       //!< logical blocks
  std::uint32_t lba_size = 512;   //!< bytes per block: a power of two, 512 to 65536
  std::shared_ptr<media> backing; //!< null: RAM of blocks * lba_size bytes
};

struct controller_config {
  std::vector<namespace_config> namespaces;
  std::uint32_t max_queue_entries = 4096; //!< CAP.MQES + 1 (2..65536)
  std::uint32_t max_io_queues = 256;      //!< I/O SQs (and CQs) the controller offers
  std::uint8_t mdts = 5;                  //!< max transfer 2^mdts * 4 KiB; 0: no limit
  std::uint32_t engine_threads = 2;       //!< CPU engine threads for I/O queues
  std::uint8_t dstrd = 0;                 //!< CAP.DSTRD: doorbell stride 4 << dstrd bytes
  std::uint8_t cap_to = 4;                //!< CAP.TO, 500 ms units
  std::uint64_t ready_delay_ns = 0;       //!< CSTS.RDY rises this long after CC.EN
  bool identity_dma = false;              //!< bus address == virtual address
  std::string name = "emu";               //!< for messages and thread names
  //! Engine serving the I/O queues; null: a CPU engine with `engine_threads`.
  //! The admin queue is always served by a CPU thread of the controller.
  std::shared_ptr<bam::emu::io_engine> io_engine;
};

//! Host-visible counters, as in the SMART / Health log.
struct controller_counters {
  std::uint64_t data_units_read;    //!< 512-byte units read
  std::uint64_t data_units_written; //!< 512-byte units written
  std::uint64_t host_reads;         //!< read commands completed
  std::uint64_t host_writes;        //!< write commands completed
  std::uint64_t media_errors;
  std::uint64_t error_log_entries;
  std::uint64_t flushes; //!< Flush commands completed
};

namespace detail {

//! VS register value: NVMe 1.4.0.
inline constexpr std::uint32_t emu_version = 0x00010400u;
//! PCI vendor id reported (0xffff would read as "no device"; this one is
//! not a PCI-SIG assignment of any real vendor we know of).
inline constexpr std::uint16_t emu_vendor_id = 0x1b4d;
inline constexpr const char* emu_model = "bam software NVMe controller";
inline constexpr const char* emu_firmware = "0.1.0";
//! Error Information log entries kept (Identify ELPE + 1).
inline constexpr std::uint32_t error_log_entries = 64;
//! Size of the SMART/Health and Firmware Slot log pages.
inline constexpr std::size_t health_log_size = 512;
//! Outstanding Asynchronous Event Requests accepted (Identify AERL + 1).
inline constexpr std::uint32_t max_async_events = 4;
//! Command specific status: Asynchronous Event Request Limit Exceeded.
inline constexpr std::uint8_t async_event_limit_exceeded = 0x05;
//! Concurrent Abort commands (Identify ACL + 1).
inline constexpr std::uint8_t abort_limit = 4;
//! Active namespace IDs per Identify CNS 2 page.
inline constexpr std::size_t ns_list_entries = nvme::identify_data_size / sizeof(std::uint32_t);
//! CQE sq_id/sq_head, Identify SQES/CQES: required (low nibble) and maximum (high nibble).
inline constexpr std::uint8_t sqes_value = (nvme::sq_entry_log2 << 4) | nvme::sq_entry_log2;
inline constexpr std::uint8_t cqes_value = (nvme::cq_entry_log2 << 4) | nvme::cq_entry_log2;
//! Identify VWC: present, and Flush with NSID FFFFFFFFh supported (bits 2:1 = 11b).
inline constexpr std::uint8_t vwc_value = 0x07;
//! Identify FRMW: one firmware slot, slot 1 read-only.
inline constexpr std::uint8_t frmw_value = 0x03;
//! Identify DLFEAT: deallocated blocks read as zeroes; Write Zeroes may deallocate.
inline constexpr std::uint8_t dlfeat_value = 0x09;
//! Identify CNTRLTYPE: I/O controller.
inline constexpr std::uint8_t cntrltype_io = 1;
//! Temperature reported in the health log, Kelvin.
inline constexpr std::uint16_t reported_temperature_k = 313;
//! Largest number of a 0-based queue count field in Number of Queues.
inline constexpr std::uint32_t num_queues_field_max = 0xfffe;

//! Copy `text` into a fixed, space-padded ASCII field.
inline void set_ascii(char* field, std::size_t n, const std::string& text) {
  std::memset(field, ' ', n);
  std::memcpy(field, text.data(), std::min(n, text.size()));
}
//! Store a count in a 128-bit little-endian log field.
inline void set_u128(std::uint8_t* field, std::uint64_t v) {
  std::memset(field, 0, 16);
  std::memcpy(field, &v, sizeof v);
}

} // namespace detail

//! The software NVMe controller. Create it with `make_emulated_controller`.
class emulated_controller : public transport {
public:
  explicit emulated_controller(controller_config cfg)
      : cfg_(std::move(cfg)), dma_(std::make_shared<detail::dma_table>(cfg_.identity_dma)),
        started_ns_(bam::detail::now_ns()) {
    validate_config();
    for (const auto& n : cfg_.namespaces) {
      ns_.push_back({n.blocks, n.lba_size, static_cast<std::uint32_t>(std::countr_zero(n.lba_size)),
                     n.backing ? n.backing : make_ram_media(n.blocks * n.lba_size)});
      ns_geometry_.push_back({n.blocks, static_cast<std::uint32_t>(std::countr_zero(n.lba_size)), 0});
    }
    std::memset(&nvm_counters_, 0, sizeof nvm_counters_);
    target_.ns = ns_geometry_.data();
    target_.ns_count = static_cast<std::uint32_t>(ns_geometry_.size());
    target_.max_transfer_bytes = cfg_.mdts == 0 ? 0 : dma_page_size << cfg_.mdts;
    target_.counters = &nvm_counters_;
    target_.faults = faults_.table();
    doorbell_stride_ = 4u << cfg_.dstrd;
    const std::size_t db_bytes = static_cast<std::size_t>(2) * (cfg_.max_io_queues + 1) * doorbell_stride_;
    regs_bytes_ = transport::round_up(nvme::reg::doorbell_base + db_bytes);
    regs_.reset(static_cast<std::uint32_t*>(std::aligned_alloc(dma_page_size, regs_bytes_)));
    if (!regs_) throw_errno("allocating the register file", ENOMEM, cfg_.name);
    std::memset(regs_.get(), 0, regs_bytes_);

    nvme::cap_register cap{};
    cap.bits.mqes = cfg_.max_queue_entries - 1;
    cap.bits.cqr = 1;
    cap.bits.to = cfg_.cap_to;
    cap.bits.dstrd = cfg_.dstrd;
    cap.bits.css = 1; // NVM command set
    cap.bits.mpsmin = 0;
    cap.bits.mpsmax = 0;
    cap_ = cap.raw;

    sqs_.resize(cfg_.max_io_queues + 1);
    cqs_.resize(cfg_.max_io_queues + 1);
    processed_ = std::make_unique<std::atomic<std::uint64_t>[]>(cfg_.max_io_queues + 1);
    for (std::uint32_t i = 0; i <= cfg_.max_io_queues; ++i)
      processed_[i].store(0);

    admin_engine_ = std::make_unique<cpu_engine>(1, cfg_.name + "-a", faults_.table());
    if (cfg_.io_engine) {
      io_engine_ = cfg_.io_engine;
    } else {
      io_engine_ = std::make_shared<cpu_engine>(cfg_.engine_threads, cfg_.name, faults_.table());
    }
    // An engine that reads the fault table elsewhere (GPU memory) gets a copy
    // that every change reaches.
    if (auto copy = io_engine_->fault_table_copy()) faults_.add_copy(std::move(copy));
    io_engine_->attached(cfg_.dstrd);
  }

  ~emulated_controller() override {
    admin_engine_.reset(); // joins the admin thread
    io_engine_->reset();
    io_engine_.reset();
  }
  emulated_controller(const emulated_controller&) = delete;
  emulated_controller& operator=(const emulated_controller&) = delete;

  // -------------------------------------------------------------------------
  // transport
  // -------------------------------------------------------------------------

  std::string name() const override { return cfg_.name; }

  std::uint32_t read32(std::uint32_t offset) override {
    check_register(offset);
    if (offset >= nvme::reg::doorbell_base) return detail::load_doorbell(reg_word(offset));
    std::lock_guard lock(reg_mutex_);
    switch (offset) {
    case nvme::reg::cap: return static_cast<std::uint32_t>(cap_);
    case nvme::reg::cap + 4: return static_cast<std::uint32_t>(cap_ >> 32);
    case nvme::reg::vs: return detail::emu_version;
    case nvme::reg::intms:
    case nvme::reg::intmc: return intm_;
    case nvme::reg::cc: return cc_.raw;
    case nvme::reg::csts: return csts_locked().raw;
    case nvme::reg::aqa: return aqa_.raw;
    case nvme::reg::asq: return static_cast<std::uint32_t>(asq_);
    case nvme::reg::asq + 4: return static_cast<std::uint32_t>(asq_ >> 32);
    case nvme::reg::acq: return static_cast<std::uint32_t>(acq_);
    case nvme::reg::acq + 4: return static_cast<std::uint32_t>(acq_ >> 32);
    default: return 0;
    }
  }

  void write32(std::uint32_t offset, std::uint32_t value) override {
    check_register(offset);
    if (offset >= nvme::reg::doorbell_base) {
      std::atomic_ref<std::uint32_t>(*reg_word(offset)).store(value, std::memory_order_release);
      return;
    }
    std::lock_guard lock(reg_mutex_);
    switch (offset) {
    case nvme::reg::intms: intm_ |= value; break;
    case nvme::reg::intmc: intm_ &= ~value; break;
    case nvme::reg::cc: write_cc(value); break;
    case nvme::reg::aqa: aqa_.raw = value; break;
    case nvme::reg::asq: asq_ = (asq_ & ~0xffffffffull) | value; break;
    case nvme::reg::asq + 4: asq_ = (asq_ & 0xffffffffull) | (std::uint64_t{value} << 32); break;
    case nvme::reg::acq: acq_ = (acq_ & ~0xffffffffull) | value; break;
    case nvme::reg::acq + 4: acq_ = (acq_ & 0xffffffffull) | (std::uint64_t{value} << 32); break;
    default: break; // read-only or reserved: ignored
    }
  }

  volatile std::uint32_t* doorbell(std::uint32_t offset) override {
    check_register(offset);
    if (offset < nvme::reg::doorbell_base) {
      error_context c;
      c.controller = cfg_.name;
      c.errnum = EINVAL;
      throw error("register offset " + std::to_string(offset) + " is not a doorbell", c);
    }
    return reg_word(offset);
  }

  volatile std::uint32_t* device_doorbell(std::uint32_t offset) override {
    check_register(offset);
    return io_engine_->device_doorbell(offset);
  }
  nvme::memory_scope device_doorbell_scope() const override { return io_engine_->device_doorbell_scope(); }
  device_progress device_progress_hook() const override { return io_engine_->device_progress_hook(); }
  bool exact_sq_head() const override { return io_engine_->exact_sq_head(); }
  const std::uint64_t* controller_run_ns(std::uint16_t qid) const override {
    return qid == 0 ? admin_engine_->run_ns(0) : io_engine_->run_ns(qid);
  }

  std::unique_ptr<dma_region> map(void* ptr, std::size_t size, memory_kind kind) override {
    check_map_args(ptr, size, kind);
    if (kind == memory_kind::device && !dma_->identity()) {
      error_context c;
      c.controller = cfg_.name;
      c.errnum = ENOTSUP;
      throw error("the software controller's CPU engine cannot reach GPU memory "
                  "(map it with identity_dma and a GPU engine)",
                  c);
    }
    std::uint64_t key = 0;
    const std::uint64_t bus = dma_->add(ptr, size, key);
    return std::make_unique<detail::emu_dma_region>(dma_, ptr, size, kind, bus, key);
  }

  // -------------------------------------------------------------------------
  // Emulation controls and introspection
  // -------------------------------------------------------------------------

  const controller_config& config() const noexcept { return cfg_; }
  //! Fault rules and the global added latency.
  fault_injector& faults() noexcept { return faults_; }
  //! Stop (true) or resume fetching and completing commands; registers keep working.
  void stop_answering(bool stop) { faults_.set_paused(stop); }
  bool answering() const { return !faults_.paused(); }
  //! The engine serving the I/O queues.
  io_engine& engine() const { return *io_engine_; }
  //! Commands fetched from all queues / from SQ `qid` (dropped ones included).
  std::uint64_t commands_processed() const {
    std::uint64_t n = 0;
    for (std::uint32_t i = 0; i <= cfg_.max_io_queues; ++i)
      n += processed_[i].load();
    return n;
  }
  std::uint64_t commands_processed(std::uint16_t qid) const {
    return qid <= cfg_.max_io_queues ? processed_[qid].load() : 0;
  }
  controller_counters counters() const {
    nvm_counters h;
    auto ld = [](const std::uint64_t& w) {
      return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(w)).load(std::memory_order_relaxed);
    };
    h.units_read = ld(nvm_counters_.units_read);
    h.units_written = ld(nvm_counters_.units_written);
    h.host_reads = ld(nvm_counters_.host_reads);
    h.host_writes = ld(nvm_counters_.host_writes);
    h.media_errors = ld(nvm_counters_.media_errors);
    h.flushes = ld(nvm_counters_.flushes);
    const nvm_counters e = io_engine_->counters();
    return {h.units_read + e.units_read,   h.units_written + e.units_written, h.host_reads + e.host_reads,
            h.host_writes + e.host_writes, h.media_errors + e.media_errors,   error_count_.load(),
            h.flushes + e.flushes};
  }
  std::uint32_t namespace_count() const { return static_cast<std::uint32_t>(ns_.size()); }
  //! The media of namespace `nsid` (1-based), e.g. to preload or inspect data.
  media& namespace_media(std::uint32_t nsid) {
    if (nsid == 0 || nsid > ns_.size()) {
      error_context c;
      c.controller = cfg_.name;
      c.errnum = EINVAL;
      throw error("no namespace " + std::to_string(nsid), c);
    }
    return *ns_[nsid - 1].backing;
  }
  //! Virtual address of bus range `[bus, bus + len)`, nullptr if not mapped as a whole.
  void* translate(std::uint64_t bus, std::uint64_t len) const { return dma_->translate(bus, len); }

  //! What the CPU engines call for each command they fetch from SQ `qid`:
  //! statistics, fault rules, execution (admin here; I/O by the one
  //! executor, `process_nvm`, over host memory and the namespaces' media),
  //! error log.
  command_outcome process(const nvme::command& cmd, std::uint16_t qid) {
    if (qid <= cfg_.max_io_queues) processed_[qid].fetch_add(1, std::memory_order_relaxed);
    command_outcome out;
    if (qid == 0) {
      const fault_decision f = faults_.table()->check(cmd, qid);
      if (f.matched && f.action == fault_action::drop) {
        out.drop = true;
        return out;
      }
      if (f.matched && f.action == fault_action::fail) {
        out.status = f.status;
      } else {
        out = run_admin(cmd);
        if (f.matched && f.action == fault_action::delay) out.delay_ns += f.latency_ns;
      }
      if (!out.drop) out.delay_ns += faults_.table()->added_latency_ns();
    } else {
      host_backend be{this};
      out = process_nvm(cmd, qid, target_, be);
    }
    if (!out.drop && !out.status.ok()) log_error(cmd, qid, out.status);
    return out;
  }

  //! What commands execute against (namespaces, limit, counters, faults), for
  //! engines that run the executor themselves over their own media view.
  const nvm_target& target() const { return target_; }

private:
  //! The executor's backend for commands the host serves: PRPs translated
  //! through the DMA table, blocks on the namespaces' media.
  struct host_backend {
    emulated_controller* c;
    nvme::status move(std::uint32_t nsid, std::uint64_t offset, std::uint64_t bytes, const nvme::command& cmd,
                      bool write) {
      auto& segs = scratch_segments();
      const nvme::status st = c->prp_segments(cmd.prp1, cmd.prp2, bytes, segs);
      if (!st.ok()) return st;
      media& m = *c->ns_[nsid - 1].backing;
      const int err = write ? m.write(offset, segs) : m.read(offset, segs);
      if (err != 0) return write ? detail::write_status(err) : detail::read_error();
      return nvme::status_success;
    }
    nvme::status flush(std::uint32_t nsid) {
      for (std::uint32_t i = 0; i < c->ns_.size(); ++i)
        if ((nsid == 0 || nsid == i + 1) && c->ns_[i].backing->flush() != 0) return detail::write_fault();
      return nvme::status_success;
    }
    nvme::status zero(std::uint32_t nsid, std::uint64_t offset, std::uint64_t len, bool deallocate) {
      media& m = *c->ns_[nsid - 1].backing;
      const int err = deallocate ? m.deallocate(offset, len) : m.write_zeroes(offset, len);
      return detail::write_status(err);
    }
    nvme::status fetch(const nvme::command& cmd, std::uint64_t offset, void* dst, std::uint64_t len) {
      // The ranges are read from the start of the buffer; `offset` selects a piece of it.
      std::vector<unsigned char> all(offset + len);
      const nvme::status st = c->copy_from_host(cmd, all.data(), all.size());
      if (st.ok()) std::memcpy(dst, all.data() + offset, len);
      return st;
    }
  };

  struct ns_info {
    std::uint64_t blocks;
    std::uint32_t lba_size;
    std::uint32_t lba_shift;
    std::shared_ptr<media> backing;
  };
  struct io_sq {
    std::uint16_t cqid;
    std::uint32_t depth;
  };
  struct io_cq {
    std::unique_ptr<cq_state> state;
    std::uint64_t bus;
    std::uint32_t sq_users = 0;
  };
  struct free_deleter {
    void operator()(void* p) const { std::free(p); }
  };

  [[noreturn]] void config_error(const std::string& what) const {
    error_context c;
    c.controller = cfg_.name;
    c.errnum = EINVAL;
    throw error("invalid software controller configuration: " + what, c);
  }

  void validate_config() const {
    if (cfg_.max_queue_entries < 2 || cfg_.max_queue_entries > nvme::max_io_queue_entries)
      config_error("max_queue_entries must be 2.." + std::to_string(nvme::max_io_queue_entries));
    if (cfg_.max_io_queues < 1 || cfg_.max_io_queues > detail::num_queues_field_max + 1)
      config_error("max_io_queues must be 1.." + std::to_string(detail::num_queues_field_max + 1));
    if (cfg_.dstrd > 7) config_error("dstrd must be 0..7");
    if (cfg_.mdts > 16) config_error("mdts must be 0..16");
    std::uint32_t nsid = 1;
    for (const auto& n : cfg_.namespaces) {
      const std::string which = "namespace " + std::to_string(nsid++);
      if (n.blocks == 0) config_error(which + " has no blocks");
      if (n.lba_size < 512 || n.lba_size > 65536 || !std::has_single_bit(n.lba_size))
        config_error(which + ": lba_size must be a power of two, 512..65536");
      if (n.backing && n.backing->size() / n.lba_size < n.blocks)
        config_error(which + ": media " + n.backing->describe() + " is smaller than " + std::to_string(n.blocks) +
                     " blocks of " + std::to_string(n.lba_size));
    }
  }

  void check_register(std::uint32_t offset) const {
    if (offset % 4 != 0 || offset >= regs_bytes_) {
      error_context c;
      c.controller = cfg_.name;
      c.errnum = EINVAL;
      throw error("register offset " + std::to_string(offset) + " outside the register file", c);
    }
  }
  std::uint32_t* reg_word(std::uint32_t offset) const { return regs_.get() + offset / 4; }
  std::uint32_t* sq_doorbell_word(std::uint16_t qid) const {
    return reg_word(nvme::sq_doorbell_offset(qid, cfg_.dstrd));
  }
  std::uint32_t* cq_doorbell_word(std::uint16_t qid) const {
    return reg_word(nvme::cq_doorbell_offset(qid, cfg_.dstrd));
  }

  // ---- CC / CSTS (reg_mutex_ held) ---------------------------------------

  nvme::csts_register csts_locked() const {
    nvme::csts_register c = csts_;
    if (enabled_ && !c.bits.cfs && bam::detail::now_ns() >= ready_at_ns_) c.bits.rdy = 1;
    return c;
  }

  void write_cc(std::uint32_t value) {
    nvme::cc_register next{};
    next.raw = value;
    const nvme::cc_register prev = cc_;
    cc_ = next;
    if (!prev.bits.en && next.bits.en) {
      enable();
    } else if (prev.bits.en && !next.bits.en) {
      reset_controller();
    }
    if (next.bits.en && next.bits.shn != prev.bits.shn &&
        next.bits.shn != static_cast<std::uint32_t>(nvme::shutdown_notification::none)) {
      shutdown(next.bits.shn == static_cast<std::uint32_t>(nvme::shutdown_notification::normal));
    }
  }

  void enable() {
    const nvme::cc_register cc = cc_;
    const std::uint32_t asq_entries = aqa_.bits.asqs + 1;
    const std::uint32_t acq_entries = aqa_.bits.acqs + 1;
    void* sq = nullptr;
    void* cq = nullptr;
    const bool ok = cc.bits.iosqes == nvme::sq_entry_log2 && cc.bits.iocqes == nvme::cq_entry_log2 &&
                    cc.bits.mps == 0 && cc.bits.css == 0 && cc.bits.ams == 0 && asq_entries >= 2 && acq_entries >= 2 &&
                    asq_ % dma_page_size == 0 && acq_ % dma_page_size == 0 &&
                    (sq = dma_->translate(asq_, asq_entries * sizeof(nvme::command))) != nullptr &&
                    (cq = dma_->translate(acq_, acq_entries * sizeof(nvme::completion))) != nullptr;
    if (!ok) {
      csts_.bits.cfs = 1; // a configuration the controller cannot run: fatal until reset
      return;
    }
    admin_cq_ = std::make_unique<cq_state>();
    admin_cq_->ring = static_cast<nvme::completion*>(cq);
    admin_cq_->depth = acq_entries;
    admin_cq_->head_doorbell = cq_doorbell_word(0);
    admin_cq_->cqid = 0;
    ready_at_ns_ = bam::detail::now_ns() + cfg_.ready_delay_ns;
    enabled_ = true;
    queue_info q;
    q.qid = 0;
    q.sq = static_cast<nvme::command*>(sq);
    q.sq_depth = asq_entries;
    q.sq_tail_doorbell = sq_doorbell_word(0);
    q.cq = admin_cq_.get();
    q.sq_bus = asq_;
    q.cq_bus = acq_;
    q.ready_at_ns = ready_at_ns_;
    q.process = [this](const nvme::command& c) { return process(c, 0); };
    admin_engine_->queue_created(q);
  }

  //! Controller reset (CC.EN 1 -> 0): every queue is gone, doorbells read 0.
  void reset_controller() {
    admin_engine_->reset();
    io_engine_->reset();
    {
      std::lock_guard lock(queues_mutex_);
      for (auto& s : sqs_)
        s.reset();
      for (auto& c : cqs_)
        c.reset();
      allocated_queues_.reset();
      async_events_ = 0;
    }
    admin_cq_.reset();
    for (std::uint32_t off = nvme::reg::doorbell_base; off < regs_bytes_; off += 4)
      std::atomic_ref<std::uint32_t>(*reg_word(off)).store(0, std::memory_order_release);
    csts_.raw = 0;
    enabled_ = false;
    ready_at_ns_ = 0;
  }

  void shutdown(bool normal) {
    if (normal) {
      for (auto& n : ns_)
        n.backing->flush();
    }
    csts_.bits.shst = static_cast<std::uint32_t>(nvme::shutdown_status::complete);
  }

  // ---- DMA --------------------------------------------------------------

  //! The host memory pieces the PRPs of a `bytes` transfer describe.
  nvme::status prp_segments(std::uint64_t prp1, std::uint64_t prp2, std::uint64_t bytes,
                            std::vector<iovec>& segs) const {
    segs.clear();
    auto read_list = [&](std::uint64_t bus, std::uint64_t* dst, std::size_t n) {
      const void* p = dma_->translate(bus, n * sizeof(std::uint64_t));
      if (p == nullptr) return false;
      std::memcpy(dst, p, n * sizeof(std::uint64_t));
      return true;
    };
    auto segment = [&](std::uint64_t bus, std::uint64_t len) {
      void* p = dma_->translate(bus, len);
      if (p == nullptr) return false;
      if (!segs.empty() && static_cast<unsigned char*>(segs.back().iov_base) + segs.back().iov_len == p)
        segs.back().iov_len += len; // contiguous in virtual memory too: merge
      else
        segs.push_back({p, len});
      return true;
    };
    return nvme::walk_prp(prp1, prp2, bytes, dma_page_size, read_list, segment);
  }

  static std::vector<iovec>& scratch_segments() {
    thread_local std::vector<iovec> segs;
    return segs;
  }

  nvme::status copy_to_host(const nvme::command& cmd, const void* src, std::size_t len) const {
    auto& segs = scratch_segments();
    const nvme::status st = prp_segments(cmd.prp1, cmd.prp2, len, segs);
    if (!st.ok()) return st;
    detail::scatter(static_cast<const unsigned char*>(src), segs);
    return nvme::status_success;
  }
  nvme::status copy_from_host(const nvme::command& cmd, void* dst, std::size_t len) const {
    auto& segs = scratch_segments();
    const nvme::status st = prp_segments(cmd.prp1, cmd.prp2, len, segs);
    if (!st.ok()) return st;
    detail::gather(static_cast<unsigned char*>(dst), segs);
    return nvme::status_success;
  }

  // ---- Admin command set (detail/admin_commands.hpp) ----------------------

  command_outcome run_admin(const nvme::command& cmd);
  nvme::status identify(const nvme::command& cmd);
  nvme::status features(const nvme::command& cmd, bool set, std::uint32_t& dw0);
  std::uint32_t queue_id_limit() const;
  nvme::status create_cq(const nvme::command& cmd);
  nvme::status create_sq(const nvme::command& cmd);
  nvme::status delete_sq(const nvme::command& cmd);
  nvme::status delete_cq(const nvme::command& cmd);
  nvme::status get_log_page(const nvme::command& cmd);
  void log_error(const nvme::command& cmd, std::uint16_t qid, nvme::status st);

  controller_config cfg_;
  std::shared_ptr<detail::dma_table> dma_;
  std::uint64_t started_ns_;
  std::vector<ns_info> ns_;
  std::uint32_t doorbell_stride_ = 4;
  std::size_t regs_bytes_ = 0;
  std::unique_ptr<std::uint32_t, free_deleter> regs_; //!< the register file (doorbells live here)

  // Registers other than doorbells; reg_mutex_ guards them and every CC transition.
  std::mutex reg_mutex_;
  std::uint64_t cap_ = 0;
  nvme::cc_register cc_{};
  nvme::csts_register csts_{};
  nvme::aqa_register aqa_{};
  std::uint64_t asq_ = 0;
  std::uint64_t acq_ = 0;
  std::uint32_t intm_ = 0;
  bool enabled_ = false;
  std::uint64_t ready_at_ns_ = 0;
  std::unique_ptr<cq_state> admin_cq_;

  // Queue tables: written by admin commands (admin thread) and by reset.
  std::mutex queues_mutex_;
  std::vector<std::optional<io_sq>> sqs_;
  std::vector<std::optional<io_cq>> cqs_;
  std::optional<std::pair<std::uint32_t, std::uint32_t>> allocated_queues_; //!< 0-based NSQA, NCQA
  std::uint32_t async_events_ = 0;
  std::atomic<bool> write_cache_{true};

  fault_injector faults_;
  std::vector<nvm_namespace> ns_geometry_;
  nvm_counters nvm_counters_;
  nvm_target target_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> processed_;
  std::atomic<std::uint64_t> error_count_{0};
  std::mutex error_mutex_;
  std::deque<nvme_error_log_page> error_log_;

  // Engines last: destroyed first, while everything they call into still exists.
  std::shared_ptr<io_engine> io_engine_;
  std::unique_ptr<cpu_engine> admin_engine_;
};

//! Create a software controller.
inline std::shared_ptr<emulated_controller> make_emulated_controller(controller_config cfg) {
  return std::make_shared<emulated_controller>(std::move(cfg));
}

//! A controller with one RAM namespace of `bytes` bytes (rounded down to whole blocks).
inline std::shared_ptr<emulated_controller>
make_ram_emulated_controller(std::uint64_t bytes, std::uint32_t lba_size = 512, controller_config cfg = {}) {
  cfg.namespaces.push_back({bytes / lba_size, lba_size, nullptr});
  return make_emulated_controller(std::move(cfg));
}

} // namespace bam::emu

#include <bam/emu/detail/admin_commands.hpp>
