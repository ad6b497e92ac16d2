# shellcheck shell=bash disable=SC2034  # the variables are for the scripts that source this
# bench_lib.sh: what the CPU training benchmarks (cpu_step.sh, mask_step.sh) share.
#   bench_init NAME CPLANC MODEL  sets $cplanc (absolute) and $tmp (removed at exit), copies
#                                 $here/MODEL into $tmp and cds there; exits 2 without a cplanc
bench_init() {
  local name=$1 model=$3
  cplanc=$2
  [ -x "$cplanc" ] || { echo "$name: no cplanc at $cplanc (build it, or pass its path)"; exit 2; }
  cplanc=$(cd "$(dirname "$cplanc")" && pwd)/$(basename "$cplanc")
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/cplan_bench.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  cp "$here/$model" "$tmp/"
  cd "$tmp" || exit 1
}
