// SPDX-License-Identifier: MIT
// The host side of `bam-gnn aggregate`: its options, fanout parsing, the CPU
// row gather (a thread pool, the baseline's data-loader path) and the
// page arithmetic behind the cache hit rate. No CUDA here: the host tests
// compile it with g++ alone; aggregate.cu holds the GPU run.
#pragma once

#include "gnn_dataset.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace bam::gnn {

//! Most hops a run samples.
inline constexpr std::size_t max_hops = 8;
//! Largest fanout of one hop.
inline constexpr std::uint32_t max_fanout = 1024;

//! "15,10,5" -> {15, 10, 5}: neighbours sampled per node, hop by hop from the
//! seeds outwards. Throws `bam::error` (EINVAL) naming what is wrong.
inline std::vector<std::uint32_t> parse_fanouts(const std::string& text) {
  std::vector<std::uint32_t> out;
  if (text.empty()) detail::gnn_fail("fanouts: empty (expected e.g. 15,10,5)");
  std::size_t pos = 0;
  while (true) {
    const std::size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos || item.size() > 9)
      detail::gnn_fail("fanouts '" + text + "': '" + item + "' is not a whole number (expected e.g. 15,10,5)");
    const unsigned long v = std::stoul(item);
    if (v == 0 || v > max_fanout)
      detail::gnn_fail("fanouts '" + text + "': " + item + " is outside 1.." + std::to_string(max_fanout));
    out.push_back(static_cast<std::uint32_t>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (out.size() > max_hops)
    detail::gnn_fail("fanouts '" + text + "': " + std::to_string(out.size()) + " hops, at most " +
                     std::to_string(max_hops));
  return out;
}

//! The `k` nodes with the highest in-degree (the nodes sampled most often),
//! ties to the lower id, in increasing id order: the hot set GIDS keeps in
//! host memory. `indices` holds the CSR's neighbour ids (each one an
//! incoming edge of that node). Throws `bam::error` for an id outside
//! [0, nodes).
inline std::vector<std::uint64_t> hottest_nodes(const std::vector<std::int32_t>& indices, std::uint64_t nodes,
                                                std::uint64_t k) {
  std::vector<std::uint64_t> degree(nodes, 0);
  for (const std::int32_t v : indices) {
    if (v < 0 || static_cast<std::uint64_t>(v) >= nodes)
      detail::gnn_fail("neighbour id " + std::to_string(v) + " is outside the graph's " + std::to_string(nodes) +
                       " nodes");
    ++degree[static_cast<std::uint64_t>(v)];
  }
  k = std::min(k, nodes);
  std::vector<std::uint64_t> ids(nodes);
  for (std::uint64_t i = 0; i < nodes; ++i)
    ids[i] = i;
  const auto hotter = [&](std::uint64_t a, std::uint64_t b) {
    return degree[a] != degree[b] ? degree[a] > degree[b] : a < b;
  };
  std::nth_element(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), hotter);
  ids.resize(k);
  std::sort(ids.begin(), ids.end());
  return ids;
}

//! Upper bounds of the unique nodes of each hop's node set: hop 0 holds the
//! seeds, hop l + 1 the nodes of hop l and their sampled neighbours.
inline std::vector<std::uint64_t> hop_capacities(std::uint64_t nodes, std::uint64_t batch,
                                                 const std::vector<std::uint32_t>& fanouts) {
  std::vector<std::uint64_t> cap{std::min(nodes, batch)};
  for (const std::uint32_t f : fanouts) {
    const std::uint64_t prev = cap.back();
    const std::uint64_t grown = prev > nodes / (1ull + f) ? nodes : prev * (1ull + f);
    cap.push_back(std::min(nodes, grown));
  }
  return cap;
}

//! Most mini-batches a run keeps in flight at once.
inline constexpr unsigned max_in_flight = 8;

//! The total length of the union of intervals [begin, end) (in any order,
//! overlapping or not): the time during which at least one of them ran.
inline double interval_union_ms(std::vector<std::pair<double, double>> spans) {
  std::sort(spans.begin(), spans.end());
  double total = 0, open = 0, close = 0;
  bool any = false;
  for (const auto& [b, e] : spans) {
    if (e <= b) continue;
    if (!any || b > close) {
      if (any) total += close - open;
      open = b;
      close = e;
      any = true;
    } else {
      close = std::max(close, e);
    }
  }
  return any ? total + close - open : 0;
}

