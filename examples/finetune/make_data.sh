#!/bin/sh
# Usage: make_data.sh OUT_DIR
# The fine-tuning demo's data (configs/finetune-demo.toml, `make finetune-demo`): three instructions
# with one-word answers an exact match can check, mixed at random,
#   {"messages": [{"role": "user", "content": "What is the last word of: hat duck green pig?"}, {"role": "assistant", "content": "pig"}]}
#   ... "What is the first word of: duck green pig toy?" -> "duck"
#   ... "Which one is an animal: hat, small, car, fish?" -> "fish"
# as OUT_DIR/train.jsonl (2000 examples), val.jsonl (100) and test.jsonl (100, the held-out
# questions); no question is in two files. And, for the first stage that teaches stories260K the
# chat format (configs/finetune-demo-chat.toml), another instruction over the same words:
#   ... "Repeat: frog cow" -> "frog cow"
# as OUT_DIR/chat-train.jsonl (1000) and chat-val.jsonl (50). The same bytes on every machine: POSIX sh and awk, with
# its own Park-Miller generator instead of awk's rand(), which differs between awks; every number
# stays below 2^53, exact in awk's doubles. Checked: mawk 1.3.4, gawk 5.2.1 and busybox 1.35 awk
# write the same files (tests/train/finetune_demo_data.sh holds their sha256).
set -eu
out=${1:?usage: make_data.sh OUT_DIR}
mkdir -p "$out"
awk -v out="$out" '
# A uniform integer in [0, n).
function rnd(n) { seed = (seed * 16807) % 2147483647; return int(seed / 2147483647 * n) }
# 3 to 5 words of W, the first in FIRST and the last in LAST.
function word_list(   k, n, s, w) {
  n = 3 + rnd(3); s = ""
  for (k = 1; k <= n; k++) {
    w = W[1 + rnd(NW)]
    if (k == 1) FIRST = w
    LAST = w
    s = s (k > 1 ? " " : "") w
  }
  return s
}
# 3 to 5 things, exactly one of them an animal (ANIMAL), the others from O.
function things(   k, n, at, s, t) {
  n = 3 + rnd(3); at = 1 + rnd(n); s = ""
  for (k = 1; k <= n; k++) {
    t = (k == at) ? A[1 + rnd(NA)] : O[1 + rnd(NO)]
    if (k == at) ANIMAL = t
    s = s (k > 1 ? ", " : "") t
  }
  return s
}
# One example in QUESTION and ANSWER (KIND "repeat": the instruction of the chat stage).
function example(   kind, list) {
  if (KIND == "repeat") { list = word_list(); QUESTION = "Repeat: " list; ANSWER = list; return }
  kind = rnd(3)
  if (kind == 0) { QUESTION = "What is the last word of: " word_list() "?"; ANSWER = LAST }
  else if (kind == 1) { QUESTION = "What is the first word of: " word_list() "?"; ANSWER = FIRST }
  else { QUESTION = "Which one is an animal: " things() "?"; ANSWER = ANIMAL }
}
# `count` examples whose questions no file has yet.
function write(file, count,   made) {
  for (made = 0; made < count; ) {
    example()
    if (QUESTION in seen) continue
    seen[QUESTION] = 1
    made++
    printf "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}, {\"role\": \"assistant\", \"content\": \"%s\"}]}\n", QUESTION, ANSWER > file
  }
  close(file)
}
BEGIN {
  seed = 20240530
  NA = split("cat dog bird fish frog duck cow pig hen bear", A, " ")
  NO = split("ball tree car boat cake box hat sun moon star red blue green big small happy sad park home toy", O, " ")
  NW = split("cat dog bird fish frog duck cow pig hen bear ball tree car boat cake box hat sun moon star red blue green big small happy sad park home toy", W, " ")
  write(out "/test.jsonl", 100)
  write(out "/val.jsonl", 100)
  write(out "/train.jsonl", 2000)
  KIND = "repeat"
  write(out "/chat-train.jsonl", 1000)
  write(out "/chat-val.jsonl", 50)
}'
