#!/usr/bin/env bash
# STS-B with one method: STS-B.sh METHOD [--dry-run] [extra fairseq-train flags...]; settings in hparams.tsv.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/finetune.sh" STS-B "$@"
