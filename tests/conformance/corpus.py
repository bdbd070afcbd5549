#!/usr/bin/python3
"""Conformance corpus tool (docs/testing.md, "Conformance corpus").

Golden files live in tests/conformance/<dialect>/, one JSON file per wire
message (format: tests/conformance/README.md). This tool

  build                      (re)writes the files whose provenance is
                             "spec-example" or "spec-derived" from the case
                             table below (frames built from the specs'
                             tables; "expect" from this file's own decoder);
  import DIR                 turns the recordings of `scripts/interop.sh
                             --record` / `interop-tokenspeed.sh --record`
                             (DIR/*.jsonl, one line per message a real peer
                             sent or accepted) into "recorded" golden files,
                             one per (dialect, kind, shape), volatile values
                             (pointers, ports, session ids) canonicalised;
  check                      decodes every golden file's frames with this
                             file's decoder and compares with its "expect"
                             (an independent reading of the specs: the C
                             replay test, tests/conformance/test_conformance.c,
                             checks kvbridge's decoder against the same).

Python 3 standard library only (Debian's /usr/bin/python3).
"""

import glob
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MARKER = b"kvbridge-ext/1"
DIALECTS = ("sglang2025", "sglang2026", "tokenspeed_seed004")

# ---------------------------------------------------------------- frames <-> text


def frame_text(b):
    """One frame as a string: "t:" + printable ASCII, else "x:" + hex."""
    if all(0x20 <= c < 0x7F for c in b):
        return "t:" + b.decode("ascii")
    return "x:" + b.hex()


def frame_bytes(s):
    if s.startswith("t:"):
        return s[2:].encode("ascii")
    if s.startswith("x:"):
        return bytes.fromhex(s[2:])
    raise ValueError(f"frame {s!r}: neither t: nor x:")


def dec(v):
    return str(v).encode()


def u64s(*v):
    return struct.pack(f"<{len(v)}Q", *v)


def u32s(*v):
    return struct.pack(f"<{len(v)}I", *v)


def i32s(*v):
    return struct.pack(f"<{len(v)}i", *v)


def i64s(*v):
    return struct.pack(f"<{len(v)}q", *v)


def lol(fmt, lists):
    """SGLang 2026's packed list of lists (spec 4); [] is an empty frame."""
    if not lists:
        return b""
    w = struct.calcsize("<" + fmt)
    out = struct.pack(f"<{1 + len(lists)}I", len(lists), *[len(x) * w for x in lists])
    for x in lists:
        out += struct.pack(f"<{len(x)}{fmt}", *x)
    return out


# ---------------------------------------------------------------- decoders
# Each returns the "expect" object: the fields kvbridge's decoder must give
# (names as in src/proto/frames*.h). Raises ValueError on a malformed message.


def _arr(b, fmt):
    w = struct.calcsize("<" + fmt)
    if len(b) % w:
        raise ValueError(f"length {len(b)} not a multiple of {w}")
    return list(struct.unpack(f"<{len(b) // w}{fmt}", b))


def _int(b):
    s = b.decode("ascii")
    if not s or not (s.isdigit() or (s[0] == "-" and s[1:].isdigit())):
        raise ValueError(f"not a decimal: {b!r}")
    return int(s)


def _lol(b, fmt):
    if not b:
        return []
    n = struct.unpack_from("<I", b)[0]
    lens = struct.unpack_from(f"<{n}I", b, 4)
    off, out = 4 + 4 * n, []
    for ln in lens:
        out.append(_arr(b[off:off + ln], fmt))
        off += ln
    if off != len(b):
        raise ValueError("LoL: trailing bytes")
    return out


def split_ext(fr):
    """Dialect frames, extension frames (after the kvbridge marker)."""
    if MARKER in fr:
        i = fr.index(MARKER)
        return fr[:i], fr[i + 1:]
    return fr, []


def ext_map(ext):
    m = {}
    for e in ext:
        k, _, v = e.partition(b"=")
        m[k.decode()] = v
    return m


def d25_registration(fr):
    d, ext = split_ext(fr)
    if len(d) != 9 or d[0] != b"None":
        raise ValueError("registration: 9 frames, frame 0 None")
    em = ext_map(ext)
    return {"ip": d[1].decode(), "port": _int(d[2]), "session_id": d[3].decode(),
            "kv_ptrs": _arr(d[4], "Q"), "aux_ptrs": _arr(d[5], "Q"), "dst_tp_rank": _int(d[6]),
            "dst_attn_tp_size": _int(d[7]), "dst_kv_item_len": _int(d[8]),
            "state_ptrs": _arr(em["state_ptrs"], "Q") if "state_ptrs" in em else None,
            "ext": [frame_text(e) for e in ext]}


def d25_transfer(fr):
    d, ext = split_ext(fr)
    if len(d) != 7:
        raise ValueError("transfer info: 7 frames")
    dummy = not d[4] and not d[5]
    em = ext_map(ext)
    return {"room": _int(d[0]), "ip": d[1].decode(), "port": _int(d[2]),
            "session_id": d[3].decode(), "is_dummy": dummy, "pages": _arr(d[4], "i"),
            "aux_index": -1 if dummy else _int(d[5]), "required_dst_info_num": _int(d[6]),
            "page_mask": list(em["page_mask"]) if "page_mask" in em else None,
            "prefix_len": _int(em["prefix_len"]) if "prefix_len" in em else None,
            "state_idx": _arr(em["state_idx"], "i") if "state_idx" in em else None,
            "epoch": _int(em["epoch"]) if "epoch" in em else None,
            "ext": [frame_text(e) for e in ext]}


