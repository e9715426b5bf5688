// SPDX-License-Identifier: MIT
//! NVMe base and NVM command set definitions shared by host and device code:
//! controller registers, submission/completion entries, opcodes, status codes
//! and PRP rules. Identify data structures come from libnvme on the host
//! (`bam/nvme/identify.hpp`); nothing here needs them.
//!
//! @code
//!   bam::nvme::command cmd = bam::nvme::make_read(nsid, lba, nblocks, prp1, prp2);
//!   bam::nvme::status st = completion.status();
//!   if (!st.ok()) std::puts(bam::nvme::status_name(st));
//! @endcode
#pragma once

#include <bam/detail/macros.hpp>

#include <cstddef>
#include <cstdint>

namespace bam::nvme {

// ---------------------------------------------------------------------------
// Controller registers (NVMe base spec 2.0, section 3.1)
// ---------------------------------------------------------------------------

//! Register offsets in BAR0.
namespace reg {
inline constexpr std::uint32_t cap = 0x00;             //!< Controller Capabilities (64 bit)
inline constexpr std::uint32_t vs = 0x08;              //!< Version
inline constexpr std::uint32_t intms = 0x0c;           //!< Interrupt Mask Set
inline constexpr std::uint32_t intmc = 0x10;           //!< Interrupt Mask Clear
inline constexpr std::uint32_t cc = 0x14;              //!< Controller Configuration
inline constexpr std::uint32_t csts = 0x1c;            //!< Controller Status
inline constexpr std::uint32_t nssr = 0x20;            //!< NVM Subsystem Reset
inline constexpr std::uint32_t aqa = 0x24;             //!< Admin Queue Attributes
inline constexpr std::uint32_t asq = 0x28;             //!< Admin SQ Base Address (64 bit)
inline constexpr std::uint32_t acq = 0x30;             //!< Admin CQ Base Address (64 bit)
inline constexpr std::uint32_t doorbell_base = 0x1000; //!< SQ0 tail doorbell
} // namespace reg

//! CAP: what the controller can do.
union cap_register {
  std::uint64_t raw;
  struct {
    std::uint64_t mqes : 16; //!< maximum queue entries supported, 0-based
    std::uint64_t cqr : 1;   //!< contiguous queues required
    std::uint64_t ams : 2;   //!< arbitration mechanisms supported
    std::uint64_t reserved1 : 5;
    std::uint64_t to : 8;    //!< worst-case ready timeout, 500 ms units
    std::uint64_t dstrd : 4; //!< doorbell stride: 2^(2+DSTRD) bytes
    std::uint64_t nssrs : 1; //!< NVM subsystem reset supported
    std::uint64_t css : 8;   //!< command sets supported (bit 0: NVM)
    std::uint64_t bps : 1;   //!< boot partition support
    std::uint64_t reserved2 : 2;
    std::uint64_t mpsmin : 4; //!< memory page size minimum: 2^(12+MPSMIN)
    std::uint64_t mpsmax : 4; //!< memory page size maximum: 2^(12+MPSMAX)
    std::uint64_t pmrs : 1;   //!< persistent memory region supported
    std::uint64_t cmbs : 1;   //!< controller memory buffer supported
    std::uint64_t reserved3 : 6;
  } bits;
};
static_assert(sizeof(cap_register) == 8);

//! VS: spec version implemented.
union vs_register {
  std::uint32_t raw;
  struct {
    std::uint32_t ter : 8;  //!< tertiary
    std::uint32_t mnr : 8;  //!< minor
    std::uint32_t mjr : 16; //!< major
  } bits;
};
static_assert(sizeof(vs_register) == 4);

//! CC: how the host configures the controller.
union cc_register {
  std::uint32_t raw;
  struct {
    std::uint32_t en : 1; //!< enable
    std::uint32_t reserved1 : 3;
    std::uint32_t css : 3;    //!< I/O command set selected (0: NVM)
    std::uint32_t mps : 4;    //!< memory page size: 2^(12+MPS)
    std::uint32_t ams : 3;    //!< arbitration mechanism (0: round robin)
    std::uint32_t shn : 2;    //!< shutdown notification
    std::uint32_t iosqes : 4; //!< I/O SQ entry size, log2 (6 for 64 B)
    std::uint32_t iocqes : 4; //!< I/O CQ entry size, log2 (4 for 16 B)
    std::uint32_t reserved2 : 8;
  } bits;
};
static_assert(sizeof(cc_register) == 4);

//! CC.SHN values.
enum class shutdown_notification : std::uint32_t { none = 0, normal = 1, abrupt = 2 };

//! CSTS: what the controller reports.
union csts_register {
  std::uint32_t raw;
  struct {
    std::uint32_t rdy : 1;   //!< ready
    std::uint32_t cfs : 1;   //!< controller fatal status
    std::uint32_t shst : 2;  //!< shutdown status
    std::uint32_t nssro : 1; //!< NVM subsystem reset occurred
    std::uint32_t pp : 1;    //!< processing paused
    std::uint32_t reserved : 26;
  } bits;
};
static_assert(sizeof(csts_register) == 4);

//! CSTS.SHST values.
enum class shutdown_status : std::uint32_t { normal = 0, occurring = 1, complete = 2 };

//! A read of all ones from CSTS means the device is gone (surprise removal,
//! link down): no register of a present controller reads as 0xffffffff.
inline constexpr std::uint32_t register_gone = 0xffffffffu;

//! AQA: admin queue sizes, both 0-based.
union aqa_register {
  std::uint32_t raw;
  struct {
    std::uint32_t asqs : 12; //!< admin SQ size, 0-based
    std::uint32_t reserved1 : 4;
    std::uint32_t acqs : 12; //!< admin CQ size, 0-based
    std::uint32_t reserved2 : 4;
  } bits;
};
static_assert(sizeof(aqa_register) == 4);

//! Largest admin queue the spec allows (AQA fields are 12 bits, 0-based).
inline constexpr std::uint32_t max_admin_queue_entries = 4096;
//! Largest I/O queue the spec allows (queue size fields are 16 bits, 0-based).
inline constexpr std::uint32_t max_io_queue_entries = 65536;
//! Unit of CAP.TO.
inline constexpr std::uint64_t cap_timeout_unit_ms = 500;

//! Byte offset of the SQ `qid` tail doorbell for doorbell stride CAP.DSTRD.
BAM_HD constexpr std::uint32_t sq_doorbell_offset(std::uint32_t qid, std::uint32_t dstrd) {
  return reg::doorbell_base + (2 * qid) * (4u << dstrd);
}
//! Byte offset of the CQ `qid` head doorbell for doorbell stride CAP.DSTRD.
BAM_HD constexpr std::uint32_t cq_doorbell_offset(std::uint32_t qid, std::uint32_t dstrd) {
  return reg::doorbell_base + (2 * qid + 1) * (4u << dstrd);
}
static_assert(sq_doorbell_offset(0, 0) == 0x1000);
static_assert(cq_doorbell_offset(0, 0) == 0x1004);
static_assert(sq_doorbell_offset(1, 0) == 0x1008);
static_assert(cq_doorbell_offset(3, 2) == 0x1000 + 7 * 16);

// ---------------------------------------------------------------------------
// Opcodes
// ---------------------------------------------------------------------------

//! Admin command set opcodes.
enum class admin_opcode : std::uint8_t {
  delete_io_sq = 0x00,
  create_io_sq = 0x01,
  get_log_page = 0x02,
  delete_io_cq = 0x04,
  create_io_cq = 0x05,
  identify = 0x06,
  abort = 0x08,
  set_features = 0x09,
  get_features = 0x0a,
  async_event_request = 0x0c,
};

//! NVM command set opcodes.
enum class nvm_opcode : std::uint8_t {
  flush = 0x00,
  write = 0x01,
  read = 0x02,
  write_zeroes = 0x08,
  dataset_management = 0x09,
};

//! Identify CNS values.
enum class identify_cns : std::uint8_t {
  ns = 0x00,             //!< namespace data structure for NSID
  controller = 0x01,     //!< controller data structure
  active_ns_list = 0x02, //!< active namespace IDs above NSID
};

//! Feature identifiers.
enum class feature_id : std::uint8_t {
  arbitration = 0x01,
  power_management = 0x02,
  temperature_threshold = 0x04,
  error_recovery = 0x05,
  volatile_write_cache = 0x06,
  number_of_queues = 0x07,
  interrupt_coalescing = 0x08,
};

//! Log page identifiers.
enum class log_page_id : std::uint8_t {
  error_information = 0x01,
  smart_health = 0x02,
  firmware_slot = 0x03,
};

// ---------------------------------------------------------------------------
// Status codes
// ---------------------------------------------------------------------------

//! Status code types (CQE status SCT).
enum class status_type : std::uint8_t {
  generic = 0x0,
  command_specific = 0x1,
  media_error = 0x2,
  path_related = 0x3,
  vendor = 0x7,
};

//! Generic command status values (SCT 0).
namespace generic_status {
inline constexpr std::uint8_t success = 0x00;
inline constexpr std::uint8_t invalid_opcode = 0x01;
inline constexpr std::uint8_t invalid_field = 0x02;
inline constexpr std::uint8_t command_id_conflict = 0x03;
inline constexpr std::uint8_t data_transfer_error = 0x04;
inline constexpr std::uint8_t aborted_power_loss = 0x05;
inline constexpr std::uint8_t internal_error = 0x06;
inline constexpr std::uint8_t abort_requested = 0x07;
inline constexpr std::uint8_t aborted_sq_deletion = 0x08;
inline constexpr std::uint8_t invalid_namespace = 0x0b;
inline constexpr std::uint8_t command_sequence_error = 0x0c;
inline constexpr std::uint8_t invalid_prp_offset = 0x13;
inline constexpr std::uint8_t namespace_write_protected = 0x20;
inline constexpr std::uint8_t lba_out_of_range = 0x80;
inline constexpr std::uint8_t capacity_exceeded = 0x81;
inline constexpr std::uint8_t namespace_not_ready = 0x82;
} // namespace generic_status

//! Command specific status values (SCT 1).
namespace command_specific_status {
inline constexpr std::uint8_t invalid_completion_queue = 0x00;
inline constexpr std::uint8_t invalid_queue_identifier = 0x01;
inline constexpr std::uint8_t invalid_queue_size = 0x02;
inline constexpr std::uint8_t abort_limit_exceeded = 0x03;
inline constexpr std::uint8_t invalid_log_page = 0x09;
inline constexpr std::uint8_t invalid_queue_deletion = 0x0c;
inline constexpr std::uint8_t feature_not_changeable = 0x0e;
} // namespace command_specific_status

//! Media and data integrity errors (SCT 2).
namespace media_status {
inline constexpr std::uint8_t write_fault = 0x80;
inline constexpr std::uint8_t unrecovered_read_error = 0x81;
inline constexpr std::uint8_t compare_failure = 0x85;
inline constexpr std::uint8_t access_denied = 0x86;
} // namespace media_status

//! Codes bam reports on its own, in the vendor-specific type: they never come
//! from a controller that bam talks to, so they cannot be confused with one.
namespace bam_status {
inline constexpr std::uint8_t timeout = 0xf0;      //!< no completion within the deadline
inline constexpr std::uint8_t queue_broken = 0xf1; //!< an earlier timeout poisoned the queue
inline constexpr std::uint8_t out_of_range = 0xf2; //!< rejected before submission
inline constexpr std::uint8_t queue_full = 0xf3;   //!< no slot free within the deadline
//! refused before submission: the transport needs a device-side progress hook
//! that the kernel was compiled without (see transport/device_progress.cuh)
inline constexpr std::uint8_t no_progress_hook = 0xf4;
} // namespace bam_status

//! A completion status without the phase bit: SCT and SC plus the More and
//! Do Not Retry flags, in the CQE's layout shifted right by one.
struct status {
  std::uint16_t raw = 0;

