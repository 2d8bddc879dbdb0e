#!/usr/bin/env bash
# The include graph matches docs/architecture.md's layer table: every
# `#include "pipetrain/<layer>/..."` in src/<x>/ and include/pipetrain/<x>/ names a layer
# that <x> may use, and every include of MPI, Kokkos, HDF5, CUDA or NCCL a library its row
# names. A new dependency means changing the table on purpose.
# And a reader finds the code from a header's name: include/pipetrain/<x>/<n>.hpp is
# implemented in src/<x>/<n>.cpp or src/<x>/<n>_*.cpp, unless it is listed below as an
# interface or as the header of a family whose files its Exports comment names.
set -euo pipefail
: "${SRC:?}"
# The "may use" column of docs/architecture.md's layer table, one entry per layer: the rule
# lives there, this reads it.
table=$SRC/docs/architecture.md
declare -A may=()
while IFS='|' read -r _ layer _ _ uses _; do
  layer=$(tr -d ' ' <<<"$layer")
  may[$layer]=$(sed -E 's/\([^)]*\)//g; s/,/ /g' <<<"$uses")
done < <(grep -E '^\| (core|backend|comm|topology|schedule|io|model|plan|runtime|app) \|' "$table")
[ ${#may[@]} -eq 10 ] || { echo "FAIL: $table: expected the 10 layer rows, read ${#may[@]}"; exit 1; }
# A system library: the name in the table and the include that uses it.
declare -A system=([MPI]='<mpi\.h>' [Kokkos]='<Kokkos_' [HDF5]='<hdf5\.h>' [CUDA]='<(cuda|cublas|cudnn)[A-Za-z_0-9]*\.h>'
                   [NCCL]='<nccl\.h>')
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
    for lib in "${!system[@]}"; do
      if [[ " ${may[$layer]} " == *" $lib "* ]]; then continue; fi
      while IFS= read -r file; do
        echo "FAIL: ${file#"$SRC"/} ($layer) includes $lib, which docs/architecture.md does not let $layer use"
        bad=1
      done < <(grep -rlE "#include ${system[$lib]}" "$dir" || true)
    done
  done
done
declare -A family=(
  [model/layer]="interface: the Layer every model piece implements"
  [backend/backend]="interface: the Backend, implemented by src/backend/{cpu,cuda}/"
  [backend/cuda]="src/backend/cuda/ (cuda_backend.cpp, or cuda_disabled.cpp without CUDA)"
  [comm/communicator]="interface: the Communicator, implemented by mpi_communicator"
  [comm/steps]="header only: Steps, the pausing computations, and InFlight"
  [core/error]="header only: Error and fail()"
  [core/device]="header only: DeviceId"
  [core/documents]="header only: what packed documents' positions and ignored targets mean"
  [backend/gemm_problem]="header only: GemmProblem, one product of Backend::gemm_grouped"
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
echo "layering: every include (pipetrain's, MPI, Kokkos, HDF5, CUDA, NCCL) is one docs/architecture.md's table allows; every header names its files"
