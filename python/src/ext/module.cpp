// SPDX-License-Identifier: MIT
// bam._core: the nanobind extension behind the `bam` Python package. Host
// side: device strings, host-driven controllers, loads and reads. GPU side
// (gpu.hpp): page cache, arrays, row gathers and writes on DLPack tensors.
#include "gpu.hpp"

#include <bam/host.hpp>
#include <bam/host/dataset.hpp>
#include <bam/transport/device_string.hpp>
#include <bam/error.hpp>
#include <bam/transport/open.hpp>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace bam::python {
namespace {

//! Bytes moved per step of a host copy that is not a `load_dataset`/`dump_dataset`.
constexpr std::uint64_t host_chunk_bytes = 1ull << 20;
//! I/O queues a host-driven controller asks for (what load_dataset uses at most).
constexpr std::uint32_t host_io_queues = 8;

using progress_fn = std::function<void(std::uint64_t done, std::uint64_t total)>;

//! How a transfer reports and is stopped.
struct transfer_control {
  progress_fn progress;                      //!< after each chunk; may be empty
  const std::atomic<bool>* cancel = nullptr; //!< set: stop cleanly (a load records its chunks)
};

struct transfer_result {
  std::uint64_t bytes = 0;
  std::string checksum;
  double seconds = 0;
  std::uint64_t resumed_chunks = 0; //!< a load: chunks an earlier, interrupted load had written
};

[[noreturn]] void invalid(const std::string& what) {
  error_context c;
  c.errnum = EINVAL;
  throw error(what, c);
}

//! What a device string names, for the host and, once an array needs it, for
//! GPU threads. `emu-gpu:` devices are GPU-side from the start. `emu:` and
//! kernel-module devices are driven by host threads until an array is made
//! over them; then the same device string is brought up for GPU submitters
//! and the host controllers are shut down (an `emu:ram` media's bytes are
//! carried over, a file or an SSD keeps them anyway). From then on loads and
//! reads go straight to the software controller's media, in whole blocks as
//! on the host; the caches of arrays over the storage write their dirty
//! pages back first, and before a load or write forget the pages they hold
//! of it. Transfers and the
//! switch hold one mutex; the properties are read with Python's GIL held.
//! `close()` waits for a transfer in flight, then lets the controllers go;
//! every use after it throws.
class storage_handle {
public:
  explicit storage_handle(const std::string& text) : spec_(parse_device(text)) {
    if (spec_.kind == device_kind::emu_gpu) {
      gpu_ = std::make_shared<gpu_storage>(text);
      return;
    }
    open_host();
  }

  const std::string& device_string() const { return spec_.text; }
  bool closed() const { return closed_; }
  bool gpu_side() const {
    check_open();
    return gpu_ != nullptr;
  }
  std::uint32_t controller_count() const {
    check_open();
    return gpu_ ? gpu_->controller_count() : static_cast<std::uint32_t>(host_.size());
  }
  std::uint32_t lba_size() const {
    check_open();
    return gpu_ ? gpu_->lba_size() : host_.front()->ns(1).lba_size;
  }
  std::uint64_t blocks() const {
    check_open();
    if (gpu_) return gpu_->blocks_per_controller();
    std::uint64_t b = host_.front()->ns(1).blocks;
    for (const auto& c : host_)
      b = std::min(b, c->ns(1).blocks);
    return b;
  }
  std::uint64_t bytes() const { return blocks() * lba_size() * controller_count(); }
  std::string name() const {
    check_open();
    if (gpu_) return gpu_->name();
    std::string n;
    for (const auto& c : host_)
      n += (n.empty() ? "" : "+") + c->name();
    return n;
  }
  std::string transport() const {
    check_open();
    if (gpu_) return gpu_->transport_name();
    return spec_.kind == device_kind::pci ? "pci (kernel module), host-driven"
                                          : "emu (software controller, CPU engine), host-driven";
  }

  //! Waits for a transfer in flight, then shuts the host controllers down and
  //! lets the GPU side go (arrays made over it keep it until they go).
  //! Closing twice is closing once.
  void close() {
    std::lock_guard lock(mutex_);
    closed_ = true;
    host_.clear();
    gpu_.reset();
  }

