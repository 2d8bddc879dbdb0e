#!/usr/bin/env bash
# The PyTorch oracle for Llama (tests/test_llama_reference.cpp, tests/reference/llama_torch.py):
# installs Debian's python3-torch when no python3 has torch (as root, through apt), then
# compares pipetrain's loss and every gradient with PyTorch's float64 ones.
set -euo pipefail
: "${PIPETRAIN:?}" "${SRC:?}"
# The interpreter: the one on PATH if it has torch, else Debian's (where python3-torch goes).
find_python() {
  for py in python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null && "$py" -c "import torch" 2>/dev/null; then
      command -v "$py"
      return 0
    fi
  done
  return 1
}
if ! py=$(find_python); then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "skipped: no python3 has torch, and only root with apt can install python3-torch here"
    exit 77
  fi
  echo "no python3 has torch: installing Debian's python3-torch (the test's oracle)"
  log=$(mktemp)
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch >"$log" 2>&1; then
    echo "FAIL: apt-get install python3-torch failed:"
    tail -5 "$log"
    exit 1
  fi
  rm -f "$log"
  py=$(find_python) || { echo "FAIL: python3-torch installed, but no python3 imports torch"; exit 1; }
fi
echo "oracle: $py, torch $("$py" -c 'import torch; print(torch.__version__)')"
PIPETRAIN_TORCH_PYTHON="$py" "$(dirname "$PIPETRAIN")/pipetrain_tests" --gtest_filter='LlamaTorchReference.*'
