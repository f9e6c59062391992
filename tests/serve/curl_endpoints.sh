#!/bin/sh
# Every endpoint of tpcli serve through curl, as the README shows them (ctest label "serve").
#
#   tests/serve/curl_endpoints.sh TPCLI_BINARY SHARED_DIR OUTDIR
#
# Starts `tpcli serve` on stories260K (2 devices, a free port), then checks each answer's status and
# shape. Exit 77 (ctest: Skipped) without SHARED_DIR's data.
set -u
tpcli=$1 shared=${TPCLI_SHARED_DIR:-$2} out=$3
model=$shared/data/stories260K.bin tokenizer=$shared/data/tok512.bin
[ -f "$model" ] && [ -f "$tokenizer" ] || { echo "curl_endpoints: $model or $tokenizer is absent: skipped" >&2; exit 77; }
mkdir -p "$out"
log=$out/curl_server.log
. "$(cd "$(dirname "$0")" && pwd)/start_serve.sh"
start_serve curl_endpoints "$log" --model "$model" -z "$tokenizer" --template zephyr --devices 2

failures=0
# check NAME WANT_STATUS WANT_TEXT curl-arguments...: the answer's status and a piece of its body.
check() {
  name=$1 want=$2 text=$3
  shift 3
  status=$(curl -s -o "$out/body" -w '%{http_code}' --max-time 60 "$@")
  if [ "$status" = "$want" ] && grep -qF -- "$text" "$out/body"; then
    echo "ok: $name"
  else
    echo "FAILED: $name: status $status (want $want), body lacks '$text':" >&2
    head -c 400 "$out/body" >&2
    echo >&2
    failures=$((failures + 1))
  fi
}
json='Content-Type: application/json'
chat='{"messages": [{"role": "user", "content": "Tell me about a cat."}], "max_tokens": 20, "temperature": 0}'

check "GET /health" 200 '"status":"ok"' "$url/health"
check "GET /v1/models" 200 '"id":"stories260K.bin"' "$url/v1/models"
check "POST /v1/chat/completions" 200 '"object":"chat.completion"' -H "$json" -d "$chat" "$url/v1/chat/completions"
check "POST /v1/chat/completions, streamed" 200 'data: [DONE]' -N -H "$json" \
  -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": true, "stream_options": {"include_usage": true}}' \
  "$url/v1/chat/completions"
grep -qF '"choices":[],' "$out/body" || { echo "FAILED: the stream has no usage chunk" >&2; failures=$((failures + 1)); }
check "POST /v1/completions" 200 '"object":"text_completion"' -H "$json" -d '{"prompt": "Once upon a time", "max_tokens": 8}' "$url/v1/completions"
check "POST /v1/completions, token ids, streamed" 200 'data: [DONE]' -N -H "$json" \
  -d '{"prompt": [1, 403, 407], "max_tokens": 8, "stream": true}' "$url/v1/completions"
check "POST /tokenize" 200 '"tokens":[1,' -H "$json" -d '{"content": "Once upon a time"}' "$url/tokenize"
check "POST /detokenize" 200 '"content":' -H "$json" -d '{"tokens": [403, 407]}' "$url/detokenize"
check "GET /status" 200 '"devices":2' "$url/status"
check "GET /" 200 '<title>' "$url/"
check "GET /metrics" 200 'tpcli_requests_total{status="200"}' "$url/metrics"
check "malformed JSON" 400 '"invalid_request_error"' -H "$json" -d '{"messages": [' "$url/v1/chat/completions"
check "an unknown model" 400 '"model_not_found"' -H "$json" -d '{"model": "gpt-4", "prompt": "x"}' "$url/v1/completions"
check "max_tokens -1" 400 '"param":"max_tokens"' -H "$json" -d '{"prompt": "x", "max_tokens": -1}' "$url/v1/completions"
check "an unknown path" 404 '"not_found"' "$url/v2/nothing"
# A client that hangs up mid-stream leaves the server serving.
curl -s -N --max-time 0.3 -H "$json" -d '{"prompt": "Once", "max_tokens": 400, "ignore_eos": true, "stream": true}' \
  "$url/v1/completions" >/dev/null 2>&1
check "GET /health after a client left" 200 '"status":"ok"' "$url/health"
[ "$failures" -eq 0 ] || { echo "curl_endpoints: $failures failed" >&2; exit 1; }
