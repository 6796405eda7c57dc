#!/usr/bin/env bash
# Tasks x methods x seeds: a thin loop over recipes/glue/finetune.sh, then the results table.
#
#   TASKS="RTE MRPC" METHODS="ce acl_embed" SEEDS="1 2 3" recipes/glue/sweep.sh [--dry-run] [extra fairseq flags...]
#
# The run plan (acl_fairseq/cli/plan.py) checks the names and skips the pairs it refuses (contrastive methods
# on STS-B, a regression task). Runs with a result.json are skipped by finetune.sh (FORCE=1 reruns them).
# Every other setting (MODEL, OUT_ROOT, DATA_ROOT, ...) passes through the environment to finetune.sh.
#   TASKS    GLUE tasks to run, space-separated (default: every row of hparams.tsv)
#   METHODS  methods to run (see methods.tsv; default: ce scl acl_embed acl_grad)
#   SEEDS    seeds (default: 1 2 3 4 5; the RoBERTa paper reports the median of 5)
# shellcheck disable=SC2154  # runs is set by eval
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

OUT_ROOT="${OUT_ROOT:-$REPO/runs/glue}"            # as in finetune.sh; the table goes to $OUT_ROOT/results.md
KEEP_GOING="${KEEP_GOING:-0}"                      # 1: carry on after a failed run, list failures at the end
COLLECT="${COLLECT:-1}"                            # 0: do not write the results table at the end
PYTHON="${PYTHON:-python3}"                        # runs collect_results.py
export OUT_ROOT

code="$(plan_shell sweep "$@")" || exit $?  # runs=("TASK METHOD SEED" or "#note" ...), or --help's exit 0
eval "$code"
dry="${DRY_RUN:-0}"
for a in "$@"; do [[ "$a" == "--dry-run" ]] && dry=1; done

failed=()
for r in "${runs[@]}"; do
  if [[ "$r" == "#"* ]]; then
    note "${r#"#"}"
    continue
  fi
  read -r t m s <<<"$r"
  if ! SEED="$s" "$GLUE_DIR/finetune.sh" "$t" "$m" "$@"; then
    [[ "$KEEP_GOING" == 1 ]] || die "$t / $m / seed $s failed (KEEP_GOING=1 carries on)"
    failed+=("$t/$m/seed$s")
  fi
done

if [[ "$dry" != 1 && "$COLLECT" == 1 && -d "$OUT_ROOT/runs" ]]; then
  "$PYTHON" "$REPO/recipes/collect_results.py" "$OUT_ROOT/runs" --out "$OUT_ROOT/results.md"
fi
if [[ ${#failed[@]} != 0 ]]; then
  die "${#failed[@]} run(s) failed: ${failed[*]}"
fi
