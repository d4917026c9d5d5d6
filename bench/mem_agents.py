#!/usr/bin/env python3
"""Memory per agent: S agent sessions sharing a system prompt, each grown to a
target context, against one OpenAI-compatible server (hone serve or llama.cpp's
llama-server), then the server's memory read while all sessions are still cached.

usage: bench/mem_agents.py --port PORT --pid PID --kind hone|llama [--log FILE]
                           [--sessions 4] [--system 4000] [--context 8000]
                           [--turns 4] [--turn-tokens 150] [--max-tokens 8] [--seed 1]

Prompts are token-id arrays ("prompt": [ids] on /v1/completions, which both
servers accept), the same ids for both servers: a shared system prompt of
--system tokens, then per session its own tokens so that the first request
holds context - system - turns * turn-tokens tokens of its own; then --turns
short turns, each appending --turn-tokens new tokens to the previous prompt
(the previous answer is not echoed back: its place is taken by the new turn's
tokens, so the prompt each turn is the same on both servers). Each request
generates --max-tokens tokens at temperature 0. The first request of each
session runs alone (session 0 first, so the system prompt is computed once
where the server can share it); the later turns of all sessions run at once.
llama-server requests name their slot (id_slot = session), so each session
keeps its slot.

Then it prints, for the process PID: VmRSS and VmHWM from /proc/PID/status;
for hone the KV figures from GET /metrics (hone_kv_bytes, hone_kv_peak_bytes,
hone_engine_bytes, hone_resident_bytes, per-session own/shared bytes) and
GET /v1/hone/status; for llama-server the KV buffer sizes from its log
(--log, the "KV buffer size" lines). Then memory per agent (KV / sessions,
RSS / sessions). Standard library only.
"""
import argparse
import json
import random
import re
import sys
import threading
import time
import urllib.request


def post(port, path, body, timeout=3600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as r:
        return r.read().decode()


def proc_status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def mib(b):
    return b / 1048576.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--kind", choices=("hone", "llama"), required=True)
    ap.add_argument("--log", help="llama-server's log (stderr), for its KV buffer size")
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--system", type=int, default=4000)
    ap.add_argument("--context", type=int, default=8000)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--turn-tokens", type=int, default=150)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=150000, help="token ids are drawn from [100, VOCAB)")
    a = ap.parse_args()

    rng = random.Random(a.seed)
    ids = lambda n: [rng.randrange(100, a.vocab) for _ in range(n)]
    first_own = a.context - a.system - a.turns * a.turn_tokens
    if first_own <= 0:
        sys.exit("mem_agents: --context must exceed --system + turns * turn-tokens")
    system = ids(a.system)
    prompts = [system + ids(first_own) for _ in range(a.sessions)]
    turns = [[ids(a.turn_tokens) for _ in range(a.turns)] for _ in range(a.sessions)]
    log = []
    lock = threading.Lock()

    def request(s, prompt):
        body = {"prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0}
        if a.kind == "llama":
            body.update(id_slot=s, cache_prompt=True)
        t0 = time.time()
        r = post(a.port, "/v1/completions", body)
        dt = time.time() - t0
        u = r.get("usage", {})
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
        with lock:
            log.append((s, len(prompt), u.get("completion_tokens"), cached, dt))
            print(f"session {s}: prompt {len(prompt)} tokens, generated {u.get('completion_tokens')}, "
                  f"cached {cached}, {dt:.1f} s", file=sys.stderr, flush=True)

    t_start = time.time()
    for s in range(a.sessions):
        request(s, prompts[s])

    def later(s):
        p = prompts[s]
        for t in turns[s]:
            p = p + t
            request(s, p)

    th = [threading.Thread(target=later, args=(s,)) for s in range(a.sessions)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.time() - t_start
    if len(log) != a.sessions * (1 + a.turns):
        sys.exit("mem_agents: some requests failed")
    time.sleep(1)

    res = {"kind": a.kind, "sessions": a.sessions, "system": a.system, "context": a.context,
           "tokens_per_session": a.context + a.max_tokens, "wall_s": round(wall, 1)}
    res.update(proc_status(a.pid))
    if a.kind == "hone":
        m = {}
        sess = {}
        for line in get(a.port, "/metrics").splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, _, val = line.rpartition(" ")
            mm = re.match(r'hone_session_kv_bytes\{id="(\d+)",kind="(\w+)"\}', name)
            if mm:
                sess.setdefault(mm.group(1), {})[mm.group(2)] = float(val)
            else:
                m[name] = float(val)
        for k in ("hone_kv_bytes", "hone_kv_peak_bytes", "hone_engine_bytes", "hone_model_bytes",
                  "hone_model_file_bytes", "hone_resident_bytes", "hone_alloc_bytes", "hone_kv_block_bytes",
                  "hone_kv_blocks_backed", 'hone_kv_blocks{state="used"}', 'hone_kv_blocks{state="cached"}',
                  'hone_kv_blocks{state="free"}'):
            if k in m:
                res[k] = int(m[k])
        res["live_sessions_in_metrics"] = len(sess)
        res["status"] = json.loads(get(a.port, "/v1/hone/status"))
        kv = res["hone_kv_bytes"]
    else:
        kv = 0
        lines = []
        if a.log:
            with open(a.log, errors="replace") as f:
                for line in f:
                    if "buffer size" in line:
                        lines.append(line.strip())
                    mm = re.search(r"KV buffer size =\s*([\d.]+) MiB", line)
                    if mm:
                        kv += float(mm.group(1)) * 1048576
        res["log_buffer_lines"] = lines
        res["kv_bytes"] = int(kv)
    res["kv_per_agent_mib"] = round(mib(kv) / a.sessions, 1)
    res["rss_per_agent_mib"] = round(mib(res["VmRSS"]) / a.sessions, 1)
    res["hwm_per_agent_mib"] = round(mib(res["VmHWM"]) / a.sessions, 1)
    print(json.dumps(res, indent=1))
    print(f"{a.kind}: KV {mib(kv):.1f} MiB ({res['kv_per_agent_mib']} per agent), "
          f"VmRSS {mib(res['VmRSS']):.1f} MiB ({res['rss_per_agent_mib']} per agent), "
          f"VmHWM {mib(res['VmHWM']):.1f} MiB, {wall:.0f} s")


if __name__ == "__main__":
    main()
