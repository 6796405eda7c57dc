#!/usr/bin/env bash
# WNLI with one method: WNLI.sh METHOD [--dry-run] [extra fairseq-train flags...]; settings in hparams.tsv.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/finetune.sh" WNLI "$@"
