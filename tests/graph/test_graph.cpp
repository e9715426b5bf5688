// SPDX-License-Identifier: MIT
// bam-graph on the CPU: the R-MAT graph (symmetric, deduplicated, the same
// for any thread count), the edge-list importers (SNAP, .npy, Matrix Market;
// malformed input refused naming its line), the CPU algorithms against
// answers worked out by hand, the validators (a wrong BFS parent, a missed
// node, a cycle, a merged component are each caught), and the bam-graph
// command: make, check, load onto a software controller, check the device.
#include "graph_cpu.hpp"
#include "graph_dataset.hpp"

#include "gnn_test_util.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using bam::gnn::csr_graph;
using bam_gnn_test::temp_dir;
using Catch::Matchers::ContainsSubstring;

//! The bam-graph command (the helper runs the program BAM_GNN_PATH names: bam-graph here).
bam_gnn_test::run_result bam_graph(const std::string& args) { return bam_gnn_test::bam_gnn(args); }

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

//! An undirected graph from its edges, through the SNAP importer.
csr_graph graph_of(const temp_dir& t, const std::string& edges, std::uint64_t nodes = 0) {
  write_text(t / "g.txt", edges);
  bam::graph::import_options o;
  o.edges = t / "g.txt";
  o.nodes = nodes;
  return bam::graph::csr_from_edge_list(o);
}

std::vector<std::int32_t> row(const csr_graph& g, std::uint64_t u) {
  return {g.indices.begin() + g.indptr[u], g.indices.begin() + g.indptr[u + 1]};
}

// Two components {0, 1, 2, 3} (a path 0-1-2-3 and a chord 0-2) and {4, 5}; node 6 alone.
const char* two_parts = "# a comment\n0 1\n1 2\n2 3\n0 2\n4 5\n";

} // namespace

TEST_CASE("make: R-MAT of 2^scale nodes, symmetric, deduplicated, the same again", "[graph]") {
  temp_dir t;
  bam::graph::make_options o;
  o.scale = 12;
  o.degree = 8;
  o.threads = 2;
  const auto r = bam::graph::make_graph(t.path / "g", o);
  CHECK(r.m.nodes == 4096);
  CHECK(r.m.edges % 2 == 0);
  CHECK(r.m.edges > 4096 * 8); // most of the 8 x 4096 drawn edges survive, each stored twice
  CHECK(r.m.edges <= 2 * 4096 * 8);
  const auto report = bam::graph::check_graph(t.path / "g");
  CHECK(report.max_degree > 100); // a power law: hubs
  const csr_graph g = bam::graph::read_graph(t.path / "g", r.m);
  o.threads = 1;
  CHECK(bam::graph::make_graph(t.path / "g", o).already_there);
  const auto again = bam::graph::make_graph(t.path / "h", o);
  CHECK(bam::graph::read_graph(t.path / "h", again.m).indices == g.indices);
  o.seed = 2;
  CHECK_THROWS_WITH(bam::graph::make_graph(t.path / "g", o), ContainsSubstring("--force"));
  // A manifest cut short, or another tool's: refused, then replaced with --force.
  write_text(t / "g/manifest.json", "{\"format\": \"bam-gnn\"");
  CHECK_THROWS_WITH(bam::graph::make_graph(t.path / "g", o), ContainsSubstring("cannot be read"));
  o.force = true;
  const auto replaced = bam::graph::make_graph(t.path / "g", o);
  CHECK_FALSE(replaced.already_there);
  CHECK_NOTHROW(bam::graph::check_graph(t.path / "g"));
}

TEST_CASE("import: SNAP, .npy and Matrix Market give the same symmetric CSR", "[graph]") {
  temp_dir t;
  // Duplicates, an edge in both directions and a self loop.
  const csr_graph snap = graph_of(t, "# from SNAP\n0 1\n1 0\n\n1 2\t\n2 2\n0 1\n3 1\n", 6);
  CHECK(snap.nodes() == 6);
  CHECK(row(snap, 0) == std::vector<std::int32_t>{1});
  CHECK(row(snap, 1) == std::vector<std::int32_t>{0, 2, 3});
  CHECK(row(snap, 2) == std::vector<std::int32_t>{1});
  CHECK(row(snap, 5).empty());

  const std::vector<std::int64_t> pairs{0, 1, 1, 2, 3, 1, 2, 2};
  bam::gnn::npy_write(t / "e.npy", "<i8", {4, 2}, pairs.data());
  bam::graph::import_options o;
  o.edges = t / "e.npy";
  o.nodes = 6;
  const csr_graph npy = bam::graph::csr_from_edge_list(o);
  CHECK(npy.indptr == snap.indptr);
  CHECK(npy.indices == snap.indices);

  write_text(t / "m.mtx", "%%MatrixMarket matrix coordinate pattern symmetric\n% comment\n6 6 3\n2 1\n3 2\n4 2\n");
  o.edges = t / "m.mtx";
  o.nodes = 0;
  const csr_graph mtx = bam::graph::csr_from_edge_list(o);
  CHECK(mtx.indptr == snap.indptr);
  CHECK(mtx.indices == snap.indices);

  const auto m = bam::graph::import_graph(t.path / "imported", o);
  CHECK(m.nodes == 6);
  CHECK(m.edges == 6);
  CHECK_NOTHROW(bam::graph::check_graph(t.path / "imported"));
}

