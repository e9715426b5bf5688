// SPDX-License-Identifier: MIT
// The GNN dataset tool: the R-MAT generator (deterministic, any thread
// count, a power-law degree distribution, a valid CSR), the feature
// generator, .npy files (read back by NumPy where it is installed), imports
// from edge lists and CSR pairs, and the bam-gnn command: make, rerun,
// load onto a software controller, check (which catches a corrupted row).
#include "gnn_dataset.hpp"

#include "gnn_test_util.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using Catch::Matchers::ContainsSubstring;
using json = nlohmann::json;

using bam_gnn_test::bam_gnn;
using bam_gnn_test::run_result;
using bam_gnn_test::temp_dir;

json bam_gnn_json(const std::string& args) {
  const run_result r = bam_gnn("--json -q " + args);
  INFO(r.out);
  REQUIRE(r.status == 0);
  return json::parse(r.out.substr(r.out.find('{')));
}

bam::gnn::rmat_options small(unsigned threads = 1) {
  bam::gnn::rmat_options o;
  o.nodes = 1 << 14;
  o.avg_degree = 16;
  o.seed = 42;
  o.threads = threads;
  return o;
}

} // namespace

TEST_CASE("R-MAT: a valid CSR, the same for any thread count, another for another seed", "[gnn]") {
  const auto g1 = bam::gnn::make_rmat(small(1));
  const auto g4 = bam::gnn::make_rmat(small(4));
  bam::gnn::check_csr(g1.indptr, g1.indices, g1.nodes());
  CHECK(g1.indptr == g4.indptr);
  CHECK(g1.indices == g4.indices);
  auto o = small(2);
  o.seed = 43;
  const auto g2 = bam::gnn::make_rmat(o);
  CHECK(g2.indices != g1.indices);
  // Undirected, no self loops, no duplicates, rows sorted.
  std::set<std::pair<std::int32_t, std::int32_t>> edges;
  for (std::uint64_t u = 0; u < g1.nodes(); ++u)
    for (auto i = g1.indptr[u]; i < g1.indptr[u + 1]; ++i) {
      const auto v = g1.indices[static_cast<std::size_t>(i)];
      REQUIRE(v != static_cast<std::int32_t>(u));
      if (i > g1.indptr[u]) REQUIRE(g1.indices[static_cast<std::size_t>(i - 1)] < v);
      edges.insert({static_cast<std::int32_t>(u), v});
    }
  for (const auto& [u, v] : edges)
    REQUIRE(edges.count({v, u}) == 1);
  // Most of the requested edges survive merging (R-MAT repeats hub edges).
  CHECK(g1.edges() > 0.7 * 16 * (1 << 14));
  CHECK(g1.edges() <= 16 * (1 << 14));
}

TEST_CASE("R-MAT: degrees follow a power law, and do not follow the node id", "[gnn]") {
  const auto g = bam::gnn::make_rmat(small(2));
  std::vector<std::int64_t> deg(g.nodes());
  for (std::uint64_t u = 0; u < g.nodes(); ++u)
    deg[u] = g.indptr[u + 1] - g.indptr[u];
  const double mean = static_cast<double>(g.edges()) / static_cast<double>(g.nodes());
  auto sorted = deg;
  std::sort(sorted.rbegin(), sorted.rend());
  // A heavy tail: hubs with tens of times the mean degree; the top 1% of
  // nodes hold far more than 1% of the edges; many nodes far below the mean.
  CHECK(static_cast<double>(sorted[0]) > 20 * mean);
  std::int64_t top = 0;
  for (std::size_t i = 0; i < g.nodes() / 100; ++i)
    top += sorted[i];
  CHECK(static_cast<double>(top) / static_cast<double>(g.edges()) > 0.08);
  CHECK(static_cast<double>(sorted[g.nodes() / 2]) < mean);
  // Scrambled labels: the first and second half of the ids hold similar shares.
  std::int64_t lo = 0, hi = 0;
  for (std::uint64_t u = 0; u < g.nodes(); ++u)
    (u < g.nodes() / 2 ? lo : hi) += deg[u];
  CHECK(std::abs(static_cast<double>(lo - hi)) < 0.25 * static_cast<double>(lo + hi));
}

