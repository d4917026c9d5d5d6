#!/usr/bin/env python3
"""soak.py: `hone serve` under a crowd of streaming clients, loopback only.

Starts `hone serve` on the model (the real engine; --test-engine with
--test-engine), then CLIENTS threads for SECONDS, each looping over random
requests on the three APIs (OpenAI chat, Responses, Anthropic messages):
  full      stream read to the end: must end with its terminal event
            (chat `data: [DONE]` after a finish_reason, Responses
            response.completed / response.incomplete, Anthropic message_stop)
  drop      disconnect after a few events (the server must cancel)
  slow      a reader that sleeps between small reads, then reads to the end
  nostream  a non-streaming request, answered 200 with the API's object
  cancel    a non-streaming request abandoned before its answer
Afterwards it waits for the server to be idle and checks, from /health:
running == 0 and kv.blocks_used == 0 (every KV block back), and the
server's RSS after the idle drop against the baseline taken after warm-up.

A failure: any 5xx, an error event, a non-dropped stream without its
terminal event, a connection error on a request not dropped by us, a KV
block still held, or RSS more than --rss-tolerance (default 5%) over the
baseline. Prints the figures; exit status 1 on any failure.

usage: bench/soak.py MODEL.gguf [--clients 64] [--seconds 600] [--hone ./hone]
                     [--test-engine] [--max-tokens 48] [--seed 1] [--idle-wait 20]
                     [--cache-idle 3] [--threads 2]
The idle drop is the server's --cache-idle timer (the prefix cache and its
memory given back); both RSS figures are taken --idle-wait seconds after
the load stops, so --idle-wait must exceed --cache-idle.
"""
import argparse
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


WORDS = "the quick brown fox jumps over a lazy dog while agents read files and call tools".split()


def prompt_text(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 60)))


def request(api, rng, stream, max_tokens):
    text = prompt_text(rng)
    if api == "chat":
        body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return "/v1/chat/completions", body
    if api == "responses":
        return "/v1/responses", {"model": "m", "input": text, "max_output_tokens": max_tokens, "stream": stream}
    return "/v1/messages", {"model": "m", "max_tokens": max_tokens, "stream": stream,
                            "messages": [{"role": "user", "content": text}]}


def terminal_ok(api, data):
    if b"event: error" in data:
        return False
    if api == "chat":
        return data.rstrip().endswith(b"data: [DONE]") and b'"finish_reason":"' in data and b'"error"' not in data
    if api == "responses":
        return (b"event: response.completed" in data or b"event: response.incomplete" in data) and \
            b"event: response.failed" not in data and b"event: error" not in data
    return b"event: message_stop" in data


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.n = {}
        self.failures = []

    def add(self, key):
        with self.lock:
            self.n[key] = self.n.get(key, 0) + 1

    def fail(self, what):
        with self.lock:
            self.failures.append(what)


def one(port, api, action, rng, st, max_tokens):
    stream = action in ("full", "drop", "slow")
    path, body = request(api, rng, stream, max_tokens)
    payload = json.dumps(body).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, payload, {"Content-Type": "application/json"})
        if action == "cancel":
            time.sleep(rng.uniform(0.0, 0.2))
            conn.sock.close()
            st.add("cancel")
            return
        r = conn.getresponse()
        if r.status >= 500:
            st.fail(f"{api} {action}: HTTP {r.status} {r.read()[:200]!r}")
            return
        if r.status != 200:
            st.fail(f"{api} {action}: HTTP {r.status} {r.read()[:200]!r}")
            return
        if action == "nostream":
            obj = json.loads(r.read())
            ok = ("choices" in obj) if api == "chat" else ("output" in obj) if api == "responses" else obj.get("type") == "message"
            if not ok:
                st.fail(f"{api} nostream: {str(obj)[:200]}")
            st.add("nostream")
            return
        if action == "drop":
            n = rng.randint(1, 6)
            for _ in range(n):
                if not r.read1(256):
                    break
            conn.sock.close()
            st.add("drop")
            return
        data = b""
        while True:
            chunk = r.read1(64 if action == "slow" else 65536)
            if not chunk:
                break
            data += chunk
            if action == "slow":
                time.sleep(0.02)
        if not terminal_ok(api, data):
            st.fail(f"{api} {action}: no terminal event; tail {data[-300:]!r}")
        st.add(action)
    except (OSError, http.client.HTTPException, ValueError) as e:
        if action not in ("drop", "cancel"):
            st.fail(f"{api} {action}: {type(e).__name__}: {e}")
    finally:
        conn.close()


