// SPDX-License-Identifier: MIT
// Loading data sets onto a namespace and reading them back (bam/host/dataset.hpp)
// through the controller driver and the software controller: checksums,
// geometry checks, interruption and resume, device errors.
#include <bam/host.hpp>
#include <bam/host/dataset.hpp>
#include <bam/emu.hpp>

#include <catch2/catch_test_macros.hpp>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct temp_dir {
  fs::path path;
  temp_dir() {
    char tmpl[] = "/tmp/bam-dataset-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~temp_dir() { fs::remove_all(path); }
};

std::vector<unsigned char> random_bytes(std::size_t n, std::uint64_t seed) {
  std::vector<unsigned char> v(n);
  std::mt19937_64 rng(seed);
  for (auto& b : v)
    b = static_cast<unsigned char>(rng());
  return v;
}

void write_file(const fs::path& p, const std::vector<unsigned char>& data) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

std::vector<unsigned char> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

struct device {
  std::shared_ptr<bam::emu::emulated_controller> emu;
  std::unique_ptr<bam::controller> ctrl;
  explicit device(std::uint64_t bytes = 16 << 20, std::uint32_t lba = 512, std::uint32_t queues = 4) {
    bam::emu::controller_config cfg;
    cfg.engine_threads = 2;
    emu = bam::emu::make_ram_emulated_controller(bytes, lba, cfg);
    bam::controller_options o;
    o.io_queues = queues;
    o.queue_depth = 64;
    ctrl = std::make_unique<bam::controller>(emu, o);
  }
  //! Bytes [offset, offset + n) of namespace 1, read straight from the media.
  std::vector<unsigned char> media(std::uint64_t offset, std::size_t n) {
    std::vector<unsigned char> v(n);
    iovec seg{v.data(), n};
    REQUIRE(emu->namespace_media(1).read(offset, std::span<const iovec>(&seg, 1)) == 0);
    return v;
  }
};

} // namespace

TEST_CASE("dataset: load then dump round-trips bytes and checksums", "[dataset]") {
  temp_dir dir;
  for (std::uint32_t lba : {512u, 4096u}) {
    device d(16 << 20, lba);
    // Not a multiple of the chunk or the LBA size.
    const auto data = random_bytes(3 * (1 << 20) + 12345, lba);
    write_file(dir.path / "src.bin", data);
    bam::dataset_options o;
    o.offset = 8 * lba;
    o.chunk_bytes = 256 << 10;
    o.verify = true;
    std::uint64_t last_done = 0, calls = 0;
    o.progress = [&](const bam::transfer_progress& p) {
      CHECK(p.bytes_done > last_done);
      CHECK(p.bytes_total == data.size());
      last_done = p.bytes_done;
      ++calls;
    };
    const auto r = bam::load_dataset(*d.ctrl, (dir.path / "src.bin").string(), o);
    CHECK(r.bytes == data.size());
    CHECK(r.chunks == (data.size() + o.chunk_bytes - 1) / o.chunk_bytes);
    CHECK(r.verified_chunks == r.chunks);
    CHECK(r.resumed_chunks == 0);
    CHECK(calls == r.chunks);
    CHECK(last_done == data.size());
    CHECK(r.checksum == bam::file_checksum((dir.path / "src.bin").string()));
    CHECK(r.checksum.rfind("xxh128:", 0) == 0);
    CHECK(r.checksum.size() == 7 + 32);
    CHECK_FALSE(fs::exists(r.state_path)); // a completed load leaves no state

    // What the media holds: the data at the offset, zeroes after it to the block end.
    const std::size_t padded = (data.size() + lba - 1) / lba * lba;
    auto on_media = d.media(o.offset, padded);
    CHECK(std::memcmp(on_media.data(), data.data(), data.size()) == 0);
    CHECK(std::all_of(on_media.begin() + static_cast<std::ptrdiff_t>(data.size()), on_media.end(),
                      [](unsigned char b) { return b == 0; }));

    o.progress = nullptr;
    const auto back = bam::dump_dataset(*d.ctrl, (dir.path / "back.bin").string(), data.size(), o);
    CHECK(back.checksum == r.checksum);
    CHECK(read_file(dir.path / "back.bin") == data);
  }
}

