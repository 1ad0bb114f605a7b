"""Traffic from files: timestamped traces, recorded conversations, agent workloads, lengths-only traces.

``load_traffic(path, kind="auto", **options)`` reads one file into a checked
:class:`~kvplan.traffic.model.Traffic`; ``kind`` is one of ``LOADERS`` (``auto`` tells them apart by
the first non-empty line). Every file is read through kvplan.paths (regular files only, at most
``paths.MAX_FILE_BYTES``, JSON nesting capped, no NaN/Infinity), every count and time is bounded
before it is used (a 400-digit number is refused, never converted), and every refusal is one
KvplanError naming ``file:line`` and the field.

**mooncake** -- the JSONL traces kvcache-ai/Mooncake publishes
(https://github.com/kvcache-ai/Mooncake/tree/main/FAST25-release/traces), one request a line::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ..., 2353]}

``timestamp``: milliseconds from the trace start (never decreasing); ``hash_ids``: one id per
512-token block of the prompt, chained (an id names its block *and* everything before it), so
``len(hash_ids) == ceil(input_length / 512)``. Each line is a session of one turn (``r<line>``),
arriving at ``timestamp / 1000`` s; its segments are its blocks (key ``h<id>``), 512 tokens each but
the last, ``input_length - 512 * (len - 1)``. Option ``hash_block_tokens`` (512) for traces hashed
with another block size.

**conversations** -- ShareGPT-style JSON (https://huggingface.co/datasets/anon8231489123/ShareGPT_Vicuna_unfiltered):
a list of ``{"id": ..., "conversations": [{"from": "human", "value": "..."}, ...]}``, or the same
objects one a line (JSONL). Each conversation is a session; each assistant message (``gpt``,
``assistant``, ``chatgpt``, ``bing``) ends a turn whose prompt is every message before it (one
segment each, key ``<id>:m<i>``, the assistant's earlier replies included, as a chat replay re-sends
them) and whose output is that message. Other roles: ``human``, ``user``, ``system``, ``tool``,
``function``. A message's tokens are its integer ``tokens`` (or ``num_tokens``) field when it has
one, else ``max(1, ceil(len(value) / chars_per_token))`` (4.0; no tokenizer is loaded); the notes
say which rule counted how many. Sessions start ``session_gap_s`` apart (1.0), later turns
``think_s`` (0.0) after the previous reply. Conversations with no assistant message are skipped
(counted in the notes); an assistant message that answers nothing (first in its conversation) is
history only. A repeated id is refused.

**agent** -- a synthetic agent workload named by its parameters, a JSON object::

    {"kind": "agent", "sessions": 8, "turns": 4, "groups": 2, "shared_prefix_tokens": 512,
     "new_tokens": 64, "output_tokens": 32, "think_s": 0.5, "session_rate_per_s": 2.0, "seed": 0,
     "think_distribution": "fixed", "arrival_distribution": "fixed"}

built by :func:`agent_traffic` (which says what the parameters mean).

**lengths** -- kvplan's lengths-only JSONL (``{"prompt_tokens": 512, "output_tokens": 128}`` a line,
read by load_trace): each line a session of one turn, its prompt shared with
no other, arriving at 0 (a closed-loop replay decides the timing).
"""

from __future__ import annotations

import inspect
import json
import math
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.paths import MAX_DEPTH, MAX_FILE_BYTES, iter_user_lines, json_depth, parse_json_text, read_user_text
from kvplan.traffic.model import MAX_SECONDS, MAX_SEGMENTS_PER_TURN, MAX_TURN_TOKENS, MAX_TURNS, Segment, Traffic, Turn

#: One JSONL line of a trace: a Mooncake line of 16M tokens (32,768 ids) is under 400 KB.
MAX_TRACE_LINE_CHARS = 1 << 20
#: Segment references held by one Traffic (a prompt's segments summed over its turns): bounds the
#: memory of a conversation replayed turn by turn (its history grows quadratically) or a huge trace.
MAX_SEGMENT_REFS = 20_000_000
#: Prompt tokens of a whole synthetic workload.
MAX_TOTAL_TOKENS = 2_000_000_000
MAX_ID_CHARS = 256  # a conversation id: it is copied into every message's key
MAX_BLOCK_ID = 1 << 64  # Mooncake's ids are small ints; anything up to a 64-bit hash is taken
MAX_THINK_S = 86_400.0
MAX_SEED = 1 << 63

ASSISTANT_ROLES = frozenset({"gpt", "assistant", "chatgpt", "bing"})
PROMPT_ROLES = frozenset({"human", "user", "system", "tool", "function"})