TEST_CASE("import: malformed input is refused, naming the file and line", "[graph]") {
  temp_dir t;
  bam::graph::import_options o;
  auto refuse = [&](const std::string& name, const std::string& text, const std::string& says) {
    write_text(t / name, text);
    o.edges = t / name;
    CHECK_THROWS_WITH(bam::graph::csr_from_edge_list(o), ContainsSubstring(says));
  };
  refuse("a.txt", "0 1\n# fine\n2 x\n", "a.txt:3: expected two node ids, found '2 x'");
  refuse("b.txt", "0 1\n1 -4\n", "b.txt:2: negative node id");
  refuse("c.txt", "0 1\n7\n", "c.txt:2: expected two node ids");
  refuse("d.mtx", "0 1\n", "d.mtx:1: not a Matrix Market file");
  refuse("e.mtx", "%%MatrixMarket matrix array real general\n2 2\n1\n", "a Matrix Market 'array'");
  refuse("f.mtx", "%%MatrixMarket matrix coordinate pattern general\n3 3 2\n1 2\n3 4\n",
         "f.mtx:4: entry (3, 4) outside the 3 x 3 matrix");
  refuse("g.mtx", "%%MatrixMarket matrix coordinate real general\n3 3 3\n1 2 0.5\n2 3 1.0\n",
         "the file ends after 2 of the 3 entries");
  refuse("h.mtx", "%%MatrixMarket matrix coordinate pattern general\n%\nthree by three\n",
         "h.mtx:3: expected the size line");
  // Square adjacency matrices only, and an empty one is an empty graph.
  refuse("j.mtx", "%%MatrixMarket matrix coordinate pattern general\n3 5 2\n1 2\n3 5\n",
         "j.mtx:2: a 3 x 5 matrix: a graph's adjacency matrix is square");
  refuse("k.mtx", "%%MatrixMarket matrix coordinate pattern general\n0 0 0\n",
         "k.mtx:2: a 0 x 0 matrix: an empty graph");
  // A Matrix Market file read as SNAP text (no .mtx name) is named, not misread.
  refuse("l.txt", "%%MatrixMarket matrix coordinate pattern general\n3 3 2\n1 2\n2 3\n",
         "l.txt:1: a Matrix Market file: pass --format mtx");
  // Ids a graph cannot hold are refused before anything is sized for them
  // (an id of 2^32 - 2 once made the import zero 32 GiB first).
  refuse("m.txt", "0 1\n0 4294967294\n", "m.txt:2: node id past 2^31 - 2");
  refuse("n.txt", "0 2147483647\n", "node id past 2^31 - 2");
  const std::vector<std::int64_t> far{0, 1, 2147483647, 3};
  bam::gnn::npy_write(t / "far.npy", "<i8", {2, 2}, far.data());
  o.edges = t / "far.npy";
  CHECK_THROWS_WITH(bam::graph::csr_from_edge_list(o), ContainsSubstring("outside [0, 2^31 - 2]"));
  o.nodes = 2;
  refuse("i.txt", "0 1\n1 5\n", "node id 5 is past --nodes 2");
  refuse("o.txt", "0 1\n1 2000000000\n", "node id 2000000000 is past --nodes 2");
}

TEST_CASE("import: --format npy reads any file name as NumPy; .NPY is NumPy too", "[graph]") {
  temp_dir t;
  const std::vector<std::int64_t> pairs{0, 1, 1, 2, 3, 1};
  bam::gnn::npy_write(t / "edges.bin", "<i8", {3, 2}, pairs.data());
  bam::gnn::npy_write(t / "E.NPY", "<i8", {3, 2}, pairs.data());
  write_text(t / "e.txt", "0 1\n1 2\n3 1\n");
  bam::graph::import_options o;
  o.edges = t / "e.txt";
  const csr_graph text = bam::graph::csr_from_edge_list(o);
  o.edges = t / "edges.bin";
  o.format = "npy";
  const csr_graph bin = bam::graph::csr_from_edge_list(o);
  CHECK(bin.indptr == text.indptr);
  CHECK(bin.indices == text.indices);
  o.edges = t / "E.NPY";
  o.format = "";
  const csr_graph upper = bam::graph::csr_from_edge_list(o);
  CHECK(upper.indices == text.indices);
  // A text file said to be NumPy is refused as one.
  o.edges = t / "e.txt";
  o.format = "npy";
  CHECK_THROWS(bam::graph::csr_from_edge_list(o));
}

