// SPDX-License-Identifier: MIT
//! Files of an ext2, ext3 or ext4 file system read without mounting it: the
//! file system in a disk image (a regular file, e.g. one `mkfs.ext4 -d DIR`
//! made with no root) or on a block device, opened read-only with libext2fs
//! (Debian: libext2fs-dev and comerr-dev; the build defines BAM_HAVE_LIBEXT2FS
//! when it found them). `fs_image::map(path)` gives the same `extent_map` as FIEMAP gives for
//! a mounted file (`extent_map::of_file`), in the image's blocks, with the
//! same refusals: data kept inside the inode (inline data), encrypted data,
//! and holes or preallocated blocks unless `allow_holes` (then they read as
//! zeroes). Files mapped by blocks (ext2, ext3) and by extents (ext4) alike.
//!
//! The map's "disk" is the image: its byte offsets count from the start of
//! the image (the file system's start plus `fs_offset` when the file system
//! begins inside it, e.g. in a partition), in blocks of `lba_size`. Loading
//! the image onto a controller's namespace at LBA 0 makes them that
//! namespace's LBAs.
//!
//! @code
//!   bam::fs_image img("disk.img");                 // mkfs.ext4 -d data/ disk.img 1G
//!   bam::extent_map m = img.map("/features.bin");   // path inside the file system
//!   for (const auto& e : m.extents()) ...           // file offset -> image offset, length
//!   bam::file_set set = img.map_files("/train");    // every regular file below /train, by index
//! @endcode
//!
//! The file system may also be read through any reader of bytes, a
//! `bam::fs_medium`: e.g. NVMe read commands on the namespace of an SSD bound
//! to bam's driver, which the kernel cannot mount (`bam::fs_medium_of` in
//! bam/file/mapped_file.hpp). The maps are then in that namespace's LBAs.
#pragma once

#if !defined(BAM_HAVE_LIBEXT2FS)
#error "bam/file/fs_image.hpp needs libext2fs: install libext2fs-dev and configure again (BAM_HAVE_LIBEXT2FS)"
#endif

#include <bam/error.hpp>
#include <bam/file/extent_map.hpp>
#include <bam/file/file_set.hpp>
#include <bam/file/fs_medium.hpp>

#include <ext2fs/ext2fs.h> // declares com_err's error_message inside its extern "C"
#include <linux/fiemap.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace bam {

