// SPDX-License-Identifier: MIT
// bam-graph's GPU algorithms on a small R-MAT graph: BFS (direction-
// optimizing, and top-down only), connected
// components and PageRank over the graph through bam's page cache (pinned
// host RAM served by the GPU engine, a cache smaller than the edges, both
// ways of reading neighbours, pages of 512 B to 16 KiB, the offsets in GPU
// memory or through the cache, two controllers striped) and in GPU memory, each checked against
// the CPU (graph_cpu.hpp).
#include "graph_kernels.cuh"
#include "graph_storage.cuh"

#include "graph_cpu.hpp"
#include "gnn_test_util.hpp"

#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include <fstream>

#include <string>
#include <vector>

namespace {

using namespace bam::graph;

struct small_graph {
  csr_graph g;
  manifest m;
  std::uint32_t root = 0; //!< a BFS root with edges (R-MAT leaves many nodes without any)
  small_graph() {
    bam::gnn::rmat_options o;
    o.nodes = 1 << 14;
    o.avg_degree = 16;
    o.seed = 7;
    g = bam::gnn::make_rmat(o);
    m.nodes = g.nodes();
    m.edges = g.edges();
    root = pick_roots(g, 1, 1).at(0);
  }
};

const small_graph& graph() {
  static const small_graph s;
  return s;
}

struct results {
  std::vector<std::uint32_t> parents, labels;
  std::vector<std::uint32_t> top_down_parents; //!< BFS with every level top-down
  bfs_figures bfs, top_down;
  std::vector<double> ranks;
  std::uint64_t visits = 0;
};

template <class V>
results run_all(V v, work_buffers& w, cudaStream_t s) {
  results r;
  const std::uint64_t n = graph().m.nodes;
  r.top_down = bfs_gpu(v, graph().root, w, s, false);
  r.top_down_parents.resize(n);
  bam::copy_to_host(r.top_down_parents.data(), w.a.get(), n, s);
  r.bfs = bfs_gpu(v, graph().root, w, s); // direction-optimizing
  r.parents.resize(n);
  bam::copy_to_host(r.parents.data(), w.a.get(), n, s);
  cc_gpu(v, w, s);
  r.labels.resize(n);
  bam::copy_to_host(r.labels.data(), w.a.get(), n, s);
  pagerank_gpu(v, 0.85, 20, 0, w, s);
  std::vector<float> f(n);
  bam::copy_to_host(f.data(), w.r0.get(), n, s);
  r.ranks.assign(f.begin(), f.end());
  r.visits = w.page_visits(s); // pages the three algorithms visited (a running count)
  return r;
}

void check_against_cpu(const results& r) {
  const csr_graph& g = graph().g;
  const check_result b = validate_bfs(g, graph().root, r.parents);
  INFO(b.why);
  CHECK(b.ok);
  CHECK(b.reached > g.nodes() / 2);
  // The graph's large levels ran bottom-up, the others top-down.
  CHECK(r.bfs.bottom_up_levels >= 1);
  CHECK(r.bfs.bottom_up_levels < r.bfs.levels);
  const check_result t = validate_bfs(g, graph().root, r.top_down_parents);
  INFO(t.why);
  CHECK(t.ok);
  CHECK(t.reached == b.reached);
  CHECK(r.top_down.bottom_up_levels == 0);
  CHECK(r.top_down.levels == r.bfs.levels);
  const check_result c = same_partition(r.labels, cc_cpu(g));
  INFO(c.why);
  CHECK(c.ok);
  CHECK(r.labels == cc_cpu(g)); // both: the smallest node id of each component
  CHECK(l1_distance(r.ranks, pagerank_cpu(g, {})) < 1e-4);
}

//! The algorithms through the cache over `device`, warps bringing in
//! `ahead` pages at once before reading a window of lists (0: none).
void through_cache(const std::string& device, std::uint32_t page_size, bool offsets_in_cache, bool reader,
                   unsigned ahead, unsigned heads = 0) {
  const small_graph& sg = graph();
  graph_location l = choose_device(device, sg.m);
  bam::storage s(l.spec);
  bam::gnn::cuda_stream stream;
  prepare_medium(l, s, sg.m, sg.g, page_size);
  bam::device_buffer<std::uint64_t> d_off(sg.m.nodes + 1);
  bam::copy_to_device(d_off.get(), reinterpret_cast<const std::uint64_t*>(sg.g.indptr.data()), sg.m.nodes + 1);
  work_buffers w(sg.m.nodes, true);
  // A cache of a quarter of the edges (at least one set of 8 pages): pages are evicted and read again.
  const std::uint64_t cache_bytes = std::max<std::uint64_t>(sg.m.image().edges_bytes() / 4, 8ull * page_size);
  cached_graph cg(s, l, sg.m, cache_bytes, page_size, offsets_in_cache, stream.s);
  const unsigned shift = cg.edge_page_shift();
  const look_ahead_settings settings{ahead, static_cast<float>(sg.m.nodes) /
                                                static_cast<float>((cg.edges.size() >> shift) + 1)};
  const std::vector<std::uint32_t> h = list_heads(sg.g, heads);
  bam::device_buffer<std::uint32_t> d_heads(std::max<std::size_t>(h.size(), 1));
  if (!h.empty()) bam::copy_to_device(d_heads.get(), h.data(), h.size());
  results r;
  auto with_heads = [&](auto v) {
    v.heads = d_heads.get();
    v.head_k = heads;
    return v;
  };
  auto go = [&](auto edges) {
    if (offsets_in_cache)
      r = run_all(with_heads(graph_view<bam_reader_source<std::uint64_t>, decltype(edges)>{
                      sg.m.nodes, {cg.offsets->ref(), shift - 1}, edges}),
                  w, stream.s);
    else
      r = run_all(
          with_heads(graph_view<pointer_source<std::uint64_t>, decltype(edges)>{sg.m.nodes, {d_off.get()}, edges}), w,
          stream.s);
  };
  if (reader)
    go(bam_reader_source<std::uint32_t>{cg.edges.ref(), shift, settings});
  else
    go(bam_copy_source<std::uint32_t>{cg.edges.ref(), shift, settings});
  REQUIRE_NOTHROW(cg.check(stream.s));
  CHECK(r.visits > 0);
  CHECK(cg.cache.counters(stream.s).misses > sg.m.image().edges_bytes() / page_size); // more than one pass of misses
  check_against_cpu(r);
}

} // namespace