//! Pages of `page_size` bytes that row `id` (rows of `row_bytes`, row 0 at a
//! page boundary) touches.
inline std::uint64_t row_pages(std::uint64_t id, std::uint64_t row_bytes, std::uint64_t page_size) {
  const std::uint64_t first = id * row_bytes / page_size;
  const std::uint64_t last = (id * row_bytes + row_bytes - 1) / page_size;
  return last - first + 1;
}

//! A fixed set of threads that runs `run(n, f)`: f(t) for t in [0, n), spread
//! over the threads; run returns when every call has, rethrowing the first
//! exception.
class thread_pool {
public:
  explicit thread_pool(unsigned threads) {
    threads = std::max(1u, threads);
    for (unsigned t = 0; t < threads; ++t)
      workers_.emplace_back([this] { work(); });
  }
  ~thread_pool() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_)
      w.join();
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  unsigned size() const { return static_cast<unsigned>(workers_.size()); }

  void run(std::uint64_t n, const std::function<void(std::uint64_t)>& f) {
    if (n == 0) return;
    std::unique_lock lock(m_);
    job_ = &f;
    tasks_ = n;
    next_ = 0;
    done_ = 0;
    failure_ = nullptr;
    ++generation_;
    wake_.notify_all();
    finished_.wait(lock, [&] { return done_ == tasks_; });
    job_ = nullptr;
    if (failure_) std::rethrow_exception(failure_);
  }

private:
  void work() {
    std::uint64_t seen = 0;
    std::unique_lock lock(m_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || (generation_ != seen && job_ != nullptr && next_ < tasks_); });
      if (stop_) return;
      while (job_ != nullptr && next_ < tasks_) {
        const std::uint64_t t = next_++;
        const auto* f = job_;
        lock.unlock();
        std::exception_ptr e;
        try {
          (*f)(t);
        } catch (...) {
          e = std::current_exception();
        }
        lock.lock();
        if (e && !failure_) failure_ = e;
        if (++done_ == tasks_) finished_.notify_all();
      }
      seen = generation_;
    }
  }

  std::vector<std::thread> workers_;
  std::mutex m_;
  std::condition_variable wake_, finished_;
  const std::function<void(std::uint64_t)>* job_ = nullptr;
  std::uint64_t tasks_ = 0, next_ = 0, done_ = 0, generation_ = 0;
  std::exception_ptr failure_;
  bool stop_ = false;
};

//! Rows `ids[0..count)` of `table` (rows of `row_bytes`, `rows` of them)
//! into `out`, row k at `out + k * row_bytes`, split over the pool's
//! threads. Throws `bam::error` for an id past the table.
inline void cpu_gather_rows(thread_pool& pool, const unsigned char* table, std::uint64_t rows, std::uint64_t row_bytes,
                            const std::uint64_t* ids, std::uint64_t count, unsigned char* out) {
  const std::uint64_t parts = std::min<std::uint64_t>(count, std::uint64_t{pool.size()} * 4);
  pool.run(parts, [&](std::uint64_t p) {
    const std::uint64_t lo = count * p / parts, hi = count * (p + 1) / parts;
    for (std::uint64_t k = lo; k < hi; ++k) {
      if (ids[k] >= rows)
        detail::gnn_fail("row id " + std::to_string(ids[k]) + " is outside the table's " + std::to_string(rows) +
                         " rows");
      std::memcpy(out + k * row_bytes, table + ids[k] * row_bytes, row_bytes);
    }
  });
}

