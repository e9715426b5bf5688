// SPDX-License-Identifier: MIT
//! `bam::controller`: the host driver of one NVMe controller. It brings the
//! controller up by the spec over any `bam::transport` (the kernel module's
//! PCI transport, or the software controller), creates I/O queue pairs where
//! the caller says (host memory, or GPU memory for GPU submitters), and
//! offers synchronous block I/O from host threads. When the transport says
//! the controller's admin queue is someone else's (the kernel module, which
//! shares one controller among processes), it skips the bring-up, asks the
//! transport for its I/O queue pairs and sends admin commands through it.
//!
//! @code
//!   auto t = bam::emu::make_ram_emulated_controller(64 << 20);   // or a pci_transport
//!   bam::controller ctrl(t, {.io_queues = 4, .queue_depth = 256});
//!   std::printf("%s, %llu blocks\n", ctrl.model().c_str(),
//!               (unsigned long long)ctrl.ns(1).blocks);
//!   auto buf = ctrl.transport().alloc(8 * ctrl.ns(1).lba_size);
//!   ctrl.write(1, /*lba=*/100, /*nblocks=*/8, *buf);
//!   ctrl.read(1, 100, 8, *buf, 0, /*queue=*/2);
//! @endcode
//!
//! Every failure throws `bam::error` naming the controller, queue, opcode,
//! command id, LBA and NVMe status. A command that timed out keeps its memory
//! (data buffer of driver-owned transfers, PRP lists, completion record) until
//! the controller has been reset, so a late completion never lands in freed
//! memory.
#pragma once

#include <bam/driver/detail/prp_pool.hpp>
#include <bam/error.hpp>
#include <bam/nvme/identify.hpp>
#include <bam/nvme/prp.hpp>
#include <bam/nvme/queue.hpp>
#include <bam/nvme/spec.hpp>
#include <bam/transport/transport.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
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
  std::function<std::unique_ptr<dma_region>(bam::transport&, std::size_t bytes)> ring_alloc;
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
  //! Bring the controller behind `t` up; throws `bam::error` naming the state that failed.
  explicit controller(std::shared_ptr<bam::transport> t, controller_options opts = {});
  //! Deletes the I/O queues and shuts the controller down (CC.SHN); after a
  //! timeout or a failed teardown, resets it (CC.EN=0) before any queue or
  //! quarantined memory is freed. Failures are reported through `bam::warn`.
  ~controller();
  controller(const controller&) = delete;
  controller& operator=(const controller&) = delete;

  bam::transport& transport() const { return *transport_; }
  const std::string& name() const { return name_; }
  controller_state state() const { return state_; }

  nvme::cap_register cap() const { return cap_; }
  const nvme_id_ctrl& identify_data() const { return id_ctrl_; }
  std::string model() const { return trim(id_ctrl_.mn, sizeof id_ctrl_.mn); }
  std::string serial() const { return trim(id_ctrl_.sn, sizeof id_ctrl_.sn); }
  std::string firmware() const { return trim(id_ctrl_.fr, sizeof id_ctrl_.fr); }

  const std::vector<namespace_info>& namespaces() const { return namespaces_; }
  const namespace_info& ns(std::uint32_t nsid) const;

  std::uint32_t io_queue_count() const { return static_cast<std::uint32_t>(io_.size()); }
  std::uint32_t io_queue_depth() const { return io_depth_; }
  //! Handle of I/O queue `i` (queue id i + 1).
  nvme::queue_pair_ref io_queue(std::uint32_t i) const {
    check_queue_index(i);
    return io_[i].ref;
  }
  //! The admin queue (empty on a shared controller: admin commands go through `admin`).
  nvme::queue_pair_ref admin_queue() const { return admin_.ref; }
  //! The controller is shared: its admin queue belongs to the transport's
  //! owner (the kernel module), which gave this driver its I/O queue pairs.
  bool shared() const { return shared_; }

  //! Largest transfer one command may move (MDTS, and what one PRP list
  //! chain of the driver describes).
  std::size_t max_transfer_bytes() const { return max_transfer_; }
  //! Controller memory page size (CC.MPS); bam uses 4 KiB.
  static constexpr std::size_t page_size() { return dma_page_size; }

  // ---- synchronous I/O from host threads -------------------------------

  void read(std::uint32_t nsid, std::uint64_t lba, std::uint32_t nblocks, const dma_region& buf, std::size_t offset = 0,
            std::uint32_t queue = 0) {
    block_io(nvme::nvm_opcode::read, nsid, lba, nblocks, buf, offset, queue);
  }
  void write(std::uint32_t nsid, std::uint64_t lba, std::uint32_t nblocks, const dma_region& buf,
             std::size_t offset = 0, std::uint32_t queue = 0) {
    block_io(nvme::nvm_opcode::write, nsid, lba, nblocks, buf, offset, queue);
  }
  void flush(std::uint32_t nsid, std::uint32_t queue = 0) { run_io(queue, nvme::make_flush(nsid), std::nullopt); }
  void write_zeroes(std::uint32_t nsid, std::uint64_t lba, std::uint32_t nblocks, std::uint32_t queue = 0);
  //! Dataset Management / deallocate of one range.
  void deallocate(std::uint32_t nsid, std::uint64_t lba, std::uint32_t nblocks, std::uint32_t queue = 0);

  //! Run one admin command; `data` (if any) is the transfer buffer, which must
  //! stay valid until the controller is reset if the command times out.
  //! Returns completion dword 0; throws `bam::error` on a failed status.
  std::uint32_t admin(nvme::command cmd, const dma_region* data = nullptr, std::size_t bytes = 0);

  //! Get Log Page into `buf` (`bytes`, a multiple of 4, at most one page here).
  void get_log_page(nvme::log_page_id lid, std::uint32_t nsid, const dma_region& buf, std::uint32_t bytes) {
    admin(nvme::make_get_log_page(lid, nsid, bytes, 0), &buf, bytes);
  }