namespace detail {

//! libext2fs's I/O manager for `fs_medium`s: a channel's name is a key of
//! `fs_media()`, under which `fs_image` put the medium while it opened it.
struct fs_medium_channel {
  std::shared_ptr<const fs_medium> medium;
  std::uint64_t fs_offset = 0;
};

struct fs_medium_registry {
  std::mutex lock;
  std::uint64_t next = 0;
  std::unordered_map<std::string, std::pair<std::shared_ptr<const fs_medium>, std::uint64_t>> open; // + fs offset
};

inline fs_medium_registry& fs_media() {
  static fs_medium_registry r;
  return r;
}

inline io_manager fs_medium_io_manager();

//! What a medium's reader threw last on this thread (libext2fs sees only EIO).
inline thread_local std::string fs_medium_error;

inline errcode_t fs_medium_open(const char* name, int flags, io_channel* channel) {
  if ((flags & IO_FLAG_RW) != 0) return EXT2_ET_RO_FILSYS;
  std::shared_ptr<const fs_medium> medium;
  std::uint64_t offset = 0;
  {
    fs_medium_registry& r = fs_media();
    std::lock_guard g(r.lock);
    const auto it = r.open.find(name);
    if (it == r.open.end()) return EXT2_ET_BAD_DEVICE_NAME;
    std::tie(medium, offset) = it->second;
  }
  auto* ch = new (std::nothrow) struct_io_channel{};
  char* copy = ::strdup(name);
  auto* priv = new (std::nothrow) fs_medium_channel{std::move(medium), offset};
  if (ch == nullptr || copy == nullptr || priv == nullptr) {
    delete ch;
    std::free(copy);
    delete priv;
    return EXT2_ET_NO_MEMORY;
  }
  ch->magic = EXT2_ET_MAGIC_IO_CHANNEL;
  ch->manager = fs_medium_io_manager();
  ch->name = copy;
  ch->block_size = 1024;
  ch->refcount = 1;
  ch->private_data = priv;
  *channel = ch;
  return 0;
}

inline errcode_t fs_medium_close(io_channel ch) {
  if (--ch->refcount > 0) return 0;
  delete static_cast<fs_medium_channel*>(ch->private_data);
  std::free(ch->name);
  delete ch;
  return 0;
}

inline errcode_t fs_medium_set_blksize(io_channel ch, int blksize) {
  ch->block_size = blksize;
  return 0;
}

inline errcode_t fs_medium_read64(io_channel ch, unsigned long long block, int count, void* data) {
  auto& c = *static_cast<fs_medium_channel*>(ch->private_data);
  // A negative count is a number of bytes, a positive one of blocks.
  const std::uint64_t n = count < 0 ? static_cast<std::uint64_t>(-static_cast<long long>(count))
                                    : static_cast<std::uint64_t>(count) * static_cast<std::uint64_t>(ch->block_size);
  const std::uint64_t at = c.fs_offset + block * static_cast<std::uint64_t>(ch->block_size);
  if (at > c.medium->bytes || n > c.medium->bytes - at) {
    std::memset(data, 0, n);
    return EXT2_ET_SHORT_READ;
  }
  try {
    c.medium->read(at, data, n);
  } catch (const std::exception& e) {
    fs_medium_error = e.what();
    std::memset(data, 0, n);
    return EIO;
  } catch (...) { // nothing may unwind through libext2fs's C code
    fs_medium_error = "the medium's reader failed";
    std::memset(data, 0, n);
    return EIO;
  }
  return 0;
}

inline errcode_t fs_medium_read(io_channel ch, unsigned long block, int count, void* data) {
  return fs_medium_read64(ch, block, count, data);
}

inline errcode_t fs_medium_write(io_channel, unsigned long, int, const void*) { return EXT2_ET_RO_FILSYS; }
inline errcode_t fs_medium_write64(io_channel, unsigned long long, int, const void*) { return EXT2_ET_RO_FILSYS; }
inline errcode_t fs_medium_flush(io_channel) { return 0; }

inline io_manager fs_medium_io_manager() {
  static struct_io_manager m = [] {
    struct_io_manager x{};
    x.magic = EXT2_ET_MAGIC_IO_MANAGER;
    x.name = "bam fs_medium";
    x.open = fs_medium_open;
    x.close = fs_medium_close;
    x.set_blksize = fs_medium_set_blksize;
    x.read_blk = fs_medium_read;
    x.write_blk = fs_medium_write;
    x.flush = fs_medium_flush;
    x.read_blk64 = fs_medium_read64;
    x.write_blk64 = fs_medium_write64;
    return x;
  }();
  return &m;
}

} // namespace detail

