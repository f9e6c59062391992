#!/bin/sh
# tpcli serve in a real browser and through the official openai npm client (ctest label "serve").
#
#   tests/serve/web/run_web_test.sh TPCLI_BINARY SHARED_DIR OUTDIR
#
# Starts `tpcli serve` on stories260K (2 devices) on a free port, waits for /health, installs the
# pinned npm packages into OUTDIR (npm ci, only when the lock file changed: the source tree is not
# written to), runs chat_page_test.mjs (headless Chromium; screenshots in OUTDIR) and
# openai_client_test.mjs, then stops the server. Then it writes a random-weight Qwen3-shaped model
# (qwen3-tiny.toml) and serves it with Qwen3's tokenizer and template for openai_tools_test.mjs
# (tool calls and a JSON schema). Exit 77 (ctest: Skipped) without SHARED_DIR's data.
set -u
if [ $# -ne 3 ]; then
  echo "usage: $0 TPCLI_BINARY SHARED_DIR OUTDIR" >&2
  exit 2
fi
tpcli=$1 shared=${TPCLI_SHARED_DIR:-$2} out=$3  # TPCLI_SHARED_DIR: as for the other tests
here=$(cd "$(dirname "$0")" && pwd)
model=$shared/data/stories260K.bin tokenizer=$shared/data/tok512.bin qwen3=$shared/data/hf-tokenizers/qwen3
if [ ! -f "$model" ] || [ ! -f "$tokenizer" ] || [ ! -d "$qwen3" ]; then
  echo "run_web_test: $model, $tokenizer or $qwen3 is absent: skipped" >&2
  exit 77
fi
mkdir -p "$out/web"

# The scripts run from OUTDIR/web, next to their node_modules.
cp "$here/package.json" "$here/package-lock.json" "$here/chat_page_test.mjs" "$here/openai_client_test.mjs" "$here/openai_tools_test.mjs" "$out/web/"
if [ ! -d "$out/web/node_modules" ] || ! cmp -s "$here/package-lock.json" "$out/web/node_modules/.tpcli-lock.json"; then
  echo "run_web_test: npm ci in $out/web"
  if ! npm ci --prefix "$out/web" --no-audit --no-fund >"$out/npm.log" 2>&1; then
    echo "run_web_test: npm ci failed (network? registry?):" >&2
    tail -20 "$out/npm.log" >&2
    exit 1
  fi
  cp "$here/package-lock.json" "$out/web/node_modules/.tpcli-lock.json"
fi

# --port 0: the server binds any free port and names it in its "listening on" line.
log=$out/server.log
. "$here/../start_serve.sh"
start_serve run_web_test "$log" --model "$model" --tokenizer "$tokenizer" --devices 2 --host 127.0.0.1 --template zephyr
# Waits for $url/health, or exits 1 with the server's log.
health() { node -e 'fetch(process.argv[1]).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))' "$url/health"; }
await_health() {
  for _ in $(seq 1 100); do
    health && break
    sleep 0.1
  done
  if ! health; then
    echo "run_web_test: $url/health does not answer 200" >&2
    cat "$log" >&2
    exit 1
  fi
  echo "run_web_test: tpcli serve at $url"
}
await_health

status=0
node "$out/web/chat_page_test.mjs" "$url" "$out" || status=1
node "$out/web/openai_client_test.mjs" "$url" || status=1
if [ $status -ne 0 ]; then
  echo "run_web_test: server log ($log):" >&2
  tail -40 "$log" >&2
fi
kill "$server" 2>/dev/null
wait "$server" 2>/dev/null

if ! "$tpcli" init --model-config "$here/qwen3-tiny.toml" --out "$out/qwen3-tiny.safetensors" --seed 5 >"$out/init.log" 2>&1; then
  cat "$out/init.log" >&2
  exit 1
fi
log=$out/server-qwen3.log
start_serve run_web_test "$log" --model "$out/qwen3-tiny.safetensors" --tokenizer "$qwen3" --devices 2 --host 127.0.0.1
await_health
if ! node "$out/web/openai_tools_test.mjs" "$url"; then
  echo "run_web_test: server log ($log):" >&2
  tail -40 "$log" >&2
  status=1
fi
exit $status
