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
#include <string_view>
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
  for (std::size_t i = 0; i < shape.size(); ++i)
    dict += std::to_string(shape[i]) + (shape.size() == 1 ? "," : i + 1 < shape.size() ? ", " : "");
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
  const bool ok =
      std::fwrite(h.data(), 1, h.size(), f) == h.size() && (bytes == 0 || std::fwrite(data, 1, bytes, f) == bytes);
  const int err = errno;
  if (std::fclose(f) != 0 || !ok) throw_errno("writing " + path, ok ? errno : err);
}

//! Bytes of the header of a .npy file from its first 12 bytes (magic,
//! version, header length): the data starts there. Refuses what is not a
//! .npy header.
inline std::uint64_t npy_header_length(std::string_view pre, const std::string& name) {
  if (pre.size() < 10 || pre.substr(0, 6) != std::string_view("\x93NUMPY", 6))
    detail::npy_fail(name, "not a .npy file");
  const auto byte = [&](std::size_t i) { return static_cast<std::uint64_t>(static_cast<unsigned char>(pre[i])); };
  const std::uint64_t major = byte(6);
  if (major == 1) return 10 + (byte(8) | byte(9) << 8);
  if (major != 2 && major != 3) detail::npy_fail(name, ".npy version " + std::to_string(major) + " is not known");
  if (pre.size() < 12) detail::npy_fail(name, "truncated .npy header");
  const std::uint64_t len = byte(8) | byte(9) << 8 | byte(10) << 16 | byte(11) << 24;
  if (len > (64u << 20)) detail::npy_fail(name, "a .npy header of " + std::to_string(len) + " bytes is not plausible");
  return 12 + len;
}

//! Parses a .npy header (`bytes`: the file's first npy_header_length bytes
//! at least); refuses Fortran order, big-endian, object and other arrays
//! bam does not read, and shapes whose size overflows.
inline npy_header npy_parse_header(std::string_view bytes, const std::string& name) {
  const std::uint64_t total = npy_header_length(bytes, name);
  if (bytes.size() < total) detail::npy_fail(name, "truncated .npy header");
  const std::uint64_t start = static_cast<unsigned char>(bytes[6]) == 1 ? 10 : 12;
  const std::string dict(bytes.substr(start, total - start));
  auto value_of = [&](const std::string& key) -> std::string {
    const auto k = dict.find("'" + key + "'");
    const auto colon = k == std::string::npos ? k : dict.find(':', k);
    if (colon == std::string::npos) detail::npy_fail(name, "no '" + key + "' in the .npy header");
    auto v = colon + 1;
    while (v < dict.size() && dict[v] == ' ')
      ++v;
    return dict.substr(v);
  };
  npy_header h;
  const std::string d = value_of("descr");
  const auto close = d.empty() ? std::string::npos : d.find(d[0], 1);
  if (d.empty() || (d[0] != '\'' && d[0] != '"') || close == std::string::npos)
    detail::npy_fail(name, "unreadable dtype in the .npy header");
  h.dtype = d.substr(1, close - 1);
  if (h.dtype.size() == 3 && h.dtype[0] == '=') h.dtype[0] = '<'; // native order on a little-endian machine
  if (!detail::known_dtype(h.dtype))
    detail::npy_fail(name, "dtype '" + h.dtype + "' is not supported (little-endian ints and floats)");
  if (value_of("fortran_order").rfind("False", 0) != 0)
    detail::npy_fail(name, "Fortran-order arrays are not supported: save with np.ascontiguousarray");
  const std::string sh = value_of("shape");
  if (sh.empty() || sh[0] != '(') detail::npy_fail(name, "unreadable shape in the .npy header");
  std::uint64_t elements = 1;
  std::size_t i = 1;
  for (; i < sh.size() && sh[i] != ')'; ++i) {
    if (sh[i] == ' ' || sh[i] == ',') continue;
    if (sh[i] < '0' || sh[i] > '9') detail::npy_fail(name, "unreadable shape in the .npy header");
    std::uint64_t n = 0;
    for (; i < sh.size() && sh[i] >= '0' && sh[i] <= '9'; ++i) {
      if (n > (UINT64_MAX - 9) / 10) detail::npy_fail(name, "a dimension of the shape overflows");
      n = n * 10 + static_cast<std::uint64_t>(sh[i] - '0');
    }
    --i;
    if (n != 0 && elements > (std::uint64_t{1} << 62) / n) detail::npy_fail(name, "the array's size overflows");
    elements *= n;
    h.shape.push_back(n);
  }
  if (i >= sh.size()) detail::npy_fail(name, "unreadable shape in the .npy header");
  if (elements > (std::uint64_t{1} << 62) / h.item_bytes()) detail::npy_fail(name, "the array's size overflows");
  h.data_offset = total;
  return h;
}

//! Parses the header of the .npy file `path`.
inline npy_header npy_read_header(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("opening " + path);
  std::string head(12, '\0');
  const ssize_t got = ::pread(fd, head.data(), head.size(), 0);
  head.resize(got < 0 ? 0 : static_cast<std::size_t>(got));
  std::uint64_t total = 0;
  try {
    total = npy_header_length(head, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  head.resize(total);
  const ssize_t r = ::pread(fd, head.data(), total, 0);
  ::close(fd);
  if (r != static_cast<ssize_t>(total)) detail::npy_fail(path, "truncated .npy header");
  return npy_parse_header(head, path);
}

//! Reads `count` elements from element `first` of a 1-D or flattened array.
template <class T>
void npy_read(const std::string& path, const npy_header& h, std::uint64_t first, std::uint64_t count, T* out) {
  if (h.item_bytes() != sizeof(T))
    detail::npy_fail(path, "element size " + std::to_string(h.item_bytes()) + " read as " + std::to_string(sizeof(T)));
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
