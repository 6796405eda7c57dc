#!/usr/bin/env bash
# SST-2 with one method: SST-2.sh METHOD [--dry-run] [extra fairseq-train flags...]; settings in hparams.tsv.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/finetune.sh" SST-2 "$@"
