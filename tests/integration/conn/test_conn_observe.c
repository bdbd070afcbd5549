/* Timelines and metrics (docs/observe.md), on a real prefill and decode
 * with their bootstrap server, the /metrics listener on loopback:
 * - N rooms of known bytes move the counters by exactly what they did
 *   (rooms ended, transfers, bytes, stage histogram counts, in flight back
 *   to where it was), and /metrics serves the same names (promtool-clean
 *   when promtool is installed; a 404 for any other path);
 * - a successful room's timelines list its events in their order, both
 *   sides;
 * - an aborted room shows the abort on both sides, in order, and is counted
 *   by its reason class;
 * - KVBRIDGE_TRACE writes one OTLP/JSON line per room and side, joined
 *   by the trace id made from the room;
 * - a room whose prefill never answers shows, from the receiver's timeline
 *   alone, that it sits after transfer_info_sent and for how long; then its
 *   time-out ends it with the stage named. */
#include "harness/kvb_cluster.h"
#include "kvb_test.h"

#include <curl/curl.h>
#include <jansson.h>
#include <kvbridge/metrics.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ROOMS 8
#define PAGES 3
#define WAIT_TIMEOUT 1.0 /* the decode's KVPoll.WaitingForInput time-out */

static char *metrics(void)
{
    kvb_metrics_t *m = NULL;
    CHECK_EQ(kvb_metrics_snapshot(&m), KVB_OK);
    char *t = strdup(m->text);
    CHECK_EQ(strlen(t), m->len);
    kvb_metrics_free(m);
    return t;
}

/* Sum of the samples of name (exactly: not name_bucket) whose labels
 * contain every string of labels (NULL-terminated). */
static double mval(const char *text, const char *name, const char *const *labels)
{
    double sum = 0;
    size_t nl = strlen(name);
    for (const char *l = text; l != NULL && *l != '\0';) {
        const char *end = strchr(l, '\n');
        size_t len = end != NULL ? (size_t)(end - l) : strlen(l);
        char line[512];
        snprintf(line, sizeof(line), "%.*s", (int)len, l);
        bool ok = strncmp(line, name, nl) == 0 && (line[nl] == '{' || line[nl] == ' ');
        for (const char *const *k = labels; ok && k != NULL && *k != NULL; k++)
            ok = strstr(line, *k) != NULL;
        if (ok)
            sum += strtod(strrchr(line, ' ') + 1, NULL);
        l = end != NULL ? end + 1 : NULL;
    }
    return sum;
}

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

typedef struct {
    char *buf;
    size_t len;
} body_t;

static size_t on_body(char *p, size_t sz, size_t n, void *arg)
{
    body_t *b = arg;
    char *v = realloc(b->buf, b->len + sz * n + 1);
    if (v == NULL)
        return 0;
    memcpy(v + b->len, p, sz * n);
    b->len += sz * n;
    v[b->len] = '\0';
    b->buf = v;
    return sz * n;
}

/* GET http://addr/path: the status code and the body (caller frees). */
static long http_get(const char *addr, const char *path, char **body_p)
{
    char url[512];
    body_t b = {NULL, 0};
    long code = 0;
    snprintf(url, sizeof(url), "http://%s%s", addr, path);
    CURL *c = curl_easy_init();
    CHECK(c != NULL);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 5L);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    CHECK_EQ(curl_easy_perform(c), CURLE_OK);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(c);
    *body_p = b.buf;
    return code;
}

/* promtool check metrics on text: 0 clean, 1 not, -1 no promtool. */
static int promtool(const char *text)
{
    if (system("command -v promtool >/dev/null 2>&1") != 0)
        return -1;
    char path[] = "/tmp/kvb_observe_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    CHECK_EQ(write(fd, text, strlen(text)), (long long)strlen(text));
    close(fd);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "promtool check metrics < %s", path);
    int rc = system(cmd);
    unlink(path);
    return rc == 0 ? 0 : 1;
}

static void show(const char *who, const kvb_timeline_t *t)
{
    fprintf(stderr, "%s room %llu (age %.6f s, %llu dropped):\n", who, (unsigned long long)t->room,
            t->age_s, (unsigned long long)t->dropped);
    for (size_t i = 0; i < t->n; i++)
        fprintf(stderr, "  %+.6f %-22s %lld %s\n", t->events[i].t_s,
                kvb_event_name(t->events[i].event), (long long)t->events[i].value,
                t->events[i].detail);
}

