// SPDX-License-Identifier: MIT
// A graph on disk, as `bam-graph` makes, imports, loads and checks it:
//
//   DIR/manifest.json   nodes, edges, where the graph came from, and (once
//                       loaded) the device string, namespace and byte offset
//   DIR/offsets.npy     uint64, nodes + 1 entries  } undirected, in CSR: the
//   DIR/edges.npy       uint32, edges entries      } neighbours of u are
//                       edges[offsets[u] .. offsets[u + 1]), sorted, no
//                       duplicates, no self loops, every edge stored in both
//                       directions (edges counts both)
//
// On a device the graph is one image (graph_image): the offsets at the
// image's first byte, the edges at the next MiB boundary past them (so that
// both arrays start on a page boundary for any cache page size), zero
// padding in between. Every file is written under a temporary name and
// renamed when complete, the manifest last.
#pragma once

#include "../gnn/gnn_dataset.hpp"

#include <bam/host.hpp>
#include <bam/host/dataset.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace bam::gnn {
// device_placement as a JSON object (found by argument-dependent lookup).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(device_placement, device, nsid, offset, lba_size, checksum)
} // namespace bam::gnn

namespace bam::graph {

using gnn::csr_graph;
using gnn::detail::gnn_fail;

inline constexpr const char* manifest_name = "manifest.json";
inline constexpr int manifest_version = 1;
//! The edges' offset in a graph image is a multiple of this.
inline constexpr std::uint64_t image_alignment = 1ull << 20;

//! Where the two arrays lie in a graph image (bytes from its start).
struct graph_image {
  std::uint64_t nodes = 0, edges = 0;
  std::uint64_t offsets_bytes() const { return 8 * (nodes + 1); }
  std::uint64_t edges_at() const { return (offsets_bytes() + image_alignment - 1) / image_alignment * image_alignment; }
  std::uint64_t edges_bytes() const { return 4 * edges; }
  std::uint64_t bytes() const { return edges_at() + edges_bytes(); }
};

//! Where `bam-graph load` wrote the image: device string, namespace, byte
//! offset, LBA size and XXH3-128 checksum (as bam-gnn records its tables).
using gnn::device_placement;

struct manifest {
  std::uint64_t nodes = 0, edges = 0; //!< edges: stored entries, both directions of each
  std::string source;                 //!< "rmat" or "imported: PATH (FORMAT)"
  unsigned scale = 0;                 //!< rmat: 2^scale nodes
  double degree = 0;                  //!< rmat: undirected edges drawn per node (Graph500's edge factor)
  std::uint64_t seed = 0;
  std::optional<device_placement> device;
  graph_image image() const { return {nodes, edges}; }
};

inline nlohmann::ordered_json to_json(const manifest& m) {
  nlohmann::ordered_json j;
  j["format"] = "bam-graph";
  j["version"] = manifest_version;
  j["nodes"] = m.nodes;
  j["edges"] = m.edges;
  j["undirected"] = true;
  j["source"] = m.source;
  if (m.source == "rmat")
    j["rmat"] = {{"scale", m.scale}, {"degree", m.degree}, {"seed", m.seed}, {"abc", {0.57, 0.19, 0.19}}};
  j["offsets"] = {{"file", "offsets.npy"}, {"dtype", "uint64"}};
  j["edge_ids"] = {{"file", "edges.npy"}, {"dtype", "uint32"}};
  const graph_image im = m.image();
  j["image"] = {{"offsets_at", 0}, {"edges_at", im.edges_at()}, {"bytes", im.bytes()}};
  if (m.device) j["device"] = nlohmann::ordered_json(nlohmann::json(*m.device));
  return j;
}

inline manifest read_manifest(const std::filesystem::path& dir) {
  const auto p = dir / manifest_name;
  std::ifstream f(p);
  if (!f) gnn_fail(p.string() + ": no graph here (make one with bam-graph make, or bam-graph import)", ENOENT);
  manifest m;
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    if (j.value("format", "") != "bam-graph") gnn_fail(p.string() + ": not a bam-graph manifest");
    if (j.value("version", 0) != manifest_version)
      gnn_fail(p.string() + ": manifest version " + std::to_string(j.value("version", 0)) + ", this tool reads " +
               std::to_string(manifest_version));
    m.nodes = j.at("nodes");
    m.edges = j.at("edges");
    m.source = j.at("source");
    if (j.contains("rmat")) {
      m.scale = j["rmat"].at("scale");
      m.degree = j["rmat"].at("degree");
      m.seed = j["rmat"].at("seed");
    }
    if (j.contains("device")) m.device = j.at("device").get<device_placement>();
  } catch (const nlohmann::json::exception& e) {
    gnn_fail(p.string() + ": " + e.what());
  }
  return m;
}

