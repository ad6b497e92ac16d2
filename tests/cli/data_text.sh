#!/usr/bin/env bash
# cplanc data text: the token file it writes has llm.c's header and the text's
# bytes as tokens, the --val split is the tail, and bad usage exits 2.
set -u
cplanc=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
printf 'hello, world\nthe quick brown fox\n' > "$dir/in.txt"   # 33 bytes: 8 go to val
"$cplanc" data text "$dir/in.txt" -o "$dir/out.bin" --val 0.25 >/dev/null || { echo "data text failed"; fail=1; }
python3 - "$dir" <<'PY' || fail=1
import struct, sys
d = sys.argv[1]
def load(p):
    b = open(p, 'rb').read()
    h = struct.unpack('<256i', b[:1024])
    toks = struct.unpack('<%dH' % ((len(b) - 1024) // 2), b[1024:])
    assert h[0] == 20240520 and h[1] == 1 and h[2] == len(toks), h[:3]
    return bytes(toks)
text = open(d + '/in.txt', 'rb').read()
train, val = load(d + '/out.bin'), load(d + '/out_val.bin')
assert train == text[:25] and val == text[25:], (train, val)
print('token files ok')
PY
"$cplanc" data text "$dir/in.txt" >/dev/null 2>&1; [ $? = 2 ] || { echo "missing -o should exit 2"; fail=1; }
"$cplanc" data text "$dir/in.txt" -o "$dir/x.bin" --val 1.5 >/dev/null 2>&1; [ $? = 2 ] || { echo "--val 1.5 should exit 2"; fail=1; }
"$cplanc" data text "$dir/none.txt" -o "$dir/x.bin" >/dev/null 2>&1; [ $? = 1 ] || { echo "missing input should exit 1"; fail=1; }
# the text as its own output (by its name, or through a link; or as the --val file) is refused, the text kept
cp "$dir/in.txt" "$dir/keep.txt" && ln -s keep.txt "$dir/link.bin" && cp "$dir/in.txt" "$dir/v.txt" && ln -s v.txt "$dir/w_val.bin"
for args in "-o $dir/keep.txt" "-o $dir/link.bin" "-o $dir/w.bin --val 0.5"; do
  src=$dir/keep.txt; case $args in *w.bin*) src=$dir/v.txt;; esac
  # shellcheck disable=SC2086
  "$cplanc" data text "$src" $args >/dev/null 2>"$dir/same.err"; rc=$?
  if [ $rc != 1 ] || ! grep -q "is the text being read" "$dir/same.err" || ! cmp -s "$src" "$dir/in.txt"; then
    echo "data text $src $args: exit $rc, the text replaced or no error"; cat "$dir/same.err"; fail=1
  fi
done
exit $fail