/* Index of the first (or, last, the last) event ev in t; -1: none. */
static int find(const kvb_timeline_t *t, kvb_event_t ev, bool last)
{
    int at = -1;
    for (size_t i = 0; i < t->n; i++)
        if (t->events[i].event == ev && (at < 0 || last))
            at = (int)i;
    return at;
}

/* Every event of want[] present, each first occurrence after the previous. */
static void in_order(const kvb_timeline_t *t, const kvb_event_t *want, size_t n)
{
    int prev = -1;
    for (size_t i = 0; i < n; i++) {
        int at = find(t, want[i], false);
        if (at <= prev) {
            show("out of order", t);
            fprintf(stderr, "event %s at %d, expected after %d\n", kvb_event_name(want[i]), at,
                    prev);
        }
        CHECK(at > prev);
        prev = at;
    }
}

static kvb_timeline_t *rtl(kvb_receiver_h rc)
{
    kvb_timeline_t *t = NULL;
    CHECK_EQ(kvb_receiver_timeline(rc, &t), KVB_OK);
    return t;
}

static kvb_timeline_t *stl(kvb_sender_h s)
{
    kvb_timeline_t *t = NULL;
    CHECK_EQ(kvb_sender_timeline(s, &t), KVB_OK);
    return t;
}

static void success_timelines(kvb_receiver_h rc, kvb_sender_h s, bool print)
{
    kvb_timeline_t *r = rtl(rc), *p = stl(s);
    if (print)
        show("receiver", r), show("sender", p);
    static const kvb_event_t rw[] = {KVB_EV_CREATED, KVB_EV_BOOTSTRAP_ANSWERED,
                                     KVB_EV_TRANSFER_INFO_SENT, KVB_EV_STATUS_RECEIVED,
                                     KVB_EV_TERMINAL};
    static const kvb_event_t pw[] = {KVB_EV_CREATED,         KVB_EV_TRANSFER_INFO_RECEIVED,
                                     KVB_EV_CHUNK_PLANNED,   KVB_EV_FIRST_WRITE_POSTED,
                                     KVB_EV_LAST_WRITE_DONE, KVB_EV_TERMINAL,
                                     KVB_EV_STATUS_SENT};
    in_order(r, rw, sizeof(rw) / sizeof(rw[0]));
    in_order(p, pw, sizeof(pw) / sizeof(pw[0]));
    CHECK_EQ(r->events[0].t_s, 0);
    CHECK_EQ(r->events[find(r, KVB_EV_TERMINAL, false)].value, KVB_POLL_SUCCESS);
    CHECK_EQ(p->events[find(p, KVB_EV_TERMINAL, false)].value, KVB_POLL_SUCCESS);
    CHECK_EQ(p->events[find(p, KVB_EV_STATUS_SENT, false)].value, KVB_POLL_SUCCESS);
    CHECK_EQ(p->events[find(p, KVB_EV_CHUNK_PLANNED, false)].value, PAGES);
    CHECK_EQ(p->events[find(p, KVB_EV_LAST_WRITE_DONE, false)].value, KVB_OK);
    CHECK_EQ(r->dropped, 0);
    for (size_t i = 1; i < r->n; i++) /* the receiver's stamps come from one thread at a time */
        CHECK(r->events[i].t_s >= r->events[i - 1].t_s);
    CHECK(r->age_s >= r->events[r->n - 1].t_s);
    kvb_timeline_free(r);
    kvb_timeline_free(p);
}

