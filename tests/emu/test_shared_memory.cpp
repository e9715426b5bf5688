// SPDX-License-Identifier: MIT
// Shared-memory media (`shm=NAME`), host side: names, create and attach,
// sizes that disagree, who removes the name, and processes (fork) that see
// each other's writes, through the mapping and through software controllers.
#include <bam/emu.hpp>
#include <bam/host.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Catch::Matchers::ContainsSubstring;

//! A name of this process's own, removed at scope exit.
struct scratch_name {
  std::string name;
  scratch_name() {
    static int serial = 0;
    name = "test-" + std::to_string(::getpid()) + "-" + std::to_string(serial++);
  }
  ~scratch_name() { ::shm_unlink(bam::emu::shared_memory_object(name).c_str()); }
};

bool object_exists(const std::string& name) {
  const int fd = ::shm_open(bam::emu::shared_memory_object(name).c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

std::string thrown(auto&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

std::uint32_t word(std::uint64_t i, std::uint32_t salt) {
  return static_cast<std::uint32_t>((i + salt) * 2654435761u) ^ salt;
}

//! A pipe to wait on the other process: one byte per step.
struct signal_pipe {
  int fd[2] = {-1, -1};
  signal_pipe() { REQUIRE(::pipe(fd) == 0); }
  ~signal_pipe() {
    ::close(fd[0]);
    ::close(fd[1]);
  }
  void post() const {
    const char c = 1;
    (void)!::write(fd[1], &c, 1);
  }
  bool wait() const {
    char c = 0;
    return ::read(fd[0], &c, 1) == 1;
  }
};

//! Run `child` in a forked process; its return value is its exit status.
template <class Child>
pid_t fork_child(Child&& child) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = 1;
    try {
      rc = child();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    ::_exit(rc);
  }
  return pid;
}

int exit_status(pid_t pid) {
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

} // namespace

TEST_CASE("shm: names are one path component, checked by the device-string parser", "[shm]") {
  CHECK(bam::shm_name_problem("features").empty());
  CHECK(bam::shm_name_problem("ogbn.papers_100M-v2").empty());
  CHECK_THAT(bam::shm_name_problem(""), ContainsSubstring("empty"));
  CHECK_THAT(bam::shm_name_problem("a/b"), ContainsSubstring("'/'"));
  CHECK_THAT(bam::shm_name_problem(".."), ContainsSubstring("not a name"));
  CHECK_THAT(bam::shm_name_problem("a b"), ContainsSubstring("one path component"));
  CHECK_THAT(bam::shm_name_problem(std::string(bam::shm_name_max + 1, 'x')), ContainsSubstring("longer"));

  const bam::device_spec s = bam::parse_device("emu-gpu:shm=feat,size=64M,unlink");
  CHECK(s.kind == bam::device_kind::emu_gpu);
  CHECK(s.media == bam::media_kind::shm);
  CHECK(s.shm_name == "feat");
  CHECK(s.bytes == 64ull << 20);
  CHECK(s.shm_unlink);
  const bam::device_spec a = bam::parse_device("emu:shm=feat");
  CHECK(a.kind == bam::device_kind::emu_cpu);
  CHECK(a.bytes == 0);
  CHECK(!a.shm_unlink);

  auto fails_with = [](const std::string& dev, const std::string& text) {
    CHECK_THAT(thrown([&] { bam::parse_device(dev); }), ContainsSubstring(text));
  };
  fails_with("emu-gpu:shm=a/b,size=1M", "one path component");
  fails_with("emu-gpu:shm=..,size=1M", "not a name");
  fails_with("emu-gpu:shm=x,size=0", "size is zero");
  fails_with("emu-gpu:shm=x,ram=1M", "more than one media");
  fails_with("emu-gpu:ram=1M,unlink", "unlink applies to shm= media only");
  fails_with("emu-gpu:ram=1M,size=1M", "size= applies to file and shm= media only");
  fails_with("emu-gpu:shm=x,size=1000", "not a multiple of the LBA size");
}

TEST_CASE("shm: the first opener creates it zero-filled, later ones attach and must agree on the size", "[shm]") {
  scratch_name n;
  CHECK_THAT(thrown([&] { bam::emu::shared_memory::open(n.name); }), ContainsSubstring("give size="));
  {
    auto m = bam::emu::shared_memory::open(n.name, {.bytes = 1 << 20});
    CHECK(m->created());
    CHECK(m->size() == 1u << 20);
    CHECK(m->object() == "/bam-" + n.name);
    CHECK(std::all_of(m->data(), m->data() + m->size(), [](std::uint8_t b) { return b == 0; }));
    std::memcpy(m->data() + 4096, "shared", 6);
    // Opened again in this process: the same mapping, whatever size is given or not.
    CHECK(bam::emu::shared_memory::open(n.name).get() == m.get());
    CHECK(bam::emu::shared_memory::open(n.name, {.bytes = 1 << 20}).get() == m.get());
    const std::string e = thrown([&] { bam::emu::shared_memory::open(n.name, {.bytes = 2 << 20}); });
    CHECK_THAT(e, ContainsSubstring("1048576 bytes"));
    CHECK_THAT(e, ContainsSubstring("2097152"));
    CHECK_THAT(e, ContainsSubstring(n.name));
  }
  // Closed by every user: the name and its data stay (as a file's would).
  REQUIRE(object_exists(n.name));
  {
    auto m = bam::emu::shared_memory::open(n.name);
    CHECK(!m->created());
    CHECK(m->size() == 1u << 20);
    CHECK(std::memcmp(m->data() + 4096, "shared", 6) == 0);
    CHECK_THAT(thrown([&] { bam::emu::shared_memory::open(n.name, {.bytes = 4096}); }),
               ContainsSubstring("not the 4096 asked for"));
  }
  CHECK(bam::emu::remove_shared_memory(n.name));
  CHECK(!bam::emu::remove_shared_memory(n.name));
  CHECK(!object_exists(n.name));
  CHECK_THAT(thrown([&] { bam::emu::remove_shared_memory("../etc"); }), ContainsSubstring("'/'"));
}

TEST_CASE("shm: an object left unsized by a creator that died is sized by the next opener", "[shm]") {
  scratch_name n;
  const int fd = ::shm_open(bam::emu::shared_memory_object(n.name).c_str(), O_RDWR | O_CREAT, 0600);
  REQUIRE(fd >= 0);
  ::close(fd);
  CHECK_THAT(thrown([&] { bam::emu::shared_memory::open(n.name); }), ContainsSubstring("is empty"));
  auto m = bam::emu::shared_memory::open(n.name, {.bytes = 8192});
  CHECK(m->created());
  CHECK(m->size() == 8192);
}

TEST_CASE("shm: new objects are the user's alone (0600)", "[shm]") {
  scratch_name n;
  auto m = bam::emu::shared_memory::open(n.name, {.bytes = 4096});
  struct stat st {};
  REQUIRE(::stat(("/dev/shm/bam-" + n.name).c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
}

TEST_CASE("shm: with unlink, the last user to close removes the name; a killed user counts as closed", "[shm]") {
  scratch_name n;
  {
    auto m = bam::emu::shared_memory::open(n.name, {.bytes = 4096, .unlink_at_last_close = true});
    CHECK(m->unlinks_at_last_close());
  }
  CHECK(!object_exists(n.name));

  // Another process has it open: closing here leaves the name.
  signal_pipe ready, never;
  const pid_t child = fork_child([&] {
    auto m = bam::emu::shared_memory::open(n.name, {.bytes = 4096});
    ready.post();
    never.wait(); // until killed
    return 0;
  });
  REQUIRE(ready.wait());
  {
    auto m = bam::emu::shared_memory::open(n.name, {.bytes = 4096, .unlink_at_last_close = true});
    CHECK(!m->created());
  }
  CHECK(object_exists(n.name));
  // Killed mid-run: it never closes, but the kernel drops its lock.
  ::kill(child, SIGKILL);
  CHECK(exit_status(child) == 128 + SIGKILL);
  { auto m = bam::emu::shared_memory::open(n.name, {.bytes = 4096, .unlink_at_last_close = true}); }
  CHECK(!object_exists(n.name));
}

TEST_CASE("shm: two processes see each other's writes through the mapping", "[shm]") {
  scratch_name n;
  constexpr std::uint64_t words = (4u << 20) / 4;
  signal_pipe to_child, to_parent;
  const pid_t child = fork_child([&] {
    auto m = bam::emu::shared_memory::open(n.name, {.bytes = words * 4});
    auto* w = reinterpret_cast<std::uint32_t*>(m->data());
    for (std::uint64_t i = 0; i < words; ++i)
      w[i] = word(i, 1);
    to_parent.post();
    if (!to_child.wait()) return 2;
    for (std::uint64_t i = 0; i < words; ++i)
      if (w[i] != word(i, 2)) return 3;
    return 0;
  });
  REQUIRE(to_parent.wait());
  auto m = bam::emu::shared_memory::open(n.name, {.bytes = words * 4});
  CHECK(!m->created());
  auto* w = reinterpret_cast<std::uint32_t*>(m->data());
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < words; ++i) {
    bad += w[i] != word(i, 1);
    w[i] = word(i, 2);
  }
  CHECK(bad == 0);
  to_child.post();
  CHECK(exit_status(child) == 0);
}

TEST_CASE("shm: software controllers of two processes serve one copy of the blocks (emu:shm=)", "[shm]") {
  scratch_name n;
  const std::string dev = "emu:shm=" + n.name + ",size=4M,lba=4096,threads=1";
  constexpr std::uint32_t blocks = 64, lba = 4096;
  signal_pipe done;
  const pid_t child = fork_child([&] {
    bam::controller c(bam::open_host_transports(bam::parse_device(dev)).at(0));
    auto buf = c.transport().alloc(blocks * lba);
    auto* w = reinterpret_cast<std::uint32_t*>(buf->data());
    for (std::uint64_t i = 0; i < blocks * lba / 4; ++i)
      w[i] = word(i, 7);
    c.write(1, 100, blocks, *buf);
    done.post();
    return 0;
  });
  REQUIRE(done.wait());
  CHECK(exit_status(child) == 0);
  // The writer is gone; its blocks are not.
  bam::controller c(bam::open_host_transports(bam::parse_device("emu:shm=" + n.name + ",lba=4096,threads=1")).at(0));
  CHECK(c.ns(1).blocks == (4u << 20) / lba);
  auto buf = c.transport().alloc(blocks * lba);
  c.read(1, 100, blocks, *buf);
  const auto* w = reinterpret_cast<const std::uint32_t*>(buf->data());
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < blocks * lba / 4; ++i)
    bad += w[i] != word(i, 7);
  CHECK(bad == 0);
  // An LBA size the object's size is no multiple of is refused.
  const auto odd = bam::emu::shared_memory::open(n.name + "-odd", {.bytes = 6144, .unlink_at_last_close = true});
  CHECK_THAT(thrown([&] { bam::open_host_transports(bam::parse_device("emu:shm=" + n.name + "-odd,lba=4096")); }),
             ContainsSubstring("not a multiple of the LBA size"));
}