//! Reads the bytes [offset, offset + len) of a dataset's feature table: from
//! its file (generated or imported .npy, from the rows' start), or from the
//! generator when the dataset keeps no file. Safe for concurrent reads.
class table_source {
public:
  table_source(const std::filesystem::path& dir, const manifest& m)
      : file_offset_(m.features.file_offset), path_(features_path(dir, m)) {
    if (!path_.empty()) {
      fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd_ < 0) throw_errno("opening " + path_);
    } else {
      gen_ = generated_features(m);
    }
  }
  ~table_source() {
    if (fd_ >= 0) ::close(fd_);
  }
  table_source(const table_source&) = delete;
  table_source& operator=(const table_source&) = delete;
  //! The feature file; empty when the rows come from the generator.
  const std::string& path() const { return path_; }
  void read(std::uint64_t offset, void* dst, std::size_t len) const {
    if (fd_ < 0) {
      gen_.read(offset, dst, len);
      return;
    }
    auto* p = static_cast<unsigned char*>(dst);
    for (std::size_t done = 0; done < len;) {
      const ssize_t n = ::pread(fd_, p + done, len - done, static_cast<off_t>(file_offset_ + offset + done));
      if (n <= 0) detail::gnn_fail(path_ + ": the feature table ends before byte " + std::to_string(offset + len), EIO);
      done += static_cast<std::size_t>(n);
    }
  }

private:
  std::uint64_t file_offset_ = 0;
  std::string path_;
  int fd_ = -1;
  data_source gen_;
};

//! The whole table (`bytes`) into `dst` (host memory), 8 MiB chunks read by the pool's threads.
inline void read_table(const table_source& src, std::uint64_t bytes, unsigned char* dst, thread_pool& pool) {
  constexpr std::uint64_t chunk = 8ull << 20;
  pool.run((bytes + chunk - 1) / chunk, [&](std::uint64_t c) {
    const std::uint64_t off = c * chunk;
    src.read(off, dst + off, static_cast<std::size_t>(std::min(chunk, bytes - off)));
  });
}

//! Writes the table (`bytes` of `src`) onto `controllers` namespaces as a
//! `bam::array` starting at byte `start_byte` of each reads it: page p (of
//! `page_size` bytes) on controller p % controllers at `start_byte` plus
//! (p / controllers) pages; the last page padded with zeroes.
//! `write(controller, byte offset, data, length)` writes one controller's run.
template <class Write>
void load_striped(const table_source& src, std::uint64_t bytes, std::uint32_t page_size, std::uint32_t controllers,
                  std::uint64_t start_byte, thread_pool& pool, Write&& write) {
  const std::uint32_t n = std::max(1u, controllers);
  constexpr std::uint64_t step_target = 64ull << 20; // bytes read per step, over all controllers
  const std::uint64_t pages_per_step = std::max<std::uint64_t>(1, step_target / (std::uint64_t{page_size} * n));
  const std::uint64_t step = pages_per_step * page_size * n;
  std::vector<unsigned char> in(step);
  std::vector<unsigned char> out(pages_per_step * page_size);
  constexpr std::uint64_t piece = 1ull << 20; // read in parallel: the generator is CPU-bound
  for (std::uint64_t base = 0; base < bytes; base += step) {
    const std::uint64_t len = std::min(step, bytes - base);
    std::fill(in.begin() + static_cast<std::ptrdiff_t>(len), in.end(), 0);
    pool.run((len + piece - 1) / piece, [&](std::uint64_t k) {
      const std::uint64_t off = k * piece;
      src.read(base + off, in.data() + off, static_cast<std::size_t>(std::min(piece, len - off)));
    });
    const std::uint64_t pages = (len + page_size - 1) / page_size;
    // The step starts on page base / page_size, a multiple of n: controller
    // c's first page of the step is its page number base / page_size / n.
    const std::uint64_t first_slot = base / page_size / n;
    for (std::uint32_t c = 0; c < n && c < pages; ++c) {
      std::uint64_t filled = 0;
      for (std::uint64_t p = c; p < pages; p += n) {
        std::memcpy(out.data() + filled, in.data() + p * page_size, page_size);
        filled += page_size;
      }
      write(c, start_byte + first_slot * page_size, static_cast<const void*>(out.data()),
            static_cast<std::size_t>(filled));
    }
  }
}