static void rooms_counted(kvbh_pair_t *pr)
{
    int32_t src[PAGES], dst[PAGES];
    char *t0 = metrics();
    for (int k = 0; k < ROOMS; k++) {
        uint64_t room = 5100 + (uint64_t)k;
        kvb_receiver_h rc;
        kvb_sender_h s;
        kvbh_room_pages(&pr->pre.g, room, PAGES, src, dst);
        CHECK_EQ(kvbh_pair_room(pr, room, src, dst, PAGES, &rc, &s), KVB_OK);
        CHECK_EQ(kvb_sender_send(s, src, PAGES), KVB_OK);
        CHECK_EQ(kvbh_wait_receiver(rc, 10), KVB_POLL_SUCCESS);
        CHECK_EQ(kvbh_wait_sender(s, 10), KVB_POLL_SUCCESS);
        CHECK_EQ(kvbh_verify_buf(&pr->dec, room, 0, dst, PAGES), 0);
        success_timelines(rc, s, k == 0);
        kvb_sender_destroy(s);
        kvb_receiver_destroy(rc);
    }
    char *t1 = metrics();
    uint64_t room_bytes = (uint64_t)PAGES * pr->pre.n_kv * pr->pre.item_len + KVBH_AUX_ITEM;
    fprintf(stderr, "%d rooms of %llu bytes (%d KV buffers of %llu-byte items, + aux)\n", ROOMS,
            (unsigned long long)room_bytes, pr->pre.n_kv, (unsigned long long)pr->pre.item_len);
#define DELTA(name, ...) (mval(t1, name, L(__VA_ARGS__)) - mval(t0, name, L(__VA_ARGS__)))
    CHECK_EQ(DELTA("kvbridge_rooms_ended_total", "role=\"prefill\"", "outcome=\"success\""), ROOMS);
    CHECK_EQ(DELTA("kvbridge_rooms_ended_total", "role=\"decode\"", "outcome=\"success\""), ROOMS);
    CHECK_EQ(DELTA("kvbridge_rooms_ended_total", "outcome=\"failed\""), 0);
    CHECK_EQ(DELTA("kvbridge_transfer_bytes_total", "op=\"write\""), ROOMS * room_bytes);
    CHECK_EQ(DELTA("kvbridge_transfer_bytes_total", "op=\"read\""), 0);
    /* per room: its KV write and its aux write, both OK */
    CHECK_EQ(DELTA("kvbridge_transfers_total", "op=\"write\"", "outcome=\"ok\""), 2 * ROOMS);
    CHECK_EQ(DELTA("kvbridge_transfers_total", "outcome=\"failed\""), 0);
    CHECK_EQ(DELTA("kvbridge_transfer_speed_bytes_per_second_count", "op=\"write\""), 2 * ROOMS);
    CHECK_EQ(DELTA("kvbridge_room_stage_seconds_count", "role=\"decode\"", "stage=\"total\""),
             ROOMS);
    CHECK_EQ(DELTA("kvbridge_room_stage_seconds_count", "role=\"decode\"", "stage=\"transfer\""),
             ROOMS);
    CHECK_EQ(DELTA("kvbridge_room_stage_seconds_count", "role=\"prefill\"", "stage=\"transfer\""),
             ROOMS);
    CHECK_EQ(mval(t1, "kvbridge_rooms_in_flight", NULL),
             mval(t0, "kvbridge_rooms_in_flight", NULL));
    CHECK_EQ(mval(t1, "kvbridge_registrations", L("role=\"prefill\"")), 1);
    CHECK(mval(t1, "kvbridge_fence_grants_total", NULL) >= ROOMS);
    CHECK_STR_CONTAINS(t1, "kvbridge_rooms_ended_total{role=\"decode\",rank=\"0\",outcome=");
    free(t0);
    free(t1);
}

static void aborted_room(kvbh_pair_t *pr)
{
    int32_t src[PAGES], dst[PAGES];
    uint64_t room = 5200;
    kvb_receiver_h rc;
    kvb_sender_h s;
    char *t0 = metrics();
    kvbh_room_pages(&pr->pre.g, room, PAGES, src, dst);
    CHECK_EQ(kvbh_pair_room(pr, room, src, dst, PAGES, &rc, &s), KVB_OK);
    kvb_receiver_abort(rc);
    CHECK_EQ(kvbh_wait_receiver(rc, 10), KVB_POLL_FAILED);
    CHECK_EQ(kvbh_wait_sender(s, 10), KVB_POLL_FAILED);
    kvb_timeline_t *r = rtl(rc), *p = stl(s);
    show("aborted receiver", r);
    show("aborted sender", p);
    static const kvb_event_t rw[] = {KVB_EV_TRANSFER_INFO_SENT, KVB_EV_TERMINAL, KVB_EV_ABORT_SENT};
    static const kvb_event_t pw[] = {KVB_EV_TRANSFER_INFO_RECEIVED, KVB_EV_ABORT_RECEIVED,
                                     KVB_EV_TERMINAL};
    in_order(r, rw, 3);
    in_order(p, pw, 3);
    CHECK_STR_CONTAINS(r->events[find(r, KVB_EV_TERMINAL, false)].detail,
                       "aborted in WaitingForInput: Aborted by");
    CHECK_STR_CONTAINS(p->events[find(p, KVB_EV_TERMINAL, false)].detail,
                       "aborted in WaitingForInput: Aborted by");
    CHECK_EQ(find(p, KVB_EV_FIRST_WRITE_POSTED, false), -1); /* nothing was written */
    /* the prefill's answer (its ABORT_ACK or Failed status) came after the
     * abort on both sides: the decode's fence saw it */
    int ack = find(p, KVB_EV_ABORT_ACK_SENT, false), st = find(p, KVB_EV_STATUS_SENT, false);
    CHECK(ack > find(p, KVB_EV_ABORT_RECEIVED, false) ||
          st > find(p, KVB_EV_ABORT_RECEIVED, false));
    kvb_timeline_free(r);
    kvb_timeline_free(p);
    kvb_sender_destroy(s);
    kvb_receiver_destroy(rc);
    char *t1 = metrics();
    CHECK_EQ(DELTA("kvbridge_rooms_failed_total", "role=\"decode\"", "reason=\"aborted\""), 1);
    CHECK_EQ(DELTA("kvbridge_rooms_failed_total", "role=\"prefill\"", "reason=\"aborted\""), 1);
    CHECK_EQ(DELTA("kvbridge_rooms_ended_total", "outcome=\"success\""), 0);
    free(t0);
    free(t1);
}