TEST_CASE("import: an edge list that is not a regular file is refused (it is read twice)", "[graph]") {
  temp_dir t;
  const std::filesystem::path fifo = t / "edges.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  bam::graph::import_options o;
  o.edges = fifo;
  // Refused before it is opened: opening a FIFO with no writer would block.
  CHECK_THROWS_WITH(bam::graph::csr_from_edge_list(o), ContainsSubstring("not a regular file"));
  o.edges = t.path; // a directory
  CHECK_THROWS_WITH(bam::graph::csr_from_edge_list(o), ContainsSubstring("not a regular file"));
}

TEST_CASE("CPU BFS, and the Graph500 validator catching wrong parents", "[graph]") {
  temp_dir t;
  const csr_graph g = graph_of(t, two_parts, 7);
  const auto parent = bam::graph::bfs_cpu(g, 0);
  const std::vector<std::uint32_t> want{0, 0, 0, 2, bam::graph::no_node, bam::graph::no_node, bam::graph::no_node};
  CHECK(parent == want);
  const auto ok = bam::graph::validate_bfs(g, 0, parent);
  CHECK(ok.ok);
  CHECK(ok.reached == 4);
  CHECK(ok.component_edges == 8);

  auto bad = parent;
  bad[3] = 1; // 1 is no neighbour of 3
  auto r = bam::graph::validate_bfs(g, 0, bad);
  CHECK_FALSE(r.ok);
  CHECK_THAT(r.why, ContainsSubstring("node 3 has parent 1, which is not one of its neighbours"));
  bad = parent;
  bad[2] = 1; // a neighbour, but a level too deep: 0-2 then joins levels 0 and 2
  CHECK_FALSE(bam::graph::validate_bfs(g, 0, bad).ok);
  bad = parent;
  bad[3] = bam::graph::no_node; // a reachable node missed
  r = bam::graph::validate_bfs(g, 0, bad);
  CHECK_FALSE(r.ok);
  CHECK_THAT(r.why, ContainsSubstring("missed"));
  bad = parent;
  bad[1] = 2;
  bad[2] = 1; // a cycle off the root
  CHECK_FALSE(bam::graph::validate_bfs(g, 0, bad).ok);
  bad = parent;
  bad[0] = 1;
  CHECK_THAT(bam::graph::validate_bfs(g, 0, bad).why, ContainsSubstring("not its own parent"));
}

TEST_CASE("CPU connected components and the partition check", "[graph]") {
  temp_dir t;
  const csr_graph g = graph_of(t, two_parts, 7);
  const auto labels = bam::graph::cc_cpu(g);
  CHECK(labels == std::vector<std::uint32_t>{0, 0, 0, 0, 4, 4, 6});
  const auto same = bam::graph::same_partition({3, 3, 3, 3, 5, 5, 1}, labels);
  CHECK(same.ok);
  CHECK(same.reached == 3);                                                  // components
  CHECK_FALSE(bam::graph::same_partition({0, 0, 0, 0, 0, 0, 6}, labels).ok); // two merged
  CHECK_FALSE(bam::graph::same_partition({0, 0, 1, 1, 4, 4, 6}, labels).ok); // one split

  // A larger graph: Afforest's skip of the largest component against a plain BFS labelling.
  bam::graph::make_options o;
  o.scale = 13;
  o.degree = 2; // sparse: many small components next to the giant one
  const auto m = bam::graph::make_graph(t.path / "r", o).m;
  const csr_graph r = bam::graph::read_graph(t.path / "r", m);
  std::vector<std::uint32_t> by_bfs(r.nodes(), bam::graph::no_node);
  for (std::uint32_t v = 0; v < r.nodes(); ++v) {
    if (by_bfs[v] != bam::graph::no_node) continue;
    if (r.indptr[v] == r.indptr[v + 1]) {
      by_bfs[v] = v;
      continue;
    }
    const auto p = bam::graph::bfs_cpu(r, v);
    for (std::uint32_t u = 0; u < r.nodes(); ++u)
      if (p[u] != bam::graph::no_node) by_bfs[u] = v;
  }
  const auto cc = bam::graph::cc_cpu(r);
  CHECK(cc == by_bfs); // both: the smallest id of each component
  CHECK(bam::graph::same_partition(cc, by_bfs).reached > 100);
}

