#!/usr/bin/env bash
# bad_data.sh CPLANC SRCDIR: what a real built program does with bad inputs.  Each case wants
# exit status 1 (2 for bad usage) and a message that names the file and the problem, never a
# crash (a status >= 128 fails):
#   token files: missing, wrong magic, wrong version, truncated, shorter than the header, a token
#                >= the vocab, too small for one batch, a directory; also the plan's own data file
#   --init:      a file without one of the params, a file with a param of another shape, a
#                file that is not safetensors
#   --resume:    no checkpoint in the dir, a checkpoint of another build, a truncated checkpoint
#   FIFOs as --data and --init (refused before they block), --save through a symlink and onto a FIFO
#   a model that diverges on purpose (lr = 1e6): the run stops with a message naming the step
set -u
# shellcheck source=tests/e2e/e2e_lib.sh
. "$(dirname "$0")/e2e_lib.sh"
e2e_init "$1" "$2"
cp "$src/tests/e2e/gpt_small.cplan" .
e2e_tokens tokens.bin
e2e_build gpt gpt_small.cplan
e2e_prog 0 good ./gpt --steps 1 --quiet --threads 1

# patch FILE OFFSET BYTE: overwrites one byte of FILE (the header is little-endian int32s)
patch() { printf "%b" "\\x$3" | dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null; }
# bad_tokens FILE WORD...: ./gpt --data FILE fails with 1, naming FILE and saying every WORD
bad_tokens() {
  local f=$1
  shift
  e2e_prog 1 "data_$f" ./gpt --data "$f" --steps 1 --threads 1
  e2e_says "data_$f" "$f" "$@"
}

cp tokens.bin magic.bin && patch magic.bin 0 01
cp tokens.bin version.bin && patch version.bin 4 07
head -c 2000 tokens.bin >truncated.bin
cp tokens.bin long.bin && printf 'xx' >>long.bin
head -c 100 tokens.bin >header.bin
printf 'hello' >vocab.txt && "$cplanc" data text vocab.txt -o vocab.bin >/dev/null
printf '0123456789' >small.txt && "$cplanc" data text small.txt -o small.bin >/dev/null
mkdir -p adir
bad_tokens missing.bin "cannot open" "No such file"
bad_tokens magic.bin "bad magic" "20240520"
bad_tokens version.bin "unsupported version 7"
bad_tokens truncated.bin "truncated" "3164 tokens"
bad_tokens long.bin "bytes too many"
bad_tokens header.bin "shorter than" "header"
bad_tokens vocab.bin "token 0 is 104" "vocab 64"
bad_tokens small.bin "too small" "10 tokens"
# a directory opens with fopen on Linux; it must still be an error, not a crash
bad_tokens adir "not a regular file"
# integers past int64 or the thread count's limit are usage errors that quote what was typed
e2e_prog 2 flag_huge ./gpt --steps 99999999999999999999
e2e_says flag_huge "--steps: '99999999999999999999' is not an integer"
e2e_prog 2 flag_threads ./gpt --threads 2147483648
e2e_says flag_threads "--threads 2147483648: at most 65536"
# a FIFO is refused before it is opened (opening one waits for a writer)
mkfifo afifo
bad_tokens afifo "not a regular file"
e2e_prog 1 init_fifo ./gpt --init afifo --steps 1
e2e_says init_fifo afifo "not a regular file"
# --save writes through a symlink (its target replaced, the link kept) and never replaces what is not
# a regular file (a FIFO, a directory)
printf 'old' >target.st && ln -s target.st link.st
e2e_prog 0 save_link ./gpt --steps 1 --quiet --threads 1 --save link.st
[ -L link.st ] && [ "$(head -c 3 target.st)" != old ] || fail "save_link: --save replaced the symlink or left its target"
e2e_prog 1 save_fifo ./gpt --steps 1 --quiet --threads 1 --save afifo
e2e_says save_fifo afifo "not a regular file"
[ -p afifo ] || fail "save_fifo: the FIFO was replaced"
# the plan's own file (data = tokens("tokens.bin"), an absolute path after the build)
mv tokens.bin tokens.away
e2e_prog 1 data_plan ./gpt --steps 1
e2e_says data_plan "$tmp/tokens.bin" "cannot open"
mv tokens.away tokens.bin

