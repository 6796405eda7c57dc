#!/usr/bin/env bash
# Tune one method on one GLUE task with Optuna (acl-tune, acl_fairseq/cli/tune.py; docs/tuning.md).
#
#   recipes/glue/tune.sh TASK METHOD [acl-tune flags...] [-- extra fairseq-train flags...]
#   recipes/glue/tune.sh SST-2 scl --data-bin data-bin/SST-2-N20-seed1-bin --trials 24 --threads 1
#   recipes/glue/tune.sh SST-2 scl --data-bin 'data-bin/SST-2-N20-seed{seed}-bin' --evaluate-best --seeds 1 2 3 4 5
#
# Every trial is a run of the run plan (acl_fairseq/runs/plan.py) through finetune.sh; the driver's settings
# (SEED aside) come from the environment as for finetune.sh, or from --set NAME=VALUE. Start the same command
# on more machines with one --storage URL (postgresql://...) to share the study; a stopped study resumes.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [[ $# -lt 2 || "$1" == -h || "$1" == --help ]]; then
  PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m acl_fairseq.cli.tune --help
fi
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m acl_fairseq.cli.tune "$@"
