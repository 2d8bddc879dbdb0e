# Shared by quickstart.sh and test.sh: install missing Debian packages, then
# configure and build. Source it; do not run it.

PIPETRAIN_PACKAGES=(
  g++ cmake ninja-build pkg-config git
  openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools libopenblas-dev
  libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libfmt-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev libpcre2-dev libdnnl-dev python3
)

# Only the test suite needs these (the report page is checked in headless Chromium).
PIPETRAIN_TEST_PACKAGES=(chromium hdf5-tools strace)

log() { printf '==> %s\n' "$*"; }

# Installs the packages that are missing (the build's, plus any named as arguments);
# silent when all are present.
ensure_packages() {
  local missing=()
  for p in "${PIPETRAIN_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
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

# Open MPI refuses root without these, and tests use more ranks than cores.
mpi_env() {
  if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
  export OMPI_MCA_rmaps_base_oversubscribe=1
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
