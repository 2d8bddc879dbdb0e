#!/usr/bin/env bash
# `cmake --install` of the build tree into a temporary prefix: the installed pipetrain
# runs, the headers, the CMake package (config, version, targets files), the README,
# the job scripts and the Lmod modulefile (naming the prefix) are there; then the tiny
# consumer project tests/install/ finds the package with find_package(pipetrain CONFIG),
# links pipetrain::pipetrain, builds and runs.
# Env: PIPETRAIN = the built executable (BUILD/bin/pipetrain); SRC = the source tree.
set -euo pipefail
: "${PIPETRAIN:?set PIPETRAIN to the built pipetrain executable}"
SRC=${SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
BUILD=$(cd "$(dirname "$PIPETRAIN")/.." && pwd)
[ -f "$BUILD/cmake_install.cmake" ] || { echo "FAIL: $BUILD is not a CMake build tree" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
die() { echo "FAIL: $*" >&2; exit 1; }
prefix=$tmp/prefix

echo "== cmake --install $BUILD --prefix $prefix"
timeout 300 cmake --install "$BUILD" --prefix "$prefix" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; die "install failed"; }

echo "== installed files"
version=$(sed -n 's/^project(pipetrain VERSION \([0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")
[ -n "$version" ] || die "no project version in $SRC/CMakeLists.txt"
[ -x "$prefix/bin/pipetrain" ] || die "bin/pipetrain missing"
out=$(cd "$tmp" && timeout 60 "$prefix/bin/pipetrain" --version) || die "installed pipetrain --version failed"
grep -q "$version" <<<"$out" || die "pipetrain --version does not print $version: $out"
grep -q "^1f1b" <<<"$(timeout 60 "$prefix/bin/pipetrain" schedule --list)" || die "installed pipetrain schedule --list"
libdir=""
for d in lib lib64 lib/x86_64-linux-gnu; do
  if [ -f "$prefix/$d/cmake/pipetrain/pipetrainConfig.cmake" ]; then libdir=$d; break; fi
done
[ -n "$libdir" ] || die "no <libdir>/cmake/pipetrain/pipetrainConfig.cmake under $prefix: $(cd "$prefix" && find . -name '*.cmake')"
for f in "$libdir/libpipetrain.a" "$libdir/cmake/pipetrain/pipetrainConfigVersion.cmake" \
         "$libdir/cmake/pipetrain/pipetrainTargets.cmake" \
         include/pipetrain/core/config.hpp include/pipetrain/schedule/registry.hpp \
         share/doc/pipetrain/README.md share/pipetrain/jobscripts/workstation.sh \
         share/pipetrain/jobscripts/slurm-single-node.sbatch share/pipetrain/jobscripts/lib/pipetrain_job.sh \
         share/pipetrain/inputs/austen-char.toml; do
  [ -f "$prefix/$f" ] || die "$f not installed"
done
# Every public header of the source tree is installed.
while IFS= read -r h; do
  [ -f "$prefix/include/$h" ] || die "header $h not installed"
done < <(cd "$SRC/include" && find pipetrain -name '*.hpp')
grep -q "pipetrain::pipetrain" "$prefix/$libdir/cmake/pipetrain/pipetrainTargets.cmake" ||
  die "pipetrainTargets.cmake does not define pipetrain::pipetrain"

echo "== installed job scripts find the installed pipetrain"
out=$(cd "$tmp" && env -u PIPETRAIN PATH=/usr/bin:/bin MPIEXEC="${MPIEXEC:-mpirun}" PIPETRAIN_DRY_RUN=1 \
      timeout 60 bash "$prefix/share/pipetrain/jobscripts/workstation.sh" \
      "$prefix/share/pipetrain/inputs/austen-char.toml" 2>&1) || die "installed workstation.sh: $out"
if ! PATH=/usr/bin:/bin command -v pipetrain >/dev/null; then
  grep -qF "$prefix/bin/pipetrain train $prefix/share/pipetrain/inputs/austen-char.toml" <<<"$out" ||
    die "installed workstation.sh does not run $prefix/bin/pipetrain: $out"
fi
echo "   $out"

echo "== Lmod modulefile"
module=$prefix/share/modulefiles/pipetrain/$version.lua
[ -f "$module" ] || die "modulefile share/modulefiles/pipetrain/$version.lua missing"
for needle in "setenv(\"PIPETRAIN_ROOT\", root)" "local root = \"$prefix\"" \
              "prepend_path(\"PATH\", \"$prefix/bin\")" "prepend_path(\"LD_LIBRARY_PATH\", \"$prefix/$libdir\")" \
              "prepend_path(\"CMAKE_PREFIX_PATH\", root)" "whatis(\"Version: $version\")" "whatis(\"Compiler: " \
              "help([[" "-- load(\"openmpi"; do
  grep -qF -- "$needle" "$module" || die "modulefile lacks '$needle':$(printf '\n')$(cat "$module")"
done
if grep -q "@[A-Za-z_]*@" "$module"; then die "modulefile has unreplaced @VARIABLES@: $(grep "@[A-Za-z_]*@" "$module")"; fi
# Its help lists every subcommand `pipetrain --help` has, in the order the command lists them.
subs=$(timeout 60 "$prefix/bin/pipetrain" --help | awk '/^Subcommands:/ {on = 1; next} on && NF {print $1}' | paste -sd, | sed 's/,/, /g')
grep -qF "subcommands: $subs" "$module" || die "modulefile's subcommands are not 'pipetrain --help''s ($subs)"
if command -v luac >/dev/null 2>&1; then
  luac -p "$module" || die "modulefile is not valid Lua"
fi

echo "== consumer project (tests/install) against the installed package"
timeout 300 cmake -S "$SRC/tests/install" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; die "consumer configure failed"; }
grep -q "pipetrain $version from $prefix/$libdir/cmake/pipetrain" "$tmp/consumer.log" ||
  { cat "$tmp/consumer.log"; die "consumer did not find the installed package"; }
timeout 600 cmake --build "$tmp/consumer" >>"$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; die "consumer build failed"; }
out=$(timeout 60 "$tmp/consumer/pipetrain_consumer") || die "consumer run failed: $out"
echo "   $out"
grep -q "config ok" <<<"$out" || die "consumer output: $out"
grep -q "zb-h1" <<<"$out" || die "consumer output lacks the schedule list: $out"

echo "== a package version that does not match is refused"
mkdir "$tmp/badver"
cat >"$tmp/badver/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.25)
project(badver LANGUAGES CXX)
find_package(pipetrain 99.0 CONFIG QUIET)
if(pipetrain_FOUND)
  message(FATAL_ERROR "pipetrain 99.0 found?")
endif()
EOF
timeout 300 cmake -S "$tmp/badver" -B "$tmp/badver/build" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/badver.log" 2>&1 ||
  { cat "$tmp/badver.log"; die "version check"; }
echo "all install checks passed"
