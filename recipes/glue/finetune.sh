#!/usr/bin/env bash
# Fine-tune RoBERTa on one GLUE task with one method, fairseq's GLUE recipe plus this plugin's criteria.
#
#   recipes/glue/finetune.sh TASK METHOD [--dry-run] [--fresh] [extra fairseq-train flags...]
#   recipes/glue/<TASK>.sh METHOD [--dry-run] [--fresh] [extra fairseq-train flags...]
#
# Steps: look the task up in hparams.tsv and the method in methods.tsv; fetch roberta.$MODEL if it is
# missing; check that data and checkpoint exist; run fairseq-train (log tee'd to train.log, TensorBoard
# under $OUT_ROOT/tb/TASK/METHOD/seedS); for multi-exit methods run acl-evaluate on the best checkpoint;
# write $OUT_ROOT/runs/TASK/METHOD/seedS/result.json. Extra flags go last, so they override the table.
# A run of the same command that was killed before its end is resumed from its checkpoint_last.pt
# (--fresh or FRESH=1 starts over). The architecture, model and layout flags come from acl_fairseq/cli/recipe.py.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SEED="${SEED:-1}"                                  # random seed; runs land in .../seed$SEED
MODEL="${MODEL:-base}"                             # pretrained RoBERTa size: base | large
MODEL_DIR="${MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/acl_fairseq}"  # holds roberta.$MODEL/ (downloaded if missing)
ROBERTA_PATH="${ROBERTA_PATH:-}"                   # checkpoint to start from; default $MODEL_DIR/roberta.$MODEL/model.pt
RESTORE="${RESTORE:-}"                             # "none": start from random weights (tiny smoke runs only)
ARCH="${ARCH:-}"                                   # fairseq --arch; default from MODEL and the method's exits
MODEL_ARGS="${MODEL_ARGS:-}"                       # extra model flags; default: model_args.txt next to ROBERTA_PATH
EXIT_LAYERS="${EXIT_LAYERS:-}"                     # multi_exit_roberta: --exit-layers; empty = every layer (single-exit methods: the top one)
EXIT_POOLING="${EXIT_POOLING:-}"                   # multi_exit_roberta: --exit-pooling cls | mean; empty = the model's default
DATA_ROOT="${DATA_ROOT:-$REPO/data-bin}"           # holds one binarized folder per task, <TASK>-bin
DATA_BIN="${DATA_BIN:-}"                           # this task's binarized data; default $DATA_ROOT/<TASK>-bin
OUT_ROOT="${OUT_ROOT:-$REPO/runs/glue}"            # output root: runs/TASK/METHOD/seedS and tb/TASK/METHOD/seedS
LR="${LR:-}"                                       # peak learning rate; default the table's
BATCH_SIZE="${BATCH_SIZE:-}"                       # sentences per batch; default the table's (updates not rescaled)
MAX_EPOCH="${MAX_EPOCH:-10}"                       # fairseq's recipe: 10 epochs
TOTAL_UPDATES="${TOTAL_UPDATES:-}"                 # override the table's total updates (LR schedule length)
WARMUP_UPDATES="${WARMUP_UPDATES:-}"               # override warm-up; default the table's, or 6 % of TOTAL_UPDATES
MAX_POSITIONS="${MAX_POSITIONS:-512}"              # longest input in tokens (RoBERTa: 512)
MAX_TOKENS="${MAX_TOKENS:-4400}"                   # fairseq's recipe: at most 4400 tokens per batch
LOG_INTERVAL="${LOG_INTERVAL:-200}"                # updates between train_inner log lines
DEVICE="${DEVICE:-auto}"                           # auto | cuda | cpu (auto: cuda when nvidia-smi lists a GPU; gpu = cuda)
OPTIMIZER="${OPTIMIZER:-adamw_torch}"              # adamw_torch (fused torch AdamW, the same update as fairseq's adam) | adam
FP16="${FP16:-auto}"                               # auto (on when running on a GPU) | 1 | 0
NUM_GPUS="${NUM_GPUS:-1}"                          # GPUs per run; the recipe's batch sizes are for one GPU
EVAL_ARGS="${EVAL_ARGS:-}"                         # extra acl-evaluate flags (multi-exit methods)
PREDICT_TEST="${PREDICT_TEST:-0}"                  # 1: acl-evaluate also writes GLUE test-set predictions
FORCE="${FORCE:-0}"                                # 1: rerun even if result.json exists (default: skip done runs)
DOWNLOAD="${DOWNLOAD:-1}"                          # 0: never download roberta.$MODEL, fail instead
DRY_RUN="${DRY_RUN:-0}"                            # 1 (or --dry-run): print the commands, run nothing
FRESH="${FRESH:-0}"                                # 1 (or --fresh): start over, even where the same command left checkpoint_last.pt to resume from
FAIRSEQ_TRAIN="${FAIRSEQ_TRAIN:-fairseq-train}"    # the fairseq-train executable
ACL_EVALUATE="${ACL_EVALUATE:-acl-evaluate}"       # the early-exit evaluation executable
PYTHON="${PYTHON:-python3}"                        # runs write_result.py (standard library only)

