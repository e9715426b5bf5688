// SPDX-License-Identifier: MIT
//! The data of the software controller's GPU engine as GPU threads see it:
//! plain structs in GPU memory and a trivially copyable handle. The device
//! code that serves the queues is in `detail/gpu_serve.cuh`; the host owner
//! in `gpu_engine.cuh`.
#pragma once

#include <bam/emu/nvm_executor.hpp>
#include <bam/transport/media_kind.hpp>
#include <bam/nvme/queue.hpp>
#include <bam/nvme/spec.hpp>

#include <cstdint>
#include <type_traits>

namespace bam::emu {

//! The `device_progress::hook` id of the GPU engine: kernels serve its queues
//! through `serve_software_controller` (progress.cuh).
inline constexpr std::uint32_t gpu_engine_progress_id = 0x47505545; // "GPUE"

//! Engine-side state of one I/O queue pair (GPU memory, zeroed when created).
struct gpu_engine_queue {
  nvme::command* sq;
  nvme::completion* cq;
  std::uint32_t sq_depth;
  std::uint32_t cq_depth;
  std::uint32_t active; //!< 1 while the queue exists
  std::uint16_t qid;
  std::uint16_t cqid;
  alignas(128) std::uint64_t sq_claim;   //!< virtual SQ head: entries claimed
  alignas(128) std::uint64_t sq_fetched; //!< entries copied out, advanced in order
  alignas(128) std::uint64_t cq_reserve; //!< CQ slots handed out, virtual
  alignas(128) std::uint64_t cq_head;    //!< lower bound of the consumer's virtual head
  std::uint64_t served;                  //!< commands completed (statistics)
};

//! The SSD model: an IOPS limit and a latency per command (GPU memory).
struct gpu_ssd_model {
  std::uint64_t ns_per_io;                  //!< minimum spacing of command starts (0: no IOPS limit)
  std::uint64_t latency_ns;                 //!< added latency per command (0: none)
  alignas(128) std::uint64_t next_start_ns; //!< token of the IOPS limiter
};

//! Trivially copyable handle to a GPU engine, passed to kernels by value or
//! kept in GPU memory (the transport's progress hook points at one).
struct gpu_engine_ref {
  gpu_engine_queue* queues = nullptr; //!< indexed by queue id (0 unused: admin stays on the CPU)
  std::uint32_t* doorbells = nullptr; //!< doorbell words, index (offset - 0x1000) / 4
  std::uint32_t dstrd = 0;            //!< CAP.DSTRD of the controller: stride 4 << dstrd bytes
  std::uint32_t max_qid = 0;
  std::uint8_t* media = nullptr; //!< device-accessible pointer (ram, hbm); null for null media
  std::uint64_t media_bytes = 0;
  media_kind media_is = media_kind::null;
  std::uint32_t zero = 0; //!< always 0; the compiler cannot know it (a dependency token)
  nvm_target target;      //!< namespace, limits, counters and fault table (GPU memory)
  gpu_ssd_model* model = nullptr;
  std::uint64_t timeout_ns = nvme::default_queue_timeout_ns; //!< bound of every engine wait

  //! Index of the SQ tail / CQ head doorbell word of queue `qid`.
  BAM_HD std::uint32_t sq_doorbell_index(std::uint32_t qid) const { return (2 * qid) << dstrd; }
  BAM_HD std::uint32_t cq_doorbell_index(std::uint32_t qid) const { return (2 * qid + 1) << dstrd; }
};
static_assert(std::is_trivially_copyable_v<gpu_engine_ref>);

} // namespace bam::emu
