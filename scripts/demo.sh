#!/usr/bin/env bash
# The built-in demo: generate a small sentiment task with negations offline, binarize it with
# fairseq-preprocess, fine-tune a small multi-exit RoBERTa from scratch with acl_cross_layer through
# `fairseq-train --user-dir acl_fairseq` on CPU (about two minutes), log to TensorBoard, print the
# validation metric, write the early-exit quality/speed report, then classify two typed sentences
# with acl-predict (label, probabilities and the exit each one left at).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"                  # environment made by scripts/setup_env.sh
OUT="${OUT:-$ROOT/demo_out}"                 # everything the demo writes goes here
CRITERION="${CRITERION:-acl_cross_layer}"    # any registered criterion of the plugin
MAX_EPOCH="${MAX_EPOCH:-4}"                  # epochs over the 4000 training sentences
SEED="${SEED:-1}"                            # training seed
export PATH="$VENV/bin:$PATH" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" PYTHONWARNINGS=ignore

echo "[demo] data: toy sentiment task with negation -> $OUT/data"
rm -rf "$OUT"
python "$ROOT/scripts/toy_data.py" "$OUT/data" --n-train 4000 --n-valid 500 > "$OUT.preprocess.log" 2>&1 \
  || { cat "$OUT.preprocess.log"; exit 1; }
mv "$OUT.preprocess.log" "$OUT/preprocess.log"

# the task flags of RoBERTa's input layout, from the one place that decides it (acl_runtime/conventions.py)
read -r -a layout_flags <<<"$(PYTHONPATH="$ROOT" python -S -m acl_fairseq.runs.model_flags flags)"
echo "[demo] training: multi_exit_roberta (4 layers, dim 64), criterion $CRITERION, $MAX_EPOCH epochs on CPU"
fairseq-train "$OUT/data" --user-dir "$ROOT/acl_fairseq" \
  --task sentence_prediction_acl "${layout_flags[@]}" --num-classes 2 \
  --arch multi_exit_roberta --encoder-layers 4 --encoder-embed-dim 64 --encoder-ffn-embed-dim 128 \
  --encoder-attention-heads 4 --max-positions 64 --dropout 0.1 --attention-dropout 0.1 \
  --criterion "$CRITERION" \
  --optimizer adam --adam-betas "(0.9, 0.98)" --lr 1e-3 --lr-scheduler polynomial_decay \
  --warmup-updates 50 --total-num-update 500 --batch-size 32 --max-epoch "$MAX_EPOCH" \
  --cpu --seed "$SEED" --num-workers 0 \
  --save-dir "$OUT/checkpoints" --no-epoch-checkpoints \
  --best-checkpoint-metric accuracy --maximize-best-checkpoint-metric \
  --tensorboard-logdir "$OUT/tensorboard" --log-format json --log-interval 25 \
  2>&1 | tee "$OUT/train.log" | grep --line-buffered -E '"(train|valid)_loss"|epoch [0-9]+ \|' || true
[[ -f "$OUT/checkpoints/checkpoint_best.pt" ]] || { echo "[demo] training failed: see $OUT/train.log"; tail -20 "$OUT/train.log"; exit 1; }
python - "$OUT/train.log" <<'PY'
import json, sys
rows = [json.loads(l.split("| valid | ", 1)[1]) for l in open(sys.argv[1]) if "| valid | " in l]
last = rows[-1]
exits = {k[len("valid_accuracy_exit"):]: v for k, v in last.items() if k.startswith("valid_accuracy_exit")}
print(f"[demo] validation accuracy (last exit): {last['valid_accuracy']}  best: {last.get('valid_best_accuracy')}")
if exits:
    print("[demo] per-exit validation accuracy (last epoch): " + ", ".join(f"layer {k}: {v}" for k, v in exits.items()))
PY

echo "[demo] early-exit report of the best checkpoint (checkpoint_best.pt) -> $OUT/early_exit"
acl-evaluate "$OUT/checkpoints/checkpoint_best.pt" "$OUT/data" --output "$OUT/early_exit" \
  --tensorboard-logdir "$OUT/tensorboard/early_exit"
echo "[demo] acl-predict: two typed sentences, entropy early exit at threshold 0.3"
printf '%s\n' "the music was really brilliant" "the plot was not clever , honestly" > "$OUT/two.txt"
acl-predict "$OUT/checkpoints/checkpoint_best.pt" --data "$OUT/data" --input "$OUT/two.txt" --policy entropy \
  --threshold 0.3 --format tsv --output "$OUT/two.torch.tsv"
cat "$OUT/two.torch.tsv"
echo "[demo] acl-export: the model as ONNX graphs with an int8 copy -> $OUT/export/onnx"
acl-export "$OUT/checkpoints/checkpoint_best.pt" --data "$OUT/data" --output "$OUT/export" --format onnx \
  --quantize int8 --metrics-split none
echo "[demo] the same two sentences through ONNX Runtime (no torch in the engine)"
acl-predict "$OUT/export/onnx" --input "$OUT/two.txt" --policy entropy --threshold 0.3 --format tsv \
  --output "$OUT/two.onnx.tsv"
cat "$OUT/two.onnx.tsv"
python - "$OUT/two.torch.tsv" "$OUT/two.onnx.tsv" <<'PY'
import csv, sys
torch_rows, onnx_rows = ([(r["label"], r["exit_layer"]) for r in csv.DictReader(open(p), delimiter="\t")] for p in sys.argv[1:])
same = torch_rows == onnx_rows
print(f"[demo] ONNX Runtime against the checkpoint: {'same' if same else 'DIFFERENT'} labels and exit layers")
sys.exit(0 if same else 1)
PY
echo "[demo] done. report: $OUT/early_exit/early_exit.png"
echo "[demo] next: source $VENV/bin/activate   then: tensorboard --logdir $OUT/tensorboard   or: acl-serve $OUT/export/onnx"