  constexpr status() = default;
  BAM_HD constexpr explicit status(std::uint16_t r) : raw(r) {}
  BAM_HD constexpr status(status_type sct, std::uint8_t sc, bool dnr = false)
      : raw(static_cast<std::uint16_t>(sc | (static_cast<std::uint16_t>(sct) << 8) | (dnr ? 0x4000u : 0u))) {}

  BAM_HD constexpr std::uint8_t sc() const { return static_cast<std::uint8_t>(raw & 0xff); }
  BAM_HD constexpr status_type sct() const { return static_cast<status_type>((raw >> 8) & 0x7); }
  BAM_HD constexpr bool more() const { return (raw >> 13) & 1; }
  BAM_HD constexpr bool dnr() const { return (raw >> 14) & 1; }
  BAM_HD constexpr bool ok() const { return (raw & 0x7ff) == 0; }
  //! The code without flags: `(SCT << 8) | SC`.
  BAM_HD constexpr std::uint16_t code() const { return raw & 0x7ff; }
  BAM_HD constexpr bool operator==(status o) const { return code() == o.code(); }
  BAM_HD constexpr bool operator!=(status o) const { return code() != o.code(); }
  BAM_HD constexpr bool is_bam(std::uint8_t sc_) const { return sct() == status_type::vendor && sc() == sc_; }
};
static_assert(sizeof(status) == 2);

inline constexpr status status_success{};
inline constexpr status status_timeout{status_type::vendor, bam_status::timeout, true};
inline constexpr status status_queue_broken{status_type::vendor, bam_status::queue_broken, true};
inline constexpr status status_out_of_range{status_type::vendor, bam_status::out_of_range, true};
inline constexpr status status_queue_full{status_type::vendor, bam_status::queue_full, true};
inline constexpr status status_no_progress_hook{status_type::vendor, bam_status::no_progress_hook, true};

//! A readable name for a status ("LBA Out of Range", "Invalid Opcode", ...).
BAM_HD inline const char* status_name(status st) {
  const auto sc = st.sc();
  switch (st.sct()) {
  case status_type::generic:
    switch (sc) {
    case generic_status::success: return "Successful Completion";
    case generic_status::invalid_opcode: return "Invalid Command Opcode";
    case generic_status::invalid_field: return "Invalid Field in Command";
    case generic_status::command_id_conflict: return "Command ID Conflict";
    case generic_status::data_transfer_error: return "Data Transfer Error";
    case generic_status::aborted_power_loss: return "Commands Aborted due to Power Loss";
    case generic_status::internal_error: return "Internal Error";
    case generic_status::abort_requested: return "Command Abort Requested";
    case generic_status::aborted_sq_deletion: return "Command Aborted due to SQ Deletion";
    case generic_status::invalid_namespace: return "Invalid Namespace or Format";
    case generic_status::command_sequence_error: return "Command Sequence Error";
    case generic_status::invalid_prp_offset: return "PRP Offset Invalid";
    case generic_status::namespace_write_protected: return "Namespace is Write Protected";
    case generic_status::lba_out_of_range: return "LBA Out of Range";
    case generic_status::capacity_exceeded: return "Capacity Exceeded";
    case generic_status::namespace_not_ready: return "Namespace Not Ready";
    default: return "Generic Status (unknown code)";
    }
  case status_type::command_specific:
    switch (sc) {
    case command_specific_status::invalid_completion_queue: return "Completion Queue Invalid";
    case command_specific_status::invalid_queue_identifier: return "Invalid Queue Identifier";
    case command_specific_status::invalid_queue_size: return "Invalid Queue Size";
    case command_specific_status::abort_limit_exceeded: return "Abort Command Limit Exceeded";
    case command_specific_status::invalid_log_page: return "Invalid Log Page";
    case command_specific_status::invalid_queue_deletion: return "Invalid Queue Deletion";
    case command_specific_status::feature_not_changeable: return "Feature Not Changeable";
    default: return "Command Specific Status (unknown code)";
    }
  case status_type::media_error:
    switch (sc) {
    case media_status::write_fault: return "Write Fault";
    case media_status::unrecovered_read_error: return "Unrecovered Read Error";
    case media_status::compare_failure: return "Compare Failure";
    case media_status::access_denied: return "Access Denied";
    default: return "Media Error (unknown code)";
    }
  case status_type::path_related: return "Path Related Status";
  case status_type::vendor:
    switch (sc) {
    case bam_status::timeout: return "Timeout (no completion)";
    case bam_status::queue_broken: return "Queue Broken by an Earlier Timeout";
    case bam_status::out_of_range: return "Request Out of Range";
    case bam_status::queue_full: return "Queue Full (no slot within deadline)";
    case bam_status::no_progress_hook:
      return "Kernel Compiled Without the Transport's Device Hook (include <bam/bam.cuh> before other bam headers)";
    default: return "Vendor Specific Status";
    }
  default: return "Reserved Status Code Type";
  }
}

// ---------------------------------------------------------------------------
// Queue entries
// ---------------------------------------------------------------------------

//! A 64-byte submission queue entry.
struct command {
  std::uint8_t opcode;
  std::uint8_t flags; //!< FUSE [1:0], PSDT [7:6] (0: PRPs)
  std::uint16_t cid;  //!< command identifier
  std::uint32_t nsid;
  std::uint32_t cdw2;
  std::uint32_t cdw3;
  std::uint64_t mptr;
  std::uint64_t prp1;
  std::uint64_t prp2;
  std::uint32_t cdw10;
  std::uint32_t cdw11;
  std::uint32_t cdw12;
  std::uint32_t cdw13;
  std::uint32_t cdw14;
  std::uint32_t cdw15;
};
static_assert(sizeof(command) == 64);
static_assert(offsetof(command, cid) == 2);
static_assert(offsetof(command, nsid) == 4);
static_assert(offsetof(command, mptr) == 16);
static_assert(offsetof(command, prp1) == 24);
static_assert(offsetof(command, prp2) == 32);
static_assert(offsetof(command, cdw10) == 40);
static_assert(offsetof(command, cdw15) == 60);

//! Completion dword 3: command id, phase tag and status field (NVMe 2.0, 4.2.3).
//! The status field is what `nvme::status` holds, shifted right by one.
union cqe_dw3 {
  std::uint32_t raw;
  struct {
    std::uint32_t cid : 16;  //!< command identifier
    std::uint32_t phase : 1; //!< phase tag
    std::uint32_t sc : 8;    //!< status code
    std::uint32_t sct : 3;   //!< status code type
    std::uint32_t crd : 2;   //!< command retry delay
    std::uint32_t more : 1;  //!< more status information in the error log
    std::uint32_t dnr : 1;   //!< do not retry
  } bits;