//! An ext2/3/4 file system opened read-only through libext2fs.
class fs_image {
public:
  //! @param image a disk image file or a block device holding the file system
  //! @param fs_offset bytes from the start of `image` to the file system (a partition's start)
  //! @param lba_size the logical block of the maps' LBAs (the namespace the image goes onto)
  //! @throw bam::error when `image` cannot be opened or holds no ext2/3/4 file system
  explicit fs_image(std::string image, std::uint64_t fs_offset = 0, std::uint32_t lba_size = 512)
      : image_(std::move(image)), offset_(fs_offset), lba_size_(lba_size) {
    struct stat st {};
    if (::stat(image_.c_str(), &st) != 0) throw_errno("opening file system image " + image_);
    image_bytes_ = static_cast<std::uint64_t>(st.st_size);
    if (S_ISBLK(st.st_mode)) image_bytes_ = 0; // a block device: its size is not checked here
    image_dev_ = st.st_dev;
    image_ino_ = st.st_ino;
    const std::string io_options = fs_offset != 0 ? "offset=" + std::to_string(fs_offset) : std::string();
    const errcode_t e = ext2fs_open2(image_.c_str(), io_options.empty() ? nullptr : io_options.c_str(),
                                     EXT2_FLAG_64BITS, 0, 0, unix_io_manager, &fs_);
    if (e != 0) {
      fs_ = nullptr;
      fail("opening " + image_ + (fs_offset != 0 ? " at byte " + std::to_string(fs_offset) : std::string()) +
               " as an ext2/3/4 file system",
           e);
    }
  }
  //! The file system on `medium`, starting `fs_offset` bytes into it; the
  //! maps count in `medium.lba_size` blocks of the medium. `medium.read` (and
  //! what it reads through, e.g. a controller) must stay valid while this
  //! object and its maps' change checks are used.
  //! @throw bam::error when the medium cannot be read or holds no ext2/3/4 file system
  explicit fs_image(fs_medium medium, std::uint64_t fs_offset = 0)
      : image_(medium.name), offset_(fs_offset), lba_size_(medium.lba_size), image_bytes_(medium.bytes),
        medium_(std::make_shared<const fs_medium>(std::move(medium))) {
    detail::fs_medium_registry& r = detail::fs_media();
    std::string key;
    {
      std::lock_guard g(r.lock);
      key = "bam-fs-medium:" + std::to_string(r.next++);
      r.open.emplace(key, std::make_pair(medium_, offset_));
    }
    detail::fs_medium_error.clear();
    const errcode_t e =
        ext2fs_open2(key.c_str(), nullptr, EXT2_FLAG_64BITS, 0, 0, detail::fs_medium_io_manager(), &fs_);
    {
      std::lock_guard g(r.lock);
      r.open.erase(key); // the channel holds the medium now
    }
    if (e != 0) {
      fs_ = nullptr;
      fail("opening " + image_ + (fs_offset != 0 ? " at byte " + std::to_string(fs_offset) : std::string()) +
               " as an ext2/3/4 file system",
           e);
    }
  }
  ~fs_image() {
    if (fs_ != nullptr) ext2fs_close_free(&fs_);
  }
  fs_image(const fs_image&) = delete;
  fs_image& operator=(const fs_image&) = delete;
  fs_image(fs_image&& o) noexcept
      : image_(std::move(o.image_)), offset_(o.offset_), lba_size_(o.lba_size_), image_bytes_(o.image_bytes_),
        image_dev_(o.image_dev_), image_ino_(o.image_ino_), medium_(std::move(o.medium_)),
        fs_(std::exchange(o.fs_, nullptr)) {}

  const std::string& image() const { return image_; }
  //! The file system's block size in bytes.
  std::uint32_t block_size() const { return fs_->blocksize; }

  //! What identifies a file of the image when it is mapped.
  struct file_stamp {
    ext2_ino_t ino = 0;
    std::uint32_t generation = 0;
    std::uint32_t mtime = 0, ctime = 0;
    std::uint64_t size = 0;
    std::uint64_t layout = 0; //!< `extent_map::layout_hash` of its pieces
  };

  //! The extent map of the regular file `path` (absolute, inside the file system).
  //! @throw bam::error (ENOENT) for a path that is not there, (EINVAL) for a
  //! directory or another non-regular file, and every refusal of `extent_map`.
  //! The map remembers the file as it was (inode, generation, size, times,
  //! layout): its `check_unchanged()` opens the image again and fails
  //! (ESTALE) once the file differs, is gone, or the image is another file.
  extent_map map(const std::string& path, const extent_map_options& opts = {}) const {
    file_stamp stamp;
    return map(path, opts, stamp);
  }
  //! `map`, and the file's stamp into `stamp`.
  extent_map map(const std::string& path, const extent_map_options& opts, file_stamp& stamp) const {
    return map_at(path, lookup(path), opts, stamp);
  }

  //! The pieces of the regular file `path` as FIEMAP would report them, and its stamp.
  //! @throw bam::error as `map` does for a path that is not a regular file
  std::vector<raw_extent> layout(const std::string& path, file_stamp& stamp) const {
    return layout_at(path, lookup(path), stamp);
  }

