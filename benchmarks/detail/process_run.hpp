// SPDX-License-Identifier: MIT
// One process per GPU for the benchmarks' --processes runs (block_bench,
// bam-gnn aggregate): the first process starts the others as copies of
// itself (its command line plus options of their own). They share one page
// (a memfd the others inherit): a barrier that fails, rather than hangs,
// when one of them failed or ended without reaching it, and one number per
// process.
#pragma once

#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace bam::bench {

//! Whether process `pid` still runs: not gone, not a zombie (ended, not yet
//! reaped by its parent).
inline bool process_running(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  if (!f) return false;
  const std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::size_t name_end = stat.rfind(')'); // "pid (name) S ...": the name may hold anything
  if (name_end == std::string::npos || name_end + 2 >= stat.size()) return true;
  const char state = stat[name_end + 2];
  return state != 'Z' && state != 'X';
}

//! What the processes of a run share.
struct process_sync {
  static constexpr int max_processes = 64;
  std::atomic<int> arrived;
  std::atomic<int> generation;
  std::atomic<int> failed;
  std::atomic<int> pids[max_processes]; //!< the run's processes by rank (0: none)
  double times[max_processes];          //!< one number per process (e.g. its time, for the slowest)

  //! Returns once `n` processes arrived. Throws when one of them failed, or
  //! ended (killed, crashed) without arriving: it would never arrive.
  void wait(int n) {
    const int gen = generation.load();
    if (arrived.fetch_add(1) + 1 == n) {
      arrived.store(0);
      generation.fetch_add(1);
      return;
    }
    for (unsigned spins = 1; generation.load() == gen; ++spins) {
      if (failed.load() != 0) throw std::runtime_error("another process of the run failed");
      if (spins % 1024 == 0) {
        const int gone = first_ended();
        // One that arrived last may end as soon as it returns: the barrier
        // is passed then.
        if (gone >= 0 && generation.load() == gen)
          throw std::runtime_error("process " + std::to_string(gone) + " of the run (pid " +
                                   std::to_string(pids[gone].load()) + ") ended without reaching the others");
      }
      ::usleep(20);
    }
  }

  //! The rank of a registered process that no longer runs, or -1.
  int first_ended() const {
    for (int k = 0; k < max_processes; ++k) {
      const int p = pids[k].load();
      if (p != 0 && !process_running(p)) return k;
    }
    return -1;
  }
};

//! The first process's side: the shared page and the processes it started.
//! The destructor marks the run failed if it ends by an exception, and
//! waits for every process it started.
class process_run {
public:
  process_run() {
    fd_ = ::memfd_create("bam-process-run", 0); // no close-on-exec: the processes started inherit it
    if (fd_ < 0 || ::ftruncate(fd_, sizeof(process_sync)) != 0) {
      if (fd_ >= 0) ::close(fd_);
      throw std::runtime_error("--processes: no memfd for the processes' barrier");
    }
    void* mem = ::mmap(nullptr, sizeof(process_sync), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (mem == MAP_FAILED) {
      ::close(fd_);
      throw std::runtime_error("--processes: cannot map the processes' barrier");
    }
    sync_ = static_cast<process_sync*>(mem); // zeroes: a fresh barrier
    sync_->pids[0].store(::getpid());
  }
  process_run(const process_run&) = delete;
  process_run& operator=(const process_run&) = delete;
  ~process_run() {
    if (!kids_.empty()) {
      sync_->failed.store(1); // still running: the run did not get to wait_all
      (void)wait_all();
    }
    ::munmap(sync_, sizeof(process_sync));
    ::close(fd_);
    for (const auto& f : files_)
      std::remove(f.c_str());
  }

  process_sync& sync() { return *sync_; }
  //! The descriptor a started process passes to attach_process_sync.
  int fd() const { return fd_; }
  //! A file in the temporary directory, named from `name`, where a started
  //! process writes what it reports; removed with the run.
  std::string report_file(const std::string& name) {
    files_.push_back((std::filesystem::temp_directory_path() / name).string());
    return files_.back();
  }
  //! Marks the run failed: the others' next wait throws.
  void fail() { sync_->failed.store(1); }

  //! Starts this program again (or `program`) with `args` (argv[0] first)
  //! as the run's next process. Throws, after marking the run failed, when
  //! it cannot.
  void start(std::vector<std::string> args, const std::string& program = "/proc/self/exe") {
    if (kids_.size() + 1 >= static_cast<std::size_t>(process_sync::max_processes)) {
      fail();
      throw std::runtime_error("--processes: at most " + std::to_string(process_sync::max_processes) + " processes");
    }
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (::posix_spawn(&pid, program.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
      fail();
      throw std::runtime_error("--processes: could not start process " + std::to_string(kids_.size() + 1));
    }
    kids_.push_back(pid);
    sync_->pids[kids_.size()].store(pid);
  }

  //! Waits for every process started; true when each exited with status 0.
  //! failures() then says how each other one ended.
  bool wait_all() {
    for (std::size_t k = 0; k < kids_.size(); ++k) {
      int st = 0;
      while (::waitpid(kids_[k], &st, 0) < 0 && errno == EINTR) {
      }
      const std::string who = "process " + std::to_string(k + 1) + " of the run (pid " + std::to_string(kids_[k]) + ")";
      if (WIFSIGNALED(st))
        failures_.push_back(who + " was killed by signal " + std::to_string(WTERMSIG(st)));
      else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        failures_.push_back(who + " exited with status " + std::to_string(WEXITSTATUS(st)) + " (its message is above)");
    }
    kids_.clear();
    return failures_.empty();
  }
  //! How the processes that failed ended (after wait_all).
  const std::vector<std::string>& failures() const { return failures_; }

private:
  int fd_ = -1;
  process_sync* sync_ = nullptr;
  std::vector<pid_t> kids_;
  std::vector<std::string> files_;
  std::vector<std::string> failures_;
};

//! A started process's side: the run's shared page, from the descriptor it
//! inherited. Null when it cannot be mapped.
inline process_sync* attach_process_sync(int fd) {
  void* mem = ::mmap(nullptr, sizeof(process_sync), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return mem == MAP_FAILED ? nullptr : static_cast<process_sync*>(mem);
}

} // namespace bam::bench