TEST_CASE("R-MAT: bad parameters are refused", "[gnn]") {
  auto o = small();
  o.nodes = 1;
  CHECK_THROWS_WITH(bam::gnn::make_rmat(o), ContainsSubstring("at least 2 nodes"));
  o = small();
  o.a = 0.9;
  CHECK_THROWS_WITH(bam::gnn::make_rmat(o), ContainsSubstring("a + b + c <= 1"));
  o = small();
  o.nodes = 3'000'000'000ull;
  CHECK_THROWS_WITH(bam::gnn::make_rmat(o), ContainsSubstring("2^31 - 1"));
}

TEST_CASE("features: a function of (seed, node, column), from -1 up to 1", "[gnn]") {
  std::map<float, int> seen;
  for (std::uint64_t n = 0; n < 100; ++n)
    for (std::uint32_t c = 0; c < 100; ++c) {
      const float v = bam::gnn::feature_value(7, n, c);
      REQUIRE(v >= -1.0f);
      REQUIRE(v < 1.0f);
      REQUIRE(v == bam::gnn::feature_value(7, n, c));
      ++seen[v];
    }
  CHECK(seen.size() > 9990); // 24 random bits: almost no repeats in 10,000
  CHECK(bam::gnn::feature_value(7, 5, 3) != bam::gnn::feature_value(8, 5, 3));
  CHECK(bam::gnn::feature_value(7, 5, 3) != bam::gnn::feature_value(7, 3, 5));
}

