// SPDX-License-Identifier: MIT
// Power-law graphs in CSR: R-MAT (the Kronecker generator of Graph500, with
// its parameters a = 0.57, b = 0.19, c = 0.19 by default), node labels
// scrambled by a fixed bijection so that degree does not follow the id, self
// loops dropped, duplicate edges merged, undirected by default (both
// directions stored). The result depends on the seed only, never on the
// number of threads: every edge is drawn from a counter-based generator
// keyed by its index, and each row is sorted at the end.
//
// No edge list is kept: the edges are drawn twice, once to count degrees and
// once to place them, so memory is the CSR itself plus one counter per node.
#pragma once

#include "gnn_features.hpp"

#include <bam/error.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace bam::gnn {

struct rmat_options {
  std::uint64_t nodes = 1 << 16;
  double avg_degree = 16; //!< stored neighbours per node, before merging duplicates
  std::uint64_t seed = 1;
  bool undirected = true;              //!< store each edge in both rows
  double a = 0.57, b = 0.19, c = 0.19; //!< quadrant probabilities (d = 1 - a - b - c)
  unsigned threads = 0;                //!< 0: all cores
  //! Progress: (stage name, done, total), from the calling thread.
  std::function<void(const char*, std::uint64_t, std::uint64_t)> progress;
};

//! A graph in compressed sparse rows: the neighbours of node u are
//! indices[indptr[u] .. indptr[u + 1]), sorted ascending, no duplicates.
struct csr_graph {
  std::vector<std::int64_t> indptr; //!< nodes + 1 entries
  std::vector<std::int32_t> indices;
  std::uint64_t nodes() const { return indptr.empty() ? 0 : indptr.size() - 1; }
  std::uint64_t edges() const { return indices.size(); }
};

