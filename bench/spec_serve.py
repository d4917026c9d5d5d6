#!/usr/bin/env python3
"""spec_serve.py: N concurrent sessions through `hone serve`, --spec auto vs off.

Starts `hone serve` on a free loopback port for each mode in turn (alternating,
ROUNDS times), sends N chat requests at once (temperature 0, max_tokens G; half
ask to repeat a passage, half ask a free question, which this model answers in a
few dozen tokens), and prints the aggregate completion tokens per second (all
tokens / wall time from the first request to the last response), whether every
response's text equals the other mode's, and the speculative counters from the
final usage.

usage: bench/spec_serve.py [HONE] [MODEL] [--sessions 8] [--tokens 512] [--rounds 3] [--threads 2]
"""
import argparse, json, os, re, socket, subprocess, sys, threading, time, urllib.request

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def start(hone, model, spec, threads):
    port = free_port()
    p = subprocess.Popen([hone, "serve", "-m", model, "--port", str(port), "-t", str(threads), "--no-tune",
                          "--spec", spec], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1).read(); return p, port
        except Exception:
            time.sleep(0.1)
    p.kill(); raise SystemExit("hone serve did not start")

def ask(port, msg, G, out, i):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": msg}], "temperature": 0,
                       "max_tokens": G}).encode()
    rq = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                {"Content-Type": "application/json"})
    out[i] = json.loads(urllib.request.urlopen(rq, timeout=600).read())

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hone", nargs="?", default="./hone")
    ap.add_argument("model", nargs="?", default="../shared/data/models/qwen3-agent-q8_0.gguf")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    # the passage bench/spec.sh repeats (frozen, so editing DESIGN.md does not change the
    # task), in overlapping slices of whole lines (~450 tokens, which this model reproduces
    # well), each followed by "Repeat it." (the form under which it copies)
    passage = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "spec_data", "passage.txt")).read()
    def cut(i):
        s = passage.rfind("\n", 0, 700 * i) + 1 if i else 0
        t = passage[s:s + 1800]
        return t[:t.rfind("\n")]
    msgs = []
    for i in range(a.sessions):
        if i % 2 == 0:
            msgs.append(cut((i // 2) % 4) + "\n\nRepeat it.")
        else:
            msgs.append(["Explain how a CPU cache works.", "What is a mutex?", "Describe the water cycle.",
                         "Write a function that reverses a list in Python."][(i // 2) % 4])
    texts = {}
    rates = {"off": [], "auto": []}
    for r in range(a.rounds):
        for spec in ("off", "auto"):
            p, port = start(a.hone, a.model, spec, a.threads)
            try:
                out = [None] * a.sessions
                t0 = time.time()
                th = [threading.Thread(target=ask, args=(port, msgs[i], a.tokens, out, i)) for i in range(a.sessions)]
                for t in th: t.start()
                for t in th: t.join()
                wall = time.time() - t0
            finally:
                p.terminate(); p.wait()
            toks = sum(o["usage"]["completion_tokens"] for o in out)
            d = sum(o["usage"].get("speculative", {}).get("drafted_tokens", 0) for o in out)
            acc = sum(o["usage"].get("speculative", {}).get("accepted_tokens", 0) for o in out)
            texts.setdefault(spec, []).append([o["choices"][0]["message"].get("content") for o in out])
            rates[spec].append(toks / wall)
            print(f"round {r + 1} {spec:4s}: {toks} tokens in {wall:.2f} s, {toks / wall:.1f} tok/s aggregate, "
                  f"drafted {d}, accepted {acc}", flush=True)
    same = all(x == y for x, y in zip(texts["off"], texts["auto"]))
    diff = lambda u, v: sum(x != y for x, y in zip(u, v))
    # the same mode twice: prefill numerics depend on how requests arriving at
    # different moments were batched, with or without speculation
    print("sessions whose text differs: off vs auto per round", [diff(x, y) for x, y in zip(texts["off"], texts["auto"])],
          "; off round 1 vs later rounds", [diff(texts["off"][0], y) for y in texts["off"][1:]],
          "; auto round 1 vs later", [diff(texts["auto"][0], y) for y in texts["auto"][1:]])
    med = lambda v: sorted(v)[len(v) // 2]
    print(f"median aggregate: off {med(rates['off']):.1f}, auto {med(rates['auto']):.1f} tok/s, "
          f"ratio {med(rates['auto']) / med(rates['off']):.2f}; same text in every session: {'yes' if same else 'NO'}")

main()
