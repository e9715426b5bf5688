// SPDX-License-Identifier: MIT
// The CPU side of `bam-graph`'s algorithms, on an undirected graph in CSR
// (graph_dataset.hpp): multi-threaded (OpenMP) implementations of the same
// algorithm families as the GPU kernels, which are both the CPU baseline and
// the reference the GPU results are checked against, and the validators:
//
//   bfs_cpu        level-synchronous top-down BFS: a parent per node
//   cc_cpu         Afforest (sampled neighbours hooked, the largest component
//                  skipped, the rest hooked, compressed): each node's label
//                  is the smallest node id of its component
//   pagerank_cpu   pull-based PageRank, dangling mass spread evenly
//   validate_bfs   Graph500's checks of a BFS tree
//   same_partition two labellings name the same components
//
// No CUDA here: the tests build it with g++ alone.
#pragma once

#include "../gnn/rmat.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace bam::graph {

using gnn::csr_graph;

//! A node no BFS reached (its parent), or no node.
inline constexpr std::uint32_t no_node = 0xffffffffu;

//! Parents of a BFS from `root` (root's is root; unreached: no_node).
std::vector<std::uint32_t> bfs_cpu(const csr_graph& g, std::uint32_t root);

//! Component labels: the smallest node id of each node's component.
std::vector<std::uint32_t> cc_cpu(const csr_graph& g);

struct pagerank_options {
  double damping = 0.85;
  unsigned max_iterations = 20;
  double tolerance = 0; //!< stop once the L1 change of an iteration is below it (0: run max_iterations)
};

//! PageRank (sums to 1); `iterations` receives the iterations run.
std::vector<double> pagerank_cpu(const csr_graph& g, const pagerank_options& o, unsigned* iterations = nullptr);

struct check_result {
  bool ok = true;
  std::string why;                   //!< the first fault, naming a node
  std::uint64_t reached = 0;         //!< BFS: nodes in the tree
  std::uint64_t component_edges = 0; //!< BFS: stored edges (both directions) of the reached nodes
};

//! Graph500's validation of BFS parents from `root`: the root is its own
//! parent; the parents form a tree (every chain ends at the root); each
//! parent edge is an edge of the graph; along every edge of the graph the
//! tree levels differ by at most one, and no edge joins a reached node to an
//! unreached one (so every node reachable from the root was reached).
check_result validate_bfs(const csr_graph& g, std::uint32_t root, const std::vector<std::uint32_t>& parent);

//! `a` and `b` (labels in [0, nodes)) split the nodes into the same sets.
check_result same_partition(const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b);

//! Sum of |a[i] - b[i]|.
double l1_distance(const std::vector<double>& a, const std::vector<double>& b);

//! `count` BFS roots with at least one neighbour, drawn from `seed` (the
//! same for every path of a run).
std::vector<std::uint32_t> pick_roots(const csr_graph& g, unsigned count, std::uint64_t seed);

//! The first `k` neighbours of every node, node after node (`k` per node;
//! `no_node` past the end of a shorter list): what `--heads` keeps in GPU
//! memory.
std::vector<std::uint32_t> list_heads(const csr_graph& g, unsigned k);

//! Threads OpenMP runs the CPU algorithms with (1 in a build without OpenMP).
unsigned cpu_threads();
//! Sets that number (0: leave it).
void set_cpu_threads(unsigned threads);

} // namespace bam::graph
