#!/usr/bin/env bash
# ompi_bundle_check.sh [CPLANC]: proves that the Open MPI bundle of ompi_bundle.sh works on a
# machine without Open MPI.  A manual check, not in ctest: it needs root and `unshare -m`
# (a mount namespace), and exits 77 with "SKIPPED: ..." where it has neither.
# It builds gpt_small for one CPU device and for 2 (dp = 2, as tests/e2e/dp.sh), makes a bundle
# with the dp program's libraries in it, moves it (it must be relocatable), and then, in a mount
# namespace where the system's Open MPI, PMIx, hwloc, libevent, libudev, libmunge and every other
# library the bundle holds are hidden (bind mounts of /dev/null and empty tmpfs; ssh/rsh too, as
# a GPU image may lack them), sources env.sh and runs `mpirun -np 2 hostname`, the single-device
# program (MPI singleton) and the dp program under mpirun -np 2: once with this machine's network
# and once in a network namespace with loopback only (and an empty /etc/hosts).  The dp runs must
# train like the single-device one (tests/e2e/e2e_lib.sh's e2e_close: losses 2e-4 relative,
# params 1e-4).
# Prints "ompi_bundle_check.sh: ok" or "FAILED: ...".  CPLAN_KEEP=1 keeps the temp dir.
set -u
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
skip() { echo "ompi_bundle_check.sh: SKIPPED: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (for unshare -m and bind mounts)"
command -v unshare >/dev/null || skip "no unshare (util-linux)"
unshare -m true 2>/dev/null || skip "unshare -m is not permitted here (no CAP_SYS_ADMIN?)"
cplanc=${1:-$src/build/cplanc}
[ -x "$cplanc" ] || { echo "usage: ompi_bundle_check.sh [CPLANC] (no $cplanc)"; exit 2; }
# e2e_init, e2e_tokens, e2e_build, e2e_close, fail (read only; this also cds into a temp dir)
# shellcheck source-path=SCRIPTDIR source=../e2e/e2e_lib.sh
. "$src/tests/e2e/e2e_lib.sh"
e2e_init "$cplanc" "$src"
e2e_tokens tokens.bin
{ cat "$src/tests/e2e/gpt_small.cplan"; printf '\nmesh laptop {\n  shape  = [cpu = 1]\n  device = cpu\n}\n'; } >gs.cplan
e2e_build gs-1 gs.cplan
e2e_build gs-dp2 gs.cplan --set train.mesh=laptop --set mesh.laptop.shape.cpu=2 \
  --set train.strategy.dp=2

# the bundle alone (its size: what the GPU machine gets), then one with the program's libraries
"$here/ompi_bundle.sh" "$tmp/mpi" >bundle.log 2>&1 || { cat bundle.log; fail "ompi_bundle.sh"; }
cat bundle.log
"$here/ompi_bundle.sh" "$tmp/built" ./gs-dp2 >bundle2.log 2>&1 || { cat bundle2.log; fail "ompi_bundle.sh with a program"; }
mv "$tmp/built" "$tmp/moved" # relocated: nothing may point to where it was made
b=$tmp/moved/ompi
echo "bundle with gs-dp2's libraries: $(du -sh "$b" | cut -f1); lib/: $(cd "$b/lib" && echo *.so*)"

cat >inner.sh <<'EOF'
# runs inside the namespace: hide, prove hidden, then use the bundle.  $1: label, $2: bundle
set -u
label=$1 b=$2
mount --make-rprivate / 2>/dev/null
# loopback: no network but lo, and a hostname /etc/hosts does not know
if [ "$label" = loopback ]; then ip link set lo up && mount --bind /dev/null /etc/hosts || exit 1; fi
hide() { # hide FILE-or-DIR
  local r
  r=$(readlink -f "$1") || return 0
  [ -e "$r" ] || return 0
  if [ -d "$r" ]; then mount -t tmpfs none "$r"; else mount --bind /dev/null "$r"; fi || { echo "cannot hide $r"; exit 1; }
}
ml=/usr/lib/x86_64-linux-gnu
for d in $ml/openmpi $ml/pmix2 $ml/hwloc /usr/share/openmpi /etc/openmpi; do hide "$d"; done
for f in mpirun mpiexec orterun orted ompi_info ssh rsh; do
  p=$(command -v $f) && hide "$p"
done
for f in "$b"/lib/*.so*; do
  n=$(basename "$f")
  for d in $ml /lib/x86_64-linux-gnu /usr/lib /lib; do [ -e "$d/$n" ] && hide "$d/$n"; done
done
# hidden?  The system's mpirun and the programs' libraries must not work any more
if mpirun --version >/dev/null 2>&1; then echo "the system mpirun still runs"; exit 1; fi
for f in $ml/libmpi.so.40 $ml/libopen-pal.so.40 $ml/libpmix.so.2 $ml/libhwloc.so.15; do
  [ -e "$f" ] && [ -s "$f" ] && { echo "$f is not hidden"; exit 1; }
done
[ -z "$(ls -A $ml/openmpi)" ] || { echo "$ml/openmpi is not hidden"; exit 1; }
echo "[$label] hidden: the system's mpirun/orterun/orted/ompi_info/ssh, $ml/openmpi, pmix2, hwloc, /usr/share/openmpi, /etc/openmpi, $(ls "$b"/lib/*.so* | wc -l) libraries (libmpi.so.40 now $(stat -L -c %s $ml/libmpi.so.40) bytes)"
if ./gs-1 --steps 1 >/dev/null 2>sys.err; then echo "gs-1 still loads without the bundle"; exit 1; fi
echo "[$label] without the bundle: $(grep -m1 -o 'error while loading shared libraries.*' sys.err)"
. "$b/env.sh" || exit 1
echo "[$label] mpirun: $(command -v mpirun), $(mpirun --version | head -1)"
timeout 60 mpirun -np 2 --oversubscribe hostname >host.out 2>host.err || { cat host.err; echo "mpirun hostname failed"; exit 1; }
echo "[$label] mpirun -np 2 --oversubscribe hostname: $(tr '\n' ' ' <host.out)"
[ "$(wc -l <host.out)" = 2 ] || { echo "expected 2 lines"; exit 1; }
[ -s host.err ] && { echo "stderr of mpirun hostname:"; cat host.err; }
timeout 120 ./gs-1 --save "gs-1-$label.st" --metrics "gs-1-$label.jsonl" 2>"gs-1-$label.err" ||
  { cat "gs-1-$label.err"; echo "gs-1 (singleton) failed"; exit 1; }
timeout 120 mpirun -np 2 --oversubscribe ./gs-dp2 --save "dp2-$label.st" --metrics "dp2-$label.jsonl" 2>"dp2-$label.err" ||
  { cat "dp2-$label.err"; echo "mpirun -np 2 ./gs-dp2 failed"; exit 1; }
grep -q 'data parallel: 2 ranks' "dp2-$label.err" || { cat "dp2-$label.err"; echo "no 'data parallel: 2 ranks'"; exit 1; }
echo "[$label] mpirun -np 2 --oversubscribe ./gs-dp2: $(grep -m1 -o 'data parallel: 2 ranks[^;]*' "dp2-$label.err"); $(grep -o 'step 6/6.*' "dp2-$label.err" | tail -1)"
EOF
unshare -m bash inner.sh host "$b" || fail "in the mount namespace (host network)"
e2e_close host gs-1-host.jsonl dp2-host.jsonl gs-1-host.st dp2-host.st
echo "[host] the 2 ranks trained like one device (6 losses/grad norms within 2e-4, params 1e-4)"
unshare -m -n bash inner.sh loopback "$b" || fail "in the mount + network namespace (loopback only)"
e2e_close loopback gs-1-host.jsonl dp2-loopback.jsonl gs-1-host.st dp2-loopback.st
echo "[loopback] the 2 ranks trained like one device"
echo "ompi_bundle_check.sh: ok"
