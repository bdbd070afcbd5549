/* The bootstrap server and client over IPv6 loopback (::1), and "::" serving
 * both IPv6 and IPv4. Skipped (exit 77, reported by CTest as skipped) when
 * this host cannot bind ::1. */
#include <kvbridge/bootstrap.h>

#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "boot_test_util.h"

static int have_ipv6_loopback(void)
{
    struct sockaddr_in6 a;
    int fd = socket(AF_INET6, SOCK_STREAM, 0), ok;
    if (fd < 0)
        return 0;
    memset(&a, 0, sizeof(a));
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

static void roundtrip(const char *client_addr)
{
    kvb_bootstrap_client_h c;
    kvb_bootstrap_rank_addr_t a;
    kvb_bootstrap_parallel_info_t info;
    kvb_bootstrap_registration_t reg = {.attn_tp_size = 2,
                                        .attn_tp_rank = 1,
                                        .attn_dp_size = 1,
                                        .pp_size = 1,
                                        .system_dp_size = 1,
                                        .rank_ip = "::1",
                                        .rank_port = 6001};
    CHECK_EQ(kvb_bootstrap_client_create(client_addr, NULL, &c), KVB_OK);
    CHECK_EQ(kvb_bootstrap_client_health(c, 0), KVB_OK);
    CHECK_EQ(kvb_bootstrap_client_register(c, &reg, 0), KVB_OK);
    CHECK_EQ(kvb_bootstrap_client_lookup(c, 0, 1, 0, 0, &a), KVB_OK);
    CHECK(strcmp(a.rank_ip, "::1") == 0);
    CHECK_EQ(a.rank_port, 6001);
    CHECK_EQ(kvb_bootstrap_client_parallel_info(c, 0, &info), KVB_OK);
    CHECK_EQ(info.attn_tp_size, 2);
    kvb_bootstrap_parallel_info_free(&info);
    kvb_bootstrap_client_destroy(c);
}

int main(void)
{
    kvb_bootstrap_server_h s;
    char addr[128], url[256];
    unsetenv("KVBRIDGE_BOOTSTRAP_TOKEN");
    if (!have_ipv6_loopback()) {
        fprintf(stderr, "SKIP: cannot bind ::1 on this host (no IPv6 loopback)\n");
        return 77;
    }
    s = start_server("::1", NULL, 0);
    snprintf(addr, sizeof(addr), "%s", kvb_bootstrap_server_address(s));
    fprintf(stderr, "server at %s\n", addr);
    CHECK(strncmp(addr, "[::1]:", 6) == 0);
    roundtrip(addr);
    snprintf(url, sizeof(url), "http://%s/route?engine_rank=1&target_dp_group=0", addr);
    expect_http("GET", url, NULL, NULL, 200, "{\"rank_ip\":\"::1\",\"rank_port\":6001}");
    /* ::1 only: IPv4 loopback on the same port is not served. */
    {
        kvb_bootstrap_client_h c;
        snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)kvb_bootstrap_server_port(s));
        CHECK_EQ(kvb_bootstrap_client_create(addr, NULL, &c), KVB_OK);
        CHECK_EQ(kvb_bootstrap_client_health(c, 1.0), KVB_ERR_PEER);
        kvb_bootstrap_client_destroy(c);
    }
    kvb_bootstrap_server_stop(s);
    TEST_PASS("IPv6 ::1 server and client");

    /* "::": IPv6 and IPv4 on one socket. */
    s = start_server("::", NULL, 0);
    snprintf(addr, sizeof(addr), "[::1]:%u", (unsigned)kvb_bootstrap_server_port(s));
    roundtrip(addr);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)kvb_bootstrap_server_port(s));
    roundtrip(addr);
    kvb_bootstrap_server_stop(s);
    TEST_PASS("dual-stack :: serves IPv6 and IPv4");
    return 0;
}
