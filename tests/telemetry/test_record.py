"""poolsim record against a publisher inside the test: SGLang's multipart frames over a loopback ipc socket, the
payload msgpack-encoded by the test itself in SGLang's positional field order (and once as the map msgspec writes
for SGLang's Struct), then read back by the JSONL reader."""

import threading

import pytest

from poolsim.telemetry import read_fpm
from poolsim.telemetry.fpm import FIELDS, QUEUED_FIELDS, SCHEDULED_FIELDS
from poolsim.telemetry.record import record

zmq = pytest.importorskip("zmq")
msgspec = pytest.importorskip("msgspec")


def positional(counter, wall, sched, queued=(0, 0, 0.0, 0, 0, 0.0)):
    assert len(sched) == len(SCHEDULED_FIELDS) and len(queued) == len(QUEUED_FIELDS)
    return [1, "worker-a", 0, counter, wall, list(sched), list(queued)]  # ForwardPassMetrics field order


def as_map(message):
    out = dict(zip(FIELDS, message))
    out["scheduled_requests"] = dict(zip(SCHEDULED_FIELDS, message[5]))
    out["queued_requests"] = dict(zip(QUEUED_FIELDS, message[6]))
    return out


def publish(endpoint, payloads, ready):
    """An XPUB socket (a PUB that hears its subscribers): waits for the subscription, then sends SGLang's frames."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.bind(endpoint)
    ready.set()
    try:
        if pub.poll(10_000):
            pub.recv()  # the subscription message
            for seq, payload in payloads:
                pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
    finally:
        pub.close(linger=1000)
        ctx.term()


def test_record_writes_what_sglang_publishes(tmp_path):
    endpoint = f"ipc://{tmp_path}/fpm.0"
    messages = [positional(0, 0.045, (2, 3000, 250000.0, 0, 0, 0, 0.0)),
                positional(1, 0.011, (0, 0, 0.0, 0, 2, 3002, 1.0)),
                positional(2, 0.0, (0, 0, 0.0, 0, 0, 0, 0.0)),  # idle heartbeat
                positional(3, 0.012, (0, 0, 0.0, 0, 2, 3004, 1.0))]
    payloads = [(m[3], msgspec.msgpack.encode(m)) for m in messages[:3]]
    payloads.insert(1, (9, b"\xc1 not msgpack"))  # undecodable: counted, not written
    payloads.append((3, msgspec.msgpack.encode(as_map(messages[3]))))  # the map form of SGLang's Struct
    ready = threading.Event()
    t = threading.Thread(target=publish, args=(endpoint, payloads, ready), daemon=True)
    t.start()
    ready.wait(5)
    out = tmp_path / "fpm.jsonl"
    summary = record([endpoint], out, max_messages=4, duration_s=20)
    t.join(10)
    assert summary["written"] == 4 and summary["stopped_after"] == "4 messages"
    assert summary["by_endpoint"] == {endpoint: 4}
    assert list(summary["undecodable"].values()) == [1]
    src = read_fpm(out)
    assert [(s.kind, s.measured_s, s.line) for s in src.steps] == [("prefill", 0.045, 1), ("decode", 0.011, 2),
                                                                   ("decode", 0.012, 4)]
    assert src.steps[1].decode_kv_tokens == 3002 and src.steps[0].prefill_len_var == 250000.0
    assert src.skips.total == 1 and src.notes["lost_messages"] == 0


def test_record_stops_after_its_duration_and_refuses_bad_input(tmp_path):
    endpoint = f"ipc://{tmp_path}/silent.0"
    summary = record([endpoint], tmp_path / "none.jsonl", duration_s=0.3)
    assert summary["written"] == 0 and summary["stopped_after"] == "0.3 s"
    with pytest.raises(ValueError, match="exists"):
        record([endpoint], tmp_path / "none.jsonl", duration_s=0.1)
    with pytest.raises(ValueError, match="--max-messages"):
        record([endpoint], tmp_path / "x.jsonl", max_messages=0)
    with pytest.raises(ValueError, match="--fpm bogus"):
        record(["bogus"], tmp_path / "y.jsonl", duration_s=0.1)
