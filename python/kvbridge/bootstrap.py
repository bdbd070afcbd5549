"""KVBootstrapServer: the seeds' MooncakeKVBootstrapServer over kvb_bootstrap_server_*."""

import ctypes

from . import _lib as L

__all__ = ["KVBootstrapServer"]


class KVBootstrapServer(L.Closeable):
    """The HTTP service where prefill ranks register and decode ranks look them
    up. KVBootstrapServer(host, port) is listening when it returns (port 0 =
    ephemeral; read `port` / `address`). Runs on the library's own threads,
    so unlike the seed no Python thread is used. close() stops it."""

    def __init__(self, host="127.0.0.1", port=8998, *, token=None, auth_reads=False,
                 threads=None, conn_timeout=None):
        host = L.as_str(host, "host")
        port = L.as_int(port, "port", 0, 65535)
        p = L.BootstrapServerParams()
        self._host_b = host.encode()
        p.host = self._host_b
        p.port = port
        p.field_mask = L.BOOT_PARAM_HOST | L.BOOT_PARAM_PORT
        if token is not None:
            self._token_b = L.as_str(token, "token").encode()
            p.token = self._token_b
            p.field_mask |= L.BOOT_PARAM_TOKEN
        if auth_reads:
            p.auth_reads = 1
            p.field_mask |= L.BOOT_PARAM_AUTH_READS
        if threads is not None:
            p.threads = L.as_int(threads, "threads", 1, 64)
            p.field_mask |= L.BOOT_PARAM_THREADS
        if conn_timeout is not None:
            p.conn_timeout_s = L.as_float(conn_timeout, "conn_timeout", 1.0)
            p.field_mask |= L.BOOT_PARAM_CONN_TIMEOUT
        self._guard = L.Guard("KVBootstrapServer")
        self._h = None
        self.host = host
        h = ctypes.c_void_p()
        st = L.lib().kvb_bootstrap_server_start(ctypes.byref(p), ctypes.byref(h))
        if st != L.KVB_OK:
            self._guard.closed = True
            L.raise_status(st, f"cannot start the bootstrap server on {host}:{port}: "
                               f"{L.status_string(st)} (the reason is logged)")
        self._h = h.value
        self._port = int(L.lib().kvb_bootstrap_server_port(self._h))
        self._address = L.text(L.lib().kvb_bootstrap_server_address(self._h))
        L.track(self, 2)

    @property
    def port(self):
        """The bound port (the ephemeral one when started with port 0)."""
        return self._port

    @property
    def address(self):
        """"host:port" ("[v6]:port"): the bootstrap_addr senders/receivers use."""
        return self._address

    @property
    def num_ranks(self):
        """Prefill (dp_group, tp_rank, pp_rank) entries registered so far."""
        with self._guard:
            return int(L.lib().kvb_bootstrap_server_num_ranks(self._h))

    def run(self):
        """The seed starts its thread in run(); ours is running already."""

    def close(self):
        if self._guard.close() and self._h is not None:
            L.lib().kvb_bootstrap_server_stop(self._h)
            self._h = None

