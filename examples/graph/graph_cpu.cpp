// SPDX-License-Identifier: MIT
// The CPU algorithms and validators of bam-graph (graph_cpu.hpp).
#include "graph_cpu.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace bam::graph {

namespace {

std::uint64_t deg(const csr_graph& g, std::uint64_t u) {
  return static_cast<std::uint64_t>(g.indptr[u + 1] - g.indptr[u]);
}

std::uint32_t load(std::vector<std::uint32_t>& a, std::uint64_t i) {
  return std::atomic_ref<std::uint32_t>(a[i]).load(std::memory_order_relaxed);
}

//! Afforest's hook: joins the trees of u and v, the larger root under the smaller.
void link(std::vector<std::uint32_t>& comp, std::uint32_t u, std::uint32_t v) {
  std::uint32_t p1 = load(comp, u), p2 = load(comp, v);
  while (p1 != p2) {
    const std::uint32_t high = std::max(p1, p2), low = std::min(p1, p2);
    std::uint32_t p_high = load(comp, high);
    if (p_high == low) break;
    if (p_high == high &&
        std::atomic_ref<std::uint32_t>(comp[high]).compare_exchange_strong(p_high, low, std::memory_order_relaxed))
      break;
    p1 = load(comp, load(comp, high));
    p2 = load(comp, low);
  }
}

void compress(std::vector<std::uint32_t>& comp) {
  const auto n = static_cast<std::int64_t>(comp.size());
#pragma omp parallel for schedule(static)
  for (std::int64_t v = 0; v < n; ++v)
    while (load(comp, comp[v]) != comp[v])
      comp[v] = load(comp, comp[v]);
}

} // namespace

unsigned cpu_threads() {
#if defined(_OPENMP)
  return static_cast<unsigned>(omp_get_max_threads());
#else
  return 1;
#endif
}

void set_cpu_threads(unsigned threads) {
#if defined(_OPENMP)
  if (threads != 0) omp_set_num_threads(static_cast<int>(threads));
#else
  (void)threads;
#endif
}

std::vector<std::uint32_t> bfs_cpu(const csr_graph& g, std::uint32_t root) {
  std::vector<std::uint32_t> parent(g.nodes(), no_node);
  parent.at(root) = root;
  std::vector<std::uint32_t> frontier{root}, next;
  while (!frontier.empty()) {
    next.clear();
#pragma omp parallel
    {
      std::vector<std::uint32_t> mine;
#pragma omp for schedule(dynamic, 64) nowait
      for (std::int64_t i = 0; i < static_cast<std::int64_t>(frontier.size()); ++i) {
        const std::uint32_t v = frontier[static_cast<std::size_t>(i)];
        for (std::int64_t e = g.indptr[v]; e < g.indptr[v + 1]; ++e) {
          const auto u = static_cast<std::uint32_t>(g.indices[static_cast<std::size_t>(e)]);
          std::uint32_t none = no_node;
          if (load(parent, u) == no_node &&
              std::atomic_ref<std::uint32_t>(parent[u]).compare_exchange_strong(none, v, std::memory_order_relaxed))
            mine.push_back(u);
        }
      }
#pragma omp critical
      next.insert(next.end(), mine.begin(), mine.end());
    }
    frontier.swap(next);
  }
  return parent;
}

std::vector<std::uint32_t> cc_cpu(const csr_graph& g) {
  const auto n = static_cast<std::int64_t>(g.nodes());
  std::vector<std::uint32_t> comp(g.nodes());
  for (std::int64_t v = 0; v < n; ++v)
    comp[static_cast<std::size_t>(v)] = static_cast<std::uint32_t>(v);
  constexpr unsigned rounds = 2;
  for (unsigned r = 0; r < rounds; ++r) {
#pragma omp parallel for schedule(dynamic, 1024)
    for (std::int64_t v = 0; v < n; ++v)
      if (deg(g, static_cast<std::uint64_t>(v)) > r)
        link(comp, static_cast<std::uint32_t>(v),
             static_cast<std::uint32_t>(g.indices[static_cast<std::size_t>(g.indptr[v] + r)]));
    compress(comp);
  }
  // The most frequent label of a sample: the giant component, whose nodes skip the rest of their edges.
  std::mt19937_64 rng(n);
  std::vector<std::uint32_t> sample(1024);
  for (auto& s : sample)
    s = comp[rng() % static_cast<std::uint64_t>(n)];
  std::sort(sample.begin(), sample.end());
  std::uint32_t giant = sample[0];
  std::size_t best = 0;
  for (std::size_t i = 0, j; i < sample.size(); i = j) {
    for (j = i; j < sample.size() && sample[j] == sample[i]; ++j) {
    }
    if (j - i > best) best = j - i, giant = sample[i];
  }
#pragma omp parallel for schedule(dynamic, 1024)
  for (std::int64_t v = 0; v < n; ++v) {
    if (load(comp, static_cast<std::uint64_t>(v)) == giant) continue;
    for (std::int64_t e = g.indptr[v] + rounds; e < g.indptr[v + 1]; ++e)
      link(comp, static_cast<std::uint32_t>(v), static_cast<std::uint32_t>(g.indices[static_cast<std::size_t>(e)]));
  }
  compress(comp);
  return comp;
}

