#!/usr/bin/env bash
# Download and unpack fairseq's pretrained RoBERTa (roberta.base or roberta.large) into DEST_DIR,
# giving DEST_DIR/roberta.MODEL/{model.pt,dict.txt,NOTE}. Does nothing when model.pt is already there.
#
#   recipes/download_roberta.sh base|large DEST_DIR
set -euo pipefail

BASE_URL="${BASE_URL:-https://dl.fbaipublicfiles.com/fairseq/models}"  # where fairseq publishes its models

if [[ $# -ne 2 || ( "$1" != base && "$1" != large ) ]]; then
  echo "usage: $(basename "$0") base|large DEST_DIR" >&2
  exit 2
fi
MODEL="$1"
DEST="$2"
TARGET="$DEST/roberta.$MODEL/model.pt"
URL="$BASE_URL/roberta.$MODEL.tar.gz"

if [[ -f "$TARGET" ]]; then
  echo "[download] $TARGET already present" >&2
  exit 0
fi
mkdir -p "$DEST"
archive="$(mktemp "$DEST/roberta.$MODEL.XXXXXX.tar.gz")"
trap 'rm -f "$archive"' EXIT
echo "[download] $URL -> $DEST (roberta.base is about 0.3 GB, roberta.large about 0.8 GB)" >&2
if command -v curl >/dev/null; then
  curl -fL --retry 3 -o "$archive" "$URL"
elif command -v wget >/dev/null; then
  wget -O "$archive" "$URL"
else
  echo "error: neither curl nor wget is installed; download $URL by hand into $DEST" >&2
  exit 1
fi
tar -xzf "$archive" -C "$DEST"
if [[ ! -f "$TARGET" ]]; then
  echo "error: $URL did not unpack to $TARGET" >&2
  exit 1
fi
echo "[download] $TARGET ready" >&2
