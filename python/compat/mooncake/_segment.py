"""Mooncake 0.3.14's SharedSegment over kvbridge: one kvb_mem_alloc
allocation of the owner rank, mapped by every rank of the host.

Phase one, create(): every rank checks its declaration (name, size,
world_size, owner_rank) and returns a blob; the owner allocates the memory
(kvb_mem_alloc: a sealed memfd, shareable) and puts its export
(kvb_mem_export) in its blob. Phase two, complete(blobs): every rank checks
that all blobs are of this build and declare the same segment, and a
non-owner maps the owner's memory (kvb_mem_import: the file must be the one
the blob names). The mapping is host memory at each rank's own address
(base_addr); register it with an engine like any buffer.
"""

import ctypes
import hashlib
import operator
import struct

from kvbridge import _lib as L

MAGIC = b"KVBSEG01"
VERSION = 1
# magic, version u32, rank u32, has_handle u32, pad u32, declaration digest
# (16 bytes), the owner's kvb_mem_export blob (zeros for the others).
_HEAD = struct.Struct("<8sIIII16s")
BLOB_LEN = _HEAD.size + L.MEM_EXPORT_LEN


def _index(v, name):
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"SharedSegment.create: {name} must be an int") from None


def supported(mmap=True, host_register=False):
    """Host memory shared by mapping (mmap=True) only: kvbridge has no
    device-side registration of it (host_register) and no VMM segments."""
    return bool(mmap) and not bool(host_register)


class SharedSegment:
    """A segment of host memory shared by the ranks of one host."""

    def __init__(self, *a, **k):
        raise TypeError("mooncake.engine.SharedSegment: No constructor defined!")

    @staticmethod
    def supported(mmap=True, host_register=False):
        return supported(mmap, host_register)

    @staticmethod
    def create(name, size, world_size, rank_id, owner_rank=0, device_id=0, mmap=True,
               host_register=False):
        """Phase one: (segment, this rank's blob). ValueError / RuntimeError
        with Mooncake's texts for a declaration it refuses."""
        if not isinstance(name, str):
            raise TypeError("SharedSegment.create: name must be a str")
        size, world = _index(size, "size"), _index(world_size, "world_size")
        rank, owner = _index(rank_id, "rank_id"), _index(owner_rank, "owner_rank")
        _index(device_id, "device_id")
        if world == 0:
            raise ValueError("Shared segment world_size must not be zero")
        if not (0 <= rank < world and 0 <= owner < world):
            raise ValueError("Shared segment rank_id and owner_rank must be below world_size")
        if host_register and not mmap:
            raise ValueError("Shared segment host_register requires mmap=true")
        if host_register:
            raise RuntimeError("Shared segment host_register is not provided by kvbridge: "
                               "its segment is host memory only (SharedSegment.supported "
                               "says so)")
        if not mmap:
            raise RuntimeError("This build has no VMM backend for shared segments")
        if size <= 0 or size > 1 << 50:
            raise ValueError(f"Shared segment size must be in (0, 2**50], got {size}")
        seg = object.__new__(SharedSegment)
        seg._size, seg._world, seg._rank, seg._owner = size, world, rank, owner
        seg._digest = hashlib.sha256(f"{name}\0{size}\0{world}\0{owner}".encode()).digest()[:16]
        seg._base, seg._own, seg._imported = 0, False, False
        export = bytes(L.MEM_EXPORT_LEN)
        if rank == owner:
            p = ctypes.c_void_p()
            st = L.lib().kvb_mem_alloc(size, ctypes.byref(p))
            if st != L.KVB_OK:
                raise RuntimeError(f"Shared segment: kvb_mem_alloc({size}) failed: "
                                   f"{L.status_string(st)}")
            seg._base, seg._own = p.value, True
            buf = ctypes.create_string_buffer(L.MEM_EXPORT_LEN)
            st = L.lib().kvb_mem_export(seg._base, buf)
            if st != L.KVB_OK:
                seg._free()
                raise RuntimeError(f"Shared segment: export failed: {L.status_string(st)}")
            export = buf.raw
        head = _HEAD.pack(MAGIC, VERSION, rank, int(rank == owner), 0, seg._digest)
        return seg, head + export

    def complete(self, blobs):
        """Phase two: blobs[i] is rank i's blob. ValueError with Mooncake's
        texts for a blob that does not match; RuntimeError when the owner's
        memory cannot be mapped (another host, another user, a gone owner)."""
        blobs = list(blobs)
        if len(blobs) != self._world:
            raise ValueError(f"Shared segment expects one blob per rank, got {len(blobs)}")
        for i, b in enumerate(blobs):
            b = bytes(b)
            if len(b) != BLOB_LEN:
                raise ValueError("Shared segment blob has an unexpected length")
            magic, ver, rank, has, _, digest = _HEAD.unpack_from(b)
            if magic != MAGIC:
                raise ValueError("Shared segment blob magic mismatch")
            if ver != VERSION:
                raise ValueError("Shared segment blob version mismatch, peers run different "
                                 "builds")
            if rank != i or digest != self._digest:
                raise ValueError(f"Shared segment declaration of rank {i} differs from the "
                                 "local one")
            if i == self._owner and not has:
                raise ValueError("Shared segment owner rank did not export a handle")
        if self._own or self._imported:
            return
        p, n = ctypes.c_void_p(), ctypes.c_size_t()
        st = L.lib().kvb_mem_import(bytes(blobs[self._owner])[_HEAD.size:], ctypes.byref(p),
                                    ctypes.byref(n))
        if st != L.KVB_OK or n.value < self._size:
            raise RuntimeError("Shared segment: the owner's memory cannot be mapped here "
                               f"({L.status_string(st)}: another host or user, or the owner "
                               "is gone)")
        self._base, self._imported = p.value, True

    def ready(self):
        return self._own or self._imported

    def base_addr(self):
        """Host address of the mapping in this process (0 before complete on
        a non-owner rank)."""
        return self._base or 0

    def device_addr(self):
        """0: kvbridge's segment is not registered with a device."""
        return 0

    def size(self):
        return self._size

    def _free(self):
        base, self._base = self._base, 0
        if base and self._own:
            L.lib().kvb_mem_free(base)
        elif base and self._imported:
            L.lib().kvb_mem_unimport(base)
        self._own = self._imported = False

    def __del__(self):
        try:
            self._free()
        except Exception:
            pass
