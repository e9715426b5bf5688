// SPDX-License-Identifier: MIT
// The comparison harness of `bam-gnn aggregate`, called once a run's batches
// are done: it prints the run's figures, gathers the same batches' rows by
// the paths a user has without bam (--compare: CPU threads, GPU zero-copy,
// mmap cold and warm, and features resident in GPU memory as the upper
// bound), prints the table and writes the JSON report (--json).
#pragma once

#include "../../examples/gnn/gnn_aggregate.hpp"
#include "../../examples/gnn/gnn_feature_store.cuh"

#include <bam/bam.cuh>

#include <cstdint>
#include <vector>

namespace bam::gnn {

//! A finished run, and what the baselines need to gather its batches again.
struct finished_run {
  const aggregate_options& options;
  const manifest& m;
  const aggregate_figures& figures;
  // For --compare:
  const std::vector<std::vector<std::uint64_t>>& batch_ids; //!< the rows each batch gathered
  const std::vector<unsigned char>& batch0_rows;            //!< batch 0's expected rows
  std::uint64_t max_batch_rows;                             //!< the most rows a batch can gather
  const table_source& src;                                  //!< the feature table, from its file or the generator
  const storage& s;              //!< the storage the run read (its medium may hold the table)
  const feature_location& where; //!< where on it
  thread_pool& pool;             //!< the CPU baselines' threads
  cudaStream_t stream;           //!< the GPU baselines' stream
};

//! Reports `run`: its figures as text, the baselines with --compare, the
//! JSON with --json. Throws `bam::error` (EIO) when a baseline gathers
//! other bytes than the reference.
void report_aggregate(const finished_run& run);

} // namespace bam::gnn