usage() {
  cat >&2 <<EOF
usage: recipes/glue/finetune.sh TASK METHOD [--dry-run] [--fresh] [extra fairseq-train flags...]
   or: recipes/glue/<TASK>.sh METHOD [--dry-run] [--fresh] [extra fairseq-train flags...]
  TASK:    $(known_tasks)
  METHOD:  $(known_methods)
  Contrastive methods need class labels: STS-B (regression) runs ce / multi_exit_ce only.
  Settings come from the environment (SEED, MODEL, ROBERTA_PATH, RESTORE, ARCH, MODEL_ARGS, DATA_ROOT,
  DATA_BIN, OUT_ROOT, MAX_EPOCH, TOTAL_UPDATES, DEVICE, FP16, ...): see the top of recipes/glue/finetune.sh.
EOF
  exit "${1:-2}"
}

# ---- arguments ---------------------------------------------------------------------------------------
args=()
for a in "$@"; do
  case "$a" in
    --dry-run) DRY_RUN=1 ;;
    --fresh) FRESH=1 ;;
    *) args+=("$a") ;;
  esac
done
set -- "${args[@]+"${args[@]}"}"
case "${1:-} ${2:-}" in  # -h in the TASK or METHOD place (CoLA.sh -h); later ones go to fairseq-train
  "-h "* | "--help "* | *" -h" | *" --help") usage 0 ;;
