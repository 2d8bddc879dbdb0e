# shellcheck shell=bash
# Shared by quickstart.sh and test.sh: install missing Debian packages, then
# configure and build. Source it; do not run it.

PIPETRAIN_PACKAGES=(
  g++ cmake ninja-build pkg-config git
  openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools libopenblas-dev
  libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libfmt-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev libpcre2-dev libdnnl-dev python3
)

# Only the test suite needs these: the oracles and tools whose tests skip without them
# (the report page in headless Chromium, PyTorch for Llama, strace for durable writes,
# the shell linter, the serial HDF5 headers). npm's tiktoken comes with install_tiktoken, where npm is.
# shellcheck disable=SC2034  # used by test.sh, which sources this file
PIPETRAIN_TEST_PACKAGES=(chromium hdf5-tools strace python3-torch shellcheck libhdf5-dev universal-ctags)

log() { printf '==> %s\n' "$*"; }

# Installs the packages that are missing (the build's, plus any named as arguments);
# silent when all are present.
ensure_packages() {
  local missing=()
  for p in "${PIPETRAIN_PACKAGES[@]}" "$@"; do
    [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == *"install ok installed"* ]] || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then return 0; fi
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "error: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  log "installing ${#missing[@]} Debian packages: ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

# install_tiktoken DIR: npm's tiktoken (the tokenizer oracle) into DIR/node_modules, once.
install_tiktoken() {
  local dir=$1
  if [ -d "$dir/node_modules/tiktoken" ]; then return 0; fi
  if ! command -v npm >/dev/null; then log "no npm: the tiktoken oracle test will be skipped"; return 0; fi
  log "installing the tokenizer oracle: npm install tiktoken@1 in $dir"
  mkdir -p "$dir"
  (cd "$dir" && npm install --no-audit --no-fund --silent tiktoken@1 >/dev/null)
}

# Open MPI refuses root without these, and tests use more ranks than cores.
mpi_env() {
  if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
  export OMPI_MCA_rmaps_base_oversubscribe=1
}

# configure_sanitized BUILD_DIR: the one sanitized tree that sanitize.sh and fuzz.sh share
# (clang-14: AddressSanitizer + UBSan on everything, and libFuzzer's coverage on the
# library), so the library is compiled once for the unit suite, mpi.np2 and the fuzzers.
# Line tables, not full debug information: reports name every frame's file and line, and
# the tree compiles about a tenth faster. Leak detection is off at run time: Open MPI
# unloads its plugins (dlclose) with allocations still held, which LeakSanitizer reports
# from "<unknown module>" frames that no suppression can name. The command layer and the
# tests compile at -O0 (half the time; ASan checks unoptimised code at least as closely).
configure_sanitized() {
  local dir=$1
  mkdir -p "$dir"
  log "configuring $dir (clang-14, AddressSanitizer + UBSan, libFuzzer coverage)"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    -DCMAKE_CXX_FLAGS="-O1 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
    -DCMAKE_CXX_FLAGS_DEBUG="-gline-tables-only" -DCMAKE_C_FLAGS_DEBUG="-gline-tables-only" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DPIPETRAIN_ENABLE_CUDA=OFF -DPIPETRAIN_BUILD_TESTS=ON -DPIPETRAIN_BUILD_BENCH=OFF \
    -DPIPETRAIN_BUILD_FUZZERS=ON -DPIPETRAIN_WARNINGS_AS_ERRORS=ON \
    -DPIPETRAIN_COLD_CODE_OPTIMIZATION=-O0 >"$dir/configure.log" 2>&1 \
    || { cat "$dir/configure.log"; exit 1; }
}

# sanitized_build BUILD_DIR TARGET...: builds the targets, the log in BUILD_DIR/build.log.
sanitized_build() {
  local dir=$1 start
  shift
  start=$(date +%s)
  log "building $* in $dir with $(nproc) jobs"
  cmake --build "$dir" -j "$(nproc)" --target "$@" >"$dir/build.log" 2>&1 || { tail -n 60 "$dir/build.log"; exit 1; }
  log "built in $(( $(date +%s) - start )) s"
}

# configure_and_build BUILD_DIR [extra cmake args...]
configure_and_build() {
  local dir=$1; shift
  local jobs
  jobs=$(nproc)
  log "configuring $dir (Release)"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >"$dir.configure.log" 2>&1 \
    || { cat "$dir.configure.log"; exit 1; }
  log "building with $jobs jobs"
  cmake --build "$dir" -j "$jobs" >"$dir.build.log" 2>&1 || { tail -n 60 "$dir.build.log"; exit 1; }
}
