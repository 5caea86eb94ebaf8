#!/usr/bin/env bash
# Create the separate environment for the loader benchmark's peers that do not belong in the
# project's .venv: Hugging Face datasets, MosaicML streaming and Google grain.
#
#   bash benchmarks/peers_env.sh            # -> bench-output/peers-venv (gitignored)
#
# PyTorch is pinned to the CPU build (never an unpinned torch: it pulls a multi-GB CUDA build).
# mosaicml-streaming depends on torchvision, which resolves to a CUDA build that fails to load
# beside CPU torch, and pins huggingface-hub<1.0; so it is installed with --no-deps plus the
# light dependencies it imports. loader_bench.py uses this venv's python when it exists.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PEERS_VENV:-bench-output/peers-venv}
PYTHON=${PYTHON:-python3}
TORCH_PIN=${TORCH_PIN:-torch==2.13.0}
mkdir -p "$(dirname "$VENV")"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip install --quiet"
$PIP --upgrade pip >/dev/null 2>&1 || true
$PIP "$TORCH_PIN" numpy psutil
$PIP datasets || echo "peers_env: datasets failed to install" >&2
$PIP grain || echo "peers_env: grain failed to install" >&2
# MosaicML streaming without torchvision: its dataset/writer code paths need only these.
$PIP --no-deps mosaicml-streaming || echo "peers_env: mosaicml-streaming failed" >&2
$PIP zstd xxhash 'azure-identity' 'python-snappy' 'brotli' 'paramiko' 'pydantic' \
  'catalogue' 'tqdm' 'boto3' 'requests' 'lightning-utilities' 'numpy' 2>/dev/null \
  || echo "peers_env: some streaming dependencies failed" >&2
# streaming.base imports transformers (which needs Pillow for its image utilities); its
# torchvision import is only in streaming.vision, which loader_bench.py stubs out.
$PIP transformers pillow || echo "peers_env: transformers failed" >&2
for mod in datasets grain streaming; do
  check="import $mod"
  [ "$mod" = streaming ] && check="import sys; sys.path.insert(0, 'benchmarks'); \
import loader_bench; loader_bench._import_streaming()"
  if "$VENV/bin/python" -c "$check" >/dev/null 2>&1; then
    echo "peers_env: $mod ok"
  else
    echo "peers_env: $mod NOT importable" >&2
  fi
done
