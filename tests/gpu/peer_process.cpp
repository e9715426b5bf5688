// SPDX-License-Identifier: MIT
#include "peer_process.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sstream>
#include <stdexcept>

extern char** environ;

namespace bam_test {

peer::peer(const std::vector<std::string>& args) {
  int in[2], out[2];
  if (::pipe(in) != 0) throw std::runtime_error("pipe");
  if (::pipe(out) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    throw std::runtime_error("pipe");
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addclose(&fa, in[1]);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  const int rc = ::posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(in[0]);
  ::close(out[1]);
  to_ = ::fdopen(in[1], "w");
  from_ = ::fdopen(out[0], "r");
  if (rc != 0) {
    pid_ = -1;
    throw std::runtime_error("could not start " + args.at(0));
  }
}

peer::~peer() {
  if (to_ != nullptr) std::fclose(to_);
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (from_ != nullptr) std::fclose(from_);
}

std::string peer::line() {
  char b[4096];
  if (std::fgets(b, sizeof b, from_) == nullptr) return "";
  std::string s(b);
  while (!s.empty() && s.back() == '\n')
    s.pop_back();
  return s;
}

std::string peer::ask(const std::string& command) {
  std::fprintf(to_, "%s\n", command.c_str());
  std::fflush(to_);
  return line();
}

peer::checked peer::check(std::uint64_t first, std::uint64_t count, std::uint32_t salt) {
  std::istringstream in(
      ask("check " + std::to_string(first) + " " + std::to_string(count) + " " + std::to_string(salt)));
  std::string ok;
  checked c;
  in >> ok >> c.done >> c.bad >> c.misses;
  if (ok != "ok" || !in) c.bad = ~0ull;
  return c;
}

int peer::finish() {
  if (to_ != nullptr) std::fclose(to_);
  to_ = nullptr;
  int st = 0;
  if (pid_ <= 0 || ::waitpid(pid_, &st, 0) != pid_) return -1;
  pid_ = -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

} // namespace bam_test
