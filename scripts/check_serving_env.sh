#!/usr/bin/env bash
# The serving install, checked: a fresh virtual environment with the serve extra's pins only (numpy, onnxruntime,
# tokenizers, starlette, uvicorn, prometheus-client; setup.py SERVE_REQUIRES) and this package installed with
# --no-deps, so that torch and fairseq are absent (not blocked). acl-predict OUT/onnx must classify in it, with the
# labels and exit layers that the full environment gives on the same folder (and on the checkpoint it was exported
# from, when built here); acl-serve must start on the folder, answer /v2/health/ready, one /predict and one Open
# Inference Protocol infer with those same labels and exit layers, and exit 0 on SIGTERM.
#
# Usage: scripts/check_serving_env.sh [OUT/onnx]
#   OUT/onnx: a folder acl-export wrote (e.g. make demo's demo_out/export/onnx). Without it, a tiny model is
#   trained and exported with the full environment ($VENV, default .venv) first; nothing is exported in the
#   serving environment itself. Everything else lives in a temporary folder, removed at the end.
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
  read -r -a layout_flags <<<"$(PYTHONPATH="$ROOT" "$VENV/bin/python" -S -m acl_fairseq.recipes.model_flags flags)"
  "$VENV/bin/fairseq-train" "$WORK/data" --user-dir "$ROOT/acl_fairseq" --task sentence_prediction_acl \
    "${layout_flags[@]}" --num-classes 2 --arch multi_exit_roberta --encoder-layers 3 --encoder-embed-dim 16 \
    --encoder-ffn-embed-dim 32 --encoder-attention-heads 2 --max-positions 64 --criterion sentence_ce \
    --optimizer adam --lr 1e-3 --batch-size 16 --max-epoch 1 --cpu --num-workers 0 --no-progress-bar \
    --save-dir "$WORK/ckpt" --no-epoch-checkpoints >"$WORK/train.log" 2>&1 || { tail -20 "$WORK/train.log"; exit 1; }
  CKPT="$WORK/ckpt/checkpoint_best.pt"
  "$VENV/bin/acl-export" "$CKPT" --data "$WORK/data" --out "$WORK/export" --format onnx --metrics-split none >/dev/null
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
# shellcheck disable=SC2086  # the pins are separate words
"${PIP[@]}" install $pins
"${PIP[@]}" install --no-deps -e "$ROOT"  # after the pins: pip then has no resolver run to warn from
"$WORK/serve/bin/python" - <<'PY'
import importlib.util
present = [m for m in ("torch", "fairseq") if importlib.util.find_spec(m) is not None]
assert not present, f"the serving environment should not have {present}"
PY
say "installed: $pins; torch and fairseq absent"

printf '%s\n' "the music was really brilliant" "the plot was not clever , honestly" >"$WORK/two.txt"
flags=(--input "$WORK/two.txt" --format tsv --policy entropy --threshold 0.3)
t0=$SECONDS
"$WORK/serve/bin/acl-predict" "$FOLDER" "${flags[@]}" --output "$WORK/serve.tsv"
say "acl-predict OUT/onnx in the serving environment: $((SECONDS - t0))s"
cat "$WORK/serve.tsv"
"$VENV/bin/acl-predict" "$FOLDER" "${flags[@]}" --output "$WORK/full.tsv" 2>/dev/null
refs=("$WORK/full.tsv")
if [[ -n "$CKPT" ]]; then
  "$VENV/bin/acl-predict" "$CKPT" --data "$WORK/data" "${flags[@]}" --device cpu --output "$WORK/ckpt.tsv" 2>/dev/null
  refs+=("$WORK/ckpt.tsv")
fi
"$VENV/bin/python" - "$WORK/serve.tsv" "${refs[@]}" <<'PY'
import csv, sys
ours, *theirs = ([(r["id"], r["label"], r["exit_layer"]) for r in csv.DictReader(open(p), delimiter="\t")]
                 for p in sys.argv[1:])
assert len(ours) == 2, ours
for path, rows in zip(sys.argv[2:], theirs):
    assert rows == ours, f"{path}: {rows} != {ours}"
print(f"[serving-env] same ids, labels and exit layers as {len(theirs)} reference run(s)")
PY

if [[ -n "$CKPT" ]]; then  # a checkpoint needs the training install: one line that says so, exit 2
  status=0
  "$WORK/serve/bin/acl-predict" "$CKPT" --data "$WORK/data" "${flags[@]}" 2>"$WORK/ckpt.err" >/dev/null || status=$?
  grep -q "a checkpoint needs torch" "$WORK/ckpt.err" && [[ $status -eq 2 ]] ||
    { cat "$WORK/ckpt.err"; echo "acl-predict CHECKPOINT without torch: expected exit 2 naming torch, got $status" >&2; exit 1; }
  say "acl-predict CHECKPOINT without torch: $(tail -1 "$WORK/ckpt.err")"
fi

port="$("$WORK/serve/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
url="http://127.0.0.1:$port"
t0=$SECONDS
"$WORK/serve/bin/acl-serve" "$FOLDER" --port "$port" --policy entropy --threshold 0.3 2>"$WORK/serve.log" &
SERVER=$!
until curl -sf -o /dev/null "$url/v2/health/ready"; do
  kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/serve.log"; echo "acl-serve did not start" >&2; exit 1; }
  sleep 0.1
done
say "acl-serve ready in the serving environment: $((SECONDS - t0))s"
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
"$VENV/bin/python" - "$WORK/serve.tsv" "$WORK/predict.json" "$WORK/infer.json" <<'PY'
import csv, json, sys
ours = [(r["label"], int(r["exit_layer"])) for r in csv.DictReader(open(sys.argv[1]), delimiter="\t")]
tei = [(entries[0]["label"], entries[0]["exit_layer"]) for entries in json.load(open(sys.argv[2]))]
out = {o["name"]: o["data"] for o in json.load(open(sys.argv[3]))["outputs"]}
assert tei == ours, f"/predict {tei} != acl-predict {ours}"
assert list(zip(out["label"], out["exit_layer"])) == ours, f"infer {out} != acl-predict {ours}"
print("[serving-env] acl-serve's /predict and OIP infer give acl-predict's labels and exit layers; exit 0 on SIGTERM")
PY
say "ok"