# --- small checks ------------------------------------------------------------------------------


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _whole(value, lo: int, hi: int) -> int | None:
    """``value`` if it is an int in [lo, hi] (compared as an int: a 400-digit one is just too big)."""
    return value if _is_int(value) and lo <= value <= hi else None


def _real(value, lo: float, hi: float) -> float | None:
    """``value`` as a float if it is a finite number in [lo, hi]; ints are compared before converting."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return float(value) if lo <= value <= hi else None
    return value if math.isfinite(value) and lo <= value <= hi else None


def _show(value) -> str:
    if _is_int(value) and value.bit_length() > 13_000:  # about 3,900 digits: repr fails past 4,300
        return f"a whole number of about {math.floor(value.bit_length() * math.log10(2)) + 1:,} digits"
    text = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _option(name: str, value, lo: float, hi: float, integer: bool = False):
    got = _whole(value, int(lo), int(hi)) if integer else _real(value, lo, hi)
    if got is None:
        kind = "a whole number" if integer else "a number"
        raise KvplanError(f"option {name}={_show(value)}: expected {kind} from {lo:,g} to {hi:,g}")
    return got


# --- JSON with positions ------------------------------------------------------------------------

_WS = re.compile(r"[ \t\n\r]*")


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number kvplan accepts (use a finite value)")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def _line_at(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _decode_at(text: str, i: int, where: str):
    """One JSON value starting at ``i`` -> (value, end); errors name the line."""
    try:
        return _DECODER.raw_decode(text, i)
    except json.JSONDecodeError as exc:
        raise KvplanError(f"{where}:{exc.lineno}: not valid JSON: {exc.msg} (column {exc.colno})") from None
    except ValueError as exc:  # NaN/Infinity, or an integer of more than 4300 digits
        m = next((m for m in _BAD_TOKEN.finditer(text, i) if m.group(1)), None)
        at = m.start(1) if m else i
        raise KvplanError(f"{where}:{_line_at(text, at)}: {str(exc).splitlines()[0][:200]}") from None
    except RecursionError:
        raise KvplanError(f"{where}:{_line_at(text, i)}: JSON nested too deeply") from None


#: What raw_decode refuses without saying where: found by a scan that skips strings.
_BAD_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN|-?\d{4301,})')


def _parse_json(text: str, where: str):
    """One JSON value (the whole text), nesting capped; errors name the line (NaN's too)."""
    if json_depth(text) > MAX_DEPTH:
        raise KvplanError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels")
    start = _WS.match(text).end()
    value, end = _decode_at(text, start, where)
    end = _WS.match(text, end).end()
    if end < len(text):
        raise KvplanError(f"{where}:{_line_at(text, end)}: not valid JSON: extra data after the value")
    return value, start


def _top_values(text: str, where: str) -> Iterator[tuple[object, int]]:
    """(value, offset) for each element of a top-level JSON array, or each value of a stream of them
    (JSONL, or objects one after another); one element is decoded at a time."""
    i = _WS.match(text).end()
    if text.startswith("[", i):
        i = _WS.match(text, i + 1).end()
        if text.startswith("]", i):
            end = i + 1
        else:
            while True:
                value, end = _decode_at(text, i, where)
                yield value, i
                end = _WS.match(text, end).end()
                if text.startswith("]", end):
                    end += 1
                    break
                if not text.startswith(",", end):
                    raise KvplanError(f"{where}:{_line_at(text, end)}: not valid JSON: expected ',' or ']'")
                i = _WS.match(text, end + 1).end()
        end = _WS.match(text, end).end()
        if end < len(text):
            raise KvplanError(f"{where}:{_line_at(text, end)}: not valid JSON: extra data after the list")
        return
    while i < len(text):
        value, end = _decode_at(text, i, where)
        yield value, i
        i = _WS.match(text, end).end()


def _member_offsets(text: str, start: int) -> dict[str, int]:
    """Where each member's value of the (already parsed, so valid) JSON object at ``start`` begins."""
    out: dict[str, int] = {}
    i = _WS.match(text, start + 1).end()
    while not text.startswith("}", i):
        key, i = _DECODER.raw_decode(text, i)
        i = _WS.match(text, _WS.match(text, i).end() + 1).end()  # past ':'
        out.setdefault(key, i)
        _, i = _DECODER.raw_decode(text, i)
        i = _WS.match(text, i).end()
        if text.startswith(",", i):
            i = _WS.match(text, i + 1).end()
    return out


def _element_offset(text: str, start: int, index: int) -> int:
    """Where element ``index`` of the (valid) JSON array at ``start`` begins."""
    i = _WS.match(text, start + 1).end()
    for _ in range(index):
        _, i = _DECODER.raw_decode(text, i)
        i = _WS.match(text, _WS.match(text, i).end() + 1).end()  # past ','
    return i


# --- mooncake ----------------------------------------------------------------------------------


def _trace_lines(path: Path, what: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-empty line, streamed; a line over MAX_TRACE_LINE_CHARS is refused
    (iter_user_lines cuts lines, so it is asked for one character more than the limit)."""
    for number, line in enumerate(iter_user_lines(path, what, MAX_FILE_BYTES, MAX_TRACE_LINE_CHARS + 1), 1):
        if number == 1:
            line = line.lstrip("\ufeff")
        if len(line) > MAX_TRACE_LINE_CHARS:
            raise KvplanError(f"{path}:{number}: a line longer than {MAX_TRACE_LINE_CHARS:,} characters",
                              "one JSON object a line")
        if line.strip():
            yield number, line


def _parse_line(line: str, where: str):
    """One JSONL line (``where`` is ``file:line``): parse_json_text, its "file:line:1:" said "file:line:"."""
    try:
        return parse_json_text(line, where)
    except KvplanError as exc:
        if exc.message.startswith(f"{where}:1: "):
            raise KvplanError(f"{where}: {exc.message[len(where) + 4:]}", exc.hint) from None
        raise


def load_mooncake(path: Path, *, hash_block_tokens: int = 512) -> Traffic:
    """A Mooncake trace (module docstring): one single-turn session a line, its blocks as segments,
    so requests sharing leading hash ids share those prefix segments."""
    block = _option("hash_block_tokens", hash_block_tokens, 1, MAX_TURN_TOKENS, integer=True)
    segments: dict[tuple[int, int], Segment] = {}  # one object per distinct block: shared prefixes cost once
    turns: list[Turn] = []
    refs = 0
    last_ms = 0.0
    last_line = 0
    for number, line in _trace_lines(path, "trace"):
        where = f"{path}:{number}"
        row = _parse_line(line, where)
        if not isinstance(row, dict):
            raise KvplanError(f"{where}: not a trace line (a JSON {type(row).__name__}, not an object)",
                              '{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}')
        for name in ("timestamp", "input_length", "output_length", "hash_ids"):
            if name not in row:
                raise KvplanError(f"{where}: no {name!r}", "a Mooncake trace line has timestamp, input_length, "
                                  "output_length and hash_ids")
        ms = _real(row["timestamp"], 0.0, MAX_SECONDS * 1000.0)
        if ms is None:
            raise KvplanError(f"{where}: timestamp {_show(row['timestamp'])}: expected milliseconds from the trace "
                              f"start, 0 to {MAX_SECONDS * 1000:,.0f}")
        if ms < last_ms:
            raise KvplanError(f"{where}: timestamp {row['timestamp']!r} is before the previous line's "
                              f"({last_ms:g} ms, line {last_line})", "sort the trace by timestamp")
        lengths = {}
        for name in ("input_length", "output_length"):
            lengths[name] = _whole(row[name], 1, MAX_TURN_TOKENS)
            if lengths[name] is None:
                raise KvplanError(f"{where}: {name} {_show(row[name])}: expected a whole number of tokens "
                                  f"from 1 to {MAX_TURN_TOKENS:,}")
        n_in = lengths["input_length"]
        ids = row["hash_ids"]
        if not isinstance(ids, list):
            raise KvplanError(f"{where}: hash_ids {_show(ids)}: expected a list of block ids")
        want = -(-n_in // block)
        if len(ids) != want:
            raise KvplanError(f"{where}: hash_ids has {len(ids):,} ids but input_length {n_in:,} is {want:,} "
                              f"blocks of {block}", "one id per block of the prompt (hash_block_tokens)")
        refs += want
        if refs > MAX_SEGMENT_REFS:
            raise KvplanError(f"{where}: more than {MAX_SEGMENT_REFS:,} blocks in the trace", "replay a part of it")
        if len(turns) >= MAX_TURNS:
            raise KvplanError(f"{where}: more than {MAX_TURNS:,} requests", "replay a part of the trace")
        if not (set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) < MAX_BLOCK_ID):  # (at C speed: a
            # trace is millions of ids; the loop below names the first bad one)
            for j, h in enumerate(ids):
                if not _is_int(h) or not 0 <= h < MAX_BLOCK_ID:
                    raise KvplanError(f"{where}: hash_ids[{j}] {_show(h)}: expected a whole number from 0 to 2^64 - 1")
        segs = []
        last_tokens = n_in - block * (want - 1)
        for j, h in enumerate(ids):
            k = (h, block if j < want - 1 else last_tokens)
            seg = segments.get(k)
            if seg is None:
                seg = segments[k] = Segment(f"h{h}", k[1])
            segs.append(seg)
        turns.append(Turn(f"r{number}", 0, tuple(segs), lengths["output_length"], arrival_s=ms / 1000.0))
        last_ms, last_line = ms, number
    if not turns:
        raise KvplanError(f"{path}: no requests (an empty trace)")
    distinct = len({k[0] for k in segments})
    return Traffic(tuple(turns), str(path), (
        f"Mooncake trace: prompts as {block}-token blocks named by hash_ids ({distinct:,} distinct of {refs:,}); "
        "arrivals from timestamp (ms)",))


# --- conversations -----------------------------------------------------------------------------


def load_conversations(path: Path, *, chars_per_token: float = 4.0, session_gap_s: float = 1.0,
                       think_s: float = 0.0) -> Traffic:
    """ShareGPT-style conversations (module docstring): one session each, one turn per assistant message."""
    cpt = _option("chars_per_token", chars_per_token, 1e-3, 1e6)
    gap = _option("session_gap_s", session_gap_s, 0.0, MAX_SECONDS)
    think = _option("think_s", think_s, 0.0, MAX_THINK_S)
    text = read_user_text(path, "conversations")
    where = str(path)
    if json_depth(text) > MAX_DEPTH:
        raise KvplanError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels")
    turns: list[Turn] = []
    seen: dict[str, int] = {}
    counted = {"field": 0, "chars": 0}  # messages of the conversations kept
    skipped = unanswered = refs = 0
    for index, (conv, offset) in enumerate(_top_values(text, where)):
        def fail(message: str, msg_index: int | None = None, field: str | None = None, hint: str | None = None,
                 _conv=conv, _offset=offset):
            raise KvplanError(f"{where}:{_conv_line(text, _conv, _offset, msg_index, field)}: {message}", hint)

        if not isinstance(conv, dict):
            fail(f"conversation {index}: a JSON {type(conv).__name__}, not an object",
                 hint='{"id": ..., "conversations": [{"from": "human", "value": "..."}, ...]}')
        cid = conv.get("id", f"#{index}")
        if not (isinstance(cid, str) or _is_int(cid) and abs(cid) < MAX_SEED) or len(str(cid)) > MAX_ID_CHARS:
            fail(f"conversation {index}: id {_show(cid)}: expected a string of at most {MAX_ID_CHARS} characters "
                 "or a whole number", field="id")
        cid = str(cid)
        if cid in seen:
            fail(f"conversation id {cid[:60]!r} repeats conversation {seen[cid]}", field="id")
        seen[cid] = index
        messages = conv.get("conversations")
        if not isinstance(messages, list):
            fail(f"conversation {cid[:60]!r}: 'conversations' {_show(messages)}: expected a list of messages",
                 field="conversations" if "conversations" in conv else None)
        history: list[Segment] = []
        history_tokens = 0
        by_field = by_chars = opening = 0
        session_turns: list[Turn] = []
        for i, msg in enumerate(messages):
            label = f"conversation {cid[:60]!r} message {i}"
            if not isinstance(msg, dict):
                fail(f"{label}: a JSON {type(msg).__name__}, not an object", i)
            role = msg.get("from")
            if role not in ASSISTANT_ROLES and role not in PROMPT_ROLES:
                roles = ", ".join(sorted(PROMPT_ROLES | ASSISTANT_ROLES))
                fail(f"{label}: from {_show(role)}: expected one of {roles}", i, "from" if "from" in msg else None)
            tokens = msg.get("tokens", msg.get("num_tokens"))
            if tokens is not None:
                name = "tokens" if "tokens" in msg else "num_tokens"
                if _whole(tokens, 1, MAX_TURN_TOKENS) is None:
                    fail(f"{label}: {name} {_show(tokens)}: expected a whole number from 1 to {MAX_TURN_TOKENS:,}",
                         i, name)
                by_field += 1
            else:
                value = msg.get("value")
                if not isinstance(value, str):
                    fail(f"{label}: value {_show(value)}: expected the message's text (or a 'tokens' count)", i,
                         "value" if "value" in msg else None)
                tokens = max(1, math.ceil(len(value) / cpt))
                if tokens > MAX_TURN_TOKENS:
                    fail(f"{label}: {tokens:,} tokens (at most {MAX_TURN_TOKENS:,})", i, "value")
                by_chars += 1
            if role in ASSISTANT_ROLES:
                if not history:
                    opening += 1
                else:
                    refs += len(history)
                    if refs > MAX_SEGMENT_REFS or len(history) > MAX_SEGMENTS_PER_TURN:
                        fail(f"{label}: the replay would hold more than {MAX_SEGMENT_REFS:,} message references "
                             f"or a prompt of more than {MAX_SEGMENTS_PER_TURN:,} messages", i)
                    if history_tokens > MAX_TURN_TOKENS:
                        fail(f"{label}: its prompt (the conversation so far) is {history_tokens:,} tokens, longer "
                             f"than any engine serves ({MAX_TURN_TOKENS:,})", i)
                    if len(turns) + len(session_turns) >= MAX_TURNS:
                        fail(f"{label}: more than {MAX_TURNS:,} turns", i)
                    if session_turns:
                        turn = Turn(cid, len(session_turns), tuple(history), tokens, think_s=think)
                    else:
                        turn = Turn(cid, 0, tuple(history), tokens, arrival_s=0.0)  # arrival set below
                    session_turns.append(turn)
            history.append(Segment(f"{cid}:m{i}", tokens))
            history_tokens += tokens
        if not session_turns:
            skipped += 1
            continue
        arrival = len(seen) - 1 - skipped
        arrival_s = arrival * gap
        if arrival_s > MAX_SECONDS:
            fail(f"conversation {cid[:60]!r} would start at {arrival_s:,.0f} s (session_gap_s={gap:g}; at most "
                 f"{MAX_SECONDS:,.0f} s)", hint="use a smaller session_gap_s")
        counted["field"] += by_field
        counted["chars"] += by_chars
        unanswered += opening
        first = session_turns[0]
        session_turns[0] = Turn(cid, 0, first.segments, first.output_tokens, arrival_s=arrival_s)
        turns.extend(session_turns)
    if not turns:
        raise KvplanError(f"{where}: no requests (no conversation has an assistant message)" if seen
                          else f"{where}: no conversations")
    notes = [f"conversations: a turn per assistant message, sessions {gap:g} s apart, think {think:g} s"]
    rule = []
    if counted["field"]:
        rule.append(f"{counted['field']:,} from their 'tokens' field")
    if counted["chars"]:
        rule.append(f"{counted['chars']:,} as ceil(characters / {cpt:g}) (no tokenizer)")
    notes.append("message tokens: " + ", ".join(rule))
    if skipped:
        notes.append(f"skipped {skipped:,} conversation(s) with no assistant message")
    if unanswered:
        notes.append(f"{unanswered:,} assistant message(s) opening a conversation kept as history, not sent")
    return Traffic(tuple(turns), where, tuple(notes))


def _conv_line(text: str, conv, offset: int, msg_index: int | None, field: str | None) -> int:
    """The line of a conversation, of its message ``msg_index``, or of that message's ``field``
    (found by walking the already-parsed text; only on the error path)."""
    try:
        at = offset
        if isinstance(conv, dict):
            members = _member_offsets(text, offset)
            if msg_index is None:
                at = members.get(field, offset) if field else offset
            else:
                msgs = members["conversations"]
                at = _element_offset(text, msgs, msg_index)
                if field:
                    at = _member_offsets(text, at).get(field, at)
        return _line_at(text, at)
    except (ValueError, KeyError, IndexError):  # never expected: the text parsed
        return _line_at(text, offset)


# --- agent -------------------------------------------------------------------------------------

THINK_DISTRIBUTIONS = ("fixed", "exponential")
ARRIVAL_DISTRIBUTIONS = ("fixed", "poisson")
_AGENT_REQUIRED = ("sessions", "turns", "groups", "shared_prefix_tokens", "new_tokens", "output_tokens")
_AGENT_OPTIONAL = ("think_s", "session_rate_per_s", "seed", "think_distribution", "arrival_distribution")


class _BadParam(Exception):
    def __init__(self, name: str, text: str):
        super().__init__(f"{name} {text}")
        self.name = name


def _agent_check(sessions, turns, groups, shared_prefix_tokens, new_tokens, output_tokens, think_s,
                 session_rate_per_s, seed, think_distribution, arrival_distribution) -> None:
    def whole(name, value, lo, hi):
        if _whole(value, lo, hi) is None:
            raise _BadParam(name, f"{_show(value)}: expected a whole number from {lo:,} to {hi:,}")

    whole("sessions", sessions, 1, MAX_TURNS)
    whole("turns", turns, 1, MAX_TURNS)
    if sessions * turns > MAX_TURNS:
        raise _BadParam("turns", f"{turns:,} x {sessions:,} sessions is more than {MAX_TURNS:,} requests")
    whole("groups", groups, 1, sessions)
    whole("shared_prefix_tokens", shared_prefix_tokens, 0, MAX_TURN_TOKENS)
    whole("new_tokens", new_tokens, 1, MAX_TURN_TOKENS)
    whole("output_tokens", output_tokens, 1, MAX_TURN_TOKENS)
    last = shared_prefix_tokens + turns * new_tokens + (turns - 1) * output_tokens
    if last > MAX_TURN_TOKENS:
        raise _BadParam("turns", f"{turns:,}: the last turn's prompt is {last:,} tokens (at most {MAX_TURN_TOKENS:,})")
    total = sessions * (turns * (shared_prefix_tokens + new_tokens) + (new_tokens + output_tokens) * turns * (turns - 1) // 2)
    if total > MAX_TOTAL_TOKENS:
        raise _BadParam("sessions", f"{sessions:,}: {total:,} prompt tokens in all (at most {MAX_TOTAL_TOKENS:,})")
    refs = sessions * (turns * turns + (turns if shared_prefix_tokens else 0))
    if refs > MAX_SEGMENT_REFS:
        raise _BadParam("turns", f"{turns:,} x {sessions:,} sessions: {refs:,} segment references (at most "
                        f"{MAX_SEGMENT_REFS:,}; histories grow with the square of turns)")
    if _real(think_s, 0.0, MAX_THINK_S) is None:
        raise _BadParam("think_s", f"{_show(think_s)}: expected seconds from 0 to {MAX_THINK_S:,.0f}")
    if session_rate_per_s is not None:
        rate = _real(session_rate_per_s, 1e-9, 1e9)
        if rate is None or rate <= 0:
            raise _BadParam("session_rate_per_s", f"{_show(session_rate_per_s)}: expected sessions a second, "
                            "above 0 and at most 1e9 (or null: all at once)")
        if (sessions - 1) / rate > MAX_SECONDS:
            raise _BadParam("session_rate_per_s", f"{rate:g}: {sessions:,} sessions would span "
                            f"{(sessions - 1) / rate:,.0f} s (at most {MAX_SECONDS:,.0f})")
    if _whole(seed, -MAX_SEED, MAX_SEED) is None:
        raise _BadParam("seed", f"{_show(seed)}: expected a whole number")
    if think_distribution not in THINK_DISTRIBUTIONS:
        raise _BadParam("think_distribution", f"{_show(think_distribution)}: expected fixed or exponential")
    if arrival_distribution not in ARRIVAL_DISTRIBUTIONS:
        raise _BadParam("arrival_distribution", f"{_show(arrival_distribution)}: expected fixed or poisson")
    if arrival_distribution == "poisson" and session_rate_per_s is None:
        raise _BadParam("arrival_distribution", "poisson needs session_rate_per_s")


def agent_traffic(sessions: int, turns: int, groups: int, shared_prefix_tokens: int, new_tokens: int,
                  output_tokens: int, think_s: float = 0.0, session_rate_per_s: float | None = None, seed: int = 0,
                  think_distribution: str = "fixed", arrival_distribution: str = "fixed") -> Traffic:
    """``sessions`` agent runs of ``turns`` turns, each re-sending its whole history.

    Session ``s`` is in group ``s % groups``; turn ``t``'s prompt is the group's shared prefix
    (``g<group>:prefix``, ``shared_prefix_tokens``; none when 0), then for each earlier turn ``u``
    its message ``s<s>:u<u>`` (``new_tokens``) and reply ``s<s>:a<u>`` (``output_tokens``), then its
    own message ``s<s>:u<t>``; it generates ``output_tokens``. Session ``s`` starts at
    ``s / session_rate_per_s`` (``fixed``), after seeded exponential gaps (``poisson``; session 0 at 0),
    or at 0 for all when the rate is None; turn ``t > 0`` follows its previous reply after ``think_s``
    (``fixed``) or a seeded exponential draw of that mean. Same parameters, same traffic."""
    try:
        _agent_check(sessions, turns, groups, shared_prefix_tokens, new_tokens, output_tokens, think_s,
                     session_rate_per_s, seed, think_distribution, arrival_distribution)
    except _BadParam as exc:
        raise KvplanError(f"agent workload: {exc}") from None
    arrivals_rng = random.Random(f"agent:{seed}")
    think_rng = random.Random(f"agent:{seed}:think")
    prefixes = [Segment(f"g{g}:prefix", shared_prefix_tokens) if shared_prefix_tokens else None for g in range(groups)]
    out: list[Turn] = []
    start = 0.0
    for s in range(sessions):
        if session_rate_per_s is None:
            start = 0.0
        elif arrival_distribution == "fixed":
            start = s / session_rate_per_s
        elif s:
            start += arrivals_rng.expovariate(session_rate_per_s)
        if start > MAX_SECONDS:
            raise KvplanError(f"agent workload: session {s} would start at {start:,.0f} s (at most {MAX_SECONDS:,.0f})",
                              "use a higher session_rate_per_s")
        history: list[Segment] = [prefixes[s % groups]] if shared_prefix_tokens else []
        for t in range(turns):
            ask = Segment(f"s{s}:u{t}", new_tokens)
            prompt = tuple(history) + (ask,)
            if t == 0:
                out.append(Turn(f"s{s}", 0, prompt, output_tokens, arrival_s=start))
            else:
                wait = float(think_s)
                if think_distribution == "exponential" and think_s > 0:
                    wait = min(think_rng.expovariate(1.0 / think_s), MAX_SECONDS)
                out.append(Turn(f"s{s}", t, prompt, output_tokens, think_s=wait))
            history += (ask, Segment(f"s{s}:a{t}", output_tokens))
    rate = "all at 0 s" if session_rate_per_s is None else f"{arrival_distribution} at {session_rate_per_s:g}/s"
    return Traffic(tuple(out), "agent workload", (
        f"agent workload: {sessions} sessions x {turns} turns in {groups} group(s), prefix {shared_prefix_tokens}, "
        f"+{new_tokens} in / {output_tokens} out a turn, sessions {rate}, think {think_distribution} {float(think_s):g} s, "
        f"seed {seed}",))


def load_agent(path: Path) -> Traffic:
    """An agent workload file (module docstring): its parameters, checked where they are written."""
    text = read_user_text(path, "agent workload")
    where = str(path)
    spec, start = _parse_json(text, where)
    if not isinstance(spec, dict):
        raise KvplanError(f"{where}:{_line_at(text, start)}: an agent workload is a JSON object, not a "
                          f"{type(spec).__name__}")

    def line(name: str) -> int:
        try:
            return _line_at(text, _member_offsets(text, start).get(name, start))
        except ValueError:
            return 1

    if spec.get("kind", "agent") != "agent":
        raise KvplanError(f"{where}:{line('kind')}: kind {_show(spec['kind'])}: expected \"agent\"")
    for name in spec:
        if name != "kind" and name not in _AGENT_REQUIRED + _AGENT_OPTIONAL:
            raise KvplanError(f"{where}:{line(name)}: unknown field {name[:60]!r}",
                              f"the fields are {', '.join(_AGENT_REQUIRED + _AGENT_OPTIONAL)}")
    for name in _AGENT_REQUIRED:
        if name not in spec:
            raise KvplanError(f"{where}:{line(name)}: no {name!r}", f"an agent workload needs {', '.join(_AGENT_REQUIRED)}")
    params = {k: v for k, v in spec.items() if k != "kind"}
    defaults = inspect.signature(agent_traffic).parameters
    full = {name: params.get(name, defaults[name].default) for name in _AGENT_REQUIRED + _AGENT_OPTIONAL}
    try:
        _agent_check(**full)
    except _BadParam as exc:
        raise KvplanError(f"{where}:{line(exc.name)}: {exc}") from None
    traffic = agent_traffic(**full)
    return Traffic(traffic.turns, where, traffic.notes)


# --- lengths -----------------------------------------------------------------------------------


MAX_TRACE_TOKENS = 1 << 24  # 16M tokens in one request
MAX_TRACE_REQUESTS = 1_000_000


def load_trace(path: Path) -> tuple[tuple[int, int], ...]:
    """Read a JSONL trace: one ``{"prompt_tokens": P, "output_tokens": M}`` per line."""
    lines = read_user_text(path, "trace").splitlines()
    out: list[tuple[int, int]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        row = parse_json_text(line, f"{path}:{number}")
        try:
            prompt = row.get("prompt_tokens", row.get("input_tokens"))
            output = row.get("output_tokens", row.get("max_tokens"))
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (prompt, output)):
                raise TypeError
        except (ValueError, TypeError, AttributeError):
            raise KvplanError(
                f"{path}:{number}: not a trace line",
                'use one JSON object a line with whole numbers: {"prompt_tokens": 512, "output_tokens": 128}',
            ) from None
        if prompt < 1 or output < 1:
            raise KvplanError(f"{path}:{number}: prompt_tokens and output_tokens must be >= 1")
        if prompt > MAX_TRACE_TOKENS or output > MAX_TRACE_TOKENS:
            raise KvplanError(f"{path}:{number}: {max(prompt, output):,} tokens is more than any engine serves "
                              f"(at most {MAX_TRACE_TOKENS:,})")
        out.append((prompt, output))
        if len(out) > MAX_TRACE_REQUESTS:
            raise KvplanError(f"trace {path} has more than {MAX_TRACE_REQUESTS:,} requests")
    if not out:
        raise KvplanError(f"trace {path} has no requests")
    return tuple(out)


def load_lengths(path: Path) -> Traffic:
    """A lengths-only JSONL trace (load_trace) as single-turn sessions, no reuse."""
    pairs = load_trace(path)
    turns = tuple(Turn(f"r{i}", 0, (Segment(f"r{i}:prompt", p),), o, arrival_s=0.0) for i, (p, o) in enumerate(pairs))
    return Traffic(turns, str(path), ("lengths-only trace: no prompt shares a token; every arrival at 0 s "
                                      "(a closed-loop replay decides the timing)",))


# --- dispatch ----------------------------------------------------------------------------------

#: kind -> loader; ``auto`` (``sniff_kind``) picks one of these.
LOADERS: dict[str, Callable[..., Traffic]] = {
    "mooncake": load_mooncake,
    "conversations": load_conversations,
    "agent": load_agent,
    "lengths": load_lengths,
}

_SNIFF_CHARS = 64 * 1024
_SNIFF_KEYS = (  # a distinctive key -> kind, for a first line that is not a whole JSON object
    (re.compile(r'"hash_ids"\s*:'), "mooncake"),
    (re.compile(r'"conversations"\s*:'), "conversations"),
    (re.compile(r'"kind"\s*:\s*"agent"'), "agent"),
    (re.compile(r'"(?:prompt|input)_tokens"\s*:'), "lengths"),
)


def _kind_of_object(row: dict) -> str | None:
    if "hash_ids" in row or "input_length" in row:
        return "mooncake"
    if "conversations" in row:
        return "conversations"
    if row.get("kind") == "agent":
        return "agent"
    if "prompt_tokens" in row or "input_tokens" in row:
        return "lengths"
    return None


def sniff_kind(path: Path) -> str:
    """The kind of a traffic file, from its head: ``[`` is a conversation list; a first line that is a
    JSON object is told by its keys; else the first distinctive key in the first 64 KB."""
    head: list[str] = []
    size = 0
    first = None
    first_line = 1
    for number, line in enumerate(iter_user_lines(path, "traffic", MAX_FILE_BYTES, _SNIFF_CHARS), 1):
        line = line.lstrip("\ufeff") if number == 1 else line
        if first is None and not line.strip():
            continue
        if first is None:
            first, first_line = line, number
        head.append(line)
        size += len(line) + 1
        if size >= _SNIFF_CHARS:
            break
    if first is None:
        raise KvplanError(f"{path}: an empty file", "give a traffic file")
    first = first.strip()
    kind = None
    if first.startswith("["):
        kind = "conversations"
    elif first.startswith("{"):
        try:
            row = json.loads(first)
        except (ValueError, RecursionError):
            row = None
        if isinstance(row, dict):
            kind = _kind_of_object(row)
        else:
            text = "\n".join(head)
            found = [(m.start(), k) for rx, k in _SNIFF_KEYS if (m := rx.search(text))]
            kind = min(found)[1] if found else None
    if kind is None:
        raise KvplanError(f"{path}:{first_line}: cannot tell which traffic format this is",
                          f"name its kind: {', '.join(LOADERS)}")
    return kind


def load_traffic(path: Path, kind: str = "auto", **options) -> Traffic:
    """Read ``path`` as traffic of ``kind`` (a key of ``LOADERS``, or ``auto``); ``options`` go to its
    loader (e.g. ``hash_block_tokens`` for mooncake, ``chars_per_token`` for conversations)."""
    if kind == "auto":
        kind = sniff_kind(path)
    loader = LOADERS.get(kind)
    if loader is None:
        raise KvplanError(f"unknown traffic kind {_show(kind)}", f"use auto, {', '.join(LOADERS)}")
    accepted = [p.name for p in inspect.signature(loader).parameters.values() if p.kind is p.KEYWORD_ONLY]
    for name in options:
        if name not in accepted:
            raise KvplanError(f"option {name!r} does not apply to {kind} traffic",
                              f"its options: {', '.join(accepted)}" if accepted else f"{kind} takes no options")
    return loader(Path(path), **options)
