// SPDX-License-Identifier: MIT
// The report of `bam-gnn aggregate`: the figures of a run printed, the
// comparison table of the gather paths (--compare), and the JSON document
// (--json) that scripts/gnn-sweep, scripts/gnn-pipeline and the plots read.
// Host code alone (no CUDA): the tests build it with g++.
#pragma once

#include "../../examples/gnn/gnn_aggregate.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace bam::gnn {

//! One way of gathering the same batches' rows, and how fast it went.
struct path_result {
  std::string path; //!< short name: "bam", "cpu-threads", "zero-copy", ...
  std::string what; //!< what it does, in words
  bool ran = false;
  std::string why_not; //!< why it did not run
  double seconds = 0;
  std::uint64_t rows = 0, bytes = 0;
  bool verified = false; //!< its batch-0 rows equal the reference
  double nodes_per_s() const { return seconds > 0 ? static_cast<double>(rows) / seconds : 0; }
  double gb_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

//! The fastest of the baselines a user has without bam (CPU threads,
//! zero-copy, mmap); features resident in GPU memory are the upper bound,
//! not a baseline. 0 when none ran.
double best_baseline(const std::vector<path_result>& paths);

//! The run's own gather, through bam, as a path of the comparison.
path_result bam_path(const aggregate_figures& f, std::uint64_t row_bytes);

//! The GPU a run used, for the JSON report.
struct gpu_description {
  std::string name;
  int driver = 0;       //!< cudaDriverGetVersion
  int cuda_runtime = 0; //!< CUDART_VERSION of the build
};

//! The source's commit: $BAM_COMMIT, else `git rev-parse --short HEAD`, else "unknown".
std::string commit_id();
//! Now, UTC, as 2024-01-31T12:00:00Z.
std::string utc_now();

//! The run's figures as text on stdout (throughput, per-stage times, hit
//! rate, what was verified). `gather_gbs` >= 0: the gather stage's GB/s
//! (several GPUs: the sum of theirs), else the one `f` gives.
void print_run_summary(const aggregate_options& o, const manifest& m, const aggregate_figures& f,
                       double gather_gbs = -1);

//! The table of the gather paths (--compare): bam's and the baselines'.
void print_comparison(const aggregate_figures& f, std::uint64_t row_bytes, std::uint64_t batches,
                      const std::vector<path_result>& baselines);

//! The JSON document of a run (`baselines` only with --compare).
nlohmann::ordered_json aggregate_json(const aggregate_options& o, const manifest& m, const aggregate_figures& f,
                                      const std::vector<path_result>& baselines, const gpu_description& gpu,
                                      const std::string& commit, const std::string& date);

//! The figures of a run on several GPUs at once: the GPUs' sums (stage
//! times too), the longest GPU's time, `cache_bytes` the caches' pages in all.
aggregate_figures combine_gpu_figures(const std::vector<aggregate_figures>& per, std::uint64_t cache_bytes);

//! A run on several GPUs at once (--gpus N).
struct gpus_report {
  const aggregate_options& options; //!< `batches`: each GPU's
  const manifest& m;
  const std::vector<aggregate_figures>& per_gpu;
  const aggregate_figures& all; //!< the GPUs' sums; the longest GPU's time
  std::string cache_layout;     //!< "a cache per GPU", "one cache spread over the GPUs"
  const std::vector<gpu_description>& gpus;
};

//! Prints the per-GPU and total figures; writes the JSON with --json (the
//! one-GPU document of the totals, with "gpus", "cache_layout" and "per_gpu").
void report_gpus(const gpus_report& r);

//! `j` into --json FILE and, with the global --json, onto stdout.
void write_json(const aggregate_options& o, const nlohmann::ordered_json& j);

} // namespace bam::gnn
