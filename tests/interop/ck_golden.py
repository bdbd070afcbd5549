"""What SGLang 0.5.23 puts on the wire with --disaggregation-enable-kv-checksum
against without it, from an interop --record run (scripts/interop.sh
--record; the ck_ cases of sglang_pd.py and their plain twins): every
ZeroMQ message SGLang's connector sent or read as (role, direction, frame
lengths), the frames that hold addresses or ports described by length only,
and the keys of the bootstrap bodies. Writes the golden file
tests/interop/golden/sglang0523_kv_checksum.json (`git diff` shows what a
release changed).

Usage: ck_golden.py RECORD_DIR OUT_JSON
"""

import glob
import json
import os
import sys

RELEASE = "sglang==0.5.23"
PAIRS = [  # (checksum case, its plain twin)
    ("ck_kvbridge_decode_from_sglang_prefill__sglang_boot",
     "kvbridge_decode_from_sglang_prefill__sglang_boot"),
    ("ck_sglang_decode_from_kvbridge_prefill__kvbridge_boot",
     "sglang_decode_from_kvbridge_prefill__kvbridge_boot"),
]
# KV-args frames that carry this run's ports and session ids: their length
# is not the release's (KV-args frames 2, 3; transfer info 2, 3).
VARYING = {"kv_args": (2, 3), "transfer_info": (2, 3)}


def kind(frames):
    f0 = bytes.fromhex(frames[0])
    if f0 == b"None":
        return "kv_args"
    if f0.isdigit() and len(frames) == 3:
        return "status"
    if f0.isdigit():
        return "transfer_info"
    return f0.decode("latin-1")


def shape(o):
    k = kind(o["frames"])
    lens = [len(x) // 2 for x in o["frames"]]
    for i in VARYING.get(k, ()):
        lens[i] = "var"
    return {"role": o["role"], "dir": o["dir"], "kind": k, "frame_bytes": lens}


def case(records, name):
    msgs = [shape(o) for o in records if o["case"] == name and "frames" in o]
    http = sorted({(o["what"], tuple(sorted(o["body"]))) for o in records
                   if o["case"] == name and "body" in o and isinstance(o["body"], dict)})
    return {"zmq": sorted(msgs, key=json.dumps), "http_keys": [[w, list(k)] for w, k in http]}


def main(rec, out):
    records = []
    for f in sorted(glob.glob(os.path.join(rec, "*.jsonl"))):
        with open(f) as fh:
            records += [o for o in map(json.loads, fh) if o.get("release") == RELEASE]
    res = {"source": "sglang==0.5.23 (PyPI wheel), its Mooncake connector in the interop "
                     "suite (tests/interop/sglang_pd.py), recorded by interop_record.py; "
                     "regenerate with scripts/interop.sh --record",
           "pairs": []}
    for ck, plain in PAIRS:
        a, b = case(records, ck), case(records, plain)
        diff = [{"kind": x["kind"], "role": x["role"], "dir": x["dir"],
                 "frames_that_differ": {str(i): [y["frame_bytes"][i], x["frame_bytes"][i]]
                                        for i in range(len(x["frame_bytes"]))
                                        if x["frame_bytes"][i] != y["frame_bytes"][i]}}
                for x, y in zip(a["zmq"], b["zmq"]) if x != y]
        res["pairs"].append({"with_checksum": ck, "without": plain, "with": a,
                             "differences (frame: [without, with] bytes)": diff,
                             "http_keys_equal": a["http_keys"] == b["http_keys"],
                             "message_count_equal": len(a["zmq"]) == len(b["zmq"])})
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1)
        fh.write("\n")
    return 0 if all(p["with"]["zmq"] for p in res["pairs"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
