// SPDX-License-Identifier: MIT
// The host side of `bam-gnn aggregate`: fanout parsing, the per-hop
// capacities, the page arithmetic of the hit rate, the thread pool and the
// CPU gather baseline (against the feature generator), and the command's
// answers to bad input (which come before it looks for a GPU).
#include "gnn_aggregate.hpp"

#include "gnn_test_util.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using Catch::Matchers::ContainsSubstring;

using bam_gnn_test::bam_gnn;
using bam_gnn_test::run_result;
using bam_gnn_test::temp_dir;

bam::gnn::manifest small_dataset(const fs::path& dir, std::uint64_t nodes, std::uint32_t dim, bool file = true) {
  bam::gnn::make_options o;
  o.features_file = file;
  o.graph.nodes = nodes;
  o.graph.avg_degree = 6;
  o.graph.seed = 3;
  o.graph.threads = 2;
  o.dim = dim;
  return bam::gnn::make_dataset(dir, o).m;
}

} // namespace

TEST_CASE("fanouts parse hop by hop; bad ones are refused with the reason", "[gnn][aggregate]") {
  using bam::gnn::parse_fanouts;
  CHECK(parse_fanouts("15,10,5") == std::vector<std::uint32_t>{15, 10, 5});
  CHECK(parse_fanouts("25") == std::vector<std::uint32_t>{25});
  CHECK(parse_fanouts("1,1024") == std::vector<std::uint32_t>{1, 1024});
  CHECK_THROWS_WITH(parse_fanouts(""), ContainsSubstring("empty"));
  CHECK_THROWS_WITH(parse_fanouts("15,,5"), ContainsSubstring("'' is not a whole number"));
  CHECK_THROWS_WITH(parse_fanouts("15,10,"), ContainsSubstring("not a whole number"));
  CHECK_THROWS_WITH(parse_fanouts("15,-1"), ContainsSubstring("'-1' is not a whole number"));
  CHECK_THROWS_WITH(parse_fanouts("15, 10"), ContainsSubstring("not a whole number"));
  CHECK_THROWS_WITH(parse_fanouts("x"), ContainsSubstring("'x'"));
  CHECK_THROWS_WITH(parse_fanouts("0"), ContainsSubstring("outside 1..1024"));
  CHECK_THROWS_WITH(parse_fanouts("1025"), ContainsSubstring("outside 1..1024"));
  CHECK_THROWS_WITH(parse_fanouts("99999999999999999999"), ContainsSubstring("not a whole number"));
  CHECK_THROWS_WITH(parse_fanouts("1,2,3,4,5,6,7,8,9"), ContainsSubstring("9 hops, at most 8"));
  try {
    parse_fanouts("a");
    FAIL("no throw");
  } catch (const bam::error& e) {
    CHECK(e.errnum() == EINVAL);
  }
}

