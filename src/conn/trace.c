/* KVBRIDGE_TRACE=path: each room's timeline appended to path as it is let
 * go (its room freed and its handle destroyed, so events after its terminal
 * state are in), one OTLP/JSON object per line (resourceSpans →
 * scopeSpans → spans, the shape OpenTelemetry's file exporter writes): a
 * root span for the room carrying every event, and a child span per stage.
 * The trace id is derived from the room id alone, so the prefill's and the
 * decode's lines of one request join into one trace. Each line is one
 * write(2) on an O_APPEND descriptor (lines of several processes do not
 * interleave); a failed write is logged once and the room goes on. */
#include "conn/timeline.h"
#include "core/core.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int trace_fd = -1;
static int64_t wall_minus_mono; /* ns: CLOCK_REALTIME - CLOCK_MONOTONIC at open */

static void trace_open(void)
{
    const char *path = kvb__env_get("KVBRIDGE_TRACE", NULL);
    struct timespec r, m;
    if (path == NULL)
        return;
    trace_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (trace_fd < 0) {
        KVB_LOGE("KVBRIDGE_TRACE=\"%s\": cannot open it for appending; no trace is written", path);
        return;
    }
    clock_gettime(CLOCK_REALTIME, &r);
    clock_gettime(CLOCK_MONOTONIC, &m);
    wall_minus_mono = ((int64_t)r.tv_sec - (int64_t)m.tv_sec) * 1000000000ll +
                      ((int64_t)r.tv_nsec - (int64_t)m.tv_nsec);
    KVB_LOGI("trace: rooms' timelines go to %s (OTLP/JSON, one line per room and side)", path);
}

bool kvb__trace_on(void)
{
    pthread_once(&once, trace_open);
    return trace_fd >= 0;
}

