// SPDX-License-Identifier: MIT
//! `bam::error`: the one exception type of bam's host code. It carries what
//! failed — controller, queue, command, LBA, NVMe status, errno — and prints
//! as one line.
//!
//! @code
//!   try { ctrl.read(1, lba, 8, buf); }
//!   catch (const bam::error& e) { std::fprintf(stderr, "%s\n", e.what()); }
//!   // bam: read failed: controller emu:ram, queue 3, opcode 0x02, cid 17,
//!   //      LBA 123456, status LBA Out of Range (sct 0x0 sc 0x80)
//! @endcode
#pragma once

#include <bam/nvme/spec.hpp>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

namespace bam {

//! What an error is about; every field is optional.
struct error_context {
  std::string controller;             //!< device string or name
  std::optional<std::uint16_t> queue; //!< queue id (0: admin)
  std::optional<std::uint8_t> opcode;
  std::optional<std::uint16_t> cid;
  std::optional<std::uint64_t> lba;
  std::optional<std::uint64_t> index; //!< array element index
  std::optional<nvme::status> status;
  int errnum = 0; //!< errno, 0 if none
};

class error : public std::runtime_error {
public:
  error(const std::string& what_failed, error_context ctx = {})
      : std::runtime_error(format(what_failed, ctx)), ctx_(std::move(ctx)) {}

  //! The same failure, its message prefixed with what was being done.
  static error wrap(const std::string& doing, const error& e) {
    std::string w = e.what();
    if (w.rfind("bam: ", 0) == 0) w.erase(0, 5);
    return error(preformatted{}, "bam: " + doing + ": " + w, e.context());
  }

  //! A mistake in what a person wrote (a device string, a size, a file that
  //! is not there): `message` says what was wrong and what to write instead.
  //! errnum() is `errnum` (EINVAL unless given); the message leaves out the
  //! errno text, which would only repeat it ("Invalid argument").
  static error invalid_input(const std::string& message, int errnum = EINVAL, error_context ctx = {}) {
    ctx.errnum = 0;
    std::string text = format(message, ctx);
    ctx.errnum = errnum;
    return error(preformatted{}, std::move(text), std::move(ctx));
  }

  const error_context& context() const noexcept { return ctx_; }
  //! NVMe status if the failure came from a completion (or a bam status).
  std::optional<nvme::status> status() const noexcept { return ctx_.status; }
  int errnum() const noexcept { return ctx_.errnum; }

  // Plain string building, no iostreams: the text must not depend on the
  // process's locale machinery (an extension module inside a Python process
  // that also holds other C++ runtimes crashed in ostream's number output).
  static std::string format(const std::string& what_failed, const error_context& c) {
    std::string out = "bam: " + what_failed;
    const char* sep = ": ";
    auto field = [&](const std::string& part) {
      out += sep;
      out += part;
      sep = ", ";
    };
    if (!c.controller.empty()) field("controller " + c.controller);
    if (c.queue) field("queue " + std::to_string(*c.queue));
    if (c.opcode) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "0x%02x", *c.opcode);
      field(std::string("opcode ") + buf);
    }
    if (c.cid) field("cid " + std::to_string(*c.cid));
    if (c.index) field("index " + std::to_string(*c.index));
    if (c.lba) field("LBA " + std::to_string(*c.lba));
    if (c.status) {
      char buf[32];
      std::snprintf(buf, sizeof buf, " (sct 0x%x sc 0x%02x)", static_cast<unsigned>(c.status->sct()), c.status->sc());
      field("status " + std::string(nvme::status_name(*c.status)) + buf);
    }
    if (c.errnum != 0) field("errno " + std::to_string(c.errnum) + " (" + std::strerror(c.errnum) + ")");
    return out;
  }

private:
  struct preformatted {};
  error(preformatted, const std::string& message, error_context ctx)
      : std::runtime_error(message), ctx_(std::move(ctx)) {}
  error_context ctx_;
};

//! Throw a `bam::error` for errno after a failed system call.
[[noreturn]] inline void throw_errno(const std::string& what_failed, int errnum = errno, std::string controller = {}) {
  error_context c;
  c.controller = std::move(controller);
  c.errnum = errnum;
  throw error(what_failed, std::move(c));
}

//! Where bam reports what it cannot throw (failures during teardown, in
//! destructors): by default one line on stderr. A program or test may route
//! the lines elsewhere; `nullptr` restores the default.
using warning_handler = std::function<void(const std::string&)>;

namespace detail {
struct warning_sink {
  std::mutex mutex;
  warning_handler handler;
};
inline warning_sink& warnings() {
  static warning_sink s;
  return s;
}
} // namespace detail

inline void set_warning_handler(warning_handler h) {
  auto& s = detail::warnings();
  std::lock_guard lock(s.mutex);
  s.handler = std::move(h);
}

//! Report a failure that cannot be thrown ("bam: " is prefixed).
inline void warn(const std::string& what) {
  auto& s = detail::warnings();
  std::lock_guard lock(s.mutex);
  if (s.handler)
    s.handler("bam: " + what);
  else
    std::fprintf(stderr, "bam: %s\n", what.c_str());
}

} // namespace bam
