/* Issue 25: local-only registrations (Mooncake's remote_accessible=False)
 * and kvb_xfer_drained (what the drop-in's scatter tickets report).
 *
 * 1. A local-only region is a write source like any other, but peers never
 *    see it: a write into a target's local-only region fails KVB_ERR_BOUNDS
 *    and leaves it untouched; overlaps either way are refused; device
 *    memory is refused; after unregister it is no source any more.
 * 2. Drained: a successful write is drained; a cancelled one to a live peer
 *    is drained (its messages were acknowledged or never sent); a write to
 *    a SIGSTOPped peer whose session is then closed ends KVB_ERR_PEER with
 *    messages still unacknowledged: not drained (those bytes may yet land
 *    when the peer resumes), and the timings show the stop covered it; a
 *    read given up the same way is drained (its answers are dropped). */
#include "kvb_test.h"
#include "kvb_test_engine.h"
#include "peer.h"

#include <kvbridge/engine.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define PEER_BYTES (64u << 20) /* the first half is registered at start */
#define LEN (4u << 20)

static kvb_status_t reg_ex(kvb_engine_h e, void *addr, size_t len, kvb_mem_type_t t, int local)
{
    kvb_mem_region_ex_t r = {0};
    r.field_mask = KVB_MEM_REGION_FIELD_LOCAL_ONLY;
    r.addr = addr;
    r.length = len;
    r.mem_type = t;
    r.local_only = local;
    return kvb_engine_register_ex(e, &r, 1, sizeof(r));
}

static void local_only_regions(void)
{
    kvb_engine_h w = kvb_test_engine(KVB_TRANSPORT_AUTO, 0);
    kvb_test_end_t t = kvb_test_end(kvb_test_engine(KVB_TRANSPORT_AUTO, 0), 2 * LEN, 0x00, false);
    uint8_t *src = malloc(2 * LEN), *tgt_private = malloc(LEN);
    CHECK(src != NULL && tgt_private != NULL);
    memset(src, 0x5a, 2 * LEN);
    memset(tgt_private, 0x11, LEN);
    const char *sid = kvb_engine_session_id(t.eng);

    /* Source registered local-only: the write works, exact bytes. */
    CHECK_EQ(reg_ex(w, src, LEN, KVB_MEM_HOST, 1), KVB_OK);
    kvb_block_t b = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)t.buf, LEN};
    CHECK_EQ(kvb_engine_write(w, sid, &b, 1, 10), KVB_OK);
    CHECK(kvb_test_all(t.buf, LEN, 0x5a));
    CHECK(kvb_test_all(t.buf + LEN, LEN, 0x00));

    /* The target's local-only region is not in the table it sends. */
    CHECK_EQ(reg_ex(t.eng, tgt_private, LEN, KVB_MEM_HOST, 1), KVB_OK);
    b.dst = (uint64_t)(uintptr_t)tgt_private;
    CHECK_EQ(kvb_engine_write(w, sid, &b, 1, 10), KVB_ERR_BOUNDS);
    CHECK(strstr(kvb_engine_last_error(w), "not inside a region the peer registered") != NULL);
    CHECK(kvb_test_all(tgt_private, LEN, 0x11));

    /* Overlaps either way; device memory; the flag unset registers normally. */
    CHECK_EQ(kvb_engine_register(w, src + LEN / 2, LEN, KVB_MEM_HOST), KVB_ERR_OVERLAP);
    CHECK_EQ(reg_ex(w, src + LEN, LEN, KVB_MEM_HOST, 0), KVB_OK);
    CHECK_EQ(reg_ex(w, src + LEN + 4096, 4096, KVB_MEM_HOST, 1), KVB_ERR_OVERLAP);
    CHECK_EQ(reg_ex(w, src + LEN - 4096, 8192, KVB_MEM_HOST, 1), KVB_ERR_OVERLAP);
    CHECK_EQ(reg_ex(w, tgt_private, 4096, KVB_MEM_CUDA, 1), KVB_ERR_INVALID);
    CHECK(strstr(kvb_engine_last_error(w), "must be host memory") != NULL);

    /* Unregistered: no source any more. */
    CHECK_EQ(kvb_engine_unregister(w, src), KVB_OK);
    b.dst = (uint64_t)(uintptr_t)t.buf;
    CHECK_EQ(kvb_engine_write(w, sid, &b, 1, 10), KVB_ERR_BOUNDS);
    CHECK(strstr(kvb_engine_last_error(w), "local source") != NULL);
    CHECK_EQ(kvb_engine_unregister(w, src), KVB_ERR_NOT_FOUND);
    CHECK_EQ(kvb_engine_unregister(t.eng, tgt_private), KVB_OK);

    kvb_engine_destroy(w);
    kvb_test_end_free(&t);
    free(src);
    free(tgt_private);
    TEST_PASS("local-only regions: a source, never a destination peers see");
}