inline void write_manifest(const std::filesystem::path& dir, const manifest& m) {
  gnn::write_atomically(dir / manifest_name, to_json(m).dump(2) + "\n");
}

//! The graph's arrays written into `dir` (offsets.npy, edges.npy). The CSR's
//! signed ids are non-negative: their bytes are those of uint64 and uint32.
inline void write_arrays(const std::filesystem::path& dir, const csr_graph& g) {
  std::filesystem::create_directories(dir);
  gnn::npy_write((dir / "offsets.npy.partial").string(), "<u8", {g.indptr.size()}, g.indptr.data());
  gnn::npy_write((dir / "edges.npy.partial").string(), "<u4", {g.indices.size()}, g.indices.data());
  std::filesystem::rename(dir / "offsets.npy.partial", dir / "offsets.npy");
  std::filesystem::rename(dir / "edges.npy.partial", dir / "edges.npy");
}

//! The graph of `dir` in memory, checked to be a CSR of the manifest's size.
inline csr_graph read_graph(const std::filesystem::path& dir, const manifest& m) {
  csr_graph g;
  const std::string op = (dir / "offsets.npy").string(), ep = (dir / "edges.npy").string();
  const gnn::npy_header oh = gnn::npy_read_header(op), eh = gnn::npy_read_header(ep);
  if (oh.dtype != "<u8" || oh.elements() != m.nodes + 1)
    gnn_fail(op + ": expected " + std::to_string(m.nodes + 1) + " uint64 offsets, found " +
             std::to_string(oh.elements()) + " of " + oh.dtype);
  if (eh.dtype != "<u4" || eh.elements() != m.edges)
    gnn_fail(ep + ": expected " + std::to_string(m.edges) + " uint32 edges, found " + std::to_string(eh.elements()) +
             " of " + eh.dtype);
  g.indptr.resize(m.nodes + 1);
  g.indices.resize(m.edges);
  gnn::npy_read(op, oh, 0, g.indptr.size(), g.indptr.data());
  gnn::npy_read(ep, eh, 0, g.indices.size(), g.indices.data());
  gnn::check_csr(g.indptr, g.indices, m.nodes);
  return g;
}

//! The image of `g` (see graph_image) as a byte source: for loading onto a
//! device and for filling an in-process medium. `g` must outlive it.
inline data_source image_source(const csr_graph& g) {
  const graph_image im{g.nodes(), g.edges()};
  data_source s;
  s.size = im.bytes();
  s.identity = "bam-graph image: " + std::to_string(im.nodes) + " nodes, " + std::to_string(im.edges) + " edges";
  const auto* off = reinterpret_cast<const unsigned char*>(g.indptr.data());
  const auto* edg = reinterpret_cast<const unsigned char*>(g.indices.data());
  s.read = [im, off, edg](std::uint64_t at, void* dst, std::size_t len) {
    auto* out = static_cast<unsigned char*>(dst);
    std::memset(out, 0, len);
    // The two arrays' parts of [at, at + len); the padding stays zero.
    auto part = [&](std::uint64_t lo, std::uint64_t bytes, const unsigned char* src) {
      const std::uint64_t b = std::max(at, lo), e = std::min(at + len, lo + bytes);
      if (b < e) std::memcpy(out + (b - at), src + (b - lo), e - b);
    };
    part(0, im.offsets_bytes(), off);
    part(im.edges_at(), im.edges_bytes(), edg);
  };
  return s;
}

