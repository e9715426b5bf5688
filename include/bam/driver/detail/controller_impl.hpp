// SPDX-License-Identifier: MIT
//! Implementation of `bam::controller` (driver/controller.hpp): the bring-up
//! state machine, queue placement, teardown, admin and block I/O.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace bam {

// ---- construction and teardown ---------------------------------------------

inline controller::controller(std::shared_ptr<bam::transport> t, controller_options opts)
    : transport_(std::move(t)), opts_(std::move(opts)) {
  if (!transport_) throw error("controller needs a transport");
  if (!opts_.ring_alloc) opts_.ring_alloc = [](bam::transport& tr, std::size_t bytes) { return tr.alloc(bytes); };
  if (static_cast<bool>(opts_.state_alloc) != static_cast<bool>(opts_.state_free))
    throw error("controller_options: state_alloc and state_free must be given together");
  host_state_ = !opts_.state_alloc;
  if (!opts_.state_alloc) {
    opts_.state_alloc = [](std::size_t bytes) { return host_state_alloc(bytes); };
    opts_.state_free = [](void* p) { std::free(p); };
  }
  const auto stop = [&] {
    // Stop the controller before its queue memory (and anything a timed-out
    // command may still reach) goes back to the allocator.
    reset_quietly();
    quarantine_.clear();
    release_queues();
  };
  try {
    bring_up();
  } catch (const error& e) {
    const controller_state at = state_;
    state_ = controller_state::failed;
    stop();
    if (std::string(e.what()).find("bring-up failed") != std::string::npos) throw;
    // A command failed: say in which state, keep what it said.
    throw error::wrap(std::string("controller bring-up failed in state '") + state_name(at) + "'", e);
  } catch (...) {
    state_ = controller_state::failed;
    stop();
    throw;
  }
}

inline controller::~controller() {
  bool stopped = false;
  try {
    if (state_ == controller_state::ready && !any_queue_broken()) {
      delete_io_queues();
      if (opts_.shutdown_on_destroy && !shared_) shutdown(); // a shared controller goes on for others
      stopped = true;
    }
  } catch (const std::exception& e) {
    warn("controller " + name_ + ": orderly teardown failed, resetting it instead: " + e.what());
  }
  // A queue with commands that never completed (or a failed teardown): reset
  // the controller so that nothing DMAs into memory freed below.
  if (!stopped) reset_quietly();
  quarantine_.clear(); // timed-out commands: the controller is stopped now
  release_queues();
}

inline const namespace_info& controller::ns(std::uint32_t nsid) const {
  for (const auto& n : namespaces_)
    if (n.nsid == nsid) return n;
  error_context c;
  c.controller = name_;
  throw error("no active namespace " + std::to_string(nsid), c);
}

// ---- bring-up ---------------------------------------------------------------

inline void controller::bring_up() {
  name_ = transport_->name();
  cap_.raw = transport_->read64(nvme::reg::cap);
  if (static_cast<std::uint32_t>(cap_.raw) == nvme::register_gone &&
      static_cast<std::uint32_t>(cap_.raw >> 32) == nvme::register_gone)
    fail("controller is not responding (CAP reads all ones)");
  if ((cap_.bits.css & 1u) == 0) fail("controller does not support the NVM command set");
  if (cap_.bits.mpsmin > 0) fail("controller needs memory pages larger than 4 KiB (CAP.MPSMIN)");
  // MQES is 0-based and at least 1: a queue holds two entries or more.
  if (cap_.bits.mqes == 0) fail("CAP.MQES is 0 (queues of one entry), which no NVMe controller may report");
  dstrd_ = static_cast<std::uint32_t>(cap_.bits.dstrd);
  // CAP.TO is the worst case for CSTS.RDY to change; 0 would mean no wait at all.
  state_timeout_ns_ = std::max<std::uint64_t>(cap_.bits.to, 1) * nvme::cap_timeout_unit_ms * 1'000'000ull;
  const std::uint32_t mqes = static_cast<std::uint32_t>(cap_.bits.mqes) + 1;
  // The controller is up and its admin queue someone else's (the kernel
  // module, shared by several processes): identify through it, then ask it
  // for I/O queue pairs.
  shared_ = transport_->admin_queue_owned_elsewhere();
  if (!shared_) enable_with_admin_queue(mqes);
  identify_and_create_queues(mqes);
}

