/* libkvbridge_ts_mooncake.so: TokenSpeed's ts_mooncake_* C ABI v1
 * (include/kvbridge/ts_mooncake.h) on kvbridge's engine. Built against the
 * shared libkvbridge and its public headers only. */
#include <kvbridge/engine.h>
#include <kvbridge/ts_mooncake.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

_Static_assert(KVB_ERR_INVALID == -1, "a bad grid must return -1");

struct ts_mooncake_engine {
    kvb_engine_h eng;
    int port;
    double timeout_s; /* MC_TRANSFER_TIMEOUT */
};

#define LOG(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "kvbridge ts_mooncake: " __VA_ARGS__);                                     \
        fputc('\n', stderr);                                                                       \
    } while (0)

int ts_mooncake_abi_version(void)
{
    return TS_MOONCAKE_ABI_VERSION;
}

/* C atoi of an environment variable; def when unset. */
static long env_long(const char *name, long def)
{
    const char *v = getenv(name);
    return v != NULL ? atol(v) : def;
}

/* The address part of local_hostname into out (as the Python drop-in's
 * _parse_host): "[v6]:port", a bare IPv6 address, "ip:port[:...]", "ip". */
static void parse_host(const char *h, char *out, size_t cap)
{
    struct in6_addr a6;
    size_t n;
    while (*h == ' ' || *h == '\t')
        h++;
    if (*h == '[') {
        const char *end = strchr(h, ']');
        n = end != NULL ? (size_t)(end - h - 1) : strlen(h);
        h += end != NULL ? 1 : 0;
    } else if (inet_pton(AF_INET6, h, &a6) == 1) {
        n = strlen(h);
    } else {
        n = strcspn(h, ":");
    }
    if (n >= cap)
        n = cap - 1;
    memcpy(out, h, n);
    out[n] = '\0';
    if (out[0] == '\0')
        snprintf(out, cap, "127.0.0.1");
}

static int port_free(const char *host, int port)
{
    struct sockaddr_storage ss;
    socklen_t len;
    memset(&ss, 0, sizeof(ss));
    if (strchr(host, ':') != NULL) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1)
            return 1; /* let the engine say what is wrong */
        len = sizeof(*a);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
            return 1;
        len = sizeof(*a);
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 1;
    int ok = bind(fd, (struct sockaddr *)&ss, len) == 0;
    close(fd);
    return ok;
}

ts_mooncake_engine_t *ts_mooncake_create(const char *local_hostname, const char *metadata_server,
                                         const char *protocol, const char *device_name)
{
    char host[256];
    if (local_hostname == NULL || metadata_server == NULL || protocol == NULL) {
        LOG("ts_mooncake_create: NULL argument");
        return NULL;
    }
    if (strcmp(protocol, "rdma") != 0) {
        LOG("ts_mooncake_create supports the rdma protocol only (got \"%s\")", protocol);
        return NULL;
    }
    if (strcmp(metadata_server, "P2PHANDSHAKE") != 0) {
        LOG("ts_mooncake_create: metadata server \"%s\" is not supported; use \"P2PHANDSHAKE\"",
            metadata_server);
        return NULL;
    }
    (void)device_name; /* UCX picks the devices */
    parse_host(local_hostname, host, sizeof(host));

    kvb_engine_params_t p = {0};
    p.field_mask = KVB_ENGINE_PARAM_HOST | KVB_ENGINE_PARAM_PORT | KVB_ENGINE_PARAM_TRANSPORT |
                   KVB_ENGINE_PARAM_SERVE_READS;
    p.host = host;
    /* This ABI has no read call, so its hosts (TokenSpeed) never read: serve
     * peers' one-sided reads of the registered KV only when asked to. */
    const char *sr = getenv("KVBRIDGE_SERVE_READS");
    p.serve_reads = sr != NULL && strcmp(sr, "1") == 0;
    p.transport = KVB_TRANSPORT_AUTO;
    const char *t = getenv("KVBRIDGE_TRANSPORT");
    if (t != NULL && strcmp(t, "tcp") == 0)
        p.transport = KVB_TRANSPORT_TCP;
    else if (t != NULL && strcmp(t, "shm") == 0)
        p.transport = KVB_TRANSPORT_SHM;
    if (getenv("MC_FORCE_TCP") != NULL) /* set = on, as in Mooncake */
        p.transport = KVB_TRANSPORT_TCP;

    long lo = env_long("MC_MIN_RPC_PORT", env_long("MC_MIN_PRC_PORT", 15000));
    long hi = env_long("MC_MAX_RPC_PORT", env_long("MC_MAX_PRC_PORT", 17000));
    if (!(1024 < lo && lo <= hi && hi < 65536))
        lo = 15000, hi = 17000;
    long to = env_long("MC_TRANSFER_TIMEOUT", 30);

    struct ts_mooncake_engine *e = calloc(1, sizeof(*e));
    if (e == NULL) {
        LOG("ts_mooncake_create: out of memory");
        return NULL;
    }
    e->timeout_s = (double)(to < 5 ? 5 : to);
    kvb_status_t st = KVB_ERR_NOT_FOUND;
    for (int tries = 0, failures = 0; tries < 128 && failures < 3; tries++) {
        uint32_t r = 0;
        if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
            r = (uint32_t)rand();
        int port = (int)(lo + (long)(r % (uint32_t)(hi - lo + 1)));
        if (!port_free(host, port))
            continue;
        p.port = (uint16_t)port;
        st = kvb_engine_create(&p, &e->eng);
        if (st == KVB_OK) {
            e->port = port;
            return e;
        }
        if (st == KVB_ERR_INVALID) /* a bad host: no port will do */
            break;
        failures++;
    }
    LOG("ts_mooncake_create: cannot start an engine on %s, port in [%ld, %ld]: %s", host, lo, hi,
        kvb_status_string(st));
    free(e);
    return NULL;
}

