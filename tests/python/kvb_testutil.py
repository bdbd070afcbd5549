"""Helpers shared by the Python tests (no test_ prefix: pytest collects
nothing here). Import it after the test has put python/ on sys.path."""
import time

import kvbridge as kb


def poll_until(obj, timeout, states=(kb.KVPoll.Success, kb.KVPoll.Failed)):
    """Poll obj (a KVSender or KVReceiver) every 2 ms until its state is one
    of states or timeout seconds passed; the last state polled."""
    deadline = time.monotonic() + timeout
    st = obj.poll()
    while st not in states and time.monotonic() < deadline:
        time.sleep(0.002)
        st = obj.poll()
    return st
