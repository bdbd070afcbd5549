#include "core/core.h"
#include "kvb_test.h"

#include <stdlib.h>

static char g_last[1024];
static int g_count;
static void sink(kvb_log_level_t level, const char *line, void *arg)
{
    (void)level;
    (void)arg;
    snprintf(g_last, sizeof(g_last), "%s", line);
    g_count++;
}

static void test_status(void)
{
    CHECK_EQ(KVB_OK, 0);
    CHECK(strcmp(kvb_status_string(KVB_OK), "ok") == 0);
    CHECK(strcmp(kvb_status_string(KVB_ERR_BOUNDS), "out of bounds") == 0);
    CHECK(strcmp(kvb_status_string((kvb_status_t)-999), "unknown status") == 0);
    for (int s = KVB_ERR_BUSY; s < 0; s++)
        CHECK(strcmp(kvb_status_string((kvb_status_t)s), "unknown status") != 0);
    CHECK(strcmp(kvb_version(), KVB_VERSION_STRING) == 0);
}

static void test_log(void)
{
    kvb_log_set_handler(sink, NULL);
    kvb_log_set_level(KVB_LOG_WARN);
    kvb__log(KVB_LOG_INFO, "hidden %d", 1);
    CHECK_EQ(g_count, 0);
    kvb__log(KVB_LOG_WARN, "shown %d", 2);
    CHECK_EQ(g_count, 1);
    CHECK(strcmp(g_last, "shown 2") == 0);
    kvb_log_set_level(KVB_LOG_DEBUG);
    KVB_LOGD("dbg");
    CHECK_EQ(g_count, 2);
    kvb_log_set_handler(NULL, NULL);
    kvb_log_set_level(KVB_LOG_ERROR);
}

static void test_err(void)
{
    kvb__err_t e;
    kvb__err_init(&e);
    CHECK(strcmp(kvb__err_get(&e), "") == 0);
    CHECK_EQ(kvb__err_set(&e, KVB_ERR_PEER, "peer %s gone", "a:1"), KVB_ERR_PEER);
    CHECK(strcmp(kvb__err_get(&e), "peer a:1 gone") == 0);
    kvb__err_clear(&e);
    CHECK(strcmp(kvb__err_get(&e), "") == 0);
    kvb__err_destroy(&e);
}

static void test_env(void)
{
    unsetenv("KVBRIDGE_T_X");
    unsetenv("SGLANG_T_X");
    CHECK_EQ(kvb__env_int("KVBRIDGE_T_X", "SGLANG_T_X", 7, 1, 100), 7);
    setenv("SGLANG_T_X", "9", 1);
    CHECK_EQ(kvb__env_int("KVBRIDGE_T_X", "SGLANG_T_X", 7, 1, 100), 9);
    setenv("KVBRIDGE_T_X", "11", 1);
    CHECK_EQ(kvb__env_int("KVBRIDGE_T_X", "SGLANG_T_X", 7, 1, 100), 11); /* twin wins */
    setenv("KVBRIDGE_T_X", "1000", 1);
    CHECK_EQ(kvb__env_int("KVBRIDGE_T_X", "SGLANG_T_X", 7, 1, 100), 7); /* out of range */
    setenv("KVBRIDGE_T_X", "12abc", 1);
    CHECK_EQ(kvb__env_int("KVBRIDGE_T_X", "SGLANG_T_X", 7, 1, 100), 7);
    setenv("KVBRIDGE_T_X", "2.5", 1);
    CHECK(kvb__env_double("KVBRIDGE_T_X", NULL, 1.0, 0.0, 10.0) == 2.5);
    setenv("KVBRIDGE_T_X", "nan", 1);
    CHECK(kvb__env_double("KVBRIDGE_T_X", NULL, 1.0, 0.0, 10.0) == 1.0);
}

static void test_parse(void)
{
    int64_t v = 0;
    CHECK(kvb__parse_i64("123", 3, 0, 1000, &v) && v == 123);
    CHECK(kvb__parse_i64("-1", 2, -1, 1, &v) && v == -1);
    CHECK(!kvb__parse_i64("", 0, 0, 10, &v));
    CHECK(!kvb__parse_i64("-", 1, -10, 10, &v));
    CHECK(!kvb__parse_i64("1 ", 2, 0, 10, &v));
    CHECK(!kvb__parse_i64("+1", 2, 0, 10, &v));
    CHECK(!kvb__parse_i64("11", 2, 0, 10, &v));
    CHECK(kvb__parse_i64("9223372036854775807", 19, INT64_MIN, INT64_MAX, &v) && v == INT64_MAX);
    CHECK(!kvb__parse_i64("9223372036854775808", 19, INT64_MIN, INT64_MAX, &v));
    CHECK(kvb__parse_i64("-9223372036854775808", 20, INT64_MIN, INT64_MAX, &v) && v == INT64_MIN);
    CHECK(!kvb__parse_i64("99999999999999999999", 20, INT64_MIN, INT64_MAX, &v));
    uint64_t o;
    CHECK(!kvb__add_u64(UINT64_MAX, 1, &o));
    CHECK(kvb__add_u64(1, 2, &o) && o == 3);
    CHECK(!kvb__mul_u64(UINT64_MAX / 2, 3, &o));
}

int main(void)
{
    test_status();
    test_log();
    test_err();
    test_env();
    test_parse();
    TEST_PASS("core");
    return 0;
}
