// SPDX-License-Identifier: MIT
// bam-gnn aggregate: GraphSAGE-style mini-batches on the GPU over a dataset's
// CSR, with the feature rows read from storage through bam's page cache.
//
// Per mini-batch, on a CUDA stream of its own:
//   1. sampling (gnn_sampling.cuh): `--batch-size` seed nodes, then
//      fanout[l] neighbours of every node of hop l; each hop's set sorted
//      and de-duplicated, the last one holding every node of the batch;
//   2. gathering: the feature row of every node of the last hop's set
//      through `bam::gather_rows`, the batch's cached pages held from its
//      sampling to its gather (`bam::row_holds`, --lookahead) so that the
//      batches in flight before it do not evict them;
//   3. aggregation (gnn_mean_aggregation.cuh): from the last hop inwards,
//      each node's representation is the mean of its own and the mean of
//      its sampled neighbours'.
// `--in-flight N` batches run at once: while one gathers, the next samples.
// The gathered rows of the first batches are compared with the generator
// (or the feature file); a difference ends the run with exit status 1.
//
// `--gpus N` runs this on GPUs 0 .. N-1 at once, a host thread each over a
// storage of its own on one shared medium, with a cache per GPU or one cache
// spread over the GPUs (--node-cache); GPU g runs the batches g, g + N, ...
// With --processes each GPU has a process of its own (the first starts the
// others), and --node-cache is one cache shared by the processes.
//
// Where the features live is gnn_feature_store.cuh's; the report, and the
// same gathers by other paths (--compare), benchmarks/gnn's.
#include "gnn_aggregate.hpp"
#include "gnn_cuda.cuh"
#include "gnn_feature_store.cuh"
#include "gnn_mean_aggregation.cuh"
#include "gnn_sampling.cuh"

#include "../../benchmarks/gnn/aggregate_bench.cuh"
#include "../../benchmarks/detail/process_run.hpp"
#include "../../benchmarks/gnn/aggregate_report.hpp"

#include <bam/bam.cuh>
#include <bam/runtime/row_gather.cuh>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace bam::gnn {

//! aggregate_figures as JSON: how a process of a --processes run hands its
//! figures to the first.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(aggregate_figures, device, transport, placement, in_process, load_seconds,
                                   cache_bytes, fanouts, seconds, sampling_seconds, gathering_seconds,
                                   aggregation_seconds, first_batch_seconds, rows, hop_nodes, page_visits, pages_loaded,
                                   held_pages, hot_set, hot_in_gpu, cache_bytes_by_gpu, hot_rows, hot_bytes,
                                   hot_fill_seconds, hot_row_visits, verified_rows, verified_batches)

namespace {

//! What one mini-batch in flight owns: its stream, its buffers, its events
//! and its look-ahead holds. Sized for the largest batch the fanouts allow.
template <class T>
struct batch_slot {
  batch_slot(const neighbour_sampler& sampler, const std::vector<std::uint32_t>& fanouts, std::uint32_t dim,
             array<T>& feats, bool lookahead)
      : sample(sampler.make_batch()), rows(sampler.capacity()[sampler.hops()] * dim),
        mean(make_mean_buffers(sampler.capacity(), fanouts, dim)),
        holds(lookahead ? std::make_unique<row_holds<T>>(feats) : nullptr) {}

  sampled_batch sample;                      // its node sets, hop by hop
  device_buffer<T> rows;                     // the feature rows of its last hop's nodes
  mean_buffers mean;                         // its aggregation
  pinned_buffer<unsigned long long> held{1}; // the pages its look-ahead holds kept
  cuda_stream stream;                        // its gather and aggregation
  cuda_stream sampling{true};                // its sampling, ahead of the other batches' gathers
  cuda_event start, sampled, gathered, aggregated;
  std::unique_ptr<row_holds<T>> holds; // null: --no-lookahead
  std::uint64_t batch = 0;
};

//! What every batch uses.
template <class T>
struct batch_pipeline {
  const neighbour_sampler& sampler;
  const std::vector<std::uint32_t>& fanouts;
  std::uint32_t dim;
  array<T>& feats;             // the feature table, through the page cache
  const hot_rows<T>* hot;      // null: no hot set
  unsigned long long* missing; // GPU counter: nodes missing from a next hop's set
  // --gpus N: GPU g samples batches g, g + N, g + 2N, ... (the batches one
  // GPU would run, dealt out), and counts the misses of its own kernels.
  std::uint64_t batch_stride = 1, batch_offset = 0;
  int counter_device = -1; // -1: the cache's every GPU (a cache of this GPU alone)

