// SPDX-License-Identifier: MIT
// `bam-graph bfs|cc|pagerank`: the algorithm over the graph read through
// bam's page cache, and, in the same run over the same graph and roots, its
// baselines: the graph in GPU memory (the upper bound, when it fits),
// zero-copy from pinned host memory (the GPU reading the graph over PCIe,
// the BaM paper's baseline) and CPU threads (OpenMP). Every run's result is
// checked: BFS parents as Graph500 validates them, CC labels as a partition
// against the CPU's, PageRank within an L1 distance of the CPU's ranks.
#include "graph_kernels.cuh"
#include "graph_storage.cuh"

#include "graph_cpu.hpp"
#include "graph_run.hpp"

#include "../../benchmarks/gnn/aggregate_report.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>

namespace bam::graph {

namespace {

using json = nlohmann::ordered_json;

//! One way of running the algorithm, and how it went.
struct path_result {
  std::string path; //!< bam, gpu-memory, zero-copy, cpu
  std::string what;
  bool ran = false;
  std::string why_not;
  std::vector<double> seconds; //!< per run
  std::uint64_t edges = 0;     //!< the runs' work in edges (see edge_measure)
  std::uint64_t checked = 0, failed = 0;
  std::string first_failure;
  std::uint64_t misses = 0, page_visits = 0; //!< bam: pages loaded, pages touched
  unsigned look_ahead = 0;                   //!< bam: pages a warp brought in at once
  double total() const {
    double t = 0;
    for (const double s : seconds)
      t += s;
    return t;
  }
  double edges_per_s() const { return total() > 0 ? static_cast<double>(edges) / total() : 0; }
};

//! What the edge rate counts, by algorithm.
const char* edge_measure(const std::string& algo) {
  if (algo == "bfs") return "TEPS: undirected edges of the root's component per second (Graph500)";
  if (algo == "cc") return "undirected edges of the graph per second";
  return "stored edges (both directions) times iterations per second";
}

//! A run's result, on the host.
struct outcome {
  double seconds = 0;
  std::vector<std::uint32_t> labels; //!< BFS parents or CC labels
  std::vector<double> ranks;
  unsigned steps = 0; //!< BFS levels, PageRank iterations
};

class runner {
public:
  runner(const run_options& o, const manifest& m, const csr_graph& g) : o_(o), m_(m), g_(g) {
    if (o.algorithm == "bfs") {
      roots_ = o.root >= 0 ? std::vector<std::uint32_t>(o.runs, static_cast<std::uint32_t>(o.root))
                           : pick_roots(g, o.runs, o.seed);
      if (o.root >= static_cast<std::int64_t>(m.nodes))
        gnn_fail("--root " + std::to_string(o.root) + ": the graph has " + std::to_string(m.nodes) + " nodes");
      component_edges_.resize(roots_.size());
    }
  }

  const std::vector<std::uint32_t>& roots() const { return roots_; }

  //! The CPU's result (the reference for CC and PageRank) and its time.
  outcome cpu_run(unsigned run) {
    outcome r;
    const auto t0 = gnn::clock_type::now();
    if (o_.algorithm == "bfs") {
      r.labels = bfs_cpu(g_, roots_[run]);
    } else if (o_.algorithm == "cc") {
      r.labels = cc_cpu(g_);
    } else {
      r.ranks = pagerank_cpu(g_, {o_.damping, o_.iterations, o_.tolerance}, &r.steps);
    }
    r.seconds = gnn::seconds_since(t0);
    return r;
  }

