// SPDX-License-Identifier: MIT
// A GNN dataset on disk, as `bam-gnn` makes, imports and checks it:
//
//   DIR/manifest.json   shapes, dtypes, seeds, where the features are
//   DIR/indptr.npy      int64, nodes + 1 entries  } the graph in CSR (neighbours
//   DIR/indices.npy     int32, edges entries      } of u: indices[indptr[u]:indptr[u+1]])
//   DIR/features.bin    nodes x dim float32, row-major, no header (generated), or
//                       the rows inside an imported .npy file, referenced in place
//
// and, once loaded onto a device, the device string, namespace and byte
// offset of the feature table (manifest "device"). Generated features are a
// function of (feature seed, node, column) (gnn_features.hpp), so any row can
// be checked without a reference copy; imported ones are checked against
// their file. Every file is written under a temporary name and renamed when
// complete, the manifest last: a dataset directory with a manifest is whole.
#pragma once

#include "gnn_features.hpp"
#include "npy.hpp"
#include "rmat.hpp"

#include <bam/host.hpp>
#include <bam/host/dataset.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace bam::gnn {

inline constexpr const char* manifest_name = "manifest.json";
inline constexpr int manifest_version = 1;

struct feature_info {
  std::uint32_t dim = 1024;
  std::string dtype = "float32";    //!< float32 or float16
  std::string source = "generated"; //!< generated | imported
  std::uint64_t seed = 0;           //!< generated: the generator's seed
  std::string file;                 //!< path (relative to the dataset directory, or absolute); empty: not on disk
  std::uint64_t file_offset = 0;    //!< where row 0 starts in `file`
  std::uint32_t item_bytes() const { return dtype == "float16" ? 2 : 4; }
  std::uint64_t row_bytes() const { return std::uint64_t{dim} * item_bytes(); }
};

struct device_placement {
  std::string device; //!< device string the table was written to
  std::uint32_t nsid = 1;
  std::uint64_t offset = 0; //!< bytes on the namespace where row 0 starts
  std::uint32_t lba_size = 512;
  std::string checksum; //!< XXH3-128 of the table as written
};

struct manifest {
  std::uint64_t nodes = 0, edges = 0;
  bool undirected = true;
  std::string graph_source; //!< "rmat" or "imported: ..."
  std::uint64_t graph_seed = 0;
  double rmat_a = 0.57, rmat_b = 0.19, rmat_c = 0.19;
  double requested_degree = 0;
  std::string indptr_file = "indptr.npy", indices_file = "indices.npy";
  feature_info features;
  std::optional<device_placement> device;
};

inline nlohmann::ordered_json to_json(const manifest& m) {
  nlohmann::ordered_json j;
  j["format"] = "bam-gnn-dataset";
  j["version"] = manifest_version;
  j["nodes"] = m.nodes;
  j["edges"] = m.edges;
  j["undirected"] = m.undirected;
  j["graph"] = {{"source", m.graph_source},
                {"seed", m.graph_seed},
                {"rmat_abc", {m.rmat_a, m.rmat_b, m.rmat_c}},
                {"requested_degree", m.requested_degree},
                {"indptr", {{"file", m.indptr_file}, {"dtype", "int64"}}},
                {"indices", {{"file", m.indices_file}, {"dtype", "int32"}}}};
  j["features"] = {{"dim", m.features.dim},
                   {"dtype", m.features.dtype},
                   {"row_bytes", m.features.row_bytes()},
                   {"source", m.features.source},
                   {"seed", m.features.seed},
                   {"file", m.features.file},
                   {"file_offset", m.features.file_offset}};
  if (m.device)
    j["device"] = {{"device", m.device->device},
                   {"nsid", m.device->nsid},
                   {"offset", m.device->offset},
                   {"lba_size", m.device->lba_size},
                   {"checksum", m.device->checksum}};
  return j;
}

