#!/usr/bin/env bash
# build.sh CPLANC SRCDIR NVCC: `cplanc build` for a mesh of one CUDA device (codegen/emit_cu.c).
# gpt_small and llama_small (tests/e2e) with a one-GPU mesh added, in f32, and in bf16 and f16
# (precision = bf16 / f16: low-precision activations, f32 master weights; f16 with loss scaling):
# each program links against cudart, cuBLASLt and NVRTC; its kernels.cu (--keep-c) compiles with
# nvcc --ptx for sm_90 (and gpt_small's for sm_80) and defines every kernel plan.c launches; the
# low-precision plans really store activations in the low type (kernels/cuda launched with
# CPLAN_BF16 / CPLAN_F16, cuBLASLt GEMMs on bf16 / f16 operands); --help runs without a GPU; and
# run here it exits 1 saying "no CUDA device was found" (with a GPU: it trains 2 steps, exit 0);
# attention reads and writes its heads in place (no permute launches).
# CPLAN_TEST_SANITIZED=1 (the ASan build): cplanc and the programs run sanitized, but kernels.cu is
# not compiled with nvcc (not our code; the plain build's run of this test does).
# Two GPUs build a data-parallel program (NCCL); settings the backend does not take yet (tp, pp,
# zero, sp) are diagnostics at the .cplan file.
set -u
cplanc=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
src=$(cd "$2" && pwd)
nvcc=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/cplan-cuda-build-XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
fail() { echo "FAILED: $*"; exit 1; }
gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi

for i in $(seq 300); do printf '%d+%d=%d; ' "$i" $((i * 7 % 13)) $((i + i * 7 % 13)); done >tokens.txt
"$cplanc" data text tokens.txt -o tokens.bin >/dev/null 2>&1 || fail "cplanc data text"

