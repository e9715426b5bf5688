// SPDX-License-Identifier: MIT
// libFuzzer target: the host driver (bam::controller) against a hostile
// controller. The controller here is a transport whose registers and
// answers come from the input: CAP, CSTS and shutdown status during
// bring-up, identify data (MDTS, namespace count, sizes, LBA formats), the
// Number of Queues answer, and for every command fetched a completion that
// may carry a wrong command id, SQ id, phase, status or SQ head, come twice,
// come late, or never come. Some inputs make it a shared controller, as
// the kernel module presents one: already up, admin commands answered
// through the transport (any status, any data), I/O queue pairs granted
// with any queue id or refused, and any count of them said to be left.
//
// What must hold: no crash or sanitizer report; no wait without end (every
// driver call returns); every failure is a bam::error; a call that reports
// success had, for each command it sent, a completion with that command's
// id posted after the command was fetched (never a stale or
// spurious one; unless the controller made up an SQ head, after which no
// driver can tell); the PRPs of every read and write describe mapped memory.
#include <bam/driver/controller.hpp>
#include <bam/nvme/prp.hpp>

#include <fuzzer/FuzzedDataProvider.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace {

using namespace bam;
constexpr std::size_t page = dma_page_size;
constexpr std::uint32_t regs_bytes = 64 * 1024; // BAR0: registers and doorbells
constexpr std::uint64_t call_limit_ns = 20'000'000'000ull;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "hostile controller fuzz: %s\n", what.c_str());
  std::abort();
}

//! A stream of choices from part of the input; zeroes once it is used up.
struct script {
  std::vector<std::uint8_t> bytes;
  std::size_t pos = 0;
  std::uint8_t u8() { return pos < bytes.size() ? bytes[pos++] : 0; }
  std::uint32_t u32() {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i)
      v |= std::uint32_t{u8()} << (8 * i);
    return v;
  }
  std::uint64_t u64() { return u32() | (std::uint64_t{u32()} << 32); }
};

//! The controller's view of memory, as through an IOMMU: bus addresses of
//! mapped regions only, and an access holds the table so that a region
//! cannot be unmapped (and its memory freed) in the middle of it.
class fake_iommu : public std::enable_shared_from_this<fake_iommu> {
public:
  std::uint64_t add(void* p, std::size_t n) {
    std::lock_guard lock(m_);
    const std::uint64_t bus = next_;
    next_ += n + page;
    regions_[bus] = {static_cast<unsigned char*>(p), n};
    return bus;
  }
  void remove(std::uint64_t bus) {
    std::lock_guard lock(m_);
    regions_.erase(bus);
  }
  //! Run fn(pointer) on [bus, bus + n) if one mapped region holds it all.
  template <class Fn>
  bool access(std::uint64_t bus, std::uint64_t n, Fn&& fn) {
    std::lock_guard lock(m_);
    auto it = regions_.upper_bound(bus);
    if (it == regions_.begin()) return false;
    --it;
    if (bus - it->first >= it->second.second || n > it->second.second - (bus - it->first)) return false;
    fn(it->second.first + (bus - it->first));
    return true;
  }

private:
  std::mutex m_;
  std::map<std::uint64_t, std::pair<unsigned char*, std::uint64_t>> regions_;
  std::uint64_t next_ = 0x7700'0000'0000ull;
};

class iommu_region final : public dma_region {
public:
  iommu_region(std::shared_ptr<fake_iommu> t, void* p, std::size_t n, memory_kind k, std::uint64_t bus)
      : dma_region(p, n, k, pages(bus, n)), t_(std::move(t)), bus_(bus) {}
  ~iommu_region() override { t_->remove(bus_); }

private:
  static std::vector<std::uint64_t> pages(std::uint64_t bus, std::size_t n) {
    std::vector<std::uint64_t> v(n / page);
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = bus + i * page;
    return v;
  }
  std::shared_ptr<fake_iommu> t_;
  std::uint64_t bus_;
};

