#!/usr/bin/env bash
# prepare.sh CPLANC BUILD_DIR OUT: everything issue 6's GPU checks need, built HERE (the lent GPU
# machines cannot build cplan: no bison, cJSON or LLVM there) into OUT, with OUT/run_all.sh to run
# THERE in one call (one H200: a few minutes; device time is short, so it is one script):
#   0. test_emu.cu built by nvcc: the CUDA-on-CPU emulator's selftest on the GPU (the semantics the
#      emulator copies, mma16816's fragment layout among them);
#   1. test_gpu_kernels (BUILD_DIR/tests, nvcc-built): every kernels/cuda kernel against its CPU
#      reference in f32, bf16 and f16 (tests/gpu/test_kernels.c's tolerances), again with the WMMA
#      attention (CPLAN_ATTENTION=wmma); then test_gpu_gemm:
#      runtime/cuda_rt.c's cuBLASLt GEMMs, every epilogue, against a double reference, and which
#      epilogues the GPU's cuBLASLt refused; and bench/attention_gpu.c: the attention kernels timed
#      at GPT-2's shape, each implementation (mma, wmma, simt);
#   2. bench/gpu_gpt2.sh: GPT-2 124M in bf16 (step ms, tokens/s, MFU against 989 TFLOP/s, the
#      per-node-class profile);
#   3. tests/gpu/gpt_gpu.sh --check: the small GPT and LLaMA, 20 steps on the GPU against the CPU
#      backend in f32, bf16 and f16, and dp 2, tp 2, ZeRO 3 and pp 2 (two ranks; on one GPU through MPI)
#      with a bundled Open MPI (tests/gpu/ompi_bundle.sh).
# The 20 small-model programs each embed the kernels' fatbins (~10 MB), so the tree (~270 MB) goes
# as OUT/gpu.tar.xz (~8 MB: xz finds the repeats) with OUT/run.sh, which unpacks it there (Python's
# lzma: no xz binary needed) and runs run_all.sh. A device call carries 64 MiB at most: use
#   run(command = "OUT/run.sh", carry = [OUT])   with OUT an ignored build-* directory of the
# repository (it travels only when carried).
set -eu
cplanc=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
build=$(cd "$2" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
out=$3
[ -x "$build/tests/test_gpu_kernels" ] || { echo "prepare.sh: no $build/tests/test_gpu_kernels (a CUDA build)"; exit 1; }
rm -rf "$out" && mkdir -p "$out"
final=$(cd "$out" && pwd)
out=$(mktemp -d "${TMPDIR:-/tmp}/cplan-gpu-prepare-XXXXXX")
trap 'rm -rf "$out"' EXIT
cp "$build/tests/test_gpu_kernels" "$out/"
[ -x "$build/tests/test_gpu_gemm" ] && cp "$build/tests/test_gpu_gemm" "$out/"
[ -x "$build/tests/attention_gpu" ] && cp "$build/tests/attention_gpu" "$out/"
# the emulator's selftest as plain CUDA (tests/cuda/emu/test_emu.cu): on the GPU it checks the
# semantics the emulator copies, mma16816's fragment layout among them
"${NVCC:-/usr/local/cuda/bin/nvcc}" -std=c++17 -arch=sm_90 -I"$src/kernels/cuda" -o "$out/test_emu_gpu" \
  "$src/tests/cuda/emu/test_emu.cu" || { echo "prepare.sh: nvcc test_emu.cu failed"; exit 1; }
"$src/tests/gpu/gpt_gpu.sh" --prepare "$out/gpt" "$cplanc" "$src" >"$out/prepare_gpt.log" 2>&1 ||
  { cat "$out/prepare_gpt.log"; exit 1; }
"$src/bench/gpu_gpt2.sh" "$cplanc" "$out/gpt2" >"$out/prepare_gpt2.log" 2>&1 || { cat "$out/prepare_gpt2.log"; exit 1; }
# the CUDA programs' kernels.cu compiled here by NVRTC for the H200 (sm_90) into a cache the GPU
# session uses (CPLAN_NVRTC_CACHE): device time is not spent compiling (about 5 s per program). A
# GPU whose NVRTC version or architecture differs finds no entry and compiles as usual.
n=0
for prog in "$out"/gpt/*-gpu-* "$out"/gpt2/gpt2gpu_*; do
  [ -x "$prog" ] && grep -q CPLAN_NVRTC_PREWARM "$prog" || continue
  (cd "$(dirname "$prog")" && CPLAN_NVRTC_PREWARM=${CPLAN_PREWARM_CC:-90} CPLAN_NVRTC_CACHE="$out/nvrtc" "./$(basename "$prog")") \
    >>"$out/prepare_nvrtc.log" 2>&1 || { tail -5 "$out/prepare_nvrtc.log"; echo "prepare.sh: NVRTC prewarm of $prog failed"; exit 1; }
  n=$((n + 1))
done
echo "prepare.sh: kernels.cu of $n programs compiled for sm_${CPLAN_PREWARM_CC:-90}: $(ls "$out/nvrtc" 2>/dev/null | wc -l) cubins"
# one copy of the shared libraries: gpt2's are gpt's
for l in "$out"/gpt2/lib/*; do [ -e "$out/gpt/lib/$(basename "$l")" ] && rm -f "$l"; done
find "$out" -type f -perm -u+x -exec sh -c 'file -b "$1" | grep -q "^ELF.*executable\|^ELF.*pie" && strip "$1"' _ {} \; 2>/dev/null || true
cat >"$out/run_all.sh" <<'RUN'
#!/usr/bin/env bash
# run_all.sh: issue 6's GPU checks, prepared by tests/gpu/prepare.sh; prints a summary, exit 1 if any failed.
set -o pipefail # a failing test_gpu_kernels fails its stage, not its `tail`
cd "$(dirname "$0")" || exit 1
here=$PWD
export LD_LIBRARY_PATH=$here/gpt/lib:$here/gpt2/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export CPLAN_NVRTC_CACHE=$here/nvrtc # kernels.cu compiled by prepare.sh for sm_90
nvidia-smi -L || { echo "run_all.sh: no GPU visible: nothing ran"; exit 1; }
fail=0
t0=$(date +%s)
# a device call runs 600 s at most: the timeouts add up to less, and the GPT-2 figure comes before the
# longest part
echo "==== 0. the CUDA-on-CPU emulator's selftest, on the GPU (its semantics; mma16816's fragment layout)"
timeout 20 ./test_emu_gpu >emu.txt; rc=$?
grep FAIL emu.txt | head -20; tail -1 emu.txt
[ $rc -eq 0 ] || { echo "FAILED: test_emu_gpu (exit $rc)"; fail=1; }
echo "==== 1. CUDA kernels against the CPU references"
timeout 45 ./test_gpu_kernels >kernels.txt; rc=$?
grep FAIL kernels.txt | head -30; tail -25 kernels.txt
[ $rc -eq 0 ] || { echo "FAILED: test_gpu_kernels (exit $rc)"; fail=1; }
echo "==== 1a. the same with bf16 / f16 attention on the WMMA kernels (CPLAN_ATTENTION=wmma)"
CPLAN_ATTENTION=wmma timeout 25 ./test_gpu_kernels >kernels_wmma.txt; rc=$?
grep FAIL kernels_wmma.txt | head -30; tail -1 kernels_wmma.txt
[ $rc -eq 0 ] || { echo "FAILED: test_gpu_kernels with CPLAN_ATTENTION=wmma (exit $rc)"; fail=1; }
echo "==== 1b. the runtime's cuBLASLt GEMMs, every epilogue (refusals listed: the programs fall back)"
if [ -x ./test_gpu_gemm ]; then timeout 20 ./test_gpu_gemm | tail -14 || { echo "FAILED: test_gpu_gemm"; fail=1; }; fi
echo "==== 1c. attention kernels timed, GPT-2's shape in bf16 (bench/attention_gpu.c: a benchmark, printed)"
if [ -x ./attention_gpu ]; then
  for a in mma wmma simt; do CPLAN_ATTENTION=$a timeout 10 ./attention_gpu 192 1024 64 20 bf16; done
  CPLAN_ATTENTION=mma timeout 10 ./attention_gpu 64 1024 128 20 bf16
  timeout 10 ./attention_gpu 192 1024 64 20 bf16 mask   # BERT's padding mask, the last 1/8 of the keys
fi
echo "==== 2. GPT-2 124M, bf16 (a benchmark: printed)"
OUT=$here timeout 230 ./gpt2/run_gpu.sh 12 || { echo "FAILED: gpu_gpt2"; fail=1; }
echo "==== 3. small GPT / LLaMA on the GPU against the CPU backend (f32, bf16, f16; dp 2, tp 2, ZeRO 3)"
timeout 210 ./gpt/gpt_gpu.sh --check "$here/gpt" || { echo "FAILED: gpt_gpu.sh"; fail=1; }
echo "==== run_all.sh: $(( $(date +%s) - t0 )) s, $([ $fail -eq 0 ] && echo "all passed" || echo "FAILURES above")"
exit $fail
RUN
chmod +x "$out/run_all.sh"
# a dictionary larger than the tree, the files in name order: the programs (~10 MB each, mostly the
# same fatbins) compress to ~8 MB together; xz's default 8 MiB dictionary, smaller than one of them,
# left 55 MB, near the 64 MiB a device call carries (Python's lzma unpacks it in 256 MiB)
XZ_OPT='--lzma2=preset=9,dict=256MiB' tar -C "$out" --sort=name -cJf "$final/gpu.tar.xz" .
cat >"$final/run.sh" <<'RUN'
#!/usr/bin/env bash
# run.sh [DIR]: on the GPU machine: unpacks gpu.tar.xz (beside this script) into DIR (default
# /tmp/cplan-gpu) and runs its run_all.sh (tests/gpu/prepare.sh)
here=$(cd "$(dirname "$0")" && pwd)
dst=${1:-/tmp/cplan-gpu}
rm -rf "$dst" && mkdir -p "$dst" || exit 1
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$here/gpu.tar.xz" "$dst" || exit 1
exec "$dst/run_all.sh"
RUN
chmod +x "$final/run.sh"
echo "prepare.sh: $final: gpu.tar.xz $(du -h "$final/gpu.tar.xz" | cut -f1) (unpacked $(du -sh "$out" | cut -f1)); there: $final/run.sh"
