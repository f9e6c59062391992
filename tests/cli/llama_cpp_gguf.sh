#!/bin/bash
# llama.cpp itself runs what `tpcli export --to gguf` writes: stories260K exported in f32 and in
# q8_0, then greedy text from llama.cpp's llama-cli (KV cache in f32, one thread) against tpcli's
# `infer -t 0` on the same file.
#   f32:  the whole continuation is equal (llama.cpp's f32 forward pass matches tpcli's to ~1e-5).
#   q8_0: the first 100 characters are equal. llama.cpp's CPU kernels quantize the activations to
#         Q8_0 blocks before each product with Q8_0 weights (and round them to f16 for the F16
#         rows of 172), which moves its logits by a few percent (../shared/reference/gguf/README.md),
#         so a long greedy run parts from any f32 computation of the same weights at some close call.
# Usage: llama_cpp_gguf.sh TPCLI SHARED_DIR WORK_DIR [LLAMA_CPP_BIN]
# LLAMA_CPP_BIN (or $TPCLI_LLAMA_CPP_BIN) is a folder with llama-cli; without one the test is
# skipped (exit 77).
set -euo pipefail
tpcli=$1 shared=$2 work=$3
bin=${TPCLI_LLAMA_CPP_BIN:-${4:-}}
if [[ -z "$bin" || ! -x "$bin/llama-cli" ]]; then
  echo "SKIPPED: no llama.cpp build (set TPCLI_LLAMA_CPP_BIN to a folder holding llama-cli)" >&2
  exit 77
fi
[[ -f "$shared/data/stories260K.bin" ]] || { echo "SKIPPED: $shared/data is absent" >&2; exit 77; }
rm -rf "$work" && mkdir -p "$work"
prompt="Once upon a time"
for dtype in f32 q8_0; do
  model="$work/stories260K-$dtype.gguf"
  "$tpcli" export --to gguf --model "$shared/data/stories260K.bin" -z "$shared/data/tok512.bin" --dtype "$dtype" --out "$model" 2>/dev/null
  ours=$("$tpcli" infer --model "$model" -z "$shared/data/tok512.bin" -i "$prompt" -n 120 -t 0 2>/dev/null)
  theirs=$("$bin/llama-cli" -m "$model" -p "$prompt" -n 120 --temp 0 -ctk f32 -ctv f32 -t 1 -no-cnv --simple-io --no-warmup \
           </dev/null 2>"$work/llama-cli-$dtype.err") || { echo "llama-cli failed on $model:"; tail -5 "$work/llama-cli-$dtype.err"; exit 1; }
  theirs=${theirs%$'\n'}
  theirs=${theirs# }  # llama-cli prints the SentencePiece space before the first word
  if [[ $dtype == f32 ]]; then length=${#ours}; (( ${#theirs} < length )) && length=${#theirs}; else length=100; fi
  if (( length < 100 )) || [[ "${ours:0:length}" != "${theirs:0:length}" ]]; then
    printf '%s: tpcli and llama.cpp differ in the first %d characters\ntpcli:     %s\nllama.cpp: %s\n' "$dtype" "$length" "$ours" "$theirs"
    exit 1
  fi
  echo "$dtype: llama.cpp's greedy text equals tpcli's over $length characters"
done