  //! The sampler's number of this GPU's `b`-th batch.
  std::uint64_t sampled_batch(std::uint64_t b) const { return b * batch_stride + batch_offset; }
  page_cache_counters counters(const page_cache& cache, cudaStream_t st) const {
    return counter_device < 0 ? cache.counters(st) : cache.counters(counter_device, st);
  }
};

//! Starts batch `b` in slot `sl` (whose batch before is finished): the
//! sampling (the host waits for each hop's count) on the slot's urgent
//! stream, so that its small kernels do not queue behind the blocks of the
//! other batches' gathers; then, without waiting, the look-ahead holds, the
//! gather through the cache and the aggregation on the slot's stream. The
//! other slots' batches run meanwhile.
template <class T>
void start_batch(const batch_pipeline<T>& p, batch_slot<T>& sl, std::uint64_t b) {
  const cudaStream_t st = sl.stream.s;
  const std::uint32_t hops = p.sampler.hops();
  sl.batch = b;
  BAM_CUDA_TRY(cudaEventRecord(sl.start.e, sl.sampling.s));
  p.sampler.sample(sl.sample, p.sampled_batch(b), sl.sampling.s);
  BAM_CUDA_TRY(cudaEventRecord(sl.sampled.e, sl.sampling.s));
  BAM_CUDA_TRY(cudaStreamWaitEvent(st, sl.sampled.e, 0));
  const std::uint64_t* ids = sl.sample.nodes[hops].get();
  const std::uint64_t nids = sl.sample.count[hops];
  if (sl.holds) {
    // The pages of this batch's rows that are in the cache now stay there
    // while the batches before it (other streams) and its own gather miss.
    sl.holds->hold(ids, nids, p.dim, st);
    sl.holds->held_to(sl.held.get(), st);
  }
  if (p.hot)
    bam::gather_rows(p.feats, ids, nids, p.dim, sl.rows.get(), *p.hot, st);
  else
    bam::gather_rows(p.feats, ids, nids, p.dim, sl.rows.get(), st);
  if (sl.holds) sl.holds->release(st);
  BAM_CUDA_TRY(cudaEventRecord(sl.gathered.e, st));
  mean_aggregate(sl.sample, sl.rows.get(), p.fanouts, p.dim, sl.mean, p.missing, st);
  BAM_CUDA_TRY(cudaEventRecord(sl.aggregated.e, st));
}

//! The timed loop over the batches: batch b goes into slot b % in_flight
//! once the batch there before it (b - in_flight) is finished. Sums the
//! figures, checks the first batches, keeps the batches' ids for --compare.
template <class T>
class batch_loop {
public:
  batch_loop(const aggregate_options& o, const manifest& m, const batch_pipeline<T>& p, page_cache& cache,
             const std::vector<bool>& is_hot, aggregate_figures& f, cudaStream_t stream)
      : o_(o), m_(m), p_(p), cache_(cache), is_hot_(is_hot), f_(f), stream_(stream),
        before_(p.counters(cache, stream)) {
    f_.hop_nodes.assign(p.sampler.hops() + 1, 0);
    BAM_CUDA_TRY(cudaEventRecord(origin_.e, stream));
    progress_t0_ = clock_type::now();
  }

  //! Runs every batch; false when a gathered row or the sampling was wrong
  //! (said on stderr).
  bool run(std::vector<std::unique_ptr<batch_slot<T>>>& slots) {
    const auto t0 = clock_type::now();
    const std::uint64_t in_flight = slots.size();
    bool ok = true;
    for (std::uint64_t b = 0; b < o_.batches + in_flight && ok; ++b) {
      batch_slot<T>& sl = *slots[b % in_flight];
      if (b >= in_flight && !finish_batch(sl)) ok = false;
      if (b < o_.batches && ok) start_batch(p_, sl, b);
    }
    if (!ok) {
      BAM_CUDA_LOG(cudaDeviceSynchronize());
      return false;
    }
    f_.seconds = seconds_since(t0) - unclocked_;
    f_.gathering_seconds = interval_union_ms(gather_spans_) / 1e3;
    unsigned long long missing = 0;
    copy_to_host(&missing, p_.missing, 1, stream_);
    if (missing != 0) {
      std::fprintf(stderr, "bam-gnn aggregate: %llu sampled nodes were missing from the next hop's set\n", missing);
      return false;
    }
    f_.pages_loaded = p_.counters(cache_, stream_).misses - before_.misses;
    return true;
  }

  //! The rows each batch gathered (kept with --compare).
  const std::vector<std::vector<std::uint64_t>>& batch_ids() const { return batch_ids_; }
  //! Batch 0's expected rows (kept with --compare).
  const std::vector<unsigned char>& batch0_rows() const { return batch0_rows_; }

private:
  //! Waits for the batch in `sl`, takes its figures, checks it when asked.
  //! Returns false on a wrong row.
  bool finish_batch(batch_slot<T>& sl) {
    const cudaStream_t st = sl.stream.s;
    const std::uint64_t b = sl.batch;
    p_.feats.check(st); // waits for the stream; a bad id or a failed read throws here
    take_figures(sl);
    if (b < o_.verify_batches || (o_.compare && b == 0)) {
      // Not timed: the other batches in flight end first, and nothing runs
      // on the GPU while the host checks.
      BAM_CUDA_TRY(cudaDeviceSynchronize());
      const auto t0 = clock_type::now();
      if (!verify_batch(sl)) return false;
      unclocked_ += seconds_since(t0);
    }
    if (o_.compare) batch_ids_.push_back(ids_);
    if (o_.progress_every != 0 && (b + 1) % o_.progress_every == 0 && b + 1 < o_.batches && !o_.quiet)
      print_progress(b, st);
    return true;
  }

