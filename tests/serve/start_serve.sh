# Sourced by the serve test scripts: start_serve NAME LOG ARGS... runs `$tpcli serve ARGS --port 0`
# in the background (killed when the script exits) and sets $server (its pid) and $url (from its
# "listening on" line, once the model has loaded), or exits 1 with the server's log.
start_serve() {
  name=$1 log=$2
  shift 2
  "$tpcli" serve "$@" --port 0 >"$log" 2>&1 &
  server=$!
  trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null' EXIT INT TERM
  url=
  for _ in $(seq 1 300); do
    url=$(sed -n 's|.*listening on \(http://[^ ]*\).*|\1|p' "$log" | head -n 1)
    [ -n "$url" ] && return 0
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  echo "$name: tpcli serve did not say where it listens (exited, or not within 30 s):" >&2
  cat "$log" >&2
  exit 1
}
