#!/usr/bin/env python3
"""Streams a generation from a strata-server (strata.v1.Inference) and prints the text as it arrives.

    python3 generate.py --stubs BUILD/services/python [--server 127.0.0.1:50051] "prompt"
    python3 generate.py ... --tls-ca ca.pem [--tls-cert client.pem --tls-key client.key] \
        [--auth-token TOKEN] "prompt"       (TLS, mutual TLS, a bearer token; STRATA_AUTH_TOKEN works too)

Needs Debian's python3-grpcio and python3-protobuf, and the stubs the build generates from
proto/strata/v1/inference.proto into BUILD/services/python (or any directory on PYTHONPATH).
Exit codes: 0 ok, 1 the server refused or failed the request (or could not be reached), 2 usage.
"""

import argparse
import os
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--server", default="127.0.0.1:50051", help="host:port of the strata-server")
    p.add_argument("--stubs", default="", help="directory holding strata/v1/inference_pb2*.py")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy (server default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-generation tokens")
    p.add_argument("--timeout", type=float, default=120.0, help="deadline of the call in seconds")
    p.add_argument("--wait", type=float, default=0.0,
                   help="seconds to keep retrying while the server is unreachable or still loading")
    add_access_flags(p)
    return p.parse_args()


def add_access_flags(p):
    """The TLS and bearer-token flags (chat.py takes them too)."""
    p.add_argument("--tls", action="store_true", help="TLS with the system's roots (implied by --tls-*)")
    p.add_argument("--tls-ca", default="", help="PEM file of the CA that signs the server's certificate")
    p.add_argument("--tls-cert", default="", help="mutual TLS: PEM file of this client's certificate")
    p.add_argument("--tls-key", default="", help="mutual TLS: PEM file of this client's private key")
    p.add_argument("--tls-server-name", default="", help="name the server's certificate must carry")
    p.add_argument("--auth-token", default=os.environ.get("STRATA_AUTH_TOKEN", ""),
                   help="bearer token (default: the STRATA_AUTH_TOKEN environment variable)")


def read_pem(path, flag):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise SystemExit(f"generate.py: error: {flag}: cannot read '{path}': {e.strerror}")


def make_channel(grpc, args):
    """A plaintext or TLS channel to args.server; dns:/// targets are balanced round-robin."""
    options = [("grpc.lb_policy_name", "round_robin")]
    if not (args.tls or args.tls_ca or args.tls_cert or args.tls_key or args.tls_server_name):
        return grpc.insecure_channel(args.server, options=options)
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("generate.py: error: --tls-cert and --tls-key go together")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=read_pem(args.tls_ca, "--tls-ca") if args.tls_ca else None,
        private_key=read_pem(args.tls_key, "--tls-key") if args.tls_key else None,
        certificate_chain=read_pem(args.tls_cert, "--tls-cert") if args.tls_cert else None)
    if args.tls_server_name:
        options.append(("grpc.ssl_target_name_override", args.tls_server_name))
    return grpc.secure_channel(args.server, credentials, options=options)


def main():
    args = parse_args()
    if args.stubs:
        sys.path.insert(0, args.stubs)
    import grpc
    from strata.v1 import inference_pb2, inference_pb2_grpc

    request = inference_pb2.GenerateRequest(text=args.prompt)
    request.sampling.max_tokens = args.max_tokens
    request.sampling.seed = args.seed
    request.sampling.ignore_eos = args.ignore_eos
    if args.temperature is not None:
        request.sampling.temperature = args.temperature

    metadata = [("authorization", "Bearer " + args.auth_token)] if args.auth_token else None
    try:
        channel = make_channel(grpc, args)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    give_up = time.monotonic() + args.wait
    with channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        while True:
            last = None
            printed = ""
            try:
                for message in stub.Generate(request, timeout=args.timeout, metadata=metadata):
                    if message.text:
                        sys.stdout.write(message.text)
                        sys.stdout.flush()
                        printed += message.text
                    if message.finish_reason != inference_pb2.FINISH_REASON_UNSPECIFIED:
                        last = message
                break
            except grpc.RpcError as e:
                # UNAVAILABLE: not listening yet, or the pack is still loading; nothing was generated.
                if e.code() == grpc.StatusCode.UNAVAILABLE and not printed and time.monotonic() < give_up:
                    time.sleep(0.2)
                    continue
                print(f"\ngenerate.py: error: {e.code().name}: {e.details()}", file=sys.stderr)
                return 1
    if printed and not printed.endswith("\n"):
        print()
    if last is None:
        print("generate.py: error: the stream ended without a finish reason", file=sys.stderr)
        return 1
    u = last.usage
    reason = inference_pb2.FinishReason.Name(last.finish_reason).replace("FINISH_REASON_", "").lower()
    print(f"-- {u.completion_tokens} tokens ({reason}) | first token {u.time_to_first_token * 1e3:.1f} ms | "
          f"decode {u.decode_tokens_per_second:.1f} tokens/s | expert hit rate {u.expert_hit_rate * 100:.1f}%",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
