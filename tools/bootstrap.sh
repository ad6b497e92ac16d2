#!/usr/bin/env bash
# bootstrap.sh: installs every Debian package cplan needs (only the missing ones,
# so it is idempotent), then configures and builds. Extra arguments go to cmake.
#   tools/bootstrap.sh                      -> build/
#   BUILD_DIR=build-asan tools/bootstrap.sh -DCPLAN_SANITIZE=ON
set -euo pipefail
cd "$(dirname "$0")/.."

# Checklist: a new dependency goes here, in CMakeLists.txt and in DESIGN's table.
PKGS=(
  build-essential cmake pkg-config git
  flex bison                      # the grammar
  llvm-14-dev clang-14 libclang-rt-14-dev   # CPU codegen; clang + libFuzzer for the fuzz target
  libcjson-dev                    # plans, safetensors headers, metrics, check --json
  libopenmpi-dev openmpi-bin      # CPU ranks and the NCCL bootstrap
  libopenblas-dev                 # CPU GEMM
  coinor-libcbc-dev               # the ILP of the search
  python3 python3-numpy python3-torch   # the PyTorch reference the training tests compare with
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" "$@" >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
echo "bootstrap: built $BUILD_DIR/cplanc"
