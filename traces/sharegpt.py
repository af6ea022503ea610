"""ShareGPT-style conversations: one request per assistant turn, whose prompt is the whole history so far.

Input: a JSON array of conversations, or JSONL with one conversation per line. A conversation is an object with
``conversations`` (messages with ``from``/``value``, ShareGPT) or ``messages`` (``role``/``content``, OpenAI
style), and an optional ``id`` (the session id). Each message is one segment whose id is a stable hash of its
role and text, so equal histories give equal prefixes and a turn's answer is the next turn's prompt's middle:
the previous assistant message's segment is that turn's ``output_segment``.

There is no tokenizer offline: a message counts ``max(1, ceil(utf8_bytes / 4))`` tokens (the usual "4
characters per token" rule, in bytes so that CJK text is not undercounted as badly). There are no timestamps
either: conversation ``c`` (counting those that yield requests) starts at ``c * CONVERSATION_INTERVAL_S`` and its
assistant turn ``k`` arrives ``k * TURN_INTERVAL_S`` later. Requests are then sorted by arrival (stable).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

from poolsim.traces.errors import TraceFormatError
from poolsim.traces.lines import BOM, Skips, head, json_kind, json_object, numbered_lines
from poolsim.traces.request import MAX_SEGMENT_LEN, Request

FORMAT = "sharegpt"
CONVERSATION_INTERVAL_S = 1.0  # seconds between conversation starts
TURN_INTERVAL_S = 30.0  # seconds between a conversation's assistant turns
NO_REQUESTS = "no conversation has an assistant turn after a user or system message"
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
         "bing": "assistant", "assistant": "assistant", "model": "assistant", "system": "system"}
_WS = re.compile(r"\s*")


def looks_like(first: dict) -> bool:
    return "conversations" in first or "messages" in first


def estimate_tokens(text: str) -> int:
    return max(1, -(-len(text.encode("utf-8", "surrogatepass")) // 4))


def message_segment(role: str, text: str) -> int:
    """A stable 42-bit id of a message (Python's hash() is salted per process, so blake2b)."""
    digest = hashlib.blake2b(f"{role}\0{text}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 22


def _messages(path: Path, line: int, conv) -> tuple[str | None, list[tuple[str, str]]]:
    if not isinstance(conv, dict):
        raise TraceFormatError(path, line, None, f"expected a conversation object, got {json_kind(conv)}")
    key, role_key, text_key = ("conversations", "from", "value") if "conversations" in conv else \
                              ("messages", "role", "content")
    messages = conv.get(key)
    if not isinstance(messages, list):
        raise TraceFormatError(path, line, key, "missing, or not a list of messages")
    out = []
    for k, m in enumerate(messages):
        where = f"{key}[{k}]"
        if not isinstance(m, dict):
            raise TraceFormatError(path, line, where, f"expected a message object, got {json_kind(m)}")
        role, text = m.get(role_key), m.get(text_key)
        if not isinstance(role, str) or role not in ROLES:
            raise TraceFormatError(path, line, f"{where}.{role_key}", f"unknown role {role!r:.40}")
        if not isinstance(text, str):
            raise TraceFormatError(path, line, f"{where}.{text_key}", "missing, or not a string")
        if estimate_tokens(text) > MAX_SEGMENT_LEN:
            raise TraceFormatError(path, line, f"{where}.{text_key}", "longer than 2**20 estimated tokens")
        out.append((ROLES[role], text))
    cid = conv.get("id")
    return None if cid is None else str(cid), out


def conversation_requests(messages: list[tuple[str, str]], session_id: str | None, start_s: float) -> list[Request]:
    history: list[tuple[int, int]] = []
    requests = []
    for role, text in messages:
        seg = (message_segment(role, text), estimate_tokens(text))
        if role == "assistant" and history:
            turn = len(requests)
            requests.append(Request(rid=0, arrival_s=start_s + turn * TURN_INTERVAL_S,
                                    input_len=sum(n for _, n in history), output_len=seg[1],
                                    segments=tuple(history), output_segment=seg[0], session_id=session_id,
                                    turn=turn))
        history.append(seg)
    return requests


def iter_requests(path: Path, skips: Skips) -> Iterator[Request]:
    """Requests in file order (not sorted: load_trace sorts them)."""
    started = 0
    for line, conv in _conversations(path, skips):
        try:
            session_id, messages = _messages(path, line, conv)
        except TraceFormatError:
            if not skips.allowed:
                raise
            skips.count += 1
            continue
        requests = conversation_requests(messages, session_id or f"conv{started}", started * CONVERSATION_INTERVAL_S)
        started += bool(requests)
        yield from requests


def _conversations(path: Path, skips: Skips) -> Iterator[tuple[int, object]]:
    if head(path).lstrip()[:1] != b"[":
        for number, raw in numbered_lines(path):
            try:
                yield number, json_object(path, number, raw)
            except TraceFormatError:
                if not skips.allowed:
                    raise
                skips.count += 1
        return
    yield from _array(path)


def _array(path: Path) -> Iterator[tuple[int, object]]:
    """The elements of a JSON array with the line each starts on; a syntax error ends the file (never skipped)."""
    data = path.read_bytes().removeprefix(BOM)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceFormatError(path, data.count(b"\n", 0, e.start) + 1, None, f"not UTF-8 text ({e.reason})") from None
    decoder = json.JSONDecoder()
    i = _WS.match(text).end() + 1  # past '['
    i = _WS.match(text, i).end()
    line = 1 + text.count("\n", 0, i)
    if text.startswith("]", i):
        return _end(path, text, i + 1)
    while True:
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise TraceFormatError(path, e.lineno, None, f"invalid JSON: {e.msg} (column {e.colno})") from None
        except (ValueError, RecursionError) as e:
            raise TraceFormatError(path, line, None, f"invalid JSON: {e}") from None
        yield line, obj
        j = _WS.match(text, end).end()
        if text.startswith("]", j):
            return _end(path, text, j + 1)
        if not text.startswith(",", j):
            raise TraceFormatError(path, 1 + text.count("\n", 0, j), None, "invalid JSON: expected ',' or ']'")
        k = _WS.match(text, j + 1).end()
        line += text.count("\n", i, k)
        i = k


def _end(path: Path, text: str, i: int) -> None:
    j = _WS.match(text, i).end()
    if j != len(text):
        raise TraceFormatError(path, 1 + text.count("\n", 0, j), None, "invalid JSON: extra data after the array")
