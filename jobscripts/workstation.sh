#!/usr/bin/env bash
# Train on a workstation with plain mpirun.
#   jobscripts/workstation.sh CONFIG [NRANKS] [extra pipetrain train options...]
# NRANKS must equal parallel.dp * parallel.pp * parallel.tp of the config.
set -euo pipefail
config=${1:?usage: $0 CONFIG [NRANKS] [options...]}
nranks=${2:-1}
shift $(( $# >= 2 ? 2 : 1 ))
exe=${PIPETRAIN:-$(dirname "$0")/../build/bin/pipetrain}
extra=()
[ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
exec mpirun "${extra[@]}" --oversubscribe -np "$nranks" \
  "$exe" train "$config" "$@"