  BAM_HD constexpr nvme::status status() const { return nvme::status(static_cast<std::uint16_t>(raw >> 17)); }
  BAM_HD constexpr bool phase_tag() const { return (raw >> 16) & 1u; }
  BAM_HD constexpr std::uint16_t command_id() const { return static_cast<std::uint16_t>(raw & 0xffffu); }
  //! Dword 3 of a completion of command `cid` with status `st` in phase `phase`.
  BAM_HD static constexpr cqe_dw3 make(std::uint16_t cid, nvme::status st, std::uint32_t phase) {
    cqe_dw3 d{};
    d.raw =
        static_cast<std::uint32_t>(cid) | ((phase & 1u) << 16) | (static_cast<std::uint32_t>(st.raw & 0x7fffu) << 17);
    return d;
  }
};
static_assert(sizeof(cqe_dw3) == 4);

//! Completion dword 2: SQ head pointer and SQ identifier.
union cqe_dw2 {
  std::uint32_t raw;
  struct {
    std::uint32_t sq_head : 16; //!< SQ head pointer after this command was fetched
    std::uint32_t sq_id : 16;   //!< submission queue the command came from
  } bits;
};
static_assert(sizeof(cqe_dw2) == 4);

//! A 16-byte completion queue entry.
struct completion {
  std::uint32_t dw0;     //!< command specific
  std::uint32_t dw1;     //!< reserved / command specific
  std::uint16_t sq_head; //!< SQ head pointer after this command was fetched
  std::uint16_t sq_id;
  std::uint16_t cid;
  std::uint16_t status_phase; //!< bit 0: phase tag; bits 15:1: status

