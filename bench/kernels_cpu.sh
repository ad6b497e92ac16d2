#!/bin/sh
# kernels_cpu.sh: per-kernel GB/s of the fast f32 CPU kernels (kernels/cpu/fast_nn.c) vs their
# reference twins, on the sizes of a GPT training step. Prints figures only.
# Usage: bench/kernels_cpu.sh [BUILD_DIR]   (BUILD_DIR holds kernels/libcplankernels.a; default: build)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
lib=$build/kernels/libcplankernels.a
if [ ! -f "$lib" ]; then
  echo "kernels_cpu.sh: $lib not found: build first (cmake --build $build)" >&2
  exit 2
fi
tmp=$(mktemp -d /tmp/cplan_kernels_cpu.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -std=gnu11 -I"$root/kernels/cpu" -o "$tmp/run" "$root/bench/kernels_cpu.c" "$lib" \
  $(pkg-config --libs openblas) -lm
"$tmp/run"
