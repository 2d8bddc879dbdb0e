#!/usr/bin/env bash
# pipetrain keeps compiling against a serial HDF5 (a site's default hdf5 module often is):
# every source that includes HDF5 (src/io/, the training loop, the commands that read
# token files) is compiled, syntax only, with this build's own command line but Debian's
# serial HDF5 headers (libhdf5-dev: /usr/include/hdf5/serial, H5_HAVE_PARALLEL unset) in
# place of the parallel ones. Skipped (77) where those headers are not installed; a full
# serial build and its tests: docs/building.md.
# Env: PIPETRAIN = BUILD/bin/pipetrain (its BUILD/compile_commands.json is read).
set -euo pipefail
: "${PIPETRAIN:?set PIPETRAIN to the built pipetrain executable}"
serial=/usr/include/hdf5/serial
if [ ! -f "$serial/hdf5.h" ]; then
  echo "SKIP: no serial HDF5 headers in $serial (Debian: libhdf5-dev; scripts/test.sh installs it)"
  exit 77
fi
commands=$(dirname "$PIPETRAIN")/../compile_commands.json
[ -f "$commands" ] || { echo "FAIL: no $commands (configure with CMAKE_EXPORT_COMPILE_COMMANDS)"; exit 1; }
python3 - "$commands" "$serial" <<'PY'
import json, re, shlex, subprocess, sys
entries, serial = json.load(open(sys.argv[1])), sys.argv[2]
wanted = re.compile(r"/src/(io/[^/]+|runtime/training_loop|app/cmd_(check|data|train))\.cpp$")
files = [e for e in entries if wanted.search(e["file"])]
assert len(files) >= 15, f"only {len(files)} HDF5 sources found in {sys.argv[1]}"
failed = []
for e in files:
    argv = shlex.split(e["command"])
    out = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a == "-c":
            continue
        out.append(re.sub(r"^/usr/include/hdf5/[a-z]+$", serial, a))
    if serial not in out:
        failed.append(f"{e['file']}: no HDF5 include directory to replace in its command")
        continue
    p = subprocess.run(out + ["-fsyntax-only"], cwd=e["directory"], capture_output=True, text=True)
    if p.returncode:
        failed.append(f"{e['file']}:\n{p.stderr[-2000:]}")
for f in failed:
    print("FAIL:", f)
print(f"{len(files) - len(failed)} of {len(files)} HDF5 sources compile against the serial HDF5 in {serial}")
sys.exit(1 if failed else 0)
PY
