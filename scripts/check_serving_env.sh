#!/usr/bin/env bash
# The serving install, checked: a fresh virtual environment with the serve extra's pins only (numpy, onnxruntime,
# tokenizers, starlette, uvicorn, prometheus-client; setup.py SERVE_REQUIRES) and this package installed with
# --no-deps, so that torch and fairseq are absent (not blocked). For fp32, and int8 where the folder has it,
# acl-predict OUT/onnx must classify in it with the labels, exit layers and probabilities (to 1e-5) that the full
# environment gives on the same folder (and, fp32, on the checkpoint it was exported from, when built here, to
# 1e-4); acl-serve --precision P must start on the folder, answer /v2/health/ready, one /predict and one Open
# Inference Protocol infer with those same labels, exit layers and probabilities (to 1e-5), and exit 0 on SIGTERM.
#
# Usage: scripts/check_serving_env.sh [OUT/onnx]
#   OUT/onnx: a folder acl-export wrote (e.g. make demo's demo_out/export/onnx). Without it, a tiny model is
#   trained and exported (fp32 and int8) with the full environment ($VENV, default .venv) first; nothing is
#   exported in the serving environment itself. Everything else lives in a temporary folder, removed at the end.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"                  # the full environment (scripts/setup_env.sh)
PYTHON="${PYTHON:-python3}"                  # interpreter of the serving environment
WORK="$(mktemp -d "${TMPDIR:-/tmp}/acl_serving.XXXXXX")"
SERVER=""
trap '[[ -n "$SERVER" ]] && kill "$SERVER" 2>/dev/null; rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" PYTHONWARNINGS=ignore
start=$SECONDS
say() { echo "[serving-env $((SECONDS - start))s] $*"; }

FOLDER="${1:-}"
CKPT=""
if [[ -z "$FOLDER" ]]; then
  say "no OUT/onnx given: a tiny model trained and exported with $VENV"
  PATH="$VENV/bin:$PATH" python "$ROOT/scripts/toy_data.py" "$WORK/data" --n-train 64 --n-valid 16 >/dev/null 2>&1
  read -r -a layout_flags <<<"$(PYTHONPATH="$ROOT" "$VENV/bin/python" -S -m acl_fairseq.runs.model_flags flags)"
  "$VENV/bin/fairseq-train" "$WORK/data" --user-dir "$ROOT/acl_fairseq" --task sentence_prediction_acl \
    "${layout_flags[@]}" --num-classes 2 --arch multi_exit_roberta --encoder-layers 3 --encoder-embed-dim 16 \
    --encoder-ffn-embed-dim 32 --encoder-attention-heads 2 --max-positions 64 --criterion sentence_ce \
    --optimizer adam --lr 1e-3 --batch-size 16 --max-epoch 1 --cpu --num-workers 0 --no-progress-bar \
    --save-dir "$WORK/ckpt" --no-epoch-checkpoints >"$WORK/train.log" 2>&1 || { tail -20 "$WORK/train.log"; exit 1; }
  CKPT="$WORK/ckpt/checkpoint_best.pt"
  "$VENV/bin/acl-export" "$CKPT" --data "$WORK/data" --output "$WORK/export" --format onnx --quantize int8 \
    --metrics-split none >/dev/null
  FOLDER="$WORK/export/onnx"
fi
[[ -f "$FOLDER/manifest.json" ]] || { echo "$FOLDER/manifest.json not found: pass an OUT/onnx folder" >&2; exit 2; }

