/* KVBRIDGE_METRICS_ADDR that cannot be served: a clear error in the log,
 * no listener (kvb_metrics_addr() NULL), and the engine that started it is
 * created and works all the same. Argument: the value, or "inuse" (a port
 * this test holds). */
#include "kvb_test.h"

#include <arpa/inet.h>
#include <kvbridge/kvbridge.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static char logged[1024];

static void on_log(kvb_log_level_t level, const char *line, void *arg)
{
    (void)arg;
    if (level == KVB_LOG_ERROR && strstr(line, "KVBRIDGE_METRICS_ADDR") != NULL)
        snprintf(logged, sizeof(logged), "%s", line);
}

/* A listening socket on 127.0.0.1:port (the port written). */
static int hold_port(unsigned *port_p)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    CHECK_EQ(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    CHECK_EQ(listen(fd, 1), 0);
    CHECK_EQ(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port_p = ntohs(a.sin_port);
    return fd;
}

int main(int argc, char **argv)
{
    char value[128];
    int held = -1;
    CHECK(argc == 2);
    if (strcmp(argv[1], "inuse") == 0) {
        unsigned port;
        held = hold_port(&port);
        snprintf(value, sizeof(value), "127.0.0.1:%u", port);
    } else {
        snprintf(value, sizeof(value), "%s", argv[1]);
    }
    setenv("KVBRIDGE_METRICS_ADDR", value, 1);
    kvb_log_set_handler(on_log, NULL);
    kvb_engine_h eng = NULL;
    CHECK_EQ(kvb_engine_create(NULL, &eng), KVB_OK);
    fprintf(stderr, "KVBRIDGE_METRICS_ADDR=%s: logged \"%s\"\n", value, logged);
    CHECK_STR_CONTAINS(logged, value);
    CHECK_STR_CONTAINS(logged, "/metrics is not served");
    CHECK(kvb_metrics_addr() == NULL);
    kvb_metrics_t *m = NULL; /* the snapshot is served all the same */
    CHECK_EQ(kvb_metrics_snapshot(&m), KVB_OK);
    CHECK_STR_CONTAINS(m->text, "# TYPE kvbridge_engine_sessions gauge");
    kvb_metrics_free(m);
    kvb_engine_destroy(eng);
    if (held >= 0)
        close(held);
    TEST_PASS("a bad KVBRIDGE_METRICS_ADDR is a logged error, not a crash");
    return 0;
}