TEST_CASE("graph: BFS, CC and PageRank through the cache (copy_to) match the CPU", "[graph][gpu]") {
  SECTION("without look-ahead") { through_cache("emu-gpu:ram=16M", 4096, false, false, 0); }
  // 32 pages per warp in a cache of a quarter of the edges: windows evict each other's pages.
  SECTION("32 pages of look-ahead") { through_cache("emu-gpu:ram=16M", 4096, false, false, 32); }
}

TEST_CASE("graph: the same with a reader, 512-byte pages and the offsets through the cache", "[graph][gpu]") {
  through_cache("emu-gpu:ram=16M", 512, true, true, 8);
}

TEST_CASE("graph: the same over two controllers, pages striped, 16 KiB pages", "[graph][gpu]") {
  through_cache("emu-gpu:ram=16M,ssds=2", 16384, false, false, 4);
}

TEST_CASE("graph: the same with the first neighbours of every node in GPU memory (--heads)", "[graph][gpu]") {
  // Fewer heads than CC samples, as many, and more (lists shorter than the heads too).
  SECTION("1 head") { through_cache("emu-gpu:ram=16M", 4096, false, false, 16, 1); }
  SECTION("2 heads") { through_cache("emu-gpu:ram=16M", 4096, false, false, 16, 2); }
  SECTION("5 heads, a reader, offsets through the cache") { through_cache("emu-gpu:ram=16M", 512, true, true, 8, 5); }
  SECTION("32 heads") { through_cache("emu-gpu:ram=16M", 4096, false, false, 0, 32); }
}

TEST_CASE("graph: list_heads holds each node's first neighbours, no_node past a shorter list", "[graph][gpu]") {
  const csr_graph& g = graph().g;
  const std::vector<std::uint32_t> h = list_heads(g, 3);
  REQUIRE(h.size() == g.nodes() * 3);
  std::uint64_t short_lists = 0;
  for (std::uint64_t v = 0; v < g.nodes(); ++v) {
    const auto d = static_cast<std::uint64_t>(g.indptr[v + 1] - g.indptr[v]);
    short_lists += d < 3;
    for (std::uint64_t j = 0; j < 3; ++j)
      REQUIRE(h[v * 3 + j] == (j < d ? static_cast<std::uint32_t>(g.indices[g.indptr[v] + j]) : no_node));
  }
  CHECK(short_lists > 0);
}

__global__ void prefetch_spans_kernel(bam::array_ref<std::uint32_t> a, unsigned shift, unsigned ahead,
                                      unsigned pages_each, unsigned stride) {
  const std::uint64_t lane = threadIdx.x;
  const std::uint64_t b = (lane * stride) << shift; // lane l: pages [l stride, l stride + pages_each)
  // lanes 30 and 31 name empty ranges
  const std::uint64_t e = lane >= 30 ? b : b + (std::uint64_t{pages_each} << shift);
  prefetch_spans(a, shift, ahead, b, e);
}

