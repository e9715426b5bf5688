// SPDX-License-Identifier: MIT
// A crash in the middle: a process whose kernels have writes in flight to a
// file-backed software controller is killed with SIGKILL; the next process
// brings the same storage up and reads what was flushed before the kill.
// The writer is a process of its own (crash_writer.cu, started with
// posix_spawn: this process has initialised CUDA, so it must not fork and
// go on).
#include "crash_layout.cuh"
#include "test_util.cuh"

#include <catch2/catch_test_macros.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#ifndef BAM_TEST_CRASH_WRITER
#error "BAM_TEST_CRASH_WRITER must name the crash writer executable"
#endif

extern char** environ;

namespace {

//! The file's words as the crash test lays them out before the writer runs:
//! guard words everywhere (the array's part included: the writer's first
//! pattern replaces it).
void make_guarded_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  std::vector<std::uint32_t> buf((1 << 20) / 4);
  for (std::uint64_t off = 0; off < bam_crash::file_bytes; off += buf.size() * 4) {
    for (std::size_t k = 0; k < buf.size(); ++k)
      buf[k] = bam_crash::guard_word(off / 4 + k);
    REQUIRE(::pwrite(fd, buf.data(), buf.size() * 4, static_cast<off_t>(off)) == static_cast<ssize_t>(buf.size() * 4));
  }
  REQUIRE(::fsync(fd) == 0);
  ::close(fd);
}

std::vector<std::uint32_t> read_file_words(const std::string& path) {
  std::vector<std::uint32_t> w(bam_crash::file_bytes / 4);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  std::size_t done = 0;
  while (done < w.size() * 4) {
    const ssize_t r =
        ::pread(fd, reinterpret_cast<char*>(w.data()) + done, w.size() * 4 - done, static_cast<off_t>(done));
    REQUIRE(r > 0);
    done += static_cast<std::size_t>(r);
  }
  ::close(fd);
  return w;
}

//! Wait up to `seconds` for one byte on `fd`: the byte, or 0 on EOF or timeout.
char wait_for_mark(int fd, int seconds) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, seconds * 1000) != 1) return 0;
  char c = 0;
  return ::read(fd, &c, 1) == 1 ? c : 0;
}

std::string describe_exit(int st) {
  if (WIFEXITED(st)) return "exited with status " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return std::string("killed by ") + strsignal(WTERMSIG(st));
  return "status " + std::to_string(st);
}

__global__ void compare_kernel(bam::array_ref<std::uint32_t> a, const std::uint32_t* want, bam_test::counters* c) {
  unsigned long long bad = 0, done = 0;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < a.size();
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    if (a[i] != want[i]) {
      if (bad == 0) atomicMin(&c->first_bad_index, static_cast<unsigned long long>(i));
      ++bad;
    }
    ++done;
  }
  if (bad) atomicAdd(&c->bad, bad);
  atomicAdd(&c->done, done);
}

__global__ void write_kernel(bam::array_ref<std::uint32_t> a, std::uint32_t salt) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < a.size();
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    a.write(i, bam_crash::mix(i ^ (std::uint64_t{salt} << 32)));
}

} // namespace

