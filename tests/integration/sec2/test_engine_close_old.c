/* Review finding 1.5: kvb_engine_close_session failed only the session's
 * current connection. A transfer keeps the connection it was issued on; once
 * the session moved to a new one (the peer registered more memory: notice,
 * re-handshake), a transfer to a stalled peer on the old connection never
 * ended, and neither did the connector's worker waiting for it. The stalled
 * peer is the internal test hook kvb__test_hooks.target_drop_writes (the
 * target drops write messages unanswered, as a SIGSTOPped process whose
 * kernel still holds the TCP connection open). */
#include "engine/engine_int.h"
#include "kvb_test.h"

#include <stdlib.h>

int main(void)
{
    kvb_engine_params_t prm = {0};
    kvb_engine_h a = NULL, b = NULL;
    static uint8_t src[8192], dst[8192], more[8192];
    prm.field_mask = KVB_ENGINE_PARAM_COPY_THREADS | KVB_ENGINE_PARAM_PEER_TIMEOUT;
    prm.copy_threads = 0; /* the message lane */
    prm.peer_timeout_s = 1.0;
    CHECK_EQ(kvb_engine_create(&prm, &a), KVB_OK);
    CHECK_EQ(kvb_engine_create(&prm, &b), KVB_OK);
    CHECK_EQ(kvb_engine_register(a, src, sizeof(src), KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_register(b, dst, sizeof(dst), KVB_MEM_HOST), KVB_OK);
    const char *sid = kvb_engine_session_id(b);
    kvb_block_t blk = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)dst, 4096};
    CHECK_EQ(kvb_engine_write(a, sid, &blk, 1, 5.0), KVB_OK); /* conn 1 */
    KVB__HOOK_SET(target_drop_writes, 1);
    kvb_xfer_h old = NULL;
    CHECK_EQ(kvb_engine_write_async(a, sid, &blk, 1, &old), KVB_OK); /* stuck on conn 1 */
    /* The peer registers more: a write into the new region re-handshakes
     * (bounds retry) and the session moves to conn 2. */
    CHECK_EQ(kvb_engine_register(b, more, sizeof(more), KVB_MEM_HOST), KVB_OK);
    kvb_block_t blk2 = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)more, 4096};
    kvb_xfer_h cur = NULL;
    CHECK_EQ(kvb_engine_write_async(a, sid, &blk2, 1, &cur), KVB_OK);
    CHECK(old->conn != cur->conn);
    CHECK_EQ(kvb_xfer_test(old), KVB_ERR_INPROGRESS);
    double t0 = kvb_test_now_s();
    CHECK_EQ(kvb_engine_close_session(a, sid), KVB_OK);
    kvb_status_t so = kvb_xfer_wait(old, 3.0), sc = kvb_xfer_wait(cur, 3.0);
    double took = kvb_test_now_s() - t0;
    fprintf(stderr, "after close_session: old conn's transfer %s, current %s, %.3f s\n",
            kvb_status_string(so), kvb_status_string(sc), took);
    CHECK_EQ(sc, KVB_ERR_PEER);
    CHECK_EQ(so, KVB_ERR_PEER);
    CHECK(took < 1.0);
    kvb_xfer_free(old);
    kvb_xfer_free(cur);
    KVB__HOOK_SET(target_drop_writes, 0);
    memset(src, 0x21, sizeof(src));
    CHECK_EQ(kvb_engine_write(a, sid, &blk, 1, 5.0), KVB_OK); /* re-handshakes */
    CHECK_EQ(dst[0], 0x21);
    kvb_engine_destroy(a);
    kvb_engine_destroy(b);
    TEST_PASS("test_engine_close_old");
    return 0;
}
