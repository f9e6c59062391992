#!/bin/sh
# Usage: fetch_base.sh OUT_DIR
# The fine-tuning demo's base model when ../shared is absent (a fresh clone elsewhere): llama2.c's
# stories260K.bin and its tokenizer tok512.bin (karpathy/tinyllamas, MIT), downloaded with curl or
# wget into OUT_DIR and checked against the sha256 of ../shared/data/SOURCES.txt. A file already
# there with the right sum is kept. BASE_URL overrides the source (file:///DIR works too).
set -eu
out=${1:?usage: fetch_base.sh OUT_DIR}
url=${BASE_URL:-https://huggingface.co/karpathy/tinyllamas/resolve/main/stories260K}
mkdir -p "$out"
cd "$out"
sums='b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696  stories260K.bin
037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312  tok512.bin'
for f in stories260K.bin tok512.bin; do
  echo "$sums" | grep " $f\$" | sha256sum -c --quiet - >/dev/null 2>&1 && continue
  echo "fetch_base.sh: downloading $url/$f"
  if command -v curl >/dev/null; then
    curl -fsSL -o "$f.part" "$url/$f"
  elif command -v wget >/dev/null; then
    wget -q -O "$f.part" "$url/$f"
  else
    echo "fetch_base.sh: neither curl nor wget: put stories260K.bin and tok512.bin in $out, or set SHARED_DIR" >&2
    exit 1
  fi
  mv "$f.part" "$f"
  echo "$sums" | grep " $f\$" | sha256sum -c --quiet - ||
    { echo "fetch_base.sh: $out/$f is not the expected file (sha256 above)" >&2; rm -f "$f"; exit 1; }
done
