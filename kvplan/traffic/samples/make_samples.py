"""Write the sample traffic files beside this script (deterministic: same bytes on every run).

    python kvplan/traffic/samples/make_samples.py

``mooncake-sample.jsonl``: 200 requests in the Mooncake trace format
(https://github.com/kvcache-ai/Mooncake/tree/main/FAST25-release/traces) with the reuse such traces
show: 4 system prompts of 2-6 full blocks that most requests start with, some requests continuing an
earlier one (its full blocks, then new ones), per-request tails; ids numbered as blocks first appear;
bursts of requests milliseconds apart between lulls of seconds. ``conversations-sample.json``: 30
ShareGPT-style conversations of English-ish text, 1-5 assistant turns each, some with a system message.
``agent-sample.json``: an agent workload's parameters (kvplan.traffic.loaders.agent_traffic).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
BLOCK = 512

_WORD_TEXT = ("the a of to and in is it that for on with as was be by this are or from at have an not which but "
         "all can more one will about there their has if up out so what when your some into time other model "
         "cache memory token request server batch prompt value table river stone light garden music paper "
         "window system user answer question explain example write code list file number data result error "
         "test simple fast slow large small first last next please thanks could would should because")
WORDS = _WORD_TEXT.split()


def mooncake_lines(n: int = 200, seed: int = 0) -> list[dict]:
    rng = random.Random(f"mooncake-sample:{seed}")
    next_id = 0

    def new_ids(k: int) -> list[int]:
        nonlocal next_id
        out = list(range(next_id, next_id + k))
        next_id += k
        return out

    prompts = [new_ids(k) for k in (2, 3, 4, 6)]  # system prompts, full blocks
    weights = (5, 3, 2, 1)
    rows: list[dict] = []
    t = 0
    for _ in range(n):
        # bursty: mostly tens of ms apart, now and then a lull of seconds
        t += 1 + int(rng.expovariate(1 / 2500) if rng.random() < 0.12 else rng.expovariate(1 / 40))
        earlier = [r for r in rows[-30:] if r["input_length"] // BLOCK >= 1 and r["input_length"] < 7000]
        if earlier and rng.random() < 0.3:  # a later turn of an earlier request: its full blocks, then new
            prev = rng.choice(earlier)
            head = prev["hash_ids"][: prev["input_length"] // BLOCK]
        elif rng.random() < 0.85:
            head = list(rng.choices(prompts, weights)[0])
        else:
            head = []
        lo = max(600, len(head) * BLOCK + 1)
        length = rng.randint(lo, max(lo, 8000))
        blocks = -(-length // BLOCK)
        rows.append({"timestamp": t, "input_length": length, "output_length": rng.randint(20, 400),
                     "hash_ids": head + new_ids(blocks - len(head))})
    return rows


def _text(rng: random.Random, lo: int, hi: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    sentences, i = [], 0
    while i < len(words):
        k = rng.randint(5, 14)
        part = " ".join(words[i:i + k])
        sentences.append(part[:1].upper() + part[1:] + rng.choice(".....?!"))
        i += k
    return " ".join(sentences)


def conversations(n: int = 30, seed: int = 0) -> list[dict]:
    rng = random.Random(f"conversations-sample:{seed}")
    out = []
    for c in range(n):
        msgs = []
        if rng.random() < 0.3:
            msgs.append({"from": "system", "value": _text(rng, 10, 30)})
        for _ in range(rng.randint(1, 5)):
            msgs.append({"from": "human", "value": _text(rng, 4, 60)})
            msgs.append({"from": "gpt", "value": _text(rng, 15, 150)})
        out.append({"id": f"sample{c:02d}", "conversations": msgs})
    return out


AGENT = {"kind": "agent", "sessions": 8, "turns": 4, "groups": 2, "shared_prefix_tokens": 512, "new_tokens": 64,
         "output_tokens": 32, "think_s": 0.5, "session_rate_per_s": 2.0, "seed": 0, "think_distribution": "fixed",
         "arrival_distribution": "fixed"}


def main(folder: Path = HERE) -> None:
    with open(folder / "mooncake-sample.jsonl", "w", encoding="utf-8", newline="\n") as fh:
        for row in mooncake_lines():
            fh.write(json.dumps(row) + "\n")
    (folder / "conversations-sample.json").write_text(json.dumps(conversations(), indent=1) + "\n", encoding="utf-8")
    (folder / "agent-sample.json").write_text(json.dumps(AGENT, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
