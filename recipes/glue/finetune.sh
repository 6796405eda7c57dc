#!/usr/bin/env bash
# Fine-tune RoBERTa on one GLUE task with one method, fairseq's GLUE recipe plus this plugin's criteria.
#
#   recipes/glue/finetune.sh TASK METHOD [--dry-run] [--fresh] [extra fairseq-train flags...]
#   recipes/glue/<TASK>.sh METHOD [--dry-run] [--fresh] [extra fairseq-train flags...]
#
# The run plan (acl_fairseq/cli/plan.py) decides everything: the task's row of hparams.tsv and the method's
# of methods.tsv, the checks of the settings, the commands, whether to resume. This script runs it: fetch
# roberta.$MODEL if it is missing, run fairseq-train (log tee'd to train.log, TensorBoard under
# $OUT_ROOT/tb/TASK/METHOD/seedS), acl-evaluate for multi-exit methods, then write
# $OUT_ROOT/runs/TASK/METHOD/seedS/result.json. Extra flags go last, so they override the table. A run of the
# same command that was killed before its end is resumed from its checkpoint_last.pt (--fresh or FRESH=1
# starts over).
#
# Settings (environment; defaults and meaning in acl_fairseq/cli/plan.py SETTINGS and recipes/README.md):
#   SEED MODEL MODEL_DIR ROBERTA_PATH RESTORE ARCH MODEL_ARGS EXIT_LAYERS EXIT_POOLING DATA_ROOT DATA_BIN
#   OUT_ROOT LR BATCH_SIZE MAX_EPOCH TOTAL_UPDATES WARMUP_UPDATES MAX_POSITIONS MAX_TOKENS LOG_INTERVAL DEVICE
#   OPTIMIZER FP16 NUM_GPUS EVAL_ARGS PREDICT_TEST FORCE DOWNLOAD DRY_RUN FRESH FAIRSEQ_TRAIN ACL_EVALUATE
#   PYTHON HPARAMS_TABLE METHODS_TABLE
# shellcheck disable=SC2154  # the plan's variables are set by eval
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# a dry run or --help prints and exits inside the plan's code; a real run gets the plan's variables
code="$(plan_shell finetune "$@")" || exit $?
eval "$code"

if [[ "$SKIP" == 1 ]]; then
  note "$RUN_DIR/result.json exists: skipping (FORCE=1 reruns)"
  exit 0
fi
for stop in "${stops[@]+"${stops[@]}"}"; do die "$stop"; done
command -v "$FAIRSEQ_TRAIN" >/dev/null || die "'$FAIRSEQ_TRAIN' not found: activate the environment or set FAIRSEQ_TRAIN"
if [[ "$MULTI" == 1 ]]; then
  command -v "$ACL_EVALUATE" >/dev/null || die "'$ACL_EVALUATE' not found: install this package (pip install -e .) or set ACL_EVALUATE"
fi
if [[ -n "$download_note" ]]; then
  note "$download_note"
  "${download_cmd[@]}"
  [[ -f "$ROBERTA_PATH" ]] || die "download finished but $ROBERTA_PATH is still missing"
  code="$(plan_shell finetune "$@")" || exit $?  # again, now that the checkpoint (and its dict.txt) is there
  eval "$code"
fi
[[ -z "$dict_warning" ]] || note "$dict_warning"

# ---- run ---------------------------------------------------------------------------------------------
mkdir -p "$RUN_DIR" "$TB_DIR"
log_start=0  # train.log lines of the run(s) before this one
[[ -z "$start_note" ]] || note "$start_note"
if [[ "$RESUME" == 1 ]]; then
  log_start="$(wc -l <"$RUN_DIR/train.log" 2>/dev/null || echo 0)"
elif [[ "$drop_last" == 1 ]]; then
  rm -f "$RUN_DIR/checkpoint_last.pt"
fi
{
  echo "#!/usr/bin/env bash"
  echo "# $TASK / $METHOD / seed $SEED, written by recipes/glue/finetune.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  printf '%s\n' "${record_lines[@]}"
} >"$RUN_DIR/command.sh"
{
  git -C "$REPO" rev-parse HEAD 2>/dev/null || echo "unknown (not a git checkout)"
  git -C "$REPO" diff --quiet HEAD -- 2>/dev/null || echo "uncommitted changes present"
} >"$RUN_DIR/git_head.txt"
rm -f "$RUN_DIR/result.json"

note "$TASK / $METHOD / seed $SEED -> $RUN_DIR"
[[ -n "$ROBERTA_PATH" ]] || note "RESTORE=none: training from random initialization"
note "$train_shown"
tee_args=()
[[ "$RESUME" != 1 ]] || tee_args=(-a)
"${train_cmd[@]}" 2>&1 | tee "${tee_args[@]+"${tee_args[@]}"}" "$RUN_DIR/train.log"

[[ -f "$RUN_DIR/checkpoint_best.pt" ]] || die "training ended without $RUN_DIR/checkpoint_best.pt (see train.log)"
if [[ -n "$restored" ]] &&
  ! awk -v s="$log_start" 'NR > s && /Loaded checkpoint/ {found = 1} END {exit !found}' "$RUN_DIR/train.log"; then
  die "train.log does not say 'Loaded checkpoint $restored': the run may have started from random weights"
fi
for c in "${eval_cmds[@]+"${eval_cmds[@]}"}"; do
  note "$c"
  eval "$c"
done
"${result_cmd[@]}"
