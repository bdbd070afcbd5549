"""SGLang 0.5.23's own KV checksum (--disaggregation-enable-kv-checksum) in
the interop suite (sglang_pd.py's ck_ cases), run by SGLang's own code
where it can run on a CPU.

Where SGLang computes it: not in the connector (which only moves one more
aux buffer, MetadataBuffers.kv_checksum, [N, 8] uint64, appended after the
bootstrap_room buffer) but in the schedulers: the prefill's send_kv_chunk
(prefill.py) digests the request's pages past the decode's prefix before
the last chunk and writes (digest, layout signature) into the request's
row; the decode's _verify_kv_checksums (decode.py) recomputes it over its
own pages when the request enters a batch, after _kv_checksum_comparable
accepted the signature, and drops the request on a mismatch.

Run unmodified here: SchedulerDisaggregationPrefillMixin.send_kv_chunk,
SchedulerDisaggregationDecodeMixin._verify_kv_checksums,
DecodeTransferQueue._kv_checksum_comparable, page_indices_for_request,
state_indices_for_request, kv_layout_signature, MetadataBuffers'
set_kv_checksum / get_kv_checksum, all_reduce_flags (over a real gloo
group of one rank), on fake schedulers holding only the attributes those
functions read (an unknown one raises AttributeError).

Stubbed (no GPU): SGLang's CUDA kernel adler32_strided_checksum, replaced by
adler32_items below (zlib's Adler-32 over the same items in the kernel's
order: the kernel reduces per-item (A, B, len) states with Adler-32's own
combine, so its result is the serial Adler-32 of the concatenation), and
the CUDA asserts of KvChecksumComputer.compute (CpuKvChecksumComputer,
otherwise the same body). The decode's mismatch handler, which aborts the
request towards the client, records the message instead; the prefill's
_send_kv_chunk (the connector call after the digest) is the harness's.
"""

import ctypes
import logging
import random
import socket
import types
import zlib


def adler32_items(data_ptrs, strides, indices):
    """adler32_strided_checksum on the CPU: for each tensor in order, its
    items idx * stride + base in index order, one Adler-32 over them all
    (1 when there is nothing, as the kernel answers)."""
    a = zlib.adler32(b"")
    for base, idx, stride in zip(data_ptrs, indices, strides):
        for i in idx.reshape(-1).tolist():
            a = zlib.adler32(ctypes.string_at(base + int(i) * stride, stride), a)
    return a


def _computer_class():
    from sglang.srt.disaggregation.checksum import KvChecksumComputer

    class CpuKvChecksumComputer(KvChecksumComputer):
        """KvChecksumComputer.compute without its is_cuda asserts, over the
        CPU kernel stand-in."""

        def compute(self, kv_page_indices_gpu, state_indices_gpu=None):
            assert kv_page_indices_gpu.is_contiguous()
            all_ptrs = list(self._kv_data_ptrs)
            all_lens = list(self._kv_item_lens)
            all_indices = [kv_page_indices_gpu] * len(self._kv_data_ptrs)
            if self._state_data_ptrs:
                assert state_indices_gpu is not None
                all_ptrs += self._state_data_ptrs
                all_lens += self._state_item_lens
                all_indices += [state_indices_gpu] * len(self._state_data_ptrs)
            return adler32_items(all_ptrs, all_lens, all_indices)

    return CpuKvChecksumComputer


class Fake(types.SimpleNamespace):
    """A scheduler or request holding only what SGLang's code reads."""

    def __getattr__(self, name):
        raise AttributeError(f"sglang_checksum fake has no {name!r}: add it")


def checksum_tensor(slots):
    """SGLang's MetadataBuffers.kv_checksum: [N, 8] uint64 on the CPU."""
    import torch

    return torch.zeros((slots, 8), dtype=torch.uint64)


class _Meta:
    """MetadataBuffers' checksum methods over one tensor (the rest of its
    buffers are not what this suite moves)."""

    def __init__(self, t):
        from sglang.srt.disaggregation.utils import MetadataBuffers

        self.kv_checksum = t
        self._mb = MetadataBuffers

    def set_kv_checksum(self, req, digest, signature):
        self._mb.set_kv_checksum(self, req, digest, signature)

    def get_kv_checksum(self, idx):
        return self._mb.get_kv_checksum(self, idx)


def layout_signature(kv_args):
    """kv_layout_signature of a KVArgs-like object (SGLang's own function)."""
    from sglang.srt.disaggregation.utils import kv_layout_signature

    return kv_layout_signature(kv_args)


