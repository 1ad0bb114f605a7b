"""kvplan.traffic.loaders: each format read into the Traffic worked out by hand, hostile files refused
with one KvplanError naming file:line and the field, the shipped samples, and a large trace."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvplan.errors import KvplanError
from kvplan.traffic import loaders
from kvplan.traffic.loaders import (
    LOADERS,
    agent_traffic,
    load_agent,
    load_conversations,
    load_lengths,
    load_mooncake,
    load_traffic,
    sniff_kind,
)
from kvplan.traffic.model import MAX_TURNS

SAMPLES = Path(loaders.__file__).resolve().parent / "samples"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def _shape(traffic):
    return [(t.session, t.turn, [(s.key, s.tokens) for s in t.segments], t.output_tokens, t.arrival_s, t.think_s)
            for t in traffic.turns]


# --- mooncake ----------------------------------------------------------------------------------

MOONCAKE_3 = (
    '{"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [1, 2, 3]}\n'
    '{"timestamp": 1500, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]}\n'
    "\n"
    '{"timestamp": 1500.5, "input_length": 1, "output_length": 1, "hash_ids": [9], "extra": "ignored"}\n'
)


def test_mooncake_by_hand(tmp_path):
    p = _write(tmp_path, "t.jsonl", MOONCAKE_3)
    t = load_mooncake(p)
    # line 1: ceil(1100/512) = 3 blocks: 512, 512 and 1100 - 1024 = 76; at 0 ms = 0 s
    # line 2: 1024 = exactly 2 full blocks (the last is 1024 - 512 = 512); at 1.5 s
    # line 4 (line 3 is blank): 1 token in 1 block; at 1500.5 ms = 1.5005 s
    assert _shape(t) == [
        ("r1", 0, [("h1", 512), ("h2", 512), ("h3", 76)], 10, 0.0, 0.0),
        ("r2", 0, [("h1", 512), ("h2", 512)], 5, 1.5, 0.0),
        ("r4", 0, [("h9", 1)], 1, 1.5005, 0.0),
    ]
    assert t.timestamped and len(t.sessions) == 3
    assert t.turns[0].segments[0] is t.turns[1].segments[0]  # a shared block is one object
    assert "4 distinct of 6" in t.notes[0]  # ids 1, 2, 3, 9 of 3 + 2 + 1 references
    assert load_traffic(p) == t and sniff_kind(p) == "mooncake"


def test_mooncake_block_size_option(tmp_path):
    # 100 tokens in blocks of 64: ceil(100/64) = 2 ids, the last 100 - 64 = 36 tokens
    p = _write(tmp_path, "t.jsonl", '{"timestamp": 2, "input_length": 100, "output_length": 3, "hash_ids": [7, 8]}\n')
    t = load_traffic(p, "mooncake", hash_block_tokens=64)
    assert _shape(t) == [("r1", 0, [("h7", 64), ("h8", 36)], 3, 0.002, 0.0)]
    with pytest.raises(KvplanError, match="hash_ids has 2 ids but input_length 100 is 1 blocks of 512"):
        load_mooncake(p)
    with pytest.raises(KvplanError, match="hash_block_tokens"):
        load_mooncake(p, hash_block_tokens=0)


GOOD = '{"timestamp": 100, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}'
BIG = "9" * 400


@pytest.mark.parametrize("line, field", [
    ('{"timestamp": 200, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2]}', "hash_ids has 2 ids"),
    ('{"timestamp": 200, "input_length": 100, "output_length": 5, "hash_ids": [1, 2]}', "hash_ids has 2 ids"),
    ('{"timestamp": 200, "input_length": 600, "output_length": 5, "hash_ids": []}', "hash_ids has 0 ids"),
    ('{"timestamp": -1, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}', "timestamp"),
    ('{"timestamp": 50, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}', "timestamp 50 is before"),
    ('{"timestamp": 1e400, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}', "timestamp inf"),
    ('{"timestamp": NaN, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}', "NaN"),
    ('{"timestamp": "300", "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}', "timestamp '300'"),
    ('{"timestamp": true, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}', "timestamp True"),
    (f'{{"timestamp": {BIG}, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}}', "timestamp 999"),
    ('{"timestamp": 1700000000000, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}', "from the trace start"),
    ('{"timestamp": 200, "input_length": 0, "output_length": 5, "hash_ids": []}', "input_length 0"),
    ('{"timestamp": 200, "input_length": 600.5, "output_length": 5, "hash_ids": [1, 2]}', "input_length 600.5"),
    (f'{{"timestamp": 200, "input_length": {BIG}, "output_length": 5, "hash_ids": [1, 2]}}', "input_length 999"),
    ('{"timestamp": 200, "input_length": 600, "output_length": 0, "hash_ids": [1, 2]}', "output_length 0"),
    ('{"timestamp": 200, "input_length": 600, "output_length": "5", "hash_ids": [1, 2]}', "output_length '5'"),
    ('{"timestamp": 200, "input_length": 600, "hash_ids": [1, 2]}', "no 'output_length'"),
    ('{"input_length": 600, "output_length": 5, "hash_ids": [1, 2]}', "no 'timestamp'"),
    ('{"timestamp": 200, "input_length": 600, "output_length": 5}', "no 'hash_ids'"),
    ('{"timestamp": 200, "input_length": 600, "output_length": 5, "hash_ids": "1,2"}', "hash_ids '1,2'"),
    ('{"timestamp": 200, "input_length": 600, "output_length": 5, "hash_ids": [1, -2]}', r"hash_ids\[1\] -2"),
    ('{"timestamp": 200, "input_length": 600, "output_length": 5, "hash_ids": [1, "b"]}', r"hash_ids\[1\] 'b'"),
    ('{"timestamp": 200, "input_length": 600, "output_length": 5, "hash_ids": [1.0, 2]}', r"hash_ids\[0\] 1.0"),
    (f'{{"timestamp": 200, "input_length": 600, "output_length": 5, "hash_ids": [1, {BIG}]}}', r"hash_ids\[1\]"),
    ('[1, 2]', "not a trace line"),
    ('{"timestamp": 200, ', "not valid JSON"),
    ("[" * 200 + "]" * 200, "nested deeper"),
    ('{"timestamp": 200, "x": "' + "y" * (1 << 20) + '"}', "longer than"),
])
def test_mooncake_hostile_lines_name_file_line_and_field(tmp_path, line, field):
    p = _write(tmp_path, "t.jsonl", GOOD + "\n" + line + "\n" + GOOD.replace("100", "900") + "\n")
    with pytest.raises(KvplanError) as exc:
        load_mooncake(p)
    message = str(exc.value)
    assert message.startswith(f"{p}:2: "), message
    assert __import__("re").search(field, message), message
    assert "\n" not in message and len(message) < 500


def test_mooncake_empty_and_not_files(tmp_path):
    with pytest.raises(KvplanError, match="no requests"):
        load_mooncake(_write(tmp_path, "e.jsonl", "\n\n  \n"))
    with pytest.raises(KvplanError, match="not a regular file"):
        load_mooncake(Path("/dev/null"))
    with pytest.raises(KvplanError, match="folder"):
        load_mooncake(tmp_path)
    with pytest.raises(KvplanError, match="no such file"):
        load_traffic(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("kind", ["auto", *LOADERS])
def test_a_10_gb_file_is_refused_before_it_is_read(tmp_path, kind):
    p = tmp_path / "huge.jsonl"
    with open(p, "wb") as fh:  # sparse: nothing is written, the size says 10 GiB
        fh.write(GOOD.encode() + b"\n")
        fh.truncate(10 << 30)
    with pytest.raises(KvplanError, match="too large"):
        load_traffic(p, kind)


def test_200k_line_trace_loads(tmp_path):
    """Streamed line by line; blocks shared by many lines are one object each (no timing asserted)."""
    p = tmp_path / "big.jsonl"
    with open(p, "w") as fh:
        for i in range(200_000):
            fh.write(f'{{"timestamp": {i}, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, {i + 2}]}}\n')
    t = load_mooncake(p)
    assert t.num_requests == 200_000 and len(t.sessions) == 200_000
    assert t.turns[-1].arrival_s == 199.999 and t.turns[-1].segments[-1] == loaders.Segment("h200001", 76)
    assert t.turns[0].segments[0] is t.turns[-1].segments[0]
    assert t.prompt_tokens() == 200_000 * 1100


# --- conversations -----------------------------------------------------------------------------

CONVS = [
    {"id": "a", "conversations": [
        {"from": "system", "value": "You are kind."},  # 13 chars -> ceil(13/4) = 4 tokens
        {"from": "human", "value": "Hello there"},  # 11 -> 3
        {"from": "gpt", "value": "Hi! How can I help?"},  # 19 -> 5
        {"from": "human", "value": "Sum 2+2"},  # 7 -> 2
        {"from": "gpt", "value": "4"},  # 1 -> 1
    ]},
    {"id": "c", "conversations": [{"from": "human", "value": "nobody answers"}]},  # skipped
    {"id": 7, "conversations": [
        {"from": "user", "value": "ignored", "tokens": 100},  # its field: 100
        {"from": "assistant", "value": "x" * 9},  # ceil(9/4) = 3
        {"from": "assistant", "num_tokens": 2},  # its field: 2 (no text needed)
    ]},
]


def _convs_by_hand(gap=1.0, think=0.0):
    return [
        # a: turn 0 answers m0 + m1 (4 + 3 = 7 tokens) with m2 (5); turn 1 sends m0..m3 (4+3+5+2 = 14), gets 1
        ("a", 0, [("a:m0", 4), ("a:m1", 3)], 5, 0.0, 0.0),
        ("a", 1, [("a:m0", 4), ("a:m1", 3), ("a:m2", 5), ("a:m3", 2)], 1, None, think),
        # "c" has no assistant message: skipped, and "7" is the second session, starting 1 gap later
        ("7", 0, [("7:m0", 100)], 3, gap, 0.0),
        ("7", 1, [("7:m0", 100), ("7:m1", 3)], 2, None, think),
    ]


@pytest.mark.parametrize("form", ["json", "jsonl", "pretty"])
def test_conversations_by_hand(tmp_path, form):
    text = {"json": json.dumps(CONVS), "pretty": json.dumps(CONVS, indent=2),
            "jsonl": "".join(json.dumps(c) + "\n" for c in CONVS)}[form]
    p = _write(tmp_path, f"c.{form}", text)
    t = load_conversations(p)
    assert _shape(t) == _convs_by_hand()
    assert [t.turns[i].prompt_tokens for i in range(4)] == [7, 14, 100, 103]
    assert any("2 from their 'tokens' field, 6 as ceil(characters / 4)" in n for n in t.notes), t.notes
    assert any("skipped 1 conversation" in n for n in t.notes)
    assert sniff_kind(p) == "conversations" and load_traffic(p) == t
    # options: 2.5 s between sessions, 0.25 s think; 2 characters a token: "You are kind." = ceil(13/2) = 7
    t2 = load_traffic(p, "conversations", session_gap_s=2.5, think_s=0.25, chars_per_token=2.0)
    assert t2.turns[0].segments[0].tokens == 7 and t2.turns[2].arrival_s == 2.5 and t2.turns[3].think_s == 0.25


def test_an_assistant_opening_a_conversation_is_history(tmp_path):
    conv = {"id": "g", "conversations": [{"from": "gpt", "value": "Welcome!"}, {"from": "human", "value": "hey"},
                                         {"from": "gpt", "value": "hi"}]}
    t = load_conversations(_write(tmp_path, "g.json", json.dumps([conv])))
    # "Welcome!" (8 chars, 2 tokens) answers nothing: one turn, prompt g:m0 + g:m1 (2 + 1), output 1
    assert _shape(t) == [("g", 0, [("g:m0", 2), ("g:m1", 1)], 1, 0.0, 0.0)]
    assert any("opening a conversation" in n for n in t.notes)


HEAD = '[\n {"id": "a", "conversations": [\n  {"from": "human", "value": "hi"},\n'
TAIL = '\n ]}\n]\n'


@pytest.mark.parametrize("message, field", [
    ('{"from": "robot", "value": "x"}', "from 'robot'"),
    ('{"value": "x"}', "from None"),
    ('{"from": "gpt"}', "value None"),
    ('{"from": "gpt", "value": 5}', "value 5"),
    ('{"from": "gpt", "value": ["x"]}', "value list"),
    ('{"from": "gpt", "value": "x", "tokens": 0}', "tokens 0"),
    ('{"from": "gpt", "tokens": -3}', "tokens -3"),
    ('{"from": "gpt", "tokens": true}', "tokens True"),
    ('{"from": "gpt", "num_tokens": 1.5}', "num_tokens 1.5"),
    (f'{{"from": "gpt", "tokens": {BIG}}}', "tokens 999"),
    ('{"from": "gpt", "value": NaN}', "NaN"),
    ('{"from": "gpt", "tokens": 1' + "0" * 5000 + "}", "digits"),
    ('"just text"', "not an object"),
    ('{"from": "gpt", "value": "x",}', "not valid JSON"),
])
def test_conversation_hostile_messages_name_their_line(tmp_path, message, field):
    p = _write(tmp_path, "c.json", HEAD + "  " + message + TAIL)  # the bad message is on line 4
    with pytest.raises(KvplanError) as exc:
        load_conversations(p)
    text = str(exc.value)
    assert text.startswith(f"{p}:4: ") and __import__("re").search(field, text), text
    assert "\n" not in text and len(text) < 600


@pytest.mark.parametrize("body, line, field", [
    ('[\n {"id": "a", "conversations": []},\n {"id": "b",\n  "conversations": "hi"}\n]', 4, "'conversations' 'hi'"),
    ('[\n {"id": "a", "conversations": []},\n {"conversations": [],\n  "id": "a"}\n]', 4, "id 'a' repeats"),
    ('[\n {"id": 1, "conversations": []},\n {"id": "1", "conversations": []}\n]', 3, "repeats"),
    ('[\n {"id": ["x"], "conversations": []}\n]', 2, "id list"),
    ('[\n {"id": "' + "x" * 300 + '", "conversations": []}\n]', 2, "id 'xxx"),
    ('[\n {"id": "a", "conversations": []},\n 5\n]', 3, "a JSON int"),
    ('[\n {"id": "a", "conversations": []}\n\n{"id": "b"}]', 4, "expected ',' or ']'"),
    ('[\n {"id": "a", "conversations": []}\n] x', 3, "extra data"),
    ('{"id": "a", "conversations": []}\n{"id": "b", "conversations": [\n{"from": "bot"}]}\n', 3, "from 'bot'"),
    ('[\n {"id": "a", "conversations": [\n{"from": "human", "tokens": 16000000},\n{"from": "human", '
     '"tokens": 16000000},\n{"from": "gpt", "tokens": 1}]}]', 5, "32,000,000 tokens"),
])
def test_conversation_hostile_files_name_their_line(tmp_path, body, line, field):
    p = _write(tmp_path, "c.json", body)
    with pytest.raises(KvplanError) as exc:
        load_conversations(p)
    text = str(exc.value)
    assert text.startswith(f"{p}:{line}: ") and __import__("re").search(field, text), text
    assert len(text) < 600


def test_conversations_refusals_without_a_line(tmp_path):
    with pytest.raises(KvplanError, match="no conversation has an assistant message"):
        load_conversations(_write(tmp_path, "n.json", json.dumps([CONVS[1]])))
    with pytest.raises(KvplanError, match="no conversations"):
        load_conversations(_write(tmp_path, "e.json", "[]"))
    with pytest.raises(KvplanError, match="nested deeper"):
        load_conversations(_write(tmp_path, "d.json", "[" * 100_000 + "]" * 100_000))
    p = _write(tmp_path, "ok.json", json.dumps(CONVS))
    for name, value in (("chars_per_token", 0), ("session_gap_s", -1), ("think_s", float("nan")),
                        ("chars_per_token", 10 ** 400), ("session_gap_s", "1")):
        with pytest.raises(KvplanError, match=f"option {name}="):
            load_conversations(p, **{name: value})
    three = CONVS + [{"id": "d", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}]
    p3 = _write(tmp_path, "three.json", json.dumps(three))
    with pytest.raises(KvplanError, match=r":\d+: conversation 'd' would start at 3,456,000 s \(session_gap_s"):
        load_conversations(p3, session_gap_s=20 * 86400.0)  # the third kept session: 40 days in


def test_a_long_conversation_is_bounded(tmp_path, monkeypatch):
    """Replaying a conversation re-sends its history: n exchanges hold n^2 segment references, counted
    as they are built (here against a limit of 10,000: 200 exchanges would be 40,000)."""
    monkeypatch.setattr(loaders, "MAX_SEGMENT_REFS", 10_000)
    msgs = [{"from": r, "value": "x"} for _ in range(200) for r in ("human", "gpt")]
    p = _write(tmp_path, "long.jsonl", json.dumps({"id": "z", "conversations": msgs}) + "\n")
    with pytest.raises(KvplanError, match=r":1: conversation 'z' message 201: the replay would hold more than 10,000"):
        load_conversations(p)


# --- agent -------------------------------------------------------------------------------------


def test_agent_traffic_by_hand():
    t = agent_traffic(2, 3, 2, 100, 10, 5, think_s=0.5, session_rate_per_s=0.5)
    # turn t sends the group prefix (100), each earlier exchange (10 + 5) and its new message (10):
    # 100 + 10 = 110, 100 + 15 + 10 = 125, 100 + 30 + 10 = 140; session 1 is in group 1, starts at 1 / 0.5 = 2 s
    assert _shape(t) == [
        ("s0", 0, [("g0:prefix", 100), ("s0:u0", 10)], 5, 0.0, 0.0),
        ("s0", 1, [("g0:prefix", 100), ("s0:u0", 10), ("s0:a0", 5), ("s0:u1", 10)], 5, None, 0.5),
        ("s0", 2, [("g0:prefix", 100), ("s0:u0", 10), ("s0:a0", 5), ("s0:u1", 10), ("s0:a1", 5), ("s0:u2", 10)],
         5, None, 0.5),
        ("s1", 0, [("g1:prefix", 100), ("s1:u0", 10)], 5, 2.0, 0.0),
        ("s1", 1, [("g1:prefix", 100), ("s1:u0", 10), ("s1:a0", 5), ("s1:u1", 10)], 5, None, 0.5),
        ("s1", 2, [("g1:prefix", 100), ("s1:u0", 10), ("s1:a0", 5), ("s1:u1", 10), ("s1:a1", 5), ("s1:u2", 10)],
         5, None, 0.5),
    ]
    assert [x.prompt_tokens for x in t.turns] == [110, 125, 140] * 2
    # one group, no prefix, no rate: both sessions at 0, prompts 10, 25, 40
    t1 = agent_traffic(2, 3, 1, 0, 10, 5)
    assert [x.prompt_tokens for x in t1.turns] == [10, 25, 40] * 2
    assert t1.turns[0].segments[0].key == "s0:u0" and t1.turns[3].arrival_s == 0.0


def test_agent_random_draws_are_seeded():
    kw = dict(sessions=20, turns=3, groups=4, shared_prefix_tokens=64, new_tokens=8, output_tokens=4, think_s=2.0,
              session_rate_per_s=5.0, think_distribution="exponential", arrival_distribution="poisson")
    a, b, c = agent_traffic(**kw, seed=1), agent_traffic(**kw, seed=1), agent_traffic(**kw, seed=2)
    assert a == b and a != c
    starts = [x.arrival_s for x in a.turns if x.turn == 0]
    thinks = [x.think_s for x in a.turns if x.turn > 0]
    assert starts[0] == 0.0 and starts == sorted(starts) and len(set(starts)) == 20
    assert len(set(thinks)) == len(thinks) == 40 and all(w >= 0 for w in thinks)
    # the arrivals do not depend on the think distribution (separate streams)
    fixed = agent_traffic(**{**kw, "think_distribution": "fixed"}, seed=1)
    assert [x.arrival_s for x in fixed.turns] == [x.arrival_s for x in a.turns]


@pytest.mark.parametrize("change, field", [
    ({"sessions": 0}, "sessions 0"), ({"sessions": "2"}, "sessions '2'"), ({"sessions": 10 ** 400}, "sessions 1000"),
    ({"sessions": 10 ** 5000}, "sessions a whole number of about 5,001 digits"),
    ({"turns": 1.5}, "turns 1.5"), ({"groups": 3}, "groups 3"), ({"shared_prefix_tokens": -1}, "shared_prefix_tokens"),
    ({"new_tokens": 0}, "new_tokens 0"), ({"output_tokens": True}, "output_tokens True"),
    ({"think_s": -1}, "think_s -1"), ({"think_s": float("inf")}, "think_s inf"), ({"think_s": 10 ** 400}, "think_s"),
    ({"session_rate_per_s": 0}, "session_rate_per_s 0"), ({"session_rate_per_s": 1e-9}, "session_rate_per_s"),
    ({"seed": 2.5}, "seed 2.5"), ({"seed": 2 ** 80}, "seed"), ({"think_distribution": "gamma"}, "think_distribution"),
    ({"arrival_distribution": "poisson", "session_rate_per_s": None}, "poisson needs session_rate_per_s"),
    ({"sessions": MAX_TURNS, "turns": 2}, "requests"),
    ({"sessions": 1, "groups": 1, "turns": 5000, "new_tokens": 1, "output_tokens": 1}, "segment references"),
    ({"sessions": 1000, "turns": 100, "new_tokens": 10_000, "output_tokens": 10_000}, "prompt tokens in all"),
    ({"turns": 1000, "new_tokens": 10_000, "output_tokens": 10_000}, "last turn's prompt"),
])
def test_agent_parameters_are_checked(change, field):
    kw = dict(sessions=2, turns=3, groups=2, shared_prefix_tokens=100, new_tokens=10, output_tokens=5)
    with pytest.raises(KvplanError) as exc:
        agent_traffic(**{**kw, **change})
    assert str(exc.value).startswith("agent workload: ") and __import__("re").search(field, str(exc.value)), exc.value


AGENT = {"kind": "agent", "sessions": 2, "turns": 3, "groups": 1, "shared_prefix_tokens": 0, "new_tokens": 10,
         "output_tokens": 5, "think_s": 0.5}


def test_agent_file(tmp_path):
    p = _write(tmp_path, "a.json", json.dumps(AGENT, indent=2))
    t = load_agent(p)
    assert [x.prompt_tokens for x in t.turns] == [10, 25, 40] * 2 and t.source == str(p)
    assert t.turns[1].think_s == 0.5 and sniff_kind(p) == "agent" and load_traffic(p) == t
    p2 = _write(tmp_path, "b.json", json.dumps({k: v for k, v in AGENT.items() if k != "kind"}))
    assert load_agent(p2).turns == t.turns  # "kind" may be left out when the kind is named


@pytest.mark.parametrize("change, field", [
    ({"sessions": 0}, "sessions"), ({"turns": "3"}, "turns"), ({"think_s": -0.5}, "think_s"),
    ({"sessions": 10 ** 400}, "sessions"), ({"kind": "chat"}, "kind"), ({"sesions": 2}, "sesions"),
    ({"seed": None}, "seed"), ({"arrival_distribution": "poisson"}, "arrival_distribution"),
])
def test_agent_file_errors_name_the_fields_line(tmp_path, change, field):
    spec = {**AGENT, **change}
    text = json.dumps(spec, indent=1)  # one field a line: field k of the object is on line k + 2
    line = list(spec).index(field) + 2
    p = _write(tmp_path, "a.json", text)
    with pytest.raises(KvplanError) as exc:
        load_agent(p)
    assert str(exc.value).startswith(f"{p}:{line}: ") and field in str(exc.value), exc.value


def test_agent_file_other_refusals(tmp_path):
    missing = {k: v for k, v in AGENT.items() if k != "new_tokens"}
    with pytest.raises(KvplanError, match="no 'new_tokens'"):
        load_agent(_write(tmp_path, "m.json", json.dumps(missing)))
    with pytest.raises(KvplanError, match=r":3: Infinity"):
        load_agent(_write(tmp_path, "i.json", '{"kind": "agent",\n"sessions": 2,\n"think_s": Infinity}'))
    with pytest.raises(KvplanError, match=r":1: an agent workload is a JSON object"):
        load_agent(_write(tmp_path, "l.json", "[1]"))


# --- lengths and dispatch ----------------------------------------------------------------------


def test_lengths(tmp_path):
    p = _write(tmp_path, "l.jsonl", '{"prompt_tokens": 512, "output_tokens": 128}\n\n{"input_tokens": 7, "max_tokens": 3}\n')
    t = load_lengths(p)
    assert _shape(t) == [("r0", 0, [("r0:prompt", 512)], 128, 0.0, 0.0), ("r1", 0, [("r1:prompt", 7)], 3, 0.0, 0.0)]
    assert sniff_kind(p) == "lengths" and load_traffic(p) == t
    with pytest.raises(KvplanError, match=r":2: prompt_tokens and output_tokens must be >= 1"):
        load_lengths(_write(tmp_path, "b.jsonl", '{"prompt_tokens": 5, "output_tokens": 1}\n{"prompt_tokens": 0, "output_tokens": 1}'))


def test_dispatch_refusals(tmp_path):
    p = _write(tmp_path, "t.jsonl", MOONCAKE_3)
    with pytest.raises(KvplanError, match="unknown traffic kind 'csv'"):
        load_traffic(p, "csv")
    with pytest.raises(KvplanError, match="option 'chars_per_token' does not apply to mooncake"):
        load_traffic(p, chars_per_token=3.0)
    with pytest.raises(KvplanError, match="agent takes no options"):
        load_traffic(SAMPLES / "agent-sample.json", think_s=1.0)
    with pytest.raises(KvplanError, match="an empty file"):
        load_traffic(_write(tmp_path, "e.json", "\n \n"))
    for text in ("hello", '{"model": "x"}', "{\n"):
        with pytest.raises(KvplanError, match=r":1: cannot tell which traffic format"):
            load_traffic(_write(tmp_path, "u.txt", text))
    assert sniff_kind(_write(tmp_path, "b.jsonl", "\ufeff" + MOONCAKE_3)) == "mooncake"


# --- the shipped samples -----------------------------------------------------------------------


def test_samples_load_with_their_counts():
    m = load_traffic(SAMPLES / "mooncake-sample.jsonl")
    assert (m.num_requests, len(m.sessions), m.timestamped) == (200, 200, True)
    stamps = [t.arrival_s for t in m.turns]
    assert stamps == sorted(stamps) and len(set(stamps)) == 200
    assert all(600 <= t.prompt_tokens <= 8000 and 20 <= t.output_tokens <= 400 for t in m.turns)
    refs = [s.key for t in m.turns for s in t.segments]
    assert len(set(refs)) < 0.7 * len(refs)  # prefixes are shared
    firsts = {t.segments[0].key for t in m.turns}
    assert len(firsts) < 80  # most requests start with one of a few system prompts
    c = load_traffic(SAMPLES / "conversations-sample.json")
    assert (c.num_requests, len(c.sessions)) == (98, 30)
    assert all(1 <= len(turns) <= 5 for turns in c.sessions.values())
    a = load_traffic(SAMPLES / "agent-sample.json")
    # 8 sessions x 4 turns; turn t: 512 + 64 + 96 t tokens = 576, 672, 768, 864 (720 on average)
    assert (a.num_requests, len(a.sessions), a.prompt_tokens()) == (32, 8, 32 * 720)
    assert a.turns[4].arrival_s == 0.5  # session 1 at 1 / 2.0 per second


def test_samples_are_what_the_script_writes(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_samples", SAMPLES / "make_samples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(tmp_path)
    for name in ("mooncake-sample.jsonl", "conversations-sample.json", "agent-sample.json"):
        assert (tmp_path / name).read_bytes() == (SAMPLES / name).read_bytes(), name
        assert os.path.getsize(SAMPLES / name) < 200_000