class hostile_controller final : public transport {
public:
  hostile_controller(script regs, script answers)
      : regs_script_(std::move(regs)), answers_(std::move(answers)), dma_(std::make_shared<fake_iommu>()) {
    regs_.assign(regs_bytes / 4, 0);
    // CAP: sane most of the time, anything at all otherwise.
    nvme::cap_register cap{};
    const std::uint8_t mode = regs_script_.u8();
    if (mode % 4 == 0) {
      cap.raw = regs_script_.u64();
    } else {
      cap.bits.mqes = regs_script_.u8() % 64; // 1..64 entries (0 is invalid, on purpose)
      cap.bits.cqr = 1;
      cap.bits.to = regs_script_.u8() % 2;
      cap.bits.dstrd = regs_script_.u8() % 3;
      cap.bits.css = 1;
      cap.bits.mpsmin = (mode % 16 == 1) ? 1 : 0;
    }
    cap_ = cap.raw;
    ready_after_ = regs_script_.u8() % 8;
    never_ready_ = regs_script_.u8() == 0xa5;
    fatal_ = regs_script_.u8() == 0x5a;
    gone_ = regs_script_.u8() == 0x3c;
    shared_ = regs_script_.u8() % 3 == 0;
    if (shared_) enabled_ = true; // up before the driver came
    device_ = std::thread([this] { serve(); });
  }
  ~hostile_controller() override {
    stop_.store(true);
    device_.join();
  }

  std::string name() const override { return "hostile"; }

  std::uint32_t read32(std::uint32_t off) override {
    check(off);
    std::lock_guard lock(mutex_);
    if (gone_) return nvme::register_gone;
    switch (off) {
    case nvme::reg::cap: return static_cast<std::uint32_t>(cap_);
    case nvme::reg::cap + 4: return static_cast<std::uint32_t>(cap_ >> 32);
    case nvme::reg::csts: {
      nvme::csts_register s{};
      ++csts_reads_;
      if (enabled_ && !never_ready_ && csts_reads_ > ready_after_) s.bits.rdy = 1;
      if (enabled_ && fatal_) s.bits.cfs = 1;
      if (shutdown_ && csts_reads_ > ready_after_) s.bits.shst = 2;
      if (regs_script_.u8() == 0xee) s.raw = regs_script_.u32(); // now and then, anything
      return s.raw;
    }
    default: return std::atomic_ref<std::uint32_t>(regs_[off / 4]).load();
    }
  }
  void write32(std::uint32_t off, std::uint32_t v) override {
    check(off);
    std::lock_guard lock(mutex_);
    std::atomic_ref<std::uint32_t>(regs_[off / 4]).store(v);
    if (off == nvme::reg::cc) {
      const nvme::cc_register cc{v};
      if (cc.bits.en && !enabled_) {
        const nvme::aqa_register aqa{std::atomic_ref<std::uint32_t>(regs_[nvme::reg::aqa / 4]).load()};
        const std::uint64_t asq = regs_[nvme::reg::asq / 4] | (std::uint64_t{regs_[nvme::reg::asq / 4 + 1]} << 32);
        const std::uint64_t acq = regs_[nvme::reg::acq / 4] | (std::uint64_t{regs_[nvme::reg::acq / 4 + 1]} << 32);
        std::lock_guard q(queues_mutex_);
        queues_.clear();
        add_queue_locked(0, asq, aqa.bits.asqs + 1u, acq, aqa.bits.acqs + 1u);
      }
      if (!cc.bits.en && enabled_) {
        std::lock_guard q(queues_mutex_);
        queues_.clear(); // reset: the controller forgets its queues and stops all DMA
      }
      enabled_ = cc.bits.en;
      shutdown_ = cc.bits.shn != 0;
      csts_reads_ = 0;
    }
  }
  volatile std::uint32_t* doorbell(std::uint32_t off) override {
    check(off);
    return &regs_[off / 4];
  }
  std::unique_ptr<dma_region> map(void* ptr, std::size_t size, memory_kind kind) override {
    check_map_args(ptr, size, kind);
    return std::make_unique<iommu_region>(dma_, ptr, size, kind, dma_->add(ptr, size));
  }