/* The prefill gets the transfer info, but no sender is ever made there:
 * nothing answers. */
static void silent_room(kvbh_pair_t *pr)
{
    int32_t dst[PAGES];
    uint64_t room = 5300;
    kvb_receiver_h rc;
    char *t0 = metrics();
    kvbh_room_pages(&pr->pre.g, room, PAGES, NULL, dst);
    CHECK_EQ(kvb_receiver_create(pr->dec.mgr, pr->boot.addr, room, -1, &rc), KVB_OK);
    CHECK_EQ(kvb_receiver_init(rc, dst, PAGES, 0, NULL), KVB_OK);
    kvbh_sleep(WAIT_TIMEOUT / 2);
    CHECK_EQ(kvb_receiver_poll(rc), KVB_POLL_WAITING_FOR_INPUT);
    kvb_timeline_t *r = rtl(rc);
    show("silent receiver, mid-wait", r);
    /* Where it is and for how long, from this timeline alone: its last event
     * is its transfer info going out, and it has waited since. */
    const kvb_timeline_event_t *last = &r->events[r->n - 1];
    CHECK_EQ(last->event, KVB_EV_TRANSFER_INFO_SENT);
    CHECK(r->age_s - last->t_s >= WAIT_TIMEOUT / 2 - 0.05);
    fprintf(stderr, "waiting for the prefill for %.3f s after %s\n", r->age_s - last->t_s,
            kvb_event_name(last->event));
    CHECK_EQ(find(r, KVB_EV_TERMINAL, false), -1);
    kvb_timeline_free(r);
    CHECK_EQ(kvbh_wait_receiver(rc, 10 + WAIT_TIMEOUT), KVB_POLL_FAILED);
    r = rtl(rc);
    show("silent receiver, ended", r);
    int info = find(r, KVB_EV_TRANSFER_INFO_SENT, true), term = find(r, KVB_EV_TERMINAL, false);
    CHECK(term > info);
    CHECK_STR_CONTAINS(r->events[term].detail, "timeout in WaitingForInput: Request 5300");
    CHECK(r->events[term].t_s - r->events[info].t_s >= WAIT_TIMEOUT);
    CHECK(find(r, KVB_EV_ABORT_SENT, false) > term); /* the fence asked the prefill to stop */
    kvb_timeline_free(r);
    kvb_receiver_destroy(rc);
    char *t1 = metrics();
    CHECK_EQ(DELTA("kvbridge_rooms_failed_total", "role=\"decode\"", "reason=\"timeout\""), 1);
    free(t0);
    free(t1);
}

static void served(void)
{
    const char *addr = kvb_metrics_addr();
    char *body = NULL;
    CHECK(addr != NULL);
    fprintf(stderr, "/metrics at %s\n", addr);
    CHECK_EQ(http_get(addr, "/metrics", &body), 200);
    CHECK_STR_CONTAINS(body, "# TYPE kvbridge_rooms_ended_total counter\n");
    CHECK_STR_CONTAINS(body, "# TYPE kvbridge_room_stage_seconds histogram\n");
    CHECK_STR_CONTAINS(body, "kvbridge_room_stage_seconds_bucket{role=\"decode\",rank=\"0\","
                             "stage=\"total\",le=\"+Inf\"}");
    CHECK(strstr(body, "room=") == NULL); /* never a per-room label */
    int pt = promtool(body);
    if (pt < 0)
        fprintf(stderr, "SKIP promtool check: promtool not installed (Debian: prometheus)\n");
    else
        CHECK_EQ(pt, 0);
    free(body);
    CHECK_EQ(http_get(addr, "/other", &body), 404);
    free(body);
}

/* The value of attribute key in an OTLP attribute array (string or int as
 * text), or NULL. */