private:
  struct queue_resources {
    nvme::queue_pair_ref ref;
    std::unique_ptr<dma_region> rings; // SQ at 0, CQ after it (page aligned)
    void* state = nullptr;
    bool created_cq = false;
    bool created_sq = false;
    bool granted = false; //!< a pair from transport::create_io_queue_pair (shared controller)
  };

  //! One host command in flight in `block_io`.
  struct inflight {
    std::uint32_t pool_entry;
    std::uint64_t ticket;
    nvme::command cmd;
    std::uint64_t lba;
    nvme::completion_record record; // several in flight: completions delivered here
  };

  //! Memory a timed-out command may still reach: kept until the controller is reset.
  struct quarantined {
    std::unique_ptr<inflight> command;
    std::unique_ptr<dma_region> buffer;
  };

  // bring-up and teardown (detail/controller_impl.hpp)
  void bring_up();
  void enable_with_admin_queue(std::uint32_t mqes);
  void identify_and_create_queues(std::uint32_t mqes);
  void identify_namespaces();
  queue_resources make_queue(std::uint16_t qid, std::uint32_t depth, std::uint64_t timeout_ns, bool on_device,
                             std::unique_ptr<dma_region> rings = nullptr);
  void check_contiguous(const dma_region& r, std::size_t offset, std::size_t bytes, std::uint16_t qid,
                        const char* which) const;
  void release_queues();
  template <class Pred>
  void wait_csts(Pred pred, bool enabling);
  void delete_io_queues();
  void shutdown();
  bool any_queue_broken() const;
  void reset_quietly() noexcept;
  [[noreturn]] void fail(const std::string& what) const;

  // commands (detail/controller_impl.hpp)
  //! An admin command with a driver-owned buffer: on a timeout the buffer is
  //! moved into quarantine (the caller's pointer becomes null) before the error is thrown.
  std::uint32_t admin_owned(nvme::command cmd, std::unique_ptr<dma_region>& data, std::size_t bytes);
  std::uint32_t admin_raw(nvme::command cmd, const dma_region* data, std::size_t bytes, bool& may_complete_late);
  void set_prps(nvme::command& cmd, const dma_region& buf, std::size_t offset, std::size_t bytes,
                std::uint64_t* const* list_virt, const std::uint64_t* list_bus, std::size_t list_pages);
  void check_range(std::uint32_t nsid, std::uint64_t lba, std::uint64_t nblocks) const;
  void check_queue_index(std::uint32_t i) const;
  const queue_resources& io_queue_res(std::uint32_t queue) const;
  error command_error(const std::string& what, std::uint16_t qid, const nvme::command& cmd, nvme::status st,
                      std::optional<std::uint64_t> lba) const;
  void run_io(std::uint32_t queue, nvme::command cmd, std::optional<std::uint64_t> lba,
              std::unique_ptr<dma_region>* owned = nullptr);
  void block_io(nvme::nvm_opcode op, std::uint32_t nsid, std::uint64_t lba, std::uint32_t nblocks,
                const dma_region& buf, std::size_t offset, std::uint32_t queue);
  void quarantine(quarantined q) {
    std::lock_guard<std::mutex> lock(quarantine_mutex_);
    quarantine_.push_back(std::move(q));
  }

  //! LBA data sizes (log2) a namespace may have to be used.
  static constexpr unsigned min_lba_shift = 9, max_lba_shift = 24;
  static std::size_t cq_offset(std::uint32_t depth) { return bam::transport::round_up(sizeof(nvme::command) * depth); }
  static std::size_t ring_bytes(std::uint32_t depth) {
    return cq_offset(depth) + bam::transport::round_up(sizeof(nvme::completion) * depth);
  }
  static void* host_state_alloc(std::size_t bytes);
  static std::string trim(const char* s, std::size_t n);

  std::shared_ptr<bam::transport> transport_;
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
  std::vector<quarantined> quarantine_; //!< timed out, may still complete
  bool host_state_ = true;              //!< I/O queue state in host memory (the default allocator)
  bool shared_ = false;                 //!< the transport's controller is up; its admin queue is not ours
  std::size_t max_transfer_ = 0;
  detail::prp_pool prp_;
};

} // namespace bam

#include <bam/driver/detail/controller_impl.hpp>
