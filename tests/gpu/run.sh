#!/usr/bin/env bash
# The GPU checks, on a machine with CUDA GPUs and a CUDA build of torch (tests/gpu/test_gpu.py, marker "gpu").
# Uses the project's .venv when it has a CUDA torch, else the python3 on PATH; notebook_launcher comes from this
# checkout (PYTHONPATH), so nothing is installed. Bounded to 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=python3
if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    python=.venv/bin/python
fi
"$python" -c "import torch, sys; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPUs', torch.cuda.device_count()); sys.exit(not torch.cuda.is_available())" \
    || { echo "tests/gpu/run.sh: no CUDA GPU visible to $python (a CUDA build of torch is needed)"; exit 1; }
"$python" -c "import pytest, cloudpickle, IPython, yaml" \
    || { echo "tests/gpu/run.sh: $python needs pytest, cloudpickle, ipython and pyyaml"; exit 1; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 480 "$python" -m pytest -q -p no:cacheprovider -m gpu tests/gpu -o addopts="" "$@"