# --init: params of the same model with one layer (h.1.* missing), or width 16 (shapes differ)
e2e_build gpt_L1 gpt_small.cplan --set train.model.L=1
e2e_build gpt_C16 gpt_small.cplan --set train.model.C=16
e2e_prog 0 save_L1 ./gpt_L1 --steps 0 --save-init L1.safetensors --quiet
e2e_prog 0 save_C16 ./gpt_C16 --steps 0 --save-init C16.safetensors --quiet
e2e_prog 1 init_missing ./gpt --init L1.safetensors --steps 1
e2e_says init_missing L1.safetensors "h.1."
e2e_prog 1 init_shape ./gpt --init C16.safetensors --steps 1
e2e_says init_shape C16.safetensors "wte" "[64, 16]" "[64, 32]"
# a NaN in a param of --init is an error naming the tensor, not a loss that turns NaN at step 1
e2e_prog 0 save_good ./gpt --steps 0 --save-init good.safetensors --quiet
python3 - <<'PY' || fail "cannot write nan.safetensors"
import json, struct
b = bytearray(open("good.safetensors", "rb").read())
n = struct.unpack("<Q", b[:8])[0]
off = json.loads(b[8:8 + n])["wte"]["data_offsets"][0] + 8 + n + 4 * 5
b[off:off + 4] = struct.pack("<f", float("nan"))
open("nan.safetensors", "wb").write(b)
PY
e2e_prog 1 init_nan ./gpt --init nan.safetensors --steps 1
e2e_says init_nan nan.safetensors "tensor 'wte' holds nan at element 5"
e2e_prog 2 flag_empty ./gpt --data ''
e2e_says flag_empty "--data needs a value"
e2e_prog 1 init_text ./gpt --init tokens.bin.txt --steps 1
e2e_says init_text tokens.bin.txt
e2e_prog 1 init_none ./gpt --init nothing.safetensors --steps 1
e2e_says init_none nothing.safetensors
e2e_prog 2 init_and_resume ./gpt --init L1.safetensors --resume ck --steps 1
e2e_says init_and_resume "--init" "--resume"

# --resume: an empty dir; a checkpoint of another build (other lr); a truncated checkpoint
mkdir -p empty
e2e_prog 1 resume_empty ./gpt --resume empty --steps 2
e2e_says resume_empty empty
e2e_build gpt_lr gpt_small.cplan --set train.optimizer.lr=2e-3
e2e_prog 0 ck_lr ./gpt_lr --steps 1 --checkpoint-every 1 --checkpoint-dir ck_lr --quiet
e2e_prog 1 resume_other ./gpt --resume ck_lr --steps 2
e2e_says resume_other ck_lr/step_000001 "build"
e2e_prog 0 ck ./gpt --steps 1 --checkpoint-every 1 --checkpoint-dir ck --quiet
head -c 300 ck/step_000001/model.safetensors >cut.st && mv cut.st ck/step_000001/model.safetensors
e2e_prog 1 resume_cut ./gpt --resume ck --steps 2
e2e_says resume_cut ck/step_000001/model.safetensors

# divergence: lr = 1e6 makes the loss NaN or infinite within a few steps
e2e_build gpt_nan gpt_small.cplan --set train.optimizer.lr=1e6
e2e_prog 1 nan ./gpt_nan --threads 1 --metrics nan.jsonl
e2e_says nan "error: step " "the loss is"
grep -qE "the loss is (NaN|infinite)" nan.err || { cat nan.err; fail "nan: no 'NaN' or 'infinite'"; }
# the step named is the one after the last metrics line (the lines count steps from 1, as it does)
n=$(grep -c . nan.jsonl)
e2e_says nan "error: step $((n + 1))/"
[ "$n" = 0 ] || grep -q "^{\"step\":$n," nan.jsonl || { cat nan.jsonl; fail "nan: the last metrics line is not step $n"; }
echo "ok"