std::vector<double> pagerank_cpu(const csr_graph& g, const pagerank_options& o, unsigned* iterations) {
  const auto n = static_cast<std::int64_t>(g.nodes());
  const double dn = static_cast<double>(n);
  std::vector<double> rank(g.nodes(), 1.0 / dn), next(g.nodes()), contrib(g.nodes());
  unsigned it = 0;
  while (it < o.max_iterations) {
    ++it;
    double dangling = 0;
#pragma omp parallel for reduction(+ : dangling)
    for (std::int64_t v = 0; v < n; ++v) {
      const std::uint64_t d = deg(g, static_cast<std::uint64_t>(v));
      contrib[v] = d ? rank[v] / static_cast<double>(d) : 0;
      if (d == 0) dangling += rank[v];
    }
    const double base = (1 - o.damping) / dn + o.damping * dangling / dn;
    double change = 0;
#pragma omp parallel for schedule(dynamic, 1024) reduction(+ : change)
    for (std::int64_t v = 0; v < n; ++v) {
      double sum = 0;
      for (std::int64_t e = g.indptr[v]; e < g.indptr[v + 1]; ++e)
        sum += contrib[static_cast<std::size_t>(g.indices[static_cast<std::size_t>(e)])];
      next[v] = base + o.damping * sum;
      change += std::fabs(next[v] - rank[v]);
    }
    rank.swap(next);
    if (o.tolerance > 0 && change < o.tolerance) break;
  }
  if (iterations != nullptr) *iterations = it;
  return rank;
}

check_result validate_bfs(const csr_graph& g, std::uint32_t root, const std::vector<std::uint32_t>& parent) {
  check_result r;
  const std::uint64_t n = g.nodes();
  auto fail = [&](const std::string& why) {
    r.ok = false;
    r.why = why;
    return r;
  };
  if (parent.size() != n) return fail(std::to_string(parent.size()) + " parents for " + std::to_string(n) + " nodes");
  if (root >= n || parent[root] != root) return fail("the root " + std::to_string(root) + " is not its own parent");
  // Levels from the parent chains (each chain walked once: a node's level is
  // set when its chain is), refusing chains that do not end at the root.
  constexpr std::uint32_t unknown = no_node;
  std::vector<std::uint32_t> level(n, unknown), chain;
  level[root] = 0;
  for (std::uint64_t v = 0; v < n; ++v) {
    if (parent[v] == no_node || level[v] != unknown) continue;
    chain.clear();
    std::uint64_t u = v;
    while (level[u] == unknown) {
      if (parent[u] >= n)
        return fail("node " + std::to_string(u) + " has parent " + std::to_string(parent[u]) +
                    ", not a node or an unreached one on a reached chain");
      chain.push_back(static_cast<std::uint32_t>(u));
      if (chain.size() > n) return fail("the parent chain of node " + std::to_string(v) + " is a cycle");
      u = parent[u];
    }
    for (std::size_t k = chain.size(); k-- > 0;)
      level[chain[k]] = level[parent[chain[k]]] + 1;
  }
  std::atomic<std::uint64_t> bad{no_node};
  std::uint64_t reached = 0, edges = 0;
#pragma omp parallel for schedule(dynamic, 1024) reduction(+ : reached, edges)
  for (std::int64_t iv = 0; iv < static_cast<std::int64_t>(n); ++iv) {
    const auto v = static_cast<std::uint64_t>(iv);
    const auto b = g.indices.begin() + g.indptr[v], e = g.indices.begin() + g.indptr[v + 1];
    if (level[v] != unknown) {
      ++reached;
      edges += static_cast<std::uint64_t>(e - b);
      if (v != root && !std::binary_search(b, e, static_cast<std::int32_t>(parent[v]))) bad.store(v);
    }
    for (auto it = b; it != e; ++it) {
      const auto u = static_cast<std::uint64_t>(*it);
      if ((level[v] == unknown) != (level[u] == unknown) ||
          (level[v] != unknown && (level[v] > level[u] + 1 || level[u] > level[v] + 1)))
        bad.store(v);
    }
  }
  if (const std::uint64_t v = bad.load(); v != no_node) {
    if (level[v] != unknown && v != root &&
        !std::binary_search(g.indices.begin() + g.indptr[v], g.indices.begin() + g.indptr[v + 1],
                            static_cast<std::int32_t>(parent[v])))
      return fail("node " + std::to_string(v) + " has parent " + std::to_string(parent[v]) +
                  ", which is not one of its neighbours");
    return fail("an edge of node " + std::to_string(v) + (level[v] == unknown ? " (unreached)" : "") +
                " joins it to a node more than one level away or " +
                (level[v] == unknown ? "reached: the BFS missed it" : "unreached: the BFS missed that one"));
  }
  r.reached = reached;
  r.component_edges = edges;
  return r;
}

