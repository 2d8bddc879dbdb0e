#!/usr/bin/env bash
# Every example command in the shipped files (config and job-script comments, the README
# and docs/) runs or validates as written: tests/cli/examples_check.py says how.
# Env: PIPETRAIN = the executable; SRC = the source tree.
set -euo pipefail
: "${PIPETRAIN:?set PIPETRAIN to the pipetrain executable}"
SRC=${SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
exec python3 "$SRC/tests/cli/examples_check.py" "$PIPETRAIN" "$SRC"
