#!/usr/bin/env bash
# What recipes/glue/finetune.sh and sweep.sh share (sourced, not run): where the repository is, and the runner.
# Every decision (the tables hparams.tsv and methods.tsv, the settings, the commands) is the run plan's,
# acl_fairseq/runs/plan.py, and the runner (acl_fairseq/runs/runner.py) runs it.
set -euo pipefail

GLUE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"   # recipes/glue
REPO="$(cd "$GLUE_DIR/../.." && pwd)"                        # the repository root

# runner finetune|sweep ARGS...: the runner in place of this shell. -S: it needs only the standard library, so
# importing the plugin does not load fairseq (seconds per run); fairseq-train is the environment's.
runner() {
  PYTHONPATH="$REPO" exec "${PYTHON:-python3}" -S -m acl_fairseq.runs.runner "$1" --repo "$REPO" "${@:2}"
}
