#!/bin/sh
# llvm_ew.sh: GB/s of LLVM-generated fused elementwise kernels (codegen/llvm.c) vs the reference
# kernels (kernels/cpu/ref.c) applied op by op, on 4M-element tensors. Prints figures only.
# Usage: bench/llvm_ew.sh [BUILD_DIR]   (BUILD_DIR holds libcplanfront.a; default: build)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
lib=$build/libcplanfront.a
if [ ! -f "$lib" ]; then
  echo "llvm_ew.sh: $lib not found: build first (cmake --build $build)" >&2
  exit 2
fi
tmp=$(mktemp -d /tmp/cplan_llvm_ew.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
llvm_libdir=$(llvm-config-14 --libdir)
cc -O2 -std=gnu11 -DLLVM_EW_GEN -o "$tmp/gen" "$root/bench/llvm_ew.c" "$lib" \
  -L"$llvm_libdir" -Wl,-rpath,"$llvm_libdir" -lLLVM-14 -lcjson -lm
"$tmp/gen" "$tmp/kernels.o"
cc -O2 -std=gnu11 -I"$root/kernels/cpu" -o "$tmp/run" "$root/bench/llvm_ew.c" \
  "$root/kernels/cpu/ref.c" "$tmp/kernels.o" -lm
"$tmp/run"