def d_status(fr):
    if len(fr) != 3:
        raise ValueError("status: 3 frames")
    return {"room": _int(fr[0]), "status": _int(fr[1]), "prefill_rank": _int(fr[2])}


def d_aux(fr):
    if len(fr) != 6 or fr[0] != b"AUX_DATA":
        raise ValueError("aux: 6 frames")
    if struct.unpack(">I", fr[4])[0] != len(fr[5]):
        raise ValueError("aux: length")
    return {"room": _int(fr[1]), "buffer_index": _int(fr[2]), "aux_index": _int(fr[3]),
            "payload": fr[5].hex()}


def d26_registration(fr):
    d, ext = split_ext(fr)
    if not 10 <= len(d) <= 20 or d[0] != b"None":
        raise ValueError("registration (2026): 10..20 frames")
    g = lambda i: d[i] if i < len(d) else b""  # noqa: E731
    return {"ip": d[1].decode(), "port": _int(d[2]), "session_id": d[3].decode(),
            "kv_ptrs": _arr(d[4], "Q"), "aux_ptrs": _arr(d[5], "Q"),
            "state_ptrs": _lol(d[6], "Q"), "dst_tp_rank": _int(d[7]),
            "dst_attn_tp_size": _int(d[8]), "dst_kv_item_len": _int(d[9]),
            "state_item_lens": _lol(g(10), "I"), "state_dims": _lol(g(11), "I"),
            "kv_layer_ids": _arr(g(12), "I"), "state_layer_ids": _lol(g(13), "I"),
            "staging_base": struct.unpack("<Q", g(14))[0] if len(g(14)) == 8 else None,
            "staging_size": _int(g(15)) if g(15) else 0,
            "dcp_size": _int(g(16)) if g(16) else 1, "dcp_rank": _int(g(17)) if g(17) else 0,
            "staging_slot_ids": _arr(g(18), "Q"), "kv_item_lens": _arr(g(19), "Q"),
            "n_fixed": len(d), "ext": [frame_text(e) for e in ext]}


def d26_transfer(fr):
    d, ext = split_ext(fr)
    if not 8 <= len(d) <= 10:
        raise ValueError("transfer info (2026): 8..10 frames")
    g = lambda i: d[i] if i < len(d) else b""  # noqa: E731
    dummy = not d[4] and not d[5]
    em = ext_map(ext)
    return {"room": _int(d[0]), "ip": d[1].decode(), "port": _int(d[2]),
            "session_id": d[3].decode(), "is_dummy": dummy, "pages": _arr(d[4], "i"),
            "aux_index": -1 if dummy else _int(d[5]), "state_idx": _lol(d[6], "i"),
            "required_dst_info_num": _int(d[7]),
            "prefix_len": _int(g(8)) if g(8) else None, "device_pages": _arr(g(9), "i"),
            "epoch": _int(em["epoch"]) if "epoch" in em else None,
            "page_mask": list(em["page_mask"]) if "page_mask" in em else None,
            "n_fixed": len(d), "ext": [frame_text(e) for e in ext]}


def d26_abort(fr):
    if len(fr) not in (4, 5) or fr[0] != b"ABORT":
        raise ValueError("abort: 4 or 5 frames")
    return {"room": _int(fr[1]), "ip": fr[2].decode(), "port": _int(fr[3]),
            "generation": _int(fr[4]) if len(fr) == 5 else None}


def d26_abort_ack(fr):
    if len(fr) not in (2, 3, 4) or fr[0] != b"ABORT_ACK":
        raise ValueError("abort ack: 2..4 frames")
    return {"room": _int(fr[1]), "rank": _int(fr[2]) if len(fr) >= 3 else None,
            "generation": _int(fr[3]) if len(fr) == 4 else None}


def dts_registration(fr):
    if len(fr) != 8 or fr[0] != b"None" or fr[5]:
        raise ValueError("registration (TokenSpeed): 8 frames, frame 5 empty")
    return {"ip": fr[1].decode(), "port": _int(fr[2]), "session_id": fr[3].decode(),
            "kv_ptrs": _arr(fr[4], "Q"), "state_ptrs": _arr(fr[6], "Q"),
            "prefix_len": _int(fr[7]) if fr[7] else 0}


PLAN_KEYS = ("buffer_index", "buffer_kind", "src_rank", "dst_rank", "src_page_stride_bytes",
             "dst_page_stride_bytes", "src_byte_offset", "dst_byte_offset", "bytes_per_page",
             "page_count")


def dts_transfer(fr):
    if len(fr) not in (12, 14):
        raise ValueError("transfer info (TokenSpeed): 12 or 14 frames")
    dummy = not fr[4] and not fr[5]
    plan = None
    if len(fr) == 14 and fr[12]:
        plan = [{k: f[k] for k in PLAN_KEYS} for f in json.loads(fr[13])]
    return {"room": _int(fr[0]), "ip": fr[1].decode(), "port": _int(fr[2]),
            "session_id": fr[3].decode(), "is_dummy": dummy, "pages": _arr(fr[4], "q"),
            "aux_index": -1 if dummy else _int(fr[5]), "required_dst_info_num": _int(fr[6]),
            "prefix_len": 0 if dummy else _int(fr[7]), "l1_5": 0 if dummy else _int(fr[8]),
            "mask_len": len(fr[9]), "local_len": len(fr[10]), "state_idx": _arr(fr[11], "q"),
            "plan": plan}