def _pool(pages, page_size):
    """req_to_token row of one request whose pages are `pages`, and an
    allocator of page_size (token locations page * page_size + t)."""
    import torch

    row = [p * page_size + t for p in pages for t in range(page_size)]
    return (Fake(req_to_token=torch.tensor([row], dtype=torch.int32)),
            Fake(page_size=page_size, get_kvcache=lambda: Fake(kind="plain MHA pool")))


def prefill_send(kv_ptrs, kv_item_lens, pages, page_size, signature, ck, slot, room, send):
    """SGLang's send_kv_chunk(last_chunk=True): digest the request's pages,
    fill its checksum row (slot) in ck, then send(req) as _send_kv_chunk.
    Returns (digest, signature) as written."""
    from sglang.srt.disaggregation.prefill import SchedulerDisaggregationPrefillMixin

    r2t, alloc = _pool(pages, page_size)
    meta = _Meta(ck)
    fake = Fake(kv_checksum_computer=_computer_class()("cpu", kv_ptrs, kv_item_lens),
                req_to_token_pool=r2t, token_to_kv_pool_allocator=alloc,
                disagg_prefill_bootstrap_queue=Fake(kv_checksum_signature=signature),
                disagg_metadata_buffers=meta,
                _send_kv_chunk=lambda req, last_chunk=False, end_idx=None: send(req))
    req = Fake(rid=f"interop-{room}", disagg_decode_prefix_len=0, kv=Fake(req_pool_idx=0),
               metadata_buffer_index=slot)
    SchedulerDisaggregationPrefillMixin.send_kv_chunk(fake, req, last_chunk=True,
                                                      end_idx=len(pages) * page_size)
    return meta.get_kv_checksum(slot)


def _gloo_group():
    import torch.distributed as dist

    if not dist.is_initialized():
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1)
    return dist.group.WORLD


def decode_verify(kv_manager, kv_ptrs, kv_item_lens, pages, page_size, signature, ck, slot,
                  room, boot):
    """What SGLang's decode does with the row once the transfer succeeded:
    _commit_transfer_to_req's read (get_kv_checksum, _kv_checksum_comparable)
    and _verify_kv_checksums over this decode's pages. Returns
    {"compared": bool, "verified": bool, "mismatch": SGLang's message or "",
    "logged": SGLang's log lines about it}."""
    from sglang.srt.disaggregation import decode as sd

    logs = []

    class Grab(logging.Handler):
        def emit(self, rec):
            if "checksum" in rec.getMessage():
                logs.append(rec.getMessage())

    sd.logger.addHandler(Grab())
    meta = _Meta(ck)
    queue = Fake(scheduler=Fake(disagg_decode_prealloc_queue=Fake(kv_checksum_signature=signature)),
                 _skipped_checksum_signatures=set())
    digest, sig = meta.get_kv_checksum(slot)
    expected = digest if sd.DecodeTransferQueue._kv_checksum_comparable(queue, sig) else 0
    host, port = boot.rsplit(":", 1)
    req = Fake(rid=f"interop-{room}", bootstrap_room=room, expected_kv_checksum=expected,
               origin_input_ids=[0] * (len(pages) * page_size), bootstrap_host=host,
               bootstrap_port=int(port), kv=Fake(req_pool_idx=0, cache_protected_len=0))
    r2t, alloc = _pool(pages, page_size)
    mismatches, kept = [], []
    fake = Fake(kv_checksum_computer=_computer_class()("cpu", kv_ptrs, kv_item_lens),
                disagg_decode_prealloc_queue=Fake(kv_manager=kv_manager,
                                                  kv_checksum_mismatch_injector=random.Random(0)),
                req_to_token_pool=r2t, token_to_kv_pool_allocator=alloc,
                attn_tp_cpu_group=_gloo_group(),
                _handle_kv_checksum_mismatch=lambda r, msg: mismatches.append(msg))
    batch = Fake(reqs=[req], filter_batch=lambda keep_indices: kept.append(keep_indices))
    sd.SchedulerDisaggregationDecodeMixin._verify_kv_checksums(fake, batch)
    # SGLang clears expected_kv_checksum once it compared ("verified once").
    compared = expected != 0 and req.expected_kv_checksum == 0
    return {"compared": compared, "verified": compared and not mismatches,
            "mismatch": mismatches[0] if mismatches else "", "dropped": kept == [[]],
            "logged": logs}