TEST_CASE("dataset: an empty source loads nothing and has the empty checksum", "[dataset]") {
  temp_dir dir;
  device d;
  write_file(dir.path / "empty", {});
  const auto r = bam::load_dataset(*d.ctrl, (dir.path / "empty").string());
  CHECK(r.bytes == 0);
  CHECK(r.chunks == 0);
  CHECK(r.checksum == bam::file_checksum((dir.path / "empty").string()));
}

TEST_CASE("dataset: offsets, sizes and chunks that do not fit are refused clearly", "[dataset]") {
  temp_dir dir;
  device d(1 << 20, 4096);
  write_file(dir.path / "src.bin", random_bytes(64 << 10, 1));
  const std::string src = (dir.path / "src.bin").string();
  bam::dataset_options o;
  auto message = [&](const bam::dataset_options& opts) {
    try {
      bam::load_dataset(*d.ctrl, src, opts);
    } catch (const bam::error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  o.offset = 512;
  CHECK(message(o).find("not a multiple of the LBA size (4096") != std::string::npos);
  o.offset = (1 << 20) - 32768;
  CHECK(message(o).find("do not fit namespace 1") != std::string::npos);
  o.offset = 0;
  o.chunk_bytes = 1000;
  CHECK(message(o).find("chunk size 1000") != std::string::npos);
  o.chunk_bytes = 1 << 20;
  o.nsid = 2;
  CHECK(message(o).find("no active namespace 2") != std::string::npos);
  CHECK_THROWS_AS(bam::load_dataset(*d.ctrl, (dir.path / "missing").string()), bam::error);
  CHECK_THROWS_AS(bam::dump_dataset(*d.ctrl, src, (1 << 20) + 1), bam::error);
}

TEST_CASE("dataset: an interrupted load resumes where it stopped", "[dataset][resume]") {
  temp_dir dir;
  device d(16 << 20);
  const auto data = random_bytes(4 << 20, 7);
  write_file(dir.path / "src.bin", data);
  const std::string src = (dir.path / "src.bin").string();
  bam::dataset_options o;
  o.chunk_bytes = 128 << 10; // 32 chunks
  o.state_interval_ms = 0;   // record every chunk
  std::atomic<bool> stop{false};
  o.cancel = &stop;
  o.progress = [&](const bam::transfer_progress& p) {
    if (p.chunks_done == 10) stop = true;
  };
  try {
    bam::load_dataset(*d.ctrl, src, o);
    FAIL("the load was not interrupted");
  } catch (const bam::error& e) {
    CHECK(e.errnum() == EINTR);
    CHECK(std::string(e.what()).find("run it again to resume") != std::string::npos);
  }
  const std::string state = src + ".bam-load";
  REQUIRE(fs::exists(state));
  std::ifstream in(state);
  std::string line;
  std::size_t recorded = 0;
  while (std::getline(in, line))
    recorded += line.rfind("done ", 0) == 0;
  CHECK(recorded >= 10);
  CHECK(recorded < 32);

  stop = false;
  o.progress = nullptr;
  o.verify = true;
  const auto r = bam::load_dataset(*d.ctrl, src, o);
  CHECK(r.resumed_chunks == recorded);
  CHECK(r.verified_chunks == 32 - recorded);
  CHECK(r.checksum == bam::file_checksum(src));
  CHECK(d.media(0, data.size()) == data);
  CHECK_FALSE(fs::exists(state));
}

TEST_CASE("dataset: a chunk whose source changed since it was recorded is written again", "[dataset][resume]") {
  temp_dir dir;
  device d(8 << 20);
  auto data = random_bytes(1 << 20, 3);
  write_file(dir.path / "src.bin", data);
  const std::string src = (dir.path / "src.bin").string();
  bam::dataset_options o;
  o.chunk_bytes = 64 << 10; // 16 chunks
  o.state_interval_ms = 0;
  std::atomic<bool> stop{false};
  o.cancel = &stop;
  o.progress = [&](const bam::transfer_progress& p) {
    if (p.chunks_done == 4) stop = true;
  };
  CHECK_THROWS_AS(bam::load_dataset(*d.ctrl, src, o), bam::error);
  data[5] ^= 0xff; // chunk 0 differs now
  write_file(dir.path / "src.bin", data);
  o.cancel = nullptr;
  o.progress = nullptr;
  const auto r = bam::load_dataset(*d.ctrl, src, o);
  CHECK(r.resumed_chunks >= 3);
  CHECK(r.resumed_chunks < 16);
  CHECK(d.media(0, data.size()) == data);
  CHECK(r.checksum == bam::file_checksum(src));
}

TEST_CASE("dataset: a state file of another load is refused; resume off starts over", "[dataset][resume]") {
  temp_dir dir;
  device d(8 << 20);
  write_file(dir.path / "src.bin", random_bytes(1 << 20, 4));
  const std::string src = (dir.path / "src.bin").string();
  bam::dataset_options o;
  o.chunk_bytes = 64 << 10;
  std::atomic<bool> stop{true};
  o.cancel = &stop;
  CHECK_THROWS_AS(bam::load_dataset(*d.ctrl, src, o), bam::error);
  REQUIRE(fs::exists(src + ".bam-load"));
  o.cancel = nullptr;
  o.offset = 1 << 20; // another target
  try {
    bam::load_dataset(*d.ctrl, src, o);
    FAIL("accepted a state file of another load");
  } catch (const bam::error& e) {
    CHECK(std::string(e.what()).find("belongs to another load (offset was '0', now '1048576')") != std::string::npos);
  }
  o.resume = false;
  const auto r = bam::load_dataset(*d.ctrl, src, o);
  CHECK(r.resumed_chunks == 0);
  CHECK(r.checksum == bam::file_checksum(src));
}

TEST_CASE("dataset: a device error stops the load with the LBA and status; a rerun completes it", "[dataset][errors]") {
  temp_dir dir;
  device d(8 << 20);
  const auto data = random_bytes(2 << 20, 5);
  write_file(dir.path / "src.bin", data);
  const std::string src = (dir.path / "src.bin").string();
  bam::emu::fault_rule rule;
  rule.opcode = static_cast<std::uint8_t>(bam::nvme::nvm_opcode::write);
  rule.lba_first = 2048; // chunk 8 of 64 KiB chunks on 512-byte blocks
  rule.lba_last = 2048;
  rule.status = {bam::nvme::status_type::media_error, bam::nvme::media_status::write_fault};
  d.emu->faults().add(rule);
  bam::dataset_options o;
  o.chunk_bytes = 64 << 10;
  o.state_interval_ms = 0;
  try {
    bam::load_dataset(*d.ctrl, src, o);
    FAIL("the write fault was not reported");
  } catch (const bam::error& e) {
    REQUIRE(e.status().has_value());
    CHECK(e.status()->sct() == bam::nvme::status_type::media_error);
    CHECK(e.context().lba.has_value());
    CHECK(std::string(e.what()).find("Write Fault") != std::string::npos);
  }
  const auto r = bam::load_dataset(*d.ctrl, src, o); // the rule fired once
  CHECK(r.resumed_chunks >= 8);
  CHECK(d.media(0, data.size()) == data);
}

TEST_CASE("dataset: a throttled load keeps to its rate", "[dataset]") {
  temp_dir dir;
  device d(8 << 20);
  write_file(dir.path / "src.bin", random_bytes(1 << 20, 6));
  bam::dataset_options o;
  o.chunk_bytes = 128 << 10;
  o.max_bytes_per_second = 4 << 20; // 1 MiB: the last chunk starts after 7/8 of 250 ms
  const auto r = bam::load_dataset(*d.ctrl, (dir.path / "src.bin").string(), o);
  CHECK(r.seconds >= 0.2);
}
