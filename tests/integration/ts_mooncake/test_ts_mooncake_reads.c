/* Review 3 F5: TokenSpeed's C ABI has no read call, so an engine made by
 * ts_mooncake_create serves no one-sided reads unless KVBRIDGE_SERVE_READS=1:
 * a plain kvbridge engine's read of a ts_mooncake_register'ed range is
 * refused (KVB_ERR_UNSUPPORTED, "serves no reads", not a byte read) by
 * default and with KVBRIDGE_SERVE_READS=0 or a value other than 1, and
 * served exactly with KVBRIDGE_SERVE_READS=1. Each over tcp (MC_FORCE_TCP)
 * and the default transport (the message lane over UCX on this host);
 * writes into the ts_mooncake engine are taken either way. */
#include <kvbridge/engine.h>
#include <kvbridge/ts_mooncake.h>

#include "kvb_test.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEN (1u << 20)

static uint8_t kv[LEN], got[LEN];

static bool all(const uint8_t *p, size_t n, uint8_t v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return false;
    return true;
}

/* One ts_mooncake engine created under the current environment, read from
 * (and written to) by a plain engine of transport tr: the read's status. */
static kvb_status_t read_from_ts(kvb_transport_t tr)
{
    memset(kv, 0x5a, sizeof(kv));
    memset(got, 0, sizeof(got));
    ts_mooncake_engine_t *ts = ts_mooncake_create("127.0.0.1", "P2PHANDSHAKE", "rdma", "");
    CHECK(ts != NULL);
    CHECK_EQ(ts_mooncake_register(ts, kv, sizeof(kv)), 0);
    char sid[64];
    snprintf(sid, sizeof(sid), "127.0.0.1:%d", ts_mooncake_rpc_port(ts));
    kvb_engine_h rd;
    kvb_engine_params_t p = {.field_mask = KVB_ENGINE_PARAM_TRANSPORT, .transport = tr};
    CHECK_EQ(kvb_engine_create(&p, &rd), KVB_OK);
    CHECK_EQ(kvb_engine_register(rd, got, sizeof(got), KVB_MEM_HOST), KVB_OK);
    kvb_block_t b = {(uint64_t)(uintptr_t)kv, (uint64_t)(uintptr_t)got, LEN};
    kvb_status_t st = kvb_engine_read(rd, sid, &b, 1, 10.0);
    if (st == KVB_OK)
        CHECK(all(got, LEN, 0x5a));
    else {
        CHECK_STR_CONTAINS(kvb_engine_last_error(rd), "serves no reads");
        CHECK(all(got, LEN, 0));
    }
    /* writes into it are taken whatever the reads do */
    memset(got, 0x33, 4096);
    kvb_block_t w = {(uint64_t)(uintptr_t)got, (uint64_t)(uintptr_t)kv + 8192, 4096};
    CHECK_EQ(kvb_engine_write(rd, sid, &w, 1, 10.0), KVB_OK);
    CHECK(all(kv + 8192, 4096, 0x33) && all(kv, 8192, 0x5a));
    kvb_engine_destroy(rd);
    CHECK_EQ(ts_mooncake_unregister(ts, kv), 0);
    ts_mooncake_destroy(ts);
    return st;
}

int main(void)
{
    for (int tcp = 1; tcp >= 0; tcp--) {
        kvb_transport_t tr = tcp ? KVB_TRANSPORT_TCP : KVB_TRANSPORT_AUTO;
        if (tcp)
            setenv("MC_FORCE_TCP", "1", 1);
        else
            unsetenv("MC_FORCE_TCP");
        unsetenv("KVBRIDGE_SERVE_READS");
        CHECK_EQ(read_from_ts(tr), KVB_ERR_UNSUPPORTED);
        setenv("KVBRIDGE_SERVE_READS", "0", 1);
        CHECK_EQ(read_from_ts(tr), KVB_ERR_UNSUPPORTED);
        setenv("KVBRIDGE_SERVE_READS", "yes", 1);
        CHECK_EQ(read_from_ts(tr), KVB_ERR_UNSUPPORTED);
        setenv("KVBRIDGE_SERVE_READS", "1", 1);
        CHECK_EQ(read_from_ts(tr), KVB_OK);
        unsetenv("KVBRIDGE_SERVE_READS");
        fprintf(stderr,
                "ok: %s: a read from a ts_mooncake engine refused by default, with "
                "KVBRIDGE_SERVE_READS=0 and =yes; served exactly with =1; writes taken\n",
                tcp ? "tcp" : "auto");
    }
    return 0;
}
