#!/usr/bin/env bash
# Distributed (DDP) fine-tuning on CPU through fairseq's own DDP: one process per rank on this machine,
# over loopback with the gloo backend.
#
#   scripts/ddp_cpu.sh [--port PORT] [--log-dir DIR] NPROC -- fairseq-train DATA --user-dir acl_fairseq ...
#
# Starts NPROC copies of the command after `--`, rank R with these flags appended:
#   --distributed-world-size NPROC --distributed-rank R --distributed-no-spawn
#   --distributed-init-method tcp://127.0.0.1:PORT --distributed-backend gloo
#   --ddp-backend legacy_ddp --cpu
# (fairseq 0.12 runs DDP on CPU only with legacy_ddp; torchrun does not work there, since fairseq
# divides the world by the GPU count.) Rank 0 prints to this terminal; rank R > 0 writes
# DIR/rank{R}.log (default: a fresh temporary directory, named on stderr). The script waits for every
# rank; when one fails, it stops the others and exits with that rank's status (and shows its log tail).
# PORT defaults to $MASTER_PORT or a free loopback port. OMP_NUM_THREADS defaults to cores / NPROC.
# --batch-size is per rank: the global batch is NPROC times larger (scale --batch-size or --update-freq).
# Add --contrast-across-workers to contrast against every rank's batch (one global contrastive set),
# and --acl-grad-global-decision (acl_grad, acl_cross_layer) for one ACL-Grad decision over all ranks.
#
# On GPUs use fairseq's usual launch instead of this script, with DDP's c10d backend (fairseq's
# default, an alias of pytorch_ddp) and --find-unused-parameters (the RoBERTa LM head is unused):
#   one node, all its GPUs (fairseq spawns one process per GPU by itself):
#     fairseq-train DATA --user-dir acl_fairseq ... --distributed-world-size 8 --ddp-backend c10d --find-unused-parameters
#   or torchrun, one process per GPU (fairseq reads RANK/WORLD_SIZE/MASTER_* from the environment):
#     torchrun --nproc_per_node 8 --module fairseq_cli.train DATA --user-dir acl_fairseq ... --ddp-backend c10d --find-unused-parameters
#   several nodes: torchrun --nnodes N --node_rank I --master_addr HOST --master_port PORT ... (same arguments)
# --contrast-across-workers and --acl-grad-global-decision work the same there (NCCL collectives).
set -euo pipefail

usage() {
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

PORT="${MASTER_PORT:-}"
LOG_DIR=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --port) [[ $# -ge 2 ]] || usage; PORT="$2"; shift 2 ;;
    --log-dir) [[ $# -ge 2 ]] || usage; LOG_DIR="$2"; shift 2 ;;
    -h|--help) usage ;;
    *) break ;;
  esac
done
[[ $# -ge 3 && "$1" =~ ^[1-9][0-9]*$ && "$2" == "--" ]] || usage
NPROC="$1"
shift 2
[[ -z "$PORT" || "$PORT" =~ ^[0-9]+$ ]] || usage

if [[ -z "$PORT" ]]; then
  PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
fi
if [[ -z "$LOG_DIR" ]]; then
  LOG_DIR="$(mktemp -d "${TMPDIR:-/tmp}/ddp_cpu.XXXXXX")"
fi
mkdir -p "$LOG_DIR"
CORES="$(nproc 2>/dev/null || echo 1)"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( CORES / NPROC > 0 ? CORES / NPROC : 1 ))}"

declare -A RANK_OF=()  # pid -> rank, for the ranks still running
stop_all() {
  local pid
  (( ${#RANK_OF[@]} )) || return 0
  for pid in "${!RANK_OF[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    for pid in "${!RANK_OF[@]}"; do kill -0 "$pid" 2>/dev/null || unset 'RANK_OF[$pid]'; done
    (( ${#RANK_OF[@]} )) || return 0
    sleep 0.5
  done
  for pid in "${!RANK_OF[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}
trap 'stop_all; exit 130' INT TERM

echo "[ddp_cpu] $NPROC ranks, tcp://127.0.0.1:$PORT, OMP_NUM_THREADS=$OMP_NUM_THREADS, logs of ranks > 0 in $LOG_DIR" >&2
for (( r = 0; r < NPROC; r++ )); do
  flags=(--distributed-world-size "$NPROC" --distributed-rank "$r" --distributed-no-spawn
         --distributed-init-method "tcp://127.0.0.1:$PORT" --distributed-backend gloo
         --ddp-backend legacy_ddp --cpu)
  if (( r == 0 )); then
    "$@" "${flags[@]}" &
  else
    "$@" "${flags[@]}" > "$LOG_DIR/rank$r.log" 2>&1 &
  fi
  RANK_OF[$!]="$r"
done

while (( ${#RANK_OF[@]} )); do
  rc=0
  wait -n -p done_pid "${!RANK_OF[@]}" || rc=$?
  r="${RANK_OF[$done_pid]}"
  unset 'RANK_OF[$done_pid]'
  if (( rc != 0 )); then
    echo "[ddp_cpu] rank $r (pid $done_pid) failed with status $rc; stopping the other ranks" >&2
    if (( r > 0 )); then tail -n 40 "$LOG_DIR/rank$r.log" >&2 || true; fi
    trap - INT TERM
    stop_all
    wait 2>/dev/null || true
    exit "$rc"
  fi
done
echo "[ddp_cpu] all $NPROC ranks finished" >&2
