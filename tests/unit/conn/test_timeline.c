/* The timeline ring and the metrics table, without a network:
 * - the ring keeps the first KVB_TIMELINE_HEAD events and the newest, counts
 *   the rest as dropped, and keeps every kept event's fields together;
 * - writers on several threads while a reader snapshots: no torn record
 *   (each event's detail spells its value) and none duplicated;
 * - the metrics table (core/metrics.def) keeps Prometheus' rules: names
 *   kvbridge_[a-z_]+, counters end _total, help present, every row in the
 *   exposition with its TYPE, histogram buckets cumulative up to _count;
 * - failure texts fall into their reason classes;
 * - what recording costs per room (printed, not asserted). */
#include "conn/timeline.h"
#include "core/metrics.h"
#include "kvb_test.h"

#include <kvbridge/metrics.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static kvb_timeline_t *snap(kvb__tl_t *tl)
{
    kvb_timeline_t *t = NULL;
    CHECK_EQ(kvb__tl_snapshot(tl, tl->room, &t), KVB_OK);
    return t;
}

static void ring_keeps_head_and_newest(void)
{
    kvb__tl_t *tl = kvb__tl_new(1, 42);
    CHECK(tl != NULL);
    for (int i = 1; i < 100; i++) { /* event 0 is "created" */
        char d[16];
        snprintf(d, sizeof(d), "%d", i);
        kvb__tl_add(tl, KVB_EV_CHUNK_PLANNED, i, d);
    }
    kvb_timeline_t *t = snap(tl);
    CHECK_EQ(t->room, 42);
    CHECK_EQ(t->n, KVB_TIMELINE_SLOTS);
    CHECK_EQ(t->dropped, 100 - KVB_TIMELINE_SLOTS);
    CHECK_EQ(t->events[0].event, KVB_EV_CREATED);
    for (int k = 1; k < KVB_TIMELINE_HEAD; k++)
        CHECK_EQ(t->events[k].value, k);
    int ring = KVB_TIMELINE_SLOTS - KVB_TIMELINE_HEAD;
    for (int k = 0; k < ring; k++) /* then the newest, oldest first */
        CHECK_EQ(t->events[KVB_TIMELINE_HEAD + k].value, 100 - ring + k);
    for (size_t k = 1; k < t->n; k++)
        CHECK(t->events[k].t_s >= t->events[k - 1].t_s);
    kvb_timeline_free(t);
    kvb__tl_put(tl);
}

typedef struct {
    kvb__tl_t *tl;
    int base, n;
} writer_t;

static void *writer(void *arg)
{
    writer_t *w = arg;
    for (int i = 0; i < w->n; i++) {
        char d[24];
        snprintf(d, sizeof(d), "v%d", w->base + i);
        kvb__tl_add(w->tl, KVB_EV_STATUS_RECEIVED, w->base + i, d);
    }
    return NULL;
}

static void writers_and_a_reader(void)
{
    enum { W = 4, N = 20000 };
    kvb__tl_t *tl = kvb__tl_new(0, 7);
    pthread_t th[W];
    writer_t ws[W];
    for (int i = 0; i < W; i++) {
        ws[i] = (writer_t){tl, (i + 1) * 1000000, N};
        CHECK_EQ(pthread_create(&th[i], NULL, writer, &ws[i]), 0);
    }
    size_t seen = 0, snaps = 0;
    for (; snaps < 2000; snaps++) { /* bounded: reads while the writers run */
        kvb_timeline_t *t = snap(tl);
        for (size_t k = 0; k < t->n; k++) {
            if (t->events[k].event == KVB_EV_CREATED)
                continue;
            char want[24];
            snprintf(want, sizeof(want), "v%lld", (long long)t->events[k].value);
            if (strcmp(want, t->events[k].detail) != 0)
                fprintf(stderr, "torn record: value %lld detail %s\n",
                        (long long)t->events[k].value, t->events[k].detail);
            CHECK_EQ(strcmp(want, t->events[k].detail), 0);
            for (size_t j = 0; j < k; j++)
                CHECK(t->events[j].event == KVB_EV_CREATED ||
                      t->events[j].value != t->events[k].value);
            seen++;
        }
        kvb_timeline_free(t);
    }
    for (int i = 0; i < W; i++)
        pthread_join(th[i], NULL);
    kvb_timeline_t *t = snap(tl);
    CHECK(t->n > KVB_TIMELINE_HEAD && t->n <= KVB_TIMELINE_SLOTS);
    CHECK_EQ(t->n + t->dropped, W * N + 1);
    fprintf(stderr, "%zu snapshots, %zu events checked while %d threads wrote %d each\n", snaps,
            seen, W, N);
    kvb_timeline_free(t);
    kvb__tl_put(tl);
}

/* The exposition's line "# TYPE name type" exists. */
static bool has_type(const char *text, const char *name, const char *type)
{
    char want[200];
    snprintf(want, sizeof(want), "# TYPE %s %s\n", name, type);
    return strstr(text, want) != NULL;
}

