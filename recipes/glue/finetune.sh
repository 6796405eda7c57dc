#!/usr/bin/env bash
# Fine-tune RoBERTa on one GLUE task with one method, fairseq's GLUE recipe plus this plugin's criteria.
#
#   recipes/glue/finetune.sh TASK METHOD [--dry-run] [--fresh] [extra fairseq-train flags...]
#   recipes/glue/<TASK>.sh METHOD [--dry-run] [--fresh] [extra fairseq-train flags...]
#
# The run plan (acl_fairseq/runs/plan.py) decides everything: the task's row of hparams.tsv and the method's
# of methods.tsv, the checks of the settings, the commands, whether to resume. The runner
# (acl_fairseq/runs/runner.py) runs it: fetch roberta.$MODEL if it is missing, run fairseq-train (log kept in
# train.log, TensorBoard under $OUT_ROOT/tb/TASK/METHOD/seedS), acl-evaluate for multi-exit methods, then write
# $OUT_ROOT/runs/TASK/METHOD/seedS/result.json. Extra flags go last, so they override the table. A run of the
# same command that was killed before its end is resumed from its checkpoint_last.pt (--fresh or FRESH=1
# starts over).
#
# Settings (environment; defaults and meaning in acl_fairseq/runs/plan.py SETTINGS and recipes/README.md):
#   SEED MODEL MODEL_DIR ROBERTA_PATH RESTORE ARCH MODEL_ARGS EXIT_LAYERS EXIT_POOLING DATA_ROOT DATA_BIN
#   OUT_ROOT LR BATCH_SIZE MAX_EPOCH TOTAL_UPDATES WARMUP_UPDATES MAX_POSITIONS MAX_TOKENS LOG_INTERVAL DEVICE
#   OPTIMIZER FP16 BF16 COMPILE NUM_GPUS EVAL_ARGS PREDICT_TEST FORCE DOWNLOAD DRY_RUN FRESH FAIRSEQ_TRAIN ACL_EVALUATE
#   PYTHON HPARAMS_TABLE METHODS_TABLE
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
runner finetune "$@"
