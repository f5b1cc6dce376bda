# Shared by scripts/demo and scripts/test: create .venv once and install tilecast into it.
# usage: source scripts/_venv.sh EXTRAS   (EXTRAS e.g. "" or "export,train,dev")
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TILECAST_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
extras="${1:-}"
if [[ "$extras" == *export* || "$extras" == *train* ]]; then
  # torch first, pinned: a bare "torch" requirement would pull GBs of CUDA wheels.
  "$VENV/bin/python" -m pip install -q "torch==2.13.0"
fi
if [ -n "$extras" ]; then
  "$VENV/bin/python" -m pip install -q -e "$ROOT[$extras]"
else
  "$VENV/bin/python" -m pip install -q -e "$ROOT"
fi
export PATH="$VENV/bin:$PATH"