inline manifest manifest_from_json(const nlohmann::json& j, const std::string& where) {
  if (j.value("format", "") != "bam-gnn-dataset") detail::gnn_fail(where + ": not a bam-gnn dataset manifest");
  if (j.value("version", 0) != manifest_version)
    detail::gnn_fail(where + ": manifest version " + std::to_string(j.value("version", 0)) + ", this tool reads " +
                     std::to_string(manifest_version));
  manifest m;
  try {
    m.nodes = j.at("nodes");
    m.edges = j.at("edges");
    m.undirected = j.at("undirected");
    const auto& g = j.at("graph");
    m.graph_source = g.at("source");
    m.graph_seed = g.at("seed");
    m.rmat_a = g.at("rmat_abc").at(0);
    m.rmat_b = g.at("rmat_abc").at(1);
    m.rmat_c = g.at("rmat_abc").at(2);
    m.requested_degree = g.at("requested_degree");
    m.indptr_file = g.at("indptr").at("file");
    m.indices_file = g.at("indices").at("file");
    const auto& f = j.at("features");
    m.features.dim = f.at("dim");
    m.features.dtype = f.at("dtype");
    m.features.source = f.at("source");
    m.features.seed = f.at("seed");
    m.features.file = f.at("file");
    m.features.file_offset = f.at("file_offset");
    if (j.contains("device")) {
      const auto& d = j.at("device");
      m.device = device_placement{d.at("device"), d.at("nsid"), d.at("offset"), d.at("lba_size"), d.at("checksum")};
    }
  } catch (const nlohmann::json::exception& e) {
    detail::gnn_fail(where + ": " + e.what());
  }
  if (m.features.dtype != "float32" && m.features.dtype != "float16")
    detail::gnn_fail(where + ": feature dtype " + m.features.dtype + " (float32 or float16)");
  return m;
}

inline manifest read_manifest(const std::filesystem::path& dir) {
  const auto p = dir / manifest_name;
  std::ifstream f(p);
  if (!f) detail::gnn_fail(p.string() + ": no dataset here (make one with bam-gnn make)", ENOENT);
  nlohmann::json j;
  try {
    f >> j;
  } catch (const nlohmann::json::exception& e) {
    detail::gnn_fail(p.string() + ": " + e.what());
  }
  return manifest_from_json(j, p.string());
}