TEST_CASE("hop capacities: seeds, then each hop's nodes and samples, never more than the graph", "[gnn][aggregate]") {
  using bam::gnn::hop_capacities;
  CHECK(hop_capacities(1'000'000, 1024, {15, 10}) == std::vector<std::uint64_t>{1024, 16384, 180224});
  CHECK(hop_capacities(1000, 1024, {15}) == std::vector<std::uint64_t>{1000, 1000});
  CHECK(hop_capacities(50'000, 1024, {15, 10, 5}) == std::vector<std::uint64_t>{1024, 16384, 50'000, 50'000});
  // No overflow on absurd sizes.
  CHECK(hop_capacities(~0ull / 2, ~0ull / 4, {1024, 1024}).back() == ~0ull / 2);
}

TEST_CASE("the hot set is the nodes of the highest in-degree, ties to the lower id", "[gnn][aggregate]") {
  // In-degrees: node 0: 1, node 1: 3, node 2: 0, node 3: 3, node 4: 2.
  const std::vector<std::int32_t> indices{1, 3, 1, 4, 3, 0, 1, 3, 4};
  CHECK(bam::gnn::hottest_nodes(indices, 5, 1) == std::vector<std::uint64_t>{1});
  CHECK(bam::gnn::hottest_nodes(indices, 5, 2) == std::vector<std::uint64_t>{1, 3});
  CHECK(bam::gnn::hottest_nodes(indices, 5, 3) == std::vector<std::uint64_t>{1, 3, 4});
  CHECK(bam::gnn::hottest_nodes(indices, 5, 4) == std::vector<std::uint64_t>{0, 1, 3, 4});
  CHECK(bam::gnn::hottest_nodes(indices, 5, 0).empty());
  CHECK(bam::gnn::hottest_nodes(indices, 5, 99).size() == 5);
  // A power-law graph: the chosen nodes' in-degrees are at least every other node's.
  std::vector<std::int32_t> many;
  std::mt19937_64 rng(7);
  for (int k = 0; k < 20000; ++k)
    many.push_back(static_cast<std::int32_t>(std::min<std::uint64_t>(rng() % 1000, rng() % 1000)));
  const std::vector<std::uint64_t> hot = bam::gnn::hottest_nodes(many, 1000, 50);
  REQUIRE(hot.size() == 50);
  std::vector<int> degree(1000, 0);
  for (const std::int32_t v : many)
    ++degree[static_cast<std::size_t>(v)];
  int coldest_hot = 1 << 30, hottest_cold = 0;
  for (std::uint64_t v = 0; v < 1000; ++v) {
    const bool in = std::find(hot.begin(), hot.end(), v) != hot.end();
    if (in)
      coldest_hot = std::min(coldest_hot, degree[v]);
    else
      hottest_cold = std::max(hottest_cold, degree[v]);
  }
  CHECK(coldest_hot >= hottest_cold);
  CHECK_THROWS_WITH(bam::gnn::hottest_nodes({0, 5}, 5, 1), ContainsSubstring("neighbour id 5 is outside"));
}

TEST_CASE("pages a row touches", "[gnn][aggregate]") {
  using bam::gnn::row_pages;
  CHECK(row_pages(0, 4096, 4096) == 1);
  CHECK(row_pages(5, 4096, 4096) == 1);
  CHECK(row_pages(0, 512, 4096) == 1);
  CHECK(row_pages(7, 512, 4096) == 1);
  CHECK(row_pages(1, 3000, 4096) == 2); // bytes 3000..5999
  CHECK(row_pages(0, 8192, 4096) == 2);
  CHECK(row_pages(1, 6000, 4096) == 2); // bytes 6000..11999: pages 1, 2
  CHECK(row_pages(2, 6000, 4096) == 3); // bytes 12000..17999: pages 2..4
}

TEST_CASE("the thread pool runs every task once, again and again, and passes failures on", "[gnn][aggregate]") {
  bam::gnn::thread_pool pool(3);
  CHECK(pool.size() == 3);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::atomic<int>> hits(97);
    pool.run(hits.size(), [&](std::uint64_t t) { hits[t].fetch_add(1); });
    for (const auto& h : hits)
      REQUIRE(h.load() == 1);
  }
  CHECK_THROWS_WITH(pool.run(10,
                             [](std::uint64_t t) {
                               if (t == 7) throw std::runtime_error("task 7 failed");
                             }),
                    "task 7 failed");
  std::atomic<int> after{0};
  pool.run(5, [&](std::uint64_t) { after.fetch_add(1); });
  CHECK(after.load() == 5);
  pool.run(0, [](std::uint64_t) { FAIL("no task to run"); });
}

TEST_CASE("CPU gather baseline: rows of the feature file equal the generator's", "[gnn][aggregate]") {
  temp_dir t;
  const bam::gnn::manifest m = small_dataset(t.path, 3000, 24);
  const std::uint64_t rb = m.features.row_bytes();
  const std::vector<unsigned char> table = bam::gnn::read_feature_rows(t.path, m, 0, m.nodes);
  std::mt19937_64 rng(7);
  std::vector<std::uint64_t> ids(5000);
  for (auto& id : ids)
    id = rng() % m.nodes;
  ids[0] = 0;
  ids[1] = m.nodes - 1;
  ids[2] = ids[3] = 42; // repeated
  bam::gnn::thread_pool pool(4);
  std::vector<unsigned char> got(ids.size() * rb), want(ids.size() * rb);
  bam::gnn::cpu_gather_rows(pool, table.data(), m.nodes, rb, ids.data(), ids.size(), got.data());
  bam::gnn::reference_rows(t.path, m, ids.data(), ids.size(), want.data());
  CHECK(got == want);
  // Independently of reference_rows: the generator itself, float by float.
  for (std::size_t k = 0; k < 10; ++k) {
    std::vector<float> row(m.features.dim);
    bam::gnn::feature_row(m.features.seed, ids[k], m.features.dim, row.data());
    CHECK(std::memcmp(row.data(), got.data() + k * rb, rb) == 0);
  }
  std::vector<std::uint64_t> bad{1, m.nodes};
  CHECK_THROWS_WITH(bam::gnn::cpu_gather_rows(pool, table.data(), m.nodes, rb, bad.data(), bad.size(), got.data()),
                    ContainsSubstring("row id 3000 is outside the table's 3000 rows"));
}

namespace {

//! A command line bam-gnn must refuse: its arguments after the dataset, whether
//! the exit status must be exactly 1 (else any failure), and what the message says.
struct refusal {
  std::string args;
  bool status_one;
  std::string says;
};

void check_refusals(const std::string& dir, const std::vector<refusal>& cases) {
  for (const refusal& c : cases) {
    const run_result r = bam_gnn("aggregate " + dir + c.args);
    INFO("aggregate DIR" << c.args << "\n" << r.out);
    if (c.status_one)
      CHECK(r.status == 1);
    else
      CHECK(r.status != 0);
    CHECK_THAT(r.out, ContainsSubstring(c.says));
  }
}

} // namespace

TEST_CASE("bam-gnn aggregate refuses bad input before it needs a GPU", "[gnn][aggregate][cli]") {
  temp_dir t;
  small_dataset(t.path, 2000, 8);
  check_refusals(t.path.string(),
                 {
                     {" --fanouts 15,x,5", true, "'x' is not a whole number"},
                     {" --fanouts 0", true, "outside 1..1024"},
                     {"/missing", true, "no dataset here"},
                     {" --batch-size 0", true, "--batch-size"},
                     {" --page-size 3000", true, "--page-size 3000"},
                     {" --hot-percent 150", false, "--hot-percent"},
                     {" --hot-memory gpu", true, "--hot-memory gpu places a hot set: give --hot-percent"},
                     {" --hot-memory disk", false, "--hot-memory"},
                     {" --in-flight 0", false, "--in-flight"},
                     {" --in-flight 9", false, "--in-flight"},
                 });
}

TEST_CASE("bam-gnn aggregate on several GPUs refuses what one GPU alone can do, before it needs a GPU",
          "[gnn][aggregate][cli]") {
  temp_dir t;
  small_dataset(t.path, 2000, 8);
  std::vector<refusal> cases = {
      {" --node-cache", true, "--node-cache spreads one cache over several GPUs: give --gpus 2 or more"},
      {" --processes", true, "--processes runs one process per GPU: give --gpus 2 or more"},
      {" --gpus 2 --compare", true, "--compare"},
      {" --gpus 0", false, "--gpus"},
  };
  // Private media belong to one storage: every GPU must read one copy.
  for (const std::string dev : {"emu-gpu:ram=64M", "emu-gpu:hbm=64M"}) {
    cases.push_back({" --gpus 2 --device " + dev, true, dev + ": with --gpus 2 every GPU reads one copy of the table"});
    cases.push_back({" --gpus 2 --device " + dev, true, "emu-gpu:shm=NAME,size=SIZE"});
  }
  check_refusals(t.path.string(), cases);
}

TEST_CASE("the gather stage's time is the union of the gathers of batches in flight", "[gnn][aggregate]") {
  using bam::gnn::interval_union_ms;
  CHECK(interval_union_ms({}) == 0);
  CHECK(interval_union_ms({{1, 3}}) == 2);
  CHECK(interval_union_ms({{1, 3}, {5, 6}}) == 3);          // apart: the sum
  CHECK(interval_union_ms({{5, 9}, {1, 3}, {2, 6}}) == 8);  // overlapping, in any order: 1..9
  CHECK(interval_union_ms({{1, 10}, {2, 3}, {4, 5}}) == 9); // nested
  CHECK(interval_union_ms({{1, 2}, {2, 4}}) == 3);          // touching
  CHECK(interval_union_ms({{4, 4}, {7, 6}, {0, 1}}) == 1);  // empty and reversed ones count nothing
}

TEST_CASE("the table is striped onto controllers page by page, as bam::array reads it", "[gnn][aggregate]") {
  const bool file = GENERATE(true, false);
  const std::uint32_t controllers = GENERATE(1u, 3u);
  const std::uint32_t page = GENERATE(512u, 4096u);
  INFO("feature file " << file << ", controllers " << controllers << ", page " << page);
  temp_dir t;
  // 7 floats a row (28 bytes): rows straddle pages; the table ends inside a page.
  const bam::gnn::manifest m = small_dataset(t.path, 5003, 7, file);
  const std::uint64_t bytes = m.nodes * m.features.row_bytes();
  const bam::gnn::table_source src(t.path, m);
  CHECK(src.path().empty() == !file);
  bam::gnn::thread_pool pool(2);
  std::vector<unsigned char> table(bytes);
  bam::gnn::read_table(src, bytes, table.data(), pool);
  std::vector<float> row(m.features.dim);
  for (const std::uint64_t node : {std::uint64_t{0}, std::uint64_t{77}, m.nodes - 1}) {
    bam::gnn::feature_row(m.features.seed, node, m.features.dim, row.data());
    CHECK(std::memcmp(row.data(), table.data() + node * m.features.row_bytes(), m.features.row_bytes()) == 0);
  }
  const std::uint64_t start = 3 * 512;
  const std::uint64_t pages = (bytes + page - 1) / page;
  std::vector<std::vector<unsigned char>> media(
      controllers, std::vector<unsigned char>(start + (pages / controllers + 1) * page, 0xee));
  std::uint64_t written = 0;
  bam::gnn::load_striped(src, bytes, page, controllers, start, pool,
                         [&](std::uint32_t c, std::uint64_t off, const void* p, std::size_t len) {
                           REQUIRE(c < controllers);
                           REQUIRE(off + len <= media[c].size());
                           std::memcpy(media[c].data() + off, p, len);
                           written += len;
                         });
  CHECK(written == pages * page);
  std::uint64_t bad = 0;
  for (std::uint64_t p = 0; p < pages; ++p)
    for (std::uint64_t k = 0; k < page; ++k) {
      const std::uint64_t b = p * page + k;
      const unsigned char want = b < bytes ? table[b] : 0;
      bad += media[p % controllers][start + (p / controllers) * page + k] != want;
    }
  CHECK(bad == 0);
  CHECK(media[0][start - 1] == 0xee); // nothing before the start
}

TEST_CASE("the host's mean aggregation: own and sampled neighbours, hop by hop", "[gnn][aggregate]") {
  using bam::gnn::mean_aggregate_reference;
  using bam::gnn::no_node;
  // One hop, one column: node 5 with samples 3 and 9.
  CHECK(mean_aggregate_reference({{5}, {3, 5, 9}}, {{3, 9}}, {2}, {1.0f, 2.0f, 5.0f}, 1) == std::vector<float>{2.5f});
  // An empty slot counts for nothing; no samples at all: half the node's own.
  CHECK(mean_aggregate_reference({{5}, {3, 5, 9}}, {{3, no_node}}, {2}, {1.0f, 2.0f, 5.0f}, 1) ==
        std::vector<float>{1.5f});
  CHECK(mean_aggregate_reference({{5}, {3, 5, 9}}, {{no_node, no_node}}, {2}, {1.0f, 2.0f, 5.0f}, 1) ==
        std::vector<float>{1.0f});
  // Two hops, two columns.
  const std::vector<float> h =
      mean_aggregate_reference({{1}, {1, 2}, {1, 2, 3}}, {{2}, {2, 3}}, {1, 1}, {10, -1, 20, -2, 30, -3}, 2);
  CHECK(h == std::vector<float>{20.0f, -2.0f});
  // A sample missing from the next hop's set.
  CHECK_THROWS_WITH(mean_aggregate_reference({{5}, {3, 5, 9}}, {{4, 9}}, {2}, {1.0f, 2.0f, 5.0f}, 1),
                    ContainsSubstring("lacks node 4"));
}
