#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs bam from BUILD_DIR into a temporary prefix, then configures, builds
# and runs the consumer project with find_package(bam).
set -euo pipefail
build=$1 src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/consumer"
