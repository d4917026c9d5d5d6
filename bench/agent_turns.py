#!/usr/bin/python3
"""agent_turns.py: agent-shaped sessions against an OpenAI-compatible server (hone serve,
llama-server), per turn: prompt tokens, tokens served from the server's cache, and the time to
the first streamed token.

usage: bench/agent_turns.py PORT [SESSIONS 4] [TURNS 6] [SYSTEM_WORDS 2000] [MAX_TOKENS 16]

S sessions run at once; each starts with the same system prompt of SYSTEM_WORDS words and, every
turn, appends a user message of 60 words and resends the whole conversation (temperature 0,
streaming). The cached count is the server's own: usage.prompt_tokens_details.cached_tokens
(hone, OpenAI) or timings.cache_n (llama-server). Prints one line per turn, then per turn index
the median TTFT and the cached share, and the whole run's wall time.
"""
import json
import random
import statistics
import sys
import threading
import time
import urllib.request

port = int(sys.argv[1])
S = int(sys.argv[2]) if len(sys.argv) > 2 else 4
T = int(sys.argv[3]) if len(sys.argv) > 3 else 6
W = int(sys.argv[4]) if len(sys.argv) > 4 else 2000
G = int(sys.argv[5]) if len(sys.argv) > 5 else 16
rng = random.Random(11)
words = ("file function return value error test build module memory thread cache token "
         "request server client kernel tensor layer model prompt session agent tool call").split()
system = "You are a coding agent. Tools: " + " ".join(rng.choice(words) for _ in range(W))
rows = []
lock = threading.Lock()


def turn(msgs):
    body = {"model": "m", "messages": msgs, "max_tokens": G, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    ttft = None
    text, prompt, cached = "", 0, 0
    with urllib.request.urlopen(req, timeout=1200) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            ev = json.loads(data)
            for ch in ev.get("choices") or []:
                piece = (ch.get("delta") or {}).get("content") or ""
                if piece and ttft is None:
                    ttft = time.time() - t0
                text += piece
            u = ev.get("usage")
            if u:
                prompt = u.get("prompt_tokens", prompt)
                cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", cached)
            tm = ev.get("timings")
            if tm and "cache_n" in tm:
                cached = tm["cache_n"]
                prompt = prompt or tm.get("cache_n", 0) + tm.get("prompt_n", 0)
    if ttft is None:
        ttft = time.time() - t0
    return text, prompt, cached, ttft


def session(k):
    msgs = [{"role": "system", "content": system}]
    r2 = random.Random(k)
    for t in range(T):
        msgs.append({"role": "user", "content": f"Session {k} turn {t}: " + " ".join(r2.choice(words) for _ in range(60))})
        try:
            text, prompt, cached, ttft = turn(msgs)
        except Exception as e:  # noqa: BLE001
            print(f"session {k} turn {t}: {e}", flush=True)
            return
        msgs.append({"role": "assistant", "content": text})
        with lock:
            rows.append((k, t, prompt, cached, ttft))
            print(f"session {k} turn {t}: prompt {prompt} cached {cached} new {prompt - cached} ttft {ttft * 1e3:.0f} ms",
                  flush=True)


t0 = time.time()
th = [threading.Thread(target=session, args=(k,)) for k in range(S)]
for x in th:
    x.start()
for x in th:
    x.join()
wall = time.time() - t0
print("turn | median prompt | median cached | median new | median TTFT ms")
for t in range(T):
    r = [x for x in rows if x[1] == t]
    if r:
        print(f"{t} | {statistics.median(x[2] for x in r):.0f} | {statistics.median(x[3] for x in r):.0f} | "
              f"{statistics.median(x[2] - x[3] for x in r):.0f} | {statistics.median(x[4] for x in r) * 1e3:.0f}")
later = [x for x in rows if x[1] > 0]
pt = sum(x[2] for x in later)
ct = sum(x[3] for x in later)
print(f"{len(rows)}/{S * T} turns ok; later turns cached {100.0 * ct / pt if pt else 0:.1f}% of prompt tokens; "
      f"wall {wall:.1f} s")
sys.exit(0 if len(rows) == S * T else 1)
