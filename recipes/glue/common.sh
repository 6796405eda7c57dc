#!/usr/bin/env bash
# Helpers shared by recipes/glue/finetune.sh and recipes/glue/sweep.sh (sourced, not run). Every decision
# (the tables hparams.tsv and methods.tsv, the settings, the commands) is the run plan's,
# acl_fairseq/cli/plan.py; these scripts run what it plans.
set -euo pipefail

GLUE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"   # recipes/glue
REPO="$(cd "$GLUE_DIR/../.." && pwd)"                        # the repository root

# die MESSAGE [STATUS]: print "error: MESSAGE" on stderr and exit (1 unless STATUS is given).
die() {
  echo "error: $1" >&2
  exit "${2:-1}"
}

# note MESSAGE: progress message on stderr (stdout of a dry run holds only commands).
note() {
  echo "[recipe] $*" >&2
}

# plan_shell finetune|sweep ARGS...: the run plan as shell code to evaluate (acl_fairseq/cli/plan_shell.py).
# -S: the plan needs only the standard library, so importing the plugin does not load fairseq.
plan_shell() {
  PYTHONPATH="$REPO" "${PYTHON:-python3}" -S -m acl_fairseq.cli.plan_shell "$1" --repo "$REPO" "${@:2}"
}