  BAM_HD constexpr bool phase() const { return status_phase & 1; }
  BAM_HD constexpr nvme::status status() const { return nvme::status(static_cast<std::uint16_t>(status_phase >> 1)); }
};
static_assert(sizeof(completion) == 16);
static_assert(offsetof(completion, sq_head) == 8);
static_assert(offsetof(completion, cid) == 12);
static_assert(offsetof(completion, status_phase) == 14);
//! Byte offset of dword 3 (cid, phase, status): consumers load it first, with acquire.
inline constexpr std::size_t cqe_dw3_offset = offsetof(completion, cid);

// ---------------------------------------------------------------------------
// Command dwords (NVMe 2.0 and NVM command set 1.0, by command)
// ---------------------------------------------------------------------------

//! Read / Write / Write Zeroes, dword 12.
union rw_cdw12 {
  std::uint32_t raw;
  struct {
    std::uint32_t nlb : 16; //!< number of logical blocks, 0-based
    std::uint32_t reserved : 4;
    std::uint32_t dtype : 4;  //!< directive type
    std::uint32_t stc : 1;    //!< storage tag check
    std::uint32_t deac : 1;   //!< Write Zeroes: deallocate
    std::uint32_t prinfo : 4; //!< protection information
    std::uint32_t fua : 1;    //!< force unit access
    std::uint32_t lr : 1;     //!< limited retry
  } bits;
};
static_assert(sizeof(rw_cdw12) == 4);

//! Create I/O Submission / Completion Queue, dword 10.
union create_queue_cdw10 {
  std::uint32_t raw;
  struct {
    std::uint32_t qid : 16;   //!< queue identifier
    std::uint32_t qsize : 16; //!< queue size, 0-based
  } bits;
};
static_assert(sizeof(create_queue_cdw10) == 4);

//! Create I/O Submission Queue, dword 11.
union create_sq_cdw11 {
  std::uint32_t raw;
  struct {
    std::uint32_t pc : 1;    //!< physically contiguous
    std::uint32_t qprio : 2; //!< queue priority
    std::uint32_t reserved : 13;
    std::uint32_t cqid : 16; //!< completion queue this SQ posts to
  } bits;
};
static_assert(sizeof(create_sq_cdw11) == 4);

//! Create I/O Completion Queue, dword 11.
union create_cq_cdw11 {
  std::uint32_t raw;
  struct {
    std::uint32_t pc : 1;  //!< physically contiguous
    std::uint32_t ien : 1; //!< interrupts enabled
    std::uint32_t reserved : 14;
    std::uint32_t iv : 16; //!< interrupt vector
  } bits;
};
static_assert(sizeof(create_cq_cdw11) == 4);

//! Set / Get Features, dword 10.
union features_cdw10 {
  std::uint32_t raw;
  struct {
    std::uint32_t fid : 8; //!< feature identifier
    std::uint32_t sel : 3; //!< Get Features: current, default, saved, supported capabilities
    std::uint32_t reserved : 20;
    std::uint32_t sv : 1; //!< Set Features: save
  } bits;
};
static_assert(sizeof(features_cdw10) == 4);

//! Number of Queues feature: dword 11 of Set Features and dword 0 of its completion.
union number_of_queues {
  std::uint32_t raw;
  struct {
    std::uint32_t nsq : 16; //!< submission queues, 0-based
    std::uint32_t ncq : 16; //!< completion queues, 0-based
  } bits;
};
static_assert(sizeof(number_of_queues) == 4);

//! Get Log Page, dword 10.
union get_log_page_cdw10 {
  std::uint32_t raw;
  struct {
    std::uint32_t lid : 8;    //!< log page identifier
    std::uint32_t lsp : 7;    //!< log specific field
    std::uint32_t rae : 1;    //!< retain asynchronous event
    std::uint32_t numdl : 16; //!< number of dwords, lower 16 bits (0-based)
  } bits;
};
static_assert(sizeof(get_log_page_cdw10) == 4);

//! Get Log Page, dword 11.
union get_log_page_cdw11 {
  std::uint32_t raw;
  struct {
    std::uint32_t numdu : 16; //!< number of dwords, upper 16 bits
    std::uint32_t lsi : 16;   //!< log specific identifier
  } bits;
};
static_assert(sizeof(get_log_page_cdw11) == 4);

//! Identify, dword 10.
union identify_cdw10 {
  std::uint32_t raw;
  struct {
    std::uint32_t cns : 8; //!< controller or namespace structure
    std::uint32_t reserved : 8;
    std::uint32_t cntid : 16; //!< controller identifier
  } bits;
};
static_assert(sizeof(identify_cdw10) == 4);

//! Dataset Management, dwords 10 and 11.
union dsm_cdw10 {
  std::uint32_t raw;
  struct {
    std::uint32_t nr : 8; //!< number of ranges, 0-based
    std::uint32_t reserved : 24;
  } bits;
};
union dsm_cdw11 {
  std::uint32_t raw;
  struct {
    std::uint32_t idr : 1; //!< integral dataset for read
    std::uint32_t idw : 1; //!< integral dataset for write
    std::uint32_t ad : 1;  //!< attribute: deallocate
    std::uint32_t reserved : 29;
  } bits;
};
static_assert(sizeof(dsm_cdw10) == 4 && sizeof(dsm_cdw11) == 4);

//! Delete I/O Submission / Completion Queue and Abort, dword 10.
union queue_id_cdw10 {
  std::uint32_t raw;
  struct {
    std::uint32_t qid : 16; //!< queue identifier (Abort: SQ identifier)
    std::uint32_t cid : 16; //!< Abort: command identifier
  } bits;
};
static_assert(sizeof(queue_id_cdw10) == 4);

//! Command flags byte: fused operation and PRP/SGL selection.
union command_flags {
  std::uint8_t raw;
  struct {
    std::uint8_t fuse : 2; //!< fused operation (0: normal)
    std::uint8_t reserved : 4;
    std::uint8_t psdt : 2; //!< 0: PRPs; otherwise SGLs
  } bits;
};
static_assert(sizeof(command_flags) == 1);

inline constexpr std::uint32_t sq_entry_log2 = 6; //!< CC.IOSQES for 64 B entries
inline constexpr std::uint32_t cq_entry_log2 = 4; //!< CC.IOCQES for 16 B entries
static_assert((1u << sq_entry_log2) == sizeof(command));
static_assert((1u << cq_entry_log2) == sizeof(completion));

//! Size of identify, log page and PRP list pages the spec fixes.
inline constexpr std::size_t identify_data_size = 4096;
//! Entries in a PRP list page of `page_size` bytes.
BAM_HD constexpr std::size_t prp_entries_per_page(std::size_t page_size) { return page_size / sizeof(std::uint64_t); }

// ---------------------------------------------------------------------------
// Command encoders
// ---------------------------------------------------------------------------

BAM_HD constexpr command make_command(std::uint8_t opcode, std::uint32_t nsid = 0) {
  command c{};
  c.opcode = opcode;
  c.nsid = nsid;
  return c;
}

//! Read or Write of `nblocks` (>= 1) logical blocks at `slba`.
BAM_HD constexpr command make_rw(nvm_opcode op, std::uint32_t nsid, std::uint64_t slba, std::uint32_t nblocks,
                                 std::uint64_t prp1, std::uint64_t prp2) {
  command c = make_command(static_cast<std::uint8_t>(op), nsid);
  c.prp1 = prp1;
  c.prp2 = prp2;
  c.cdw10 = static_cast<std::uint32_t>(slba);
  c.cdw11 = static_cast<std::uint32_t>(slba >> 32);
  rw_cdw12 d12{};
  d12.bits.nlb = (nblocks - 1) & 0xffffu; // NLB is 0-based
  c.cdw12 = d12.raw;
  return c;
}
BAM_HD constexpr command make_read(std::uint32_t nsid, std::uint64_t slba, std::uint32_t nblocks, std::uint64_t prp1,
                                   std::uint64_t prp2) {
  return make_rw(nvm_opcode::read, nsid, slba, nblocks, prp1, prp2);
}
BAM_HD constexpr command make_write(std::uint32_t nsid, std::uint64_t slba, std::uint32_t nblocks, std::uint64_t prp1,
                                    std::uint64_t prp2) {
  return make_rw(nvm_opcode::write, nsid, slba, nblocks, prp1, prp2);
}
BAM_HD constexpr command make_flush(std::uint32_t nsid) {
  return make_command(static_cast<std::uint8_t>(nvm_opcode::flush), nsid);
}
BAM_HD constexpr command make_write_zeroes(std::uint32_t nsid, std::uint64_t slba, std::uint32_t nblocks) {
  return make_rw(nvm_opcode::write_zeroes, nsid, slba, nblocks, 0, 0);
}
//! One range of a Dataset Management command's data (16 bytes each).
struct dsm_range {
  std::uint32_t attributes;
  std::uint32_t nblocks;
  std::uint64_t slba;
};
static_assert(sizeof(dsm_range) == 16);
inline constexpr std::uint32_t dsm_deallocate = 1u << 2; //!< CDW11.AD
BAM_HD constexpr command make_dsm_deallocate(std::uint32_t nsid, std::uint32_t nranges, std::uint64_t prp1) {
  command c = make_command(static_cast<std::uint8_t>(nvm_opcode::dataset_management), nsid);
  dsm_cdw10 d10{};
  d10.bits.nr = (nranges - 1) & 0xffu;
  dsm_cdw11 d11{};
  d11.bits.ad = 1;
  c.cdw10 = d10.raw;
  c.cdw11 = d11.raw;
  c.prp1 = prp1;
  return c;
}

//! Number of logical blocks of a Read/Write/Write Zeroes command.
BAM_HD constexpr std::uint32_t command_nblocks(const command& c) {
  const rw_cdw12 d12{c.cdw12};
  return d12.bits.nlb + 1u;
}
//! Starting LBA of a Read/Write/Write Zeroes command.
BAM_HD constexpr std::uint64_t command_slba(const command& c) {
  return c.cdw10 | (static_cast<std::uint64_t>(c.cdw11) << 32);
}

BAM_HD constexpr command make_identify(identify_cns cns, std::uint32_t nsid, std::uint64_t prp1,
                                       std::uint64_t prp2 = 0) {
  command c = make_command(static_cast<std::uint8_t>(admin_opcode::identify), nsid);
  identify_cdw10 d10{};
  d10.bits.cns = static_cast<std::uint8_t>(cns);
  c.cdw10 = d10.raw;
  c.prp1 = prp1;
  c.prp2 = prp2;
  return c;
}
//! Create I/O Completion Queue, physically contiguous, interrupts off.
BAM_HD constexpr command make_create_io_cq(std::uint16_t qid, std::uint32_t entries, std::uint64_t base) {
  command c = make_command(static_cast<std::uint8_t>(admin_opcode::create_io_cq));
  c.prp1 = base;
  create_queue_cdw10 d10{};
  d10.bits.qid = qid;
  d10.bits.qsize = (entries - 1) & 0xffffu;
  create_cq_cdw11 d11{};
  d11.bits.pc = 1; // interrupts off
  c.cdw10 = d10.raw;
  c.cdw11 = d11.raw;
  return c;
}
//! Create I/O Submission Queue bound to completion queue `cqid`.
BAM_HD constexpr command make_create_io_sq(std::uint16_t qid, std::uint32_t entries, std::uint64_t base,
                                           std::uint16_t cqid) {
  command c = make_command(static_cast<std::uint8_t>(admin_opcode::create_io_sq));
  c.prp1 = base;
  create_queue_cdw10 d10{};
  d10.bits.qid = qid;
  d10.bits.qsize = (entries - 1) & 0xffffu;
  create_sq_cdw11 d11{};
  d11.bits.pc = 1; // priority urgent (0)
  d11.bits.cqid = cqid;
  c.cdw10 = d10.raw;
  c.cdw11 = d11.raw;
  return c;
}
BAM_HD constexpr command make_delete_io_sq(std::uint16_t qid) {
  command c = make_command(static_cast<std::uint8_t>(admin_opcode::delete_io_sq));
  queue_id_cdw10 d10{};
  d10.bits.qid = qid;
  c.cdw10 = d10.raw;
  return c;
}
BAM_HD constexpr command make_delete_io_cq(std::uint16_t qid) {
  command c = make_command(static_cast<std::uint8_t>(admin_opcode::delete_io_cq));
  queue_id_cdw10 d10{};
  d10.bits.qid = qid;
  c.cdw10 = d10.raw;
  return c;
}
//! Set Features / Number of Queues; counts are 1-based here, 0-based on the wire.
BAM_HD constexpr command make_set_num_queues(std::uint32_t nsq, std::uint32_t ncq) {
  command c = make_command(static_cast<std::uint8_t>(admin_opcode::set_features));
  features_cdw10 d10{};
  d10.bits.fid = static_cast<std::uint8_t>(feature_id::number_of_queues);
  number_of_queues d11{};
  d11.bits.nsq = (nsq - 1) & 0xffffu;
  d11.bits.ncq = (ncq - 1) & 0xffffu;
  c.cdw10 = d10.raw;
  c.cdw11 = d11.raw;
  return c;
}
BAM_HD constexpr command make_get_features(feature_id fid) {
  command c = make_command(static_cast<std::uint8_t>(admin_opcode::get_features));
  features_cdw10 d10{};
  d10.bits.fid = static_cast<std::uint8_t>(fid);
  c.cdw10 = d10.raw;
  return c;
}
//! Get Log Page of `bytes` (a multiple of 4) into prp1/prp2.
BAM_HD constexpr command make_get_log_page(log_page_id lid, std::uint32_t nsid, std::uint32_t bytes, std::uint64_t prp1,
                                           std::uint64_t prp2 = 0) {
  command c = make_command(static_cast<std::uint8_t>(admin_opcode::get_log_page), nsid);
  const std::uint32_t numd = bytes / 4 - 1; // 0-based dwords
  get_log_page_cdw10 d10{};
  d10.bits.lid = static_cast<std::uint8_t>(lid);
  d10.bits.numdl = numd & 0xffffu;
  get_log_page_cdw11 d11{};
  d11.bits.numdu = numd >> 16;
  c.cdw10 = d10.raw;
  c.cdw11 = d11.raw;
  c.prp1 = prp1;
  c.prp2 = prp2;
  return c;
}
BAM_HD constexpr command make_abort(std::uint16_t sqid, std::uint16_t cid) {
  command c = make_command(static_cast<std::uint8_t>(admin_opcode::abort));
  queue_id_cdw10 d10{};
  d10.bits.qid = sqid;
  d10.bits.cid = cid;
  c.cdw10 = d10.raw;
  return c;
}

// ---------------------------------------------------------------------------
// PRP rules
// ---------------------------------------------------------------------------

//! PRP entries are dword aligned: bits 1:0 must be zero.
BAM_HD constexpr bool prp_offset_valid(std::uint64_t addr) { return (addr & 3u) == 0; }

//! Number of memory pages a transfer touches.
BAM_HD constexpr std::uint64_t prp_pages_spanned(std::uint64_t addr, std::uint64_t bytes, std::uint64_t page_size) {
  if (bytes == 0) return 0;
  const std::uint64_t first = addr & ~(page_size - 1);
  const std::uint64_t last = (addr + bytes - 1) & ~(page_size - 1);
  return (last - first) / page_size + 1;
}
static_assert(prp_pages_spanned(0, 4096, 4096) == 1);
static_assert(prp_pages_spanned(512, 4096, 4096) == 2);
static_assert(prp_pages_spanned(0, 8192 + 1, 4096) == 3);

} // namespace bam::nvme