  //! Checks run `run`'s result into `p`, adding its edges.
  void check(path_result& p, unsigned run, const outcome& r) {
    p.seconds.push_back(r.seconds);
    check_result c;
    if (o_.algorithm == "bfs") {
      if (o_.validate || component_edges_[run] == 0) c = validate_bfs(g_, roots_[run], r.labels);
      if (c.ok && c.component_edges != 0) component_edges_[run] = c.component_edges;
      p.edges += component_edges_[run] / 2;
    } else if (o_.algorithm == "cc") {
      if (o_.validate) c = same_partition(r.labels, reference().labels);
      p.edges += m_.edges / 2;
    } else {
      if (o_.validate) {
        const double d = l1_distance(r.ranks, reference().ranks);
        c.ok = d <= o_.max_l1;
        char buf[160];
        std::snprintf(buf, sizeof buf, "L1 distance %.3g to the CPU's ranks, above --max-l1 %.3g", d, o_.max_l1);
        c.why = buf;
      }
      p.edges += m_.edges * r.steps;
    }
    if (!o_.validate) return;
    ++p.checked;
    if (!c.ok && p.failed++ == 0) p.first_failure = "run " + std::to_string(run) + ": " + c.why;
  }

  //! The CPU's result for CC and PageRank, computed once (and its time, the CPU baseline's).
  const outcome& reference() {
    if (!reference_) reference_ = cpu_run(0);
    return *reference_;
  }

  //! Runs the algorithm on the GPU over view `v`; the result to the host.
  template <class V>
  outcome gpu_run(V v, unsigned run, work_buffers& w, cudaStream_t s) {
    outcome r;
    BAM_CUDA_TRY(cudaMemsetAsync(w.visits.get(), 0, sizeof(unsigned long long), s));
    gnn::cuda_event start, stop;
    BAM_CUDA_TRY(cudaEventRecord(start.e, s));
    if (o_.algorithm == "bfs") {
      r.steps = bfs_gpu(v, roots_[run], w, s, o_.bottom_up).levels;
    } else if (o_.algorithm == "cc") {
      cc_gpu(v, w, s);
    } else {
      r.steps = pagerank_gpu(v, o_.damping, o_.iterations, o_.tolerance, w, s).iterations;
    }
    BAM_CUDA_TRY(cudaEventRecord(stop.e, s));
    BAM_CUDA_TRY(cudaEventSynchronize(stop.e));
    r.seconds = gnn::elapsed_s(start, stop);
    if (o_.algorithm == "pagerank") {
      std::vector<float> f(m_.nodes);
      copy_to_host(f.data(), w.r0.get(), f.size(), s);
      r.ranks.assign(f.begin(), f.end());
    } else {
      r.labels.resize(m_.nodes);
      copy_to_host(r.labels.data(), w.a.get(), r.labels.size(), s);
    }
    return r;
  }

private:
  const run_options& o_;
  const manifest& m_;
  const csr_graph& g_;
  std::vector<std::uint32_t> roots_;
  std::vector<std::uint64_t> component_edges_;
  std::optional<outcome> reference_;
};

//! The look-ahead of reads through the cache: `requested` when >= 0, else
//! as many pages per warp (up to 32) as leave half the cache to pages not
//! brought in ahead while every warp `kernel` keeps resident on the GPU
//! holds its window; 0 below 2 pages.
template <class Kernel>
unsigned look_ahead_pages(int requested, std::uint64_t cache_pages, Kernel kernel) {
  if (requested >= 0) return static_cast<unsigned>(std::min(requested, 32));
  int dev = 0, sms = 0, blocks = 0;
  BAM_CUDA_TRY(cudaGetDevice(&dev));
  BAM_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  BAM_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, gnn::block_threads, 0));
  const std::uint64_t warps = std::uint64_t(std::max(blocks, 1)) * sms * warps_per_block;
  const std::uint64_t ahead = std::min<std::uint64_t>(cache_pages / (2 * warps), 32);
  return ahead < 2 ? 0 : static_cast<unsigned>(ahead);
}

