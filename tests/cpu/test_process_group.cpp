// SPDX-License-Identifier: MIT
// The processes of a page cache group hand each other files and agree on a
// number per medium: real processes (fork), real files (memfds whose bytes
// say who made them), a rank that never comes, a configuration that
// differs, a name taken twice.
#include <bam/detail/process_group.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace {

using bam::detail::exchange_files;
using bam::detail::group_directory;
using bam::detail::group_spec;

//! A name no other test run on this host uses.
std::string unique_group(const char* what) {
  static std::atomic<int> n{0};
  return std::string("test-") + what + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

//! A memfd holding `text`.
int file_with(const std::string& text) {
  const int fd = ::memfd_create("bam-test", MFD_CLOEXEC);
  if (fd < 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) return -1;
  return fd;
}

std::string read_file(int fd) {
  char b[256]{};
  const ssize_t n = ::pread(fd, b, sizeof b - 1, 0);
  return n > 0 ? std::string(b, static_cast<std::size_t>(n)) : std::string();
}

std::string label(int rank, std::size_t i) { return "rank " + std::to_string(rank) + " file " + std::to_string(i); }

//! Files rank r offers: 3 + 20 r (more than one message for rank 2 and up).
std::size_t files_of(int rank) { return 3 + 20 * static_cast<std::size_t>(rank); }

//! Run `body(rank)` in `n` child processes at once; their exit statuses.
std::vector<int> in_processes(int n, const std::function<int(int)>& body) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t p = ::fork();
    if (p == 0) {
      int rc = 99;
      try {
        rc = body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        rc = 98;
      }
      ::_exit(rc);
    }
    pids.push_back(p);
  }
  std::vector<int> out;
  for (const pid_t p : pids) {
    int st = 0;
    ::waitpid(p, &st, 0);
    out.push_back(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  }
  return out;
}

//! A rank exchanging its files; 0 when every file of every other rank arrived, in order, with its bytes.
int exchange_and_check(const group_spec& g, const std::string& description) {
  std::vector<std::vector<std::string>> got(static_cast<std::size_t>(g.size));
  exchange_files(
      g, description, files_of(g.rank), [&](std::size_t i) { return file_with(label(g.rank, i)); }, files_of,
      [&](int r, std::size_t i, int fd) {
        if (i == got[static_cast<std::size_t>(r)].size()) got[static_cast<std::size_t>(r)].push_back(read_file(fd));
        ::close(fd);
      });
  for (int r = 0; r < g.size; ++r) {
    if (r == g.rank) continue;
    const auto& v = got[static_cast<std::size_t>(r)];
    if (v.size() != files_of(r)) return 2;
    for (std::size_t i = 0; i < v.size(); ++i)
      if (v[i] != label(r, i)) return 3;
  }
  return 0;
}

} // namespace

TEST_CASE("every rank of a group receives every other rank's files, in order and intact") {
  for (const int n : {2, 4}) {
    const std::string name = unique_group("files");
    const auto rc = in_processes(n, [&](int r) {
      group_spec g{name, r, n, std::chrono::milliseconds(20000)};
      return exchange_and_check(g, "cache 4096x1024");
    });
    for (int r = 0; r < n; ++r) {
      INFO(n << " ranks, rank " << r);
      CHECK(rc[static_cast<std::size_t>(r)] == 0);
    }
  }
}

TEST_CASE("a rank that never comes fails the others after the timeout, naming it") {
  const std::string name = unique_group("missing");
  // Rank 1 of 2 never starts: rank 0 (this process) gives up.
  group_spec g{name, 0, 2, std::chrono::milliseconds(300)};
  CHECK_THROWS_WITH(exchange_and_check(g, "x"),
                    Catch::Matchers::ContainsSubstring("rank 1 of page cache group '" + name + "' did not appear"));
}

TEST_CASE("ranks that build different caches both fail, naming both configurations") {
  const std::string name = unique_group("mismatch");
  const auto rc = in_processes(2, [&](int r) {
    group_spec g{name, r, 2, std::chrono::milliseconds(5000)};
    try {
      exchange_and_check(g, r == 0 ? "pages 4096" : "pages 512");
    } catch (const bam::error& e) {
      const std::string m = e.what();
      return m.find("pages 4096") != std::string::npos && m.find("pages 512") != std::string::npos ? 0 : 4;
    }
    return 5; // no error at all
  });
  CHECK(rc[0] == 0);
  CHECK(rc[1] == 0);
}