def health(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/health")
    h = json.loads(c.getresponse().read())
    c.close()
    return h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--hone", default=os.environ.get("HONE_BIN", "./hone"))
    ap.add_argument("--test-engine", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--idle-wait", type=float, default=20)
    ap.add_argument("--rss-tolerance", type=float, default=0.05)
    ap.add_argument("--threads", default="2")
    ap.add_argument("--cache-idle", type=int, default=3, help="the server's --cache-idle: the idle drop (s)")
    a = ap.parse_args()

    port = free_port()
    cmd = [a.hone, "serve", "-m", a.model, "--host", "127.0.0.1", "--port", str(port), "--no-tune", "-t", a.threads,
           "--cache-idle", str(a.cache_idle)]
    if a.test_engine:
        cmd.append("--test-engine")
    srv = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    for _ in range(600):
        try:
            health(port)
            break
        except OSError:
            time.sleep(0.1)
    else:
        print("soak: the server did not come up", file=sys.stderr)
        srv.kill()
        return 1

    st = Stats()
    apis = ["chat", "responses", "messages"]
    actions = ["full"] * 5 + ["drop"] * 2 + ["slow"] + ["nostream"] * 2 + ["cancel"]

    def worker(i, until, stats):
        rng = random.Random(a.seed * 1000 + i)
        while time.time() < until:
            one(port, rng.choice(apis), rng.choice(actions), rng, stats, a.max_tokens)

    def crowd(seconds, stats):
        until = time.time() + seconds
        th = [threading.Thread(target=worker, args=(i, until, stats)) for i in range(a.clients)]
        for t in th:
            t.start()
        for t in th:
            t.join()

    def wait_idle():
        t0 = time.time()
        h = health(port)
        while time.time() - t0 < a.idle_wait and (h.get("running") or h.get("kv", {}).get("blocks_used")):
            time.sleep(0.2)
            h = health(port)
        return h

    # warm-up: a tenth of the time (at most 30 s), then the idle baseline
    warm = Stats()
    crowd(min(30.0, a.seconds / 10), warm)
    wait_idle()
    time.sleep(a.idle_wait)
    base = rss_kb(srv.pid)

    t0 = time.time()
    crowd(a.seconds, st)
    ran = time.time() - t0
    h = wait_idle()
    time.sleep(a.idle_wait)
    h = health(port)
    after = rss_kb(srv.pid)

    kv = h.get("kv", {})
    if h.get("running"):
        st.fail(f"{h.get('running')} requests still running after the soak")
    if kv.get("blocks_used"):
        st.fail(f"{kv.get('blocks_used')} KV blocks still held after the soak")
    if base and after > base * (1 + a.rss_tolerance):
        st.fail(f"RSS {after} kB after the idle drop > {base} kB baseline + {a.rss_tolerance:.0%}")

    srv.terminate()
    try:
        srv.wait(15)
    except subprocess.TimeoutExpired:
        st.fail("the server did not stop within 15 s of SIGTERM")
        srv.kill()
    err = srv.stderr.read().decode(errors="replace")
    if "ERROR" in err or "AddressSanitizer" in err or "runtime error" in err:
        st.fail("server stderr: " + err[-500:])

    total = sum(st.n.values())
    print(f"soak: {a.clients} clients, {ran:.0f} s, {total} requests ({total / ran:.1f}/s): "
          + ", ".join(f"{k} {v}" for k, v in sorted(st.n.items())))
    print(f"soak: after: running {h.get('running')}, kv {kv}; RSS baseline {base} kB, after idle {after} kB "
          f"({(after - base) / base * 100 if base else 0:+.1f}%)")
    print(f"soak: {len(st.failures)} failures")
    for f in st.failures[:20]:
        print("  " + f)
    return 1 if st.failures else 0


if __name__ == "__main__":
    sys.exit(main())