for mp in gpt_small:f32 llama_small:f32 gpt_small:bf16 gpt_small:f16 llama_small:bf16; do
  m=${mp%:*} p=${mp#*:}
  { cat "$src/tests/e2e/${m%-*}.cplan"; printf '\nmesh gpu1 {\n  shape  = [gpu = 1]\n  device = h100_sxm\n}\n'; } >"$m.cplan"
  [ $p = f32 ] || m=$m-$p
  [ -e "$m.cplan" ] || cp "${m%-*}.cplan" "$m.cplan"
  "$cplanc" build "$m.cplan" -o "$m" --set train.mesh=gpu1 --set train.precision=$p --keep-c "keep-$m" 2>"$m.log" ||
    { cat "$m.log"; fail "cplanc build $m for a CUDA mesh"; }
  grep -q "CUDA, device work arena" "$m.log" || { cat "$m.log"; fail "$m: no 'built ... CUDA' line"; }
  libs=$(ldd "./$m")
  for lib in libcudart libcublasLt libnvrtc; do
    grep -q "$lib" <<<"$libs" || fail "$m does not link $lib"
  done
  archs="sm_90"
  [ "${m%-*}" = gpt_small ] && archs="sm_80 sm_90"
  [ "${CPLAN_TEST_SANITIZED:-0}" = 1 ] && archs=""  # nvcc is not ours: the plain build checks its PTX
  for a in $archs; do
    "$nvcc" --ptx -arch="$a" -std=c++17 "keep-$m/kernels.cu" -o "$m-$a.ptx" 2>"$m-$a.log" ||
      { head -20 "$m-$a.log"; fail "$m: kernels.cu does not compile for $a"; }
  done
  # every kernel plan.c's table names is an entry of the PTX
  grep -o 'kernel_names\[NKERNELS + 1\] = {[^}]*' "keep-$m/plan.c" | sed 's/.*{//' | tr ',' '\n' | tr -d ' "' |
    grep -v '^NULL$' | sort >names.txt
  [ -s names.txt ] || fail "$m: plan.c has no kernel table"
  if [ -n "$archs" ]; then
    grep -o '\.entry [A-Za-z0-9_]*' "$m-sm_90.ptx" | awk '{print $2}' | sort >entries.txt
    missing=$(comm -23 names.txt entries.txt)
    [ -z "$missing" ] || fail "$m: kernels plan.c launches but kernels.cu lacks: $missing"
  fi
  if [ $p != f32 ]; then
    lp=$(tr a-z A-Z <<<"$p")
    n=$(grep -c "kl_check(cplan_cuda_[a-z_]*(CPLAN_$lp," "keep-$m/plan.c")
    [ "$n" -gt 0 ] && ! grep -q "kl_check(cplan_cuda_[a-z_]*(CPLAN_F32," "keep-$m/plan.c" ||
      fail "$m: the kernels/cuda launches are not all CPLAN_$lp"
    code=$([ $p = bf16 ] && echo 1 || echo 2)
    # gemm(..., node, abt, ct, acc): abt is the operands' storage code
    grep -q "^  gemm(.*, $code, [01], [01]);" "keep-$m/plan.c" && ! grep -q "^  gemm(.*, 0, [012], [01]);" "keep-$m/plan.c" ||
      fail "$m: the GEMMs do not all take $p operands"
    grep -q "^#define LP_CODE $code " "keep-$m/plan.c" || fail "$m: no LP_CODE $code"
    if [ $p = f16 ]; then
      grep -q '^#define LOSS_SCALING 1' "keep-$m/plan.c" && grep -q '"loss_scale", "skipped_steps"' "keep-$m/plan.c" ||
        fail "$m: f16 without loss scaling or its metrics"
    fi
  fi
  # attention in place (emit_cu.c's find_attn_inplace): the output merged by the kernel (both models),
  # q, k and v read in GPT-2's fused projection and written into its gradient (gpt_small: no permute
  # launches; llama_small splits q, k and v into heads for rope)
  grep -q "kl_check(cplan_cuda_attention_forward_l(.*, (CplanAttnLayout){[0-9]*, [0-9]*, [0-9]*LL, [1-9][0-9]*}, G.s)" \
    "keep-$m/plan.c" || fail "$m: attention's output is not merged in place"
  if [ "${m%-*}" = gpt_small ]; then
    grep -q "kl_check(cplan_cuda_attention_backward_l(CPLAN_[A-Z0-9]*, (void \\*)((char \\*)" "keep-$m/plan.c" && ! grep -qxE "cps_qkv|cps_heads" names.txt ||
      fail "$m: attention does not read q, k, v in the projection or write their gradients into its gradient"
  fi
  "./$m" --help >/dev/null 2>&1 || fail "$m --help"
  out=$(timeout 120 "./$m" --steps 2 --data tokens.bin 2>&1); rc=$?
  if [ $gpu -eq 0 ]; then
    [ $rc -eq 1 ] && grep -q "no CUDA device was found" <<<"$out" ||
      { echo "$out"; fail "$m: exit status $rc without a GPU (want 1 and 'no CUDA device was found')"; }
  else
    [ $rc -eq 0 ] || { echo "$out"; fail "$m: exit status $rc on a GPU"; }
  fi
  echo "ok: $m ($p): links cudart, cuBLASLt, NVRTC; $(wc -l <names.txt) kernels${archs:+ compile ($archs)}; run: exit $rc"
done

# the memory plan gives no arena space to a value no launch names (a fold computes it elsewhere: the
# bias add's GEMM epilogue, q, k, v read in place, the fused cross_entropy's gradient): gpt_small's bf16
# arena is below the one with a buffer for every value (CPLAN_PRUNE_ARENA=0)
work() { sed -n 's/^#define DEVICE_WORK_BYTES \([0-9]*\)LL.*/\1/p' "$1"; }
CPLAN_PRUNE_ARENA=0 "$cplanc" build gpt_small-bf16.cplan -o unpruned --set train.mesh=gpu1 --set train.precision=bf16 \
  --keep-c keep-unpruned 2>unpruned.log || { cat unpruned.log; fail "CPLAN_PRUNE_ARENA=0 cplanc build gpt_small-bf16"; }
wp=$(work keep-gpt_small-bf16/plan.c) wu=$(work keep-unpruned/plan.c)
[ -n "$wp" ] && [ -n "$wu" ] && [ "$wp" -lt "$wu" ] || fail "gpt_small-bf16: work arena $wp bytes, not below $wu unpruned"
echo "ok: gpt_small-bf16: work arena $wp bytes ($wu with a buffer for every value)"

# two GPUs: one process per GPU, data parallelism (dp defaults to the device count): the program
# links NCCL, its plan sums the gradients on the device (reduce_grads) and says dp 2; run here it
# exits 1 saying no CUDA device was found
"$cplanc" build gpt_small.cplan -o two --set train.mesh=gpu1 --set mesh.gpu1.shape.gpu=2 --keep-c keep-two \
  2>two.log || { cat two.log; fail "cplanc build for two GPUs (dp 2)"; }
grep -q '^    .dp = 2,' keep-two/plan.c && grep -q '^    .devices = 2,' keep-two/plan.c &&
  grep -q '^    .reduce_grads = reduce_grads,' keep-two/plan.c || fail "two GPUs: plan.c is not a dp 2 plan"
ldd ./two | grep -q libnccl || fail "two GPUs: the program does not link NCCL"
if [ $gpu -eq 0 ]; then
  out=$(timeout 60 ./two --steps 2 --data tokens.bin 2>&1); rc=$?
  [ $rc -eq 1 ] && grep -q "no CUDA device was found" <<<"$out" || { echo "$out"; fail "two GPUs: exit $rc without a GPU"; }
fi
echo "ok: two GPUs (dp 2): links NCCL, reduce_grads"

# tensor parallelism on two GPUs: a lowered plan (whole-tensor tables for checkpoints) whose
# collectives run on NCCL (coll_*), the vocab-parallel loss on kernels/cuda
"$cplanc" build gpt_small.cplan -o tp2 --set train.mesh=gpu1 --set mesh.gpu1.shape.gpu=2 --set train.strategy.tp=2 \
  --keep-c keep-tp2 2>tp2.log || { cat tp2.log; fail "cplanc build for two GPUs (tp 2)"; }
grep -q '^    .tp = 2,' keep-tp2/plan.c && grep -q '^    .gparams = gparams,' keep-tp2/plan.c &&
  grep -q 'coll_all_reduce(run, 0' keep-tp2/plan.c && grep -q 'cplan_cuda_vp_ce_forward_part' keep-tp2/plan.c ||
  fail "two GPUs: plan.c is not a tp 2 plan"
echo "ok: two GPUs (tp 2): collectives on NCCL, vocab-parallel cross entropy"

# the example GPT-2 on 8 H100s (strategy = auto): the search's plan builds (its micro-batch keeps the
# logits under the kernels' 2^31 elements; a lowered plan when it picks ZeRO)
# (sanitized: its 47,000-line plan.c takes gcc three minutes with ASan, so only cplanc's part runs)
if [ "${CPLAN_TEST_SANITIZED:-0}" = 1 ]; then
  "$cplanc" emit --stage=c "$src/examples/gpt2.cplan" >gpt2.c 2>gpt2ex.log &&
    "$cplanc" emit --stage=cuda "$src/examples/gpt2.cplan" >gpt2.cu 2>>gpt2ex.log || { cat gpt2ex.log; fail "emit examples/gpt2.cplan"; }
  grep -q '^    .devices = 8,' gpt2.c || fail "examples/gpt2.cplan: not a plan for 8 GPUs"
  echo "ok: examples/gpt2.cplan emits (not compiled: sanitized build)"
else
  "$cplanc" build "$src/examples/gpt2.cplan" -o gpt2ex --keep-c keep-gpt2 2>gpt2ex.log || { cat gpt2ex.log; fail "examples/gpt2.cplan"; }
  grep -q '^    .devices = 8,' keep-gpt2/plan.c || fail "examples/gpt2.cplan: not a plan for 8 GPUs"
  echo "ok: examples/gpt2.cplan builds ($(grep -o 'the search chose [^(]*' gpt2ex.log))"
fi

# `emit --stage=c` and `--stage=cuda` on a CUDA mesh print what build compiled (the search's plan
# included); only the build's hashes differ
same_as_build() { # same_as_build KEEPDIR FILE [--set ...]: plan.c and kernels.cu, or per stage
  local keep=$1 f=$2; shift 2
  "$cplanc" emit --stage=c "$f" "$@" >emit.c 2>/dev/null && "$cplanc" emit --stage=cuda "$f" "$@" >emit.cu 2>/dev/null ||
    fail "emit --stage=c|cuda $f $*"
  local want_c want_cu
  if [ -e "$keep/plan_s0.c" ]; then
    want_c=$(for k in "$keep"/plan_s*.c; do echo "/* ==== $(basename "$k") ==== */"; cat "$k"; done
             echo "/* ==== plan.c ==== */"; cat "$keep/plan.c")
    want_cu=$(for k in "$keep"/kernels_s*.cu; do echo "/* ==== $(basename "$k") ==== */"; cat "$k"; done)
  else
    want_c=$(cat "$keep/plan.c") want_cu=$(cat "$keep/kernels.cu")
  fi
  diff <(grep -v '^    \.\(source\|resume\)_hash = ' <<<"$want_c") <(grep -v '^    \.\(source\|resume\)_hash = ' emit.c) >emit.diff ||
    { head -20 emit.diff; fail "emit --stage=c $f $*: not the plan.c build compiled"; }
  diff <(echo "$want_cu") emit.cu >emit.diff || { head -20 emit.diff; fail "emit --stage=cuda $f $*: not build's kernels.cu"; }
}
[ "${CPLAN_TEST_SANITIZED:-0}" = 1 ] || {
  same_as_build keep-gpt2 "$src/examples/gpt2.cplan"
  echo "ok: examples/gpt2.cplan: emit --stage=c and --stage=cuda print the files build compiled"
}

# pipeline parallelism on two GPUs: one file per stage (plan_s0.c, plan_s1.c) and plan.c's main,
# which checks the device before MPI starts; crossings through host memory (pp_send, pp_recv)
"$cplanc" build gpt_small.cplan -o pp2 --set train.mesh=gpu1 --set mesh.gpu1.shape.gpu=2 --set train.strategy.pp=2 \
  --set train.precision=bf16 --keep-c keep-pp2 2>pp2.log || { cat pp2.log; fail "cplanc build for two GPUs (pp 2)"; }
grep -q '^    .pp = 2,' keep-pp2/plan_s0.c && grep -q '^    .stage = 1,' keep-pp2/plan_s1.c &&
  grep -q '  pp_send(run, 0, ' keep-pp2/plan_s0.c && grep -q '  pp_recv(run, 0, ' keep-pp2/plan_s1.c &&
  grep -q 'cplan_gpu_init_s1(argc, argv);' keep-pp2/plan.c || fail "two GPUs: not a pp 2 program"
if [ $gpu -eq 0 ]; then
  out=$(timeout 60 ./pp2 --steps 2 --data tokens.bin 2>&1); rc=$?
  [ $rc -eq 1 ] && grep -q "no CUDA device was found" <<<"$out" || { echo "$out"; fail "pp 2: exit $rc without a GPU"; }
fi
same_as_build keep-pp2 gpt_small.cplan --set train.mesh=gpu1 --set mesh.gpu1.shape.gpu=2 --set train.strategy.pp=2 \
  --set train.precision=bf16
echo "ok: two GPUs (pp 2): a file per stage, crossings through host memory; emit prints the stage files"

# CPLAN_NVRTC_PREWARM: every stage's kernels.cu compiled by NVRTC for sm_90 into the cache with no
# GPU, exit 0; again: found in the cache
out=$(CPLAN_NVRTC_PREWARM=90 CPLAN_NVRTC_CACHE="$PWD/prewarm" timeout 120 ./pp2 2>&1); rc=$?
[ $rc -eq 0 ] && [ "$(grep -c 'kernels.cu for sm_90: compiled, cached' <<<"$out")" = 2 ] &&
  [ "$(ls prewarm/*-sm_90.cubin | wc -l)" = 2 ] || { echo "$out"; fail "CPLAN_NVRTC_PREWARM=90: exit $rc"; }
out=$(CPLAN_NVRTC_PREWARM=90 CPLAN_NVRTC_CACHE="$PWD/prewarm" timeout 120 ./pp2 2>&1); rc=$?
[ $rc -eq 0 ] && [ "$(grep -c 'kernels.cu for sm_90: already cached' <<<"$out")" = 2 ] ||
  { echo "$out"; fail "CPLAN_NVRTC_PREWARM=90 again: exit $rc, not from the cache"; }
out=$(CPLAN_NVRTC_PREWARM=nine ./pp2 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "CPLAN_NVRTC_PREWARM.*expected compute capabilities" <<<"$out" ||
  { echo "$out"; fail "CPLAN_NVRTC_PREWARM=nine: exit $rc"; }
echo "ok: CPLAN_NVRTC_PREWARM compiles every stage's kernels for sm_90 with no GPU, cached"

# not supported: diagnostics at the file, exit 1, no program
out=$("$cplanc" build gpt_small.cplan -o dp1 --set train.mesh=gpu1 --set mesh.gpu1.shape.gpu=2 \
  --set train.strategy.dp=1 2>&1); rc=$?
# (the words `check` and `plan` give: the build checks the degrees before either backend)
[ $rc -eq 1 ] && grep -q "error: dp\*tp\*pp = 1\*1\*1 = 1 is not the mesh's 2 devices" <<<"$out" ||
  { echo "$out"; fail "dp 1 on two GPUs: exit $rc"; }
[ ! -e dp1 ] || fail "a refused build left a program"
echo "build.sh: ok"
