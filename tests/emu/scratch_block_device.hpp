// SPDX-License-Identifier: MIT
// The scratch block device of the block-device media tests
// (BAM_TEST_BLOCK_DEVICE; scripts/test makes a loop device for it), held
// with an exclusive lock while a test uses it (the test programs, plain and
// under sanitizers, run in parallel and would overwrite each other's data),
// its first `zeroed` bytes set to zero first, as a fresh device.
#pragma once

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdint>

#include <cstdlib>
#include <string>

struct scratch_block_device {
  std::string path; //!< empty: none configured
  int fd = -1;
  explicit scratch_block_device(std::uint64_t zeroed) {
    const char* dev = std::getenv("BAM_TEST_BLOCK_DEVICE");
    if (dev == nullptr || *dev == '\0') return;
    path = dev;
    fd = ::open(dev, O_RDWR | O_CLOEXEC);
    if (fd < 0) return;
    ::flock(fd, LOCK_EX);
    std::uint64_t range[2] = {0, zeroed};
    if (::ioctl(fd, BLKZEROOUT, range) != 0) {
      static const char zeroes[1 << 16] = {};
      for (std::uint64_t at = 0; at < zeroed; at += sizeof zeroes)
        if (::pwrite(fd, zeroes, sizeof zeroes, static_cast<off_t>(at)) != static_cast<ssize_t>(sizeof zeroes)) break;
      ::fsync(fd);
    }
  }
  ~scratch_block_device() {
    if (fd >= 0) ::close(fd); // releases the lock
  }
  scratch_block_device(const scratch_block_device&) = delete;
  scratch_block_device& operator=(const scratch_block_device&) = delete;
};