def dts_status(fr):
    if len(fr) != 5:
        raise ValueError("status (TokenSpeed): 5 frames")
    return {"room": _int(fr[0]), "status": _int(fr[1]), "sender": _int(fr[2]),
            "first_token": _int(fr[3]) if fr[3] else -1, "candidates": _arr(fr[4], "i")}


DECODERS = {
    ("sglang2025", "registration"): d25_registration,
    ("sglang2025", "transfer"): d25_transfer,
    ("sglang2025", "status"): d_status,
    ("sglang2025", "aux"): d_aux,
    ("sglang2026", "registration"): d26_registration,
    ("sglang2026", "transfer"): d26_transfer,
    ("sglang2026", "status"): d_status,
    ("sglang2026", "aux"): d_aux,
    ("sglang2026", "abort"): d26_abort,
    ("sglang2026", "abort_ack"): d26_abort_ack,
    ("tokenspeed_seed004", "registration"): dts_registration,
    ("tokenspeed_seed004", "transfer"): dts_transfer,
    ("tokenspeed_seed004", "status"): dts_status,
}

DIRECTION = {"registration": "decode->prefill", "transfer": "decode->prefill",
             "abort": "decode->prefill", "status": "prefill->decode",
             "aux": "prefill->decode", "abort_ack": "prefill->decode"}


def classify(dialect, fr):
    """The message kind of a multipart, as the dialect's receivers dispatch."""
    if fr[0] == b"None":
        return "registration"
    if fr[0] == b"AUX_DATA":
        return "aux"
    if fr[0] == b"ABORT":
        return "abort"
    if fr[0] == b"ABORT_ACK":
        return "abort_ack"
    if fr[0] in (b"STAGING_REQ", b"STAGING_RSP", b"CHUNK_READY", b"WATERMARK"):
        return "staging"
    d, _ = split_ext(fr)
    if dialect == "tokenspeed_seed004":
        return "status" if len(d) == 5 else "transfer"
    return "status" if len(d) == 3 else "transfer"


# ---------------------------------------------------------------- writing


def dump(obj):
    """Diff-friendly JSON: one top-level key per line, one frame per line,
    one expect field per line (values compact)."""
    c = lambda v: json.dumps(v, separators=(", ", ": "))  # noqa: E731
    lines = ["{"]
    items = list(obj.items())
    for i, (k, v) in enumerate(items):
        comma = "," if i + 1 < len(items) else ""
        if k == "frames":
            lines.append(f' "frames": [')
            lines += [f"  {c(f)}" + ("," if j + 1 < len(v) else "") for j, f in enumerate(v)]
            lines.append(" ]" + comma)
        elif isinstance(v, dict) and v and k != "server_puts":
            lines.append(f" {c(k)}: {{")
            sub = list(v.items())
            lines += [f"  {c(sk)}: {c(sv)}" + ("," if j + 1 < len(sub) else "")
                      for j, (sk, sv) in enumerate(sub)]
            lines.append(" }" + comma)
        else:
            lines.append(f" {c(k)}: {c(v)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def frames_file(dialect, kind, case, frames, provenance, note):
    fr = [bytes(f) for f in frames]
    return {"corpus": 1, "dialect": dialect, "kind": kind, "case": case,
            "direction": DIRECTION[kind], "provenance": provenance, "note": note,
            "frames": [frame_text(f) for f in fr], "expect": DECODERS[(dialect, kind)](fr)}


READER = os.environ.get("KVB_CONFORMANCE_READER",
                        os.path.join(HERE, "..", "..", "build", "tests", "conformance",
                                     "test_conformance"))


def probe(path, obj):
    """Add what kvbridge makes of the file (test_conformance --probe):
    "kvbridge_encodes" (its encoder gives these exact bytes), and for
    bootstrap bodies its reading ("expect") and, for server_puts files, the
    body its server answers. These keys pin kvbridge's behaviour (golden
    master); "expect" of frame files stays corpus.py's own reading."""
    import subprocess

    if not os.access(READER, os.X_OK):
        sys.exit(f"corpus.py: {READER} missing: build it (cmake --build build --target "
                 "test_conformance) or set KVB_CONFORMANCE_READER")
    r = subprocess.run([READER, "--probe", path], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"corpus.py: probe {path}: {r.stderr.strip()}")
    got = json.loads(r.stdout)
    out = {}
    for k, v in obj.items():
        if k in ("frames", "body", "expect"):
            continue
        out[k] = v
        if k == "provenance":
            out["kvbridge_encodes"] = got["kvbridge_encodes"]
    if "frames" in obj:
        out["frames"] = obj["frames"]
        out["expect"] = obj["expect"]
    else:
        out["body"] = got.get("body", obj.get("body"))
        out["expect"] = got["expect"]
    return out


def write(dialect, name, obj, outdir=HERE):
    d = os.path.join(outdir, dialect)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, name + ".json")
    with open(path, "w") as f:
        f.write(dump(obj))
    full = probe(path, obj)
    with open(path, "w") as f:
        f.write(dump(full))


