#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs bam from BUILD_DIR into a temporary prefix, then configures, builds
# and runs the consumer project with find_package(bam).
set -euo pipefail
build=$1 src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
quiet() { "$@" >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }; }
quiet cmake --install "$build" --prefix "$work/prefix"
quiet cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix"
quiet cmake --build "$work/build"
"$work/build/consumer"