/* Review 3 F6: same-host peers of the direct lane map a kvb_mem_alloc file
 * whole, read-write, once any part of it is registered for peers; so a
 * local-only region may not share such a file with a normal registration,
 * in either order (KVB_ERR_INVALID naming why), while both kinds still go
 * into separate allocations. Checked with a same-host writer whose direct
 * lane maps the target's file: after the refusals it still writes the
 * advertised part exactly, and a write into the refused part fails. */
static void local_only_in_shared_file(void)
{
    const size_t len = 2u << 20, half = len / 2;
    kvb_engine_h t = kvb_test_engine(KVB_TRANSPORT_AUTO, 2),
                 w = kvb_test_engine(KVB_TRANSPORT_AUTO, 2);
    uint8_t *a, *b, *c, *src = malloc(half);
    CHECK(src != NULL);
    memset(src, 0x5a, half);
    CHECK_EQ(kvb_engine_register(w, src, half, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_mem_alloc(len, (void **)&a), KVB_OK);
    CHECK_EQ(kvb_mem_alloc(len, (void **)&b), KVB_OK);
    CHECK_EQ(kvb_mem_alloc(len, (void **)&c), KVB_OK);

    /* normal first, then local-only in the same file: refused */
    CHECK_EQ(kvb_engine_register(t, a, half, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(reg_ex(t, a + half, 4096, KVB_MEM_HOST, 1), KVB_ERR_INVALID);
    CHECK_STR_CONTAINS(kvb_engine_last_error(t), "kvb_mem_alloc");
    CHECK_STR_CONTAINS(kvb_engine_last_error(t), "map that whole file");
    CHECK_EQ(reg_ex(t, a + len - 4096, 4096, KVB_MEM_HOST, 1), KVB_ERR_INVALID);
    /* local-only first, then a normal registration in the same file: refused */
    CHECK_EQ(reg_ex(t, b + half, 4096, KVB_MEM_HOST, 1), KVB_OK);
    CHECK_EQ(kvb_engine_register(t, b, half, KVB_MEM_HOST), KVB_ERR_INVALID);
    CHECK_STR_CONTAINS(kvb_engine_last_error(t), "local-only");
    CHECK_STR_CONTAINS(kvb_engine_last_error(t), "map that whole file");
    /* a batch with both in one file: refused whole */
    kvb_mem_region_ex_t both[2] = {
        {KVB_MEM_REGION_FIELD_LOCAL_ONLY, c, 4096, KVB_MEM_HOST, -1, 1},
        {KVB_MEM_REGION_FIELD_LOCAL_ONLY, c + half, half, KVB_MEM_HOST, -1, 0}};
    CHECK_EQ(kvb_engine_register_ex(t, both, 2, sizeof(both[0])), KVB_ERR_INVALID);
    /* local-only in a file of its own beside an advertised one: fine */
    CHECK_EQ(reg_ex(t, c, 4096, KVB_MEM_HOST, 1), KVB_OK);

    const char *sid = kvb_engine_session_id(t);
    kvb_block_t blk = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)a, half};
    CHECK_EQ(kvb_engine_write(w, sid, &blk, 1, 10), KVB_OK);
    CHECK(kvb_test_all(a, half, 0x5a) && kvb_test_all(a + half, half, 0));
    CHECK_EQ(kvb_engine_session_direct(w, sid), 1);
    blk.dst = (uint64_t)(uintptr_t)b;
    CHECK_EQ(kvb_engine_write(w, sid, &blk, 1, 10), KVB_ERR_BOUNDS);
    CHECK(kvb_test_all(b, len, 0));

    /* once the local-only region is gone the file may be registered */
    CHECK_EQ(kvb_engine_unregister(t, b + half), KVB_OK);
    CHECK_EQ(kvb_engine_register(t, b, half, KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_unregister(t, b), KVB_OK);
    CHECK_EQ(kvb_engine_unregister(t, a), KVB_OK);
    CHECK_EQ(kvb_engine_unregister(t, c), KVB_OK);
    kvb_engine_destroy(w);
    kvb_engine_destroy(t);
    CHECK_EQ(kvb_mem_free(a), KVB_OK);
    CHECK_EQ(kvb_mem_free(b), KVB_OK);
    CHECK_EQ(kvb_mem_free(c), KVB_OK);
    free(src);
    TEST_PASS("local-only regions never share a kvb_mem_alloc file with an advertised one");
}

static kvb_xfer_h start(kvb_engine_h w, const test_peer_t *p, const uint8_t *src, size_t len)
{
    kvb_block_t b = {(uint64_t)(uintptr_t)src, p->remote_base, len};
    kvb_xfer_h x;
    CHECK_EQ(kvb_engine_write_async(w, p->sid, &b, 1, &x), KVB_OK);
    return x;
}

static void drained(const char *self)
{
    test_peer_t p = {0};
    CHECK_EQ(test_peer_start(&p, self, "tcp", 0, PEER_BYTES, 0), 0);
    kvb_engine_h w = kvb_test_engine(KVB_TRANSPORT_TCP, 0);
    size_t len = PEER_BYTES / 2;
    uint8_t *src = malloc(len);
    CHECK(src != NULL);
    memset(src, 0x77, len);
    CHECK_EQ(kvb_engine_register(w, src, len, KVB_MEM_HOST), KVB_OK);

    kvb_xfer_h x = start(w, &p, src, LEN);
    CHECK_EQ(kvb_xfer_wait(x, 30), KVB_OK);
    CHECK_EQ(kvb_xfer_drained(x), 1);
    kvb_xfer_free(x);
    CHECK(kvb_test_all(p.buf, LEN, 0x77));

    /* Cancelled at once, peer alive: either it finished first or the
     * cancel settled; drained both ways. */
    x = start(w, &p, src, len);
    CHECK_EQ(kvb_xfer_cancel(x), KVB_OK);
    kvb_status_t st = kvb_xfer_wait(x, 30);
    fprintf(stderr, "cancelled write: %s, drained %d\n", kvb_status_string(st),
            kvb_xfer_drained(x));
    CHECK(st == KVB_OK || st == KVB_ERR_CANCELED);
    CHECK_EQ(kvb_xfer_drained(x), 1);
    kvb_xfer_free(x);

    /* Peer stopped: the message window fills and stays unacknowledged; a
     * read on the same connection waits for answers that do not come. */
    CHECK_EQ(kill(p.pid, SIGSTOP), 0);
    double t0 = kvb_test_now_s();
    x = start(w, &p, src, len);
    kvb_xfer_h y;
    kvb_block_t rb = {p.remote_base, (uint64_t)(uintptr_t)src, len};
    CHECK_EQ(kvb_engine_read_async(w, p.sid, &rb, 1, &y), KVB_OK);
    CHECK_EQ(kvb_xfer_wait(x, 0.5), KVB_ERR_TIMEOUT);
    CHECK_EQ(kvb_xfer_wait(y, 0.01), KVB_ERR_TIMEOUT);
    CHECK(kvb_xfer_drained(x) == 0 && kvb_xfer_drained(y) == 0); /* still running */
    CHECK_EQ(kvb_engine_close_session(w, p.sid), KVB_OK);
    st = kvb_xfer_wait(x, 10);
    kvb_status_t rst = kvb_xfer_wait(y, 10);
    double t1 = kvb_test_now_s();
    fprintf(stderr,
            "stopped peer: SIGSTOP at 0, write and read started 0, session closed at "
            "%.3f s, write ended %s, read ended %s at %.3f s (%s), drained %d / %d\n",
            0.5, kvb_status_string(st), kvb_status_string(rst), t1 - t0, kvb_xfer_error(x),
            kvb_xfer_drained(x), kvb_xfer_drained(y));
    CHECK_EQ(st, KVB_ERR_PEER);
    CHECK_EQ(rst, KVB_ERR_PEER);
    CHECK_EQ(kvb_xfer_drained(x), 0); /* its messages may be placed when the peer resumes */
    CHECK_EQ(kvb_xfer_drained(y), 1); /* its answers are dropped: nothing lands here */
    kvb_xfer_free(x);
    kvb_xfer_free(y);
    CHECK_EQ(kill(p.pid, SIGCONT), 0);

    kvb_engine_destroy(w);
    test_peer_stop(&p);
    free(src);
    TEST_PASS("drained: success and settled cancel yes, abandoned messages to a stopped peer no, "
              "an abandoned read yes");
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--target") == 0)
        return test_peer_main(argc, argv);
    local_only_regions();
    local_only_in_shared_file();
    drained(argv[0]);
    return 0;
}