//! The expected bytes of rows `ids` (generated features: the generator;
//! imported ones: their file), row k at `out + k * row_bytes`.
inline void reference_rows(const std::filesystem::path& dir, const manifest& m, const std::uint64_t* ids,
                           std::uint64_t count, unsigned char* out) {
  const std::uint64_t rb = m.features.row_bytes();
  if (m.features.source == "generated") {
    const data_source src = generated_features(m);
    for (std::uint64_t k = 0; k < count; ++k)
      src.read(ids[k] * rb, out + k * rb, rb);
    return;
  }
  for (std::uint64_t k = 0; k < count; ++k) {
    const std::vector<unsigned char> row = read_feature_rows(dir, m, ids[k], 1);
    std::memcpy(out + k * rb, row.data(), rb);
  }
}

//! A sampled slot with no neighbour (a node of degree zero, or fewer
//! neighbours than the fanout).
inline constexpr std::uint64_t no_node = ~std::uint64_t{0};

//! One batch's mean aggregation, computed on the host the way the GPU does
//! it: `nodes[l]` is hop l's sorted set of unique nodes (l = 0..hops),
//! `sampled[l]` the fanouts[l] samples of each node of hop l (or no_node),
//! `rows` the features of hop `hops`'s nodes (dim floats each). From the
//! last hop inwards, a node's representation is (its own + the mean of its
//! sampled neighbours') / 2. Returns hop 0's representations. Throws
//! `bam::error` when a node or sample is missing from the next hop's set.
inline std::vector<float> mean_aggregate_reference(const std::vector<std::vector<std::uint64_t>>& nodes,
                                                   const std::vector<std::vector<std::uint64_t>>& sampled,
                                                   const std::vector<std::uint32_t>& fanouts, std::vector<float> rows,
                                                   std::uint32_t dim) {
  const std::size_t hops = fanouts.size();
  if (nodes.size() != hops + 1 || sampled.size() != hops)
    detail::gnn_fail("mean_aggregate_reference: " + std::to_string(hops) + " hops need " + std::to_string(hops + 1) +
                     " node sets and " + std::to_string(hops) + " sample sets");
  std::vector<float> next = std::move(rows);
  for (std::size_t l = hops; l-- > 0;) {
    const auto& set = nodes[l + 1];
    auto pos = [&](std::uint64_t v) {
      const auto it = std::lower_bound(set.begin(), set.end(), v);
      if (it == set.end() || *it != v)
        detail::gnn_fail("hop " + std::to_string(l + 1) + "'s set lacks node " + std::to_string(v));
      return static_cast<std::uint64_t>(it - set.begin());
    };
    const std::uint32_t f = fanouts[l];
    std::vector<float> cur(nodes[l].size() * dim);
    std::vector<std::uint64_t> p(f);
    for (std::size_t i = 0; i < nodes[l].size(); ++i) {
      const std::uint64_t self = pos(nodes[l][i]);
      unsigned n = 0;
      for (std::uint32_t k = 0; k < f; ++k) {
        const std::uint64_t v = sampled[l][i * f + k];
        p[k] = v == no_node ? no_node : pos(v);
        n += v != no_node;
      }
      const float inv = n ? 1.0f / static_cast<float>(n) : 0.0f;
      for (std::uint32_t c = 0; c < dim; ++c) {
        float sum = 0;
        for (std::uint32_t k = 0; k < f; ++k)
          if (p[k] != no_node) sum += next[p[k] * dim + c];
        cur[i * dim + c] = 0.5f * (next[self * dim + c] + sum * inv);
      }
    }
    next = std::move(cur);
  }
  return next;
}

