// SPDX-License-Identifier: MIT
// `bam-graph bfs|cc|pagerank`: the options of a run and its entry point
// (graph_run.cu, in a CUDA build). No CUDA here.
#pragma once

#include <cstdint>
#include <string>

namespace bam::graph {

struct run_options {
  std::string algorithm; //!< bfs, cc or pagerank
  std::string dir;       //!< the graph's directory
  std::string device;    //!< device string (empty: the manifest's device, else pinned host RAM the image's size)
  std::uint64_t cache_mib = 1024;
  std::uint32_t page_size = 4096;
  std::string access = "copy"; //!< how a warp reads a node's neighbours through the cache: copy or reader
  std::string offsets = "gpu"; //!< where the offsets are read from: gpu (GPU memory) or cache (through bam)
  int look_ahead =
      -1; //!< pages a warp brings in at once ahead of its reads through the cache (-1: from the cache's size; 0: none)
  unsigned runs = 0;      //!< 0: 4 for bfs and cc, 1 for pagerank (BFS: a root each)
  std::int64_t root = -1; //!< BFS: this root for every run (-1: drawn from seed)
  std::uint64_t seed = 1; //!< BFS roots
  bool bottom_up = true;  //!< BFS: direction-optimizing (large frontiers bottom-up); false: top-down only
  //! BFS and CC: the first `heads` neighbours of every node in GPU memory, out of bam's --cache-mib (0: none)
  unsigned heads = 0;
  bool baselines = true;    //!< also GPU memory, zero-copy host memory and CPU threads
  bool validate = true;     //!< check every run's result
  double damping = 0.85;    //!< PageRank
  unsigned iterations = 20; //!< PageRank: at most
  double tolerance = 0;     //!< PageRank: stop below this L1 change (0: all iterations)
  double max_l1 = 1e-4;     //!< PageRank: largest L1 distance to the CPU's ranks accepted
  unsigned threads = 0;     //!< CPU threads (0: all)
  std::string json_file;
  bool json_stdout = false;
  bool quiet = false;
};

//! Runs the algorithm; 0 when every result checked, 1 otherwise. Throws
//! `bam::error` for what prevents a run.
int run_algorithm(const run_options& o);

} // namespace bam::graph