# ---------------------------------------------------------------- the spec-built cases
# Geometry of the interop suite (tests/interop/sglang_pd.py): MHA, 2 layers
# (K0 K1 V0 V1), page 16 tokens, 512 bytes per page per buffer, one aux
# buffer of 64-byte slots; decode pages [5, 1, 30, 12], aux slot 6.
KV4 = u64s(0x7F0000100000, 0x7F0000200000, 0x7F0000300000, 0x7F0000400000)
KV2 = u64s(0x7F0000100000, 0x7F0000200000)
AUX1 = u64s(0x7F0000500000)
IP, PORT, SID = b"127.0.0.1", b"17001", b"127.0.0.1:15001"
PAGES = i32s(5, 1, 30, 12)
S25 = "PROTOCOL.md (seed 001 tables)"
S26 = "PROTOCOL-SGLANG-2026.md"
STS = "PROTOCOL-TOKENSPEED.md"


def cases():
    """(dialect, kind, case, frames, provenance, note)"""
    E = b""
    n = "None"
    c = []
    add = lambda *a: c.append(a)  # noqa: E731
    # ---- seed 001 (SGLang 0.5.2rc2)
    d = "sglang2025"
    add(d, "registration", "mha", [b"None", IP, PORT, SID, KV4, AUX1, b"0", b"1", b"512"],
        "spec-derived", f"{S25}, KV-args registration: 4 KV buffers (K0 K1 V0 V1), 1 aux")
    add(d, "registration", "mla", [b"None", IP, PORT, SID, KV2, AUX1, b"0", b"1", b"1152"],
        "spec-derived", f"{S25}: MLA, one latent buffer per layer")
    add(d, "registration", "hetero_tp", [b"None", IP, PORT, SID, KV4, AUX1, b"1", b"2", b"256"],
        "spec-derived", f"{S25}: decode attention TP 2, rank 1 (half the heads per item)")
    add(d, "registration", "state_ext",
        [b"None", IP, PORT, SID, KV4, AUX1, b"0", b"1", b"512", MARKER,
         b"state_ptrs=" + u64s(0x7F0000600000)],
        "spec-derived", "docs/protocol-frames.md, extension frames: kvbridge decode -> kvbridge "
        "prefill only (state buffer bases)")
    add(d, "transfer", "mha", [b"1000", IP, PORT, SID, PAGES, b"6", b"1"],
        "spec-derived", f"{S25}, transfer info: 4 pages, aux slot 6")
    add(d, "transfer", "dummy", [b"1000", IP, PORT, SID, E, E, b"2"],
        "spec-derived", f"{S25}: dummy (frames 4 and 5 empty), decode TP larger (2 infos)")
    add(d, "transfer", "hetero_tp", [b"1001", IP, PORT, SID, PAGES, b"6", b"2"],
        "spec-derived", f"{S25}: decode TP 2 -> prefill TP 1, required_dst_info_num 2")
    add(d, "transfer", "prefix_ext",
        [b"1002", IP, PORT, SID, i32s(30, 12), b"6", b"1", MARKER, b"epoch=7",
         b"page_mask=\x00\x01", b"prefix_len=32", b"state_idx=" + i32s(3)],
        "spec-derived", "docs/protocol-frames.md: kvbridge decode -> kvbridge prefill: writer "
        "grant, page mask, decode prefix (tokens), state slot")
    add(d, "status", "success", [b"1000", b"4", b"0"], "spec-derived", f"{S25}, status")
    add(d, "status", "failed", [b"1000", b"0", b"3"], "spec-derived",
        f"{S25}: Failed from prefill_rank 3 (attn_tp_rank 1 * pp 2 + pp_rank 1)")
    add(d, "status", "bootstrapping", [b"1000", b"1", b"0"], "spec-derived",
        f"{S25}: a non-terminal status value")
    add(d, "aux", "slot", [b"AUX_DATA", b"1000", b"0", b"6", struct.pack(">I", 8),
                           bytes(range(1, 9))],
        "spec-derived", f"{S25}, aux data inline (8-byte aux item)")
    # ---- SGLang 0.5.23 (2026)
    d = "sglang2026"
    f18 = lambda kv, aux, st, rank, tp, item, *tail: [  # noqa: E731
        b"None", IP, PORT, SID, kv, aux, st, rank, tp, item, *tail]
    add(d, "registration", "mha",
        f18(KV4, AUX1, E, b"0", b"1", b"512", E, E, E, E, E, E, b"1", b"0"),
        "spec-example", f"{S26} 5.2 example: plain MHA model without staging (18 frames)")
    add(d, "registration", "mha_v0523",
        f18(KV4, AUX1, E, b"0", b"1", b"512", E, E, E, E, E, E, b"1", b"0", E,
            u64s(512, 512, 512, 512)),
        "spec-derived", "what SGLang 0.5.23's build_receiver_registration_message sends "
        "(frames 18 staging slot ids, 19 kv_item_lens; tests/unit/proto/test_frames26_v0523.c)")
    add(d, "registration", "mla",
        f18(KV2, AUX1, E, b"0", b"1", b"1152", E, E, E, E, E, E, b"1", b"0"),
        "spec-derived", f"{S26} 5.2: MLA, one buffer per layer")
    add(d, "registration", "hetero_tp",
        f18(KV4, AUX1, E, b"1", b"2", b"256", E, E, E, E, E, E, b"1", b"0"),
        "spec-derived", f"{S26} 5.2: decode attention TP 2, rank 1")
    add(d, "registration", "state",
        f18(KV4, AUX1, lol("Q", [[0x7F0000600000, 0x7F0000700000]]), b"0", b"1", b"512",
            lol("I", [[4096, 2048]]), lol("I", [[8, 8]]), u32s(0, 1, 0, 1),
            lol("I", [[0, 1]]), E, E, b"1", b"0"),
        "spec-derived", f"{S26} 5.2, 7.5: one Mamba state component (2 tensors), layer ids")
    add(d, "registration", "draft",
        f18(KV4 + u64s(0x7F0000800000, 0x7F0000900000), AUX1, E, b"0", b"1", b"512",
            E, E, E, E, E, E, b"1", b"0"),
        "spec-derived", f"{S26} 5.2: draft-model K/V buffers appended to frame 4")
    add(d, "registration", "min10",
        f18(KV4, AUX1, E, b"0", b"1", b"512")[:10],
        "spec-derived", f"{S26} 5.2: the minimum the prefill accepts (frames 0-9)")
    add(d, "registration", "dcp",
        f18(KV2, AUX1, E, b"0", b"1", b"1152", E, E, E, E, E, E, b"2", b"1"),
        "spec-derived", f"{S26} 5.2, 7.8: decode DCP 2, rank 1 (MLA)")
    f10 = lambda room, pages, aux, st, req, pre, dev: [  # noqa: E731
        room, IP, PORT, SID, pages, aux, st, req, pre, dev]
    add(d, "transfer", "mha", f10(b"1000", PAGES, b"6", E, b"1", b"0", E),
        "spec-derived", f"{S26} 5.3: 10 frames, prefix 0")
    add(d, "transfer", "dummy", f10(b"1000", E, E, E, b"1", b"0", E),
        "spec-derived", f"{S26} 5.3: dummy target (MLA, prefill TP larger)")
    add(d, "transfer", "prefix", f10(b"1001", i32s(30, 12), b"6", E, b"1", b"32", E),
        "spec-derived", f"{S26} 5.3, 7.1: decode holds 32 tokens, suffix pages only")
    add(d, "transfer", "state", f10(b"1002", PAGES, b"6", lol("i", [[5]]), b"1", b"0", E),
        "spec-example", f"{S26} 4: state indices [[5]] (the spec's LoL example)")
    add(d, "transfer", "hetero_tp", f10(b"1003", PAGES, b"6", E, b"2", b"0", E),
        "spec-derived", f"{S26} 5.3, 10.1: decode TP 2 -> prefill TP 1")
    add(d, "transfer", "min8", f10(b"1004", PAGES, b"6", E, b"1", b"0", E)[:8],
        "spec-derived", f"{S26} 5.3: the 8 frames the prefill accepts at least")
    add(d, "transfer", "hisparse", f10(b"1005", PAGES, b"6", E, b"1", b"0", i32s(9, 8, 7, 6)),
        "spec-derived", f"{S26} 5.3, 7.8: HiSparse device pages in frame 9")
    add(d, "transfer", "epoch_ext",
        f10(b"1006", PAGES, b"6", E, b"1", b"0", E) + [MARKER, b"epoch=3",
                                                      b"page_mask=\x01\x00\x01\x01"],
        "spec-derived", "docs/protocol-frames.md: kvbridge decode -> kvbridge prefill "
        "(writer grant, page mask)")
    add(d, "status", "success", [b"1000", b"4", b"0"], "spec-derived", f"{S26} 5.4")
    add(d, "status", "failed", [b"1000", b"0", b"1"], "spec-derived", f"{S26} 5.4")
    add(d, "aux", "slot", [b"AUX_DATA", b"1000", b"0", b"6", struct.pack(">I", 8),
                           bytes(range(1, 9))], "spec-derived", f"{S26} 5.5")
    add(d, "abort", "plain", [b"ABORT", b"1000", IP, PORT], "spec-derived", f"{S26} 5.6")
    add(d, "abort", "generation", [b"ABORT", b"1000", IP, PORT, b"2"], "spec-derived",
        "SGLang 0.5.23 deferred decode KV release: the ABORT's generation (frame 4)")
    add(d, "abort_ack", "plain", [b"ABORT_ACK", b"1000"], "spec-derived",
        f"{S26} 5.7: deferred release off")
    add(d, "abort_ack", "rank", [b"ABORT_ACK", b"1000", b"0"], "spec-derived",
        f"{S26} 5.7: deferred mode, prefill_unique_rank")
    add(d, "abort_ack", "generation", [b"ABORT_ACK", b"1000", b"0", b"2"], "spec-derived",
        "SGLang 0.5.23: the ACK echoes the ABORT's generation")
    # ---- TokenSpeed seed 004
    d = "tokenspeed_seed004"
    add(d, "registration", "mha", [b"None", IP, PORT, SID, KV4, E, E, b"0"],
        "spec-derived", f"{STS} 4.2, 4.5")
    add(d, "registration", "mla", [b"None", IP, PORT, SID, KV2, E, E, b"0"],
        "spec-derived", f"{STS} 4.2, 8.2: MLA")
    add(d, "registration", "state",
        [b"None", IP, PORT, SID, KV4, E, u64s(0x7F0000600000, 0x7F0000700000), b"0"],
        "spec-derived", f"{STS} 4.2, 8.4: flat state (Mamba) buffer bases")
    add(d, "registration", "draft",
        [b"None", IP, PORT, SID, KV4 + u64s(0x7F0000800000, 0x7F0000900000), E, E, b"0"],
        "spec-derived", f"{STS} 4.2, 8.5: draft K/V buffers after the target's")
    P64 = i64s(5, 1, 30, 12)
    t12 = lambda room, pages, aux, req, pre, st, *plan: [  # noqa: E731
        room, IP, PORT, SID, pages, aux, req, pre, b"0", E, E, st, *plan]
    add(d, "transfer", "mha", t12(b"1000", P64, b"6", b"1", b"0", E), "spec-example",
        f"{STS} 4.5: TP1 -> TP1, identity plan (12 frames)")
    add(d, "transfer", "dummy", [b"1000", IP, PORT, SID, E, E, b"1", E, E, E, E, E],
        "spec-derived", f"{STS} 4.3: dummy target")
    add(d, "transfer", "prefix", t12(b"1001", i64s(30, 12), b"6", b"1", b"32", E),
        "spec-derived", f"{STS} 4.3, 8.1: decode holds 32 tokens, missing pages only")
    add(d, "transfer", "state", t12(b"1002", P64, b"6", b"1", b"0", i64s(3, 4)),
        "spec-derived", f"{STS} 4.3, 8.4: working and checkpoint state slots")
    frag = lambda b, kind, off: {  # noqa: E731
        "buffer_index": b, "buffer_kind": kind, "src_rank": 1, "dst_rank": 0,
        "src_page_stride_bytes": 1024, "dst_page_stride_bytes": 2048, "src_byte_offset": 0,
        "dst_byte_offset": off, "bytes_per_page": 1024, "page_count": None}
    plan = [frag(0, "target_k", 1024), frag(1, "target_v", 1024)]
    pj = json.dumps(plan, separators=(",", ":")).encode()
    add(d, "transfer", "hetero_tp_plan", t12(b"1003", P64, b"6", b"1", b"0", E, b"1", pj),
        "spec-example", f"{STS} 7.5 example: prefill rank 1 of TP2 -> TP1, one layer")
    dplan = [frag(0, "target_k", 1024), frag(1, "target_v", 1024), frag(2, "draft_k", 1024),
             frag(3, "draft_v", 1024)]
    dj = json.dumps(dplan, separators=(",", ":")).encode()
    add(d, "transfer", "draft_plan", t12(b"1004", P64, b"6", b"1", b"0", E, b"1", dj),
        "spec-derived", f"{STS} 7.5, 8.5: TP2 -> TP1 with draft K/V fragments")
    add(d, "status", "success", [b"1000", b"5", b"0", b"42", E], "spec-derived",
        f"{STS} 4.4: Success (5) with the first token")
    add(d, "status", "failed", [b"1000", b"0", b"1", b"-1", E], "spec-derived",
        f"{STS} 4.4: Failed, no token")
    add(d, "status", "candidates", [b"1000", b"5", b"0", b"42", i32s(7, 8, 9)],
        "spec-derived", f"{STS} 4.4, 8.6: speculative candidates")
    del n
    return c