//! The edges array through the cache, read as `access` says, with the offsets
//! in GPU memory (`d_off`) or through the cache too: fn(view).
template <class Fn>
void with_cached_view(const run_options& o, cached_graph& cg, std::uint64_t nodes, const std::uint64_t* d_off,
                      const std::uint32_t* d_heads, Fn&& fn) {
  const unsigned shift = cg.edge_page_shift();
  const std::uint64_t edge_pages = std::max<std::uint64_t>(cg.edges.size() >> shift, 1);
  auto with_offsets = [&](auto edges) {
    edges.ahead.nodes_per_page = static_cast<float>(nodes) / static_cast<float>(edge_pages);
    auto go = [&](auto view) {
      view.edg.ahead.ahead = look_ahead_pages(o.look_ahead, cg.cache.slot_count(), bfs_expand<decltype(view)>);
      view.heads = d_heads;
      view.head_k = d_heads != nullptr ? o.heads : 0;
      fn(view);
    };
    if (cg.offsets)
      go(graph_view<bam_reader_source<std::uint64_t>, decltype(edges)>{nodes, {cg.offsets->ref(), shift - 1}, edges});
    else
      go(graph_view<pointer_source<std::uint64_t>, decltype(edges)>{nodes, {d_off}, edges});
  };
  if (o.access == "reader")
    with_offsets(bam_reader_source<std::uint32_t>{cg.edges.ref(), shift});
  else
    with_offsets(bam_copy_source<std::uint32_t>{cg.edges.ref(), shift});
}

json gpu_json() {
  int dev = 0, driver = 0;
  cudaDeviceProp prop{};
  BAM_CUDA_TRY(cudaGetDevice(&dev));
  BAM_CUDA_TRY(cudaGetDeviceProperties(&prop, dev));
  BAM_CUDA_TRY(cudaDriverGetVersion(&driver));
  return {{"gpu", prop.name}, {"driver", driver}, {"cuda_runtime", CUDART_VERSION}};
}

json path_json(const path_result& p, double zero_copy_rate, bool bfs) {
  json j{{"path", p.path}, {"what", p.what}, {"ran", p.ran}};
  if (!p.ran) {
    j["skipped"] = p.why_not;
    return j;
  }
  j["seconds"] = p.seconds;
  j["total_seconds"] = p.total();
  j["edges"] = p.edges;
  j[bfs ? "teps" : "edges_per_s"] = p.edges_per_s();
  j["ratio_to_zero_copy"] = zero_copy_rate > 0 ? json(p.edges_per_s() / zero_copy_rate) : json(nullptr);
  j["checked_runs"] = p.checked;
  j["failed_runs"] = p.failed;
  if (p.failed) j["first_failure"] = p.first_failure;
  if (p.path == "bam") {
    j["cache_misses"] = p.misses;
    j["page_visits"] = p.page_visits;
    j["hit_rate"] =
        p.page_visits ? json(1 - static_cast<double>(p.misses) / static_cast<double>(p.page_visits)) : json(nullptr);
    j["misses_per_s"] = p.total() > 0 ? static_cast<double>(p.misses) / p.total() : 0.0;
    j["look_ahead_pages"] = p.look_ahead;
  }
  return j;
}

void print_table(const run_options& o, const std::vector<path_result>& paths, double zero_copy_rate) {
  const bool bfs = o.algorithm == "bfs";
  std::printf("\n%-15s %12s %14s %10s %9s %12s  %s\n", "path", "s per run", bfs ? "GTEPS" : "G edges/s", "vs 0-copy",
              "hit rate", "misses/s", "checked");
  for (const auto& p : paths) {
    if (!p.ran) {
      std::printf("%-15s %12s %14s %10s %9s %12s  skipped: %s\n", p.path.c_str(), "-", "-", "-", "-", "-",
                  p.why_not.c_str());
      continue;
    }
    char hit[32] = "-", mps[32] = "-", ratio[32] = "-";
    if (p.path == "bam" && p.page_visits)
      std::snprintf(hit, sizeof hit, "%.1f%%",
                    100 * (1 - static_cast<double>(p.misses) / static_cast<double>(p.page_visits)));
    if (p.path == "bam" && p.total() > 0)
      std::snprintf(mps, sizeof mps, "%.3gM", static_cast<double>(p.misses) / p.total() / 1e6);
    if (zero_copy_rate > 0) std::snprintf(ratio, sizeof ratio, "%.2fx", p.edges_per_s() / zero_copy_rate);
    const std::string checked = !o.validate ? "not checked"
                                : p.failed  ? "FAILED " + p.first_failure
                                            : std::to_string(p.checked) + " run(s) OK";
    std::printf("%-15s %12.4f %14.3f %10s %9s %12s  %s\n", p.path.c_str(), p.total() / double(p.seconds.size()),
                p.edges_per_s() / 1e9, ratio, hit, mps, checked.c_str());
  }
  std::printf("(%s; vs 0-copy: the rate over zero-copy's; hit rate: 1 - pages loaded / pages touched; bam's "
              "look-ahead: %u pages per warp)\n",
              edge_measure(o.algorithm), paths.empty() ? 0u : paths.front().look_ahead);
}

} // namespace