  //! The GPU-side storage, brought up now if the device is host-driven so far.
  gpu_storage& gpu() {
    std::lock_guard lock(mutex_);
    check_open();
    if (gpu_) return *gpu_;
    require_gpu();
    if (spec_.kind == device_kind::pci) {
      // A kernel-module device has one owner: the host controllers go first,
      // and come back if the GPU side cannot be brought up.
      host_.clear();
      try {
        gpu_ = std::make_shared<gpu_storage>(spec_.text);
      } catch (...) {
        open_host();
        throw;
      }
      return *gpu_;
    }
    // Software controllers: the GPU side is brought up next to the host one,
    // which goes only once the new one works (a RAM media's bytes carried over).
    auto g = std::make_shared<gpu_storage>(spec_.text);
    if (spec_.media == media_kind::ram) {
      for (std::uint32_t i = 0; i < host_.size(); ++i) {
        controller& c = *host_[i];
        std::vector<std::uint8_t> bytes(host_chunk_bytes);
        const std::uint64_t total = c.ns(1).blocks * c.ns(1).lba_size;
        for (std::uint64_t pos = 0; pos < total; pos += bytes.size()) {
          const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(bytes.size(), total - pos));
          read_host(c, pos, bytes.data(), n);
          g->write_media(i, pos, bytes.data(), n);
        }
      }
    }
    host_.clear();
    gpu_ = std::move(g);
    return *gpu_;
  }

  //! A file (or block device) onto the device at byte `offset`; resumable
  //! where the host controller loads it.
  transfer_result load_file(const std::string& path, std::uint64_t offset, bool resume, const std::string& state_path,
                            const transfer_control& ctl) {
    std::unique_lock lock(mutex_);
    check_open();
    if (!gpu_) {
      dataset_options o;
      o.offset = offset;
      o.resume = resume;
      o.state_path = state_path; // empty: beside the source
      if (ctl.progress) o.progress = [&](const transfer_progress& p) { ctl.progress(p.bytes_done, p.bytes_total); };
      o.cancel = ctl.cancel;
      controller& c = single_host("load");
      const std::uint64_t size = file_bytes(path);
      check_range("load", offset, size);
      const dataset_result r = load_dataset(c, path, o);
      return {r.bytes, r.checksum, r.seconds, r.resumed_chunks};
    }
    lock.unlock();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw_errno("opening '" + path + "'");
    struct closer {
      int fd;
      ~closer() { ::close(fd); }
    } guard{fd};
    data_source src;
    src.identity = path;
    src.size = file_bytes(path);
    src.read = [fd, path](std::uint64_t off, void* dst, std::size_t len) {
      auto* p = static_cast<char*>(dst);
      while (len > 0) {
        const ssize_t n = ::pread(fd, p, len, static_cast<off_t>(off));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_errno("reading '" + path + "'");
        if (n == 0) invalid("'" + path + "' ended early (it changed during the load)");
        p += n;
        off += static_cast<std::uint64_t>(n);
        len -= static_cast<std::size_t>(n);
      }
    };
    return load(src, offset, {}, false, ctl);
  }

  //! `src.size` bytes onto the device at byte `offset`.
  transfer_result load(const data_source& src, std::uint64_t offset, const std::string& state_path, bool resume,
                       const transfer_control& ctl) {
    std::lock_guard lock(mutex_);
    check_open();
    check_range("load", offset, src.size);
    if (!gpu_) {
      dataset_options o;
      o.offset = offset;
      o.state_path = state_path;
      o.resume = resume;
      if (ctl.progress) o.progress = [&](const transfer_progress& p) { ctl.progress(p.bytes_done, p.bytes_total); };
      o.cancel = ctl.cancel;
      const dataset_result r = load_dataset(single_host("load"), src, o);
      return {r.bytes, r.checksum, r.seconds};
    }
    single_gpu("load");
    // As load_dataset does on a host controller: whole blocks, the rest of
    // the last one zeroes; and the pages a cache holds of them go first.
    const std::uint32_t lba = gpu_->lba_size();
    if (offset % lba != 0)
      invalid("load: offset " + std::to_string(offset) + " is not a multiple of the LBA size (" + std::to_string(lba) +
              " bytes) of " + name() + " (e.g. " + std::to_string(offset / lba * lba) + " or " +
              std::to_string((offset / lba + 1) * lba) + ")");
    gpu_->before_host_write();
    transfer_result r = copy_chunks(src.size, ctl, [&](std::uint64_t pos, std::uint8_t* buf, std::size_t n) {
      src.read(pos, buf, n);
      gpu_->write_media(0, offset + pos, buf, n);
    });
    if (const std::uint64_t tail = (offset + src.size) % lba; tail != 0) {
      const std::vector<std::uint8_t> zeroes(lba - tail);
      gpu_->write_media(0, offset + src.size, zeroes.data(), zeroes.size());
    }
    return r;
  }