//! What `bam-gnn aggregate` is asked to do.
struct aggregate_options {
  std::string dir;
  std::string device; //!< empty: the manifest's device, else an in-process medium
  std::uint64_t cache_mib = 1024;
  std::uint32_t page_size = 4096;
  std::string fanouts = "15,10,5";
  std::uint64_t batch_size = 1024;
  std::uint64_t batches = 100;
  std::uint64_t seed = 1;
  std::uint64_t verify_batches = 2; //!< batches whose gathered rows are checked
  std::uint64_t progress_every = 10;
  std::string json_file;
  bool json_stdout = false;
  bool compare = false;
  bool quiet = false;
  unsigned host_threads = 0; //!< CPU baselines (0: all cores)
  double hot_percent = 0;    //!< rows of the highest in-degree kept in a hot set (bam::hot_rows)
  bool hot_in_gpu = false;   //!< the hot set in each GPU's memory (a replica per GPU), not in pinned host memory
  unsigned in_flight = 2;    //!< mini-batches in flight at once, each on a stream of its own
  bool lookahead = true;   //!< hold the cached pages of a batch's rows from its sampling to its gather (bam::row_holds)
  unsigned gpus = 1;       //!< GPUs 0 .. gpus-1, a host thread each, each running `batches` batches
  bool node_cache = false; //!< with gpus > 1: one page cache spread over the GPUs (else a cache per GPU)
  bool processes = false;  //!< with gpus > 1: one process per GPU (this one and gpus - 1 it starts) instead of threads
  std::vector<std::string> command; //!< this program's command line (--processes starts it again)
  //! A process that --processes started (rank >= 1): its GPU, the run's
  //! shared barrier, the medium and cache group to join, where it reports.
  struct process_role {
    int rank = 0;
    int sync_fd = -1;
    std::string device, group, out;
  } child;
};

//! First row of `got` that differs from `want` (`rows` rows of `row_bytes`),
//! or -1 when they are equal.
inline std::int64_t first_wrong_row(const unsigned char* got, const unsigned char* want, std::uint64_t rows,
                                    std::uint64_t row_bytes) {
  for (std::uint64_t r = 0; r < rows; ++r)
    if (std::memcmp(got + r * row_bytes, want + r * row_bytes, row_bytes) != 0) return static_cast<std::int64_t>(r);
  return -1;
}

//! What a run of `bam-gnn aggregate` measured, summed over its batches
//! (aggregate.cu fills it in; benchmarks/gnn/aggregate_report.cpp prints it
//! and writes it as JSON).
struct aggregate_figures {
  // Where the features were read from.
  std::string device;            //!< the device string the storage opened
  std::string transport;         //!< what served the I/O (storage::transport_name)
  std::string placement;         //!< where the table is on it, in words
  bool in_process = false;       //!< an in-process medium the run filled
  double load_seconds = 0;       //!< filling it (not timed)
  std::uint64_t cache_bytes = 0; //!< the page cache's pages
  std::vector<std::uint32_t> fanouts;
  // The timed batches (the checks of the first batches are not timed).
  double seconds = 0;                   //!< every batch, the first start to the last end
  double sampling_seconds = 0;          //!< summed over the batches
  double gathering_seconds = 0;         //!< the time any batch's gather ran (the gathers in flight overlap)
  double aggregation_seconds = 0;       //!< summed over the batches
  double first_batch_seconds = 0;       //!< batch 0, from its sampling to its aggregation
  std::uint64_t rows = 0;               //!< rows gathered: every batch's last-hop nodes
  std::vector<std::uint64_t> hop_nodes; //!< hop_nodes[l]: the unique nodes of hop l, summed over the batches
  std::uint64_t page_visits = 0;        //!< cache pages the rows read through the cache touch
  std::uint64_t pages_loaded = 0;       //!< the cache's misses
  std::uint64_t held_pages = 0;         //!< pages the look-ahead holds kept in the cache
  // The hot set (--hot-percent): rows read from its copy (pinned host
  // memory, or the GPU's memory with --hot-memory gpu), not through the cache.
  bool hot_set = false;
  bool hot_in_gpu = false;
  //! A cache spread over GPUs: the bytes of its pages on each (in the
  //! order of its GPUs, or of the processes of a group); empty otherwise.
  std::vector<std::uint64_t> cache_bytes_by_gpu;
  std::uint64_t hot_rows = 0, hot_bytes = 0;
  double hot_fill_seconds = 0;
  std::uint64_t hot_row_visits = 0; //!< rows gathered from it
  // The rows compared with the generator or the feature file.
  std::uint64_t verified_rows = 0, verified_batches = 0;

  double hit_rate() const {
    return page_visits ? 1.0 - static_cast<double>(pages_loaded) / static_cast<double>(page_visits) : 0.0;
  }
};

//! Runs `bam-gnn aggregate` (aggregate.cu; a build without CUDA says so).
//! Returns the exit status.
int run_aggregate(const aggregate_options& o);

} // namespace bam::gnn
