#!/usr/bin/env bash
# The Llama-family ops on the CPU backend against PyTorch 1.13 (llama_ops_torch_test.py says
# how and within what).
set -euo pipefail
# Debian's python3-torch, as tests/parity uses (requires("torch") checks the same interpreter).
py=/usr/bin/python3
$py -c 'import torch' 2>/dev/null || { echo "FAIL: $py cannot import torch; run tools/setup.sh"; exit 1; }
here="$TEST_SRCDIR/braid/backends/cpu"
out="${TEST_TMPDIR:-$(mktemp -d)}/llama_ops"
mkdir -p "$out"
"$here/llama_ops_dump" "$out"
$py "$here/llama_ops_torch_test.py" "$out"