  //! The stage times of the batch in `sl` (done), its nodes, and the cache
  //! pages its rows visit (the hit rate's denominator). Leaves its ids in `ids_`.
  void take_figures(batch_slot<T>& sl) {
    const std::uint32_t hops = p_.sampler.hops();
    if (sl.batch == 0) f_.first_batch_seconds = elapsed_s(sl.start, sl.aggregated);
    f_.sampling_seconds += elapsed_s(sl.start, sl.sampled);
    f_.aggregation_seconds += elapsed_s(sl.gathered, sl.aggregated);
    // Gathers of batches in flight together overlap: the gather stage's
    // time is the union of their intervals.
    gather_spans_.emplace_back(ms_from_origin(sl.sampled), ms_from_origin(sl.gathered));
    if (sl.holds) f_.held_pages += *sl.held.get();
    f_.rows += sl.sample.count[hops];
    for (std::uint32_t l = 0; l <= hops; ++l)
      f_.hop_nodes[l] += sl.sample.count[l];
    ids_.resize(sl.sample.count[hops]);
    copy_to_host(ids_.data(), sl.sample.nodes[hops].get(), ids_.size(), sl.stream.s);
    const std::uint64_t rb = m_.features.row_bytes();
    for (const std::uint64_t id : ids_) {
      if (p_.hot && is_hot_[id]) {
        ++f_.hot_row_visits; // read from host memory: no page visited
        continue;
      }
      f_.page_visits += row_pages(id, rb, o_.page_size);
    }
  }

  //! The rows the batch in `sl` gathered (ids in `ids_`) against the
  //! generator or the feature file, and batch 0's aggregation against the
  //! host's. False on a wrong row (a wrong aggregation throws).
  bool verify_batch(batch_slot<T>& sl) {
    const cudaStream_t st = sl.stream.s;
    const std::uint64_t rb = m_.features.row_bytes();
    std::vector<unsigned char> got(ids_.size() * rb), want(ids_.size() * rb);
    copy_to_host(reinterpret_cast<T*>(got.data()), sl.rows.get(), ids_.size() * p_.dim, st);
    reference_rows(o_.dir, m_, ids_.data(), ids_.size(), want.data());
    const std::int64_t bad = first_wrong_row(got.data(), want.data(), ids_.size(), rb);
    if (bad >= 0) {
      std::fprintf(stderr,
                   "bam-gnn aggregate: batch %llu: the row of node %llu gathered through the "
                   "page cache differs from the %s\n",
                   static_cast<unsigned long long>(p_.sampled_batch(sl.batch)),
                   static_cast<unsigned long long>(ids_[static_cast<std::size_t>(bad)]),
                   m_.features.source == "generated" ? "generator" : "feature file");
      return false;
    }
    f_.verified_rows += ids_.size();
    ++f_.verified_batches;
    if (sl.batch == 0) {
      check_mean_aggregation<T>(sl.sample, sl.mean, p_.fanouts, p_.dim, want, st);
      batch0_rows_ = std::move(want);
    }
    return true;
  }

  void print_progress(std::uint64_t b, cudaStream_t st) {
    const page_cache_counters now = p_.counters(cache_, st);
    const double t = seconds_since(progress_t0_) - unclocked_;
    std::fprintf(stderr,
                 "  batch %llu/%llu: %.1f batches/s, %.2f M nodes/s, %.2f GB/s, hit rate %.1f%% "
                 "(%.0f s)\n",
                 static_cast<unsigned long long>(b + 1), static_cast<unsigned long long>(o_.batches),
                 static_cast<double>(b + 1) / t, static_cast<double>(f_.rows) / t / 1e6,
                 static_cast<double>(f_.rows * m_.features.row_bytes()) / t / 1e9,
                 f_.page_visits ? 100.0 * (1.0 - static_cast<double>(now.misses - before_.misses) /
                                                     static_cast<double>(f_.page_visits))
                                : 0.0,
                 seconds_since(progress_t0_));
  }

  double ms_from_origin(const cuda_event& e) const { return 1e3 * elapsed_s(origin_, e); }

