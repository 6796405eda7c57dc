#!/usr/bin/env bash
# Tasks x methods x seeds: the runner's loop over the fine-tuning runs, then the results table.
#
#   TASKS="RTE MRPC" METHODS="ce acl_embed" SEEDS="1 2 3" recipes/glue/sweep.sh [--dry-run] [extra fairseq flags...]
#
# The run plan (acl_fairseq/runs/plan.py) checks the names and skips the pairs it refuses (contrastive methods
# on STS-B, a regression task). Runs with a result.json are skipped (FORCE=1 reruns them).
# Every other setting (MODEL, OUT_ROOT, DATA_ROOT, ...) passes through the environment to each run.
#   TASKS    GLUE tasks to run, space-separated (default: every row of hparams.tsv)
#   METHODS  methods to run (see methods.tsv; default: ce scl acl_embed acl_grad)
#   SEEDS    seeds (default: 1 2 3 4 5; the RoBERTa paper reports the median of 5)
#   KEEP_GOING  1: carry on after a failed run, list failures at the end (default 0)
#   COLLECT     0: do not write the results table ($OUT_ROOT/results.md) at the end (default 1)
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
runner sweep "$@"
