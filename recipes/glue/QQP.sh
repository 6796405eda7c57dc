#!/usr/bin/env bash
# QQP with one method: QQP.sh METHOD [--dry-run] [extra fairseq-train flags...]; settings in hparams.tsv.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/finetune.sh" QQP "$@"
