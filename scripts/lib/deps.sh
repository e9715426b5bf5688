# SPDX-License-Identifier: MIT
# Shared by scripts/test and scripts/demo: install what bam's build needs on
# Debian/Ubuntu. Sourced, not run. Idempotent; installs only what is missing.

bam_sudo() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# On Debian 12, Catch2 3 is in bookworm-backports and NVIDIA's kernel module
# source in contrib. Enable both by editing the existing apt sources, reusing
# the mirror they already name.
bam_enable_debian_extras() {
  [ -r /etc/os-release ] || return 0
  . /etc/os-release
  [ "${ID:-}" = debian ] || return 0
  local codename=${VERSION_CODENAME:-bookworm} changed=0 f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    if ! grep -q "${codename}-backports" "$f" &&
       grep -qE "^Suites:.*[[:space:]]${codename}([[:space:]]|$)" "$f"; then
      bam_sudo sed -i -E "/^Suites:.*[[:space:]]${codename}([[:space:]]|$)/ s/$/ ${codename}-backports/" "$f"
      changed=1
    fi
    if grep -E '^Components:' "$f" | grep -qv contrib; then
      bam_sudo sed -i -E '/^Components:/ { /contrib/! s/$/ contrib non-free/ }' "$f"
      changed=1
    fi
  done
  if [ -f /etc/apt/sources.list ] && grep -qE "^deb .* ${codename} main" /etc/apt/sources.list &&
     ! grep -q "${codename}-backports" /etc/apt/sources.list; then
    local line
    line=$(grep -m1 -E "^deb .* ${codename} main" /etc/apt/sources.list)
    line=${line%% ${codename} main*}
    echo "${line} ${codename}-backports main contrib non-free" | bam_sudo tee -a /etc/apt/sources.list >/dev/null
    bam_sudo sed -i -E "/^deb .* ${codename} main/ { /contrib/! s/$/ contrib non-free/ }" /etc/apt/sources.list
    changed=1
  fi
  if [ "$changed" = 1 ] || ! ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1; then
    bam_sudo apt-get update -qq
  fi
}

# bam_apt_install PKG... : install the packages that are not installed yet.
bam_apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "bam: installing ${missing[*]}"
  bam_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" ||
    { bam_sudo apt-get update -qq &&
      bam_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; }
}

bam_install_build_deps() {
  command -v apt-get >/dev/null || { echo "bam: not a Debian/Ubuntu system: install cmake, ninja, g++, Catch2 3, libnvme-dev, liburing-dev, libext2fs-dev, CLI11, nlohmann-json, Google Benchmark yourself"; return 0; }
  bam_enable_debian_extras
  # e2fsprogs: the extent-map tests make ext4 file systems on loop devices.
  bam_apt_install cmake ninja-build g++ pkg-config libnvme-dev liburing-dev libcli11-dev \
    nlohmann-json3-dev libxxhash-dev libbenchmark-dev clang libclang-rt-dev clang-format e2fsprogs \
    libext2fs-dev comerr-dev
  # Catch2 3: Debian 12 has it in backports only (its main has 2.x).
  if ! dpkg-query -W -f='${Version}' catch2 2>/dev/null | grep -q '^3'; then
    . /etc/os-release
    if [ "${ID:-}" = debian ]; then
      bam_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t "${VERSION_CODENAME}-backports" catch2
    else
      bam_apt_install catch2
    fi
  fi
}

# A current CMake from PyPI's `cmake` wheel (unpacked, not installed) for the
# package test next to the distribution's CMake. Prints the cmake path;
# prints nothing (and returns 1) when PyPI cannot be reached.
bam_current_cmake() {
  local dir=${BAM_CACHE_DIR:-$PWD/.cache}/cmake-wheel
  if [ ! -x "$dir/cmake/data/bin/cmake" ]; then
    python3 -m pip --version >/dev/null 2>&1 || bam_apt_install python3-pip >&2
    rm -rf "$dir" && mkdir -p "$dir"
    python3 -m pip download -q --no-deps --only-binary=:all: --dest "$dir" cmake >&2 || return 1
    python3 -c 'import sys, zipfile, glob; zipfile.ZipFile(glob.glob(sys.argv[1] + "/cmake-*.whl")[0]).extractall(sys.argv[1])' "$dir" >&2 || return 1
    chmod +x "$dir"/cmake/data/bin/*
  fi
  echo "$dir/cmake/data/bin/cmake"
}

# Where nvcc is, if anywhere.
bam_find_nvcc() {
  if command -v nvcc >/dev/null; then command -v nvcc; return; fi
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    [ -x "$d/nvcc" ] && { echo "$d/nvcc"; return; }
  done
}

# True if a CUDA GPU is usable here.
bam_have_gpu() {
  command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}
