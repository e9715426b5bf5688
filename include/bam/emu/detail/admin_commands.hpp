// SPDX-License-Identifier: MIT
//! The software controller's admin command set: identify, features, queue
//! creation and deletion, log pages, abort, asynchronous events. Member
//! functions of `emulated_controller`, included at the end of its header.
#pragma once

namespace bam::emu {

inline command_outcome emulated_controller::run_admin(const nvme::command& cmd) {
  using op = nvme::admin_opcode;
  command_outcome out;
  const nvme::command_flags flags{cmd.flags};
  if (flags.bits.fuse != 0 || flags.bits.psdt != 0) {
    out.status = detail::generic(nvme::generic_status::invalid_field);
    return out;
  }
  switch (static_cast<op>(cmd.opcode)) {
  case op::identify: out.status = identify(cmd); break;
  case op::set_features:
  case op::get_features: out.status = features(cmd, static_cast<op>(cmd.opcode) == op::set_features, out.dw0); break;
  case op::create_io_cq: out.status = create_cq(cmd); break;
  case op::create_io_sq: out.status = create_sq(cmd); break;
  case op::delete_io_sq: out.status = delete_sq(cmd); break;
  case op::delete_io_cq: out.status = delete_cq(cmd); break;
  case op::get_log_page: out.status = get_log_page(cmd); break;
  case op::abort: out.dw0 = 1; break; // bit 0 set: the command was not aborted
  case op::async_event_request: {
    // Held until an event occurs; this controller raises none.
    std::lock_guard lock(queues_mutex_);
    if (async_events_ >= detail::max_async_events) {
      out.status = detail::specific(detail::async_event_limit_exceeded);
    } else {
      ++async_events_;
      out.drop = true;
    }
    break;
  }
  default: out.status = detail::generic(nvme::generic_status::invalid_opcode); break;
  }
  return out;
}

inline nvme::status emulated_controller::identify(const nvme::command& cmd) {
  namespace generic_status = nvme::generic_status;
  alignas(8) unsigned char page[nvme::identify_data_size] = {};
  const nvme::identify_cdw10 d10{cmd.cdw10};
  switch (static_cast<nvme::identify_cns>(d10.bits.cns)) {
  case nvme::identify_cns::ns: {
    if (cmd.nsid == 0 || (cmd.nsid > ns_.size() && cmd.nsid != detail::nsid_broadcast))
      return detail::generic(generic_status::invalid_namespace);
    auto* id = reinterpret_cast<nvme_id_ns*>(page);
    if (cmd.nsid != detail::nsid_broadcast) {
      const ns_info& ns = ns_[cmd.nsid - 1];
      id->nsze = ns.blocks;
      id->ncap = ns.blocks;
      id->nuse = ns.blocks;
      id->lbaf[0].ds = static_cast<std::uint8_t>(ns.lba_shift);
    } else {
      id->lbaf[0].ds = 9; // capabilities common to all namespaces
    }
    id->nlbaf = 0;
    id->flbas = 0;
    id->dlfeat = detail::dlfeat_value;
    break;
  }
  case nvme::identify_cns::controller: {
    auto* id = reinterpret_cast<nvme_id_ctrl*>(page);
    id->vid = detail::emu_vendor_id;
    id->ssvid = detail::emu_vendor_id;
    detail::set_ascii(id->sn, sizeof id->sn, "BAMEMU-" + cfg_.name);
    detail::set_ascii(id->mn, sizeof id->mn, detail::emu_model);
    detail::set_ascii(id->fr, sizeof id->fr, detail::emu_firmware);
    id->mdts = cfg_.mdts;
    id->cntlid = 1;
    id->ver = detail::emu_version;
    id->cntrltype = detail::cntrltype_io;
    id->acl = detail::abort_limit - 1;
    id->aerl = detail::max_async_events - 1;
    id->frmw = detail::frmw_value;
    id->lpa = 0;
    id->elpe = detail::error_log_entries - 1;
    id->sqes = detail::sqes_value;
    id->cqes = detail::cqes_value;
    id->nn = static_cast<std::uint32_t>(ns_.size());
    id->oncs = NVME_CTRL_ONCS_DSM | NVME_CTRL_ONCS_WRITE_ZEROES;
    id->vwc = detail::vwc_value;
    const std::string nqn = "nqn.2024-01.org.bam:emu:" + cfg_.name;
    std::strncpy(id->subnqn, nqn.c_str(), sizeof id->subnqn - 1);
    break;
  }
  case nvme::identify_cns::active_ns_list: {
    if (cmd.nsid >= detail::nsid_broadcast - 1) return detail::generic(generic_status::invalid_namespace);
    auto* list = reinterpret_cast<std::uint32_t*>(page);
    std::size_t n = 0;
    for (std::uint32_t id = cmd.nsid + 1; id <= ns_.size() && n < detail::ns_list_entries; ++id)
      list[n++] = id;
    break;
  }
  default: return detail::generic(generic_status::invalid_field);
  }
  return copy_to_host(cmd, page, sizeof page);
}

inline nvme::status emulated_controller::features(const nvme::command& cmd, bool set, std::uint32_t& dw0) {
  using nvme::feature_id;
  const nvme::features_cdw10 d10{cmd.cdw10};
  if (!set && d10.bits.sel > 1) return detail::generic(nvme::generic_status::invalid_field); // current/default only
  switch (static_cast<feature_id>(d10.bits.fid)) {
  case feature_id::number_of_queues: {
    std::lock_guard lock(queues_mutex_);
    if (set) {
      const nvme::number_of_queues req{cmd.cdw11};
      const std::uint32_t nsqr = req.bits.nsq, ncqr = req.bits.ncq;
      if (nsqr > detail::num_queues_field_max || ncqr > detail::num_queues_field_max)
        return detail::generic(nvme::generic_status::invalid_field);
      const std::uint32_t cap = cfg_.max_io_queues - 1;
      allocated_queues_ = std::pair{std::min(nsqr, cap), std::min(ncqr, cap)};
    }
    const auto [nsqa, ncqa] = allocated_queues_.value_or(std::pair{cfg_.max_io_queues - 1, cfg_.max_io_queues - 1});
    nvme::number_of_queues got{};
    got.bits.nsq = nsqa;
    got.bits.ncq = ncqa;
    dw0 = got.raw;
    return nvme::status_success;
  }
  case feature_id::volatile_write_cache:
    if (set) write_cache_.store((cmd.cdw11 & 1u) != 0, std::memory_order_relaxed);
    dw0 = write_cache_.load(std::memory_order_relaxed) ? 1u : 0u;
    return nvme::status_success;
  default: return detail::generic(nvme::generic_status::invalid_field);
  }
}

//! Highest I/O queue id the host may create now (queues_mutex_ held).
inline std::uint32_t emulated_controller::queue_id_limit() const {
  return allocated_queues_ ? allocated_queues_->first + 1 : cfg_.max_io_queues;
}

inline nvme::status emulated_controller::create_cq(const nvme::command& cmd) {
  namespace css = nvme::command_specific_status;
  const nvme::create_queue_cdw10 d10{cmd.cdw10};
  const nvme::create_cq_cdw11 d11{cmd.cdw11};
  const std::uint32_t qid = d10.bits.qid;
  const std::uint32_t entries = d10.bits.qsize + 1u;
  std::lock_guard lock(queues_mutex_);
  const std::uint32_t limit = allocated_queues_ ? allocated_queues_->second + 1 : cfg_.max_io_queues;
  if (qid == 0 || qid > limit || cqs_[qid]) return detail::specific(css::invalid_queue_identifier);
  if (entries < 2 || entries > cfg_.max_queue_entries) return detail::specific(css::invalid_queue_size);
  if (d11.bits.pc == 0) return detail::generic(nvme::generic_status::invalid_field); // CAP.CQR
  if (cmd.prp1 % dma_page_size != 0) return detail::generic(nvme::generic_status::invalid_prp_offset);
  void* ring = dma_->translate(cmd.prp1, std::uint64_t{entries} * sizeof(nvme::completion));
  if (ring == nullptr) return detail::generic(nvme::generic_status::data_transfer_error);
  auto st = std::make_unique<cq_state>();
  st->ring = static_cast<nvme::completion*>(ring);
  st->depth = entries;
  st->head_doorbell = cq_doorbell_word(static_cast<std::uint16_t>(qid));
  st->cqid = static_cast<std::uint16_t>(qid);
  // A fresh queue: its doorbell starts at 0 whatever was written there before.
  std::atomic_ref<std::uint32_t>(*st->head_doorbell).store(0, std::memory_order_release);
  cqs_[qid] = io_cq{std::move(st), cmd.prp1, 0};
  return nvme::status_success;
}

inline nvme::status emulated_controller::create_sq(const nvme::command& cmd) {
  namespace css = nvme::command_specific_status;
  const nvme::create_queue_cdw10 d10{cmd.cdw10};
  const nvme::create_sq_cdw11 d11{cmd.cdw11};
  const std::uint32_t qid = d10.bits.qid;
  const std::uint32_t entries = d10.bits.qsize + 1u;
  const std::uint32_t cqid = d11.bits.cqid;
  queue_info q;
  {
    std::lock_guard lock(queues_mutex_);
    if (qid == 0 || qid > queue_id_limit() || sqs_[qid]) return detail::specific(css::invalid_queue_identifier);
    if (entries < 2 || entries > cfg_.max_queue_entries) return detail::specific(css::invalid_queue_size);
    if (d11.bits.pc == 0) return detail::generic(nvme::generic_status::invalid_field);
    if (cqid == 0 || cqid > cfg_.max_io_queues || !cqs_[cqid]) return detail::specific(css::invalid_completion_queue);
    if (cmd.prp1 % dma_page_size != 0) return detail::generic(nvme::generic_status::invalid_prp_offset);
    void* ring = dma_->translate(cmd.prp1, std::uint64_t{entries} * sizeof(nvme::command));
    if (ring == nullptr) return detail::generic(nvme::generic_status::data_transfer_error);
    sqs_[qid] = io_sq{static_cast<std::uint16_t>(cqid), entries};
    q.cq_sq_count = ++cqs_[cqid]->sq_users;
    q.qid = static_cast<std::uint16_t>(qid);
    q.sq = static_cast<nvme::command*>(ring);
    q.sq_depth = entries;
    q.sq_tail_doorbell = sq_doorbell_word(q.qid);
    q.cq = cqs_[cqid]->state.get();
    q.sq_bus = cmd.prp1;
    q.cq_bus = cqs_[cqid]->bus;
    std::atomic_ref<std::uint32_t>(*q.sq_tail_doorbell).store(0, std::memory_order_release);
  }
  q.process = [this, id = q.qid](const nvme::command& c) { return process(c, id); };
  q.target = &target_;
  const nvme::status st = io_engine_->queue_created(q);
  if (!st.ok()) {
    // The engine cannot serve this queue (the GPU engine serves one SQ per CQ): refuse it.
    std::lock_guard lock(queues_mutex_);
    --cqs_[cqid]->sq_users;
    sqs_[qid].reset();
  }
  return st;
}

inline nvme::status emulated_controller::delete_sq(const nvme::command& cmd) {
  const std::uint32_t qid = nvme::queue_id_cdw10{cmd.cdw10}.bits.qid;
  {
    std::lock_guard lock(queues_mutex_);
    if (qid == 0 || qid > cfg_.max_io_queues || !sqs_[qid])
      return detail::specific(nvme::command_specific_status::invalid_queue_identifier);
  }
  io_engine_->queue_deleted(static_cast<std::uint16_t>(qid));
  std::lock_guard lock(queues_mutex_);
  --cqs_[sqs_[qid]->cqid]->sq_users;
  sqs_[qid].reset();
  return nvme::status_success;
}

inline nvme::status emulated_controller::delete_cq(const nvme::command& cmd) {
  namespace css = nvme::command_specific_status;
  const std::uint32_t qid = nvme::queue_id_cdw10{cmd.cdw10}.bits.qid;
  std::lock_guard lock(queues_mutex_);
  if (qid == 0 || qid > cfg_.max_io_queues || !cqs_[qid]) return detail::specific(css::invalid_queue_identifier);
  if (cqs_[qid]->sq_users != 0) return detail::specific(css::invalid_queue_deletion);
  cqs_[qid].reset();
  return nvme::status_success;
}

inline nvme::status emulated_controller::get_log_page(const nvme::command& cmd) {
  const nvme::get_log_page_cdw10 d10{cmd.cdw10};
  const nvme::get_log_page_cdw11 d11{cmd.cdw11};
  const std::uint8_t lid = d10.bits.lid;
  const std::uint64_t numd = (d10.bits.numdl | (std::uint64_t{d11.bits.numdu} << 16)) + 1;
  const std::uint64_t bytes = numd * 4;
  const std::uint64_t offset = cmd.cdw12 | (std::uint64_t{cmd.cdw13} << 32);
  std::vector<unsigned char> log;
  switch (static_cast<nvme::log_page_id>(lid)) {
  case nvme::log_page_id::error_information: {
    log.assign(detail::error_log_entries * sizeof(nvme_error_log_page), 0);
    std::lock_guard lock(error_mutex_);
    std::size_t i = 0;
    for (auto it = error_log_.rbegin(); it != error_log_.rend(); ++it, ++i) // newest first
      std::memcpy(log.data() + i * sizeof(nvme_error_log_page), &*it, sizeof(nvme_error_log_page));
    break;
  }
  case nvme::log_page_id::smart_health: {
    log.assign(detail::health_log_size, 0);
    auto* s = reinterpret_cast<nvme_smart_log*>(log.data());
    const std::uint16_t t = detail::reported_temperature_k;
    std::memcpy(s->temperature, &t, sizeof t);
    s->avail_spare = 100;
    s->spare_thresh = 10;
    const controller_counters c = counters();
    constexpr std::uint64_t units_per_data_unit = 1000; // "thousands of 512 bytes", rounded up
    detail::set_u128(s->data_units_read, (c.data_units_read + units_per_data_unit - 1) / units_per_data_unit);
    detail::set_u128(s->data_units_written, (c.data_units_written + units_per_data_unit - 1) / units_per_data_unit);
    detail::set_u128(s->host_reads, c.host_reads);
    detail::set_u128(s->host_writes, c.host_writes);
    detail::set_u128(s->power_cycles, 1);
    constexpr std::uint64_t ns_per_hour = 3'600'000'000'000ull;
    detail::set_u128(s->power_on_hours, (bam::detail::now_ns() - started_ns_) / ns_per_hour);
    detail::set_u128(s->media_errors, c.media_errors);
    detail::set_u128(s->num_err_log_entries, c.error_log_entries);
    break;
  }
  case nvme::log_page_id::firmware_slot: {
    log.assign(detail::health_log_size, 0);
    auto* f = reinterpret_cast<nvme_firmware_slot*>(log.data());
    f->afi = 1; // slot 1 active
    detail::set_ascii(f->frs[0], sizeof f->frs[0], detail::emu_firmware);
    break;
  }
  default: return detail::specific(nvme::command_specific_status::invalid_log_page);
  }
  if (offset % 4 != 0 || offset >= log.size()) return detail::generic(nvme::generic_status::invalid_field);
  // NUMD reaches 16 GiB: a request past MDTS is refused, as for any data
  // transfer, and the part past the end of the log (zeroes) is written
  // straight into the host's pages, never staged here.
  if (cfg_.mdts != 0 && bytes > (std::uint64_t{dma_page_size} << cfg_.mdts))
    return detail::generic(nvme::generic_status::invalid_field);
  auto& segs = scratch_segments();
  const nvme::status st = prp_segments(cmd.prp1, cmd.prp2, bytes, segs);
  if (!st.ok()) return st;
  const unsigned char* src = log.data() + offset;
  std::uint64_t left = log.size() - offset; // log bytes still to copy
  for (const auto& s : segs) {
    const std::uint64_t n = std::min<std::uint64_t>(left, s.iov_len);
    std::memcpy(s.iov_base, src, n);
    std::memset(static_cast<unsigned char*>(s.iov_base) + n, 0, s.iov_len - n);
    src += n;
    left -= n;
  }
  return nvme::status_success;
}

inline void emulated_controller::log_error(const nvme::command& cmd, std::uint16_t qid, nvme::status st) {
  nvme_error_log_page e{};
  const std::uint64_t count = error_count_.fetch_add(1, std::memory_order_relaxed) + 1;
  e.error_count = count;
  e.sqid = qid;
  e.cmdid = cmd.cid;
  e.status_field = static_cast<std::uint16_t>(st.raw << 1);
  e.parm_error_location = 0xffff; // not reported
  e.lba = qid != 0 ? nvme::command_slba(cmd) : 0;
  e.nsid = cmd.nsid;
  std::lock_guard lock(error_mutex_);
  error_log_.push_back(e);
  if (error_log_.size() > detail::error_log_entries) error_log_.pop_front();
}

} // namespace bam::emu
