"""The Python bindings know every status of include/kvbridge/common.h, with
the C value and name, and the library has a text for each (a status added
in C but not here, KVB_ERR_BUSY for one, would reach Python callers as a
bare number)."""

import os
import re

from kvbridge import _lib as L

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def c_statuses():
    with open(os.path.join(ROOT, "include", "kvbridge", "common.h")) as f:
        text = f.read()
    body = text[text.index("typedef enum kvb_status {"):text.index("} kvb_status_t;")]
    return {name: int(value) for name, value in re.findall(r"(KVB_\w+)\s*=\s*(-?\d+)", body)}


def test_every_c_status_is_bound():
    statuses = c_statuses()
    assert "KVB_ERR_BUSY" in statuses, statuses
    for name, value in statuses.items():
        assert getattr(L, name) == value, name
        assert L.STATUS_NAMES[value] == name, name
    assert sorted(L.STATUS_NAMES) == sorted(statuses.values())


def test_every_status_has_a_text():
    for value in c_statuses().values():
        assert L.status_string(value) != "unknown status", value
    assert L.status_string(L.KVB_ERR_BUSY) == "peer busy: try again"
