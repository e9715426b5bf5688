// SPDX-License-Identifier: MIT
// NumPy's .npy format (version 1.0 and 2.0 headers), enough for a GNN
// dataset: little-endian integer and float arrays in C order. Writing
// streams rows after the header; reading gives the header (dtype, shape,
// where the data starts) so that large arrays are read in place (pread or
// mmap), never loaded whole.
#pragma once

#include <bam/error.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace bam::gnn {

struct npy_header {
  std::string dtype;                //!< NumPy descr: "<f4", "<f2", "<i4", "<i8", "<u4", "<u8"
  std::vector<std::uint64_t> shape; //!< C order
  std::uint64_t data_offset = 0;    //!< bytes from the start of the file to the first element

  std::uint32_t item_bytes() const {
    if (dtype.size() < 3) return 0;
    return static_cast<std::uint32_t>(std::stoul(dtype.substr(2)));
  }
  std::uint64_t elements() const {
    return std::accumulate(shape.begin(), shape.end(), std::uint64_t{1}, std::multiplies<>());
  }
  std::uint64_t data_bytes() const { return elements() * item_bytes(); }
};

namespace detail {

[[noreturn]] inline void npy_fail(const std::string& path, const std::string& why) {
  error_context c;
  c.errnum = EINVAL;
  throw error(path + ": " + why, c);
}

inline bool known_dtype(const std::string& d) {
  for (const char* k : {"<f4", "<f2", "<f8", "<i4", "<i8", "<u4", "<u8", "|u1", "|i1"})
    if (d == k) return true;
  return false;
}

} // namespace detail

//! The header text for `h` (padded so the data starts at a multiple of 64 bytes).
inline std::string npy_header_bytes(const std::string& dtype, const std::vector<std::uint64_t>& shape) {
  std::string dict = "{'descr': '" + dtype + "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i) dict += std::to_string(shape[i]) + (shape.size() == 1 ? "," : i + 1 < shape.size() ? ", " : "");
  dict += "), }";
  // magic (6) + version (2) + length (2) + dict + padding + '\n'
  std::size_t total = 10 + dict.size() + 1;
  const std::size_t pad = (64 - total % 64) % 64;
  dict.append(pad, ' ');
  dict += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  const std::uint16_t len = static_cast<std::uint16_t>(dict.size());
  out += static_cast<char>(len & 0xff);
  out += static_cast<char>(len >> 8);
  return out + dict;
}

//! Writes a whole array to `path` (created or truncated).
inline void npy_write(const std::string& path, const std::string& dtype, const std::vector<std::uint64_t>& shape,
                      const void* data) {
  const std::string h = npy_header_bytes(dtype, shape);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw_errno("creating " + path);
  npy_header hd{dtype, shape, 0};
  const std::uint64_t bytes = hd.data_bytes();
  const bool ok = std::fwrite(h.data(), 1, h.size(), f) == h.size() &&
                  (bytes == 0 || std::fwrite(data, 1, bytes, f) == bytes);
  const int err = errno;
  if (std::fclose(f) != 0 || !ok) throw_errno("writing " + path, ok ? errno : err);
}

//! Parses the header of `path`; refuses Fortran order, big-endian and object arrays.
inline npy_header npy_read_header(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("opening " + path);
  char pre[12];
  const ssize_t got = ::pread(fd, pre, sizeof pre, 0);
  if (got < 10 || std::memcmp(pre, "\x93NUMPY", 6) != 0) {
    ::close(fd);
    detail::npy_fail(path, "not a .npy file");
  }
  const int major = static_cast<unsigned char>(pre[6]);
  std::uint64_t len, start;
  if (major == 1) {
    len = static_cast<unsigned char>(pre[8]) | static_cast<unsigned>(static_cast<unsigned char>(pre[9])) << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (got < 12) {
      ::close(fd);
      detail::npy_fail(path, "truncated .npy header");
    }
    len = 0;
    for (int i = 3; i >= 0; --i) len = len << 8 | static_cast<unsigned char>(pre[8 + i]);
    start = 12;
  } else {
    ::close(fd);
    detail::npy_fail(path, ".npy version " + std::to_string(major) + " is not known");
  }
  std::string dict(len, '\0');
  const ssize_t r = ::pread(fd, dict.data(), len, static_cast<off_t>(start));
  ::close(fd);
  if (r != static_cast<ssize_t>(len)) detail::npy_fail(path, "truncated .npy header");
  auto value_of = [&](const std::string& key) -> std::string {
    const auto k = dict.find("'" + key + "'");
    if (k == std::string::npos) detail::npy_fail(path, "no '" + key + "' in the .npy header");
    auto v = dict.find(':', k) + 1;
    while (v < dict.size() && dict[v] == ' ') ++v;
    return dict.substr(v);
  };
  npy_header h;
  std::string d = value_of("descr");
  if (d.empty() || (d[0] != '\'' && d[0] != '"')) detail::npy_fail(path, "unreadable dtype in the .npy header");
  h.dtype = d.substr(1, d.find(d[0], 1) - 1);
  if (h.dtype.size() == 3 && h.dtype[0] == '=') h.dtype[0] = '<'; // native order on a little-endian machine
  if (!detail::known_dtype(h.dtype))
    detail::npy_fail(path, "dtype '" + h.dtype + "' is not supported (little-endian ints and floats)");
  if (value_of("fortran_order").rfind("False", 0) != 0)
    detail::npy_fail(path, "Fortran-order arrays are not supported: save with np.ascontiguousarray");
  const std::string s = value_of("shape");
  if (s.empty() || s[0] != '(') detail::npy_fail(path, "unreadable shape in the .npy header");
  for (std::size_t i = 1; i < s.size() && s[i] != ')';) {
    if (s[i] >= '0' && s[i] <= '9') {
      std::size_t n = 0;
      h.shape.push_back(std::stoull(s.substr(i), &n));
      i += n;
    } else {
      ++i;
    }
  }
  h.data_offset = start + len;
  return h;
}

//! Reads `count` elements from element `first` of a 1-D or flattened array.
template <class T>
void npy_read(const std::string& path, const npy_header& h, std::uint64_t first, std::uint64_t count, T* out) {
  if (h.item_bytes() != sizeof(T)) detail::npy_fail(path, "element size " + std::to_string(h.item_bytes()) + " read as " + std::to_string(sizeof(T)));
  if (first > h.elements() || count > h.elements() - first) detail::npy_fail(path, "read past the end of the array");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("opening " + path);
  auto* p = reinterpret_cast<char*>(out);
  std::uint64_t left = count * sizeof(T), off = h.data_offset + first * sizeof(T);
  while (left > 0) {
    const ssize_t n = ::pread(fd, p, left, static_cast<off_t>(off));
    if (n <= 0) {
      const int e = n < 0 ? errno : EIO;
      ::close(fd);
      throw_errno("reading " + path + (n == 0 ? " (the file is shorter than its header says)" : ""), e);
    }
    p += n;
    left -= static_cast<std::uint64_t>(n);
    off += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
}

} // namespace bam::gnn
