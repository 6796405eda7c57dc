#!/usr/bin/env bash
# MNLI with one method: MNLI.sh METHOD [--dry-run] [extra fairseq-train flags...]; settings in hparams.tsv.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/finetune.sh" MNLI "$@"