//! Writes `text` to `path` through a temporary file and a rename.
inline void write_atomically(const std::filesystem::path& path, const std::string& text) {
  const auto tmp = path.string() + ".partial";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) throw_errno("writing " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

inline void write_manifest(const std::filesystem::path& dir, const manifest& m) {
  write_atomically(dir / manifest_name, to_json(m).dump(2) + "\n");
}

//! The features file's path for a manifest in `dir`.
inline std::string features_path(const std::filesystem::path& dir, const manifest& m) {
  if (m.features.file.empty()) return {};
  const std::filesystem::path f(m.features.file);
  return f.is_absolute() ? f.string() : (dir / f).string();
}

//! A data source producing the generated feature table row by row (for
//! writing it to a file or straight onto a device).
inline data_source generated_features(const manifest& m) {
  data_source s;
  s.size = m.nodes * m.features.row_bytes();
  s.identity = "bam-gnn generated features seed " + std::to_string(m.features.seed) + " dim " +
               std::to_string(m.features.dim) + " nodes " + std::to_string(m.nodes);
  const std::uint64_t seed = m.features.seed;
  const std::uint32_t dim = m.features.dim;
  s.read = [seed, dim](std::uint64_t offset, void* dst, std::size_t len) {
    // Any byte range: whole floats, generated one by one.
    auto* out = static_cast<unsigned char*>(dst);
    const std::uint64_t row_bytes = std::uint64_t{dim} * 4;
    for (std::uint64_t pos = offset; pos < offset + len;) {
      const std::uint64_t word = pos / 4;
      const float v = feature_value(seed, word / dim, static_cast<std::uint32_t>(word % dim));
      unsigned char b[4];
      std::memcpy(b, &v, 4);
      const std::uint64_t from = pos % 4, n = std::min<std::uint64_t>(4 - from, offset + len - pos);
      std::memcpy(out + (pos - offset), b + from, n);
      pos += n;
    }
    (void)row_bytes;
  };
  return s;
}

struct make_options {
  rmat_options graph;
  std::uint32_t dim = 1024;
  std::uint64_t feature_seed = 0; //!< 0: derived from the graph seed
  bool features_file = true;      //!< false: the table exists only where it is loaded (--device)
  bool force = false;             //!< remake even if a dataset with other parameters is there
  std::function<void(const char*, std::uint64_t, std::uint64_t)> progress;
};

//! What a make would write, without writing it.
inline manifest planned_manifest(const make_options& o) {
  manifest m;
  m.nodes = o.graph.nodes;
  m.undirected = o.graph.undirected;
  m.graph_source = "rmat";
  m.graph_seed = o.graph.seed;
  m.rmat_a = o.graph.a;
  m.rmat_b = o.graph.b;
  m.rmat_c = o.graph.c;
  m.requested_degree = o.graph.avg_degree;
  m.features.dim = o.dim;
  m.features.seed = o.feature_seed != 0 ? o.feature_seed : mix64(o.graph.seed ^ 0xfea7ull);
  m.features.file = o.features_file ? "features.bin" : "";
  return m;
}

//! True when `a` and `b` describe the same generated data (devices aside).
inline bool same_recipe(const manifest& a, const manifest& b) {
  return a.nodes == b.nodes && a.undirected == b.undirected && a.graph_source == b.graph_source &&
         a.graph_seed == b.graph_seed && a.rmat_a == b.rmat_a && a.rmat_b == b.rmat_b && a.rmat_c == b.rmat_c &&
         a.requested_degree == b.requested_degree && a.features.dim == b.features.dim &&
         a.features.seed == b.features.seed && a.features.file == b.features.file;
}

struct make_result {
  manifest m;
  bool already_there = false; //!< the directory held this dataset: nothing was written
};

namespace detail {

//! What a `make` finds at `file`, a manifest: nothing (empty); the same
//! recipe (`same`), which is returned; or another one, or one that `read`
//! cannot read (another tool's, or cut short): refused without `force`
//! (EEXIST, naming `other`), else removed, so the directory is not whole
//! from then on.
template <class Read, class Same>
auto manifest_to_reuse(const std::filesystem::path& file, bool force, const std::string& other, Read&& read,
                       Same&& same) -> std::optional<decltype(read())> {
  if (!std::filesystem::exists(file)) return std::nullopt;
  std::optional<decltype(read())> old;
  std::string unreadable;
  try {
    old = read();
  } catch (const std::exception& e) {
    unreadable = e.what();
  }
  if (old && same(*old)) return old;
  if (!force)
    gnn_fail(file.string() + (old ? " describes " + other : " cannot be read (" + unreadable + ")") +
                 ": pass --force to replace it",
             EEXIST);
  std::filesystem::remove(file);
  return std::nullopt;
}

} // namespace detail

//! Makes (or finds already made) the dataset of `o` in `dir`.
inline make_result make_dataset(const std::filesystem::path& dir, const make_options& o) {
  make_result r;
  r.m = planned_manifest(o);
  std::filesystem::create_directories(dir);
  if (auto old = detail::manifest_to_reuse(
          dir / manifest_name, o.force, "another dataset (other nodes, degree, seeds or width)",
          [&] { return read_manifest(dir); }, [&](const manifest& m) { return same_recipe(m, r.m); })) {
    r.m = *old;
    r.already_there = true;
    return r;
  }
  rmat_options go = o.graph;
  go.progress = o.progress;
  const csr_graph g = make_rmat(go);
  r.m.edges = g.edges();
  npy_write((dir / (r.m.indptr_file + ".partial")).string(), "<i8", {g.indptr.size()}, g.indptr.data());
  npy_write((dir / (r.m.indices_file + ".partial")).string(), "<i4", {g.indices.size()}, g.indices.data());
  std::filesystem::rename(dir / (r.m.indptr_file + ".partial"), dir / r.m.indptr_file);
  std::filesystem::rename(dir / (r.m.indices_file + ".partial"), dir / r.m.indices_file);
  if (o.features_file) {
    const std::string path = (dir / "features.bin.partial").string();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw_errno("creating " + path);
    const data_source src = generated_features(r.m);
    const std::uint64_t rows_per_chunk = std::max<std::uint64_t>(1, (8u << 20) / r.m.features.row_bytes());
    const std::uint64_t chunk_bytes = rows_per_chunk * r.m.features.row_bytes();
    const unsigned threads = detail::thread_count(o.graph.threads);
    std::vector<std::vector<unsigned char>> bufs(threads, std::vector<unsigned char>(chunk_bytes));
    for (std::uint64_t base = 0; base < src.size; base += chunk_bytes * threads) {
      detail::parallel_ranges(threads, threads, [&](std::uint64_t t, std::uint64_t) {
        const std::uint64_t off = base + t * chunk_bytes;
        if (off >= src.size) return;
        const std::uint64_t n = std::min(chunk_bytes, src.size - off);
        src.read(off, bufs[t].data(), n);
        for (std::uint64_t done = 0; done < n;) {
          const ssize_t w = ::pwrite(fd, bufs[t].data() + done, n - done, static_cast<off_t>(off + done));
          if (w <= 0) throw_errno("writing " + path);
          done += static_cast<std::uint64_t>(w);
        }
      });
      if (o.progress) o.progress("writing features", std::min(src.size, base + chunk_bytes * threads), src.size);
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) throw_errno("writing " + path);
    std::filesystem::rename(path, dir / "features.bin");
  }
  write_manifest(dir, r.m);
  return r;
}

//! Reads rows [first, first + count) of the feature table from its file.
inline std::vector<unsigned char> read_feature_rows(const std::filesystem::path& dir, const manifest& m,
                                                    std::uint64_t first, std::uint64_t count) {
  const std::string path = features_path(dir, m);
  if (path.empty()) detail::gnn_fail("the dataset keeps no feature file (it was made with --no-features-file)");
  std::vector<unsigned char> out(count * m.features.row_bytes());
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("opening " + path);
  std::uint64_t done = 0;
  const std::uint64_t at = m.features.file_offset + first * m.features.row_bytes();
  while (done < out.size()) {
    const ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(at + done));
    if (n <= 0) {
      ::close(fd);
      detail::gnn_fail(path + ": the feature table ends before row " + std::to_string(first + count), EIO);
    }
    done += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
  return out;
}

// ---- import -----------------------------------------------------------------

struct import_options {
  std::string features_npy; //!< 2-D float32 or float16 array, one row per node
  std::string edges;        //!< edge list: text ("src dst" per line, '#' comments) or .npy of shape (E, 2) or (2, E)
  std::string indptr_npy, indices_npy; //!< or a CSR pair
  bool undirected = false;             //!< edge list: store both directions
  unsigned threads = 0;
  std::function<void(const char*, std::uint64_t, std::uint64_t)> progress;
};

namespace detail {

//! Refuses a .npy file shorter than its header says, before anything is
//! allocated for its payload.
inline void require_whole_npy(const std::string& path, const npy_header& h) {
  if (std::filesystem::file_size(path) < h.data_offset + h.data_bytes())
    gnn_fail(path + ": the file is shorter than its header says", EIO);
}

template <class T>
std::vector<std::int64_t> widen(const std::string& path, const npy_header& h) {
  require_whole_npy(path, h);
  std::vector<T> raw(h.elements());
  npy_read(path, h, 0, raw.size(), raw.data());
  return {raw.begin(), raw.end()};
}

inline std::vector<std::int64_t> read_int_npy(const std::string& path) {
  const npy_header h = npy_read_header(path);
  if (h.dtype == "<i8" || h.dtype == "<u8") return widen<std::int64_t>(path, h);
  if (h.dtype == "<i4") return widen<std::int32_t>(path, h);
  if (h.dtype == "<u4") return widen<std::uint32_t>(path, h);
  gnn_fail(path + ": dtype " + h.dtype + " where integer ids are expected (int32 or int64)");
}

//! Refuses an edge list that is not a regular file: the importers read it
//! twice (degrees, then placement), which a pipe or a terminal cannot give.
inline void require_regular_file(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec) gnn_fail(path + ": " + ec.message(), ec.value());
  if (!std::filesystem::is_regular_file(st))
    gnn_fail(path + ": not a regular file (a pipe or a device?): an edge list is read twice, so write it to a file "
                    "first",
             EINVAL);
}

//! A file's size and time of last change: an edge list read twice must show
//! the same both times.
struct file_stamp {
  std::uintmax_t size = 0;
  std::filesystem::file_time_type changed{};
  bool operator==(const file_stamp&) const = default;
};
inline file_stamp stamp_of(const std::string& path) {
  return {std::filesystem::file_size(path), std::filesystem::last_write_time(path)};
}

//! Whether `path` names a NumPy file (by its suffix, in any case).
inline bool npy_name(const std::string& path) {
  if (path.size() < 4) return false;
  std::string tail = path.substr(path.size() - 4);
  std::transform(tail.begin(), tail.end(), tail.begin(), [](unsigned char c) { return std::tolower(c); });
  return tail == ".npy";
}

//! Calls f(src, dst, edge index) for every edge of a .npy array of shape
//! (E, 2) or (2, E) of int32/int64 ids, read in chunks.
template <class F>
void for_each_npy_edge(const std::string& path, F&& f) {
  {
    const npy_header h = npy_read_header(path);
    require_whole_npy(path, h);
    if (h.shape.size() != 2 || (h.shape[0] != 2 && h.shape[1] != 2))
      gnn_fail(path + ": an edge array has shape (E, 2) or (2, E)");
    const bool pairs = h.shape[1] == 2; // (2, 2) is read as two pairs
    const std::uint64_t e = pairs ? h.shape[0] : h.shape[1];
    constexpr std::uint64_t chunk = 1 << 22;
    auto run = [&](auto zero) {
      using T = decltype(zero);
      std::vector<T> a(2 * std::min(chunk, e)), b;
      if (!pairs) b.resize(std::min(chunk, e));
      for (std::uint64_t lo = 0; lo < e; lo += chunk) {
        const std::uint64_t n = std::min(chunk, e - lo);
        if (pairs) {
          npy_read(path, h, 2 * lo, 2 * n, a.data());
          for (std::uint64_t i = 0; i < n; ++i)
            f(static_cast<std::int64_t>(a[2 * i]), static_cast<std::int64_t>(a[2 * i + 1]), lo + i);
        } else {
          npy_read(path, h, lo, n, a.data());
          npy_read(path, h, e + lo, n, b.data());
          for (std::uint64_t i = 0; i < n; ++i)
            f(static_cast<std::int64_t>(a[i]), static_cast<std::int64_t>(b[i]), lo + i);
        }
      }
    };
    if (h.dtype == "<i8" || h.dtype == "<u8")
      run(std::int64_t{});
    else if (h.dtype == "<i4")
      run(std::int32_t{});
    else if (h.dtype == "<u4")
      run(std::uint32_t{});
    else
      gnn_fail(path + ": dtype " + h.dtype + " where integer ids are expected (int32 or int64)");
  }
}

//! Calls f(src, dst, edge index) for every edge of an edge list: a .npy
//! array (`for_each_npy_edge`), or a text file of two ids a line ('#' and
//! '%' start comments).
template <class F>
void for_each_edge(const std::string& path, F&& f) {
  if (npy_name(path)) return for_each_npy_edge(path, f);
  std::ifstream in(path);
  if (!in) throw_errno("opening " + path);
  std::string line;
  std::uint64_t ln = 0, index = 0;
  while (std::getline(in, line)) {
    ++ln;
    const auto p = line.find_first_not_of(" \t\r");
    if (p != std::string::npos && line.compare(p, 14, "%%MatrixMarket") == 0)
      gnn_fail(path + ":" + std::to_string(ln) +
               ": a Matrix Market file: its 1-based entries and size line are not an edge list (bam-graph import "
               "reads it; or write its entries as 0-based pairs)");
    if (p == std::string::npos || line[p] == '#' || line[p] == '%') continue;
    long long a, b;
    if (std::sscanf(line.c_str() + p, "%lld%*[ \t,]%lld", &a, &b) != 2)
      gnn_fail(path + ":" + std::to_string(ln) + ": expected two node ids, found '" + line + "'");
    f(static_cast<std::int64_t>(a), static_cast<std::int64_t>(b), index++);
  }
}

//! CSR from an edge list, read twice (degrees, then placement) so that no
//! edge list is held in memory: rows sorted, duplicates and self loops dropped.
inline csr_graph csr_from_edges(std::uint64_t nodes, const std::string& path, bool undirected, unsigned threads) {
  require_regular_file(path);
  const file_stamp before = stamp_of(path);
  std::vector<std::int64_t> deg(nodes, 0);
  for_each_edge(path, [&](std::int64_t s, std::int64_t d, std::uint64_t i) {
    for (const std::int64_t id : {s, d})
      if (id < 0 || static_cast<std::uint64_t>(id) >= nodes)
        gnn_fail(path + ": edge " + std::to_string(i) + " names node " + std::to_string(id) + ", outside [0, " +
                 std::to_string(nodes) + ") (the feature table's rows)");
    if (s == d) return;
    ++deg[static_cast<std::size_t>(s)];
    if (undirected) ++deg[static_cast<std::size_t>(d)];
  });
  csr_graph g;
  g.indptr.assign(nodes + 1, 0);
  for (std::uint64_t u = 0; u < nodes; ++u)
    g.indptr[u + 1] = g.indptr[u] + deg[u];
  std::vector<std::int64_t>& cur = deg; // reused as each row's next free position
  std::copy(g.indptr.begin(), g.indptr.end() - 1, cur.begin());
  g.indices.assign(static_cast<std::size_t>(g.indptr[nodes]), 0);
  // The second read must give the first one's edges: a file changed in
  // between is refused, never written past its rows.
  auto changed = [&] { gnn_fail(path + ": the edge list changed while it was read", EIO); };
  for_each_edge(path, [&](std::int64_t s, std::int64_t d, std::uint64_t) {
    if (s < 0 || d < 0 || static_cast<std::uint64_t>(s) >= nodes || static_cast<std::uint64_t>(d) >= nodes) changed();
    if (s == d) return;
    const auto us = static_cast<std::size_t>(s), ud = static_cast<std::size_t>(d);
    if (cur[us] >= g.indptr[us + 1] || (undirected && cur[ud] >= g.indptr[ud + 1])) changed();
    g.indices[static_cast<std::size_t>(cur[us]++)] = static_cast<std::int32_t>(d);
    if (undirected) g.indices[static_cast<std::size_t>(cur[ud]++)] = static_cast<std::int32_t>(s);
  });
  for (std::uint64_t u = 0; u < nodes; ++u)
    if (cur[u] != g.indptr[u + 1]) changed();
  if (stamp_of(path) != before) changed();
  sort_and_merge_rows(g, thread_count(threads));
  return g;
}

} // namespace detail

