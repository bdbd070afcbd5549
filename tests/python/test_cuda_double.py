"""CUDA device memory through the Python bindings, against the driver-API
test double (libkvb_cuda_double.so, path in KVBRIDGE_CUDA_DOUBLE; loaded by
the library through KVBRIDGE_CUDA_LIB). DeviceArray stands in for a PyTorch
CUDA tensor: device memory from the double exposing
__cuda_array_interface__. The engines and managers here share one process,
where the driver refuses IPC (as a real one does): device memory takes the
staging lane (tests/cuda covers IPC between processes). Bytes are verified by
reading device memory back through the double."""
import ctypes
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)
DOUBLE = os.environ.get("KVBRIDGE_CUDA_DOUBLE", "")
if not DOUBLE or not os.path.exists(DOUBLE):
    pytest.skip("KVBRIDGE_CUDA_DOUBLE (libkvb_cuda_double.so) not built", allow_module_level=True)
os.environ["KVBRIDGE_CUDA_LIB"] = DOUBLE  # before the library first loads a driver

import kvbridge as kb  # noqa: E402
from kvb_testutil import poll_until  # noqa: E402

cu = ctypes.CDLL(DOUBLE)
U64 = ctypes.c_ulonglong


def _ok(r, what):
    assert r == 0, f"{what}: CUDA error {r}"


def _bind(dev):
    ctx, d = ctypes.c_void_p(), ctypes.c_int()
    _ok(cu.cuInit(0), "cuInit")
    _ok(cu.cuDeviceGet(ctypes.byref(d), dev), "cuDeviceGet")
    _ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d), "cuDevicePrimaryCtxRetain")
    _ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


class DeviceArray:
    """nbytes of device memory of the double, as a 1-D uint8 CUDA array."""

    def __init__(self, shape, dev=0):
        _bind(dev)
        self.shape = tuple(shape)
        self.nbytes = int(np.prod(self.shape))
        p = U64()
        _ok(cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(self.nbytes)), "cuMemAlloc")
        self.ptr = p.value

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": "|u1", "data": (self.ptr, False),
                "strides": None, "version": 3}

    def upload(self, a):
        a = np.ascontiguousarray(a, np.uint8).reshape(-1)
        assert a.nbytes == self.nbytes
        _ok(cu.cuMemcpyHtoD_v2(U64(self.ptr), a.ctypes.data_as(ctypes.c_void_p),
                               ctypes.c_size_t(a.nbytes)), "HtoD")

    def download(self):
        h = np.empty(self.shape, np.uint8)
        _ok(cu.cuMemcpyDtoH_v2(h.ctypes.data_as(ctypes.c_void_p), U64(self.ptr),
                               ctypes.c_size_t(self.nbytes)), "DtoH")
        return h

    def free(self):
        _ok(cu.cuMemFree_v2(U64(self.ptr)), "cuMemFree")


def test_driver_and_queries():
    ok, why = kb.cuda_available()
    assert ok and why == ""
    d = DeviceArray((4096,), dev=1)
    h = np.zeros(16, np.uint8)
    assert kb.mem_query(d) == ("cuda", 1)
    assert kb.mem_query(d.ptr + 100) == ("cuda", 1)
    assert kb.mem_query(h.ctypes.data) == ("host", -1)
    with pytest.raises(kb.InvalidArgument, match="not C-contiguous"):
        class Strided(DeviceArray):
            @property
            def __cuda_array_interface__(self):
                return {"shape": (2, 8), "typestr": "|u1", "data": (self.ptr, False),
                        "strides": (16, 1), "version": 3}
        kb.TransferEngine("127.0.0.1", 0).register(Strided((16,)))
    d.free()


def test_engine_device_to_device_and_errors():
    rng = np.random.default_rng(5)
    src, dst = DeviceArray((1 << 20,)), DeviceArray((1 << 20,))
    data = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    src.upload(data)
    dst.upload(np.zeros(1 << 20, np.uint8))
    with kb.TransferEngine("127.0.0.1", 0) as t, kb.TransferEngine("127.0.0.1", 0) as w:
        t.register(dst)  # length from the interface, kind detected
        w.batch_register([src], [src.nbytes])
        assert w.transfer_sync(t.get_session_id(), src, dst.ptr + 4096, 65536) == 0
        w.batch_transfer_sync(t.get_session_id(), [src.ptr + 65536], [dst], [4096])
        got = dst.download()
        assert (got[4096:4096 + 65536] == data[:65536]).all()
        assert (got[:4096] == data[65536:65536 + 4096]).all()
        assert (got[4096 + 65536:] == 0).all()
        # host memory claimed to be device memory: refused with the reason
        h = np.zeros(4096, np.uint8)
        with pytest.raises(kb.KVBridgeError, match="not CUDA device memory"):
            w.register(h.ctypes.data, h.nbytes, mem_type="cuda")
        with pytest.raises(kb.InvalidArgument, match="mem_type"):
            w.register(h.ctypes.data, h.nbytes, mem_type="gpu")
    src.free()
    dst.free()


def test_connector_device_kv_round_trip():
    """A prefill and a decode manager whose KV pools are device memory
    (KVArgs.kv_data_ptrs holding __cuda_array_interface__ objects, as
    SGLang's tensors), aux on the host; pages arrive byte-exact."""
    layers, pool, item = 4, 16, 512
    rng = np.random.default_rng(11)
    pkv = [DeviceArray((pool * item,)) for _ in range(layers)]
    dkv = [DeviceArray((pool * item,), dev=1) for _ in range(layers)]
    host = [rng.integers(0, 256, pool * item, dtype=np.uint8) for _ in range(layers)]
    for d, h in zip(pkv, host):
        d.upload(h)
    for d in dkv:
        d.upload(np.zeros(pool * item, np.uint8))
    paux, daux = np.arange(8 * 64, dtype=np.uint8).reshape(8, 64), np.zeros((8, 64), np.uint8)

    def args(kv, aux):
        return kb.KVArgs(kv_data_ptrs=kv, kv_data_lens=[pool * item] * layers,
                         kv_item_lens=[item] * layers, aux_data_ptrs=[aux.ctypes.data],
                         aux_data_lens=[aux.nbytes], aux_item_lens=[64], page_size=1,
                         kv_head_num=1, engine_rank=0)

    with kb.KVBootstrapServer("127.0.0.1", 0) as server:
        pm = kb.KVManager(args(pkv, paux), "prefill", server.address)
        dm = kb.KVManager(args(dkv, daux), "decode")
        try:
            src, dst = [3, 4, 5, 9, 10], [0, 7, 8, 1, 15]
            rc = kb.KVReceiver(dm, server.address, 42)
            rc.init(np.asarray(dst, np.int32), aux_index=2)
            s = kb.KVSender(pm, server.address, 42)
            assert poll_until(s, 10, (kb.KVPoll.WaitingForInput,)) == kb.KVPoll.WaitingForInput
            s.init(len(src), aux_index=5)
            s.send(np.asarray(src, np.int32))
            st = poll_until(rc, 20)
            if st != kb.KVPoll.Success:
                rc.failure_exception()
            assert poll_until(s, 20) == kb.KVPoll.Success
            for ll in range(layers):
                got = dkv[ll].download().reshape(pool, item)
                want = host[ll].reshape(pool, item)
                for a, b in zip(src, dst):
                    assert (got[b] == want[a]).all(), (ll, a, b)
                others = [p for p in range(pool) if p not in dst]
                assert (got[others] == 0).all()
            assert (daux[2] == paux[5]).all()
        finally:
            pm.close()
            dm.close()
    for d in pkv + dkv:
        d.free()