  // ---- a shared controller: the admin queue is the transport's --------------
  bool admin_queue_owned_elsewhere() const override { return shared_; }
  std::uint32_t io_queue_pairs_available() override {
    std::lock_guard q(queues_mutex_);
    return answers_.u8() % 8 == 0 ? answers_.u32() : answers_.u8() % 4;
  }
  std::uint16_t create_io_queue_pair(const dma_region& rings, std::size_t sq_offset, std::size_t cq_offset,
                                     std::uint32_t depth) override {
    std::lock_guard q(queues_mutex_);
    const std::uint8_t act = answers_.u8();
    if (act % 8 == 1) {
      error_context c;
      c.errnum = act % 16 == 1 ? ENOSPC : EDQUOT;
      throw error("no I/O queue pair left (hostile)", c);
    }
    // Any id now and then, even one already given out or one whose doorbells lie outside BAR0.
    const std::uint16_t qid = act % 8 == 2 ? static_cast<std::uint16_t>(answers_.u32()) : ++granted_;
    add_queue_locked(qid, rings.bus_address(sq_offset), depth, rings.bus_address(cq_offset), depth);
    return qid;
  }
  void delete_io_queue_pair(std::uint16_t qid) override {
    std::lock_guard q(queues_mutex_);
    for (auto& x : queues_)
      if (x.qid == qid) x.sq_depth = 0; // no longer served
    if (answers_.u8() % 8 == 1) throw error("delete refused (hostile)");
  }
  nvme::status admin_passthrough(const nvme::command& cmd, void* data, std::size_t bytes, std::uint32_t& dw0) override {
    std::lock_guard q(queues_mutex_);
    dw0 = 0;
    std::vector<unsigned char> out;
    admin_answer(cmd, dw0, out);
    if (data != nullptr && !out.empty()) std::memcpy(data, out.data(), std::min(bytes, out.size()));
    const std::uint8_t act = answers_.u8();
    if (act % 16 == 1) throw error("passthrough timed out (hostile)");
    return nvme::status{static_cast<std::uint16_t>(act % 16 == 2 ? answers_.u32() & 0x7fff : 0)};
  }