esac
[[ $# -ge 2 ]] || usage 2
TASK="$1"
METHOD="$2"
shift 2

load_task "$TASK" || { echo "error: unknown task '$TASK'" >&2; usage 2; }
load_method "$METHOD" "$TASK" || { echo "error: unknown method '$METHOD'" >&2; usage 2; }
if [[ "$REGRESSION" == 1 ]] && is_contrastive "$CRITERION"; then
  die "$TASK is a regression task (--regression-target) and method '$METHOD' uses the contrastive criterion \
'$CRITERION', which needs class labels; run 'ce' (sentence_ce) or 'multi_exit_ce' on $TASK." 2
fi
[[ "$MODEL" == base || "$MODEL" == large ]] || die "MODEL must be base or large, not '$MODEL'" 2
[[ "$DEVICE" != gpu ]] || DEVICE=cuda  # the old spelling
[[ "$DEVICE" =~ ^(auto|cuda|cpu)$ ]] || die "DEVICE must be auto, cuda or cpu, not '$DEVICE'" 2
[[ "$FP16" =~ ^(auto|0|1)$ ]] || die "FP16 must be auto, 0 or 1, not '$FP16'" 2

# ---- derived settings --------------------------------------------------------------------------------
DATA_BIN="${DATA_BIN:-$DATA_ROOT/$TASK-bin}"
RUN_DIR="$OUT_ROOT/runs/$TASK/$METHOD/seed$SEED"
TB_DIR="$OUT_ROOT/tb/$TASK/$METHOD/seed$SEED"
IFS=',' read -r -a SUBSETS <<<"$VALID_SUBSETS"

for v in SEED MAX_EPOCH TOTAL_UPDATES WARMUP_UPDATES BATCH_SIZE NUM_GPUS; do
  [[ "${!v}" =~ ^[0-9]*$ ]] || die "$v must be a whole number, not '${!v}'" 2
done
LR="${LR:-$T_LR}"
BATCH_SIZE="${BATCH_SIZE:-$T_BATCH_SIZE}"
if [[ -n "$TOTAL_UPDATES" ]]; then
  WARMUP_UPDATES="${WARMUP_UPDATES:-$(( (TOTAL_UPDATES * 6 + 99) / 100 ))}"  # the recipe's 6 %, rounded up
else
  TOTAL_UPDATES="$T_TOTAL_UPDATES"
  WARMUP_UPDATES="${WARMUP_UPDATES:-$T_WARMUP_UPDATES}"
fi

DEFAULT_ROBERTA="$MODEL_DIR/roberta.$MODEL/model.pt"
if [[ "$RESTORE" == none ]]; then
  ROBERTA_PATH=""
elif [[ -n "$RESTORE" ]]; then
  die "RESTORE must be empty or 'none', not '$RESTORE' (set ROBERTA_PATH to choose a checkpoint)" 2
else
  ROBERTA_PATH="${ROBERTA_PATH:-$DEFAULT_ROBERTA}"
fi

# The architecture, model flags and input layout are decided in Python (acl_fairseq/cli/recipe.py, which
# owns the rules: model_args.txt and conventions.json beside the checkpoint, exits, sizes); -S: it needs
# only the standard library, so the plugin's import does not load fairseq.
decided="$(PYTHONPATH="$REPO" "$PYTHON" -S -m acl_fairseq.cli.recipe model \
  --model "$MODEL" --exits "$EXITS" --method "$METHOD" --arch "$ARCH" --model-args "$MODEL_ARGS" \
  --checkpoint "$ROBERTA_PATH" --exit-layers "$EXIT_LAYERS" --exit-pooling "$EXIT_POOLING")" || exit $?
layout_args=()
model_args=()
while IFS=$'\t' read -r group word; do
  case "$group" in
    arch) ARCH="$word" ;;
    task) layout_args+=("$word") ;;
    model) model_args+=("$word") ;;
  esac
done <<<"$decided"

if [[ "$DEVICE" == auto ]]; then
  if has_gpu; then DEVICE=cuda; else DEVICE=cpu; fi
fi
if [[ "$FP16" == auto ]]; then
  if [[ "$DEVICE" == cuda ]]; then FP16=1; else FP16=0; fi
fi
device_args=(--distributed-world-size "$NUM_GPUS")
if [[ "$DEVICE" == cpu ]]; then
  device_args=(--cpu --distributed-world-size 1)
  [[ "$FP16" == 1 ]] && die "FP16=1 needs a GPU (DEVICE=cpu)" 2
fi
if [[ "$FP16" == 1 ]]; then  # fairseq's recipe: fp16 with a small initial loss scale
  device_args+=(--fp16 --fp16-init-scale 4 --threshold-loss-scale 1 --fp16-scale-window 128)
fi

restore_args=()
if [[ -n "$ROBERTA_PATH" ]]; then
  restore_args=(--restore-file "$ROBERTA_PATH" --reset-optimizer --reset-dataloader --reset-meters)
fi
task_args=()
if [[ "$REGRESSION" == 1 ]]; then
  task_args=(--regression-target)
fi

