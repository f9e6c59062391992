#!/bin/sh
# make finetune-demo's data (examples/finetune/make_data.sh), ctest label "train":
#
#   tests/train/finetune_demo_data.sh TPCLI_BINARY SHARED_DIR OUTDIR
#
# The files are the recorded bytes (so every awk writes the same ones), the sizes the script
# promises, no question twice, and every answer is the one a second, independent reading of its
# question gives. Then, with SHARED_DIR's stories260K, `tpcli eval` reads test.jsonl (the base model
# answers next to none) and `tpcli train` two steps of each of the demo's configs (the chat stage
# on chat-*.jsonl, the LoRA stage on train.jsonl and val.jsonl). Exit 77 (ctest: Skipped) after
# the data checks when SHARED_DIR's data is absent.
set -u
tpcli=$1 shared=${TPCLI_SHARED_DIR:-$2} out=$3
source_dir=$(cd "$(dirname "$0")/../.." && pwd)
failures=0
fail() { echo "FAILED: $*" >&2; failures=$((failures + 1)); }

rm -rf "$out" && mkdir -p "$out"
sh "$source_dir/examples/finetune/make_data.sh" "$out/data" || fail "make_data.sh exited $?"
cd "$out/data" || exit 1

# The bytes mawk 1.3.4, gawk 5.2.1 and busybox 1.35 awk all wrote on 2026-12-02.
sha256sum -c --quiet - <<'SUMS' || fail "the files differ from the recorded ones"
3573424e65ec2b282dcd30176c2d91f718825343f56209750cff7301d264c5e0  chat-train.jsonl
52f6ca8f604623650a3d67ccb505837c15043f5d25099131b15c9bc5d87f84fc  chat-val.jsonl
daea99d6c6c5338f2e790eeb65428611184cee0d1a4d8ebf3f434454479a83c0  test.jsonl
b4ff2b6301ec9074979fbb913af9f3108d9da42e1667ed1bc2588dd7ad1be5eb  train.jsonl
9284c1ec58621c4bbba7ae56cdab3e1f66fc3f34a3239112774adf889457c192  val.jsonl
SUMS
for f in test:100 val:100 train:2000 chat-train:1000 chat-val:50; do
  n=$(wc -l < "${f%:*}.jsonl")
  [ "$n" -eq "${f#*:}" ] || fail "${f%:*}.jsonl has $n lines, want ${f#*:}"
done
dups=$(cat test.jsonl val.jsonl train.jsonl chat-train.jsonl chat-val.jsonl | sed 's/"role": "assistant".*//' | sort | uniq -d | wc -l)
[ "$dups" -eq 0 ] || fail "$dups questions are in more than one example"

# Each line's answer, worked out again from its question by a different route.
awk -v animals=" cat dog bird fish frog duck cow pig hen bear " '
{
  if (!match($0, /^\{"messages": \[\{"role": "user", "content": "[^"]*"\}, \{"role": "assistant", "content": "[a-z ]+"\}\]\}$/)) {
    if (++bad <= 10) print FILENAME ":" FNR ": not the expected chat example: " $0; next
  }
  split($0, part, "\"")  # part[10] the question, part[18] the answer
  q = part[10]; a = part[18]
  list = q; sub(/^[^:]*: /, "", list); sub(/\?$/, "", list); gsub(/,/, "", list)
  n = split(list, w, " ")
  if (q ~ /^Repeat: /) want = list
  else if (q ~ /^What is the last word of: /) want = w[n]
  else if (q ~ /^What is the first word of: /) want = w[1]
  else if (q ~ /^Which one is an animal: /) {
    want = ""; found = 0
    for (k = 1; k <= n; k++) if (index(animals, " " w[k] " ")) { want = w[k]; found++ }
    if (found != 1) { if (++bad <= 10) print FILENAME ":" FNR ": " found " animals in: " q; next }
  } else { if (++bad <= 10) print FILENAME ":" FNR ": an unknown question: " q; next }
  if (a != want) { if (++bad <= 10) print FILENAME ":" FNR ": answer " a ", want " want }
}
END { exit bad > 0 }' test.jsonl val.jsonl train.jsonl chat-train.jsonl chat-val.jsonl >&2 || fail "answers that do not follow from their questions (above)"

model=$shared/data/stories260K.bin tokenizer=$shared/data/tok512.bin
if [ ! -f "$model" ] || [ ! -f "$tokenizer" ]; then
  echo "finetune_demo_data: $model or $tokenizer is absent: tpcli eval and train skipped" >&2
  [ "$failures" -eq 0 ] && exit 77
  exit 1
fi
"$tpcli" eval --model "$model" -z "$tokenizer" --data test.jsonl --template zephyr --max-tokens 16 > "$out/eval.txt" ||
  fail "tpcli eval exited $?"
last=$(tail -1 "$out/eval.txt")
case $last in
  "exact match: "[0-5]/100) echo "ok: base model on the held-out questions: $last" ;;
  *) fail "tpcli eval on the base model: '$last', want 'exact match: K/100' with K <= 5" ;;
esac
cd "$source_dir" || exit 1
for stage in finetune-demo-chat:chat- finetune-demo:; do
  config=${stage%:*} prefix=${stage#*:}
  "$tpcli" train "configs/$config.toml" --set model.init_from="$model" --set data.tokenizer="$tokenizer" \
    --set data.path="$out/data/${prefix}train.jsonl" --set data.val_path="$out/data/${prefix}val.jsonl" \
    --set train.steps=2 --set train.eval_every=2 --set train.eval_batches=1 --set train.out_dir="$out/$config" \
    > "$out/$config.log" 2>&1 || { cat "$out/$config.log" >&2; fail "tpcli train configs/$config.toml exited non-zero"; }
done
[ "$failures" -eq 0 ] || { echo "$failures failure(s)" >&2; exit 1; }
echo "ok: make_data.sh's files are the recorded ones, well-formed, and tpcli eval and train read them"