// ---- make -------------------------------------------------------------------

struct make_options {
  unsigned scale = 16;
  double degree = 16; //!< undirected edges drawn per node (before duplicates merge), as Graph500's edge factor
  std::uint64_t seed = 1;
  unsigned threads = 0;
  bool force = false;
  std::function<void(const char*, std::uint64_t, std::uint64_t)> progress;
};

struct make_result {
  manifest m;
  bool already_there = false;
};

//! An R-MAT graph (GAP's kron: a = 0.57, b = 0.19, c = 0.19) of 2^scale
//! nodes, symmetric, deduplicated, written into `dir`; nothing is written
//! when `dir` holds this graph already.
inline make_result make_graph(const std::filesystem::path& dir, const make_options& o) {
  if (o.scale < 1 || o.scale > 31) gnn_fail("--scale " + std::to_string(o.scale) + ": 1 to 31 (2^31 nodes at most)");
  make_result r;
  r.m.nodes = std::uint64_t{1} << o.scale;
  r.m.source = "rmat";
  r.m.scale = o.scale;
  r.m.degree = o.degree;
  r.m.seed = o.seed;
  if (auto old = gnn::detail::manifest_to_reuse(
          dir / manifest_name, o.force, "another graph", [&] { return read_manifest(dir); },
          [&](const manifest& m) {
            return m.source == "rmat" && m.scale == o.scale && m.degree == o.degree && m.seed == o.seed;
          })) {
    r.m = *old;
    r.already_there = true;
    return r;
  }
  gnn::rmat_options go;
  go.nodes = r.m.nodes == (std::uint64_t{1} << 31) ? r.m.nodes - 1 : r.m.nodes;
  go.avg_degree = 2 * o.degree; // both directions of each drawn edge are stored
  go.seed = o.seed;
  go.undirected = true;
  go.threads = o.threads;
  go.progress = o.progress;
  const csr_graph g = gnn::make_rmat(go);
  r.m.nodes = g.nodes();
  r.m.edges = g.edges();
  write_arrays(dir, g);
  write_manifest(dir, r.m);
  return r;
}

// ---- import -----------------------------------------------------------------

//! Edge list formats: SNAP text ("u v" a line, '#' comments, 0-based),
//! NumPy (E, 2) or (2, E) integer arrays, Matrix Market coordinate (1-based).
enum class edge_format { snap, npy, mtx };

inline edge_format edge_format_of(const std::string& path, const std::string& name) {
  if (name == "snap") return edge_format::snap;
  if (name == "npy") return edge_format::npy;
  if (name == "mtx") return edge_format::mtx;
  if (!name.empty() && name != "auto") gnn_fail("--format " + name + ": snap, npy or mtx");
  auto ends = [&](const char* s) {
    const std::size_t n = std::strlen(s);
    return path.size() >= n && path.compare(path.size() - n, n, s) == 0;
  };
  if (gnn::detail::npy_name(path)) return edge_format::npy;
  if (ends(".mtx") || ends(".MTX")) return edge_format::mtx;
  return edge_format::snap;
}

inline const char* format_name(edge_format f) {
  return f == edge_format::npy ? "npy" : f == edge_format::mtx ? "mtx" : "snap";
}