def bootstrap_cases():
    """(dialect, name, kind, body, provenance, note, extra)"""
    c = []
    j = lambda o: json.dumps(o)  # noqa: E731  (Python's requests.put(json=...) bytes)
    jc = lambda o: json.dumps(o, separators=(",", ":"))  # noqa: E731 (kvbridge: compact)
    seed = {"role": "Prefill", "attn_tp_size": 1, "attn_tp_rank": 0, "attn_dp_size": 1,
            "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1,
            "system_dp_rank": 0, "rank_ip": "127.0.0.1", "rank_port": 17001}
    c.append(("sglang2025", "bootstrap_put_seed001", "bootstrap_put", j(seed), "spec-derived",
              "PROTOCOL.md, PUT /route: seed 001's body (requests.put(json=...) spacing)", {}))
    s26 = {"attn_tp_size": 2, "attn_tp_rank": 1, "attn_cp_size": 1, "attn_cp_rank": 0,
           "attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0,
           "system_dp_size": 1, "system_dp_rank": 0, "rank_ip": "127.0.0.1",
           "rank_port": 17002, "page_size": 16, "kv_cache_dtype": "auto",
           "load_balance_method": "follow_bootstrap_room", "enable_dsa_cache_layer_split": False,
           "prefill_http_port": None}
    c.append(("sglang2026", "bootstrap_put_sglang", "bootstrap_put", j(s26), "spec-derived",
              "PROTOCOL-SGLANG-2026.md 3.1: the 2026 body (no role)", {}))
    ts = {"role": "Prefill", "world_size": 2, "dp_size": 1, "rank_ip": "127.0.0.1",
          "rank_port": 17003, "engine_rank": 1, "enable_mla_l1_5_cache": False,
          "kv_item_lens": [512, 512, 512, 512], "kv_unit_lens": [32, 32, 32, 32],
          "state_item_lens": [], "state_unit_lens": []}
    c.append(("tokenspeed_seed004", "bootstrap_put", "bootstrap_put", j(ts), "spec-derived",
              "PROTOCOL-TOKENSPEED.md 3.1", {}))
    c.append(("sglang2025", "bootstrap_parallel_info_seed001", "bootstrap_parallel_info",
              j({"prefill_attn_tp_size": 1, "prefill_dp_size": 1, "prefill_pp_size": 1}),
              "spec-derived", "PROTOCOL.md, GET /route -1/-1/-1 (seed 001 server)", {}))
    info26 = {"attn_tp_size": 2, "attn_cp_size": 1, "dp_size": 1, "pp_size": 1,
              "page_size": 16, "kv_cache_dtype": "auto", "follow_bootstrap_room": True,
              "enable_dsa_cache_layer_split": False, "prefill_http_port": None,
              "target_tp_rank": None, "target_tp_ranks": None, "target_cp_ranks": None,
              "target_pp_ranks": None, "required_dst_info_num": None,
              "required_prefill_response_num": None}
    c.append(("sglang2026", "bootstrap_parallel_info", "bootstrap_parallel_info_2026",
              j(info26), "spec-derived",
              "PROTOCOL-SGLANG-2026.md 3.2: PrefillServerInfo, 15 keys", {}))
    infots = {"prefill_tp_size": 2, "prefill_dp_size": 1, "enable_mla_l1_5_cache": False,
              "kv_item_lens": [512, 512, 512, 512], "kv_unit_lens": [32, 32, 32, 32],
              "state_item_lens": [], "state_unit_lens": []}
    c.append(("tokenspeed_seed004", "bootstrap_parallel_info", "bootstrap_parallel_info_ts",
              j(infots), "spec-derived", "PROTOCOL-TOKENSPEED.md 3.2", {}))
    for d in DIALECTS:
        c.append((d, "bootstrap_rank_addr", "bootstrap_rank_addr",
                  j({"rank_ip": "127.0.0.1", "rank_port": 17001}), "spec-derived",
                  "GET /route per-rank answer", {}))
    # What kvbridge's own server answers (kvbridge-encoder: built from these
    # PUTs by the C test with the server's table and compared byte for byte).
    c.append(("sglang2025", "bootstrap_parallel_info_kvbridge", "bootstrap_parallel_info", None,
              "kvbridge-encoder", "kvbridge's server: GET /route -1/-1/-1 after the seed-001 "
              "PUT (both dialects' keys)", {"server_puts": [j(seed)]}))
    c.append(("sglang2026", "bootstrap_parallel_info_kvbridge", "bootstrap_parallel_info_2026",
              None, "kvbridge-encoder", "kvbridge's server: the 2026 parallel info after the "
              "2026 PUTs of ranks 0 and 1", {"server_puts": [j(dict(s26, attn_tp_rank=0)),
                                                            j(s26)]}))
    c.append(("tokenspeed_seed004", "bootstrap_parallel_info_kvbridge",
              "bootstrap_parallel_info", None, "kvbridge-encoder",
              "kvbridge's server: parallel info after TokenSpeed's PUT: both dialects' keys, "
              "TokenSpeed's layout keys and kvbridge_peer_dialect (read by kvbridge's decode "
              "with the seed-001 parser; TokenSpeed's decode reads prefill_tp_size, "
              "prefill_dp_size, enable_mla_l1_5_cache)", {"server_puts": [j(ts)]}))
    del jc
    return c


