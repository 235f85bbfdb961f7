#!/usr/bin/env bash
# Braid's Llama against a PyTorch Llama written in llama_parity.py (which states the cases and
# the bounds): same logits, losses and weights after 5 AdamW steps, from the same Hugging Face
# checkpoint folder, one file and sharded; and the one-line refusals of a bad config.json and a
# checkpoint whose names and shapes do not match.
set -euo pipefail
py=/usr/bin/python3
$py -c 'import torch' 2>/dev/null || { echo "FAIL: $py cannot import torch; run tools/setup.sh"; exit 1; }
root="$TEST_SRCDIR/braid"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
$py "$root/tests/parity/llama_parity.py" "$root/tests/parity/llama_parity_tool" "$tmp"
