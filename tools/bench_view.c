/* `kvbridge bench --trace FILE`: the run's rooms, as each rank's timeline
 * saw them ("tl" lines, bench_common.h), kept by the driver and written as
 * Chrome trace events (the JSON Perfetto and chrome://tracing open): a
 * process per rank, a thread per lane of rooms that do not overlap, a
 * complete ("X") slice per room and, nested in it, one per stage; a failed
 * room gets an instant ("i") event at its terminal time and its reason in
 * the slice's args. docs/bench.md, "Seeing the run". */
#include "bench_common.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

bool bench_view_add(bench_view_t *w, uint64_t room, bool prefill, int dp, int pp, int phase,
                    const char *rest)
{
    bench_vrec_t r = {.room = room, .prefill = prefill, .dp = dp, .pp = pp, .phase = phase};
    int ok = 0, n = 0, off = 0;
    if (w->n >= BENCH_VIEW_MAX_RECORDS ||
        sscanf(rest, "%d %d %lf %lf %lf %d%n", &r.tp, &ok, &r.t0, &r.t_term, &r.t_last, &n, &off) !=
            6 ||
        n < 0 || n > BENCH_VIEW_STAGES) {
        w->dropped++;
        return false;
    }
    rest += off;
    for (int k = 0; k < n; k++, rest += off) {
        bench_vstage_t *s = &r.st[k];
        if (sscanf(rest, " %15s %lf %lf%n", s->name, &s->a, &s->b, &off) != 3 || s->b < s->a) {
            w->dropped++;
            return false;
        }
    }
    r.nst = n;
    r.ok = ok == 1;
    while (*rest == ' ')
        rest++;
    if (!r.ok)
        snprintf(r.why, sizeof(r.why), "%s", rest);
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 256;
        bench_vrec_t *v = realloc(w->v, cap * sizeof(*v));
        if (v == NULL) {
            w->dropped++;
            return false;
        }
        w->v = v;
        w->cap = cap;
    }
    w->v[w->n++] = r;
    return true;
}

void bench_view_room_failed(bench_view_t *w, uint64_t room, const char *why)
{
    for (size_t i = 0; i < w->n; i++) {
        bench_vrec_t *r = &w->v[i];
        if (r->room != room)
            continue;
        r->room_failed = true;
        if (r->why[0] == '\0')
            snprintf(r->why, sizeof(r->why), "%s", why);
    }
}

int bench_view_pid(const bench_opts_t *o, const bench_vrec_t *r)
{
    if (r->prefill)
        return 1 + (r->dp * o->ptp + r->tp) * o->ppp + r->pp;
    return 1 + o->dp * o->ptp * o->ppp + r->tp;
}

void bench_view_rank_name(const bench_vrec_t *r, char *buf, size_t cap)
{
    if (r->prefill)
        snprintf(buf, cap, "prefill dp%d tp%d pp%d", r->dp, r->tp, r->pp);
    else
        snprintf(buf, cap, "decode tp%d", r->tp);
}

double bench_view_origin(const bench_view_t *w)
{
    double t = 0;
    for (size_t i = 0; i < w->n; i++)
        t = i == 0 || w->v[i].t0 < t ? w->v[i].t0 : t;
    return t;
}

static const bench_opts_t *g_sort_opts; /* qsort has no context argument */

static int by_track(const void *x, const void *y)
{
    const bench_vrec_t *a = x, *b = y;
    int pa = bench_view_pid(g_sort_opts, a), pb = bench_view_pid(g_sort_opts, b);
    if (pa != pb)
        return pa < pb ? -1 : 1;
    if (a->t0 != b->t0)
        return a->t0 < b->t0 ? -1 : 1;
    return a->room < b->room ? -1 : a->room > b->room;
}

int *bench_view_layout(const bench_opts_t *o, bench_view_t *w)
{
    int *lane = calloc(w->n + 1, sizeof(int));
    double *ends = calloc(w->n + 1, sizeof(double)); /* per lane of the current track */
    if (lane == NULL || ends == NULL) {
        free(lane);
        free(ends);
        return NULL;
    }
    g_sort_opts = o;
    qsort(w->v, w->n, sizeof(*w->v), by_track);
    size_t nl = 0;
    for (size_t i = 0; i < w->n; i++) {
        if (i > 0 && bench_view_pid(o, &w->v[i]) != bench_view_pid(o, &w->v[i - 1]))
            nl = 0;
        size_t l = 0;
        while (l < nl && ends[l] > w->v[i].t0)
            l++;
        if (l == nl)
            nl++;
        ends[l] = w->v[i].t_last;
        lane[i] = (int)l;
    }
    free(ends);
    return lane;
}

static const char *const phase_names[] = {"warmup", "timed", "held"};

/* Microseconds from the origin (never negative: the origin is the earliest). */
static double us(double t, double origin)
{
    double v = (t - origin) * 1e6;
    return v > 0 ? v : 0;
}

