#!/usr/bin/env bash
# ctest http_api_curl and http_api_openai_node: starts a real strata-server with --http-listen and
# --metrics-listen on free loopback ports and a tiny synthesized pack, then
#   curl: drives the API with `curl -N` (a streamed completion, a whole one, an error, /health, /metrics);
#   node: runs openai_node_client.js, the official `openai` npm package, against it (NODE_PATH from
#         NODE_MODULES, installed there by scripts/setup; a missing package fails the test);
# then stops the server with SIGTERM and checks that it exits 0. Every step is bounded in time.
#
#   http_api_test.sh curl STRATA_SERVER STRATA_PACK
#   http_api_test.sh node STRATA_SERVER STRATA_PACK NODE NODE_MODULES [--chat]
set -euo pipefail
mode=$1
server_bin=$2
pack_bin=$3
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/strata-http.XXXXXX)
server_pid=""

cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

alive() {
  [ -r "/proc/$server_pid/stat" ] && ! grep -q '^[0-9]* (.*) Z' "/proc/$server_pid/stat" 2>/dev/null
}

fail() {
  echo "http_api_test ($mode): $*" >&2
  echo "--- server log" >&2
  cat "$work/server.log" >&2 || true
  exit 1
}

if [ "$mode" = node ]; then
  node_bin=$4
  node_modules=$5
  [ -f "$node_modules/openai/package.json" ] ||
    fail "the openai npm package is not in $node_modules; run scripts/setup (it installs it there)"
fi

timeout 60 "$pack_bin" synth --arch qwen3moe --preset tiny --pack-only --scheme s4 --threads 2 \
  --out "$work/tiny" >/dev/null

"$server_bin" --pack "$work/tiny" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --threads 1 --max-seqs 2 --ctx 256 --log-level info 2>"$work/server.log" &
server_pid=$!

# The HTTP ports are logged once the listeners are up; the API answers 200 on /health once the pack loaded.
http_port=""
metrics_port=""
for _ in $(seq 1 300); do
  http_port=$(sed -n 's/.*HTTP API on [^ ]* (port \([0-9]*\)).*/\1/p' "$work/server.log" | head -n 1)
  metrics_port=$(sed -n 's/.*metrics at [^ ]* (port \([0-9]*\)).*/\1/p' "$work/server.log" | head -n 1)
  [ -n "$http_port" ] && [ -n "$metrics_port" ] && break
  alive || fail "strata-server exited before listening"
  sleep 0.1
done
[ -n "$http_port" ] && [ -n "$metrics_port" ] || fail "strata-server did not report its HTTP ports within 30 s"
base="http://127.0.0.1:$http_port"
for _ in $(seq 1 300); do
  code=$(curl -s -o /dev/null -w '%{http_code}' "$base/health" || true)
  [ "$code" = 200 ] && break
  alive || fail "strata-server exited while loading"
  sleep 0.1
done
[ "$code" = 200 ] || fail "/health did not answer 200 within 30 s (last: $code)"

if [ "$mode" = curl ]; then
  # Streamed: server-sent events as they come (-N), ending with [DONE].
  timeout 60 curl -sS -N --fail-with-body -H 'Content-Type: application/json' \
    -d '{"model":"tiny","prompt":"Once upon a time","max_tokens":8,"temperature":0,"ignore_eos":true,"stream":true}' \
    "$base/v1/completions" >"$work/stream.txt" || fail "streamed completion failed: $(cat "$work/stream.txt")"
  echo "--- stream"; cat "$work/stream.txt"
  [ "$(grep -c '^data: {' "$work/stream.txt")" -ge 2 ] || fail "fewer than 2 chunks streamed"
  [ "$(grep -v '^$' "$work/stream.txt" | tail -n 1)" = "data: [DONE]" ] || fail "the stream does not end with data: [DONE]"
  grep -q '"finish_reason":"length"' "$work/stream.txt" || fail "no chunk with finish_reason length"
  # Whole.
  timeout 60 curl -sS --fail-with-body -H 'Content-Type: application/json' \
    -d '{"prompt":"Once upon a time","max_tokens":8,"temperature":0,"ignore_eos":true}' \
    "$base/v1/completions" >"$work/whole.json" || fail "completion failed: $(cat "$work/whole.json")"
  echo "--- whole"; cat "$work/whole.json"; echo
  grep -q '"completion_tokens":8' "$work/whole.json" || fail "the completion's usage is not 8 tokens"
  # An error in OpenAI's shape, with its HTTP status.
  code=$(curl -sS -o "$work/error.json" -w '%{http_code}' -H 'Content-Type: application/json' \
    -d '{"prompt":"x","n":2}' "$base/v1/completions")
  echo "--- error ($code)"; cat "$work/error.json"; echo
  [ "$code" = 400 ] || fail "n = 2 answered $code, not 400"
  grep -q '"param":"n"' "$work/error.json" || fail "the error does not name the field n"
  # Metrics count what ran.
  curl -sS --fail "http://127.0.0.1:$metrics_port/metrics" >"$work/metrics.txt" || fail "/metrics failed"
  grep -q '^strata_requests_total{api="http",status="ok"} 2$' "$work/metrics.txt" ||
    fail "/metrics does not count 2 ok requests: $(grep strata_requests_total "$work/metrics.txt")"
  grep -q '^strata_requests_total{api="http",status="invalid_argument"} 1$' "$work/metrics.txt" ||
    fail "/metrics does not count the refused request"
  grep -q '^strata_time_to_first_token_seconds_count 2$' "$work/metrics.txt" || fail "no TTFT histogram"
else
  timeout 120 env NODE_PATH="$node_modules" "$node_bin" "$here/openai_node_client.js" --base-url "$base/v1" \
    --model tiny "${@:6}" || fail "openai_node_client.js failed"
fi

kill -TERM "$server_pid"
for _ in $(seq 1 100); do
  alive || break
  sleep 0.1
done
alive && fail "strata-server did not stop within 10 s of SIGTERM"
server_rc=0
wait "$server_pid" || server_rc=$?
server_pid=""
[ "$server_rc" -eq 0 ] || fail "strata-server exited with $server_rc after SIGTERM"
echo "http_api_test ($mode): ok"