  const aggregate_options& o_;
  const manifest& m_;
  const batch_pipeline<T>& p_;
  page_cache& cache_;
  const std::vector<bool>& is_hot_;
  aggregate_figures& f_;
  cudaStream_t stream_; // the first slot's: the run's end is read on it
  page_cache_counters before_;
  cuda_event origin_; // the gathers' intervals are measured from it (ms)
  std::vector<std::pair<double, double>> gather_spans_;
  clock_type::time_point progress_t0_;
  double unclocked_ = 0; // seconds the checks took, taken out of the figures
  std::vector<std::uint64_t> ids_;
  std::vector<std::vector<std::uint64_t>> batch_ids_;
  std::vector<unsigned char> batch0_rows_;
};

//! The graph's CSR, read on the host (the hot set ranks its nodes by in-degree).
struct host_csr {
  std::vector<std::int64_t> indptr;
  std::vector<std::int32_t> indices;
};

host_csr read_csr(const std::filesystem::path& dir, const manifest& m) {
  host_csr g;
  g.indptr = detail::read_int_npy((dir / m.indptr_file).string());
  const std::string ipath = (dir / m.indices_file).string();
  const npy_header ih = npy_read_header(ipath);
  if (ih.dtype != "<i4") detail::gnn_fail(ipath + ": dtype " + ih.dtype + ", the dataset format stores int32");
  g.indices.resize(ih.elements());
  npy_read(ipath, ih, 0, g.indices.size(), g.indices.data());
  check_csr(g.indptr, g.indices, m.nodes);
  return g;
}

//! The hot set (--hot-percent): the rows of the highest in-degree, read
//! once through the cache into pinned host memory or (--hot-memory gpu)
//! this GPU's memory, where the gather reads them instead of the cache.
//! Marks them in `is_hot`.
template <class T>
std::optional<hot_rows<T>> make_hot_set(const aggregate_options& o, const manifest& m,
                                        const std::vector<std::int32_t>& indices, array<T>& feats,
                                        std::vector<bool>& is_hot, aggregate_figures& f) {
  if (o.hot_percent <= 0) return std::nullopt;
  const auto t0 = clock_type::now();
  const auto k = static_cast<std::uint64_t>(static_cast<double>(m.nodes) * o.hot_percent / 100.0 + 0.5);
  const std::vector<std::uint64_t> hot_ids = hottest_nodes(indices, m.nodes, k);
  std::optional<hot_rows<T>> hot(std::in_place, feats, m.features.dim, hot_ids, cuda::stream_ref{},
                                 o.hot_in_gpu ? hot_memory::gpu : hot_memory::host);
  is_hot.assign(m.nodes, false);
  for (const std::uint64_t id : hot_ids)
    is_hot[id] = true;
  f.hot_set = true;
  f.hot_in_gpu = o.hot_in_gpu;
  f.hot_rows = hot->size();
  f.hot_bytes = hot->bytes();
  f.hot_fill_seconds = seconds_since(t0);
  if (!o.json_stdout)
    std::printf("hot set: %llu rows (%.1f MiB of %s, the highest in-degree), read through the cache in %.2f s\n",
                static_cast<unsigned long long>(f.hot_rows), static_cast<double>(f.hot_bytes) / (1 << 20),
                o.hot_in_gpu ? "GPU memory" : "pinned host memory", f.hot_fill_seconds);
  return hot;
}

//! Refuses (ENOMEM) `--in-flight` slots that may not fit the free GPU memory.
void check_gpu_memory(const aggregate_options& o, const std::vector<std::uint32_t>& fanouts,
                      const std::vector<std::uint64_t>& cap, std::uint64_t row_bytes, std::uint32_t dim) {
  std::size_t free_b = 0, total_b = 0;
  BAM_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
  // Per slot: the rows, the sort's candidates twice, and per hop its nodes,
  // representations, samples and positions.
  std::uint64_t need = cap[fanouts.size()] * row_bytes + 2 * candidate_capacity(o.batch_size, cap, fanouts) * 8;
  for (std::size_t l = 0; l < fanouts.size(); ++l)
    need += cap[l] * (8 + 4ull * dim + 12ull * fanouts[l] + 4);
  need *= o.in_flight;
  if (need > free_b)
    detail::gnn_fail("a batch of " + std::to_string(o.batch_size) + " seeds with fanouts " + o.fanouts + ", " +
                         std::to_string(o.in_flight) + " in flight, may need " + std::to_string(need >> 20) +
                         " MiB of GPU memory, " + std::to_string(free_b >> 20) +
                         " MiB are free: lower --batch-size, --in-flight or the fanouts",
                     ENOMEM);
}

//! One GPU's share of a run, built with that GPU current: the graph on it,
//! a storage opened there, the feature array (through the cache spread over
//! the run's GPUs, or through a cache of its own), the sampler and the
//! batches in flight. A run on one GPU is one of these.
template <class T>
class gpu_run {
public:
  //! `shared`: the cache spread over every GPU of the run (null: a cache
  //! of this GPU alone, or with a `group` name this process's part of the
  //! cache of the run's processes). GPU `gpu` of `gpus` runs the batches
  //! gpu, gpu + gpus, ... of the sampler. `before_cache` (if any) runs once
  //! the storage is open, before the cache is made (the processes of a run
  //! meet there, so that none waits in the cache group for one that failed).
  gpu_run(const aggregate_options& o, const manifest& m, const host_csr& graph, const table_source& src,
          feature_location where, page_cache* shared, int gpu, int gpus, const std::string& group = {},
          const std::function<void()>& before_cache = {})
      : o_(o), m_(m), graph_(graph), src_(src), where_(std::move(where)), gpu_(gpu), gpus_(gpus),
        fanouts_(parse_fanouts(o.fanouts)), csr_(upload_csr(graph.indptr, graph.indices)), s_(where_.spec) {
    if (gpu != 0) o_.progress_every = 0; // the first GPU's progress stands for the run's
    // The array is attached before the medium is filled: a table that does
    // not fit the storage is refused there.
    locate_feature_table(where_, s_, o, m, src);
    if (before_cache) before_cache();
    if (shared == nullptr) {
      page_cache_config cfg{.page_size = o.page_size, .capacity = static_cast<std::size_t>(o.cache_mib) << 20};
      if (!group.empty()) { // the group's cache: --cache-mib on each process's GPU
        cfg.capacity *= static_cast<std::size_t>(gpus);
        cfg.device = gpu;
        cfg.group = {.name = group, .rank = gpu, .size = gpus};
      }
      own_cache_.emplace(cfg);
    }
    cache_ = shared != nullptr ? shared : &*own_cache_;
    feats_.emplace(*cache_, s_, m.nodes * m.features.dim, where_.start_lba);
  }

