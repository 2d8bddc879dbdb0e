#!/usr/bin/env bash
# The PyTorch oracle for Llama (tests/test_llama_reference.cpp, tests/reference/llama_torch.py):
# compares pipetrain's loss and every gradient with PyTorch's float64 ones. Skipped (77)
# where no python3 has torch; it never installs anything (scripts/test.sh does).
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
  echo "SKIP: no python3 imports torch (Debian: python3-torch, for /usr/bin/python3; scripts/test.sh installs it)"
  exit 77
fi
echo "oracle: $py, torch $("$py" -c 'import torch; print(torch.__version__)')"
PIPETRAIN_TORCH_PYTHON="$py" "$(dirname "$PIPETRAIN")/pipetrain_tests" --gtest_filter='LlamaTorchReference.*'