  //! The bytes of the regular file `path` as the file system reads them
  //! (holes and inline data included), in pieces of at most 1 MiB:
  //! `sink(const unsigned char* p, std::size_t n)`.
  //! @throw bam::error as `map` does for a path that is not a regular file, or a failed read.
  template <class Sink>
  void read(const std::string& path, Sink&& sink) const {
    ext2_inode inode{};
    const ext2_ino_t ino = regular_file(path, inode);
    ext2_file_t f = nullptr;
    if (const errcode_t e = ext2fs_file_open2(fs_, ino, &inode, 0, &f); e != 0) fail(where(path) + ": opening it", e);
    std::vector<unsigned char> buf(std::size_t{1} << 20);
    // Never past the file's size (libext2fs hands out a whole inline area).
    for (std::uint64_t left = EXT2_I_SIZE(&inode); left > 0;) {
      unsigned int got = 0;
      if (const errcode_t e = ext2fs_file_read(f, buf.data(), static_cast<unsigned int>(buf.size()), &got); e != 0) {
        ext2fs_file_close(f);
        fail(where(path) + ": reading it", e);
      }
      if (got == 0) break;
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(got, left));
      sink(static_cast<const unsigned char*>(buf.data()), n);
      left -= n;
    }
    ext2fs_file_close(f);
  }

  //! Paths of the regular files below directory `dir` (all depths), sorted.
  //! @throw bam::error (ENOENT) for a missing `dir`, (ENOTDIR) for one that is no directory.
  std::vector<std::string> files(const std::string& dir = "/") const {
    std::vector<std::string> out;
    for (auto& [path, ino] : files_with_inodes(dir))
      out.push_back(std::move(path));
    return out;
  }

  //! The files below `dir` (see `files`) as one `file_set`, in path order.
  //! @throw bam::error as `map` does, naming the file.
  //! The set's `check_unchanged()` opens the image once and checks every
  //! file as `map`'s maps do.
  file_set map_files(const std::string& dir = "/", const extent_map_options& opts = {}) const {
    std::vector<file_set::named_map> maps;
    std::vector<std::pair<std::string, file_stamp>> stamps;
    for (auto& [p, ino] : files_with_inodes(dir)) { // no lookup by name: the walk knows each inode
      file_stamp s;
      extent_map m = map_at(p, ino, opts, s);
      stamps.emplace_back(p, s);
      maps.push_back({std::move(p), std::move(m)});
    }
    file_set set(std::move(maps));
    set.set_change_check(files_check(std::move(stamps)));
    return set;
  }