//! Imports an existing dataset: the features stay in their .npy file
//! (referenced in place, never copied); the graph is written as CSR.
inline manifest import_dataset(const std::filesystem::path& dir, const import_options& o) {
  if (o.features_npy.empty()) detail::gnn_fail("import needs --features FILE.npy (one row per node)");
  if (o.edges.empty() == (o.indptr_npy.empty() || o.indices_npy.empty()))
    detail::gnn_fail("import needs either --edges FILE or both --indptr and --indices");
  const npy_header fh = npy_read_header(o.features_npy);
  if (fh.shape.size() != 2) detail::gnn_fail(o.features_npy + ": features must be 2-D (nodes, dim)");
  if (fh.dtype != "<f4" && fh.dtype != "<f2")
    detail::gnn_fail(o.features_npy + ": features of dtype " + fh.dtype + " (float32 or float16 expected)");
  const std::uint64_t fsize = std::filesystem::file_size(o.features_npy);
  if (fsize < fh.data_offset + fh.data_bytes())
    detail::gnn_fail(o.features_npy + ": the file is shorter than its header says", EIO);
  if (fh.shape[0] < 2)
    detail::gnn_fail(o.features_npy + ": a feature table of " + std::to_string(fh.shape[0]) +
                     " rows: a graph needs 2 nodes or more");
  if (fh.shape[1] == 0 || fh.shape[1] > 0xffffffffull)
    detail::gnn_fail(o.features_npy + ": rows of " + std::to_string(fh.shape[1]) + " features (1 to 2^32 - 1)");
  manifest m;
  m.nodes = fh.shape[0];
  m.features.dim = static_cast<std::uint32_t>(fh.shape[1]);
  m.features.dtype = fh.dtype == "<f4" ? "float32" : "float16";
  m.features.source = "imported";
  m.features.file = std::filesystem::absolute(o.features_npy).string();
  m.features.file_offset = fh.data_offset;
  if (m.nodes > static_cast<std::uint64_t>(INT32_MAX))
    detail::gnn_fail(o.features_npy + ": more than 2^31 - 1 nodes: the CSR stores 32-bit neighbour ids");
  std::filesystem::create_directories(dir);
  csr_graph g;
  if (!o.edges.empty()) {
    g = detail::csr_from_edges(m.nodes, o.edges, o.undirected, o.threads);
    m.graph_source = "imported: edges " + std::filesystem::absolute(o.edges).string();
    m.undirected = o.undirected;
  } else {
    const std::vector<std::int64_t> indptr = detail::read_int_npy(o.indptr_npy);
    const std::vector<std::int64_t> indices = detail::read_int_npy(o.indices_npy);
    check_csr(indptr, indices, m.nodes);
    g.indptr = indptr;
    g.indices.assign(indices.begin(), indices.end());
    m.graph_source = "imported: csr " + std::filesystem::absolute(o.indptr_npy).string();
    m.undirected = false;
  }
  m.edges = g.edges();
  // Whole or not there: the old manifest goes first, each file is written
  // under a temporary name and renamed, the manifest last.
  std::filesystem::remove(dir / manifest_name);
  npy_write((dir / (m.indptr_file + ".partial")).string(), "<i8", {g.indptr.size()}, g.indptr.data());
  npy_write((dir / (m.indices_file + ".partial")).string(), "<i4", {g.indices.size()}, g.indices.data());
  std::filesystem::rename(dir / (m.indptr_file + ".partial"), dir / m.indptr_file);
  std::filesystem::rename(dir / (m.indices_file + ".partial"), dir / m.indices_file);
  write_manifest(dir, m);
  return m;
}

