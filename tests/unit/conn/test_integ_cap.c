/* The decode's "kv_digest=" registration extension (docs/integrity.md
 * "Wire", docs/protocol-frames.md): what a decode with integrity check
 * sends (kv_digest=2; nothing with it off), what a prefill reads from a
 * registration (absent: 0, version 1 only; a version; malformed values
 * refused with the reason, as kv_layout='s are). */
#include "dialect/sglang2025/sglang.h"
#include "kvb_test.h"

#include <string.h>

static struct kvb_manager m; /* only p.integrity is read */

static void parsed(const char *v, bool ok, uint32_t want)
{
    kvb__frame_t ext[2] = {{(const uint8_t *)"kv_layout=4,nhd", 15},
                           {(const uint8_t *)v, strlen(v)}};
    kvb__reg_in_t in;
    kvb__frames_err_t e;
    memset(&in, 0, sizeof(in));
    memset(&e, 0, sizeof(e));
    in.digest_max = 77;
    CHECK_EQ(kvb__sglang_kv_digest(ext, 2, &in, &e), ok);
    if (ok)
        CHECK_EQ(in.digest_max, want);
    else
        CHECK_STR_CONTAINS(e.reason, "extension kv_digest is not a version");
}

int main(void)
{
    kvb__frame_t f;
    m.p.integrity = 0;
    CHECK(!kvb__sglang_kv_digest_ext(&m, &f)); /* off: not sent */
    m.p.integrity = 1;
    CHECK(kvb__sglang_kv_digest_ext(&m, &f));
    CHECK(f.len == 11 && memcmp(f.data, "kv_digest=2", 11) == 0);
    parsed("kv_digest=2", true, 2);
    parsed("kv_digest=1", true, 1);
    parsed("kv_digest=7", true, 7); /* a later decode: the prefill sends at most 2 */
    parsed("kv_lens=", true, 0);    /* absent: version 1 only */
    parsed("kv_digest=", false, 0);
    parsed("kv_digest=0", false, 0);
    parsed("kv_digest=02", false, 0);
    parsed("kv_digest=x", false, 0);
    parsed("kv_digest=4294967296", false, 0);
    TEST_PASS("kv_digest= registration extension: sent with integrity check only, read, "
              "malformed values refused");
    return 0;
}
