#!/usr/bin/env bash
# The frameworks' environments of the KL-gradient conformance report (docs/conformance.md, "The frameworks"), in DIR
# (default .venv-conformance): PyPI only, about 10 minutes and 8 GB (most of it torch 2.10.0 with its CUDA libraries).
#   bash lab/scripts/setup_conformance.sh [DIR]
# Run it with the recipe's environment active (README's install): trl/ and openrlhf/ are folders installed --no-deps
# over it, and DIR/base-python names its interpreter for the probes; py312/ is a Python 3.12 environment of its own
# ($RPG_CONFORMANCE_PYTHON312, else python3.12 on PATH, else pyenv's newest 3.12).
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR="$(mkdir -p "${1:-.venv-conformance}" && cd "${1:-.venv-conformance}" && pwd)"
PYTHON="$(python -c 'import sys; print(sys.executable)')"
python -c "import rpg_lab, verl" || { echo "setup_conformance: activate the recipe's environment first (README)"; exit 1; }
PY312="${RPG_CONFORMANCE_PYTHON312:-$(python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null \
  || PYENV_VERSION="$(pyenv versions --bare 2>/dev/null | grep '^3\.12' | tail -1)" \
     python3.12 -c 'import sys; print(sys.executable)')}"
echo "$PYTHON" > "$DIR/base-python"

# TRL 1.16.0: every requirement of it is met by the recipe's environment, or this fails
python -m pip install --quiet --dry-run --report "$DIR/trl-resolution.json" trl==1.16.0
python - "$DIR/trl-resolution.json" <<'PY'
import json, sys
extra = [i["metadata"]["name"] for i in json.load(open(sys.argv[1]))["install"] if i["metadata"]["name"] != "trl"]
sys.exit(f"setup_conformance: trl 1.16.0 would also install {extra} into the recipe's environment" if extra else 0)
PY
python -m pip install --quiet --no-deps --upgrade --target "$DIR/trl" trl==1.16.0
python -m pip install --quiet --no-deps --no-build-isolation --upgrade --target "$DIR/openrlhf" -r lab/envs/openrlhf.txt

"$PY312" -m venv "$DIR/py312"
"$DIR/py312/bin/python" -m pip install --quiet -r lab/envs/py312.txt
"$DIR/py312/bin/python" -m pip install --quiet --no-deps skyrl==0.4.0 areal==1.0.4

# one line per framework: its KL code imports where its probe will run
PYTHONPATH="$DIR/trl" python -c "import trl; print('trl', trl.__version__)"
PYTHONPATH="$DIR/openrlhf" python -c "import deepspeed, importlib.metadata as m; print('openrlhf', m.version('openrlhf'), 'deepspeed', deepspeed.__version__)"
"$DIR/py312/bin/python" -c "import torch, skyrl.backends.skyrl_train.utils.ppo_utils, areal.utils.data, importlib.metadata as m; print('skyrl', m.version('skyrl'), 'areal', m.version('areal'), 'torch', torch.__version__)"
