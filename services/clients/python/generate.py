#!/usr/bin/env python3
"""Streams a generation from a strata-server (strata.v1.Inference) and prints the text as it arrives.

    python3 generate.py --stubs BUILD/services/python [--server 127.0.0.1:50051] "prompt"

Needs Debian's python3-grpcio and python3-protobuf, and the stubs the build generates from
proto/strata/v1/inference.proto into BUILD/services/python (or any directory on PYTHONPATH).
Exit codes: 0 ok, 1 the server refused or failed the request (or could not be reached), 2 usage.
"""

import argparse
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
    return p.parse_args()


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

    give_up = time.monotonic() + args.wait
    with grpc.insecure_channel(args.server) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        while True:
            last = None
            printed = ""
            try:
                for message in stub.Generate(request, timeout=args.timeout):
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