TEST_CASE("graph: a look-ahead brings in each distinct page of the lanes' ranges once, up to its limit",
          "[graph][gpu]") {
  bam::storage s("emu-gpu:ram=16M");
  bam::gnn::cuda_stream stream;
  const auto misses = [&](unsigned ahead, unsigned pages_each, unsigned stride) {
    bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20}); // 256 pages
    bam::array<std::uint32_t> a(cache, s, 4u << 20, 0, stream.s);
    prefetch_spans_kernel<<<1, 32, 0, stream.s>>>(a.ref(), 10, ahead, pages_each, stride);
    BAM_CUDA_TRY(cudaGetLastError());
    BAM_CUDA_TRY(cudaStreamSynchronize(stream.s));
    a.check(stream.s);
    return cache.counters(stream.s).misses;
  };
  CHECK(misses(32, 1, 1) == 30);   // 30 lanes, a page each
  CHECK(misses(32, 2, 1) == 31);   // overlapping: pages 0 .. 30
  CHECK(misses(32, 2, 3) == 32);   // disjoint, 60 pages: the first 32
  CHECK(misses(8, 2, 3) == 8);     // the limit
  CHECK(misses(32, 40, 40) == 32); // lane 0's range alone is longer than the limit
  CHECK(misses(32, 1, 0) == 1);    // every lane on page 0
}

TEST_CASE("graph: BFS, CC and PageRank on the graph in GPU memory match the CPU", "[graph][gpu]") {
  const small_graph& sg = graph();
  bam::gnn::cuda_stream stream;
  bam::device_buffer<std::uint64_t> d_off(sg.m.nodes + 1);
  bam::device_buffer<std::uint32_t> d_edges(sg.m.edges);
  bam::copy_to_device(d_off.get(), reinterpret_cast<const std::uint64_t*>(sg.g.indptr.data()), sg.m.nodes + 1);
  bam::copy_to_device(d_edges.get(), reinterpret_cast<const std::uint32_t*>(sg.g.indices.data()), sg.m.edges);
  work_buffers w(sg.m.nodes, true);
  using plain = graph_view<pointer_source<std::uint64_t>, pointer_source<std::uint32_t>>;
  const results r = run_all(plain{sg.m.nodes, {d_off.get()}, {d_edges.get()}}, w, stream.s);
  CHECK(r.visits == 0);
  check_against_cpu(r);
}

TEST_CASE("bam-graph bfs, cc and pagerank on a GPU: each run checked, the report written as JSON", "[graph][gpu]") {
  bam_gnn_test::temp_dir t;
  auto r = bam_gnn_test::bam_gnn("-q make " + (t / "g") + " --scale 12 --degree 8");
  INFO(r.out);
  REQUIRE(r.status == 0);
  for (const std::string run : {"bfs", "cc", "pagerank", "bfs --heads 2", "cc --heads 3"}) {
    const std::string algo = run.substr(0, run.find(' '));
    const bool heads = run.find("--heads") != std::string::npos;
    const std::string out = t / (algo + (heads ? "-heads" : "") + ".json");
    r = bam_gnn_test::bam_gnn(run + " " + (t / "g") + " --cache-mib " + (heads ? "2" : "1") + " --runs 2 --json " +
                              out);
    INFO(algo << ": " << r.out);
    REQUIRE(r.status == 0);
    std::ifstream f(out);
    const nlohmann::json j = nlohmann::json::parse(f);
    CHECK(j.at("benchmark").get<std::string>() == "bam-graph " + algo);
    CHECK(j.at("all_checks_passed").get<bool>());
    CHECK(j.at("gpu").get<std::string>().size() > 0);
    REQUIRE(j.at("paths").size() >= 2);
    CHECK(j.at("paths").at(0).at("path").get<std::string>() == "bam");
    if (heads) {
      // The heads come out of --cache-mib; zero-copy runs behind them too.
      CHECK(j.at("heads").at("bytes").get<std::uint64_t>() == 4096ull * (algo == "bfs" ? 2 : 3) * 4);
      CHECK(j.at("cache_bytes").get<std::uint64_t>() + j.at("heads").at("bytes").get<std::uint64_t>() == 2ull << 20);
      bool behind_heads = false;
      for (const auto& p : j.at("paths"))
        behind_heads = behind_heads || (p.at("path") == "zero-copy-heads" && p.at("ran").get<bool>());
      CHECK(behind_heads);
    }
    for (const auto& p : j.at("paths")) {
      if (!p.at("ran").get<bool>()) continue;
      INFO(p.at("path").get<std::string>());
      CHECK(p.at("checked_runs").get<std::size_t>() == p.at("seconds").size());
      CHECK(p.at("failed_runs").get<unsigned>() == 0);
    }
  }
  // Null media move no data: PageRank's pages do not depend on the edges'
  // values, so an unchecked PageRank without baselines runs there (its
  // refusals are in the CPU tests).
  const std::string out = t / "null.json";
  r = bam_gnn_test::bam_gnn("pagerank " + (t / "g") +
                            " --device emu-gpu:null=64M --no-validate --no-baselines --cache-mib 1 --json " + out);
  INFO(r.out);
  REQUIRE(r.status == 0);
  {
    std::ifstream f(out);
    const nlohmann::json j = nlohmann::json::parse(f);
    CHECK(j.at("validated").get<bool>() == false);
    const auto& bam = j.at("paths").at(0);
    CHECK(bam.at("path").get<std::string>() == "bam");
    CHECK(bam.at("cache_misses").get<std::uint64_t>() > 0);
    CHECK(bam.at("misses_per_s").get<double>() > 0);
  }
}