TEST_CASE(".npy files: written, read back, and readable by NumPy", "[gnn]") {
  temp_dir d;
  const std::vector<std::int64_t> a = {0, 3, 3, 7, 1ll << 40};
  bam::gnn::npy_write(d / "a.npy", "<i8", {a.size()}, a.data());
  const auto h = bam::gnn::npy_read_header(d / "a.npy");
  CHECK(h.dtype == "<i8");
  CHECK(h.shape == std::vector<std::uint64_t>{5});
  CHECK(h.data_offset % 64 == 0);
  std::vector<std::int64_t> back(5);
  bam::gnn::npy_read(d / "a.npy", h, 0, 5, back.data());
  CHECK(back == a);
  std::vector<float> m(6);
  for (int i = 0; i < 6; ++i)
    m[static_cast<std::size_t>(i)] = 0.5f * static_cast<float>(i);
  bam::gnn::npy_write(d / "m.npy", "<f4", {2, 3}, m.data());
  CHECK(bam::gnn::npy_read_header(d / "m.npy").shape == std::vector<std::uint64_t>{2, 3});
  {
    std::ofstream f(d / "bad.npy");
    f << "not numpy";
  }
  CHECK_THROWS_WITH(bam::gnn::npy_read_header(d / "bad.npy"), ContainsSubstring("not a .npy file"));
  if (std::system("python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    WARN("NumPy not installed: the NumPy cross-check is skipped");
    return;
  }
  const std::string py = "python3 -c \"import numpy as np; a = np.load('" + d / "a.npy" + "'); m = np.load('" +
                         d / "m.npy" +
                         "'); assert a.tolist() == [0, 3, 3, 7, 1 << 40], a; "
                         "assert m.shape == (2, 3) and m[1, 2] == 2.5, m; "
                         "np.save('" +
                         d / "p.npy" + "', np.arange(12, dtype=np.float32).reshape(4, 3))\"";
  REQUIRE(std::system(py.c_str()) == 0);
  const auto ph = bam::gnn::npy_read_header(d / "p.npy");
  CHECK(ph.dtype == "<f4");
  CHECK(ph.shape == std::vector<std::uint64_t>{4, 3});
  std::vector<float> p(12);
  bam::gnn::npy_read(d / "p.npy", ph, 0, 12, p.data());
  CHECK(p[11] == 11.0f);
}

TEST_CASE("import: an edge list and a CSR pair, features referenced in place", "[gnn]") {
  temp_dir d;
  std::vector<float> feats(5 * 4);
  for (std::size_t i = 0; i < feats.size(); ++i)
    feats[i] = static_cast<float>(i);
  bam::gnn::npy_write(d / "feats.npy", "<f4", {5, 4}, feats.data());
  {
    std::ofstream e(d / "edges.txt");
    e << "# src dst\n0 1\n1 2\n2 0\n2 0\n3 3\n4\t0\n";
  }
  bam::gnn::import_options o;
  o.features_npy = d / "feats.npy";
  o.edges = d / "edges.txt";
  o.undirected = true;
  const auto m = bam::gnn::import_dataset(d / "ds", o);
  CHECK(m.nodes == 5);
  CHECK(m.features.dim == 4);
  CHECK(m.features.file_offset == bam::gnn::npy_read_header(d / "feats.npy").data_offset);
  CHECK(m.edges == 8); // {0-1, 1-2, 2-0, 4-0} both ways; the duplicate and the self loop dropped
  const auto rows = bam::gnn::read_feature_rows(d / "ds", m, 3, 1);
  float row3[4];
  std::memcpy(row3, rows.data(), 16);
  CHECK(row3[0] == 12.0f);
  CHECK(bam::gnn::check_dataset(d / "ds", 16).rows_wrong == 0);
  // The same edges as .npy arrays, (2, E) int32 and (E, 2) int64: the same CSR.
  const std::vector<std::int32_t> rows2 = {0, 1, 2, 2, 3, 4, /**/ 1, 2, 0, 0, 3, 0};
  const std::vector<std::int64_t> pairs = {0, 1, 1, 2, 2, 0, 2, 0, 3, 3, 4, 0};
  bam::gnn::npy_write(d / "e2.npy", "<i4", {2, 6}, rows2.data());
  bam::gnn::npy_write(d / "e3.npy", "<i8", {6, 2}, pairs.data());
  auto csr_of = [&](const std::string& ds) {
    auto h = bam::gnn::npy_read_header(d / (ds + "/indices.npy"));
    std::vector<std::int32_t> v(h.elements());
    bam::gnn::npy_read(d / (ds + "/indices.npy"), h, 0, v.size(), v.data());
    return v;
  };
  for (const char* e : {"e2.npy", "e3.npy"}) {
    o.edges = d / e;
    const auto me = bam::gnn::import_dataset(d / (std::string("ds-") + e), o);
    CHECK(me.edges == 8);
    CHECK(csr_of(std::string("ds-") + e) == csr_of("ds"));
  }
  o.edges = d / "edges.txt";
  // A node id past the feature table is refused, naming it.
  {
    std::ofstream e(d / "bad.txt");
    e << "0 1\n1 9\n";
  }
  o.edges = d / "bad.txt";
  CHECK_THROWS_WITH(bam::gnn::import_dataset(d / "bad", o), ContainsSubstring("names node 9, outside [0, 5)"));
  // A CSR pair.
  const std::vector<std::int64_t> indptr = {0, 1, 2, 2, 2, 3}, indices = {1, 0, 2};
  bam::gnn::npy_write(d / "indptr.npy", "<i8", {6}, indptr.data());
  bam::gnn::npy_write(d / "indices.npy", "<i8", {3}, indices.data());
  o.edges.clear();
  o.indptr_npy = d / "indptr.npy";
  o.indices_npy = d / "indices.npy";
  const auto c = bam::gnn::import_dataset(d / "csr", o);
  CHECK(c.edges == 3);
  const std::vector<std::int64_t> broken = {0, 1, 2, 2, 2, 4};
  bam::gnn::npy_write(d / "indptr.npy", "<i8", {6}, broken.data());
  CHECK_THROWS_WITH(bam::gnn::import_dataset(d / "csr2", o), ContainsSubstring("indptr ends at 4"));
}

TEST_CASE("import: feature tables and files a dataset cannot be made of are refused", "[gnn]") {
  temp_dir d;
  {
    std::ofstream e(d / "edges.txt");
    e << "0 1\n";
  }
  bam::gnn::import_options o;
  o.edges = d / "edges.txt";
  // No rows, or one: `info` and `check` once crashed on an empty table.
  for (const std::uint64_t rows : {0, 1}) {
    const std::vector<float> none(rows * 4);
    bam::gnn::npy_write(d / "f.npy", "<f4", {rows, 4}, none.data());
    o.features_npy = d / "f.npy";
    CHECK_THROWS_WITH(bam::gnn::import_dataset(d / "ds", o), ContainsSubstring("a graph needs 2 nodes or more"));
  }
  // Rows without features.
  bam::gnn::npy_write(d / "g.npy", "<f4", {5, 0}, static_cast<const float*>(nullptr));
  o.features_npy = d / "g.npy";
  CHECK_THROWS_WITH(bam::gnn::import_dataset(d / "ds", o), ContainsSubstring("rows of 0 features"));
  CHECK_FALSE(std::filesystem::exists(d / "ds/manifest.json"));

  // An indptr whose header declares 2^33 entries and holds none: refused
  // from the file's size, before 64 GiB are allocated for it.
  const std::vector<float> feats(5 * 4);
  bam::gnn::npy_write(d / "feats.npy", "<f4", {5, 4}, feats.data());
  o.features_npy = d / "feats.npy";
  const std::vector<std::int64_t> one{0};
  bam::gnn::npy_write(d / "indptr.npy", "<i8", {1}, one.data());
  {
    // The same header, its shape made 2^33 (padded to the header's length).
    std::string text;
    {
      std::ifstream f(d / "indptr.npy", std::ios::binary);
      text.assign(std::istreambuf_iterator<char>(f), {});
    }
    const auto at = text.find("(1,)");
    REQUIRE(at != std::string::npos);
    text.replace(at, 4, "(8589934592,)");
    const auto nl = text.find('\n');
    REQUIRE(nl != std::string::npos);
    text.erase(nl - 9, 9); // the header stays a multiple of 64 bytes: fewer spaces before its newline
    std::ofstream f(d / "indptr.npy", std::ios::binary | std::ios::trunc);
    f << text.substr(0, nl - 9 + 1);
  }
  REQUIRE(bam::gnn::npy_read_header(d / "indptr.npy").shape.at(0) == 8589934592ull);
  bam::gnn::npy_write(d / "indices.npy", "<i8", {1}, one.data());
  o.edges.clear();
  o.indptr_npy = d / "indptr.npy";
  o.indices_npy = d / "indices.npy";
  CHECK_THROWS_WITH(bam::gnn::import_dataset(d / "ds", o), ContainsSubstring("shorter than its header says"));
}

TEST_CASE("import: an edge list that is not a regular file is refused (it is read twice)", "[gnn]") {
  temp_dir d;
  const std::vector<float> feats(5 * 4);
  bam::gnn::npy_write(d / "feats.npy", "<f4", {5, 4}, feats.data());
  const std::string fifo = d / "edges.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  bam::gnn::import_options o;
  o.features_npy = d / "feats.npy";
  o.edges = fifo;
  CHECK_THROWS_WITH(bam::gnn::import_dataset(d / "ds", o), ContainsSubstring("not a regular file"));
  // A Matrix Market file is not a text edge list: its size line and 1-based
  // entries would be read as edges.
  {
    std::ofstream e(d / "m.txt");
    e << "%%MatrixMarket matrix coordinate pattern general\n5 5 2\n1 2\n2 3\n";
  }
  o.edges = d / "m.txt";
  CHECK_THROWS_WITH(bam::gnn::import_dataset(d / "ds", o), ContainsSubstring("m.txt:1: a Matrix Market file"));
}

TEST_CASE("bam-gnn make, rerun, load onto a software controller, check, info", "[gnn][cli]") {
  temp_dir d;
  const std::string ds = d / "ds";
  json j = bam_gnn_json("make " + ds + " --nodes 20K --degree 8 --dim 128 --seed 3");
  CHECK(j["nodes"] == 20000);
  CHECK(j["features"]["row_bytes"] == 512);
  CHECK(j["already_there"] == false);
  CHECK(fs::file_size(d / "ds/features.bin") == 20000ull * 512);
  // Run again: nothing written. Other parameters: refused without --force.
  j = bam_gnn_json("make " + ds + " --nodes 20K --degree 8 --dim 128 --seed 3");
  CHECK(j["already_there"] == true);
  run_result r = bam_gnn("make " + ds + " --nodes 20K --degree 8 --dim 128 --seed 4");
  CHECK(r.status == 1);
  CHECK_THAT(r.out, ContainsSubstring("pass --force"));
  // The graph and the rows it reads are what the library generates.
  const auto m = bam::gnn::read_manifest(ds);
  const auto back = bam::gnn::read_feature_rows(ds, m, 12345, 1);
  std::vector<float> want(128);
  bam::gnn::feature_row(m.features.seed, 12345, 128, want.data());
  CHECK(std::memcmp(back.data(), want.data(), 512) == 0);
  // Onto a device, recorded in the manifest, read back and checked.
  const std::string dev = "emu:file=" + d / "disk.img" + ",size=16M";
  j = bam_gnn_json("load " + ds + " " + dev + " --offset 1M");
  CHECK(j["device"]["offset"] == 1 << 20);
  CHECK(j["device"]["checksum"] == bam::file_checksum(d / "ds/features.bin"));
  j = bam_gnn_json("check " + ds + " --rows 500 --device");
  CHECK(j["rows_checked"] == 502);
  CHECK(j["rows_wrong"] == 0);
  CHECK(j["device_checked"] == true);
  j = bam_gnn_json("info " + ds);
  CHECK(j["degree"]["max"].get<double>() > 10 * j["degree"]["mean"].get<double>());
  // A corrupted row in the file is found.
  {
    std::fstream f(d / "ds/features.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(19999 * 512 + 7);
    f.put('\x5a');
  }
  r = bam_gnn("check " + ds + " --rows 10");
  CHECK(r.status == 1);
  CHECK_THAT(r.out, ContainsSubstring("first: row 19999"));
  // Counts that are none: named, not a library's exception text.
  r = bam_gnn("make " + d / "x" + " --nodes abc --degree 4 --dim 4");
  CHECK(r.status == 1);
  CHECK_THAT(r.out, ContainsSubstring("'abc' is not a count"));
  for (const char* n : {"-5", "1e30", "1e400"}) {
    r = bam_gnn("make " + d / "x" + " --nodes " + n + " --degree 4 --dim 4");
    CHECK(r.status == 1);
    CHECK_THAT(r.out, ContainsSubstring("is not a count from 0 to 2^64 - 1"));
  }
  // A manifest that cannot be read: refused, saying so; replaced with --force.
  fs::create_directories(d / "cut");
  {
    std::ofstream f(d / "cut/manifest.json");
    f << "{\"nodes\": 20";
  }
  r = bam_gnn("make " + d / "cut" + " --nodes 2K --degree 4 --dim 4");
  CHECK(r.status == 1);
  CHECK_THAT(r.out, ContainsSubstring("cannot be read"));
  r = bam_gnn("make " + d / "cut" + " --nodes 2K --degree 4 --dim 4 --force");
  CHECK(r.status == 0);
  CHECK(bam::gnn::read_manifest(d / "cut").nodes == 2000);
}

TEST_CASE("bam-gnn make stops at Ctrl-C, leaving no dataset behind", "[gnn][cli]") {
  temp_dir d;
  // SIGINT a second into making a graph of 5 M nodes on one thread (well
  // over a second of work). Were it ignored, the make would run on: to its
  // end (a manifest) or to timeout's SIGKILL 20 s later (status 137).
  const std::string cmd = "timeout -s INT -k 20 1 " + std::string(BAM_GNN_PATH) + " make " + d / "ds" +
                          " --nodes 5M --degree 16 --dim 4 --no-features-file --threads 1 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) {
  }
  const int st = ::pclose(p);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 124); // timed out and ended by its SIGINT
  CHECK(seconds < 15);
  CHECK_FALSE(fs::exists(d / "ds/manifest.json"));
}

TEST_CASE("bam-gnn make --no-features-file writes the table straight onto the device", "[gnn][cli]") {
  temp_dir d;
  const std::string ds = d / "ds";
  // A generous deadline: a loaded machine may leave the engine thread little time.
  const std::string dev = "emu:file=" + d / "disk.img" + ",size=8M,lba=4096,timeout=60s";
  json j = bam_gnn_json("make " + ds + " --nodes 3000 --degree 4 --dim 256 --no-features-file --device " + dev +
                        " --offset 64K");
  CHECK(!fs::exists(d / "ds/features.bin"));
  CHECK(j["device"]["lba_size"] == 4096);
  j = bam_gnn_json("check " + ds + " --rows 300 --device");
  CHECK(j["rows_wrong"] == 0);
  // Bad input: a clear message, exit status 1.
  run_result r = bam_gnn("make " + d / "x" + " --nodes 1");
  CHECK(r.status == 1);
  CHECK_THAT(r.out, ContainsSubstring("at least 2 nodes"));
  r = bam_gnn("info " + d / "nothing");
  CHECK(r.status == 1);
  CHECK_THAT(r.out, ContainsSubstring("no dataset here"));
}
