#!/usr/bin/env bash
# link.sh PROG: the CUDA-linked test program (test_link.c) links against cudart, NVRTC, cuBLASLt
# and NCCL (ldd shows each), and runs: with no GPU, exit 1 and "no CUDA device found" (the
# contract of every CUDA program, never a crash); with one, exit 0 after its smoke test.
set -u
prog=$1
fail=0
libs=$(ldd "$prog")
for lib in libcudart libnvrtc libcublasLt libnccl; do
  if grep -q "$lib" <<<"$libs"; then echo "ok: $prog links $lib"; else echo "FAILED: $prog does not link $lib"; fail=1; fi
done
out=$("$prog" 2>&1); rc=$?
echo "$out"
if [ $rc -eq 1 ] && grep -q "no CUDA device found" <<<"$out"; then
  echo "ok: no GPU here: exit 1 with 'no CUDA device found'"
elif [ $rc -eq 0 ] && grep -q "^smoke ok" <<<"$out"; then
  echo "ok: a GPU is present and the smoke test passed"
else
  echo "FAILED: exit status $rc (want 1 with 'no CUDA device found', or 0 with a GPU)"; fail=1
fi
exit $fail