static void table_rules(void)
{
    static const struct {
        const char *name, *type, *help;
    } rows[] = {
#define KVB_METRIC(id, name, type, dims, bk, help) {name, #type, help},
#include "core/metrics.def"
#undef KVB_METRIC
    };
    regex_t re;
    CHECK_EQ(regcomp(&re, "^kvbridge_[a-z_]+$", REG_EXTENDED | REG_NOSUB), 0);
    kvb_metrics_t *m = NULL;
    CHECK_EQ(kvb_metrics_snapshot(&m), KVB_OK);
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const char *n = rows[i].name;
        size_t len = strlen(n);
        bool counter = strcmp(rows[i].type, "COUNTER") == 0;
        CHECK_EQ(regexec(&re, n, 0, NULL, 0), 0);
        CHECK(strlen(rows[i].help) > 10);
        CHECK_EQ(counter, len > 6 && strcmp(n + len - 6, "_total") == 0);
        char low[16];
        snprintf(low, sizeof(low), "%s", rows[i].type);
        for (char *c = low; *c; c++)
            *c = (char)(*c - 'A' + 'a');
        if (!has_type(m->text, n, low))
            fprintf(stderr, "no TYPE line for %s\n", n);
        CHECK(has_type(m->text, n, low));
        for (size_t j = 0; j < i; j++)
            CHECK(strcmp(rows[j].name, n) != 0);
    }
    regfree(&re);
    kvb_metrics_free(m);
}

static void histogram_cumulative(void)
{
    size_t slot = kvb__m_role(1, KVB__ST_TOTAL, KVB__STAGES);
    kvb__m_observe(KVB__M_STAGE, slot, 2000000);     /* 2 ms */
    kvb__m_observe(KVB__M_STAGE, slot, 2000000000);  /* 2 s */
    kvb__m_observe(KVB__M_STAGE, slot, 90000000000); /* 90 s: past the last bound */
    kvb_metrics_t *m = NULL;
    CHECK_EQ(kvb_metrics_snapshot(&m), KVB_OK);
    const char *pre = "kvbridge_room_stage_seconds_bucket{role=\"decode\",rank=\"-1\","
                      "stage=\"total\",le=\"";
    CHECK_STR_CONTAINS(m->text, "stage=\"total\",le=\"0.0025\"} 1\n");
    CHECK_STR_CONTAINS(m->text, "stage=\"total\",le=\"2.5\"} 2\n");
    CHECK_STR_CONTAINS(m->text, "stage=\"total\",le=\"60\"} 2\n");
    CHECK_STR_CONTAINS(m->text, "stage=\"total\",le=\"+Inf\"} 3\n");
    CHECK_STR_CONTAINS(m->text, "kvbridge_room_stage_seconds_count{role=\"decode\",rank=\"-1\","
                                "stage=\"total\"} 3\n");
    CHECK_STR_CONTAINS(m->text, "kvbridge_room_stage_seconds_sum{role=\"decode\",rank=\"-1\","
                                "stage=\"total\"} 92.002\n");
    CHECK_STR_CONTAINS(m->text, pre);
    kvb_metrics_free(m);
}

static void reason_classes(void)
{
    static const struct {
        const char *text;
        kvb__reason_t cls;
    } cases[] = {
        {"Aborted by AbortReq.", KVB__R_ABORTED},
        {"Aborted by the decode instance", KVB__R_ABORTED},
        {"Request 5 timed out after 30.0s in KVPoll.WaitingForInput", KVB__R_TIMEOUT},
        {"Request 5 timed out after 30.0s in KVPoll.Bootstrapping", KVB__R_TIMEOUT},
        {"Losing connection with prefill instance (bootstrap_addr: x)", KVB__R_PEER_LOST},
        {"Failed due to an unknown reason from another rank", KVB__R_PEER_FAILED},
        {"Failed to send kv chunk of 5 to 1.2.3.4:5: peer", KVB__R_TRANSFER},
        {"Could not fetch prefill parallel info from bootstrap_addr: x", KVB__R_BOOTSTRAP},
        {"something new", KVB__R_OTHER},
        {NULL, KVB__R_OTHER},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (kvb__reason_class(cases[i].text) != cases[i].cls)
            fprintf(stderr, "\"%s\": class %s\n", cases[i].text ? cases[i].text : "(null)",
                    kvb__reason_name(kvb__reason_class(cases[i].text)));
        CHECK_EQ(kvb__reason_class(cases[i].text), cases[i].cls);
    }
    CHECK_EQ(strcmp(kvb_event_name(KVB_EV_FENCE_HOLD), "fence_hold"), 0);
    CHECK_EQ(strcmp(kvb_event_name((kvb_event_t)999), "unknown"), 0);
}

/* What a room's recording costs: a timeline made, the ~8 events of one
 * side of a successful room, its end (metrics) and freed. */
static void cost_per_room(void)
{
    enum { ROOMS = 200000 };
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < ROOMS; i++) {
        kvb__tl_t *tl = kvb__tl_new(0, (uint64_t)i);
        kvb__tl_add_ep(tl, KVB_EV_TRANSFER_INFO_RECEIVED, 0, "10.0.0.1", 5000);
        kvb__tl_add(tl, KVB_EV_CHUNK_PLANNED, 16, "page 0");
        kvb__tl_add(tl, KVB_EV_FIRST_WRITE_POSTED, 0, NULL);
        kvb__tl_add(tl, KVB_EV_LAST_WRITE_DONE, 0, "10.0.0.2:6000");
        kvb__tl_terminal(tl, KVB_POLL_SUCCESS, KVB_POLL_TRANSFERRING, NULL);
        kvb__tl_add_ep(tl, KVB_EV_STATUS_SENT, 4, "10.0.0.1", 5000);
        kvb__tl_room_gone(tl);
        kvb__tl_put(tl);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double us = ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / 1e3;
    fprintf(stderr, "recording cost: %.3f us per room (one side, 7 events, end, free)\n",
            us / ROOMS);
}

int main(void)
{
    unsetenv("KVBRIDGE_TIMELINE");
    ring_keeps_head_and_newest();
    writers_and_a_reader();
    table_rules();
    histogram_cumulative();
    reason_classes();
    cost_per_room();
    TEST_PASS("timeline ring, metrics table, reason classes");
    return 0;
}