  //! What `read` checks first, before a buffer for it is made.
  void check_read(std::uint64_t offset, std::uint64_t n) {
    std::lock_guard lock(mutex_);
    check_open();
    check_range("read", offset, n);
  }

  //! `n` bytes at byte `offset` into `dst`.
  void read(std::uint64_t offset, std::uint8_t* dst, std::uint64_t n) {
    std::lock_guard lock(mutex_);
    check_open();
    check_range("read", offset, n);
    if (gpu_) {
      single_gpu("read");
      gpu_->before_host_read();
      gpu_->read_media(0, offset, dst, n);
    } else {
      read_host(single_host("read"), offset, dst, n);
    }
  }

  //! `n` bytes at byte `offset` into the file `path`.
  transfer_result dump(const std::string& path, std::uint64_t offset, std::uint64_t n, const transfer_control& ctl) {
    std::lock_guard lock(mutex_);
    check_open();
    check_range("dump", offset, n);
    if (!gpu_) {
      dataset_options o;
      o.offset = offset;
      if (ctl.progress) o.progress = [&](const transfer_progress& p) { ctl.progress(p.bytes_done, p.bytes_total); };
      o.cancel = ctl.cancel;
      const dataset_result r = dump_dataset(single_host("dump"), path, n, o);
      return {r.bytes, r.checksum, r.seconds};
    }
    single_gpu("dump");
    gpu_->before_host_read();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) throw_errno("creating '" + path + "'");
    auto r = copy_chunks(n, ctl, [&](std::uint64_t pos, std::uint8_t* buf, std::size_t len) {
      gpu_->read_media(0, offset + pos, buf, len);
      out.write(reinterpret_cast<const char*>(buf), static_cast<std::streamsize>(len));
      if (!out) throw_errno("writing '" + path + "'");
    });
    return r;
  }

private:
  void open_host() {
    controller_options o;
    o.io_queues = std::min(spec_.io_queues, host_io_queues);
    o.queue_depth = spec_.queue_depth;
    o.io_timeout_ns = spec_.timeout_ns;
    for (auto& t : open_host_transports(spec_))
      host_.push_back(std::make_unique<controller>(t, o));
  }

  void check_open() const {
    if (!closed_) return;
    error_context c;
    c.errnum = EBADF;
    throw error("storage '" + spec_.text + "' is closed", c);
  }

  //! Size of a file or block device (a directory is neither: its seek end is
  //! no size).
  static std::uint64_t file_bytes(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw_errno("opening '" + path + "'");
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      throw_errno("stat of '" + path + "'", e);
    }
    if (S_ISDIR(st.st_mode)) {
      ::close(fd);
      throw_errno("'" + path + "' is a directory, not a file", EISDIR);
    }
    const off_t end = ::lseek(fd, 0, SEEK_END);
    const int e = errno;
    ::close(fd);
    if (end < 0) throw_errno("size of '" + path + "'", e);
    return static_cast<std::uint64_t>(end);
  }

  void check_range(const char* what, std::uint64_t offset, std::uint64_t n) const {
    const std::uint64_t total = blocks() * lba_size();
    if (offset > total || n > total - offset)
      invalid(std::string(what) + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
              ") do not fit in the " + std::to_string(total) + " bytes of " + name());
  }

  controller& single_host(const char* what) {
    if (host_.size() != 1)
      invalid(std::string(what) + " on " + spec_.text + ": " + std::to_string(host_.size()) +
              " controllers; host transfers address one controller (name one device)");
    return *host_.front();
  }
  void single_gpu(const char* what) const {
    if (gpu_->controller_count() != 1)
      invalid(std::string(what) + " on " + spec_.text + ": " + std::to_string(gpu_->controller_count()) +
              " controllers with pages striped over them; host transfers address one controller "
              "(ssds=1)");
  }

  static void read_host(controller& c, std::uint64_t offset, std::uint8_t* dst, std::uint64_t n) {
    const std::uint32_t lba = c.ns(1).lba_size;
    const std::uint64_t chunk =
        std::max<std::uint64_t>(std::min<std::uint64_t>(c.max_transfer_bytes(), host_chunk_bytes) / lba * lba, lba);
    auto buf = c.transport().alloc(chunk);
    std::uint64_t pos = offset;
    const std::uint64_t end = offset + n;
    while (pos < end) {
      const std::uint64_t skip = pos % lba;
      const std::uint64_t want = std::min(end - pos + skip, chunk);
      const std::uint64_t blocks = (want + lba - 1) / lba;
      c.read(1, pos / lba, static_cast<std::uint32_t>(blocks), *buf);
      const std::uint64_t got = std::min(blocks * lba - skip, end - pos);
      std::memcpy(dst + (pos - offset), static_cast<const std::uint8_t*>(buf->data()) + skip, got);
      pos += got;
    }
  }

  template <class Step>
  static transfer_result copy_chunks(std::uint64_t n, const transfer_control& ctl, Step&& step) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::uint8_t> buf(std::min(n, host_chunk_bytes));
    detail::xxh128_stream sum;
    for (std::uint64_t pos = 0; pos < n;) {
      const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(n - pos, buf.size()));
      step(pos, buf.data(), len);
      sum.update(buf.data(), len);
      pos += len;
      if (ctl.progress) ctl.progress(pos, n);
      if (ctl.cancel != nullptr && ctl.cancel->load() && pos < n) {
        error_context c;
        c.errnum = EINTR;
        throw error("transfer interrupted after " + std::to_string(pos) + " of " + std::to_string(n) + " bytes", c);
      }
    }
    return {n, sum.hex(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
  }

  device_spec spec_;
  std::vector<std::unique_ptr<controller>> host_;
  std::shared_ptr<gpu_storage> gpu_;
  std::mutex mutex_;
  bool closed_ = false;
};

