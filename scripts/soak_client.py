#!/usr/bin/env python3
"""The load of scripts/soak: many concurrent Generate streams against one strata-server.

    soak_client.py --stubs DIR --server HOST:PORT --pid PID --seconds S [--streams 64] [--seed N]

First every prompt of a fixed set is generated alone (greedy, ignoring EOS, --max-tokens tokens): the
references. Then --streams threads run streams for --seconds: each takes a random prompt and a random
length, and either reads to the end, cancels after a random number of messages, or sets a short random
deadline. A stream that completes must give exactly the first tokens of its prompt's reference (a wrong
token otherwise); a cancelled one must end CANCELLED, a timed-out one DEADLINE_EXCEEDED (or OK, compared
alike, when it finished first); any other ending is an error. The server's RSS (/proc/PID/status) is sampled
twice a second during the load. Prints one summary line; exit 0 when there were no wrong tokens, no errors,
and the mean RSS of the last quarter is within 10% + 16 MiB of the first quarter's; 1 otherwise.
"""

import argparse
import random
import sys
import threading
import time

PROMPTS = 16


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stubs", required=True, help="directory holding strata/v1/inference_pb2*.py")
    p.add_argument("--server", required=True, help="host:port of the strata-server")
    p.add_argument("--pid", type=int, required=True, help="the server's process id, for its RSS")
    p.add_argument("--seconds", type=float, required=True, help="how long the concurrent load runs")
    p.add_argument("--streams", type=int, default=64, help="concurrent streams")
    p.add_argument("--max-tokens", type=int, default=96, help="the longest stream")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    if args.seconds <= 0 or args.streams < 1 or args.max_tokens < 1:
        p.error("--seconds must be > 0, --streams and --max-tokens >= 1")
    return args


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {"completed": 0, "cancelled": 0, "timed_out": 0, "wrong": 0, "errors": 0, "tokens": 0}
        self.first_errors = []

    def add(self, key, n=1, detail=None):
        with self.lock:
            self.counts[key] += n
            if detail and len(self.first_errors) < 5:
                self.first_errors.append(detail)


def main():
    args = parse_args()
    sys.path.insert(0, args.stubs)
    import grpc
    from strata.v1 import inference_pb2, inference_pb2_grpc

    rng = random.Random(args.seed)
    channel = grpc.insecure_channel(args.server)
    stub = inference_pb2_grpc.InferenceStub(channel)
    give_up = time.monotonic() + 120
    while True:  # UNAVAILABLE while the pack loads
        try:
            vocab = stub.GetModelInfo(inference_pb2.GetModelInfoRequest(), timeout=10).vocab_size
            break
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > give_up:
                raise
            time.sleep(0.2)

    def request(prompt, max_tokens):
        r = inference_pb2.GenerateRequest()
        r.tokens.ids.extend(prompt)
        r.sampling.temperature = 0
        r.sampling.ignore_eos = True
        r.sampling.max_tokens = max_tokens
        return r

    prompts = [[rng.randrange(1, vocab) for _ in range(rng.randint(1, 24))] for _ in range(PROMPTS)]
    references = []
    for prompt in prompts:
        tokens = []
        for message in stub.Generate(request(prompt, args.max_tokens), timeout=120):
            tokens.extend(message.tokens)
        references.append(tokens)

    tally = Tally()
    stop_at = time.monotonic() + args.seconds
    rss = []

    def sample_rss():
        while time.monotonic() < stop_at:
            rss.append(rss_kib(args.pid))
            time.sleep(0.5)

    def worker(seed):
        local = random.Random(seed)
        while time.monotonic() < stop_at:
            which = local.randrange(PROMPTS)
            n = local.randint(1, args.max_tokens)
            mode = local.choices(["complete", "cancel", "deadline"], weights=[70, 15, 15])[0]
            timeout = local.uniform(0.005, 0.2) if mode == "deadline" else 120
            cancel_after = local.randint(1, 4)
            tokens = []
            call = stub.Generate(request(prompts[which], n), timeout=timeout)
            try:
                for i, message in enumerate(call):
                    tokens.extend(message.tokens)
                    if mode == "cancel" and i + 1 >= cancel_after:
                        call.cancel()
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code = e.code()
            tally.add("tokens", len(tokens))
            if code == grpc.StatusCode.OK:
                tally.add("completed")
                if tokens != references[which][:n]:
                    tally.add("wrong", 1, f"prompt {which}, {n} tokens: got {tokens[:8]}..., "
                                          f"expected {references[which][:8]}...")
            elif code == grpc.StatusCode.CANCELLED and mode == "cancel":
                tally.add("cancelled")
            elif code == grpc.StatusCode.DEADLINE_EXCEEDED and mode == "deadline":
                tally.add("timed_out")
            else:
                tally.add("errors", 1, f"{mode} stream ended {code.name}")

    sampler = threading.Thread(target=sample_rss)
    sampler.start()
    workers = [threading.Thread(target=worker, args=(args.seed * 1000 + i,)) for i in range(args.streams)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    sampler.join()
    channel.close()

    quarter = max(1, len(rss) // 4)
    first = sum(rss[:quarter]) / quarter / 1024
    last = sum(rss[-quarter:]) / quarter / 1024
    rss_flat = last <= first * 1.10 + 16
    c = tally.counts
    print(f"soak: {c['completed']} completed, {c['cancelled']} cancelled, {c['timed_out']} timed out, "
          f"{c['tokens']} tokens, {c['wrong']} wrong, {c['errors']} errors; RSS first quarter {first:.1f} MiB, "
          f"last quarter {last:.1f} MiB ({len(rss)} samples){'' if rss_flat else ' NOT FLAT'}")
    for detail in tally.first_errors:
        print(f"soak: {detail}")
    ok = c["wrong"] == 0 and c["errors"] == 0 and rss_flat and c["completed"] > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