def build(outdir=HERE):
    for dialect, kind, case, frames, prov, note in cases():
        write(dialect, f"{kind}_{case}", frames_file(dialect, kind, case, frames, prov, note),
              outdir)
    for dialect, name, kind, body, prov, note, extra in bootstrap_cases():
        obj = {"corpus": 1, "dialect": dialect, "kind": kind, "case": name,
               "direction": "prefill->bootstrap" if kind == "bootstrap_put"
               else "bootstrap->decode", "provenance": prov, "note": note}
        obj.update(extra)
        if body is not None:
            obj["body"] = body
        write(dialect, name, obj, outdir)


# ---------------------------------------------------------------- recordings
# Per kind: frames holding pointers (u64 arrays, canonicalised) and ports.
PTR_FRAMES = {"registration": (4, 5)}


def canon(dialect, kind, fr, ctx):
    """Replace run-dependent values by stable ones, same widths and shapes:
    pointers -> 0x7f00_0010_0000 * k, ports -> 17001.., session ids ->
    127.0.0.1:15001.., rooms as recorded (the harness chooses them)."""
    fr = list(fr)

    def port(b):
        m = ctx.setdefault("ports", {})
        return dec(m.setdefault(b, 17001 + len(m)))

    def sid(b):
        m = ctx.setdefault("sids", {})
        return m.setdefault(b, b"127.0.0.1:%d" % (15001 + len(m)))

    def ptr(v):
        m = ctx.setdefault("ptrs", {})
        return m.setdefault(v, 0x7F0000000000 + (len(m) + 1) * 0x100000)

    if kind in ("registration", "transfer"):
        fr[2], fr[3] = port(fr[2]), sid(fr[3])
    if kind == "abort":
        fr[3] = port(fr[3])
    if kind == "registration":
        for i in (4, 5, 6) if dialect == "tokenspeed_seed004" else (4, 5):
            if fr[i]:
                fr[i] = u64s(*[ptr(v) for v in _arr(fr[i], "Q")])
        if dialect == "sglang2026" and fr[6]:
            fr[6] = lol("Q", [[ptr(v) for v in x] for x in _lol(fr[6], "Q")])
    return fr


