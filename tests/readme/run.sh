#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The README's shell commands, run as written:
#   - the install (cmake ...): from the source tree, with a temporary build
#     directory for `build` and a temporary prefix for `/opt/bam`; then the
#     installed bam::bam target and `bam --version` are checked;
#   - the bam command's lines (bam ...): with the installed bam first on PATH,
#     in a scratch directory holding a 4 MiB features.bin; a copy.bin they
#     write must equal it.
# Lines that need root, a whole build, the network, the two set-up scripts or
# a node of GPUs with 60 GB to spare (sudo, cpack, pip, scripts/, bam-gnn,
# torchrun: the GPU machines run those) are listed as skipped. Any other line of a
# ```sh block fails the test until this script knows how to run it.
#   tests/readme/run.sh [README]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
readme=${1:-$root/README.md}
work=$(mktemp -d "${TMPDIR:-/tmp}/bam-readme.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/cli"
head -c $((4 << 20)) /dev/urandom >"$work/cli/features.bin"

# Each line of each ```sh block, numbered by its line in the README.
awk '/^```sh[[:space:]]*$/ { inside = 1; next } /^```/ { inside = 0; next } inside && NF { print NR "\t" $0 }' \
  "$readme" >"$work/lines"
[ -s "$work/lines" ] || { echo "readme: no \`\`\`sh blocks in $readme" >&2; exit 1; }

ran=0 skipped=0 failed=0
run_line() { # where line-number command
  local dir=$1 at=$2 cmd=$3 t0=$SECONDS
  if (cd "$dir" && PATH="$work/prefix/bin:$PATH" bash -euo pipefail -c "$cmd") >"$work/log" 2>&1; then
    echo "readme: ran     README:$at  ($((SECONDS - t0)) s)  $cmd"
    ran=$((ran + 1))
  else
    echo "readme: FAILED  README:$at  $cmd" >&2
    sed 's/^/    /' "$work/log" >&2
    failed=$((failed + 1))
  fi
}
while IFS=$'\t' read -r at line; do
  case "$line" in
  scripts/* | *sudo\ * | *cpack* | pip\ * | bam-gnn\ * | torchrun\ *)
    echo "readme: skipped README:$at  $line"
    skipped=$((skipped + 1))
    ;;
  cmake\ *)
    cmd=$(printf '%s' "$line" | sed -E "s#(-B|--build|--install) build( |\$)#\\1 $work/build\\2#g; s#/opt/bam#$work/prefix#g")
    run_line "$root" "$at" "$cmd"
    ;;
  bam\ *)
    run_line "$work/cli" "$at" "$line"
    ;;
  *)
    echo "readme: FAILED  README:$at  no rule to run this line: $line" >&2
    failed=$((failed + 1))
    ;;
  esac
done <"$work/lines"

# What the install promised: the command and the bam::bam target.
if [ -x "$work/prefix/bin/bam" ] && "$work/prefix/bin/bam" --version | grep -q '^bam [0-9]'; then
  targets=$(find "$work/prefix" -name bam-targets.cmake | head -n 1)
  if [ -z "$targets" ] || ! grep -q 'bam::bam' "$targets"; then
    echo "readme: FAILED  the install holds no bam::bam target" >&2
    failed=$((failed + 1))
  fi
elif grep -q 'cmake --install' "$work/lines"; then
  echo "readme: FAILED  the install put no working bin/bam under the prefix" >&2
  failed=$((failed + 1))
fi
if [ -e "$work/cli/copy.bin" ] && ! cmp -s "$work/cli/features.bin" "$work/cli/copy.bin"; then
  echo "readme: FAILED  copy.bin differs from features.bin" >&2
  failed=$((failed + 1))
fi
echo "readme: $ran lines ran, $skipped skipped, $failed failed"
[ "$failed" -eq 0 ]
