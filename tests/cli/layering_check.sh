#!/usr/bin/env bash
# The include graph matches docs/architecture.md's layer table: every
# `#include "pipetrain/<layer>/..."` in src/<x>/ and include/pipetrain/<x>/ names a layer
# that <x> may use. A new dependency means changing the table (and this list) on purpose.
# And a reader finds the code from a header's name: include/pipetrain/<x>/<n>.hpp is
# implemented in src/<x>/<n>.cpp or src/<x>/<n>_*.cpp, unless it is listed below as an
# interface or as the header of a family whose files its Exports comment names.
set -euo pipefail
: "${SRC:?}"
declare -A may=(
  [core]=""
  [backend]="core"
  [comm]="core"
  [topology]="core comm"
  [schedule]="core"
  [io]="core"
  [model]="core backend comm"
  [plan]="core schedule model"
  [runtime]="core backend comm topology schedule io model plan"
  [app]="core backend comm topology schedule io model plan runtime"
)
bad=0
for layer in "${!may[@]}"; do
  for dir in "$SRC/src/$layer" "$SRC/include/pipetrain/$layer"; do
    [ -d "$dir" ] || continue
    while IFS= read -r line; do
      file=${line%%:*}
      used=$(sed -E 's|.*#include "pipetrain/([a-z]+)/.*|\1|' <<<"$line")
      if [ "$used" = "$layer" ]; then continue; fi
      if [[ " ${may[$layer]} " != *" $used "* ]]; then
        echo "FAIL: ${file#"$SRC"/} ($layer) includes pipetrain/$used/, which $layer may not use"
        bad=1
      fi
    done < <(grep -rHE '#include "pipetrain/[a-z]+/' "$dir" || true)
  done
done
declare -A family=(
  [model/layer]="interface: the Layer every model piece implements"
  [backend/backend]="interface: the Backend, implemented by src/backend/{cpu,cuda}/"
  [backend/cuda]="src/backend/cuda/ (cuda_backend.cpp, or cuda_disabled.cpp without CUDA)"
  [comm/communicator]="interface: the Communicator, implemented by mpi_communicator"
  [core/error]="header only: Error and fail()"
  [core/device]="header only: DeviceId"
  [core/device_allocator]="interface: what the memory pool allocates from"
  [schedule/program]="lower.cpp, validate_program.cpp, validate_in_order.cpp, walk_program.cpp"
  [schedule/builtins]="one file per built-in schedule, registered in registry.cpp"
  [schedule/render]="render_text.cpp, render_trace.cpp"
)
while IFS= read -r h; do
  rel=${h#"$SRC/include/pipetrain/"}
  key=${rel%.hpp}
  layer=${key%%/*}
  name=${key#*/}
  if [ -n "${family[$key]:-}" ]; then continue; fi
  compgen -G "$SRC/src/$layer/$name.cpp" >/dev/null || compgen -G "$SRC/src/$layer/${name}_*.cpp" >/dev/null ||
    compgen -G "$SRC/src/$layer/*/$name.cpp" >/dev/null || {
    echo "FAIL: include/pipetrain/$rel has no src/$layer/$name.cpp or src/$layer/${name}_*.cpp"
    bad=1
  }
done < <(find "$SRC/include/pipetrain" -name '*.hpp' | sort)
[ "$bad" -eq 0 ] || exit 1
grep -q "| core |" "$SRC/docs/architecture.md" || { echo "FAIL: docs/architecture.md has no layer table"; exit 1; }
echo "layering: every include points down the table of docs/architecture.md; every header names its files"