TEST_CASE("a process killed with writes in flight: the next one brings the storage up and reads "
          "what was flushed",
          "[gpu][crash]") {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("bam-crash-" + std::to_string(::getpid()) + ".img")).string();
  make_guarded_file(path);
  struct remove_file {
    std::string p;
    ~remove_file() { std::remove(p.c_str()); }
  } cleanup{path};

  // The writer, with the write end of a pipe.
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  const int child_fd = ::fcntl(fds[1], F_DUPFD, 10); // without O_CLOEXEC: inherited
  REQUIRE(child_fd >= 0);
  ::close(fds[1]);
  const std::string fd_arg = std::to_string(child_fd);
  std::string exe = BAM_TEST_CRASH_WRITER;
  std::vector<char*> argv{exe.data(), const_cast<char*>(path.c_str()), const_cast<char*>(fd_arg.c_str()), nullptr};
  pid_t pid = 0;
  REQUIRE(::posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), environ) == 0);
  ::close(child_fd);
  struct reap {
    pid_t pid;
    int fd;
    ~reap() {
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
      ::close(fd);
    }
  } child{pid, fds[0]};

  const char first = wait_for_mark(fds[0], 120);
  if (first != bam_crash::flushed_mark) {
    int st = 0;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &st, 0);
    child.pid = 0;
    FAIL("the writer did not flush its first pattern: it " << describe_exit(st));
  }
  const char second = wait_for_mark(fds[0], 60);
  REQUIRE(second == bam_crash::in_flight_mark);
  // Let it run on a little, then kill it in the middle of its writes.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  REQUIRE(::kill(pid, SIGKILL) == 0);
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  child.pid = 0;
  INFO("the writer " << describe_exit(st));
  REQUIRE(WIFSIGNALED(st));
  REQUIRE(WTERMSIG(st) == SIGKILL); // it was still writing: nothing ended it but the kill

  // The file as the kill left it: guard words outside the array intact; the
  // half written after the flush holds, element by element, the flushed
  // value or the unflushed one (pages evicted and written back before the
  // kill); the other half exactly what was flushed.
  const std::vector<std::uint32_t> words = read_file_words(path);
  const std::uint64_t first_word = bam_crash::array_offset / 4;
  const std::uint64_t end_word = first_word + bam_crash::elements;
  std::uint64_t bad_guard = 0, bad_rewritten = 0, bad_flushed = 0, unflushed_seen = 0;
  for (std::uint64_t w = 0; w < words.size(); ++w) {
    if (w < first_word || w >= end_word) {
      bad_guard += words[w] != bam_crash::guard_word(w);
      continue;
    }
    const std::uint64_t i = w - first_word;
    if (i >= bam_crash::rewritten) {
      bad_flushed += words[w] != bam_crash::flushed_value(i);
    } else if (words[w] == bam_crash::unflushed_value(i)) {
      ++unflushed_seen;
    } else {
      bad_rewritten += words[w] != bam_crash::flushed_value(i);
    }
  }
  std::printf("crash: writer killed with writes in flight; %llu of %llu rewritten elements had "
              "reached the file\n",
              static_cast<unsigned long long>(unflushed_seen), static_cast<unsigned long long>(bam_crash::rewritten));
  CHECK(bad_guard == 0);
  CHECK(bad_flushed == 0);
  CHECK(bad_rewritten == 0);
  CHECK(unflushed_seen > 0); // the writer said write-backs of the second pattern had completed

  // The next process (this one) brings the same storage up and reads
  // through the cache exactly what the file holds.
  bam::storage s(bam_crash::device_string(path));
  REQUIRE(s.blocks_per_controller() * s.lba_size() == bam_crash::file_bytes);
  bam::page_cache cache({.page_size = bam_crash::page_size, .capacity = bam_crash::cache_bytes});
  bam::array<std::uint32_t> a(cache, s, bam_crash::elements, bam_crash::array_lba);
  bam::device_buffer<std::uint32_t> want(bam_crash::elements);
  bam::copy_to_device(want.get(), words.data() + first_word, bam_crash::elements);
  bam_test::device_counters c;
  compare_kernel<<<256, 256>>>(a.ref(), want.get(), c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().done == bam_crash::elements);
  INFO("first element that differs from the file " << c.get().first_bad_index);
  CHECK(c.get().bad == 0);

  // And it works: a full write, flush, and the file holds it (guards untouched).
  write_kernel<<<256, 256>>>(a.ref(), 3);
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  REQUIRE_NOTHROW(cache.flush());
  const std::vector<std::uint32_t> after = read_file_words(path);
  bad_guard = 0;
  std::uint64_t bad_array = 0;
  for (std::uint64_t w = 0; w < after.size(); ++w) {
    if (w < first_word || w >= end_word)
      bad_guard += after[w] != bam_crash::guard_word(w);
    else
      bad_array += after[w] != bam_crash::mix((w - first_word) ^ (std::uint64_t{3} << 32));
  }
  CHECK(bad_guard == 0);
  CHECK(bad_array == 0);
}