static const char *attr(json_t *attrs, const char *key)
{
    size_t i;
    json_t *a;
    json_array_foreach(attrs, i, a)
    {
        if (strcmp(json_string_value(json_object_get(a, "key")), key) != 0)
            continue;
        json_t *v = json_object_get(a, "value");
        json_t *s = json_object_get(v, "stringValue");
        return s != NULL ? json_string_value(s) : json_string_value(json_object_get(v, "intValue"));
    }
    return NULL;
}

/* KVBRIDGE_TRACE: one OTLP/JSON line per room and side, written once both
 * let go of it; room 5100's two lines share the trace id made from the
 * room, the decode's root span holds its events in order and its stage
 * spans are the root's children. */
static void traced(const char *path)
{
    char *text = kvbh_read_file(path);
    CHECK(text != NULL);
    int lines = 0, joined = 0;
    char want[33];
    snprintf(want, sizeof(want), "6b76627269646765%016llx", 5100ull);
    for (char *l = strtok(text, "\n"); l != NULL; l = strtok(NULL, "\n")) {
        json_error_t e;
        json_t *o = json_loads(l, 0, &e);
        if (o == NULL)
            fprintf(stderr, "trace line %d not JSON: %s\n", lines, e.text);
        CHECK(o != NULL);
        lines++;
        json_t *rs = json_array_get(json_object_get(o, "resourceSpans"), 0);
        const char *role =
            attr(json_object_get(json_object_get(rs, "resource"), "attributes"), "kvbridge.role");
        json_t *spans =
            json_object_get(json_array_get(json_object_get(rs, "scopeSpans"), 0), "spans");
        json_t *root = json_array_get(spans, 0);
        CHECK(role != NULL && root != NULL);
        const char *tid = json_string_value(json_object_get(root, "traceId"));
        CHECK(tid != NULL && strlen(tid) == 32);
        if (strcmp(tid, want) != 0) {
            json_decref(o);
            continue;
        }
        joined++;
        CHECK_EQ(json_integer_value(json_object_get(json_object_get(root, "status"), "code")), 1);
        json_t *evs = json_object_get(root, "events");
        CHECK_EQ(
            strcmp(json_string_value(json_object_get(json_array_get(evs, 0), "name")), "created"),
            0);
        const char *stage = strcmp(role, "decode") == 0 ? "wait_prefill" : "transfer";
        bool found = false;
        for (size_t i = 1; i < json_array_size(spans); i++) {
            json_t *s = json_array_get(spans, i);
            CHECK_EQ(strcmp(json_string_value(json_object_get(s, "parentSpanId")),
                            json_string_value(json_object_get(root, "spanId"))),
                     0);
            CHECK(strtoull(json_string_value(json_object_get(s, "endTimeUnixNano")), NULL, 10) >=
                  strtoull(json_string_value(json_object_get(s, "startTimeUnixNano")), NULL, 10));
            found |= strcmp(json_string_value(json_object_get(s, "name")), stage) == 0;
        }
        if (!found)
            fprintf(stderr, "%s line of room 5100 has no %s span: %s\n", role, stage, l);
        CHECK(found);
        json_decref(o);
    }
    /* every room of the run, both sides: 8 + 1 + 1 (decode only: its
     * prefill had no sender, but the wire room is traced too) */
    fprintf(stderr, "trace: %d lines, %d of room 5100\n", lines, joined);
    CHECK_EQ(joined, 2);
    CHECK(lines >= 2 * (ROOMS + 2));
    free(text);
}

int main(void)
{
    char trace[] = "/tmp/kvb_observe_trace_XXXXXX";
    int tfd = mkstemp(trace);
    CHECK(tfd >= 0);
    close(tfd);
    setenv("KVBRIDGE_TRACE", trace, 1);
    setenv("KVBRIDGE_METRICS_ADDR", "127.0.0.1:0", 1);
    unsetenv("KVBRIDGE_TIMELINE");
    const kvbh_geom_t g = {2, 2, 16, 4, 512, 0, 0};
    kvbh_knobs_t dk = {.wait_timeout = WAIT_TIMEOUT};
    kvbh_pair_t pr;
    CHECK_EQ(kvbh_pair_start(&pr, &g, KVBH_MEM_MALLOC, NULL, &dk), KVB_OK);
    rooms_counted(&pr);
    aborted_room(&pr);
    silent_room(&pr);
    served();
    kvbh_pair_stop(&pr);
    traced(trace);
    unlink(trace);
    TEST_PASS("timelines show each room's path; metrics count exactly what ran");
    return 0;
}
