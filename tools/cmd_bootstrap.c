/* kvbridge bootstrap: run a standalone bootstrap server until SIGINT/SIGTERM. */
#include <kvbridge/bootstrap.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "tools.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvbridge bootstrap [--host H] [--port P] [--token T] [--auth-reads]\n"
            "                          [--threads N] [--timeout S]\n"
            "\n"
            "Run a bootstrap server (PUT/GET /route, /health, /metrics) until SIGINT or\n"
            "SIGTERM. Prints 'listening on H:P' once ready.\n"
            "\n"
            "  --host H       listen address (default 127.0.0.1; '::' = IPv6 and IPv4)\n"
            "  --port P       listen port (default %d; 0 = ephemeral)\n"
            "  --token T      bearer token PUT /route must carry (default:\n"
            "                 KVBRIDGE_BOOTSTRAP_TOKEN, unset = no authentication)\n"
            "  --auth-reads   GET /route and /metrics need the token too\n"
            "  --threads N    server threads (default 4)\n"
            "  --timeout S    idle connection time-out in seconds (default 10)\n",
            KVB_BOOTSTRAP_DEFAULT_PORT);
}

int kvb_cmd_bootstrap(int argc, char **argv)
{
    kvb_bootstrap_server_params_t p;
    kvb_bootstrap_server_h server = NULL;
    sigset_t set;
    long long v;
    int sig = 0;

    memset(&p, 0, sizeof(p));
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--host") == 0 && val != NULL) {
            p.field_mask |= KVB_BOOTSTRAP_SERVER_PARAM_HOST;
            p.host = val;
            i++;
        } else if (strcmp(a, "--port") == 0) {
            if (!kvb_tool_parse_int(a, val, 0, 65535, &v))
                return 2;
            p.field_mask |= KVB_BOOTSTRAP_SERVER_PARAM_PORT;
            p.port = (uint16_t)v;
            i++;
        } else if (strcmp(a, "--token") == 0 && val != NULL) {
            p.field_mask |= KVB_BOOTSTRAP_SERVER_PARAM_TOKEN;
            p.token = val;
            i++;
        } else if (strcmp(a, "--auth-reads") == 0) {
            p.field_mask |= KVB_BOOTSTRAP_SERVER_PARAM_AUTH_READS;
            p.auth_reads = 1;
        } else if (strcmp(a, "--threads") == 0) {
            if (!kvb_tool_parse_int(a, val, 1, 64, &v))
                return 2;
            p.field_mask |= KVB_BOOTSTRAP_SERVER_PARAM_THREADS;
            p.threads = (unsigned)v;
            i++;
        } else if (strcmp(a, "--timeout") == 0) {
            if (!kvb_tool_parse_int(a, val, 1, 3600, &v))
                return 2;
            p.field_mask |= KVB_BOOTSTRAP_SERVER_PARAM_CONN_TIMEOUT;
            p.conn_timeout_s = (double)v;
            i++;
        } else {
            fprintf(stderr, "kvbridge bootstrap: unknown or incomplete option '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }

    /* Block the signals before the server's threads exist, so that they all
     * inherit the mask and only sigwait() below receives them. */
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    kvb_status_t st = kvb_bootstrap_server_start(&p, &server);
    if (st != KVB_OK) {
        fprintf(stderr, "kvbridge bootstrap: cannot start: %s\n", kvb_status_string(st));
        return 1;
    }
    printf("listening on %s\n", kvb_bootstrap_server_address(server));
    fflush(stdout);
    sigwait(&set, &sig);
    fprintf(stderr, "kvbridge bootstrap: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    kvb_bootstrap_server_stop(server);
    return 0;
}