// ---- check ------------------------------------------------------------------

struct check_report {
  std::uint64_t rows_checked = 0;
  std::uint64_t rows_wrong = 0;
  std::uint64_t first_wrong_row = 0;
  std::uint64_t max_degree = 0;
  double mean_degree = 0;
  double top1pct_edge_share = 0; //!< share of stored edges held by the 1% highest-degree nodes
};

//! Checks a dataset: the CSR is one, the feature table has every row, and
//! `sample_rows` random rows (plus the first and last) equal the generator
//! (generated features) or, when `ctrl` is given, the rows read back from
//! the device the manifest names equal the file's (or the generator's).
inline check_report check_dataset(const std::filesystem::path& dir, std::uint64_t sample_rows = 1024,
                                  controller* ctrl = nullptr) {
  const manifest m = read_manifest(dir);
  check_report r;
  const std::vector<std::int64_t> indptr = detail::read_int_npy((dir / m.indptr_file).string());
  // Neighbour ids as stored (int32): a graph of billions of edges is not widened.
  const std::string ipath = (dir / m.indices_file).string();
  const npy_header ih = npy_read_header(ipath);
  if (ih.dtype != "<i4") detail::gnn_fail(ipath + ": dtype " + ih.dtype + ", the dataset format stores int32");
  std::vector<std::int32_t> indices(ih.elements());
  npy_read(ipath, ih, 0, indices.size(), indices.data());
  check_csr(indptr, indices, m.nodes);
  if (indices.size() != m.edges)
    detail::gnn_fail("the manifest says " + std::to_string(m.edges) + " edges, indices.npy has " +
                     std::to_string(indices.size()));
  std::vector<std::int64_t> deg(m.nodes);
  for (std::uint64_t u = 0; u < m.nodes; ++u)
    deg[u] = indptr[u + 1] - indptr[u];
  r.mean_degree = m.nodes ? static_cast<double>(m.edges) / static_cast<double>(m.nodes) : 0;
  std::sort(deg.begin(), deg.end(), std::greater<>());
  r.max_degree = deg.empty() ? 0 : static_cast<std::uint64_t>(deg[0]);
  std::int64_t top = 0;
  for (std::uint64_t i = 0; i < std::max<std::uint64_t>(1, m.nodes / 100); ++i)
    top += deg[i];
  r.top1pct_edge_share = m.edges ? static_cast<double>(top) / static_cast<double>(m.edges) : 0;

  const std::string fpath = features_path(dir, m);
  if (!fpath.empty() && std::filesystem::file_size(fpath) < m.features.file_offset + m.nodes * m.features.row_bytes())
    detail::gnn_fail(fpath + ": the feature table has fewer than " + std::to_string(m.nodes) + " rows", EIO);
  if (ctrl != nullptr && !m.device) detail::gnn_fail("the manifest names no device the features were loaded onto");
  std::mt19937_64 rng(m.nodes ^ 0xc4ec);
  std::vector<std::uint64_t> rows{0, m.nodes - 1};
  for (std::uint64_t i = 0; i < sample_rows; ++i)
    rows.push_back(rng() % m.nodes);
  const std::uint64_t rb = m.features.row_bytes();
  std::unique_ptr<dma_region> dma;
  std::uint32_t lbs = 0;
  if (ctrl != nullptr) {
    lbs = ctrl->ns(m.device->nsid).lba_size;
    dma = ctrl->transport().alloc((rb + 2 * lbs + 4095) / 4096 * 4096);
  }
  std::vector<unsigned char> want(rb);
  for (const std::uint64_t row : rows) {
    bool compared = false, wrong = false;
    if (m.features.source == "generated") {
      generated_features(m).read(row * rb, want.data(), rb);
      if (!fpath.empty()) {
        compared = true;
        wrong = read_feature_rows(dir, m, row, 1) != want;
      }
    } else {
      want = read_feature_rows(dir, m, row, 1);
    }
    if (ctrl != nullptr && !wrong) {
      const std::uint64_t at = m.device->offset + row * rb;
      const std::uint64_t lba = at / lbs, skip = at % lbs;
      const auto blocks = static_cast<std::uint32_t>((skip + rb + lbs - 1) / lbs);
      ctrl->read(m.device->nsid, lba, blocks, *dma);
      compared = true;
      wrong = std::memcmp(dma->as<unsigned char>() + skip, want.data(), rb) != 0;
    }
    if (!compared) continue;
    ++r.rows_checked;
    if (wrong && r.rows_wrong++ == 0) r.first_wrong_row = row;
  }
  return r;
}

} // namespace bam::gnn
