#!/usr/bin/env bash
# Tasks x methods x seeds: a thin loop over recipes/glue/finetune.sh, then the results table.
#
#   TASKS="RTE MRPC" METHODS="ce acl_embed" SEEDS="1 2 3" recipes/glue/sweep.sh [--dry-run] [extra fairseq flags...]
#
# Contrastive methods are skipped on STS-B (regression). Runs with a result.json are skipped by
# finetune.sh (FORCE=1 reruns them). Every other setting (MODEL, OUT_ROOT, DATA_ROOT, ...) passes
# through the environment to finetune.sh.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

TASKS="${TASKS:-$(known_tasks)}"                   # GLUE tasks to run, space-separated
METHODS="${METHODS:-ce scl acl_embed acl_grad}"    # methods to run (see methods.tsv)
SEEDS="${SEEDS:-1 2 3 4 5}"                        # seeds; the RoBERTa paper reports the median of 5
OUT_ROOT="${OUT_ROOT:-$REPO/runs/glue}"            # as in finetune.sh; the table goes to $OUT_ROOT/results.md
KEEP_GOING="${KEEP_GOING:-0}"                      # 1: carry on after a failed run, list failures at the end
COLLECT="${COLLECT:-1}"                            # 0: do not write the results table at the end
PYTHON="${PYTHON:-python3}"                        # runs collect_results.py
export OUT_ROOT

usage() {
  cat >&2 <<EOF
usage: [TASKS=...] [METHODS=...] [SEEDS=...] recipes/glue/sweep.sh [--dry-run] [extra fairseq-train flags...]
  tasks:   $(known_tasks)
  methods: $(known_methods)
EOF
  exit "${1:-2}"
}

[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && usage 0
dry="${DRY_RUN:-0}"
for a in "$@"; do [[ "$a" == "--dry-run" ]] && dry=1; done
read -r -a tasks <<<"$TASKS"
read -r -a methods <<<"$METHODS"
read -r -a seeds <<<"$SEEDS"
((${#tasks[@]} && ${#methods[@]} && ${#seeds[@]})) || usage 2
for t in "${tasks[@]}"; do load_task "$t" || { echo "error: unknown task '$t'" >&2; usage 2; }; done
for m in "${methods[@]}"; do load_method "$m" "*" || { echo "error: unknown method '$m'" >&2; usage 2; }; done
for s in "${seeds[@]}"; do [[ "$s" =~ ^[0-9]+$ ]] || { echo "error: seed '$s' is not a number" >&2; usage 2; }; done

failed=()
for t in "${tasks[@]}"; do
  load_task "$t"
  for m in "${methods[@]}"; do
    load_method "$m" "$t"
    if [[ "$REGRESSION" == 1 ]] && is_contrastive "$CRITERION"; then
      note "skipping $t / $m: $t is a regression task and $CRITERION needs class labels"
      continue
    fi
    for s in "${seeds[@]}"; do
      if ! SEED="$s" "$GLUE_DIR/finetune.sh" "$t" "$m" "$@"; then
        ((KEEP_GOING)) || die "$t / $m / seed $s failed (KEEP_GOING=1 carries on)"
        failed+=("$t/$m/seed$s")
      fi
    done
  done
done

if ((!dry)) && [[ "$COLLECT" == 1 && -d "$OUT_ROOT/runs" ]]; then
  "$PYTHON" "$REPO/recipes/collect_results.py" "$OUT_ROOT/runs" --out "$OUT_ROOT/results.md"
fi
if ((${#failed[@]})); then
  die "${#failed[@]} run(s) failed: ${failed[*]}"
fi
