#!/usr/bin/env bash
# Helpers shared by recipes/glue/finetune.sh and recipes/glue/sweep.sh (sourced, not run).
# Reads the two tables next to it: hparams.tsv (per GLUE task) and methods.tsv (per method).
# shellcheck disable=SC2034  # the variables load_task/load_method set are used by the sourcing scripts
set -euo pipefail

GLUE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"   # recipes/glue
REPO="$(cd "$GLUE_DIR/../.." && pwd)"                        # the repository root
HPARAMS_TABLE="${HPARAMS_TABLE:-$GLUE_DIR/hparams.tsv}"     # per-task hyperparameter table
METHODS_TABLE="${METHODS_TABLE:-$GLUE_DIR/methods.tsv}"     # per-method criterion/flags table

# die MESSAGE [STATUS]: print "error: MESSAGE" on stderr and exit (1 unless STATUS is given).
die() {
  echo "error: $1" >&2
  exit "${2:-1}"
}

# note MESSAGE: progress message on stderr (stdout of a dry run holds only commands).
note() {
  echo "[recipe] $*" >&2
}

# table_rows TABLE: the data rows of a tab-separated table (no comments, blank lines or header).
table_rows() {
  awk -F '\t' '/^[[:space:]]*(#|$)/ {next} !seen++ {next} {print}' "$1"
}

# table_column TABLE N: column N (1-based) of every data row.
table_column() {
  table_rows "$1" | cut -f "$2"
}

# known_tasks / known_methods: the names the tables define, space-separated.
known_tasks() {
  table_column "$HPARAMS_TABLE" 1 | tr '\n' ' ' | sed 's/ $//'
}
known_methods() {
  table_column "$METHODS_TABLE" 1 | awk '!seen[$0]++' | tr '\n' ' ' | sed 's/ $//'
}

# load_task TASK: sets NUM_CLASSES T_LR T_BATCH_SIZE T_TOTAL_UPDATES T_WARMUP_UPDATES BEST_METRIC
# REGRESSION VALID_SUBSETS REPORT from hparams.tsv; returns 1 when the task is not in the table.
load_task() {
  local row
  row="$(table_rows "$HPARAMS_TABLE" | awk -F '\t' -v t="$1" '$1 == t {print; exit}')"
  [[ -n "$row" ]] || return 1
  IFS=$'\t' read -r _ NUM_CLASSES T_LR T_BATCH_SIZE T_TOTAL_UPDATES T_WARMUP_UPDATES BEST_METRIC \
    REGRESSION VALID_SUBSETS REPORT <<<"$row"
}

# load_method METHOD TASK: sets CRITERION EXITS METHOD_FLAGS (an array) from methods.tsv, preferring a
# row for TASK over the "*" row; returns 1 when the method is not in the table.
load_method() {
  local row flags
  row="$(table_rows "$METHODS_TABLE" | awk -F '\t' -v m="$1" -v t="$2" '
    $1 == m && $2 == t {exact = $0} $1 == m && $2 == "*" {star = $0}
    END {if (exact != "") print exact; else if (star != "") print star}')"
  [[ -n "$row" ]] || return 1
  IFS=$'\t' read -r _ _ CRITERION EXITS flags <<<"$row"
  METHOD_FLAGS=()
  if [[ "$flags" != "-" ]]; then
    read -r -a METHOD_FLAGS <<<"$flags"
  fi
}

# is_contrastive CRITERION: every criterion but plain cross-entropy needs class labels.
is_contrastive() {
  [[ "$1" != "sentence_ce" ]]
}

# quote_cmd ARGS...: the arguments as one line that a shell reads back as the same words.
quote_cmd() {
  local out="" arg
  for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then
      out+="$arg "
    else
      out+="'${arg//\'/\'\\\'\'}' "
    fi
  done
  printf '%s\n' "${out% }"
}

# has_gpu: true when an NVIDIA GPU is visible (nvidia-smi lists one and CUDA_VISIBLE_DEVICES allows it).
has_gpu() {
  if [[ -n "${CUDA_VISIBLE_DEVICES+set}" && -z "${CUDA_VISIBLE_DEVICES}" ]]; then
    return 1
  fi
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}