say "fresh virtual environment: $PYTHON -m venv, the serve pins, pip install --no-deps -e ."
pins="$("$PYTHON" - "$ROOT/setup.py" <<'PY'
import ast, sys
tree = ast.parse(open(sys.argv[1]).read())
print(" ".join(next(ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", None) == "SERVE_REQUIRES" for t in n.targets))))
PY
)"
"$PYTHON" -m venv "$WORK/serve"
PIP=("$WORK/serve/bin/python" -m pip --disable-pip-version-check -q)
# pip install "$@" with its stderr kept: printed whole when pip fails; when it succeeds, its warnings (a configured
# index or find-links location that does not exist, the resolver's report of the environment's other requirements)
# read like failures, so they become one line (VERBOSE_PIP=1 prints them), and the checks below decide
pip_install() {
  local status=0
  "${PIP[@]}" install "$@" 2>"$WORK/pip.log" || status=$?
  if [[ "$status" != 0 || "${VERBOSE_PIP:-0}" == 1 ]]; then
    cat "$WORK/pip.log" >&2
  elif [[ -s "$WORK/pip.log" ]]; then
    say "pip install $*: $(wc -l <"$WORK/pip.log") lines of pip warnings not shown (VERBOSE_PIP=1 shows them)"
  fi
  return "$status"
}
# shellcheck disable=SC2086  # the pins are separate words
pip_install $pins
pip_install --no-deps -e "$ROOT"  # after the pins: pip then has no resolver run to warn from
"$WORK/serve/bin/python" - <<'PY'
import importlib.util
present = [m for m in ("torch", "fairseq") if importlib.util.find_spec(m) is not None]
assert not present, f"the serving environment should not have {present}"
PY
say "installed: $pins; torch and fairseq absent"

printf '%s\n' "the music was really brilliant" "the plot was not clever , honestly" >"$WORK/two.txt"
precisions=(fp32)
"$VENV/bin/python" -c 'import json, sys; sys.exit("int8" not in (json.load(open(sys.argv[1])).get("quantized") or {}))' \
  "$FOLDER/manifest.json" && precisions+=(int8)
say "precisions in the folder: ${precisions[*]}"

# same ids, labels and exit layers; probabilities within TOL: compare.py OURS TOL REFERENCE...
cat >"$WORK/compare.py" <<'PY'
import csv, sys
def rows(path):
    return [(r["id"], r["label"], int(r["exit_layer"]), [float(r[k]) for k in r if k.startswith("p_")])
            for r in csv.DictReader(open(path), delimiter="\t")]
ours, tol = rows(sys.argv[1]), float(sys.argv[2])
assert len(ours) == 2 and all(len(r[3]) > 1 for r in ours), ours
for path in sys.argv[3:]:
    theirs = rows(path)
    assert [r[:3] for r in theirs] == [r[:3] for r in ours], f"{path}: {theirs} != {ours}"
    gap = max(abs(a - b) for x, y in zip(ours, theirs) for a, b in zip(x[3], y[3]))
    assert gap <= tol, f"{path}: probabilities differ by {gap:.2e} > {tol:g}"
    print(f"[serving-env] {path}: same ids, labels, exit layers; probabilities within {gap:.1e}")
PY

flags=(--input "$WORK/two.txt" --format tsv --policy entropy --threshold 0.3)
for precision in "${precisions[@]}"; do
  t0=$SECONDS
  "$WORK/serve/bin/acl-predict" "$FOLDER" "${flags[@]}" --precision "$precision" --output "$WORK/serve.$precision.tsv"
  say "acl-predict OUT/onnx --precision $precision in the serving environment: $((SECONDS - t0))s"
  cat "$WORK/serve.$precision.tsv"
  "$VENV/bin/acl-predict" "$FOLDER" "${flags[@]}" --precision "$precision" --output "$WORK/full.$precision.tsv" \
    2>/dev/null
  "$VENV/bin/python" "$WORK/compare.py" "$WORK/serve.$precision.tsv" 1e-5 "$WORK/full.$precision.tsv"
done
if [[ -n "$CKPT" ]]; then  # the checkpoint in torch against the fp32 graphs: float reduction order only
  "$VENV/bin/acl-predict" "$CKPT" --data "$WORK/data" "${flags[@]}" --device cpu --output "$WORK/ckpt.tsv" 2>/dev/null
  "$VENV/bin/python" "$WORK/compare.py" "$WORK/serve.fp32.tsv" 1e-4 "$WORK/ckpt.tsv"
fi
if [[ -n "$CKPT" ]]; then  # a checkpoint needs the training install: one line that says so, exit 2
  status=0
  "$WORK/serve/bin/acl-predict" "$CKPT" --data "$WORK/data" "${flags[@]}" 2>"$WORK/ckpt.err" >/dev/null || status=$?
  grep -q "a checkpoint needs torch" "$WORK/ckpt.err" && [[ $status -eq 2 ]] ||
    { cat "$WORK/ckpt.err"; echo "acl-predict CHECKPOINT without torch: expected exit 2 naming torch, got $status" >&2; exit 1; }
  say "acl-predict CHECKPOINT without torch: $(tail -1 "$WORK/ckpt.err")"
fi


serve_check() {  # serve_check PRECISION: acl-serve --precision PRECISION against acl-predict's answers
  local precision="$1" port url status t0
  port="$("$WORK/serve/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  url="http://127.0.0.1:$port"
  t0=$SECONDS
  "$WORK/serve/bin/acl-serve" "$FOLDER" --port "$port" --precision "$precision" --policy entropy --threshold 0.3 \
    2>"$WORK/serve.log" &
  SERVER=$!
  until curl -sf -o /dev/null "$url/v2/health/ready"; do
    kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/serve.log"; echo "acl-serve did not start" >&2; exit 1; }
    sleep 0.1
  done
  say "acl-serve --precision $precision ready in the serving environment: $((SECONDS - t0))s"
  mapfile -t two <"$WORK/two.txt"
  curl -sf "$url/predict" -H 'Content-Type: application/json' \
    -d "{\"inputs\": [[\"${two[0]}\"], [\"${two[1]}\"]]}" >"$WORK/predict.json"
  curl -sf "$url/v2/models/acl/infer" -H 'Content-Type: application/json' -d "{\"inputs\": [{\"name\": \"text\", \
\"shape\": [2], \"datatype\": \"BYTES\", \"data\": [\"${two[0]}\", \"${two[1]}\"]}]}" >"$WORK/infer.json"
  cat "$WORK/predict.json"; echo; cat "$WORK/infer.json"; echo
  kill -TERM "$SERVER"
  status=0
  wait "$SERVER" || status=$?
  SERVER=""
  [[ $status -eq 0 ]] || { cat "$WORK/serve.log"; echo "acl-serve exited $status on SIGTERM, not 0" >&2; exit 1; }
  "$VENV/bin/python" - "$WORK/serve.$precision.tsv" "$WORK/predict.json" "$WORK/infer.json" "$precision" <<'PY'
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
labels = [k[2:] for k in rows[0] if k.startswith("p_")]
ours = [(r["label"], int(r["exit_layer"]), [float(r["p_" + n]) for n in labels]) for r in rows]
tei = [(max(e, key=lambda x: x["score"])["label"], e[0]["exit_layer"], [next(x["score"] for x in e if x["label"] == n)
        for n in labels]) for e in json.load(open(sys.argv[2]))]
out = {o["name"]: o["data"] for o in json.load(open(sys.argv[3]))["outputs"]}
k = len(labels)
oip = [(lab, layer, out["probabilities"][i * k: (i + 1) * k])
       for i, (lab, layer) in enumerate(zip(out["label"], out["exit_layer"]))]
for name, got in [("/predict", tei), ("infer", oip)]:
    assert [g[:2] for g in got] == [o[:2] for o in ours], f"{name} {got} != acl-predict {ours}"
    gap = max(abs(a - b) for g, o in zip(got, ours) for a, b in zip(g[2], o[2]))
    assert gap <= 1e-5, f"{name}: probabilities differ from acl-predict's by {gap:.2e}"
print(f"[serving-env] acl-serve --precision {sys.argv[4]}: /predict and OIP infer give acl-predict's labels, exit "
      "layers and probabilities (to 1e-5); exit 0 on SIGTERM")
PY
}
for precision in "${precisions[@]}"; do
  serve_check "$precision"
done
say "ok"