//! A transfer driven from Python: the progress callback runs with the GIL
//! held; an exception from it, or a pending signal (Ctrl-C), stops the
//! transfer cleanly (a load from a file records its chunks, to resume) and is
//! raised once the transfer has returned. Used with the GIL held, except
//! `control()`'s callback, which takes it.
class python_transfer {
public:
  explicit python_transfer(std::optional<nb::callable> cb) : cb_(std::move(cb)) {}

  transfer_control control() {
    transfer_control c;
    c.cancel = &cancel_;
    c.progress = [this](std::uint64_t done, std::uint64_t total) {
      nb::gil_scoped_acquire gil;
      if (error_) return;
      try {
        if (PyErr_CheckSignals() != 0) throw nb::python_error();
        if (cb_) (*cb_)(done, total);
      } catch (nb::python_error& e) {
        error_.emplace(std::move(e));
        cancel_ = true;
      }
    };
    return c;
  }

  //! Run `f` without the GIL; raise the callback's exception, if any, after it.
  template <class F>
  transfer_result run(F&& f) {
    transfer_result r;
    try {
      nb::gil_scoped_release nogil;
      r = f(control());
    } catch (...) {
      rethrow();
      throw;
    }
    rethrow();
    return r;
  }

private:
  void rethrow() {
    if (!error_) return;
    nb::python_error e = std::move(*error_);
    error_.reset();
    throw e;
  }

  std::optional<nb::callable> cb_;
  std::atomic<bool> cancel_{false};
  std::optional<nb::python_error> error_;
};

nb::dict as_dict(const transfer_result& r) {
  nb::dict d;
  d["bytes"] = r.bytes;
  d["checksum"] = r.checksum;
  d["seconds"] = r.seconds;
  d["resumed_chunks"] = r.resumed_chunks;
  return d;
}

//! A state file for a load from memory (nothing to resume from): in the
//! temporary directory, removed by load_dataset when the load completes.
std::string memory_load_state_path() {
  static std::atomic<std::uint64_t> counter{0};
  return (std::filesystem::temp_directory_path() /
          ("bam-python-load-" + std::to_string(::getpid()) + "-" + std::to_string(counter++)))
      .string();
}

using host_bytes = nb::ndarray<const std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using host_buffer = nb::ndarray<std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using cuda_ids = nb::ndarray<const std::int64_t, nb::ndim<1>, nb::c_contig, nb::device::cuda>;
using cuda_tensor = nb::ndarray<nb::c_contig, nb::device::cuda>;

void check_same_device(const cuda_ids& ids, const cuda_tensor& rows, const char* what) {
  if (ids.device_id() != rows.device_id())
    invalid(std::string(what) + ": the index is on cuda:" + std::to_string(ids.device_id()) +
            ", the rows on cuda:" + std::to_string(rows.device_id()));
}