namespace detail {

[[noreturn]] inline void gnn_fail(const std::string& why, int errnum = EINVAL) {
  error_context c;
  c.errnum = errnum;
  throw error(why, c);
}

inline unsigned thread_count(unsigned want) {
  if (want != 0) return want;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : hw;
}

//! Runs f(begin, end) over [0, n) split among `threads` threads.
template <class F>
void parallel_ranges(std::uint64_t n, unsigned threads, F&& f) {
  threads = static_cast<unsigned>(std::min<std::uint64_t>(threads, std::max<std::uint64_t>(n, 1)));
  if (threads <= 1) {
    f(std::uint64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  std::exception_ptr failure;
  std::atomic<bool> failed{false};
  for (unsigned t = 0; t < threads; ++t) {
    const std::uint64_t lo = n * t / threads, hi = n * (t + 1) / threads;
    pool.emplace_back([&, lo, hi] {
      try {
        f(lo, hi);
      } catch (...) {
        if (!failed.exchange(true)) failure = std::current_exception();
      }
    });
  }
  for (auto& th : pool)
    th.join();
  if (failure) std::rethrow_exception(failure);
}

//! A bijection of [0, 2^bits) keyed by `key` (odd multiplications, xor-shifts, additions).
struct label_scrambler {
  unsigned bits;
  std::uint64_t mask, k1, k2, k3;
  label_scrambler(unsigned b, std::uint64_t key)
      : bits(b), mask(b >= 64 ? ~0ull : (1ull << b) - 1), k1(mix64(key) | 1), k2(mix64(key + 1)),
        k3(mix64(key + 2) | 1) {}
  std::uint64_t operator()(std::uint64_t x) const {
    const unsigned s1 = bits / 2 + 1, s2 = bits / 3 + 1;
    x = (x * k1) & mask;
    x ^= x >> s1;
    x = (x + k2) & mask;
    x = (x * k3) & mask;
    x ^= x >> s2;
    return x;
  }
};

} // namespace detail

//! Sorts each row of `g` and merges repeated neighbours, compacting the CSR.
inline void sort_and_merge_rows(csr_graph& g, unsigned threads) {
  const std::uint64_t n = g.nodes();
  std::vector<std::int64_t> kept(n);
  detail::parallel_ranges(n, threads, [&](std::uint64_t lo, std::uint64_t hi) {
    for (std::uint64_t u = lo; u < hi; ++u) {
      auto b = g.indices.begin() + g.indptr[u], e = g.indices.begin() + g.indptr[u + 1];
      std::sort(b, e);
      kept[u] = std::unique(b, e) - b;
    }
  });
  std::int64_t out = 0;
  for (std::uint64_t u = 0; u < n; ++u) {
    const std::int64_t from = g.indptr[u];
    g.indptr[u] = out;
    std::copy(g.indices.begin() + from, g.indices.begin() + from + kept[u], g.indices.begin() + out);
    out += kept[u];
  }
  g.indptr[n] = out;
  g.indices.resize(static_cast<std::size_t>(out));
  g.indices.shrink_to_fit();
}

//! The R-MAT graph of `o` in CSR.
inline csr_graph make_rmat(const rmat_options& o) {
  if (o.nodes < 2) detail::gnn_fail("a graph needs at least 2 nodes");
  if (o.nodes > static_cast<std::uint64_t>(INT32_MAX))
    detail::gnn_fail("more than 2^31 - 1 nodes: the CSR stores 32-bit neighbour ids");
  if (!(o.avg_degree > 0) || o.avg_degree > 1e6) detail::gnn_fail("average degree must be in (0, 1e6]");
  const double d = 1 - o.a - o.b - o.c;
  if (o.a <= 0 || o.b < 0 || o.c < 0 || d < 0)
    detail::gnn_fail("R-MAT probabilities a, b, c must be >= 0 with a > 0 and a + b + c <= 1");
  const unsigned threads = detail::thread_count(o.threads);
  unsigned scale = 1;
  while ((1ull << scale) < o.nodes)
    ++scale;
  const std::uint64_t n = o.nodes;
  const double stored = std::round(static_cast<double>(n) * o.avg_degree);
  const std::uint64_t draws = static_cast<std::uint64_t>(o.undirected ? std::ceil(stored / 2) : stored);
  const std::uint64_t stored_max = o.undirected ? 2 * draws : draws;
  if (stored_max > static_cast<std::uint64_t>(INT64_MAX / 2)) detail::gnn_fail("too many edges");
  const detail::label_scrambler scramble(scale, o.seed ^ 0x5eedull);
  const std::uint64_t ta = static_cast<std::uint64_t>(o.a * 18446744073709551615.0);
  const std::uint64_t tb = static_cast<std::uint64_t>((o.a + o.b) * 18446744073709551615.0);
  const std::uint64_t tc = static_cast<std::uint64_t>((o.a + o.b + o.c) * 18446744073709551615.0);

  // Edge e: quadrant choices from a counter-based stream; ids past the node
  // count are drawn again (further along the same stream); then labels are
  // scrambled, cycle-walking inside [0, n).
  auto edge = [&](std::uint64_t e, std::uint64_t& u, std::uint64_t& v) {
    std::uint64_t ctr = mix64(o.seed * 0x9e3779b97f4a7c15ull + e);
    for (;;) {
      u = v = 0;
      for (unsigned lvl = 0; lvl < scale; ++lvl) {
        const std::uint64_t r = mix64(ctr++);
        const unsigned q = r < ta ? 0u : r < tb ? 1u : r < tc ? 2u : 3u;
        u = u << 1 | (q >> 1);
        v = v << 1 | (q & 1);
      }
      if (u < n && v < n) break;
    }
    do
      u = scramble(u);
    while (u >= n);
    do
      v = scramble(v);
    while (v >= n);
  };

  auto report = [&](const char* stage, std::uint64_t done, std::uint64_t total) {
    if (o.progress) o.progress(stage, done, total);
  };
  // Pass 1: degrees.
  std::vector<std::uint32_t> deg(n, 0);
  std::atomic<std::uint64_t> drawn{0};
  const std::uint64_t chunk = 1 << 20;
  const std::uint64_t chunks = (draws + chunk - 1) / chunk;
  std::atomic<std::uint64_t> next_chunk{0};
  // Workers take chunks of edges; the calling thread reports progress.
  auto over_edges = [&](const char* stage, auto&& per_edge) {
    next_chunk = 0;
    drawn = 0;
    std::atomic<unsigned> running{threads};
    std::exception_ptr failure;
    std::atomic<bool> failed{false};
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&] {
        try {
          for (std::uint64_t k; !failed && (k = next_chunk.fetch_add(1)) < chunks;) {
            const std::uint64_t lo = k * chunk, hi = std::min(draws, lo + chunk);
            for (std::uint64_t e = lo; e < hi; ++e) {
              std::uint64_t u, v;
              edge(e, u, v);
              if (u == v) continue;
              per_edge(u, v);
              if (o.undirected) per_edge(v, u);
            }
            drawn.fetch_add(hi - lo);
          }
        } catch (...) {
          if (!failed.exchange(true)) failure = std::current_exception();
        }
        running.fetch_sub(1);
      });
    while (running.load() != 0) {
      report(stage, drawn.load(), draws);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (auto& th : pool)
      th.join();
    if (failure) std::rethrow_exception(failure);
    report(stage, draws, draws);
  };
  over_edges("counting degrees", [&](std::uint64_t u, std::uint64_t) {
    if (std::atomic_ref<std::uint32_t>(deg[u]).fetch_add(1, std::memory_order_relaxed) == UINT32_MAX)
      detail::gnn_fail("a node has more than 2^32 - 1 neighbours");
  });
  csr_graph g;
  g.indptr.assign(n + 1, 0);
  for (std::uint64_t u = 0; u < n; ++u)
    g.indptr[u + 1] = g.indptr[u] + deg[u];
  std::vector<std::int64_t> cursor(g.indptr.begin(), g.indptr.end() - 1);
  deg = {};
  g.indices.assign(static_cast<std::size_t>(g.indptr[n]), 0);
  // Pass 2: the same edges, placed.
  over_edges("placing edges", [&](std::uint64_t u, std::uint64_t v) {
    const std::int64_t at = std::atomic_ref<std::int64_t>(cursor[u]).fetch_add(1, std::memory_order_relaxed);
    g.indices[static_cast<std::size_t>(at)] = static_cast<std::int32_t>(v);
  });
  cursor = {};
  // Rows sorted, duplicates merged: the order edges were placed in is gone.
  sort_and_merge_rows(g, threads);
  report("sorting rows", n, n);
  return g;
}

//! Refuses (EINVAL, saying where) a CSR that is not one: indptr not starting
//! at 0 or decreasing, ending elsewhere than the number of indices, or a
//! neighbour id outside [0, nodes).
template <class I, class P>
void check_csr(const std::vector<P>& indptr, const std::vector<I>& indices, std::uint64_t nodes) {
  if (indptr.size() != nodes + 1)
    detail::gnn_fail("indptr has " + std::to_string(indptr.size()) +
                     " entries, not nodes + 1 = " + std::to_string(nodes + 1));
  if (indptr[0] != 0) detail::gnn_fail("indptr[0] is " + std::to_string(indptr[0]) + ", not 0");
  for (std::uint64_t u = 0; u < nodes; ++u)
    if (indptr[u + 1] < indptr[u]) detail::gnn_fail("indptr decreases at node " + std::to_string(u));
  if (static_cast<std::uint64_t>(indptr[nodes]) != indices.size())
    detail::gnn_fail("indptr ends at " + std::to_string(indptr[nodes]) + " but there are " +
                     std::to_string(indices.size()) + " neighbour ids");
  for (std::size_t i = 0; i < indices.size(); ++i)
    if (indices[i] < 0 || static_cast<std::uint64_t>(indices[i]) >= nodes)
      detail::gnn_fail("neighbour id " + std::to_string(indices[i]) + " at position " + std::to_string(i) +
                       " is outside [0, " + std::to_string(nodes) + ")");
}

} // namespace bam::gnn
