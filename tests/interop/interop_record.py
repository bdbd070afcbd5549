"""Recording hook of the interop suite's --record mode (docs/testing.md,
"Conformance corpus"). In a process that runs a real peer's code (SGLang's
or TokenSpeed's connector, unmodified), install() wraps pyzmq's
Socket.send_multipart / recv_multipart and the `requests` calls of the
bootstrap protocol, and appends one JSON line per message to
$KVB_RECORD_DIR/<release>-<pid>.jsonl (frames) or http-<release>-<pid>.jsonl
(bootstrap bodies). Only the peer's code uses pyzmq and requests in these
processes (kvbridge's side is C through ctypes), so "sent" lines are what
the release's code produced and "received" lines what it read (kvbridge's
bytes, accepted when the case passed). tests/conformance/corpus.py import
turns them into golden files. Nothing happens unless KVB_RECORD_DIR is set.
"""

import json
import os
import threading

_lock = threading.Lock()


def _ctx():
    return {"dialect": os.environ["KVB_RECORD_DIALECT"],
            "release": os.environ["KVB_RECORD_RELEASE"],
            "case": os.path.splitext(os.path.basename(os.environ.get("INTEROP_LOG", "run")))[0],
            "role": os.environ.get("KVB_RECORD_ROLE", "?")}


def _append(prefix, obj):
    d = os.environ["KVB_RECORD_DIR"]
    rel = obj["release"].replace("/", "_").replace(" ", "_")
    with _lock, open(os.path.join(d, f"{prefix}{rel}-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(obj) + "\n")


def _frames(msg):
    return [(m if isinstance(m, (bytes, bytearray)) else getattr(m, "bytes", bytes(m))).hex()
            for m in msg]


def record_http(what, body, by):
    if os.environ.get("KVB_RECORD_DIR"):
        _append("http-", dict(_ctx(), what=what, body=body, by=by))


def install(role):
    if not os.environ.get("KVB_RECORD_DIR"):
        return
    os.environ["KVB_RECORD_ROLE"] = role
    import zmq

    Socket = zmq.Socket
    send0, recv0 = Socket.send_multipart, Socket.recv_multipart

    def send_multipart(self, msg_parts, *a, **kw):
        parts = list(msg_parts)
        _append("", dict(_ctx(), dir="sent", frames=_frames(parts)))
        return send0(self, parts, *a, **kw)

    def recv_multipart(self, *a, **kw):
        parts = recv0(self, *a, **kw)
        _append("", dict(_ctx(), dir="received", frames=_frames(parts)))
        return parts

    Socket.send_multipart, Socket.recv_multipart = send_multipart, recv_multipart

    import requests

    rel = os.environ["KVB_RECORD_RELEASE"]
    put0, get0, sget0 = requests.put, requests.get, requests.Session.get

    def put(url, *a, **kw):
        if url.endswith("/route") and "json" in kw:
            record_http("put", json.dumps(kw["json"]), f"PUT body of {rel}'s prefill")
        return put0(url, *a, **kw)

    def seen(url, r):
        if "/route?" in url and r.status_code == 200:
            what = "parallel_info" if "=-1" in url else "rank_addr"
            record_http(f"{what}_received", r.text, f"answer read by {rel}'s decode")
        return r

    requests.put = put
    requests.get = lambda url, *a, **kw: seen(url, get0(url, *a, **kw))
    requests.Session.get = lambda self, url, *a, **kw: seen(url, sget0(self, url, *a, **kw))


def query_server(addr, v2026, case):
    """The driver asks a real bootstrap server (the release's own, running
    in a role process) for its parallel info and rank 0, and records them."""
    if not os.environ.get("KVB_RECORD_DIR"):
        return
    import requests

    rel = os.environ["KVB_RECORD_RELEASE"]
    if v2026:
        qs = ("prefill_dp_rank={0}&prefill_cp_rank={0}&target_tp_rank={0}&target_pp_rank={0}")
    else:
        qs = "engine_rank={0}&target_dp_group={0}&target_pp_rank={0}"
    for what, v in (("parallel_info", -1), ("rank_addr", 0)):
        for _ in range(50):
            r = requests.get(f"http://{addr}/route?" + qs.format(v), timeout=5)
            if r.status_code == 200:
                os.environ["INTEROP_LOG"] = case
                record_http(what, r.text, f"{rel}'s bootstrap server, GET /route {what}")
                break
            import time

            time.sleep(0.1)
