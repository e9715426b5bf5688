// SPDX-License-Identifier: MIT
// KvikIO as the loader of a corpus of files (file_bench): each file of a
// batch opened with kvikio::FileHandle and read whole by KvikIO's thread
// pool straight into GPU memory, the batch's reads in flight together
// (kvikio_files.cpp; without KvikIO in the build, `kvikio_files_setup` says
// so and nothing is read).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bench {

//! Gives KvikIO's pool `threads` threads and sends every read to it.
//! Returns "" when KvikIO can read, else why not.
std::string kvikio_files_setup(unsigned threads);

//! Reads `paths[ids[k]]` (`sizes[k]` bytes) into `gpu + offsets[k]` for
//! every k, all in flight at once, and waits for them. Returns the bytes
//! that did not arrive; `mode` gets how KvikIO read (compat mode or
//! GPUDirect Storage). Throws what KvikIO throws, once every read it
//! started has ended. Each file of the batch holds a descriptor (two with
//! GDS) until the batch ends: raise RLIMIT_NOFILE for large batches.
std::uint64_t kvikio_read_files(const std::vector<std::string>& paths, const std::vector<std::uint64_t>& ids,
                                const std::vector<std::uint64_t>& sizes, void* gpu,
                                const std::vector<std::uint64_t>& offsets, std::string& mode);

} // namespace bench