void ts_mooncake_destroy(ts_mooncake_engine_t *e)
{
    if (e == NULL)
        return;
    kvb_engine_destroy(e->eng);
    free(e);
}

int ts_mooncake_rpc_port(ts_mooncake_engine_t *e)
{
    return e != NULL ? e->port : -1;
}

/* Mooncake's codes (its error.h) for the memory calls, as the drop-in. */
static int mem_result(ts_mooncake_engine_t *e, kvb_status_t st, const char *what)
{
    if (st == KVB_OK)
        return 0;
    LOG("%s: %s", what, kvb_engine_last_error(e->eng));
    switch (st) {
    case KVB_ERR_OVERLAP:
        return -7;
    case KVB_ERR_NOT_FOUND:
        return -3;
    case KVB_ERR_NOMEM:
        return -302;
    case KVB_ERR_UNSUPPORTED:
        return -303;
    default:
        return -1;
    }
}

int ts_mooncake_register(ts_mooncake_engine_t *e, void *addr, size_t length)
{
    if (e == NULL)
        return -1;
    return mem_result(e, kvb_engine_register(e->eng, addr, length, KVB_MEM_AUTO),
                      "ts_mooncake_register");
}

int ts_mooncake_unregister(ts_mooncake_engine_t *e, void *addr)
{
    if (e == NULL)
        return -1;
    return mem_result(e, kvb_engine_unregister(e->eng, addr), "ts_mooncake_unregister");
}

int ts_mooncake_write(ts_mooncake_engine_t *e, const char *target, const uint64_t *sources,
                      const uint64_t *destinations, const uint64_t *lengths, size_t count)
{
    if (e == NULL || target == NULL ||
        (count > 0 && (sources == NULL || destinations == NULL || lengths == NULL))) {
        LOG("ts_mooncake_write: NULL argument");
        return -1;
    }
    if (count == 0)
        return 0;
    if (count > SIZE_MAX / sizeof(kvb_block_t)) {
        LOG("ts_mooncake_write: %zu spans: too many", count);
        return -1;
    }
    kvb_block_t *b = malloc(count * sizeof(*b));
    if (b == NULL) {
        LOG("ts_mooncake_write: out of memory for %zu spans", count);
        return -1;
    }
    double bytes = 0;
    for (size_t i = 0; i < count; i++) {
        b[i] = (kvb_block_t){sources[i], destinations[i], lengths[i]};
        bytes += (double)lengths[i];
    }
    kvb_status_t st = kvb_engine_write(e->eng, target, b, count, e->timeout_s + bytes * 1e-9);
    free(b);
    if (st != KVB_OK)
        LOG("ts_mooncake_write to %s (%zu spans): %s", target, count,
            kvb_engine_last_error(e->eng));
    return st == KVB_OK ? 0 : (int)st;
}

int ts_mooncake_write_pages(ts_mooncake_engine_t *e, const char *target, const int64_t *src_pages,
                            const int64_t *dst_pages, size_t num_pages, const int64_t *fields,
                            size_t num_fields, size_t max_batch_size)
{
    if (num_pages == 0 || num_fields == 0)
        return 0; /* before any check, as the original */
    if (e == NULL || target == NULL) {
        LOG("ts_mooncake_write_pages: NULL argument");
        return -1;
    }
    /* Checks the grid (KVB_ERR_INVALID = -1), then converts it to strided
     * blocks batch by batch: kvb_engine_write_pages. */
    kvb_status_t st = kvb_engine_write_pages(e->eng, target, src_pages, dst_pages, num_pages,
                                             fields, num_fields, max_batch_size, e->timeout_s);
    if (st != KVB_OK)
        LOG("ts_mooncake_write_pages to %s (%zu pages x %zu fields): %s", target, num_pages,
            num_fields, kvb_engine_last_error(e->eng));
    return st == KVB_OK ? 0 : (int)st;
}
