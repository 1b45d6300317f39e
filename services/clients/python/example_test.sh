#!/usr/bin/env bash
# ctest python_client_example: starts a real strata-server on a free loopback port with a tiny synthesized
# pack, runs generate.py and chat.py against it and checks that they print generated text and exit 0, then stops
# the server with SIGTERM and checks that it exits 0. Then generate.py over mutual TLS with a bearer token
# (certificates made here with openssl), and the refusals without the token or the client certificate.
# Every step is bounded in time.
#
#   example_test.sh STRATA_SERVER STRATA_PACK STUBS_DIR [PYTHON]
set -euo pipefail
server_bin=$1
pack_bin=$2
stubs=$3
python=${4:-python3}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/strata-pyclient.XXXXXX)
server_pid=""

cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# True while the server runs (an exited child stays a zombie until waited for, and kill -0 still finds it).
alive() {
  [ -r "/proc/$server_pid/stat" ] && ! grep -q '^[0-9]* (.*) Z' "/proc/$server_pid/stat" 2>/dev/null
}

fail() {
  echo "example_test: $*" >&2
  echo "--- server log" >&2
  cat "$work/server.log" >&2 || true
  exit 1
}

timeout 60 "$pack_bin" synth --arch qwen3moe --preset tiny --pack-only --scheme s4 --threads 2 \
  --out "$work/tiny" >/dev/null

"$server_bin" --pack "$work/tiny" --listen 127.0.0.1:0 --threads 1 --max-seqs 2 --ctx 256 \
  --log-level info 2>"$work/server.log" &
server_pid=$!

# The server logs its bound port once it listens (before the pack has loaded).
port=""
for _ in $(seq 1 300); do
  port=$(sed -n 's/.*listening on [^ ]* (port \([0-9]*\)).*/\1/p' "$work/server.log" | head -n 1)
  [ -n "$port" ] && break
  alive || fail "strata-server exited before listening"
  sleep 0.1
done
[ -n "$port" ] || fail "strata-server did not report its port within 30 s"

rc=0
timeout 90 "$python" "$here/generate.py" --stubs "$stubs" --server "127.0.0.1:$port" --wait 30 \
  --max-tokens 16 --temperature 0 --ignore-eos "Once upon a time" >"$work/out.txt" 2>"$work/err.txt" || rc=$?
echo "--- generate.py stdout"
cat "$work/out.txt"
echo "--- generate.py stderr"
cat "$work/err.txt"
[ "$rc" -eq 0 ] || fail "generate.py exited with $rc"
grep -q '[^[:space:]]' "$work/out.txt" || fail "generate.py printed no text"
grep -q '16 tokens (length)' "$work/err.txt" || fail "generate.py printed no summary"
grep -q 'tokens/s' "$work/err.txt" || fail "generate.py printed no speed"

# chat.py: a conversation from stdin, two user lines, each answered through the pack's chat template.
rc=0
printf 'Hello\nTell me a story\n' | timeout 90 "$python" "$here/chat.py" --stubs "$stubs" \
  --server "127.0.0.1:$port" --system "Be brief." --max-tokens 8 --temperature 0 --ignore-eos \
  >"$work/chat_out.txt" 2>"$work/chat_err.txt" || rc=$?
echo "--- chat.py stdout"
cat "$work/chat_out.txt"
echo "--- chat.py stderr"
cat "$work/chat_err.txt"
[ "$rc" -eq 0 ] || fail "chat.py exited with $rc"
[ "$(grep -c '8 tokens (length)' "$work/chat_err.txt")" -eq 2 ] || fail "chat.py did not answer both messages"
[ "$(wc -l <"$work/chat_out.txt")" -ge 2 ] || fail "chat.py printed fewer than two replies"

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

# Mutual TLS and a bearer token.
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2"
(
  cd "$work"
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >server.ext
  openssl req -x509 $ec -subj /CN=test-ca -keyout ca.key -out ca.pem
  openssl req $ec -subj /CN=localhost -keyout server.key -out server.csr
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext -out server.pem
  openssl req $ec -subj /CN=client -keyout client.key -out client.csr
  openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out client.pem
) >"$work/openssl.log" 2>&1 || { cat "$work/openssl.log" >&2; fail "openssl could not make the test certificates"; }
echo "example-token-0123456789" >"$work/tokens"

"$server_bin" --pack "$work/tiny" --listen 127.0.0.1:0 --threads 1 --max-seqs 2 --ctx 256 --log-level info \
  --tls-cert "$work/server.pem" --tls-key "$work/server.key" --tls-client-ca "$work/ca.pem" \
  --auth-tokens-file "$work/tokens" 2>"$work/server.log" &
server_pid=$!
port=""
for _ in $(seq 1 300); do
  port=$(sed -n 's/.*listening on [^ ]* (port \([0-9]*\)).*/\1/p' "$work/server.log" | head -n 1)
  [ -n "$port" ] && break
  alive || fail "strata-server (TLS) exited before listening"
  sleep 0.1
done
[ -n "$port" ] || fail "strata-server (TLS) did not report its port within 30 s"

tls=(--tls-ca "$work/ca.pem" --tls-cert "$work/client.pem" --tls-key "$work/client.key")
rc=0
STRATA_AUTH_TOKEN=example-token-0123456789 timeout 90 "$python" "$here/generate.py" --stubs "$stubs" \
  --server "127.0.0.1:$port" --wait 30 "${tls[@]}" --max-tokens 8 --temperature 0 --ignore-eos "Once upon" \
  >"$work/out.txt" 2>"$work/err.txt" || rc=$?
[ "$rc" -eq 0 ] || { cat "$work/err.txt" >&2; fail "generate.py over mutual TLS with a token exited with $rc"; }
grep -q '8 tokens (length)' "$work/err.txt" || fail "generate.py over mutual TLS printed no summary"

rc=0
STRATA_AUTH_TOKEN=example-token-0123456789 timeout 90 "$python" "$here/chat.py" --stubs "$stubs" \
  --server "127.0.0.1:$port" --wait 30 "${tls[@]}" --max-tokens 8 --temperature 0 --ignore-eos "Hello" \
  >"$work/out.txt" 2>"$work/err.txt" || rc=$?
[ "$rc" -eq 0 ] || { cat "$work/err.txt" >&2; fail "chat.py over mutual TLS with a token exited with $rc"; }
grep -q '8 tokens (length)' "$work/err.txt" || fail "chat.py over mutual TLS printed no summary"

rc=0
timeout 60 "$python" "$here/generate.py" --stubs "$stubs" --server "127.0.0.1:$port" "${tls[@]}" \
  --auth-token wrong-token-0123456789 "Once upon" >"$work/out.txt" 2>"$work/err.txt" || rc=$?
[ "$rc" -eq 1 ] && grep -q UNAUTHENTICATED "$work/err.txt" || fail "a wrong token was not refused (exit $rc)"

rc=0
timeout 60 "$python" "$here/generate.py" --stubs "$stubs" --server "127.0.0.1:$port" --tls-ca "$work/ca.pem" \
  --auth-token example-token-0123456789 --timeout 10 "Once upon" >"$work/out.txt" 2>"$work/err.txt" || rc=$?
[ "$rc" -eq 1 ] || fail "a client without a certificate was not refused (exit $rc)"

kill -TERM "$server_pid"
server_rc=0
wait "$server_pid" || server_rc=$?
server_pid=""
[ "$server_rc" -eq 0 ] || fail "strata-server (TLS) exited with $server_rc after SIGTERM"
echo "example_test: ok"