int run_algorithm(const run_options& o0) {
  run_options o = o0;
  if (o.algorithm != "bfs" && o.algorithm != "cc" && o.algorithm != "pagerank")
    gnn_fail("unknown algorithm " + o.algorithm + " (bfs, cc, pagerank)");
  if (o.access != "copy" && o.access != "reader") gnn_fail("--access " + o.access + ": copy or reader");
  if (o.offsets != "gpu" && o.offsets != "cache") gnn_fail("--offsets " + o.offsets + ": gpu or cache");
  if (o.page_size < 512 || o.page_size > (64u << 10) || (o.page_size & (o.page_size - 1)) != 0)
    gnn_fail("--page-size " + std::to_string(o.page_size) + ": a power of two from 512 to 65536");
  if (o.cache_mib == 0) gnn_fail("--cache-mib must be at least 1");
  if (o.heads > 32) gnn_fail("--heads " + std::to_string(o.heads) + ": 0 to 32 neighbours per node");
  if (o.heads != 0 && o.algorithm == "pagerank")
    gnn_fail("--heads serves bfs and cc (pagerank reads every list whole)");
  if (o.runs == 0) o.runs = o.algorithm == "pagerank" ? 1 : 4;
  const manifest m = read_manifest(o.dir);
  // Null media move no data: only a run whose pages do not depend on the
  // edges' values, and that nothing compares with runs on the real edges.
  const bool pattern_only =
      o.algorithm == "pagerank" && !o.validate && !o.baselines && o.offsets == "gpu" && o.tolerance == 0;
  graph_location where = choose_device(o.device, m, pattern_only);
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    (void)cudaGetLastError();
    gnn_fail("bam-graph " + o.algorithm + " needs an NVIDIA GPU: none is visible here", ENODEV);
  }
  if (o.threads != 0) set_cpu_threads(o.threads);
  const bool talk = !o.json_stdout && !o.quiet;

  const csr_graph g = read_graph(o.dir, m);
  // The heads take their GPU memory out of the cache's.
  const std::uint64_t heads_bytes = m.nodes * o.heads * sizeof(std::uint32_t);
  if (heads_bytes != 0 && heads_bytes + (1ull << 20) > (o.cache_mib << 20))
    gnn_fail("--heads " + std::to_string(o.heads) + ": " + std::to_string(heads_bytes >> 20) +
             " MiB of heads leave no page cache in --cache-mib " + std::to_string(o.cache_mib));
  const std::uint64_t cache_bytes = (o.cache_mib << 20) - heads_bytes;
  runner run(o, m, g);
  storage s(where.spec);
  gnn::cuda_stream stream;
  const cudaStream_t st = stream.s;
  {
    // The arrays are attached once before the medium is filled: a graph
    // that does not fit the storage is refused here.
    cached_graph probe(s, where, m, 1 << 20, o.page_size, o.offsets == "cache", st);
  }
  prepare_medium(where, s, m, g, o.page_size);
  if (talk)
    std::printf("%s: %llu nodes, %llu edges (%.2f GiB of edge ids); %s on %s (%s)\n"
                "page cache %llu MiB of %u-byte pages%s, neighbours read by %s, offsets %s; %u run(s)%s\n",
                o.dir.c_str(), static_cast<unsigned long long>(m.nodes), static_cast<unsigned long long>(m.edges / 2),
                static_cast<double>(m.image().edges_bytes()) / (1ull << 30), o.algorithm.c_str(), where.device.c_str(),
                where.placement.c_str(), static_cast<unsigned long long>(cache_bytes >> 20), o.page_size,
                o.heads != 0 ? (" and " + std::to_string(heads_bytes >> 20) + " MiB of heads (the first " +
                                std::to_string(o.heads) + " neighbours of every node in GPU memory)")
                                   .c_str()
                             : "",
                o.access == "copy" ? "copy_to (a warp, through shared memory)" : "a reader (warp-strided)",
                o.offsets == "gpu" ? "in GPU memory" : "through the cache", o.runs,
                o.algorithm == "bfs" ? ", a root each" : "");
  std::fflush(stdout);

  device_buffer<std::uint64_t> d_off(m.nodes + 1);
  copy_to_device(d_off.get(), reinterpret_cast<const std::uint64_t*>(g.indptr.data()), m.nodes + 1);
  work_buffers w(m.nodes, o.algorithm == "pagerank");
  std::vector<path_result> paths;
  device_buffer<std::uint32_t> d_heads;
  double heads_seconds = 0;
  if (o.heads != 0) {
    const auto t0 = gnn::clock_type::now();
    const std::vector<std::uint32_t> h = list_heads(g, o.heads);
    d_heads = device_buffer<std::uint32_t>(h.size());
    copy_to_device(d_heads.get(), h.data(), h.size());
    heads_seconds = gnn::seconds_since(t0);
  }

  // bam: a cold cache each run.
  path_result bam{"bam", "the edges through bam's page cache from " + where.device + " (" + s.transport_name() + ")"};
  bam.ran = true;
  for (unsigned r = 0; r < o.runs; ++r) {
    cached_graph cg(s, where, m, cache_bytes, o.page_size, o.offsets == "cache", st);
    outcome out;
    with_cached_view(o, cg, m.nodes, d_off.get(), d_heads.get(), [&](auto v) {
      bam.look_ahead = v.edg.ahead.ahead;
      out = run.gpu_run(v, r, w, st);
    });
    cg.check(st);
    bam.misses += cg.cache.counters(st).misses;
    bam.page_visits += w.page_visits(st);
    run.check(bam, r, out);
    if (talk) std::printf("  bam run %u: %.4f s%s\n", r, out.seconds, bam.failed ? " (check FAILED)" : "");
  }
  paths.push_back(std::move(bam));

  if (o.baselines) {
    using plain = graph_view<pointer_source<std::uint64_t>, pointer_source<std::uint32_t>>;
    path_result gpu{"gpu-memory", "the graph in GPU memory (the upper bound)"};
    std::size_t free_b = 0, total_b = 0;
    BAM_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    if (m.image().edges_bytes() + (256ull << 20) > free_b) {
      gpu.why_not = "the edges (" + std::to_string(m.image().edges_bytes() >> 20) + " MiB) do not fit the " +
                    std::to_string(free_b >> 20) + " MiB of free GPU memory";
    } else {
      gpu.ran = true;
      device_buffer<std::uint32_t> d_edges(m.edges);
      copy_to_device(d_edges.get(), reinterpret_cast<const std::uint32_t*>(g.indices.data()), m.edges);
      for (unsigned r = 0; r < o.runs; ++r)
        run.check(gpu, r, run.gpu_run(plain{m.nodes, {d_off.get()}, {d_edges.get()}}, r, w, st));
    }
    paths.push_back(std::move(gpu));

    path_result zero{"zero-copy", "the edges in pinned host memory, read by the GPU over PCIe (zero-copy)"};
    zero.ran = true;
    // With --heads: the same heads in GPU memory in front of zero-copy, what they alone are worth.
    path_result zh{"zero-copy-heads",
                   "zero-copy behind the same heads in GPU memory (" + std::to_string(heads_bytes >> 20) + " MiB)"};
    {
      pinned_buffer<std::uint32_t> h_edges(m.edges);
      std::memcpy(h_edges.get(), g.indices.data(), m.image().edges_bytes());
      plain v{m.nodes, {d_off.get()}, {h_edges.get()}};
      for (unsigned r = 0; r < o.runs; ++r)
        run.check(zero, r, run.gpu_run(v, r, w, st));
      v.heads = d_heads.get();
      v.head_k = o.heads;
      zh.ran = o.heads != 0;
      for (unsigned r = 0; zh.ran && r < o.runs; ++r)
        run.check(zh, r, run.gpu_run(v, r, w, st));
    }
    paths.push_back(std::move(zero));
    if (zh.ran) paths.push_back(std::move(zh));

    path_result cpu{"cpu", "CPU threads (OpenMP, " + std::to_string(cpu_threads()) + "), the same algorithm family"};
    cpu.ran = true;
    if (o.algorithm == "bfs") {
      for (unsigned r = 0; r < o.runs; ++r)
        run.check(cpu, r, run.cpu_run(r));
    } else {
      run.check(cpu, 0, run.reference());
    }
    paths.push_back(std::move(cpu));
  }

  double zero_rate = 0;
  for (const auto& p : paths)
    if (p.path == "zero-copy" && p.ran) zero_rate = p.edges_per_s();
  bool ok = true;
  for (const auto& p : paths)
    ok = ok && p.failed == 0;
  if (!o.json_stdout) print_table(o, paths, zero_rate);

  if (!o.json_file.empty() || o.json_stdout) {
    json j;
    j["benchmark"] = "bam-graph " + o.algorithm;
    const json gpu = gpu_json(); // a named copy: items() refers to it
    for (const auto& [k, v] : gpu.items())
      j[k] = v;
    j["commit"] = gnn::commit_id();
    j["date"] = gnn::utc_now();
    j["graph"] = {{"directory", std::filesystem::absolute(o.dir).string()},
                  {"nodes", m.nodes},
                  {"edges_stored", m.edges},
                  {"edges_undirected", m.edges / 2},
                  {"edge_bytes", m.image().edges_bytes()},
                  {"source", m.source}};
    if (m.source == "rmat") j["graph"]["rmat"] = {{"scale", m.scale}, {"degree", m.degree}, {"seed", m.seed}};
    j["device"] = where.device;
    j["transport"] = s.transport_name();
    j["placement"] = where.placement;
    if (where.in_process) j["load_seconds"] = where.load_seconds;
    j["page_size"] = o.page_size;
    j["cache_bytes"] = cache_bytes;
    j["cache_to_edges"] = static_cast<double>(cache_bytes) / static_cast<double>(m.image().edges_bytes());
    j["heads"] = {{"per_node", o.heads}, {"bytes", heads_bytes}, {"build_seconds", heads_seconds}};
    j["gpu_memory_for_edges"] = o.cache_mib << 20; // bam's: the cache and the heads
    j["access"] = o.access;
    j["offsets"] = o.offsets;
    j["runs"] = o.runs;
    if (o.algorithm == "bfs") {
      j["roots"] = run.roots();
      j["bfs_direction"] = o.bottom_up ? "direction-optimizing" : "top-down";
    }
    if (o.algorithm == "pagerank")
      j["pagerank"] = {
          {"damping", o.damping}, {"iterations", o.iterations}, {"tolerance", o.tolerance}, {"max_l1", o.max_l1}};
    j["rate"] = edge_measure(o.algorithm);
    j["validated"] = o.validate;
    j["all_checks_passed"] = ok;
    json ps = json::array();
    for (const auto& p : paths)
      ps.push_back(path_json(p, zero_rate, o.algorithm == "bfs"));
    j["paths"] = ps;
    if (!o.json_file.empty()) {
      std::ofstream f(o.json_file);
      f << j.dump(2) << "\n";
      if (!f) throw_errno("writing " + o.json_file);
    }
    if (o.json_stdout) std::cout << j.dump(2) << std::endl;
  }
  if (!ok) std::fprintf(stderr, "bam-graph %s: a result failed its check (see above)\n", o.algorithm.c_str());
  return ok ? 0 : 1;
}

} // namespace bam::graph