inline void controller::enable_with_admin_queue(std::uint32_t mqes) {
  state_ = controller_state::disable;
  nvme::cc_register cc{transport_->read32(nvme::reg::cc)};
  if (cc.bits.en) {
    cc.bits.en = 0;
    transport_->write32(nvme::reg::cc, cc.raw);
  }
  state_ = controller_state::wait_not_ready;
  wait_csts([](nvme::csts_register s) { return s.bits.rdy == 0; }, false);

  state_ = controller_state::configure_admin_queue;
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
}

inline void controller::identify_and_create_queues(std::uint32_t mqes) {
  state_ = controller_state::identify_controller;
  {
    auto page = transport_->alloc(nvme::identify_data_size);
    admin_owned(nvme::make_identify(nvme::identify_cns::controller, 0, 0), page, nvme::identify_data_size);
    std::memcpy(&id_ctrl_, page->data(), sizeof id_ctrl_);
  }
  // MDTS is in units of the minimum memory page size; 0 means no limit.
  const std::size_t pool_limit = 2u << 20; // what the driver's PRP lists describe
  max_transfer_ = (id_ctrl_.mdts == 0 || id_ctrl_.mdts >= 20)
                      ? pool_limit
                      : std::min<std::size_t>(pool_limit, dma_page_size << id_ctrl_.mdts);
  prp_.setup(*transport_, max_transfer_);

  state_ = controller_state::identify_namespaces;
  identify_namespaces();

  state_ = controller_state::set_number_of_queues;
  std::uint32_t want = std::max<std::uint32_t>(opts_.io_queues, 1);
  want = std::min<std::uint32_t>(want, 65535);
  std::uint32_t nqueues = 0;
  if (shared_) {
    // What this process may still get; asking for one when none is left
    // brings the transport's error, which names the numbers.
    nqueues = std::max<std::uint32_t>(1, std::min(want, transport_->io_queue_pairs_available()));
  } else {
    const nvme::number_of_queues got{admin(nvme::make_set_num_queues(want, want))};
    nqueues = std::min({want, got.bits.nsq + 1u, got.bits.ncq + 1u});
  }

  state_ = controller_state::create_io_queues;
  io_depth_ = std::clamp<std::uint32_t>(opts_.queue_depth, 2, std::min(mqes, nvme::max_cids + 1));
  io_.reserve(nqueues);
  if (shared_) {
    for (std::uint32_t i = 0; i < nqueues; ++i) {
      const std::size_t bytes = ring_bytes(io_depth_);
      auto rings = opts_.ring_alloc(*transport_, bytes);
      std::uint16_t qid = 0;
      try {
        qid = transport_->create_io_queue_pair(*rings, 0, cq_offset(io_depth_), io_depth_);
      } catch (const error& e) {
        // Another process took the last ones since: go on with fewer.
        if (i > 0 && (e.errnum() == ENOSPC || e.errnum() == EDQUOT)) break;
        throw;
      }
      try {
        io_.push_back(make_queue(qid, io_depth_, opts_.io_timeout_ns, opts_.device_doorbells, std::move(rings)));
      } catch (...) {
        try {
          transport_->delete_io_queue_pair(qid);
        } catch (const std::exception& e) {
          warn("controller " + name_ + ": " + e.what());
        }
        throw;
      }
      io_.back().granted = true;
    }
    state_ = controller_state::ready;
    return;
  }
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

inline controller::queue_resources controller::make_queue(std::uint16_t qid, std::uint32_t depth,
                                                          std::uint64_t timeout_ns, bool on_device,
                                                          std::unique_ptr<dma_region> rings) {
  queue_resources q;
  const std::size_t bytes = ring_bytes(depth);
  if (rings)
    q.rings = std::move(rings);
  else
    q.rings = qid == 0 ? transport_->alloc(bytes) : opts_.ring_alloc(*transport_, bytes);
  // Queues are created physically contiguous (PC=1; CAP.CQR may demand it):
  // each ring must be one run of bus addresses.
  check_contiguous(*q.rings, 0, cq_offset(depth), qid, "submission");
  check_contiguous(*q.rings, cq_offset(depth), bytes - cq_offset(depth), qid, "completion");
  auto& r = q.ref;
  r.sq = q.rings->as<nvme::command>();
  r.cq = reinterpret_cast<nvme::completion*>(q.rings->as<unsigned char>() + cq_offset(depth));
  r.sq_depth = depth;
  r.cq_depth = depth;
  r.qid = qid;
  r.timeout_ns = timeout_ns;
  // Completions written into GPU memory are seen by GPU threads at device
  // scope; in host memory the consumer needs system scope.
  r.cq_scope = q.rings->kind() == memory_kind::device ? nvme::memory_scope::device : nvme::memory_scope::system;
  r.sq_head_exact = transport_->exact_sq_head();
  r.controller_run_ns = transport_->controller_run_ns(qid);
  const auto sq_db = nvme::sq_doorbell_offset(qid, dstrd_);
  const auto cq_db = nvme::cq_doorbell_offset(qid, dstrd_);
  if (on_device) {
    r.sq_doorbell = transport_->device_doorbell(sq_db);
    r.cq_doorbell = transport_->device_doorbell(cq_db);
    r.doorbell_scope = transport_->device_doorbell_scope();
    if (r.sq_doorbell == nullptr || r.cq_doorbell == nullptr) {
      error_context c;
      c.controller = name_;
      throw error("this transport gives GPU threads no doorbells (device_doorbells requested)", c);
    }
  } else {
    r.sq_doorbell = transport_->doorbell(sq_db);
    r.cq_doorbell = transport_->doorbell(cq_db);
    r.doorbell_scope = nvme::memory_scope::system;
  }
  // Last, once nothing above can throw (a doorbell outside the BAR does):
  // `q` does not free its state block on its own.
  const std::size_t state_bytes = nvme::queue_state_bytes(depth);
  q.state = qid == 0 ? host_state_alloc(state_bytes) : opts_.state_alloc(state_bytes);
  if (q.state == nullptr) throw_errno("allocating queue state", ENOMEM, name_);
  // The state block may be device memory: compute pointers without touching it.
  r.attach_state(q.state);
  return q;
}

inline void controller::check_contiguous(const dma_region& r, std::size_t offset, std::size_t bytes, std::uint16_t qid,
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
                      "bam::transport::alloc or a ring_alloc that returns contiguous memory",
                  c);
    }
  }
}