namespace detail {

//! A whole number at `p` (after blanks and commas); advances `p`. False when
//! there is none; `negative` tells a leading minus sign.
inline bool next_id(const char*& p, std::uint64_t& v, bool& negative) {
  while (*p == ' ' || *p == '\t' || *p == ',')
    ++p;
  negative = *p == '-';
  if (negative) ++p;
  if (*p < '0' || *p > '9') return false;
  char* end = nullptr;
  errno = 0;
  v = std::strtoull(p, &end, 10);
  if (errno == ERANGE) return false;
  p = end;
  return *p == '\0' || *p == ' ' || *p == '\t' || *p == ',' || *p == '\r' || *p == '\n';
}

//! Node ids an imported graph may hold: 0 .. 2^31 - 2 (neighbour ids are
//! stored as int32, and a graph holds 2^31 - 1 nodes at most).
inline constexpr std::uint64_t max_node_ids = static_cast<std::uint64_t>(INT32_MAX);

//! Calls f(u, v) for each edge of a text edge list (SNAP or Matrix Market,
//! ids 0-based as given to f); `max_id` receives the highest id a Matrix
//! Market header allows (0 for SNAP). Errors name the file and line.
template <class F>
void for_each_text_edge(const std::string& path, bool mtx, std::uint64_t& max_id, F&& f) {
  std::ifstream in(path);
  if (!in) throw_errno("opening " + path);
  std::string line;
  std::uint64_t ln = 0, entries = 0, declared = 0, rows = 0, cols = 0;
  bool have_size = !mtx;
  max_id = 0;
  auto fail = [&](const std::string& why) { gnn_fail(path + ":" + std::to_string(ln) + ": " + why); };
  while (std::getline(in, line)) {
    ++ln;
    if (mtx && ln == 1) {
      std::string banner = line;
      std::transform(banner.begin(), banner.end(), banner.begin(), [](unsigned char c) { return std::tolower(c); });
      if (banner.rfind("%%matrixmarket", 0) != 0) fail("not a Matrix Market file (no %%MatrixMarket banner)");
      if (banner.find("coordinate") == std::string::npos)
        fail("a Matrix Market 'array' (dense) matrix is not a graph: expected 'coordinate'");
      continue;
    }
    const auto at = line.find_first_not_of(" \t\r");
    if (!mtx && at != std::string::npos && line.compare(at, 2, "%%") == 0) {
      std::string banner = line.substr(at);
      std::transform(banner.begin(), banner.end(), banner.begin(), [](unsigned char c) { return std::tolower(c); });
      if (banner.rfind("%%matrixmarket", 0) == 0) fail("a Matrix Market file: pass --format mtx");
    }
    if (at == std::string::npos || line[at] == '#' || line[at] == '%') continue;
    const char* p = line.c_str() + at;
    std::uint64_t a = 0, b = 0;
    bool neg_a = false, neg_b = false;
    if (!next_id(p, a, neg_a) || !next_id(p, b, neg_b))
      fail(std::string(have_size ? "expected two node ids" : "expected the size line 'rows columns entries'") +
           ", found '" + line + "'");
    if (neg_a || neg_b) fail("negative node id in '" + line + "'");
    if (!have_size) {
      bool neg = false;
      if (!next_id(p, declared, neg) || neg)
        fail("expected the size line 'rows columns entries', found '" + line + "'");
      rows = a;
      cols = b;
      if (rows != cols)
        fail("a " + std::to_string(rows) + " x " + std::to_string(cols) +
             " matrix: a graph's adjacency matrix is square (rows and columns are the same nodes)");
      if (rows == 0) fail("a 0 x 0 matrix: an empty graph");
      max_id = rows - 1;
      have_size = true;
      continue;
    }
    if (mtx) {
      if (a == 0 || b == 0 || a > rows || b > cols)
        fail("entry (" + std::to_string(a) + ", " + std::to_string(b) + ") outside the " + std::to_string(rows) +
             " x " + std::to_string(cols) + " matrix (ids are 1-based)");
      if (++entries > declared) fail("more entries than the " + std::to_string(declared) + " the size line declares");
      --a;
      --b;
    }
    if (a >= max_node_ids || b >= max_node_ids) fail("node id past 2^31 - 2 (bam-graph stores 2^31 - 1 nodes at most)");
    f(a, b);
  }
  if (mtx && !have_size) gnn_fail(path + ": no size line 'rows columns entries'");
  if (mtx && entries != declared)
    gnn_fail(path + ":" + std::to_string(ln) + ": the file ends after " + std::to_string(entries) + " of the " +
             std::to_string(declared) + " entries its size line declares");
}

//! Calls f(u, v) for each edge of `path` in format `fmt`; `max_id` as above.
template <class F>
void for_each_edge(const std::string& path, edge_format fmt, std::uint64_t& max_id, F&& f) {
  if (fmt != edge_format::npy) return for_each_text_edge(path, fmt == edge_format::mtx, max_id, f);
  max_id = 0;
  gnn::detail::for_each_npy_edge(path, [&](std::int64_t u, std::int64_t v, std::uint64_t i) {
    if (u < 0 || v < 0 || static_cast<std::uint64_t>(u) >= max_node_ids ||
        static_cast<std::uint64_t>(v) >= max_node_ids)
      gnn_fail(path + ": edge " + std::to_string(i) + " (" + std::to_string(u) + ", " + std::to_string(v) +
               ") names a node id outside [0, 2^31 - 2] (bam-graph stores 2^31 - 1 nodes at most)");
    f(static_cast<std::uint64_t>(u), static_cast<std::uint64_t>(v));
  });
}

} // namespace detail

