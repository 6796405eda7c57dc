#!/usr/bin/env bash
# Debian packages that the tests use (scripts/system_packages.tsv: each keyed on a command or a shared library),
# installed only where missing (root, apt-get). A library is keyed on itself, not on a command: perf_analyzer is
# installed by make env into the venv, and links libb64.so.0d, which only this script installs.
# Usage: scripts/system_packages.sh      (CI runs it before make test; idempotent, seconds when present)
#        scripts/system_packages.sh --check   (list what is missing, install nothing; exit 1 if anything is)
set -euo pipefail
TABLE="$(dirname "${BASH_SOURCE[0]}")/system_packages.tsv"
LDCONFIG="${LDCONFIG:-/sbin/ldconfig}"  # the dynamic linker's cache (a test points it at a fake)

present() {  # kind name
  case "$1" in
    command) command -v "$2" >/dev/null 2>&1 ;;
    library) "$LDCONFIG" -p 2>/dev/null | awk '{print $1}' | grep -q -x -F "$2" ;;
    *) echo "[system] $TABLE: unknown kind '$1' (command or library)" >&2; exit 2 ;;
  esac
}

missing=() all=()
while IFS=$'\t' read -r kind name package _; do
  [[ -z "$kind" || "$kind" == \#* || "$kind" == kind ]] && continue
  all+=("$package")
  present "$kind" "$name" || missing+=("$package")
done < "$TABLE"

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "[system] ${all[*]}: present"
  exit 0
fi
if [[ "${1:-}" == "--check" ]]; then
  echo "[system] missing: ${missing[*]}"
  exit 1
fi
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "[system] missing ${missing[*]}: install them with your package manager (Debian: apt-get install ${missing[*]})" >&2
  exit 2
fi
echo "[system] installing ${missing[*]}"
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
