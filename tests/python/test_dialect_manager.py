"""The manager's bootstrap dialect, seen on the wire: a prefill and a decode
KVManager talk to a stand-in seed-001 bootstrap server (Python, written from
PROTOCOL.md: it knows only engine_rank/target_dp_group queries and answers
anything else 400 "Missing inputs for bootstrap server.", as SGLang 0.5.2
does) that records every request.

- sglang_dialect=2025: the registration is seed 001's body (no 2026 keys)
  and the decode asks only 2025-style queries.
- default (2026): the registration is the union body (role + page_size etc.),
  the decode asks the 2026 parallel info first, gets the 400, asks again in
  the 2025 style and looks its rank up 2025-style from then on.
"""

import http.server
import json
import threading
import time

import numpy as np

import kvbridge as kb  # noqa: E402

PAGE, ITEM, POOL = 4, 4 * 16, 8


class Seed001Bootstrap(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.log = []  # (method, path, body)
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self):
        return f"127.0.0.1:{self.server_address[1]}"

    def close(self):
        self.shutdown()
        self.server_close()


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _answer(self, code, text, ctype="text/plain"):
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.server.lock:
            self.server.log.append(("PUT", self.path, json.loads(body)))
        self._answer(200, "OK")

    def do_GET(self):
        with self.server.lock:
            self.server.log.append(("GET", self.path, None))
        q = dict(kv.split("=", 1) for kv in self.path.split("?", 1)[-1].split("&") if "=" in kv)
        if self.path.startswith("/health"):
            return self._answer(200, "OK")
        if "engine_rank" not in q or "target_dp_group" not in q:
            return self._answer(400, "Missing inputs for bootstrap server.")
        if q["engine_rank"] == "-1":
            return self._answer(200, json.dumps({"prefill_attn_tp_size": 1, "prefill_dp_size": 1,
                                                 "prefill_pp_size": 1}), "application/json")
        # A rank nobody serves: the receiver fails later, which is not tested here.
        return self._answer(200, json.dumps({"rank_ip": "127.0.0.1", "rank_port": 9}),
                            "application/json")


def kv_args():
    kv = [np.zeros((POOL, ITEM), np.uint8) for _ in range(2)]
    aux = np.zeros((4, 64), np.uint8)
    args = kb.KVArgs(kv_data_ptrs=[b.ctypes.data for b in kv], kv_data_lens=[b.nbytes for b in kv],
                     kv_item_lens=[ITEM] * 2, aux_data_ptrs=[aux.ctypes.data],
                     aux_data_lens=[aux.nbytes], aux_item_lens=[64], page_size=PAGE,
                     kv_head_num=1, engine_rank=0)
    return args, (kv, aux)


def run(dialect, monkeypatch):
    monkeypatch.delenv("KVBRIDGE_SGLANG_DIALECT", raising=False)
    monkeypatch.setenv("KVBRIDGE_BOOTSTRAP_REFRESH", "0")
    srv = Seed001Bootstrap()
    extra = {} if dialect is None else {"sglang_dialect": dialect}
    pa, keep_p = kv_args()
    da, keep_d = kv_args()
    try:
        with kb.KVManager(pa, "prefill", srv.address, **extra) as pm, \
                kb.KVManager(da, "decode", engine=pm.engine, **extra) as dm:
            rc = kb.KVReceiver(dm, srv.address, 6)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with srv.lock:
                    gets = [p for m, p, _ in srv.log if m == "GET" and p.startswith("/route")]
                if any("engine_rank=0" in p for p in gets):
                    break
                time.sleep(0.02)
            rc.clear()
        with srv.lock:
            return list(srv.log)
    finally:
        srv.close()
        del keep_p, keep_d


def test_manager_speaks_2025(monkeypatch):
    log = run(2025, monkeypatch)
    puts = [b for m, _, b in log if m == "PUT"]
    assert puts and puts[0]["role"] == "Prefill"
    assert not {"page_size", "attn_cp_size", "kv_cache_dtype"} & set(puts[0]), puts[0]
    gets = [p for m, p, _ in log if m == "GET" and p.startswith("/route")]
    assert gets[0] == "/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1", gets
    assert gets[1] == "/route?engine_rank=0&target_dp_group=0&target_pp_rank=0", gets
    assert not any("prefill_dp_rank" in p for p in gets), gets


def test_manager_default_2026_falls_back(monkeypatch):
    log = run(None, monkeypatch)
    puts = [b for m, _, b in log if m == "PUT"]
    # The union body: seed 001's keys with role, plus SGLang 2026's.
    assert puts and puts[0]["role"] == "Prefill"
    assert puts[0]["page_size"] == PAGE and puts[0]["attn_cp_size"] == 1
    assert puts[0]["attn_cp_rank"] == 0 and puts[0]["kv_cache_dtype"] is None
    gets = [p for m, p, _ in log if m == "GET" and p.startswith("/route")]
    assert gets[0] == ("/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1"
                       "&target_pp_rank=-1&kvbridge_layout=1"), gets
    assert gets[1] == "/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1", gets
    assert gets[2] == "/route?engine_rank=0&target_dp_group=0&target_pp_rank=0", gets


def test_bad_dialect_refused():
    args, keep = kv_args()
    for bad in (7, "2026", True):
        try:
            kb.KVManager(args, "decode", sglang_dialect=bad)
        except kb.InvalidArgument as e:
            assert "sglang_dialect" in str(e)
        else:
            raise AssertionError(f"sglang_dialect={bad!r} accepted")
    del keep