TEST_CASE("a group name and rank taken by a running process is refused, not shared") {
  const std::string name = unique_group("taken");
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t holder = ::fork();
  if (holder == 0) {
    // Holds rank 0 and waits for a rank 1 that comes late (after the check below).
    ::close(ready[0]);
    group_spec g{name, 0, 2, std::chrono::milliseconds(5000)};
    const char one = 1;
    (void)::write(ready[1], &one, 1);
    int rc = 0;
    try {
      rc = exchange_and_check(g, "same");
    } catch (...) {
      rc = 7;
    }
    ::_exit(rc);
  }
  ::close(ready[1]);
  char b = 0;
  REQUIRE(::read(ready[0], &b, 1) == 1);
  ::close(ready[0]);
  // Wait until the holder listens (its abstract socket is listed), then try its place.
  const std::string listed = "@bam-page-cache/" + name + "/0";
  bool listening = false;
  for (int attempt = 0; attempt < 500 && !listening; ++attempt) {
    std::ifstream net("/proc/net/unix");
    std::string line;
    while (std::getline(net, line))
      listening = listening || line.find(listed) != std::string::npos;
    if (!listening) ::usleep(10000);
  }
  REQUIRE(listening);
  bool refused = false;
  try {
    group_spec again{name, 0, 2, std::chrono::milliseconds(50)};
    exchange_and_check(again, "same");
  } catch (const bam::error& e) {
    refused = std::string(e.what()).find("already taken") != std::string::npos;
  }
  CHECK(refused);
  // Rank 1 comes: the holder finishes its exchange as usual.
  group_spec one{name, 1, 2, std::chrono::milliseconds(5000)};
  CHECK(exchange_and_check(one, "same") == 0);
  int st = 0;
  REQUIRE(::waitpid(holder, &st, 0) == holder);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
}

TEST_CASE("a group's directory gives each medium one number in every process, also when they name it at once") {
  const std::string name = unique_group("dir");
  group_directory d = group_directory::create(name);
  const int fd = d.file();
  const std::vector<std::string> media = {"shm:a,ssds=1,lba=512", "shm:b,ssds=1,lba=512", "file:/x,ssds=1,lba=512",
                                          "pci:0000:01:00.0;nsid=1"};
  // Four processes name the media in different orders, at once, and write what they got into a pipe.
  int out[2];
  REQUIRE(::pipe(out) == 0);
  constexpr int n = 4;
  const auto rc = in_processes(n, [&](int r) {
    group_directory mine = group_directory::open(::dup(fd), name);
    std::vector<std::uint32_t> got(media.size());
    for (std::size_t k = 0; k < media.size(); ++k) {
      const std::size_t m = (k + static_cast<std::size_t>(r)) % media.size();
      got[m] = mine.number(media[m], std::chrono::milliseconds(5000));
    }
    return ::write(out[1], got.data(), got.size() * sizeof got[0]) == static_cast<ssize_t>(got.size() * sizeof got[0])
               ? 0
               : 1;
  });
  ::close(out[1]);
  for (int r = 0; r < n; ++r)
    CHECK(rc[static_cast<std::size_t>(r)] == 0);
  std::vector<std::vector<std::uint32_t>> all;
  for (int r = 0; r < n; ++r) {
    std::vector<std::uint32_t> got(media.size());
    REQUIRE(::read(out[0], got.data(), got.size() * sizeof got[0]) == static_cast<ssize_t>(got.size() * sizeof got[0]));
    all.push_back(got);
  }
  ::close(out[0]);
  for (int r = 1; r < n; ++r)
    CHECK(all[static_cast<std::size_t>(r)] == all[0]);
  // Different media, different numbers; the numbers are the first ones.
  std::vector<std::uint32_t> sorted = all[0];
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == std::vector<std::uint32_t>{0, 1, 2, 3});
  // And this process, naming them again, gets the same.
  for (std::size_t m = 0; m < media.size(); ++m)
    CHECK(d.number(media[m], std::chrono::milliseconds(100)) == all[0][m]);
  CHECK(d.number("shm:c,ssds=1,lba=512", std::chrono::milliseconds(100)) == 4);
}

TEST_CASE("a group's directory refuses the medium after its last entry, and names too long") {
  group_directory d = group_directory::create(unique_group("full"));
  for (std::uint32_t i = 0; i < group_directory::entries; ++i)
    REQUIRE(d.number("m" + std::to_string(i), std::chrono::milliseconds(100)) == i);
  CHECK(d.number("m5", std::chrono::milliseconds(100)) == 5);
  CHECK_THROWS_WITH(d.number("one more", std::chrono::milliseconds(100)),
                    Catch::Matchers::ContainsSubstring("as many as it can"));
  CHECK_THROWS_WITH(d.number(std::string(2000, 'x'), std::chrono::milliseconds(100)),
                    Catch::Matchers::ContainsSubstring("medium name of 2000 characters"));
}
