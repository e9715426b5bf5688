#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The package test: bam used by a project outside its tree, as users do.
#   run.sh BUILD_DIR          install BUILD_DIR into a temporary prefix first
#   run.sh --installed PREFIX bam as installed there (e.g. /usr by the Debian packages)
# For each CMake in BAM_PACKAGE_TEST_CMAKES (colon-separated; default: the
# cmake on PATH) and each way of using bam (find_package on an installed copy,
# add_subdirectory of the source tree), configure, build and run the consumer:
# a .cu and a .cpp file in one target where nvcc exists (BAM_PACKAGE_TEST_NVCC
# or PATH; for BAM_PACKAGE_TEST_CUDA_ARCHS, comma-separated, default 90), else the .cpp file
# alone. Then the same consumer through pkg-config.
set -euo pipefail
installed=""
if [ "$1" = --installed ]; then installed=$2; else build=$1; fi
src=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$src/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
quiet() { "$@" >"$work/log" 2>&1 || { cat "$work/log"; echo "package test: FAILED: $*"; exit 1; }; }

IFS=: read -r -a cmakes <<<"${BAM_PACKAGE_TEST_CMAKES:-cmake}"
nvcc=${BAM_PACKAGE_TEST_NVCC:-$(command -v nvcc || true)}
cuda_args=(-DBAM_CONSUMER_CUDA=OFF)
if [ -n "$nvcc" ]; then
  cuda_args=(-DBAM_CONSUMER_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc"
    -DCMAKE_CUDA_ARCHITECTURES="$(tr , ';' <<<"${BAM_PACKAGE_TEST_CUDA_ARCHS:-90}")")
fi

prefix=$work/prefix
if [ -n "$installed" ]; then prefix=$installed; else quiet cmake --install "$build" --prefix "$prefix"; fi
n=0
for cm in "${cmakes[@]}"; do
  ver=$("$cm" --version | head -n 1 | awk '{print $3}')
  modes=(find_package add_subdirectory)
  [ -n "$installed" ] && modes=(find_package) # the source tree is not what is installed
  for mode in "${modes[@]}"; do
    b=$work/build-$n
    n=$((n + 1))
    quiet "$cm" -S "$src" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBAM_CONSUMER_MODE=$mode \
      -DCMAKE_PREFIX_PATH="$prefix" -DBAM_SOURCE_DIR="$root" "${cuda_args[@]}"
    quiet "$cm" --build "$b"
    out=$("$b/consumer")
    echo "package test: CMake $ver, $mode, $([ -n "$nvcc" ] && echo ".cu + .cpp" || echo ".cpp only"): $out" | tr '\n' ' '
    echo
  done
done

# pkg-config: the installed bam.pc gives everything a compiler needs.
pc=$(find "$prefix/lib" -name bam.pc | head -n 1)
[ -n "$pc" ] || { echo "package test: FAILED: no bam.pc installed"; exit 1; }
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs bam)
quiet g++ "$src/consumer.cpp" $flags -o "$work/consumer-pc"
echo "package test: pkg-config ($flags): $("$work/consumer-pc")"
