"""``poolsim record --fpm ENDPOINT``: subscribe to a running SGLang server's forward-pass metrics and write JSONL.

SGLang 0.5.23 with ``--enable-forward-pass-metrics`` binds one ZMQ PUB socket per dp rank at ``BASE.RANK``
(metrics_reporter.py:394-407; BASE is ``--forward-pass-metrics-ipc-name``, else a temporary ``ipc://`` path that
the log's ``FPM: ZMQ PUB bound on ...`` line names). Each message is ``(topic b"", counter as 8 big-endian bytes,
msgpack ForwardPassMetrics)`` (forward_pass_metrics.py:309-313); ``fpm.decode_payload`` reads the payload. Every
message is written as it arrives, one JSON object a line with SGLang's field names plus ``timestamp`` (receive time,
Unix s) and ``endpoint``; idle heartbeats too (the reader skips them). A message that does not decode is not
written: it is counted under its reason in the summary. Needs the ``telemetry`` extra (pyzmq, msgspec).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from poolsim.telemetry.fpm import decode_payload

POLL_MS = 100  # how often the loop looks at the clock while no message comes


def record(endpoints: list[str], out: str | Path, *, max_messages: int | None = None,
           duration_s: float | None = None, clock=time.monotonic) -> dict:
    """Write the messages of ``endpoints`` to ``out`` until ``max_messages`` were written or ``duration_s`` passed
    (either bound, both, or neither: until interrupted). Returns a summary."""
    try:
        import zmq
    except ImportError:
        raise ValueError("poolsim record needs pyzmq and msgspec: pip install 'poolsim[telemetry]'") from None
    if not endpoints:
        raise ValueError("--fpm: give the server's endpoint(s), e.g. ipc:///tmp/sglang-fpm.0 (one per dp rank)")
    if max_messages is not None and max_messages < 1:
        raise ValueError(f"--max-messages {max_messages}: must be >= 1")
    if duration_s is not None and not duration_s > 0:
        raise ValueError(f"--duration {duration_s}: must be > 0 s")
    out = Path(out)
    if out.exists():
        raise ValueError(f"--out {out}: exists; name a new file")
    ctx = zmq.Context()
    sockets, poller = {}, zmq.Poller()
    try:
        for ep in endpoints:
            s = ctx.socket(zmq.SUB)
            s.setsockopt(zmq.SUBSCRIBE, b"")
            s.setsockopt(zmq.LINGER, 0)
            try:
                s.connect(ep)
            except zmq.ZMQError as e:
                s.close()
                raise ValueError(f"--fpm {ep}: {e}") from None
            sockets[s] = ep
            poller.register(s, zmq.POLLIN)
        return _loop(sockets, poller, out, max_messages, duration_s, clock)
    finally:
        for s in sockets:
            s.close(linger=0)
        ctx.term()


def _loop(sockets, poller, out, max_messages, duration_s, clock) -> dict:
    start = clock()
    written, by_endpoint, bad = 0, {ep: 0 for ep in sockets.values()}, {}
    stopped = "interrupted"
    with open(out, "w") as f:
        try:
            while True:
                if max_messages is not None and written >= max_messages:
                    stopped = f"{max_messages} messages"
                    break
                left = None if duration_s is None else duration_s - (clock() - start)
                if left is not None and left <= 0:
                    stopped = f"{duration_s:g} s"
                    break
                wait = POLL_MS if left is None else max(1, min(POLL_MS, int(left * 1000)))
                for s, _ in poller.poll(wait):
                    frames = s.recv_multipart()
                    try:
                        rec = _message(frames)
                    except ValueError as e:
                        reason = str(e)
                        bad[reason] = bad.get(reason, 0) + 1
                        continue
                    f.write(json.dumps({"timestamp": time.time(), "endpoint": sockets[s], **rec}) + "\n")
                    written += 1
                    by_endpoint[sockets[s]] += 1
                    if max_messages is not None and written >= max_messages:
                        break
                f.flush()
        except KeyboardInterrupt:
            stopped = "interrupted"
    return {"out": str(out), "written": written, "by_endpoint": by_endpoint, "undecodable": bad,
            "stopped_after": stopped, "elapsed_s": round(clock() - start, 3)}


def _message(frames: list[bytes]) -> dict:
    if len(frames) != 3:
        raise ValueError(f"{len(frames)} frames, SGLang sends 3 (topic, counter, payload)")
    _topic, seq, payload = frames
    if len(seq) != 8:
        raise ValueError(f"a {len(seq)}-byte counter frame, SGLang sends 8")
    rec = decode_payload(payload)
    if rec["counter_id"] != int.from_bytes(seq, "big"):
        raise ValueError("the counter frame differs from the payload's counter_id")
    return rec
