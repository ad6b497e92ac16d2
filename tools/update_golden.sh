#!/usr/bin/env bash
# Re-blesses every golden expectation after a deliberate change: review the diff!
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
for f in tests/golden/*.cplan examples/*.cplan; do
  UPDATE=1 tests/golden/run_one.sh "$BUILD_DIR/cplanc" "$f"
done
git --no-pager diff --stat -- tests/golden || true