  //! Writes the table into a medium the run made, or checks the device
  //! that holds it. With several GPUs on one medium the first does it.
  void fill_or_check(thread_pool& pool) { fill_or_check_medium(where_, s_, o_, m_, src_, pool); }
  //! This GPU's medium was filled by another GPU's storage (`by`).
  void filled_by(const feature_location& by) {
    where_.placement = by.placement;
    where_.load_seconds = by.load_seconds;
  }
  const feature_location& where() const { return where_; }

  //! The hot set, the sampler and the batches' slots.
  void prepare() {
    const std::uint32_t dim = m_.features.dim;
    f_ = aggregate_figures{.device = where_.device,
                           .transport = s_.transport_name(),
                           .placement = where_.placement,
                           .in_process = where_.in_process,
                           .load_seconds = where_.load_seconds,
                           .cache_bytes = cache_->slot_count() * o_.page_size,
                           .fanouts = fanouts_};
    if (cache_->devices().size() > 1 || !cache_->config().group.name.empty()) describe_parts();
    hot_ = make_hot_set(o_, m_, graph_.indices, *feats_, is_hot_, f_);
    check_gpu_memory(o_, fanouts_, hop_capacities(m_.nodes, o_.batch_size, fanouts_), m_.features.row_bytes(), dim);
    sampler_.emplace(csr_, m_.nodes, fanouts_, o_.batch_size, o_.seed);
    for (unsigned k = 0; k < o_.in_flight; ++k)
      slots_.push_back(std::make_unique<batch_slot<T>>(*sampler_, fanouts_, dim, *feats_, o_.lookahead));
    pipeline_.emplace(batch_pipeline<T>{.sampler = *sampler_,
                                        .fanouts = fanouts_,
                                        .dim = dim,
                                        .feats = *feats_,
                                        .hot = hot_ ? &*hot_ : nullptr,
                                        .missing = missing_.get(),
                                        .batch_stride = static_cast<std::uint64_t>(gpus_),
                                        .batch_offset = static_cast<std::uint64_t>(gpu_),
                                        .counter_device = cache_->devices().size() > 1 ? gpu_ : -1});
  }

  //! Runs this GPU's batches; false when a gathered row or the sampling
  //! was wrong (said on stderr).
  bool run() {
    loop_.emplace(o_, m_, *pipeline_, *cache_, is_hot_, f_, stream());
    return loop_->run(slots_);
  }

  const aggregate_figures& figures() const { return f_; }
  //! The first slot's stream: the checks and the baselines run on it.
  cudaStream_t stream() const { return slots_[0]->stream.s; }
  const storage& store() const { return s_; }
  const batch_loop<T>& loop() const { return *loop_; }
  std::uint64_t max_batch_rows() const { return sampler_->capacity()[sampler_->hops()]; }

private:
  //! A cache spread over the GPUs: the bytes each GPU's part holds (the
  //! parts come in runs of slots, so they may differ by up to a run), said
  //! once by the first GPU.
  void describe_parts() {
    const std::size_t parts =
        cache_->config().group.name.empty() ? cache_->devices().size() : static_cast<std::size_t>(o_.gpus);
    f_.cache_bytes_by_gpu.assign(parts, 0);
    for (std::uint64_t s = 0; s < cache_->slot_count(); s += cache_->run_slots()) {
      const std::uint64_t n = std::min<std::uint64_t>(cache_->run_slots(), cache_->slot_count() - s);
      f_.cache_bytes_by_gpu[cache_->slot_part(s)] += n * cache_->page_size();
    }
    if (gpu_ != 0 || o_.json_stdout) return;
    std::string list;
    for (std::size_t g = 0; g < parts; ++g)
      list += (g == 0 ? "" : ", ") + std::to_string(f_.cache_bytes_by_gpu[g] >> 20) + " MiB";
    std::printf("the cache's pages on GPUs 0 .. %zu: %s (in runs of %llu KiB)\n", parts - 1, list.c_str(),
                static_cast<unsigned long long>(cache_->run_slots() * cache_->page_size() >> 10));
  }

