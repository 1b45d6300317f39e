#!/usr/bin/env python3
"""Chats with the model of a strata-server (strata.v1.Inference Chat): the server renders the conversation
with the model's own chat template and streams the reply.

    python3 chat.py --stubs BUILD/services/python [--server 127.0.0.1:50051] [--system "..."] "message" \
        ["reply" "message" ...]     # one reply to the conversation the arguments spell (user first)
    python3 chat.py --stubs BUILD/services/python                 # one user message per line of stdin
    python3 chat.py ... --tls-ca ca.pem [--tls-cert client.pem --tls-key client.key] [--auth-token T] "message"

Needs Debian's python3-grpcio and python3-protobuf, and the stubs the build generates from
proto/strata/v1/inference.proto into BUILD/services/python (or any directory on PYTHONPATH).
Exit codes: 0 ok, 1 the server refused or failed the request (or could not be reached), 2 usage.
"""

import argparse
import sys
import time

from generate import add_access_flags, make_channel  # the same TLS, token and round-robin handling


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("messages", nargs="*", help="user, assistant, user, ... turns; none: read lines from stdin")
    p.add_argument("--server", default="127.0.0.1:50051", help="host:port of the strata-server")
    p.add_argument("--stubs", default="", help="directory holding strata/v1/inference_pb2*.py")
    p.add_argument("--system", default="", help="a system prompt, sent as the first message")
    p.add_argument("--thinking", choices=["true", "false"], default=None,
                   help="enable_thinking, for templates that read it (Qwen3, DeepSeek-V3.1, GLM-4.6)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy (server default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-generation tokens")
    p.add_argument("--timeout", type=float, default=120.0, help="deadline of each call in seconds")
    p.add_argument("--wait", type=float, default=0.0,
                   help="seconds to keep retrying while the server is unreachable or still loading")
    add_access_flags(p)
    args = p.parse_args()
    if args.messages and len(args.messages) % 2 == 0:
        p.error("messages alternate user, assistant, user, ... and end with the user's (an odd number)")
    return args


def reply(stub, inference_pb2, request, args, give_up):
    """Streams one reply to stdout; returns its text, or None after reporting an error."""
    import grpc
    while True:
        last = None
        printed = ""
        try:
            metadata = [("authorization", "Bearer " + args.auth_token)] if args.auth_token else None
            for message in stub.Chat(request, timeout=args.timeout, metadata=metadata):
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
            print(f"\nchat.py: error: {e.code().name}: {e.details()}", file=sys.stderr)
            return None
    if printed and not printed.endswith("\n"):
        print()
    if last is None:
        print("chat.py: error: the stream ended without a finish reason", file=sys.stderr)
        return None
    u = last.usage
    reason = inference_pb2.FinishReason.Name(last.finish_reason).replace("FINISH_REASON_", "").lower()
    print(f"-- {u.completion_tokens} tokens ({reason}) | prompt {u.prompt_tokens} tokens | first token "
          f"{u.time_to_first_token * 1e3:.1f} ms | decode {u.decode_tokens_per_second:.1f} tokens/s",
          file=sys.stderr)
    return printed


def main():
    args = parse_args()
    if args.stubs:
        sys.path.insert(0, args.stubs)
    import grpc
    from strata.v1 import inference_pb2, inference_pb2_grpc

    request = inference_pb2.ChatRequest(system_prompt=args.system)
    request.sampling.max_tokens = args.max_tokens
    request.sampling.seed = args.seed
    request.sampling.ignore_eos = args.ignore_eos
    if args.temperature is not None:
        request.sampling.temperature = args.temperature
    if args.thinking is not None:
        request.enable_thinking = args.thinking == "true"

    give_up = time.monotonic() + args.wait
    try:
        channel = make_channel(grpc, args)  # dns:///name:port targets are balanced round-robin
    except SystemExit as e:
        print(str(e).replace("generate.py", "chat.py"), file=sys.stderr)
        return 2
    with channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        if args.messages:
            for i, text in enumerate(args.messages):
                request.messages.add(role="user" if i % 2 == 0 else "assistant", content=text)
            return 0 if reply(stub, inference_pb2, request, args, give_up) is not None else 1
        for line in sys.stdin:
            line = line.rstrip("\n")
            if not line:
                continue
            request.messages.add(role="user", content=line)
            text = reply(stub, inference_pb2, request, args, give_up)
            if text is None:
                return 1
            request.messages.add(role="assistant", content=text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