inline void controller::release_queues() {
  auto release = [&](queue_resources& q, bool admin_queue) {
    if (q.state != nullptr) {
      if (admin_queue)
        std::free(q.state);
      else
        opts_.state_free(q.state);
      q.state = nullptr;
    }
    q.rings.reset();
  };
  for (auto& q : io_)
    release(q, false);
  io_.clear();
  release(admin_, true);
  prp_.reset();
}

template <class Pred>
inline void controller::wait_csts(Pred pred, bool enabling) {
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

inline void controller::identify_namespaces() {
  auto page = transport_->alloc(nvme::identify_data_size);
  std::vector<std::uint32_t> ids;
  try {
    admin_owned(nvme::make_identify(nvme::identify_cns::active_ns_list, 0, 0), page, nvme::identify_data_size);
    const auto* list = page->as<std::uint32_t>();
    // The list is in increasing order; an id that is not (a repeat) would
    // give one NSID two geometries: it ends the list.
    for (std::size_t i = 0; i < nvme::identify_data_size / 4 && list[i] != 0; ++i) {
      if (!ids.empty() && list[i] <= ids.back()) {
        warn("controller " + name_ + ": active namespace list not in increasing order (" + std::to_string(list[i]) +
             " after " + std::to_string(ids.back()) + "): the rest of it is not used");
        break;
      }
      ids.push_back(list[i]);
    }
  } catch (const error& e) {
    // NVMe 1.0 controllers lack CNS 2 (Invalid Field): every NSID up to NN
    // is a candidate. Any other failure is reported as it is.
    const auto st = e.status();
    const bool unsupported =
        st && st->sct() == nvme::status_type::generic &&
        (st->sc() == nvme::generic_status::invalid_field || st->sc() == nvme::generic_status::invalid_opcode);
    if (!unsupported) throw;
    for (std::uint32_t n = 1; n <= id_ctrl_.nn && n <= 1024; ++n)
      ids.push_back(n);
  }
  for (std::uint32_t nsid : ids) {
    std::memset(page->data(), 0, nvme::identify_data_size);
    admin_owned(nvme::make_identify(nvme::identify_cns::ns, nsid, 0), page, nvme::identify_data_size);
    namespace_info info;
    std::memcpy(&info.id, page->data(), sizeof info.id);
    if (info.id.nsze == 0) continue; // inactive
    info.nsid = nsid;
    info.blocks = info.id.nsze;
    // FLBAS bits 3:0 and, with more than 16 formats, bits 6:5 as the upper bits.
    const unsigned fmt = (info.id.flbas & 0xfu) | (((info.id.flbas >> 5) & 0x3u) << 4);
    const unsigned lbads = info.id.lbaf[fmt].ds;
    // LBADS is at least 9 (512 B) by the spec; beyond 2^24 nothing here could buffer a block.
    if (lbads < min_lba_shift || lbads > max_lba_shift) {
      warn("controller " + name_ + ": namespace " + std::to_string(nsid) + " reports LBA data size 2^" +
           std::to_string(lbads) + " (format " + std::to_string(fmt) + "), outside 2^" + std::to_string(min_lba_shift) +
           "..2^" + std::to_string(max_lba_shift) + ": namespace not used");
      continue;
    }
    info.lba_size = 1u << lbads;
    namespaces_.push_back(info);
  }
}

inline void controller::delete_io_queues() {
  for (auto it = io_.rbegin(); it != io_.rend(); ++it) {
    if (it->granted) transport_->delete_io_queue_pair(it->ref.qid);
    it->granted = false;
    if (it->created_sq) admin(nvme::make_delete_io_sq(it->ref.qid));
    it->created_sq = false;
    if (it->created_cq) admin(nvme::make_delete_io_cq(it->ref.qid));
    it->created_cq = false;
  }
}

inline void controller::shutdown() {
  nvme::cc_register cc{transport_->read32(nvme::reg::cc)};
  cc.bits.shn = static_cast<std::uint32_t>(nvme::shutdown_notification::normal);
  transport_->write32(nvme::reg::cc, cc.raw);
  // RTD3E (microseconds) is the controller's own shutdown latency; never
  // less than CAP.TO or a few seconds.
  const std::uint64_t min_shutdown_ns = 5'000'000'000ull;
  const std::uint64_t timeout_ns =
      std::max({static_cast<std::uint64_t>(id_ctrl_.rtd3e) * 1000, state_timeout_ns_, min_shutdown_ns});
  const std::uint64_t deadline = detail::now_ns() + timeout_ns;
  for (;;) {
    nvme::csts_register s{transport_->read32(nvme::reg::csts)};
    if (s.raw == nvme::register_gone) return;
    if (s.bits.shst == static_cast<std::uint32_t>(nvme::shutdown_status::complete)) return;
    if (detail::now_ns() > deadline) {
      warn("controller " + name_ + " did not complete shutdown within " + std::to_string(timeout_ns / 1'000'000) +
           " ms (CSTS.SHST)");
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

inline bool controller::any_queue_broken() const {
  if (admin_.state != nullptr && admin_.ref.broken()) return true;
  if (!host_state_) return false; // state placed by the caller (GPU memory): not readable here
  for (const auto& q : io_)
    if (q.state != nullptr && q.ref.broken()) return true;
  return false;
}

//! CC.EN=0 and wait (bounded by CAP.TO) for CSTS.RDY=0: the controller stops
//! all DMA and forgets its queues. On a shared controller, this process's
//! queue pairs are deleted instead (whoever owns the admin queue resets the
//! controller if that fails). Never throws.
inline void controller::reset_quietly() noexcept {
  if (shared_) {
    for (auto& q : io_) {
      if (!q.granted) continue;
      try {
        transport_->delete_io_queue_pair(q.ref.qid);
      } catch (const std::exception& e) {
        warn("controller " + name_ + ": " + e.what());
      }
      q.granted = false;
    }
    return;
  }
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
        warn("controller " + name_ + " did not stop (CSTS.RDY=1 after CC.EN=0)");
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  } catch (const std::exception& e) {
    warn("controller " + name_ + ": reset failed: " + e.what());
  }
}

inline void controller::fail(const std::string& what) const {
  error_context c;
  c.controller = name_;
  throw error("controller bring-up failed in state '" + std::string(state_name(state_)) + "': " + what, c);
}

inline void* controller::host_state_alloc(std::size_t bytes) {
  constexpr std::size_t align = nvme::queue_state_alignment;
  void* p = std::aligned_alloc(align, (bytes + align - 1) / align * align);
  if (p != nullptr) std::memset(p, 0, bytes);
  return p;
}

inline std::string controller::trim(const char* s, std::size_t n) {
  std::string out(s, strnlen(s, n));
  while (!out.empty() && (out.back() == ' ' || out.back() == '\0'))
    out.pop_back();
  return out;
}

// ---- commands ---------------------------------------------------------------

inline std::uint32_t controller::admin_raw(nvme::command cmd, const dma_region* data, std::size_t bytes,
                                           bool& may_complete_late) {
  may_complete_late = false;
  if (shared_) {
    // The admin queue's owner moves the data through its own buffer.
    if (data != nullptr && data->kind() != memory_kind::host) {
      error_context c;
      c.controller = name_;
      c.errnum = EINVAL;
      throw error("admin command data must be host memory on a shared controller", c);
    }
    std::uint32_t dw0 = 0;
    const nvme::status st = transport_->admin_passthrough(
        cmd, data != nullptr ? data->data() : nullptr, data != nullptr ? (bytes != 0 ? bytes : data->size()) : 0, dw0);
    if (!st.ok()) throw command_error("admin command failed", 0, cmd, st, std::nullopt);
    return dw0;
  }
  if (data != nullptr) {
    if (bytes == 0) bytes = data->size();
    set_prps(cmd, *data, 0, bytes, nullptr, nullptr, 0);
  }
  const nvme::queue_pair_ref& q = admin_.ref;
  std::uint64_t ticket = 0;
  nvme::status st = q.submit(cmd, ticket);
  std::uint32_t dw0 = 0;
  if (st.ok()) {
    cmd.cid = q.cid_of(ticket);
    st = q.wait(ticket, &dw0);
    // Submitted but not completed: the controller may still transfer data.
    may_complete_late = st == nvme::status_timeout || st == nvme::status_queue_broken;
  }
  if (!st.ok()) throw command_error("admin command failed", 0, cmd, st, std::nullopt);
  return dw0;
}

inline std::uint32_t controller::admin(nvme::command cmd, const dma_region* data, std::size_t bytes) {
  bool late = false;
  return admin_raw(cmd, data, bytes, late);
}

inline std::uint32_t controller::admin_owned(nvme::command cmd, std::unique_ptr<dma_region>& data, std::size_t bytes) {
  bool late = false;
  try {
    return admin_raw(cmd, data.get(), bytes, late);
  } catch (...) {
    // The buffer must outlive a command that may still complete: keep it
    // until the controller is reset (the caller's pointer becomes null).
    if (late) quarantine({nullptr, std::move(data)});
    throw;
  }
}

inline void controller::write_zeroes(std::uint32_t nsid, std::uint64_t lba, std::uint32_t nblocks,
                                     std::uint32_t queue) {
  check_range(nsid, lba, nblocks);
  const std::uint32_t max_blocks = 65536; // NLB is 16 bits
  for (std::uint64_t done = 0; done < nblocks;) {
    const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(nblocks - done, max_blocks));
    run_io(queue, nvme::make_write_zeroes(nsid, lba + done, n), lba + done);
    done += n;
  }
}

inline void controller::deallocate(std::uint32_t nsid, std::uint64_t lba, std::uint32_t nblocks, std::uint32_t queue) {
  check_range(nsid, lba, nblocks);
  auto range = transport_->alloc(dma_page_size);
  auto* r = range->as<nvme::dsm_range>();
  r->attributes = 0;
  r->nblocks = nblocks;
  r->slba = lba;
  run_io(queue, nvme::make_dsm_deallocate(nsid, 1, range->bus_address(0)), lba, &range);
}

inline void controller::set_prps(nvme::command& cmd, const dma_region& buf, std::size_t offset, std::size_t bytes,
                                 std::uint64_t* const* list_virt, const std::uint64_t* list_bus,
                                 std::size_t list_pages) {
  if (offset + bytes > buf.size()) {
    error_context c;
    c.controller = name_;
    c.errnum = ERANGE;
    throw error("transfer of " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) + " overruns a " +
                    std::to_string(buf.size()) + "-byte buffer",
                c);
  }
  nvme::prp_pair prp;
  if (!nvme::build_prp(buf.page_bus().data(), offset, bytes, dma_page_size, list_virt, list_bus, list_pages, prp)) {
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

inline void controller::check_range(std::uint32_t nsid, std::uint64_t lba, std::uint64_t nblocks) const {
  const auto& n = ns(nsid);
  if (nblocks == 0 || lba >= n.blocks || nblocks > n.blocks - lba) {
    error_context c;
    c.controller = name_;
    c.lba = lba;
    c.status = nvme::status_out_of_range;
    throw error("block range [" + std::to_string(lba) + ", +" + std::to_string(nblocks) + ") outside namespace " +
                    std::to_string(nsid) + " of " + std::to_string(n.blocks) + " blocks",
                c);
  }
}

inline void controller::check_queue_index(std::uint32_t i) const {
  if (i >= io_.size()) {
    error_context c;
    c.controller = name_;
    throw error("I/O queue index " + std::to_string(i) + " out of range (" + std::to_string(io_.size()) + " queues)",
                c);
  }
}

inline const controller::queue_resources& controller::io_queue_res(std::uint32_t queue) const {
  check_queue_index(queue);
  if (opts_.device_doorbells) {
    error_context c;
    c.controller = name_;
    c.queue = static_cast<std::uint16_t>(queue + 1);
    throw error("host I/O on queues placed for GPU submitters", c);
  }
  return io_[queue];
}

inline error controller::command_error(const std::string& what, std::uint16_t qid, const nvme::command& cmd,
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

inline void controller::run_io(std::uint32_t queue, nvme::command cmd, std::optional<std::uint64_t> lba,
                               std::unique_ptr<dma_region>* owned) {
  const auto& q = io_queue_res(queue);
  std::uint64_t ticket = 0;
  nvme::status st = q.ref.submit(cmd, ticket);
  if (st.ok()) {
    cmd.cid = q.ref.cid_of(ticket);
    st = q.ref.wait(ticket);
    if ((st == nvme::status_timeout || st == nvme::status_queue_broken) && owned != nullptr)
      quarantine({nullptr, std::move(*owned)}); // the controller may still read it
  }
  if (!st.ok()) throw command_error("I/O command failed", q.ref.qid, cmd, st, lba);
}

inline void controller::block_io(nvme::nvm_opcode op, std::uint32_t nsid, std::uint64_t lba, std::uint32_t nblocks,
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
    throw error("buffer of " + std::to_string(buf.size()) + " bytes cannot take " + std::to_string(total) +
                    " bytes at offset " + std::to_string(offset) + " (dword-aligned offset required)",
                c);
  }
  const std::uint32_t max_blocks = static_cast<std::uint32_t>(std::min<std::uint64_t>(max_transfer_ / lba_size, 65536));
  const char* what = op == nvme::nvm_opcode::read ? "read failed" : "write failed";
  // Keep a few chunks in flight per call; each holds one PRP pool entry.
  constexpr std::size_t window = 8;
  std::vector<std::unique_ptr<inflight>> pending;
  std::optional<error> first_error;
  auto finish_one = [&]() {
    std::unique_ptr<inflight> f = std::move(pending.front());
    pending.erase(pending.begin());
    const nvme::status st = q.ref.wait(f->ticket, f->record);
    if (st == nvme::status_timeout || st == nvme::status_queue_broken) {
      // The command may still complete: its record and PRP lists stay
      // reserved until the controller is reset, never reused before.
      if (!first_error) first_error.emplace(command_error(what, q.ref.qid, f->cmd, st, f->lba));
      quarantine({std::move(f), nullptr});
      return;
    }
    prp_.release(f->pool_entry);
    if (!st.ok() && !first_error) first_error.emplace(command_error(what, q.ref.qid, f->cmd, st, f->lba));
  };
  for (std::uint64_t done = 0; done < nblocks && !first_error;) {
    const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(nblocks - done, max_blocks));
    if (pending.size() == window) finish_one();
    // Never block on the shared pool while holding entries: give ours back first.
    std::optional<std::uint32_t> got = prp_.try_acquire();
    while (!got && !pending.empty()) {
      finish_one();
      got = prp_.try_acquire();
    }
    if (first_error) break;
    const std::uint32_t entry = got ? *got : prp_.acquire(q.ref.timeout_ns, name_);
    std::uint64_t* list_virt[detail::prp_pool::max_pages_per_entry];
    std::uint64_t list_bus[detail::prp_pool::max_pages_per_entry];
    const std::size_t lp = prp_.pages_per_entry();
    for (std::size_t i = 0; i < lp; ++i) {
      list_virt[i] = prp_.page(entry, i);
      list_bus[i] = prp_.page_bus(entry, i);
    }
    nvme::command cmd = nvme::make_rw(op, nsid, lba + done, n, 0, 0);
    try {
      set_prps(cmd, buf, offset + done * lba_size, static_cast<std::size_t>(n) * lba_size, list_virt, list_bus, lp);
    } catch (...) {
      prp_.release(entry);
      while (!pending.empty())
        finish_one();
      throw;
    }
    auto f = std::make_unique<inflight>();
    f->pool_entry = entry;
    f->lba = lba + done;
    const nvme::status st = q.ref.submit(cmd, f->ticket, &f->record);
    cmd.cid = q.ref.cid_of(f->ticket);
    f->cmd = cmd;
    if (!st.ok()) {
      prp_.release(entry);
      first_error.emplace(command_error("submission failed", q.ref.qid, cmd, st, lba + done));
      break;
    }
    pending.push_back(std::move(f));
    done += n;
  }
  while (!pending.empty())
    finish_one();
  if (first_error) throw *first_error;
}

} // namespace bam
