#!/usr/bin/env bash
# The include graph matches docs/architecture.md's layer table: every
# `#include "pipetrain/<layer>/..."` in src/<x>/ and include/pipetrain/<x>/ names a layer
# that <x> may use. A new dependency means changing the table (and this list) on purpose.
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
  [runtime]="core backend comm topology schedule io model"
  [app]="core backend comm topology schedule io model runtime"
)
bad=0
for layer in "${!may[@]}"; do
  for dir in "$SRC/src/$layer" "$SRC/include/pipetrain/$layer"; do
    [ -d "$dir" ] || continue
    while IFS= read -r line; do
      file=${line%%:*}
      used=$(sed -E 's|.*#include "pipetrain/([a-z]+)/.*|\1|' <<<"$line")
      [ "$used" = "$layer" ] && continue
      if [[ " ${may[$layer]} " != *" $used "* ]]; then
        echo "FAIL: ${file#"$SRC"/} ($layer) includes pipetrain/$used/, which $layer may not use"
        bad=1
      fi
    done < <(grep -rHE '#include "pipetrain/[a-z]+/' "$dir" || true)
  done
done
[ "$bad" -eq 0 ] || exit 1
grep -q "| core |" "$SRC/docs/architecture.md" || { echo "FAIL: docs/architecture.md has no layer table"; exit 1; }
echo "layering: every include points down the table of docs/architecture.md"