check_result same_partition(const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b) {
  check_result r;
  if (a.size() != b.size()) {
    r.ok = false;
    r.why = std::to_string(a.size()) + " labels against " + std::to_string(b.size());
    return r;
  }
  const std::uint64_t n = a.size();
  std::vector<std::uint32_t> a_to_b(n, no_node), b_to_a(n, no_node);
  for (std::uint64_t v = 0; v < n; ++v) {
    if (a[v] >= n || b[v] >= n) {
      r.ok = false;
      r.why = "node " + std::to_string(v) + " has label " + std::to_string(std::max(a[v], b[v])) + ", not a node id";
      return r;
    }
    std::uint32_t& x = a_to_b[a[v]];
    std::uint32_t& y = b_to_a[b[v]];
    if (x == no_node) x = b[v];
    if (y == no_node) y = a[v];
    if (x != b[v] || y != a[v]) {
      r.ok = false;
      r.why = "node " + std::to_string(v) + " is in component " + std::to_string(a[v]) + " here and " +
              std::to_string(b[v]) + " in the reference, which split or merge those components differently";
      return r;
    }
  }
  for (std::uint64_t c = 0; c < n; ++c)
    r.reached += a_to_b[c] != no_node; // the number of components
  return r;
}

double l1_distance(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    s += std::fabs(a[i] - b[i]);
  return a.size() == b.size() ? s : INFINITY;
}

std::vector<std::uint32_t> pick_roots(const csr_graph& g, unsigned count, std::uint64_t seed) {
  std::vector<std::uint32_t> roots;
  std::mt19937_64 rng(seed);
  const std::uint64_t n = g.nodes();
  for (std::uint64_t tries = 0; roots.size() < count && tries < 64ull * count + n; ++tries) {
    const auto v = static_cast<std::uint32_t>(rng() % n);
    if (deg(g, v) > 0) roots.push_back(v);
  }
  if (roots.empty()) gnn::detail::gnn_fail("the graph has no edges: no BFS root to start from");
  return roots;
}

std::vector<std::uint32_t> list_heads(const csr_graph& g, unsigned k) {
  const auto n = static_cast<std::int64_t>(g.nodes());
  std::vector<std::uint32_t> heads(static_cast<std::size_t>(n) * k);
#pragma omp parallel for schedule(static)
  for (std::int64_t v = 0; v < n; ++v) {
    const std::uint64_t d = deg(g, static_cast<std::uint64_t>(v));
    for (unsigned j = 0; j < k; ++j)
      heads[static_cast<std::size_t>(v) * k + j] =
          j < d ? static_cast<std::uint32_t>(g.indices[static_cast<std::size_t>(g.indptr[v]) + j]) : no_node;
  }
  return heads;
}

} // namespace bam::graph