# ---- the commands ------------------------------------------------------------------------------------
train_head=("$FAIRSEQ_TRAIN" "$DATA_BIN" --user-dir "$REPO/acl_fairseq")
train_rest=(
  --task sentence_prediction_acl "${layout_args[@]+"${layout_args[@]}"}" --num-classes "$NUM_CLASSES"
  "${task_args[@]+"${task_args[@]}"}"
  --max-positions "$MAX_POSITIONS" --batch-size "$BATCH_SIZE" --max-tokens "$MAX_TOKENS"
  --required-batch-size-multiple 1
  "${model_args[@]}"
  --criterion "$CRITERION" "${METHOD_FLAGS[@]+"${METHOD_FLAGS[@]}"}"
  --dropout 0.1 --attention-dropout 0.1 --weight-decay 0.1
  --optimizer "$OPTIMIZER" --adam-betas "(0.9,0.98)" --adam-eps 1e-06 --clip-norm 0.0
  --lr-scheduler polynomial_decay --lr "$LR"
  --total-num-update "$TOTAL_UPDATES" --max-update "$TOTAL_UPDATES" --warmup-updates "$WARMUP_UPDATES"
  --max-epoch "$MAX_EPOCH" --seed "$SEED" --find-unused-parameters
  --valid-subset "$VALID_SUBSETS"
  --best-checkpoint-metric "$BEST_METRIC" --maximize-best-checkpoint-metric
  --save-dir "$RUN_DIR" --no-epoch-checkpoints
  --tensorboard-logdir "$TB_DIR" --log-format json --log-interval "$LOG_INTERVAL"
  "${device_args[@]}"
  "$@"
)
train_cmd=("${train_head[@]}" "${restore_args[@]+"${restore_args[@]}"}" "${train_rest[@]}")
# the run's command as command.sh records it: a later call with the same line may resume the run
train_line="$(quote_cmd "${train_cmd[@]}") 2>&1 | tee $(quote_cmd "$RUN_DIR/train.log")"

eval_cmds=()  # one quoted acl-evaluate line per validation subset (multi-exit methods only)
early_exit_args=()
if [[ "$EXITS" == multi ]]; then
  read -r -a eval_extra <<<"$EVAL_ARGS"
  for i in "${!SUBSETS[@]}"; do
    subset="${SUBSETS[$i]}"
    out="$RUN_DIR/early_exit"
    ((i > 0)) && out="$RUN_DIR/early_exit_$subset"
    cmd=("$ACL_EVALUATE" "$RUN_DIR/checkpoint_best.pt" "$DATA_BIN" --out-dir "$out" --split "$subset"
      --task-name "$TASK" --tensorboard-logdir "$TB_DIR/early_exit_$subset")
    if [[ "$PREDICT_TEST" == 1 && "$i" == 0 ]]; then  # test splits pair with the valid ones: test, test1, ...
      cmd+=(--test-split "${SUBSETS[@]/#valid/test}" --predictions-dir "$RUN_DIR/predictions")
    fi
    cmd+=(--device "$DEVICE")
    cmd+=("${eval_extra[@]+"${eval_extra[@]}"}")
    eval_cmds+=("$(quote_cmd "${cmd[@]}")")
    early_exit_args+=(--early-exit "$subset=${out#"$RUN_DIR"/}/early_exit.json")
  done
fi

result_cmd=("$PYTHON" "$GLUE_DIR/write_result.py" "$RUN_DIR" --task "$TASK" --method "$METHOD" --seed "$SEED"
  --criterion "$CRITERION" --arch "$ARCH" --best-metric "$BEST_METRIC" --valid-subsets "$VALID_SUBSETS"
  "${early_exit_args[@]+"${early_exit_args[@]}"}")