  aggregate_options o_;
  const manifest& m_;
  const host_csr& graph_;
  const table_source& src_;
  feature_location where_;
  int gpu_, gpus_;
  std::vector<std::uint32_t> fanouts_;
  device_csr csr_;
  storage s_;
  std::optional<page_cache> own_cache_;
  page_cache* cache_ = nullptr;
  std::optional<array<T>> feats_;
  aggregate_figures f_;
  std::vector<bool> is_hot_;
  std::optional<hot_rows<T>> hot_;
  std::optional<neighbour_sampler> sampler_;
  std::vector<std::unique_ptr<batch_slot<T>>> slots_;
  device_buffer<unsigned long long> missing_{1};
  std::optional<batch_pipeline<T>> pipeline_;
  std::optional<batch_loop<T>> loop_;
};

void print_header(const aggregate_options& o, const manifest& m, const feature_location& where) {
  if (o.json_stdout) return;
  std::printf("%s: %llu nodes, %u x %s features (%llu B a row); features %s, %s\n"
              "%llu batches of %llu seeds%s, fanouts %s, page cache %llu MiB of %u-byte pages%s, %u batch(es) in "
              "flight%s\n",
              o.dir.c_str(), static_cast<unsigned long long>(m.nodes), m.features.dim, m.features.dtype.c_str(),
              static_cast<unsigned long long>(m.features.row_bytes()), where.device.c_str(), where.placement.c_str(),
              static_cast<unsigned long long>(o.batches), static_cast<unsigned long long>(o.batch_size),
              o.gpus > 1 ? " on each GPU" : "", o.fanouts.c_str(), static_cast<unsigned long long>(o.cache_mib),
              o.page_size,
              o.gpus < 2                    ? ""
              : o.node_cache && o.processes ? " on each GPU, one cache shared by the processes, one GPU each"
              : o.node_cache                ? " on each GPU, one cache spread over the GPUs"
              : o.processes                 ? " on each GPU, a cache per process, one GPU each"
                                            : " on each GPU, a cache per GPU",
              o.in_flight, o.lookahead ? ", look-ahead holds" : "");
  std::fflush(stdout);
}

//! The run on one GPU, for element type T (float for float32 features, raw
//! 16-bit halves for float16), with the comparison harness after it.
template <class T>
int run_typed(const aggregate_options& o, const manifest& m) {
  const std::filesystem::path dir(o.dir);
  thread_pool pool(detail::thread_count(o.host_threads));
  const host_csr graph = read_csr(dir, m); // the hot set ranks the nodes by in-degree
  const table_source src(dir, m);
  gpu_run<T> r(o, m, graph, src, choose_feature_device(o, m, src), nullptr, 0, 1);
  r.fill_or_check(pool);
  r.prepare();
  print_header(o, m, r.where());
  if (!r.run()) return 1;
  report_aggregate({.options = o,
                    .m = m,
                    .figures = r.figures(),
                    .batch_ids = r.loop().batch_ids(),
                    .batch0_rows = r.loop().batch0_rows(),
                    .max_batch_rows = r.max_batch_rows(),
                    .src = src,
                    .s = r.store(),
                    .where = r.where(),
                    .pool = pool,
                    .stream = r.stream()});
  return 0;
}

gpu_description describe_gpu(int dev) {
  gpu_description g;
  cudaDeviceProp prop{};
  BAM_CUDA_TRY(cudaGetDeviceProperties(&prop, dev));
  BAM_CUDA_TRY(cudaDriverGetVersion(&g.driver));
  g.name = prop.name;
  g.cuda_runtime = CUDART_VERSION;
  return g;
}

//! The run on GPUs 0 .. o.gpus-1 at once, a host thread each, over one copy
//! of the features: a cache per GPU, or (--node-cache) one cache spread
//! over the GPUs. The first GPU fills a medium the run made; every GPU
//! starts its batches together.
template <class T>
int run_on_gpus(const aggregate_options& o, const manifest& m) {
  const int n = static_cast<int>(o.gpus);
  const std::filesystem::path dir(o.dir);
  thread_pool pool(detail::thread_count(o.host_threads));
  const host_csr graph = read_csr(dir, m);
  const table_source src(dir, m);
  const feature_location where = choose_feature_device(o, m, src);
  std::optional<page_cache> node;
  if (o.node_cache) {
    std::vector<int> devs;
    for (int g = 0; g < n; ++g)
      devs.push_back(g);
    node.emplace(page_cache_config{
        .page_size = o.page_size, .capacity = (static_cast<std::size_t>(o.cache_mib) << 20) * o.gpus, .devices = devs});
  }
  std::barrier<> step(n);
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  feature_location filled;
  std::vector<aggregate_figures> per(o.gpus);
  std::vector<gpu_description> gpus(o.gpus);
  std::vector<int> status(o.gpus, 0);
  // Every GPU passes each step together; after a failure the others stop at
  // the next one.
  const auto together = [&] {
    step.arrive_and_wait();
    return !failed.load();
  };
  std::vector<std::thread> threads;
  for (int g = 0; g < n; ++g)
    threads.emplace_back([&, g] {
      try {
        BAM_CUDA_TRY(cudaSetDevice(g));
        gpus[static_cast<std::size_t>(g)] = describe_gpu(g);
        gpu_run<T> r(o, m, graph, src, where, node ? &*node : nullptr, g, n);
        if (g == 0 || !where.in_process) r.fill_or_check(pool);
        if (g == 0) filled = r.where();
        if (!together()) return step.arrive_and_drop();
        if (g != 0 && where.in_process) r.filled_by(filled);
        r.prepare();
        if (g == 0) print_header(o, m, r.where());
        if (!together()) return step.arrive_and_drop();
        status[static_cast<std::size_t>(g)] = r.run() ? 0 : 1;
        per[static_cast<std::size_t>(g)] = r.figures();
        // No GPU detaches its array from the shared cache while another reads.
        step.arrive_and_wait();
      } catch (...) {
        {
          std::lock_guard lock(error_mutex);
          if (!error) error = std::current_exception();
        }
        failed = true;
        step.arrive_and_drop();
      }
    });
  for (auto& t : threads)
    t.join();
  if (error) std::rethrow_exception(error);
  for (const int st : status)
    if (st != 0) return st;
  const std::uint64_t cache_bytes = node ? node->slot_count() * o.page_size : per[0].cache_bytes * o.gpus;
  report_gpus({.options = o,
               .m = m,
               .per_gpu = per,
               .all = combine_gpu_figures(per, cache_bytes),
               .cache_layout = o.node_cache ? "one cache spread over the GPUs" : "a cache per GPU",
               .gpus = gpus});
  return 0;
}

//! GPU `rank`'s share of a run of one process per GPU (--processes), in
//! the process of that rank. The processes meet at `ps` once the first has
//! filled the medium, once every one's batches are ready, and before any
//! lets go of the cache (`group`: the name of the cache they share; empty:
//! a cache each). Null when a gathered row or the sampling was wrong (said
//! on stderr); the others' next meeting then fails instead of waiting.
template <class T>
std::optional<aggregate_figures> run_process(const aggregate_options& o, const manifest& m,
                                             const feature_location& where, int rank, bench::process_sync& ps,
                                             const std::string& group) {
  const int n = static_cast<int>(o.gpus);
  const std::filesystem::path dir(o.dir);
  thread_pool pool(detail::thread_count(o.host_threads));
  const host_csr graph = read_csr(dir, m);
  const table_source src(dir, m);
  BAM_CUDA_TRY(cudaSetDevice(rank));
  gpu_run<T> r(o, m, graph, src, where, nullptr, rank, n, group, [&] { ps.wait(n); });
  if (rank == 0 || !where.in_process) r.fill_or_check(pool);
  ps.wait(n);
  r.prepare();
  if (rank == 0) print_header(o, m, r.where());
  ps.wait(n);
  if (!r.run()) {
    ps.failed.store(1);
    return std::nullopt;
  }
  aggregate_figures f = r.figures();
  ps.wait(n); // no process detaches its array from the shared cache while another reads
  return f;
}

//! The run on GPUs 0 .. o.gpus-1, one process each: this one (GPU 0) starts
//! the others as copies of itself, every process opens the one shared
//! medium, and with --node-cache they share one cache
//! (page_cache_config::group); else each has a cache of its own. The first
//! collects the others' figures and reports.
template <class T>
int run_in_processes(const aggregate_options& o, const manifest& m) {
  const int n = static_cast<int>(o.gpus);
  const table_source src(o.dir, m);
  const feature_location where = choose_feature_device(o, m, src);
  const std::string tag = "bam-gnn-" + std::to_string(::getpid());
  const std::string group = o.node_cache ? tag : "";
  std::vector<gpu_description> gpus;
  for (int g = 0; g < n; ++g)
    gpus.push_back(describe_gpu(g));
  // The medium this process chose (its shared memory's name), or the
  // dataset's own file, which each process plans its reading of itself.
  const std::string child_device = where.from_file ? std::string("file") : where.device;
  bench::process_run run;
  std::vector<std::string> outs;
  for (int k = 1; k < n; ++k) {
    outs.push_back(run.report_file(tag + "-" + std::to_string(k) + ".json"));
    std::vector<std::string> args = o.command;
    for (const std::string& x :
         {std::string("--process-rank"), std::to_string(k), std::string("--process-sync-fd"), std::to_string(run.fd()),
          std::string("--process-device"), child_device, std::string("--process-group"),
          group.empty() ? std::string("-") : group, std::string("--process-out"), outs.back()})
      args.push_back(x);
    run.start(std::move(args));
  }
  std::optional<aggregate_figures> mine;
  std::exception_ptr failed;
  try {
    mine = run_process<T>(o, m, where, 0, run.sync(), group);
  } catch (...) {
    run.fail();
    failed = std::current_exception();
  }
  const bool all_ok = run.wait_all();
  if (failed) std::rethrow_exception(failed);
  if (!mine) return 1;
  if (!all_ok) {
    for (const std::string& why : run.failures())
      std::fprintf(stderr, "bam-gnn aggregate: %s\n", why.c_str());
    return 1;
  }
  std::vector<aggregate_figures> per{*mine};
  for (const std::string& out : outs) {
    std::ifstream f(out);
    per.push_back(nlohmann::json::parse(f).get<aggregate_figures>());
  }
  const std::uint64_t cache_bytes = o.node_cache ? per[0].cache_bytes : per[0].cache_bytes * o.gpus;
  report_gpus({.options = o,
               .m = m,
               .per_gpu = per,
               .all = combine_gpu_figures(per, cache_bytes),
               .cache_layout = o.node_cache ? "one cache shared by the processes, one GPU each"
                                            : "a cache per process, one GPU each",
               .gpus = gpus});
  return 0;
}

//! A process that --processes started: its GPU's share of the run, its
//! figures written where the first process reads them.
template <class T>
int run_started_process(const aggregate_options& o, const manifest& m) {
  bench::process_sync* const ps = bench::attach_process_sync(o.child.sync_fd);
  if (ps == nullptr) {
    std::fprintf(stderr, "bam-gnn aggregate: process %d: cannot map the run's barrier\n", o.child.rank);
    return 2;
  }
  aggregate_options mine = o;
  mine.device = o.child.device; // the medium the first process chose
  try {
    const table_source src(o.dir, m);
    const feature_location where = choose_feature_device(mine, m, src);
    const std::optional<aggregate_figures> f =
        run_process<T>(mine, m, where, o.child.rank, *ps, o.child.group == "-" ? "" : o.child.group);
    if (!f) return 1;
    std::ofstream out(o.child.out);
    out << nlohmann::json(*f).dump() << "\n";
    if (!out) {
      std::fprintf(stderr, "bam-gnn aggregate: process %d: cannot write its figures to %s\n", o.child.rank,
                   o.child.out.c_str());
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    ps->failed.store(1);
    std::fprintf(stderr, "bam-gnn aggregate: process %d: %s\n", o.child.rank, e.what());
    return 1;
  }
}

template <class T>
int run_multi(const aggregate_options& o, const manifest& m) {
  if (o.child.rank > 0) return run_started_process<T>(o, m);
  if (o.processes) return run_in_processes<T>(o, m);
  return run_on_gpus<T>(o, m);
}

} // namespace

int run_aggregate(const aggregate_options& o) {
  const manifest m = read_manifest(o.dir);
  (void)parse_fanouts(o.fanouts); // bad fanouts fail before anything is set up
  if (o.batch_size == 0) detail::gnn_fail("--batch-size must be at least 1");
  if (o.batches == 0) detail::gnn_fail("--batches must be at least 1");
  if (o.cache_mib == 0) detail::gnn_fail("--cache-mib must be at least 1");
  if (o.in_flight == 0 || o.in_flight > max_in_flight)
    detail::gnn_fail("--in-flight " + std::to_string(o.in_flight) + ": 1 to " + std::to_string(max_in_flight));
  if (o.page_size < 512 || o.page_size > (64u << 10) || (o.page_size & (o.page_size - 1)) != 0)
    detail::gnn_fail("--page-size " + std::to_string(o.page_size) + ": a power of two from 512 to 65536");
  if (m.nodes > 0xffffffffull) detail::gnn_fail("more than 2^32 - 1 nodes: positions are 32-bit");
  if (o.node_cache && o.gpus < 2)
    detail::gnn_fail("--node-cache spreads one cache over several GPUs: give --gpus 2 or more");
  if (o.processes && o.gpus < 2) detail::gnn_fail("--processes runs one process per GPU: give --gpus 2 or more");
  if (o.gpus > 1 && o.compare)
    detail::gnn_fail("--compare gathers the batches again by other paths on one GPU: run it without --gpus");
  if (o.hot_in_gpu && o.hot_percent <= 0) detail::gnn_fail("--hot-memory gpu places a hot set: give --hot-percent");
  if (o.gpus > 1) { // a medium every GPU can open, before anything needs a GPU
    const table_source src(o.dir, m);
    (void)choose_feature_device(o, m, src);
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    cudaGetLastError();
    detail::gnn_fail("bam-gnn aggregate needs an NVIDIA GPU: none is visible here", ENODEV);
  }
  if (o.gpus > static_cast<unsigned>(gpus))
    detail::gnn_fail("--gpus " + std::to_string(o.gpus) + ": " + std::to_string(gpus) + " GPU(s) are visible here",
                     ENODEV);
  if (o.gpus > 1) {
    if (m.features.dtype == "float16") return run_multi<std::uint16_t>(o, m);
    return run_multi<float>(o, m);
  }
  if (m.features.dtype == "float16") return run_typed<std::uint16_t>(o, m);
  return run_typed<float>(o, m);
}

} // namespace bam::gnn