/* JSON string body of s (quotes, backslashes and control bytes escaped). */
static void jstr(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static uint64_t unix_ns(const kvb__tl_t *tl, double t_s)
{
    return (uint64_t)((int64_t)tl->t0_ns + wall_minus_mono + (int64_t)(t_s * 1e9));
}

/* Span ids: unique within the room's trace (role, stage), never zero. */
static uint64_t span_id(const kvb__tl_t *tl, unsigned stage)
{
    return ((uint64_t)(tl->role + 1) << 56) | ((uint64_t)(stage + 1) << 48) |
           (tl->room & 0xffffffffffffull);
}

typedef struct {
    const char *name;
    kvb_event_t from, to;
    bool from_last, to_last; /* the last stamp of the event, else the first */
} stage_t;

/* The stages each role's spans cover, by the events that bound them. */
static const stage_t prefill_stages[] = {
    {"wait_decode", KVB_EV_CREATED, KVB_EV_TRANSFER_INFO_RECEIVED, false, true},
    {"transfer", KVB_EV_FIRST_WRITE_POSTED, KVB_EV_LAST_WRITE_DONE, false, true},
    {"notify", KVB_EV_TERMINAL, KVB_EV_STATUS_SENT, false, true},
};
static const stage_t decode_stages[] = {
    {"bootstrap", KVB_EV_CREATED, KVB_EV_BOOTSTRAP_ANSWERED, false, false},
    {"wait_prefill", KVB_EV_TRANSFER_INFO_SENT, KVB_EV_STATUS_RECEIVED, false, true},
    {"fence_hold", KVB_EV_FENCE_HOLD, KVB_EV_FENCE_RELEASE, false, false},
};

/* Time (s since creation) of ev's first or last occurrence in t; false: none. */
static bool at(const kvb_timeline_t *t, kvb_event_t ev, bool last, double *t_p)
{
    bool found = false;
    for (size_t i = 0; i < t->n; i++)
        if (t->events[i].event == ev && (!found || last)) {
            *t_p = t->events[i].t_s;
            found = true;
        }
    return found;
}

static void span_head(FILE *f, const char *trace, uint64_t id, uint64_t parent, const char *name,
                      uint64_t start, uint64_t end)
{
    fprintf(f, "{\"traceId\":\"%s\",\"spanId\":\"%016llx\",", trace, (unsigned long long)id);
    if (parent != 0)
        fprintf(f, "\"parentSpanId\":\"%016llx\",", (unsigned long long)parent);
    fprintf(f, "\"name\":");
    jstr(f, name);
    fprintf(f, ",\"kind\":1,\"startTimeUnixNano\":\"%llu\",\"endTimeUnixNano\":\"%llu\"",
            (unsigned long long)start, (unsigned long long)end);
}

static void write_events(FILE *f, const kvb__tl_t *tl, const kvb_timeline_t *t)
{
    fprintf(f, ",\"events\":[");
    for (size_t i = 0; i < t->n; i++) {
        const kvb_timeline_event_t *e = &t->events[i];
        fprintf(f, "%s{\"timeUnixNano\":\"%llu\",\"name\":\"%s\",\"attributes\":[", i ? "," : "",
                (unsigned long long)unix_ns(tl, e->t_s), kvb_event_name(e->event));
        fprintf(f, "{\"key\":\"kvbridge.value\",\"value\":{\"intValue\":\"%lld\"}}",
                (long long)e->value);
        if (e->detail[0] != '\0') {
            fprintf(f, ",{\"key\":\"kvbridge.detail\",\"value\":{\"stringValue\":");
            jstr(f, e->detail);
            fprintf(f, "}}");
        }
        fprintf(f, "]}");
    }
    fprintf(f, "]");
}

static void write_line(FILE *f, const kvb__tl_t *tl, const kvb_timeline_t *t)
{
    char trace[33];
    double end = t->age_s, term = 0;
    bool ended = at(t, KVB_EV_TERMINAL, false, &term);
    const char *role = tl->role ? "decode" : "prefill";
    int status = -1;
    for (size_t i = 0; i < t->n; i++)
        if (t->events[i].event == KVB_EV_TERMINAL)
            status = (int)t->events[i].value;
    if (t->n > 0 && t->events[t->n - 1].t_s > end)
        end = t->events[t->n - 1].t_s;
    /* "kvbridge" then the room: the same on both sides of a request */
    snprintf(trace, sizeof(trace), "6b76627269646765%016llx", (unsigned long long)tl->room);
    fprintf(f,
            "{\"resourceSpans\":[{\"resource\":{\"attributes\":["
            "{\"key\":\"service.name\",\"value\":{\"stringValue\":\"kvbridge\"}},"
            "{\"key\":\"kvbridge.role\",\"value\":{\"stringValue\":\"%s\"}},"
            "{\"key\":\"process.pid\",\"value\":{\"intValue\":\"%d\"}}]},"
            "\"scopeSpans\":[{\"scope\":{\"name\":\"kvbridge\"},\"spans\":[",
            role, (int)getpid());
    uint64_t root = span_id(tl, 15);
    span_head(f, trace, root, 0, tl->role ? "kvbridge.receiver" : "kvbridge.sender", unix_ns(tl, 0),
              unix_ns(tl, end));
    fprintf(f,
            ",\"attributes\":[{\"key\":\"kvbridge.room\",\"value\":{\"intValue\":\"%llu\"}},"
            "{\"key\":\"kvbridge.role\",\"value\":{\"stringValue\":\"%s\"}},"
            "{\"key\":\"kvbridge.dropped_events\",\"value\":{\"intValue\":\"%llu\"}}]",
            (unsigned long long)tl->room, role, (unsigned long long)t->dropped);
    write_events(f, tl, t);
    fprintf(f, ",\"status\":{\"code\":%d}}", !ended ? 0 : status == KVB_POLL_SUCCESS ? 1 : 2);
    const stage_t *st = tl->role ? decode_stages : prefill_stages;
    size_t n =
        tl->role ? sizeof(decode_stages) / sizeof(st[0]) : sizeof(prefill_stages) / sizeof(st[0]);
    for (size_t k = 0; k < n; k++) {
        double a, b;
        if (!at(t, st[k].from, st[k].from_last, &a) || !at(t, st[k].to, st[k].to_last, &b) || b < a)
            continue;
        fprintf(f, ",");
        span_head(f, trace, span_id(tl, (unsigned)k), root, st[k].name, unix_ns(tl, a),
                  unix_ns(tl, b));
        fprintf(f, "}");
    }
    fprintf(f, "]}]}]}\n");
}

void kvb__trace_room(const kvb__tl_t *tl, const kvb_timeline_t *t)
{
    char *buf = NULL;
    size_t len = 0;
    static int failed; /* logged once */
    if (!kvb__trace_on())
        return;
    FILE *f = open_memstream(&buf, &len);
    if (f != NULL) {
        write_line(f, tl, t);
        if (fclose(f) == 0 && buf != NULL && write(trace_fd, buf, len) != (ssize_t)len &&
            !__atomic_exchange_n(&failed, 1, __ATOMIC_RELAXED))
            KVB_LOGE("KVBRIDGE_TRACE: a room's line was not written whole; later failures "
                     "are not logged");
    }
    free(buf);
}
