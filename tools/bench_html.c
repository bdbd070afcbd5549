/* `kvbridge bench --report FILE`: one self-contained HTML page (inline CSS,
 * SVG and a few lines of JS; nothing fetched) with the run's summary table
 * and an SVG timeline: a row per room per rank, grouped by rank, the room's
 * life as a grey bar with its stages coloured on it and a red cross where
 * it failed. Rows come from the same records as --trace (bench_view.c).
 * docs/bench.md, "Seeing the run". */
#include "bench_common.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define PLOT_X 260.0   /* the labels' column */
#define PLOT_W 1000.0  /* the time axis */
#define ROW_H 14.0     /* a room row */
#define RANK_H 20.0    /* a rank's header row */
#define MAX_ROWS 20000 /* rows drawn; the page says how many were left out */

typedef struct stage_colour {
    const char *name, *colour;
} stage_colour_t;

/* Prefill stages in blues and greens, decode ones in oranges and purples. */
static const stage_colour_t colours[] = {
    {"wait_decode", "#9ecae1"}, {"transfer", "#2171b5"},     {"notify", "#41ab5d"},
    {"bootstrap", "#fdae6b"},   {"wait_prefill", "#807dba"}, {"fence_hold", "#d94801"},
};

static const char *colour_of(const char *stage)
{
    for (size_t i = 0; i < sizeof(colours) / sizeof(colours[0]); i++)
        if (strcmp(colours[i].name, stage) == 0)
            return colours[i].colour;
    return "#969696";
}

static void esc(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc((unsigned char)*s < 0x20 ? ' ' : *s, f);
        }
    }
}