# ---- checks before anything runs --------------------------------------------------------------------
# check_data: the binarized folders fairseq's sentence_prediction task reads; prints what is missing.
check_data() {
  local missing=() f subset
  for f in input0/dict.txt input0/train.idx; do
    [[ -f "$DATA_BIN/$f" ]] || missing+=("$DATA_BIN/$f")
  done
  for subset in "${SUBSETS[@]}"; do
    [[ -f "$DATA_BIN/input0/$subset.idx" ]] || missing+=("$DATA_BIN/input0/$subset.idx")
  done
  if [[ "$REGRESSION" == 1 ]]; then
    [[ -f "$DATA_BIN/label/train.label" ]] || missing+=("$DATA_BIN/label/train.label")
  else
    [[ -f "$DATA_BIN/label/dict.txt" ]] || missing+=("$DATA_BIN/label/dict.txt")
  fi
  ((${#missing[@]} == 0)) || printf '%s\n' "${missing[@]}"
}

missing_data="$(check_data)"
need_download=0
missing_checkpoint=""
if [[ -n "$ROBERTA_PATH" && ! -f "$ROBERTA_PATH" ]]; then
  if [[ "$ROBERTA_PATH" == "$DEFAULT_ROBERTA" && "$DOWNLOAD" == 1 ]]; then
    need_download=1
  else
    missing_checkpoint="checkpoint not found: $ROBERTA_PATH (fairseq would silently train from random \
weights). Set ROBERTA_PATH to an existing model.pt, unset it to download roberta.$MODEL into MODEL_DIR, \
or set RESTORE=none to train from scratch on purpose."
  fi
fi
download_cmd=("$REPO/recipes/download_roberta.sh" "$MODEL" "$MODEL_DIR")

# Resume: the same command, killed before its end (no result.json), left checkpoint_last.pt; fairseq
# continues from it exactly (weights, optimizer, schedule, data order) when it is the restore file and
# nothing is reset. The log is appended to, so that result.json sees every validation.
RESUME=0
if [[ "$FRESH" != 1 && -f "$RUN_DIR/checkpoint_last.pt" && ! -f "$RUN_DIR/result.json" ]] &&
  grep -qxF -- "$train_line" "$RUN_DIR/command.sh" 2>/dev/null; then
  RESUME=1
  train_cmd=("${train_head[@]}" --restore-file "$RUN_DIR/checkpoint_last.pt" "${train_rest[@]}")
fi

if [[ "$DRY_RUN" == 1 ]]; then
  note "dry run: $TASK / $METHOD / seed $SEED, nothing is executed"
  [[ -z "$missing_data" ]] || note "data missing (a real run would stop): $(echo "$missing_data" | tr '\n' ' ')"
  [[ -z "$missing_checkpoint" ]] || note "a real run would stop: $missing_checkpoint"
  [[ -n "$ROBERTA_PATH" ]] || note "RESTORE=none: random initialization"
  [[ ! -f "$RUN_DIR/result.json" || "$FORCE" == 1 ]] || note "$RUN_DIR/result.json exists: a real run would skip"
  ((RESUME == 0)) || note "a real run would resume from $RUN_DIR/checkpoint_last.pt (FRESH=1 starts over)"
  ((need_download)) && quote_cmd "${download_cmd[@]}"
  printf '%s 2>&1 | tee %s%s\n' "$(quote_cmd "${train_cmd[@]}")" "$( ((RESUME)) && echo '-a ')" \
    "$(quote_cmd "$RUN_DIR/train.log")"
  for c in "${eval_cmds[@]+"${eval_cmds[@]}"}"; do printf '%s\n' "$c"; done
  quote_cmd "${result_cmd[@]}"
  exit 0
fi

if [[ -f "$RUN_DIR/result.json" && "$FORCE" != 1 ]]; then
  note "$RUN_DIR/result.json exists: skipping (FORCE=1 reruns)"
  exit 0
fi
[[ -z "$missing_data" ]] || die "binarized data for $TASK not found:
$missing_data
Binarize it first (python preprocess/glue.py --task $TASK --input GLUE_DIR/$TASK --output $DATA_BIN),
or point DATA_ROOT (the folder of <TASK>-bin folders) or DATA_BIN at existing data."
[[ -z "$missing_checkpoint" ]] || die "$missing_checkpoint"
command -v "$FAIRSEQ_TRAIN" >/dev/null || die "'$FAIRSEQ_TRAIN' not found: activate the environment or set FAIRSEQ_TRAIN"
if [[ "$EXITS" == multi ]]; then
  command -v "$ACL_EVALUATE" >/dev/null || die "'$ACL_EVALUATE' not found: install this package (pip install -e .) or set ACL_EVALUATE"
fi
if ((need_download)); then
  note "roberta.$MODEL not found at $ROBERTA_PATH: downloading it into $MODEL_DIR"
  "${download_cmd[@]}"
  [[ -f "$ROBERTA_PATH" ]] || die "download finished but $ROBERTA_PATH is still missing"
fi
if [[ -n "$ROBERTA_PATH" && -f "$(dirname "$ROBERTA_PATH")/dict.txt" ]] &&
  ! cmp -s "$(dirname "$ROBERTA_PATH")/dict.txt" "$DATA_BIN/input0/dict.txt"; then
  note "warning: $DATA_BIN/input0/dict.txt differs from the checkpoint's dict.txt (fairseq#1048: size mismatch)"
fi

# ---- run ---------------------------------------------------------------------------------------------
mkdir -p "$RUN_DIR" "$TB_DIR"
log_start=0  # train.log lines of the run(s) before this one
if ((RESUME)); then
  note "resuming from $RUN_DIR/checkpoint_last.pt, left by the same command (FRESH=1 starts over)"
  log_start="$(wc -l <"$RUN_DIR/train.log" 2>/dev/null || echo 0)"
elif [[ -f "$RUN_DIR/checkpoint_last.pt" ]]; then
  note "an earlier run left $RUN_DIR/checkpoint_last.pt: this run starts again from the start \
($([[ "$FRESH" == 1 ]] && echo FRESH=1 || echo "another command, or a finished run"))"
  # without --restore-file fairseq would resume from it; with one it is overwritten after epoch 1 anyway
  [[ -n "$ROBERTA_PATH" ]] || rm -f "$RUN_DIR/checkpoint_last.pt"
fi
{
  echo "#!/usr/bin/env bash"
  echo "# $TASK / $METHOD / seed $SEED, written by recipes/glue/finetune.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  ((RESUME == 0)) || echo "# resumed: fairseq-train ran with --restore-file $(quote_cmd "$RUN_DIR/checkpoint_last.pt") and no resets"
  echo "cd $(quote_cmd "$REPO")"
  printf '%s\n' "$train_line"
  for c in "${eval_cmds[@]+"${eval_cmds[@]}"}"; do printf '%s\n' "$c"; done
  quote_cmd "${result_cmd[@]}"
} >"$RUN_DIR/command.sh"
{
  git -C "$REPO" rev-parse HEAD 2>/dev/null || echo "unknown (not a git checkout)"
  git -C "$REPO" diff --quiet HEAD -- 2>/dev/null || echo "uncommitted changes present"
} >"$RUN_DIR/git_head.txt"
rm -f "$RUN_DIR/result.json"

note "$TASK / $METHOD / seed $SEED -> $RUN_DIR"
[[ -n "$ROBERTA_PATH" ]] || note "RESTORE=none: training from random initialization"
note "$(quote_cmd "${train_cmd[@]}")"
tee_args=()
((RESUME == 0)) || tee_args=(-a)
"${train_cmd[@]}" 2>&1 | tee "${tee_args[@]+"${tee_args[@]}"}" "$RUN_DIR/train.log"

[[ -f "$RUN_DIR/checkpoint_best.pt" ]] || die "training ended without $RUN_DIR/checkpoint_best.pt (see train.log)"
restored="$( ((RESUME)) && echo "$RUN_DIR/checkpoint_last.pt" || echo "$ROBERTA_PATH")"
if [[ -n "$restored" ]] &&
  ! awk -v s="$log_start" 'NR > s && /Loaded checkpoint/ {found = 1} END {exit !found}' "$RUN_DIR/train.log"; then
  die "train.log does not say 'Loaded checkpoint $restored': the run may have started from random weights"
fi
for c in "${eval_cmds[@]+"${eval_cmds[@]}"}"; do
  note "$c"
  eval "$c"
done
"${result_cmd[@]}"