def shape_key(dialect, kind, fr):
    """Messages of one shape get one file: frame count, which frames are
    empty, the length of each binary frame (MHA's 4 KV pointers vs MLA's 2),
    and a status' value (Success vs Failed)."""
    shape = tuple(len(f) if frame_text(f).startswith("x:") else bool(f) for f in fr)
    return (kind, len(fr), shape, fr[1] if kind == "status" else None)


UNREADABLE = []  # messages of a recording corpus.py could not read: a wire change


def import_recordings(rec_dir, outdir=HERE):
    """DIR/*.jsonl lines: {"dialect", "release", "case", "role", "dir":
    "sent"|"received", "frames": [hex...]}. One golden file per (dialect,
    direction, kind, shape): recorded_<kind>_<n>.json for what the release's
    code sent, recorded_accepted_<kind>_<n>.json for what it read (kvbridge's
    bytes; the case passing is the release accepting them). Stale recorded_*
    files of a dialect that has recordings are removed first."""
    seen, by_dialect, recs = set(), {}, []
    for path in glob.glob(os.path.join(rec_dir, "[!h]*.jsonl")):
        recs += [(json.loads(line), i) for i, line in enumerate(open(path))]
    # the first message of a shape in (case, role, order) order: the same
    # file for the same cases, whatever the process ids
    recs.sort(key=lambda x: (x[0].get("case", ""), x[0].get("role", ""), x[1]))
    for r, _ in recs:
        d, way = r["dialect"], r.get("dir")
        fr = [bytes.fromhex(h) for h in r["frames"]]
        kind = classify(d, fr)
        if kind == "staging" or (d, kind) not in DECODERS:
            continue
        key = (d, way) + shape_key(d, kind, fr)
        if key in seen:
            continue
        seen.add(key)
        by_dialect.setdefault(d, []).append((way, kind, fr, r))
    for d, msgs in by_dialect.items():
        for old in glob.glob(os.path.join(outdir, d, "recorded_*.json")):
            os.remove(old)
        ctx, count = {}, {}
        for way, kind, fr, r in sorted(msgs, key=lambda m: (m[0] != "sent", m[1], len(m[2]))):
            pre = "recorded_" if way == "sent" else "recorded_accepted_"
            count[pre + kind] = count.get(pre + kind, 0) + 1
            case, rel = r.get("case", "run"), r["release"]
            who = (f"sent by {rel}'s own code" if way == "sent" else
                   f"sent by kvbridge, read by {rel}'s own code (the case passed)")
            try:
                obj = frames_file(d, kind, case, canon(d, kind, fr, ctx),
                                  f"recorded-from-release {rel}",
                                  f"{who}, interop case {case} ({r.get('role', '?')}); pointers, "
                                  "ports and session ids canonicalised by corpus.py")
            except (ValueError, KeyError, struct.error) as e:
                print(f"{d}: a {kind} of {rel} NOT READABLE by corpus.py ({e}): "
                      f"{[frame_text(f) for f in fr]}")
                UNREADABLE.append((d, kind))
                continue
            write(d, f"{pre}{kind}_{count[pre + kind]}", obj, outdir)
    return by_dialect