static void row(FILE *f, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void row(FILE *f, const char *key, const char *fmt, ...)
{
    char v[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof(v), fmt, ap);
    va_end(ap);
    fprintf(f, "<tr><th>%s</th><td>", key);
    esc(f, v);
    fprintf(f, "</td></tr>\n");
}

static void summary(FILE *f, const bench_opts_t *o, const bench_report_t *r)
{
    fprintf(f, "<table id=\"summary\">\n");
    row(f, "setup", "%s, prefill TP%d PP%d DP%d -> decode TP%d, transport %s%s", o->m.name, o->ptp,
        o->ppp, o->dp, o->dtp, bench_transport_name(o->transport),
        r->interrupted ? " (interrupted: partial)" : "");
    row(f, "requests", "%lld x %lld tokens (page %d, chunk %lld), %lld in flight", r->requests,
        o->prompt_len, o->page, o->chunk > 0 ? o->chunk : o->prompt_len, o->conc);
    if (o->dpage != o->page || o->dorder != KVB_PLAN_ORDER_NHD)
        row(f, "decode pages", "%d tokens, %s (prefill: %d, nhd)", o->dpage,
            kvb_plan_order_name((kvb_plan_order_t)o->dorder), o->page);
    row(f, "result", "%lld verified, %lld aborted, %lld failed", r->verified, r->aborted,
        r->failed);
    row(f, "warm-up", "%lld requests, %lld verified, %lld failed", r->warm_requests,
        r->warm_verified, r->warm_failed);
    row(f, "bytes moved", "%.3f GB in %.3f s", (double)r->steady.bytes / 1e9, r->steady.seconds);
    row(f, "throughput", "%.2f GB/s (memcpy, same volume: %.2f GB/s)", bench_rate(&r->steady),
        r->memcpy_gbps);
    row(f, "latency ms", "p50 %.3f  p90 %.3f  p99 %.3f", bench_pct(&r->steady, 50),
        bench_pct(&r->steady, 90), bench_pct(&r->steady, 99));
    for (int k = 0; k < BENCH_ST_N; k++)
        if (r->stage[k].nlat > 0) {
            char key[64];
            snprintf(key, sizeof(key), "stage %s ms", bench_stage_names[k]);
            row(f, key, "p50 %.3f  p99 %.3f", bench_pct(&r->stage[k], 50),
                bench_pct(&r->stage[k], 99));
        }
    for (int i = 0; i < r->nfails; i++)
        row(f, "failure", "%s", r->fails[i]);
    fprintf(f, "</table>\n");
}

static const char *const head =
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
    "<title>kvbridge bench report</title>\n<style>\n"
    "body{font:13px/1.4 sans-serif;margin:16px;color:#222}\n"
    "table{border-collapse:collapse;margin-bottom:16px}\n"
    "th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f3f3f3}\n"
    "svg text{font:11px monospace;fill:#333}svg .rank{font-weight:bold}\n"
    "svg .life{fill:#e0e0e0}svg .fail{stroke:#d7191c;stroke-width:2}\n"
    "svg g.failed .life{fill:#fcbba1}svg g.hi .life{fill:#ffe082}\n"
    "svg .axis{stroke:#bbb}.legend span{display:inline-block;padding:1px 6px;margin-right:6px}\n"
    "</style></head><body>\n<h1>kvbridge bench</h1>\n";

static void legend(FILE *f)
{
    fprintf(f, "<p class=\"legend\">stages: ");
    for (size_t i = 0; i < sizeof(colours) / sizeof(colours[0]); i++)
        fprintf(f, "<span style=\"background:%s\">%s</span>", colours[i].colour, colours[i].name);
    fprintf(f, "<span style=\"color:#d7191c\">&#x2715; failed</span> (grey: the room's life on "
               "that rank, created to its last event; hover a row for its times)</p>\n");
}

static void axis(FILE *f, double span_s, double height)
{
    double step = pow(10, floor(log10(span_s > 0 ? span_s : 1e-3)));
    while (span_s / step > 10)
        step *= 2;
    for (int i = 0; i * step <= span_s + 1e-12 && i < 40; i++) {
        double x = PLOT_X + PLOT_W * (i * step) / (span_s > 0 ? span_s : 1);
        fprintf(f, "<line class=\"axis\" x1=\"%.1f\" y1=\"14\" x2=\"%.1f\" y2=\"%.1f\"/>", x, x,
                height);
        fprintf(f, "<text x=\"%.1f\" y=\"11\">%.4g ms</text>\n", x + 2, i * step * 1e3);
    }
}

static void room_row(FILE *f, const bench_vrec_t *r, double y, double org, double scale)
{
    static const char *const phases[] = {"warmup", "timed", "held"};
    char rank[48];
    bool failed = !r->ok || r->room_failed;
    bench_view_rank_name(r, rank, sizeof(rank));
    double x0 = PLOT_X + (r->t0 - org) * scale, x1 = PLOT_X + (r->t_last - org) * scale;
    fprintf(f,
            "<g class=\"room %s\" data-room=\"%" PRIu64 "\" data-rank=\"%s\" data-phase=\"%s\" "
            "transform=\"translate(0,%.1f)\"><title>room %" PRIu64 " on %s (%s): %s, %.3f ms",
            failed ? "failed" : "ok", r->room, rank, phases[r->phase], y, r->room, rank,
            phases[r->phase], failed ? "failed" : "success", (r->t_last - r->t0) * 1e3);
    for (int k = 0; k < r->nst; k++)
        fprintf(f, "; %s %.3f ms", r->st[k].name, (r->st[k].b - r->st[k].a) * 1e3);
    if (failed) {
        fprintf(f, "; ");
        esc(f, r->why[0] ? r->why : "failed on another rank");
    }
    fprintf(f, "</title><text x=\"16\" y=\"10\">%" PRIu64 "%s</text>", r->room,
            r->phase == BENCH_PHASE_WARMUP ? " w" : "");
    fprintf(f, "<rect class=\"life\" x=\"%.2f\" y=\"2\" width=\"%.2f\" height=\"10\"/>", x0,
            fmax(x1 - x0, 1.0));
    for (int k = 0; k < r->nst; k++)
        fprintf(
            f,
            "<rect class=\"st\" data-stage=\"%s\" fill=\"%s\" x=\"%.2f\" y=\"3\" width=\"%.2f\" "
            "height=\"8\"/>",
            r->st[k].name, colour_of(r->st[k].name), PLOT_X + (r->st[k].a - org) * scale,
            fmax((r->st[k].b - r->st[k].a) * scale, 0.5));
    if (failed) {
        double xf = PLOT_X + ((r->ok ? r->t_last : r->t_term) - org) * scale;
        fprintf(f, "<path class=\"fail\" d=\"M%.2f 2 l8 10 m0 -10 l-8 10\"/>", xf - 4);
    }
    fprintf(f, "</g>\n");
}

static const char *const script =
    "<script>\n(function(){\n"
    "var rows=document.querySelectorAll('#timeline g.room');\n"
    "var failed=document.querySelectorAll('#timeline g.room.failed').length;\n"
    "document.getElementById('rows').textContent=rows.length+' room rows, '+failed+' failed';\n"
    "rows.forEach(function(g){\n"
    " g.addEventListener('mouseenter',function(){document.querySelectorAll("
    "'#timeline g.room[data-room=\"'+g.dataset.room+'\"]').forEach(function(h){"
    "h.classList.add('hi');});});\n"
    " g.addEventListener('mouseleave',function(){document.querySelectorAll('#timeline g.hi')"
    ".forEach(function(h){h.classList.remove('hi');});});\n"
    "});\n"
    "console.log('kvbridge report: '+rows.length+' room rows');\n"
    "})();\n</script>\n";

static void timeline(FILE *f, const bench_opts_t *o, const bench_view_t *w)
{
    double org = bench_view_origin(w), end = org;
    size_t shown = w->n < MAX_ROWS ? w->n : MAX_ROWS;
    int tracks = 0;
    for (size_t i = 0; i < shown; i++) {
        end = w->v[i].t_last > end ? w->v[i].t_last : end;
        tracks += i == 0 || bench_view_pid(o, &w->v[i]) != bench_view_pid(o, &w->v[i - 1]);
    }
    double span = end - org, scale = PLOT_W / (span > 0 ? span : 1);
    double height = 20 + (double)shown * ROW_H + tracks * RANK_H;
    fprintf(f, "<h2>Timeline</h2>\n");
    legend(f);
    fprintf(f, "<p id=\"rows\">%zu room rows</p>\n", shown);
    if (shown < w->n || w->dropped > 0)
        fprintf(f, "<p>%zu of %zu room records drawn; %lld not recorded.</p>\n", shown, w->n,
                w->dropped);
    fprintf(f,
            "<svg id=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
            "height=\"%.0f\" data-rooms=\"%zu\">\n",
            PLOT_X + PLOT_W + 60, height, shown);
    axis(f, span, height);
    double y = 20;
    for (size_t i = 0; i < shown; i++) {
        const bench_vrec_t *r = &w->v[i];
        if (i == 0 || bench_view_pid(o, r) != bench_view_pid(o, &w->v[i - 1])) {
            char name[48];
            bench_view_rank_name(r, name, sizeof(name));
            fprintf(f, "<text class=\"rank\" x=\"2\" y=\"%.1f\">%s</text>\n", y + 14, name);
            y += RANK_H;
        }
        room_row(f, r, y, org, scale);
        y += ROW_H;
    }
    fprintf(f, "</svg>\n");
}

bool bench_view_write_html(const bench_opts_t *o, const bench_report_t *rep, bench_view_t *w)
{
    int *lane = bench_view_layout(o, w); /* sorts by rank, then creation */
    FILE *f = lane != NULL ? fopen(o->report, "w") : NULL;
    if (f == NULL) {
        fprintf(stderr, "kvbridge: bench: cannot write %s\n", o->report);
        free(lane);
        return false;
    }
    fputs(head, f);
    summary(f, o, rep);
    timeline(f, o, w);
    fputs(script, f);
    fputs("</body></html>\n", f);
    free(lane);
    return fclose(f) == 0;
}