TEST_CASE("CPU PageRank: sums to one, even on a cycle, hubs first on a star", "[graph]") {
  temp_dir t;
  const csr_graph cycle = graph_of(t, "0 1\n1 2\n2 3\n3 4\n4 0\n");
  const auto pr = bam::graph::pagerank_cpu(cycle, {});
  for (const double x : pr)
    CHECK(std::fabs(x - 0.2) < 1e-12);
  const csr_graph star = graph_of(t, "0 1\n0 2\n0 3\n0 4\n", 6); // node 5 dangles
  unsigned iterations = 0;
  const auto s = bam::graph::pagerank_cpu(star, {0.85, 400, 1e-12}, &iterations);
  CHECK(iterations < 400);
  CHECK(std::fabs(std::accumulate(s.begin(), s.end(), 0.0) - 1) < 1e-9);
  CHECK(s[0] > 2 * s[1]);
  CHECK(std::fabs(s[1] - s[4]) < 1e-12);
  CHECK(bam::graph::l1_distance(s, s) == 0);
  auto off = s;
  off[2] += 1e-3;
  CHECK(std::fabs(bam::graph::l1_distance(s, off) - 1e-3) < 1e-12);
}

TEST_CASE("bam-graph: make, info, check, load onto a software controller, check the device", "[graph]") {
  temp_dir t;
  auto r = bam_graph("-q make " + (t / "g") + " --scale 10 --degree 4");
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, ContainsSubstring("1024 nodes"));
  r = bam_graph("check " + (t / "g"));
  CHECK(r.status == 0);
  CHECK_THAT(r.out, ContainsSubstring("CSR valid and symmetric"));
  r = bam_graph("-q load " + (t / "g") + " emu:file=" + (t / "disk.img") + ",size=16M --offset 1M");
  INFO(r.out);
  REQUIRE(r.status == 0);
  r = bam_graph("--json check --device " + (t / "g"));
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK_THAT(r.out, ContainsSubstring("\"device_checked\": true"));
  // The device's copy corrupted: check --device says where.
  {
    std::fstream f(t / "disk.img", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp((1 << 20) + (1 << 20) + 100); // inside the edges (the image's second MiB)
    f.put('\x7f');
  }
  r = bam_graph("check --device " + (t / "g"));
  CHECK(r.status == 1);
  CHECK_THAT(r.out, ContainsSubstring("differs from the files"));
  write_text(t / "bad.txt", "0 1\nfoo bar\n");
  r = bam_graph("import " + (t / "i") + " --edges " + (t / "bad.txt"));
  CHECK(r.status == 1);
  CHECK_THAT(r.out, ContainsSubstring("bad.txt:2:"));
  // --heads: 0 to 32 neighbours, for BFS and CC only.
  r = bam_graph("bfs " + (t / "g") + " --heads 33");
  CHECK(r.status != 0);
  CHECK_THAT(r.out, ContainsSubstring("--heads"));
  r = bam_graph("pagerank " + (t / "g") + " --heads 2");
  CHECK(r.status != 0);
  CHECK_THAT(r.out, ContainsSubstring("--heads"));
#if !defined(BAM_GRAPH_TEST_CUDA)
  r = bam_graph("bfs " + (t / "g"));
  CHECK(r.status == 1);
  CHECK_THAT(r.out, ContainsSubstring("GPU"));
#else
  // Null media move no data: refused, before a GPU is needed, for every run
  // that needs the edges' values or compares with runs on the real edges.
  for (const std::string refused :
       {"pagerank", "pagerank --no-validate", "pagerank --no-validate --no-baselines --offsets cache",
        "pagerank --no-validate --no-baselines --tolerance 1e-6", "bfs --no-validate --no-baselines",
        "cc --no-validate --no-baselines"}) {
    r = bam_graph(refused + " " + (t / "g") + " --device emu-gpu:null=64M");
    INFO(refused << ": " << r.out);
    CHECK(r.status == 1);
    CHECK_THAT(r.out, ContainsSubstring("null media keep no data"));
  }
  // What runs there gets past that check (to the GPU, which CI lacks).
  r = bam_graph("pagerank --no-validate --no-baselines " + (t / "g") + " --device emu-gpu:null=64M");
  CHECK_THAT(r.out, !ContainsSubstring("null media keep no data"));
#endif
}