  // ---- what the oracle reads ----------------------------------------------
  struct fetched {
    std::uint16_t qid, cid;
    std::uint8_t opcode;
    std::uint64_t seq;     //!< when it was fetched
    bool answered = false; //!< a completion with its id was posted after the fetch
  };
  void begin_call() {
    std::lock_guard q(queues_mutex_);
    calls_.clear();
    recording_ = true;
  }
  //! What was fetched during the call, once everything rung so far has been
  //! fetched (or after a while): a command the driver considered done before
  //! the controller even read it shows up as never answered.
  std::vector<fetched> end_call() {
    const std::uint64_t until = bam::detail::now_ns() + 200'000'000;
    for (;;) {
      {
        std::lock_guard q(queues_mutex_);
        bool all = true;
        for (const auto& x : queues_) {
          if (x.sq_depth == 0) continue;
          const std::uint32_t tail =
              std::atomic_ref<std::uint32_t>(regs_[nvme::sq_doorbell_offset(x.qid, dstrd()) / 4]).load();
          all = all && (tail >= x.sq_depth || x.head == tail);
        }
        if (all || bam::detail::now_ns() > until) {
          recording_ = false;
          return calls_;
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  //! True once a completion reported a made-up SQ head: a driver can then no
  //! longer tell a stray completion from a real one, and the "answered after
  //! it was fetched" check no longer applies.
  bool head_lied() {
    std::lock_guard q(queues_mutex_);
    return head_lied_;
  }
  std::string prp_error() {
    std::lock_guard q(queues_mutex_);
    return prp_error_;
  }

private:
  struct queue {
    std::uint16_t qid;
    std::uint64_t sq; // bus addresses: every access goes through the IOMMU
    std::uint32_t sq_depth;
    std::uint64_t cq;
    std::uint32_t cq_depth;
    std::uint32_t head = 0;    // next SQ entry to fetch
    std::uint64_t cq_tail = 0; // completions posted, virtual
  };
  struct late {
    std::size_t queue;
    std::uint16_t cid;
    std::uint16_t status;
    std::uint32_t dw0;
    int after; // passes to wait
  };

  void check(std::uint32_t off) const {
    if (off % 4 != 0 || off >= regs_bytes) {
      error_context c;
      c.controller = "hostile";
      c.errnum = EINVAL;
      throw error("register offset " + std::to_string(off) + " outside BAR0", c);
    }
  }

  void add_queue_locked(std::uint16_t qid, std::uint64_t sq_bus, std::uint32_t sq_depth, std::uint64_t cq_bus,
                        std::uint32_t cq_depth) {
    if (sq_depth < 2 || cq_depth < 2) return;                            // not served
    if (nvme::cq_doorbell_offset(qid, dstrd()) + 4 > regs_bytes) return; // no doorbells to ring: never served
    queues_.push_back({qid, sq_bus, sq_depth, cq_bus, cq_depth});
  }

  void post(queue& q, std::uint16_t cid, std::uint16_t status, std::uint32_t dw0, bool honest) {
    std::uint8_t how = honest ? 0 : answers_.u8();
    nvme::completion e{};
    e.dw0 = dw0;
    e.sq_head = static_cast<std::uint16_t>(q.head);
    e.sq_id = q.qid;
    std::uint32_t phase = ((q.cq_tail / q.cq_depth) & 1) ? 0u : 1u;
    switch (how % 8) {
    case 1: cid = static_cast<std::uint16_t>(answers_.u32()); break;     // wrong command id
    case 2: e.sq_id = static_cast<std::uint16_t>(answers_.u32()); break; // wrong SQ id
    case 3: phase ^= 1; break;                                           // wrong phase
    case 4: // wrong SQ head: from now on the driver's idea of what was fetched may be wrong
      e.sq_head = static_cast<std::uint16_t>(answers_.u32());
      head_lied_ = head_lied_ || e.sq_head < q.sq_depth; // one outside the queue is plainly wrong
      break;
    case 5: status = static_cast<std::uint16_t>(answers_.u32()); break; // any status
    default: break;
    }
    const std::uint64_t slot = q.cq + (q.cq_tail % q.cq_depth) * sizeof(nvme::completion);
    dma_->access(slot, sizeof(nvme::completion), [&](unsigned char* p) {
      auto* words = reinterpret_cast<std::uint32_t*>(p);
      words[0] = e.dw0;
      words[1] = 0;
      words[2] = reinterpret_cast<const std::uint32_t*>(&e)[2];
      std::atomic_ref<std::uint32_t>(words[3]).store(cid | (std::uint32_t((status << 1) | phase) << 16),
                                                     std::memory_order_release);
    });
    ++q.cq_tail;
    if (recording_) { // any status: a call may go on after a command that failed (identify's fallback)
      for (auto& f : calls_)
        if (f.qid == q.qid && f.cid == cid) f.answered = true;
    }
  }

  //! What the controller would put in the data buffer of an admin command.
  void admin_data(const nvme::command& c, std::uint32_t& dw0) {
    std::vector<unsigned char> data;
    admin_answer(c, dw0, data);
    if (!data.empty()) move(c, data.data(), data.size(), true);
  }

  //! The answer to an admin command: dword 0 and the data it returns, if any.
  void admin_answer(const nvme::command& c, std::uint32_t& dw0, std::vector<unsigned char>& data) {
    switch (static_cast<nvme::admin_opcode>(c.opcode)) {
    case nvme::admin_opcode::identify: {
      data.assign(nvme::identify_data_size, 0);
      const std::uint32_t cns = c.cdw10 & 0xff;
      if (cns == static_cast<std::uint32_t>(nvme::identify_cns::controller)) {
        auto* id = reinterpret_cast<nvme_id_ctrl*>(data.data());
        std::memcpy(id->mn, "hostile controller                      ", sizeof id->mn);
        id->mdts = answers_.u8() % 24;
        id->nn = answers_.u8() == 0xff ? answers_.u32() : answers_.u8() % 5;
        id->rtd3e = answers_.u8() == 0xfe ? answers_.u32() : 0;
      } else if (cns == static_cast<std::uint32_t>(nvme::identify_cns::active_ns_list)) {
        auto* list = reinterpret_cast<std::uint32_t*>(data.data());
        const std::uint8_t n = answers_.u8() % 6;
        for (std::uint8_t i = 0; i < n; ++i)
          list[i] = answers_.u8() % 8 == 0 ? answers_.u32() : i + 1u;
      } else if (cns == static_cast<std::uint32_t>(nvme::identify_cns::ns)) {
        auto* id = reinterpret_cast<nvme_id_ns*>(data.data());
        id->nsze = answers_.u8() % 4 == 0 ? answers_.u64() : answers_.u8() * 8ull;
        id->flbas = answers_.u8();
        for (auto& f : id->lbaf)
          f.ds = answers_.u8() % 4 == 0 ? answers_.u8() : 9 + answers_.u8() % 4;
        const unsigned fmt = (id->flbas & 0xfu) | (((id->flbas >> 5) & 0x3u) << 4);
        lba_size_[c.nsid] = id->lbaf[fmt].ds < 27 ? 1ull << id->lbaf[fmt].ds : 0;
      }
      break;
    }
    case nvme::admin_opcode::set_features:
    case nvme::admin_opcode::get_features:
      dw0 = answers_.u8() % 4 == 0 ? answers_.u32() : (c.cdw11 & 0xffff) | ((c.cdw11 & 0xffff) << 16);
      break;
    case nvme::admin_opcode::create_io_cq: {
      const std::uint16_t qid = c.cdw10 & 0xffff;
      cqs_.push_back({qid, c.prp1, (c.cdw10 >> 16) + 1u});
      break;
    }
    case nvme::admin_opcode::delete_io_sq: {
      const std::uint16_t qid = c.cdw10 & 0xffff;
      for (auto& q : queues_)
        if (q.qid == qid && qid != 0) q.sq_depth = 0; // no longer served
      break;
    }
    case nvme::admin_opcode::create_io_sq: {
      const std::uint16_t qid = c.cdw10 & 0xffff, cqid = c.cdw11 >> 16;
      for (const auto& cq : cqs_)
        if (cq.qid == cqid) new_sqs_.push_back({qid, c.prp1, (c.cdw10 >> 16) + 1u, cq.bus, cq.depth});
      break;
    }
    default: break;
    }
  }

  //! Copy between `buf` and the memory the command's PRPs describe.
  bool move(const nvme::command& c, unsigned char* buf, std::uint64_t bytes, bool to_host) {
    auto read_list = [&](std::uint64_t bus, std::uint64_t* dst, std::size_t n) {
      return dma_->access(bus, n * 8, [&](unsigned char* p) { std::memcpy(dst, p, n * 8); });
    };
    std::uint64_t off = 0;
    auto segment = [&](std::uint64_t bus, std::uint64_t len) {
      const bool ok = dma_->access(bus, len, [&](unsigned char* p) {
        if (to_host)
          std::memcpy(p, buf + off, len);
        else
          std::memcpy(buf + off, p, len);
      });
      off += len;
      return ok;
    };
    return nvme::walk_prp(c.prp1, c.prp2, bytes, page, read_list, segment).ok();
  }

  void serve() {
    std::vector<late> lates;
    std::uint64_t seq = 0;
    while (!stop_.load()) {
      bool busy = false;
      {
        std::lock_guard lock(queues_mutex_);
        for (auto it = lates.begin(); it != lates.end();) {
          if (--it->after <= 0 && it->queue < queues_.size()) {
            post(queues_[it->queue], it->cid, it->status, it->dw0, false);
            it = lates.erase(it);
          } else {
            ++it;
          }
        }
        for (std::size_t qi = 0; qi < queues_.size(); ++qi) {
          queue& q = queues_[qi];
          const std::uint32_t tail =
              std::atomic_ref<std::uint32_t>(regs_[nvme::sq_doorbell_offset(q.qid, dstrd()) / 4]).load();
          if (q.sq_depth == 0 || tail >= q.sq_depth) continue;
          // Everything up to the tail is published: fetch it all first, so
          // that a completion this pass posts for any of them counts as one
          // posted after the command existed.
          std::vector<nvme::command> batch;
          while (q.head != tail) {
            nvme::command c{};
            if (!dma_->access(q.sq + q.head * sizeof(nvme::command), sizeof c,
                              [&](unsigned char* p) { std::memcpy(&c, p, sizeof c); }))
              break; // the queue's memory is gone: nothing to fetch
            q.head = (q.head + 1) % q.sq_depth;
            if (recording_) calls_.push_back({q.qid, c.cid, c.opcode, ++seq});
            batch.push_back(c);
          }
          for (const nvme::command& c : batch) {
            busy = true;
            std::uint32_t dw0 = 0;
            std::uint16_t status = 0;
            if (q.qid == 0) {
              admin_data(c, dw0);
            } else if ((c.opcode == 0x01 || c.opcode == 0x02) && lba_size_.count(c.nsid) != 0 &&
                       lba_size_[c.nsid] != 0) {
              // Reads and writes: the driver's PRPs must describe mapped memory.
              const std::uint64_t bytes = (std::uint64_t{(c.cdw12 & 0xffff)} + 1) * lba_size_[c.nsid];
              std::vector<unsigned char> buf(bytes, 0x5a);
              if (!move(c, buf.data(), bytes, c.opcode == 0x02) && prp_error_.empty())
                prp_error_ = "PRPs of a " + std::string(c.opcode == 0x02 ? "read" : "write") + " of " +
                             std::to_string(bytes) + " bytes do not describe mapped memory";
            }
            const std::uint8_t act = answers_.u8();
            if (act % 16 == 1) continue;                                                     // never answered
            if (act % 16 == 2) status = static_cast<std::uint16_t>(answers_.u32() & 0x7fff); // error status
            if (act % 16 == 3) {                                                             // answered later
              lates.push_back({qi, c.cid, status, dw0, 1 + answers_.u8() % 50});
              continue;
            }
            post(q, c.cid, status, dw0, act % 16 < 8);
            if (act % 16 == 4) post(q, c.cid, status, dw0, false);                         // twice
            if (act % 16 == 5) post(q, static_cast<std::uint16_t>(c.cid + 1), 0, 0, true); // one nobody asked for
          }
        }
        for (const auto& n : new_sqs_)
          add_queue_locked(n.qid, n.sq_bus, n.sq_depth, n.cq_bus, n.cq_depth);
        new_sqs_.clear();
      }
      if (!busy) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  std::uint32_t dstrd() const { return static_cast<std::uint32_t>(nvme::cap_register{cap_}.bits.dstrd); }

  struct cq_def {
    std::uint16_t qid;
    std::uint64_t bus;
    std::uint32_t depth;
  };
  struct sq_def {
    std::uint16_t qid;
    std::uint64_t sq_bus;
    std::uint32_t sq_depth;
    std::uint64_t cq_bus;
    std::uint32_t cq_depth;
  };

  script regs_script_, answers_;
  std::shared_ptr<fake_iommu> dma_;
  std::vector<std::uint32_t> regs_;
  std::mutex mutex_; // registers other than doorbells
  std::uint64_t cap_ = 0;
  unsigned ready_after_ = 0, csts_reads_ = 0;
  bool never_ready_ = false, fatal_ = false, gone_ = false, enabled_ = false, shutdown_ = false;
  bool shared_ = false;       // the admin queue is "the module's": passthrough and grants
  std::uint16_t granted_ = 0; // queue ids handed out (shared)
  std::mutex queues_mutex_;   // queues_, cqs_, calls_, prp_error_
  std::vector<queue> queues_;
  std::vector<cq_def> cqs_;
  std::vector<sq_def> new_sqs_;                     // created while the queues are being served
  std::map<std::uint32_t, std::uint64_t> lba_size_; // per NSID, as identify told the driver
  bool recording_ = false;
  bool head_lied_ = false;
  std::vector<fetched> calls_;
  std::string prp_error_;
  std::atomic<bool> stop_{false};
  std::thread device_;
};

//! Run one driver call: it must return (success or bam::error) and, on
//! success, every command it sent must have been answered honestly.
template <class Fn>
void call(hostile_controller& h, const char* what, Fn&& fn, bool check_answers = true) {
  h.begin_call();
  const std::uint64_t t0 = bam::detail::now_ns();
  bool ok = false;
  try {
    fn();
    ok = true;
  } catch (const bam::error&) {
  } catch (const std::exception& e) {
    fail(std::string(what) + " threw something other than bam::error: " + e.what());
  }
  if (bam::detail::now_ns() - t0 > call_limit_ns) fail(std::string(what) + " took longer than any deadline allows");
  const auto fetched = h.end_call();
  if (ok && check_answers && !h.head_lied())
    for (const auto& f : fetched)
      if (!f.answered)
        fail(std::string(what) + " reported success, but command id " + std::to_string(f.cid) + " (opcode " +
             std::to_string(f.opcode) + ") on queue " + std::to_string(f.qid) +
             " never got a completion after it was fetched");
  const std::string prp = h.prp_error();
  if (!prp.empty()) fail(prp);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider f(data, size);
  controller_options o;
  o.io_queues = f.ConsumeIntegralInRange<std::uint32_t>(1, 3);
  o.queue_depth = f.ConsumeIntegralInRange<std::uint32_t>(2, 16);
  o.admin_depth = f.ConsumeIntegralInRange<std::uint32_t>(2, 8);
  o.admin_timeout_ns = 30'000'000;
  o.io_timeout_ns = 30'000'000;
  o.shutdown_on_destroy = f.ConsumeIntegralInRange<int>(0, 7) == 0;
  const std::uint32_t ops = f.ConsumeIntegralInRange<std::uint32_t>(0, 8);
  const std::size_t reg_bytes = f.ConsumeIntegralInRange<std::size_t>(0, 64);
  script regs{f.ConsumeBytes<std::uint8_t>(reg_bytes)};
  script answers{f.ConsumeRemainingBytes<std::uint8_t>()};
  auto h = std::make_shared<hostile_controller>(std::move(regs), std::move(answers));

  std::unique_ptr<controller> c;
  call(*h, "bring-up", [&] { c = std::make_unique<controller>(h, o); });
  if (c) {
    std::uint64_t seed = ops * 0x9e3779b97f4a7c15ull;
    for (std::uint32_t i = 0; i < ops && !c->namespaces().empty(); ++i) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      const auto& ns = c->namespaces()[seed % c->namespaces().size()];
      const std::uint32_t blocks = static_cast<std::uint32_t>(1 + (seed >> 20) % 16);
      const std::uint64_t lba = (seed >> 40) % 64;
      try {
        auto buf = h->alloc(std::min<std::uint64_t>(std::uint64_t{blocks} * ns.lba_size, 1ull << 24));
        const std::uint32_t q = static_cast<std::uint32_t>(seed >> 8) % c->io_queue_count();
        switch ((seed >> 12) % 4) {
        case 0: call(*h, "read", [&] { c->read(ns.nsid, lba, blocks, *buf, 0, q); }); break;
        case 1: call(*h, "write", [&] { c->write(ns.nsid, lba, blocks, *buf, 0, q); }); break;
        case 2: call(*h, "flush", [&] { c->flush(ns.nsid, q); }); break;
        default:
          call(*h, "identify", [&] { c->admin(nvme::make_get_features(nvme::feature_id::number_of_queues)); });
          break;
        }
      } catch (const bam::error&) {
      }
    }
  }
  // Teardown reports its failures as warnings, not errors: no success to check.
  bam::set_warning_handler([](const std::string&) {});
  call(
      *h, "teardown", [&] { c.reset(); }, false);
  bam::set_warning_handler(nullptr);
  return 0;
}