struct import_options {
  std::string edges;       //!< the edge list
  std::string format;      //!< snap, npy, mtx; empty or "auto": from the file name (.npy, .mtx, else snap)
  std::uint64_t nodes = 0; //!< 0: the highest id + 1 (Matrix Market: the matrix's size)
  unsigned threads = 0;
  bool force = false;
};

//! The symmetric, deduplicated CSR of an edge list (read twice: degrees,
//! then placement, so that the list itself is never held in memory). Self
//! loops are dropped.
inline csr_graph csr_from_edge_list(const import_options& o) {
  const edge_format fmt = edge_format_of(o.edges, o.format);
  gnn::detail::require_regular_file(o.edges);
  const gnn::detail::file_stamp before = gnn::detail::stamp_of(o.edges);
  std::vector<std::int64_t> count;
  std::uint64_t max_id = 0, top = 0;
  detail::for_each_edge(o.edges, fmt, max_id, [&](std::uint64_t u, std::uint64_t v) {
    // Before anything grows for it (ids are below max_node_ids here).
    if (o.nodes != 0 && std::max(u, v) >= o.nodes)
      gnn_fail(o.edges + ": node id " + std::to_string(std::max(u, v)) + " is past --nodes " + std::to_string(o.nodes));
    top = std::max({top, u + 1, v + 1});
    if (top > count.size())
      count.resize(std::min<std::uint64_t>(std::max<std::uint64_t>(top, 2 * count.size()),
                                           o.nodes != 0 ? o.nodes : detail::max_node_ids));
    if (u == v) return;
    ++count[u];
    ++count[v];
  });
  const std::uint64_t nodes = std::max({o.nodes, top, fmt == edge_format::mtx ? max_id + 1 : 0});
  if (o.nodes != 0 && top > o.nodes)
    gnn_fail(o.edges + ": node id " + std::to_string(top - 1) + " is past --nodes " + std::to_string(o.nodes));
  if (nodes < 1) gnn_fail(o.edges + ": no edges and no --nodes: an empty graph");
  if (nodes > static_cast<std::uint64_t>(INT32_MAX))
    gnn_fail(o.edges + ": " + std::to_string(nodes) + " nodes: bam-graph stores 2^31 - 1 at most");
  count.resize(nodes, 0);
  csr_graph g;
  g.indptr.assign(nodes + 1, 0);
  for (std::uint64_t u = 0; u < nodes; ++u)
    g.indptr[u + 1] = g.indptr[u] + count[u];
  g.indices.resize(static_cast<std::size_t>(g.indptr[nodes]));
  std::copy(g.indptr.begin(), g.indptr.end() - 1, count.begin()); // each row's next free slot
  // The second read must give the first one's edges: a file changed in
  // between is refused, never written past its rows.
  auto changed = [&] { gnn_fail(o.edges + ": the edge list changed while it was read", EIO); };
  detail::for_each_edge(o.edges, fmt, max_id, [&](std::uint64_t u, std::uint64_t v) {
    if (u >= nodes || v >= nodes) changed();
    if (u == v) return;
    if (count[u] >= g.indptr[u + 1] || count[v] >= g.indptr[v + 1]) changed();
    g.indices[static_cast<std::size_t>(count[u]++)] = static_cast<std::int32_t>(v);
    g.indices[static_cast<std::size_t>(count[v]++)] = static_cast<std::int32_t>(u);
  });
  for (std::uint64_t u = 0; u < nodes; ++u)
    if (count[u] != g.indptr[u + 1]) changed();
  if (gnn::detail::stamp_of(o.edges) != before) changed();
  gnn::sort_and_merge_rows(g, gnn::detail::thread_count(o.threads));
  return g;
}