void check_rows_bytes(const cuda_tensor& rows, std::uint64_t count, std::uint64_t row_width, std::uint32_t element_size,
                      const char* what) {
  const std::uint64_t want = count * row_width * element_size;
  if (rows.nbytes() != want)
    invalid(std::string(what) + ": the rows tensor holds " + std::to_string(rows.nbytes()) + " bytes, " +
            std::to_string(count) + " rows of " + std::to_string(row_width) + " elements of " +
            std::to_string(element_size) + " bytes need " + std::to_string(want));
}

PyObject* error_type = nullptr;
PyObject* row_index_error_type = nullptr;

} // namespace
} // namespace bam::python

NB_MODULE(_core, m) {
  using namespace bam::python;
  m.doc() = "bam's extension module: device strings, host transfers, and the GPU page cache";

  error_type = PyErr_NewExceptionWithDoc("bam.Error", "A failure in bam, as one line of bam's text.",
                                         PyExc_RuntimeError, nullptr);
  nb::object bases = nb::make_tuple(nb::handle(error_type), nb::handle(PyExc_IndexError));
  row_index_error_type = PyErr_NewExceptionWithDoc("bam.RowIndexError", "A row id outside [0, rows) of a bam.Array.",
                                                   bases.ptr(), nullptr);
  m.attr("Error") = nb::handle(error_type);
  m.attr("RowIndexError") = nb::handle(row_index_error_type);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const row_index_error& e) {
      PyErr_SetString(row_index_error_type, e.what());
    } catch (const bam::error& e) {
      PyErr_SetString(error_type, e.what());
    }
  });

  m.def("gpu_compiled", &gpu_compiled, "True when this extension was built with CUDA.");
  m.def("gpu_unavailable_reason", &gpu_unavailable_reason,
        "Empty when a CUDA GPU can be used here; otherwise why not.");
  m.def(
      "parse_device",
      [](const std::string& text) {
        const bam::device_spec s = bam::parse_device(text);
        nb::dict d;
        d["kind"] = s.kind == bam::device_kind::emu_gpu   ? "emu-gpu"
                    : s.kind == bam::device_kind::emu_cpu ? "emu"
                                                          : "pci";
        d["media"] = bam::media_name(s.media);
        d["bytes"] = s.bytes;
        d["path"] = s.path;
        d["ssds"] = s.ssds;
        d["lba_size"] = s.lba_size;
        d["read_only"] = s.read_only;
        return d;
      },
      "text"_a, "Parse a device string without opening anything.");

  // Behind bam.Storage (python/src/bam), which checks the arguments first.
  nb::class_<storage_handle>(m, "_Storage")
      .def(nb::init<const std::string&>(), "device_string"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("close", &storage_handle::close, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("closed", &storage_handle::closed)
      .def_prop_ro("device_string", &storage_handle::device_string)
      .def_prop_ro("name", &storage_handle::name)
      .def_prop_ro("transport", &storage_handle::transport)
      .def_prop_ro("gpu_side", &storage_handle::gpu_side)
      .def_prop_ro("controller_count", &storage_handle::controller_count)
      .def_prop_ro("lba_size", &storage_handle::lba_size)
      .def_prop_ro("blocks", &storage_handle::blocks)
      .def_prop_ro("bytes", &storage_handle::bytes)
      .def(
          "_load_file",
          [](storage_handle& s, const std::string& path, std::uint64_t offset, bool resume,
             std::optional<nb::callable> progress, const std::string& state_path) {
            python_transfer t(std::move(progress));
            return as_dict(
                t.run([&](const transfer_control& ctl) { return s.load_file(path, offset, resume, state_path, ctl); }));
          },
          "path"_a, "offset"_a, "resume"_a, "progress"_a.none(), "state_path"_a = "")
      .def(
          "_load_bytes",
          [](storage_handle& s, host_bytes data, std::uint64_t offset, std::optional<nb::callable> progress) {
            python_transfer t(std::move(progress));
            return as_dict(t.run([&](const transfer_control& ctl) {
              const auto* base = data.data();
              bam::data_source src;
              src.size = data.shape(0);
              src.identity = "memory";
              src.read = [base](std::uint64_t off, void* dst, std::size_t len) { std::memcpy(dst, base + off, len); };
              const std::string state = memory_load_state_path();
              try {
                return s.load(src, offset, state, false, ctl);
              } catch (...) {
                std::error_code ignored;
                std::filesystem::remove(state, ignored);
                throw;
              }
            }));
          },
          "data"_a, "offset"_a, "progress"_a.none())
      .def(
          "_check_read",
          [](storage_handle& s, std::uint64_t offset, std::uint64_t nbytes) { s.check_read(offset, nbytes); },
          "offset"_a, "nbytes"_a,
          nb::call_guard<nb::gil_scoped_release>()) // waits for a transfer, whose progress takes the GIL
      .def(
          "_read",
          [](storage_handle& s, std::uint64_t offset, host_buffer out) {
            nb::gil_scoped_release nogil;
            s.read(offset, out.data(), out.shape(0));
          },
          "offset"_a, "out"_a)
      .def(
          "_dump",
          [](storage_handle& s, const std::string& path, std::uint64_t offset, std::uint64_t nbytes,
             std::optional<nb::callable> progress) {
            python_transfer t(std::move(progress));
            return as_dict(t.run([&](const transfer_control& ctl) { return s.dump(path, offset, nbytes, ctl); }));
          },
          "path"_a, "offset"_a, "nbytes"_a, "progress"_a.none())
      .def("__repr__", [](const storage_handle& s) {
        if (s.closed()) return "bam.Storage('" + s.device_string() + "', closed)";
        return "bam.Storage('" + s.device_string() + "', " + std::to_string(s.controller_count()) +
               " controller(s) of " + std::to_string(s.blocks()) + " blocks of " + std::to_string(s.lba_size()) + " B)";
      });

  nb::class_<gpu_cache>(m, "_PageCache")
      .def(nb::init<std::size_t, std::size_t, std::uint32_t, const std::string&, int, int, std::uint64_t>(),
           "page_size"_a, "capacity"_a, "ways"_a, "group_name"_a = "", "group_rank"_a = 0, "group_size"_a = 0,
           "group_timeout_ms"_a = 120000, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("page_size", &gpu_cache::page_size)
      .def_prop_ro("slot_count", &gpu_cache::slot_count)
      .def(
          "counters",
          [](const gpu_cache& c, std::uintptr_t stream) {
            cache_counters k;
            {
              nb::gil_scoped_release nogil;
              k = c.counters(stream);
            }
            return nb::make_tuple(k.misses, k.writebacks);
          },
          "stream"_a)
      .def("flush", &gpu_cache::flush, "stream"_a, nb::call_guard<nb::gil_scoped_release>());

  nb::class_<gpu_array>(m, "_Array")
      .def(
          "__init__",
          [](gpu_array* self, gpu_cache& cache, storage_handle& s, std::uint64_t elements, std::uint32_t element_size,
             std::uint64_t start_lba, std::uintptr_t stream) {
            nb::gil_scoped_release nogil;
            require_gpu();
            new (self) gpu_array(cache, s.gpu(), elements, element_size, start_lba, stream);
          },
          "cache"_a, "storage"_a, "elements"_a, "element_size"_a, "start_lba"_a, "stream"_a)
      .def_prop_ro("size", &gpu_array::size)
      .def(
          "gather",
          [](gpu_array& a, cuda_ids ids, cuda_tensor out, std::uint64_t row_width, std::uint32_t element_size,
             std::uintptr_t stream) {
            check_same_device(ids, out, "bam.Array gather");
            check_rows_bytes(out, ids.shape(0), row_width, element_size, "bam.Array gather");
            nb::gil_scoped_release nogil;
            a.gather(ids.data(), ids.shape(0), row_width, out.data(), stream);
          },
          "ids"_a, "out"_a, "row_width"_a, "element_size"_a, "stream"_a)
      .def(
          "write_rows",
          [](gpu_array& a, cuda_ids ids, cuda_tensor rows, std::uint64_t row_width, std::uint32_t element_size,
             std::uintptr_t stream) {
            check_same_device(ids, rows, "bam.Array write");
            check_rows_bytes(rows, ids.shape(0), row_width, element_size, "bam.Array write");
            nb::gil_scoped_release nogil;
            a.write_rows(ids.data(), ids.shape(0), row_width, rows.data(), stream);
          },
          "ids"_a, "rows"_a, "row_width"_a, "element_size"_a, "stream"_a)
      .def("check", &gpu_array::check, "stream"_a, nb::call_guard<nb::gil_scoped_release>());
}