private:
  std::string where(const std::string& path) const { return image_ + ":" + path; }

  //! `files(dir)` with each file's inode number, sorted by path.
  std::vector<std::pair<std::string, ext2_ino_t>> files_with_inodes(const std::string& dir) const {
    ext2_ino_t ino = 0;
    if (const errcode_t e = ext2fs_namei(fs_, EXT2_ROOT_INO, EXT2_ROOT_INO, dir.c_str(), &ino); e != 0)
      fail(where(dir) + (e == EXT2_ET_FILE_NOT_FOUND ? ": no such directory in the file system" : ": looking it up"), e,
           e == EXT2_ET_FILE_NOT_FOUND ? ENOENT : EIO);
    if (ext2fs_check_directory(fs_, ino) != 0) {
      error_context c;
      c.errnum = ENOTDIR;
      throw error(where(dir) + ": not a directory", c);
    }
    std::vector<std::pair<std::string, ext2_ino_t>> out;
    walk(ino, dir == "/" ? std::string() : (dir.back() == '/' ? dir.substr(0, dir.size() - 1) : dir), out);
    std::sort(out.begin(), out.end());
    return out;
  }

  //! `layout` of the file `path`, inode `ino`.
  std::vector<raw_extent> layout_at(const std::string& path, ext2_ino_t ino, file_stamp& stamp) const {
    ext2_inode inode{};
    read_regular(path, ino, inode);
    const std::uint64_t size = EXT2_I_SIZE(&inode);
    std::vector<raw_extent> raw;
    std::uint32_t common = 0; // flags every piece carries
    if (inode.i_flags & EXT4_ENCRYPT_FL) common |= FIEMAP_EXTENT_DATA_ENCRYPTED;
    if (inode.i_flags & EXT4_INLINE_DATA_FL) {
      // The data lives in the inode itself: one piece FIEMAP reports as inline.
      if (size != 0) raw.push_back({0, 0, align_up(size), FIEMAP_EXTENT_DATA_INLINE | common});
    } else if (inode.i_flags & EXT4_EXTENTS_FL) {
      extents_of(path, ino, inode, common, raw);
    } else {
      blocks_of(path, ino, common, raw);
    }
    stamp = {ino, inode.i_generation, inode.i_mtime, inode.i_ctime, size, extent_map::layout_hash(raw)};
    return raw;
  }

  //! `map` of the file `path`, inode `ino`.
  extent_map map_at(const std::string& path, ext2_ino_t ino, const extent_map_options& opts, file_stamp& stamp) const {
    std::vector<raw_extent> raw = layout_at(path, ino, stamp);
    block_device_info dev;
    dev.disk = image_;
    dev.disk_node = image_;
    dev.partition_start = offset_;
    dev.disk_bytes = image_bytes_;
    dev.lba_size = lba_size_;
    extent_map m = extent_map::from_extents(where(path), std::move(raw), stamp.size, dev, opts);
    const auto check = files_check({{path, stamp}});
    m.set_change_check([check] {
      std::string ignored;
      return check(ignored);
    });
    return m;
  }

  //! A check that `files` are as their stamps say: the image opened again
  //! (and still the same file), each file looked up. It returns what changed
  //! ("" if nothing) and the changed file's path into its argument.
  file_set::change_check files_check(std::vector<std::pair<std::string, file_stamp>> files) const {
    return [image = image_, offset = offset_, lba = lba_size_, dev = image_dev_, ino = image_ino_, medium = medium_,
            files = std::move(files)](std::string& changed) -> std::string {
      changed = image;
      if (!medium) {
        struct stat now {};
        if (::stat(image.c_str(), &now) != 0) return "the image is gone";
        if (now.st_dev != dev || now.st_ino != ino) return "the image is another file now (replaced or renamed over)";
      }
      std::optional<fs_image> again;
      try {
        if (medium)
          again.emplace(fs_medium(*medium), offset);
        else
          again.emplace(image, offset, lba);
      } catch (const std::exception& e) {
        return std::string("the image can no longer be read as a file system (") + e.what() + ")";
      }
      std::vector<std::string> paths;
      paths.reserve(files.size());
      for (const auto& f : files)
        paths.push_back(f.first);
      const std::vector<ext2_ino_t> inos = again->lookup_all(paths);
      for (std::size_t k = 0; k < files.size(); ++k) {
        const auto& [path, then] = files[k];
        changed = again->where(path);
        if (inos[k] == 0) return "it is no longer a regular file there (no such file in the file system)";
        file_stamp s;
        try {
          (void)again->layout_at(path, inos[k], s);
        } catch (const std::exception& e) {
          return std::string("it is no longer a regular file there (") + e.what() + ")";
        }
        if (s.ino != then.ino || s.generation != then.generation) return "it is another file now";
        if (s.size != then.size)
          return "its size went from " + std::to_string(then.size) + " to " + std::to_string(s.size) + " bytes";
        if (s.mtime != then.mtime || s.ctime != then.ctime) return "it was modified";
        if (s.layout != then.layout) return "its blocks moved";
      }
      return {};
    };
  }

  //! The inode number of the regular file `path`, its inode into `inode`.
  ext2_ino_t regular_file(const std::string& path, ext2_inode& inode) const {
    const ext2_ino_t ino = lookup(path);
    read_regular(path, ino, inode);
    return ino;
  }
  //! The inode number of `path` (one lookup by name: it scans each directory on the way).
  ext2_ino_t lookup(const std::string& path) const {
    ext2_ino_t ino = 0;
    if (const errcode_t e = ext2fs_namei(fs_, EXT2_ROOT_INO, EXT2_ROOT_INO, path.c_str(), &ino); e != 0)
      fail(where(path) + (e == EXT2_ET_FILE_NOT_FOUND ? ": no such file in the file system" : ": looking it up"), e,
           e == EXT2_ET_FILE_NOT_FOUND ? ENOENT : EIO);
    return ino;
  }
  //! Inode `ino` (the file `path`) into `inode`; it must be a regular file.
  void read_regular(const std::string& path, ext2_ino_t ino, ext2_inode& inode) const {
    if (const errcode_t e = ext2fs_read_inode(fs_, ino, &inode); e != 0) fail(where(path) + ": reading its inode", e);
    if (!LINUX_S_ISREG(inode.i_mode)) detail::extent_refusal(where(path), "not a regular file", EINVAL);
  }

  //! The inode numbers of `paths` (absolute), 0 for one that is not there.
  //! Each directory is read once, however many of the paths are in it: a
  //! path looked up alone (ext2fs_namei) scans its directory, so a million
  //! files of one directory looked up one by one would take hours.
  std::vector<ext2_ino_t> lookup_all(const std::vector<std::string>& paths) const {
    std::unordered_map<std::string, std::unordered_map<std::string, ext2_ino_t>> dirs;
    std::vector<ext2_ino_t> out;
    out.reserve(paths.size());
    for (const std::string& path : paths) {
      const std::size_t slash = path.rfind('/');
      if (slash == std::string::npos || slash + 1 == path.size()) {
        out.push_back(0);
        continue;
      }
      const std::string parent = slash == 0 ? "/" : path.substr(0, slash);
      auto [it, added] = dirs.try_emplace(parent);
      if (added) {
        ext2_ino_t dir = 0;
        if (ext2fs_namei(fs_, EXT2_ROOT_INO, EXT2_ROOT_INO, parent.c_str(), &dir) == 0 &&
            ext2fs_check_directory(fs_, dir) == 0)
          for (entry& en : entries_of(dir, parent))
            it->second.emplace(std::move(en.name), en.ino);
      }
      const auto found = it->second.find(path.substr(slash + 1));
      out.push_back(found == it->second.end() ? 0 : found->second);
    }
    return out;
  }

  //! An entry of a directory.
  struct entry {
    std::string name;
    ext2_ino_t ino;
    int type; //!< EXT2_FT_*
  };
  //! The entries of directory `ino` (whose path is `path`) but "." and "..".
  std::vector<entry> entries_of(ext2_ino_t ino, const std::string& path) const {
    std::vector<entry> entries;
    auto each = [](ext2_ino_t, int, ext2_dir_entry* d, int, int, char*, void* p) -> int {
      const int len = ext2fs_dirent_name_len(d);
      std::string name(d->name, static_cast<std::size_t>(len));
      if (name != "." && name != "..")
        static_cast<std::vector<entry>*>(p)->push_back({std::move(name), d->inode, ext2fs_dirent_file_type(d)});
      return 0;
    };
    if (const errcode_t e = ext2fs_dir_iterate2(fs_, ino, 0, nullptr, each, &entries); e != 0)
      fail(where(path.empty() ? "/" : path) + ": reading the directory", e);
    return entries;
  }

  //! Regular files below directory `ino` (whose path is `prefix`) into `out`, with their inode numbers.
  void walk(ext2_ino_t ino, const std::string& prefix, std::vector<std::pair<std::string, ext2_ino_t>>& out) const {
    for (const entry& en : entries_of(ino, prefix)) {
      const std::string path = prefix + "/" + en.name;
      int type = en.type;
      if (type == EXT2_FT_UNKNOWN) { // no file types in the directory entries: ask the inode
        ext2_inode inode{};
        if (const errcode_t e = ext2fs_read_inode(fs_, en.ino, &inode); e != 0)
          fail(where(path) + ": reading its inode", e);
        type = LINUX_S_ISDIR(inode.i_mode) ? EXT2_FT_DIR : LINUX_S_ISREG(inode.i_mode) ? EXT2_FT_REG_FILE : -1;
      }
      if (type == EXT2_FT_REG_FILE)
        out.emplace_back(path, en.ino);
      else if (type == EXT2_FT_DIR)
        walk(en.ino, path, out);
    }
  }

  [[noreturn]] static void fail(const std::string& what, errcode_t e, int errnum = EIO) {
    error_context c;
    c.errnum = errnum;
    // com_err names errno and libext2fs codes alike, once libext2fs's table is registered.
    static const bool registered = (::initialize_ext2_error_table(), true);
    (void)registered;
    std::string why = ::error_message(e);
    if (!detail::fs_medium_error.empty()) { // what a medium's reader said, where libext2fs saw only EIO
      why += " (" + detail::fs_medium_error + ")";
      detail::fs_medium_error.clear();
    }
    throw error(what + ": " + why, c);
  }
  std::uint64_t align_up(std::uint64_t n) const { return (n + block_size() - 1) / block_size() * block_size(); }

  //! An extent-mapped file (ext4): its leaves in file order.
  void extents_of(const std::string& path, ext2_ino_t ino, ext2_inode& inode, std::uint32_t common,
                  std::vector<raw_extent>& raw) const {
    ext2_extent_handle_t h = nullptr;
    if (const errcode_t e = ext2fs_extent_open2(fs_, ino, &inode, &h); e != 0)
      fail(where(path) + ": reading its extent tree", e);
    ext2fs_extent x{};
    int op = EXT2_EXTENT_ROOT;
    for (;;) {
      const errcode_t e = ext2fs_extent_get(h, op, &x);
      op = EXT2_EXTENT_NEXT;
      if (e == EXT2_ET_EXTENT_NO_NEXT || e == EXT2_ET_EXTENT_NO_DOWN) break;
      if (e != 0) {
        ext2fs_extent_free(h);
        fail(where(path) + ": reading its extent tree", e);
      }
      if (!(x.e_flags & EXT2_EXTENT_FLAGS_LEAF) || x.e_len == 0) continue;
      std::uint32_t flags = common;
      if (x.e_flags & EXT2_EXTENT_FLAGS_UNINIT) flags |= FIEMAP_EXTENT_UNWRITTEN;
      raw.push_back({x.e_lblk * block_size(), x.e_pblk * block_size(),
                     static_cast<std::uint64_t>(x.e_len) * block_size(), flags});
    }
    ext2fs_extent_free(h);
  }

  //! A block-mapped file (ext2, ext3): its data blocks, runs of consecutive ones merged.
  void blocks_of(const std::string& path, ext2_ino_t ino, std::uint32_t common, std::vector<raw_extent>& raw) const {
    struct walk {
      const fs_image* self;
      std::uint32_t flags;
      std::vector<raw_extent>* out;
    } w{this, common, &raw};
    auto each = [](ext2_filsys, blk64_t* block, e2_blkcnt_t logical, blk64_t, int, void* p) -> int {
      auto& s = *static_cast<walk*>(p);
      if (logical < 0) return 0; // an indirect block: metadata, not the file's data
      const std::uint64_t bs = s.self->block_size();
      const std::uint64_t at = static_cast<std::uint64_t>(logical) * bs, disk = *block * bs;
      if (!s.out->empty()) {
        raw_extent& last = s.out->back();
        if (last.logical + last.length == at && last.physical + last.length == disk) {
          last.length += bs;
          return 0;
        }
      }
      s.out->push_back({at, disk, bs, s.flags});
      return 0;
    };
    if (const errcode_t e =
            ext2fs_block_iterate3(fs_, ino, BLOCK_FLAG_READ_ONLY | BLOCK_FLAG_DATA_ONLY, nullptr, each, &w);
        e != 0)
      fail(where(path) + ": reading its block map", e);
  }

  std::string image_;
  std::uint64_t offset_ = 0;
  std::uint32_t lba_size_ = 512;
  std::uint64_t image_bytes_ = 0;
  dev_t image_dev_ = 0; //!< the image file this object read (its maps' checks compare with it)
  ino_t image_ino_ = 0;
  std::shared_ptr<const fs_medium> medium_; //!< the medium read, when not a file or device of this machine
  ext2_filsys fs_ = nullptr;
};

namespace detail {
template <class>
struct fs_image_type;
//! What `bam::array<T>::open(cache, path, storage)` reads file systems with.
template <>
struct fs_image_type<void> {
  using type = fs_image;
};
} // namespace detail

} // namespace bam