static void trace_meta(FILE *f, const bench_opts_t *o, const bench_view_t *w, const int *lane)
{
    char name[48];
    for (size_t i = 0; i < w->n; i++) {
        const bench_vrec_t *r = &w->v[i];
        int pid = bench_view_pid(o, r);
        if (i == 0 || pid != bench_view_pid(o, &w->v[i - 1])) {
            bench_view_rank_name(r, name, sizeof(name));
            fprintf(f,
                    ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_name\",\"args\":{"
                    "\"name\":\"%s\"}}",
                    pid, name);
            fprintf(f,
                    ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_sort_index\","
                    "\"args\":{\"sort_index\":%d}}",
                    pid, pid);
        }
        bool seen = false; /* one thread_name per (track, lane) */
        for (size_t j = i; j > 0 && !seen; j--)
            seen = bench_view_pid(o, &w->v[j - 1]) == pid && lane[j - 1] == lane[i];
        if (!seen)
            fprintf(f,
                    ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{"
                    "\"name\":\"rooms lane %d\"}}",
                    pid, lane[i], lane[i]);
    }
}

/* A room's slice and its stages: each stage starts no earlier than the one
 * before it ended (a stage clipped so is marked in its args), so slices on
 * a lane nest as the format wants. */
static void trace_room(FILE *f, const bench_opts_t *o, const bench_vrec_t *r, int lane, double org)
{
    int pid = bench_view_pid(o, r);
    bool failed = !r->ok || r->room_failed;
    double a = us(r->t0, org), b = us(r->t_last, org);
    fprintf(f,
            ",\n{\"ph\":\"X\",\"cat\":\"room\",\"name\":\"room %" PRIu64 "\",\"pid\":%d,\"tid\":%d,"
            "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"room\":%" PRIu64
            ",\"phase\":\"%s\",\"outcome\":\"%s\"",
            r->room, pid, lane, a, b - a, r->room, phase_names[r->phase],
            failed ? "failed" : "success");
    if (failed) {
        fprintf(f, ",\"reason\":");
        bench_json_str(f, r->why[0] ? r->why : "failed on another rank");
    }
    fprintf(f, "}}");
    double prev = a;
    for (int k = 0; k < r->nst; k++) {
        double sa = us(r->st[k].a, org), sb = us(r->st[k].b, org);
        double ca = sa < prev ? prev : sa, cb = sb > b ? b : sb;
        cb = cb < ca ? ca : cb;
        fprintf(
            f,
            ",\n{\"ph\":\"X\",\"cat\":\"stage\",\"name\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,"
            "\"dur\":%.3f,\"args\":{\"room\":%" PRIu64 ",\"ms\":%.4f",
            r->st[k].name, pid, lane, ca, cb - ca, r->room, (sb - sa) / 1e3);
        if (ca != sa)
            fprintf(f, ",\"clipped_start_us\":%.3f", sa);
        fprintf(f, "}}");
        prev = cb;
    }
    if (failed) { /* where it failed here, or (verification, another rank) where it ended */
        double t = us(r->ok ? r->t_last : r->t_term, org);
        fprintf(f,
                ",\n{\"ph\":\"i\",\"s\":\"t\",\"cat\":\"failure\",\"name\":\"failed\",\"pid\":%d,"
                "\"tid\":%d,\"ts\":%.3f,\"args\":{\"room\":%" PRIu64 ",\"reason\":",
                pid, lane, t > b ? b : t, r->room);
        bench_json_str(f, r->why[0] ? r->why : "failed on another rank");
        fprintf(f, "}}");
    }
}

bool bench_view_write_trace(const bench_opts_t *o, bench_view_t *w)
{
    int *lane = bench_view_layout(o, w);
    FILE *f = lane != NULL ? fopen(o->trace, "w") : NULL;
    if (f == NULL) {
        fprintf(stderr, "kvbridge: bench: cannot write %s\n", o->trace);
        free(lane);
        return false;
    }
    double org = bench_view_origin(w);
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"tool\":\"kvbridge bench\","
               "\"model\":");
    bench_json_str(f, o->m.name);
    fprintf(f, ",\"records\":%zu,\"records_dropped\":%lld},\n\"traceEvents\":[", w->n, w->dropped);
    fprintf(f, "\n{\"ph\":\"M\",\"pid\":0,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":"
               "\"kvbridge bench\"}}");
    trace_meta(f, o, w, lane);
    for (size_t i = 0; i < w->n; i++)
        trace_room(f, o, &w->v[i], lane[i], org);
    fprintf(f, "\n]}\n");
    free(lane);
    if (w->dropped > 0)
        fprintf(stderr, "kvbridge: bench: %lld room records not in %s (past %d or malformed)\n",
                w->dropped, o->trace, BENCH_VIEW_MAX_RECORDS);
    return fclose(f) == 0;
}

void bench_view_free(bench_view_t *w)
{
    free(w->v);
    memset(w, 0, sizeof(*w));
}