//! Imports an edge list into `dir` as a symmetric CSR.
inline manifest import_graph(const std::filesystem::path& dir, const import_options& o) {
  if (std::filesystem::exists(dir / manifest_name) && !o.force)
    gnn_fail((dir / manifest_name).string() + " holds a graph already: pass --force to replace it", EEXIST);
  const csr_graph g = csr_from_edge_list(o);
  manifest m;
  m.nodes = g.nodes();
  m.edges = g.edges();
  m.source = "imported: " + std::filesystem::absolute(o.edges).string() + " (" +
             format_name(edge_format_of(o.edges, o.format)) + ")";
  std::filesystem::remove(dir / manifest_name);
  write_arrays(dir, g);
  write_manifest(dir, m);
  return m;
}

// ---- check ------------------------------------------------------------------

struct check_report {
  std::uint64_t max_degree = 0;
  std::uint64_t isolated = 0; //!< nodes without a neighbour
  bool device_checked = false;
};

//! Checks the graph of `dir`: a CSR, each row sorted without duplicates or
//! self loops, every edge stored in both directions; and, with `ctrl`, that
//! the device the manifest names holds its image. Throws `bam::error`
//! naming the first fault.
inline check_report check_graph(const std::filesystem::path& dir, controller* ctrl = nullptr) {
  const manifest m = read_manifest(dir);
  const csr_graph g = read_graph(dir, m);
  check_report r;
  auto row = [&](std::uint64_t u) {
    return std::pair(g.indices.begin() + g.indptr[u], g.indices.begin() + g.indptr[u + 1]);
  };
  for (std::uint64_t u = 0; u < m.nodes; ++u) {
    const auto [b, e] = row(u);
    r.max_degree = std::max<std::uint64_t>(r.max_degree, static_cast<std::uint64_t>(e - b));
    if (b == e) ++r.isolated;
    for (auto it = b; it != e; ++it) {
      const auto v = static_cast<std::uint64_t>(*it);
      if (v == u) gnn_fail("node " + std::to_string(u) + " has a self loop");
      if (it + 1 != e && *(it + 1) <= *it)
        gnn_fail("the neighbours of node " + std::to_string(u) + " are not sorted without duplicates");
      const auto [vb, ve] = row(v);
      if (!std::binary_search(vb, ve, static_cast<std::int32_t>(u)))
        gnn_fail("edge " + std::to_string(u) + " -> " + std::to_string(v) + " is stored in one direction only");
    }
  }
  if (ctrl == nullptr) return r;
  if (!m.device) gnn_fail("the graph was never loaded onto a device (bam-graph load)");
  const data_source src = image_source(g);
  const std::uint32_t lbs = ctrl->ns(m.device->nsid).lba_size;
  constexpr std::uint64_t chunk = 1ull << 20;
  auto dma = ctrl->transport().alloc(chunk);
  std::vector<unsigned char> want(chunk);
  for (std::uint64_t at = 0; at < src.size; at += chunk) {
    const std::uint64_t len = std::min(chunk, src.size - at);
    const auto blocks = static_cast<std::uint32_t>((len + lbs - 1) / lbs);
    ctrl->read(m.device->nsid, (m.device->offset + at) / lbs, blocks, *dma);
    src.read(at, want.data(), len);
    if (std::memcmp(dma->as<unsigned char>(), want.data(), len) != 0)
      gnn_fail(m.device->device + ": the graph image differs from the files in the MiB at byte " +
                   std::to_string(m.device->offset + at),
               EIO);
  }
  r.device_checked = true;
  return r;
}

} // namespace bam::graph
