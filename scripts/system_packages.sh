#!/usr/bin/env bash
# Debian packages that the tests use, installed only where their command is missing (root, apt-get):
#   qemu-user   qemu-x86_64 runs the int8 graphs on an emulated AVX2-only CPU (tests/test_int8.py)
#   postgresql  a throwaway server for two acl-tune workers sharing one study (tests/test_tune.py)
#   hey         an HTTP load generator nobody here wrote, driving acl-serve (benchmarks/serve_hey.py,
#               tests/test_serve_hey.py, which runs in make test)
# Usage: scripts/system_packages.sh      (CI runs it before make test; idempotent, seconds when present)
set -euo pipefail

# command that shows the package is there -> Debian package
declare -A PACKAGES=([qemu-x86_64]=qemu-user [pg_ctlcluster]=postgresql [hey]=hey)

missing=()
for cmd in "${!PACKAGES[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${PACKAGES[$cmd]}")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "[system] ${PACKAGES[*]}: present"
  exit 0
fi
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "[system] missing ${missing[*]}: install them with your package manager (Debian: apt-get install ${missing[*]})" >&2
  exit 2
fi
echo "[system] installing ${missing[*]}"
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