def import_bootstrap(rec_dir, outdir=HERE):
    """DIR/http-*.jsonl lines: {"dialect", "release", "what": "put"|"parallel_info"|
    "rank_addr", "body"}; one file per (dialect, what)."""
    kinds = {"put": "bootstrap_put", "rank_addr": "bootstrap_rank_addr",
             ("sglang2025", "parallel_info"): "bootstrap_parallel_info",
             ("sglang2026", "parallel_info"): "bootstrap_parallel_info_2026",
             ("tokenspeed_seed004", "parallel_info"): "bootstrap_parallel_info_ts"}
    done, recs = set(), []
    for path in glob.glob(os.path.join(rec_dir, "http-*.jsonl")):
        recs += [(json.loads(line), i) for i, line in enumerate(open(path))]
    recs.sort(key=lambda x: (x[0].get("case", ""), x[0].get("role", ""), x[1]))
    for r, _ in recs:
        d, what = r["dialect"], r["what"]
        if what.endswith("_received") or (d, what) in done:  # kvbridge's answers
            continue
        done.add((d, what))
        kind = kinds.get(what) or kinds[(d, what)]
        body = r["body"]
        if what == "put":  # canonical port, as for the frames
            o = json.loads(body)
            o["rank_port"] = 17001
            body = json.dumps(o)
        elif what == "rank_addr":
            o = json.loads(body)
            o["rank_port"] = 17001
            body = json.dumps(o)
        write(d, f"recorded_{kind}", {
            "corpus": 1, "dialect": d, "kind": kind, "case": r.get("case", "run"),
            "direction": "prefill->bootstrap" if what == "put" else "bootstrap->decode",
            "provenance": f"recorded-from-release {r['release']}",
            "note": f"{r.get('by', '')}; rank_port canonicalised by corpus.py",
            "body": body}, outdir)


# ---------------------------------------------------------------- check


def check(outdir=HERE):
    bad = n = 0
    for path in sorted(glob.glob(os.path.join(outdir, "*", "*.json"))):
        o = json.load(open(path))
        if "frames" not in o or "expect" not in o:
            continue
        n += 1
        got = DECODERS[(o["dialect"], o["kind"])]([frame_bytes(f) for f in o["frames"]])
        if got != o["expect"]:
            bad += 1
            print(f"{path}: expect differs from corpus.py's reading:\n  {got}")
    print(f"corpus.py check: {n} frame files, {bad} differ")
    return 1 if bad else 0


def main(argv):
    if argv[:1] == ["build"]:
        build()
        return 0
    if argv[:1] == ["import"] and len(argv) == 2:
        got = import_recordings(argv[1])
        import_bootstrap(argv[1])
        for d, msgs in sorted(got.items()):
            print(f"{d}: {len(msgs)} recorded message shapes")
        return 1 if UNREADABLE else 0
    if argv[:1] == ["check"]:
        return check()
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
