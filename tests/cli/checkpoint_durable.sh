#!/usr/bin/env bash
# Durable checkpoints: the system calls of a checkpointing run (strace) show every
# published name's bytes synced before its rename and the directory synced after it,
# for the checkpoint file and for `latest`.
set -euo pipefail
: "${PIPETRAIN:?}" "${SRC:?}" "${MPIEXEC:?}"
command -v strace >/dev/null || { echo "SKIP: strace is not installed (Debian: strace; scripts/test.sh installs it)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
head -c 50000 "$SRC/inputs/austen.txt" >c.txt
"$PIPETRAIN" data text c.txt -o c.h5 >/dev/null
strace -f -qq -e trace=openat,open,fsync,fdatasync,rename,renameat,renameat2,close -o trace.txt \
  "$PIPETRAIN" train "$SRC/inputs/austen-char.toml" --set data.train=c.h5 --set model.n_layer=1 \
  --set model.d_model=32 --set train.seq_len=16 --set model.max_seq_len=16 --set train.steps=2 \
  --set checkpoint.dir=ck --set checkpoint.every=2 >/dev/null
test -f ck/step_00000002.h5
python3 - trace.txt <<'PY'
import re, sys
lines = [l.split(None, 1)[1] if l[:1].isdigit() else l for l in open(sys.argv[1])]
def durable(tmp, final, directory):
    fds = {}       # fd -> path, for fds currently open
    synced = set() # paths fsynced since they were last opened
    renamed = None
    for i, l in enumerate(lines):
        m = re.match(r'open(?:at)?\((?:AT_FDCWD, )?"([^"]+)", [^)]*\) = (\d+)', l)
        if m:
            fds[m.group(2)] = m.group(1)
            continue
        m = re.match(r'f(?:data)?sync\((\d+)\)\s+= 0', l)
        if m and m.group(1) in fds:
            synced.add((fds[m.group(1)], renamed is not None))
            continue
        m = re.match(r'rename(?:at2?)?\((?:AT_FDCWD, )?"([^"]+)", (?:AT_FDCWD, )?"([^"]+)"', l)
        if m and m.group(1) == tmp and m.group(2) == final:
            assert (tmp, False) in synced, f"{tmp} renamed to {final} before it was fsynced"
            renamed = i
    assert renamed is not None, f"no rename of {tmp} to {final}"
    assert (directory, True) in synced, f"directory {directory} not fsynced after renaming {final}"
    print(f"   {final}: fsync(file) -> rename -> fsync({directory}/)")
durable("ck/step_00000002.h5.tmp", "ck/step_00000002.h5", "ck")
durable("ck/latest.tmp", "ck/latest", "ck")
PY
echo "durable checkpoint checks passed"
