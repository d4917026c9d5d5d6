/* tune.c: the autotuner core (see tune.h): search, validation, timing, the
 * disk cache and the progress bar. Kernel families live in their own files
 * and only fill in tn_case. */
#include "tune.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/alloc.h"
#include "../core/clock.h"
#include "probe.h"

#define CACHE_MAGIC "hone-tune"
#define CACHE_MAX_BYTES ((size_t)4 << 20)

typedef struct entry {
    char kernel[48], version[48], shape[96], params[256];
    double default_ns, tuned_ns;
} entry;

struct tn_tuner {
    char fp[32];
    char path[4200];
    tn_opts o;
    entry *e;
    int n_e, cap_e;
    bool corrupt;
    double t_start;
    int cases_done;
    double weight_done;
};

/* one evaluated configuration */
typedef struct point {
    int idx[TN_MAX_PARAMS]; /* indices into each param's values */
    int state;              /* 0 ok, 1 rejected, 2 skipped */
    int reps;               /* runs per timed sample */
    double ns;              /* screening median per run */
} point;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool tn_margin_wins(double default_ns, double cand_ns, double margin) {
    if (!(default_ns > 0) || !(cand_ns > 0)) return false;
    return cand_ns < default_ns * (1.0 - margin);
}

bool tn_validate(const float *ref, const float *out, size_t n, float tol_abs, float tol_rel, size_t *bad) {
    for (size_t i = 0; i < n; i++) {
        float r = ref[i], o = out[i];
        bool ok;
        if (isnan(r)) ok = isnan(o);
        else if (isinf(r)) ok = o == r;
        else ok = !isnan(o) && !isinf(o) && fabsf(o - r) <= tol_abs + tol_rel * fabsf(r);
        if (!ok) {
            if (bad) *bad = i;
            return false;
        }
    }
    return true;
}

static const char *param_label(const tn_param *p, int i, char *buf, size_t cap) {
    if (p->labels[i]) return p->labels[i];
    snprintf(buf, cap, "%d", p->values[i]);
    return buf;
}

const char *tn_cfg_str(const tn_case *c, const int *cfg, char *buf, size_t cap) {
    size_t at = 0;
    if (cap) buf[0] = 0;
    for (int p = 0; p < c->n_params; p++) {
        const tn_param *pr = &c->params[p];
        char num[24];
        const char *lab = NULL;
        for (int i = 0; i < pr->n; i++)
            if (pr->values[i] == cfg[p]) lab = param_label(pr, i, num, sizeof num);
        if (!lab) {
            snprintf(num, sizeof num, "%d", cfg[p]);
            lab = num;
        }
        int n = snprintf(buf + at, cap > at ? cap - at : 0, "%s%s=%s", p ? "," : "", pr->name, lab);
        if (n < 0 || at + (size_t)n >= cap) {
            if (at < cap) buf[at] = 0; /* whole items only */
            break;
        }
        at += (size_t)n;
    }
    return buf;
}

/* ---- cache file ---- */

static bool has_ws(const char *s, bool allow_space) {
    for (; *s; s++)
        if (*s == '\t' || *s == '\n' || *s == '\r' || (!allow_space && *s == ' ')) return true;
    return false;
}

/* Copies a field of length n into dst[cap]; false if it does not fit or is empty. */
static bool field(char *dst, size_t cap, const char *s, size_t n) {
    if (n == 0 || n >= cap) return false;
    memcpy(dst, s, n);
    dst[n] = 0;
    return true;
}

static bool parse_ns(const char *s, size_t n, double *out) {
    char buf[64];
    if (!field(buf, sizeof buf, s, n)) return false;
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    if (*end || errno || !(v > 0) || !isfinite(v)) return false;
    *out = v;
    return true;
}

static hn_status push_entry(tn_tuner *t, const entry *e, hn_err *err) {
    if (t->n_e == t->cap_e) {
        int cap = t->cap_e ? 2 * t->cap_e : 16;
        entry *ne = hn_realloc(t->e, sizeof(entry) * (size_t)cap);
        if (!ne) return hn_errf(err, HN_ERR_NOMEM, "tune: out of memory for cache entries");
        t->e = ne;
        t->cap_e = cap;
    }
    t->e[t->n_e++] = *e;
    return HN_OK;
}

/* Parses the whole file; false (and no entries) on any malformed line. */
static bool cache_parse(tn_tuner *t, const char *text, size_t len) {
    char magic[96];
    int n = snprintf(magic, sizeof magic, CACHE_MAGIC " %d %s\n", TN_CACHE_VERSION, t->fp);
    if (len < (size_t)n || memcmp(text, magic, (size_t)n)) return false;
    const char *s = text + n, *end = text + len;
    while (s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        if (!nl) return false; /* every line ends with a newline: a cut file is corrupt */
        const char *f[6];
        size_t fl[6];
        int nf = 0;
        const char *p = s;
        while (nf < 6) {
            const char *tab = memchr(p, '\t', (size_t)(nl - p));
            const char *fe = tab ? tab : nl;
            f[nf] = p;
            fl[nf] = (size_t)(fe - p);
            nf++;
            if (!tab) break;
            p = tab + 1;
        }
        if (nf != 6 || f[5] + fl[5] != nl) return false;
        entry e;
        if (!field(e.kernel, sizeof e.kernel, f[0], fl[0]) || !field(e.version, sizeof e.version, f[1], fl[1]) ||
            !field(e.shape, sizeof e.shape, f[2], fl[2]) || !field(e.params, sizeof e.params, f[3], fl[3]) ||
            !parse_ns(f[4], fl[4], &e.default_ns) || !parse_ns(f[5], fl[5], &e.tuned_ns))
            return false;
        if (memchr(e.kernel, 0, fl[0]) || memchr(e.shape, 0, fl[2]) || memchr(e.params, 0, fl[3])) return false;
        if (push_entry(t, &e, NULL) != HN_OK) return false;
        s = nl + 1;
    }
    return true;
}

static void cache_load(tn_tuner *t) {
    FILE *f = fopen(t->path, "rb");
    if (!f) return; /* no cache yet */
    char *buf = hn_malloc(CACHE_MAX_BYTES + 1);
    size_t len = buf ? fread(buf, 1, CACHE_MAX_BYTES + 1, f) : 0;
    fclose(f);
    if (!buf) return;
    if (len > CACHE_MAX_BYTES || !cache_parse(t, buf, len)) {
        t->corrupt = true;
        t->n_e = 0;
    }
    hn_free(buf);
}

hn_status tn_tuner_open(const char *fingerprint, const tn_opts *opts, tn_tuner **out, hn_err *err) {
    *out = NULL;
    if (!fingerprint || !*fingerprint || strlen(fingerprint) >= 32 || has_ws(fingerprint, false))
        return hn_errf(err, HN_ERR_INVALID, "tune: bad device fingerprint");
    tn_tuner *t = hn_calloc(1, sizeof *t);
    if (!t) return hn_errf(err, HN_ERR_NOMEM, "tune: out of memory");
    snprintf(t->fp, sizeof t->fp, "%s", fingerprint);
    if (opts) t->o = *opts;
    if (t->o.budget_s <= 0) t->o.budget_s = 30.0;
    if (t->o.n_cases <= 0) t->o.n_cases = 1;
    if (t->o.total_weight <= 0) t->o.total_weight = t->o.n_cases;
    if (t->o.margin < 0) t->o.margin = TN_DEFAULT_MARGIN;
    t->t_start = hn_now_s();
    if (!t->o.no_cache) {
        char dir[4096];
        hn_status st = tn_cache_dir(dir, sizeof dir, err);
        if (st != HN_OK) {
            hn_free(t);
            return st;
        }
        snprintf(t->path, sizeof t->path, "%s/tune-%s.txt", dir, t->fp);
        cache_load(t);
    }
    *out = t;
    return HN_OK;
}

void tn_tuner_close(tn_tuner *t) {
    if (!t) return;
    hn_free(t->e);
    hn_free(t);
}

bool tn_tuner_cache_was_corrupt(const tn_tuner *t) { return t->corrupt; }
const char *tn_tuner_cache_path(const tn_tuner *t) { return t->path; }
double tn_tuner_elapsed(const tn_tuner *t) { return hn_now_s() - t->t_start; }

hn_status tn_tuner_save(tn_tuner *t, hn_err *err) {
    if (t->o.no_cache) return HN_OK;
    size_t cap = 128 + (size_t)t->n_e * (sizeof(entry) + 64), n = 0;
    char *buf = hn_malloc(cap);
    if (!buf) return hn_errf(err, HN_ERR_NOMEM, "tune: out of memory writing the cache");
    n += (size_t)snprintf(buf, cap, CACHE_MAGIC " %d %s\n", TN_CACHE_VERSION, t->fp);
    for (int i = 0; i < t->n_e && n < cap; i++) {
        const entry *e = &t->e[i];
        n += (size_t)snprintf(buf + n, cap - n, "%s\t%s\t%s\t%s\t%.1f\t%.1f\n", e->kernel, e->version, e->shape,
                              e->params, e->default_ns, e->tuned_ns);
    }
    hn_status st = n < cap ? tn_write_file(t->path, buf, n, err)
                           : hn_errf(err, HN_ERR_INTERNAL, "tune: cache text overflow");
    hn_free(buf);
    if (st == HN_OK) t->corrupt = false;
    return st;
}

/* Parses "a=x,b=y" into cfg for c's params; false unless every param appears once with a known label. */
static bool parse_params(const tn_case *c, const char *s, int *cfg) {
    bool seen[TN_MAX_PARAMS] = {false};
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    int count = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) return false;
        *eq = 0;
        int p = 0;
        while (p < c->n_params && strcmp(c->params[p].name, tok)) p++;
        if (p == c->n_params || seen[p]) return false;
        const tn_param *pr = &c->params[p];
        int i = 0;
        char num[24];
        while (i < pr->n && strcmp(param_label(pr, i, num, sizeof num), eq + 1)) i++;
        if (i == pr->n) return false;
        cfg[p] = pr->values[i];
        seen[p] = true;
        count++;
    }
    return count == c->n_params;
}

static int find_entry(const tn_tuner *t, const char *kernel, const char *shape) {
    for (int i = 0; i < t->n_e; i++)
        if (!strcmp(t->e[i].kernel, kernel) && !strcmp(t->e[i].shape, shape)) return i;
    return -1;
}

bool tn_tuner_lookup(const tn_tuner *t, const tn_case *c, int *cfg, double *default_ns, double *tuned_ns) {
    int i = find_entry(t, c->kernel, c->shape);
    if (i < 0 || strcmp(t->e[i].version, c->version)) return false;
    int tmp[TN_MAX_PARAMS];
    if (!parse_params(c, t->e[i].params, tmp)) return false;
    memcpy(cfg, tmp, sizeof(int) * (size_t)c->n_params);
    if (default_ns) *default_ns = t->e[i].default_ns;
    if (tuned_ns) *tuned_ns = t->e[i].tuned_ns;
    return true;
}

/* ---- progress ---- */

static void progress(const tn_tuner *t, const tn_case *c, double frac) {
    if (!t->o.progress) return;
    double done = ((double)t->cases_done + (frac > 1 ? 1 : frac)) / (double)t->o.n_cases;
    if (done > 1) done = 1;
    enum { W = 24 };
    char bar[W + 1];
    int filled = (int)(done * W + 0.5);
    for (int i = 0; i < W; i++) bar[i] = i < filled ? '#' : '.';
    bar[W] = 0;
    fprintf(stderr, "\rtuning [%s] %3d%%  %4.1fs/%.0fs  %-8s %-28.28s", bar, (int)(done * 100 + 0.5),
            tn_tuner_elapsed(t), t->o.budget_s, c->kernel, c->shape);
    fflush(stderr);
}

/* ---- search ---- */

typedef struct search {
    tn_tuner *t;
    const tn_case *c;
    float *ref, *out;
    float tol_abs; /* c->tol_abs + c->tol_max * max|ref| */
    point *pts;
    int n_pts, cap_pts;
    double deadline;     /* of the search */
    double end;          /* of the case (confirmation included) */
    bool partial;
    int planned;
    tn_result *res;
} search;

static void cfg_of(const tn_case *c, const int *idx, int *cfg) {
    for (int p = 0; p < c->n_params; p++) cfg[p] = c->params[p].values[idx[p]];
}

/* Median ns per run of `samples` samples of pt->reps runs each. */
static double time_point(search *s, const point *pt, int samples) {
    int cfg[TN_MAX_PARAMS];
    double v[16];
    if (samples > 16) samples = 16;
    cfg_of(s->c, pt->idx, cfg);
    for (int k = 0; k < samples; k++) {
        double dev = s->c->time ? s->c->time(s->c->ctx, cfg, pt->reps) : 0;
        if (dev > 0) {
            v[k] = dev;
            continue;
        }
        double t0 = hn_now_s();
        for (int r = 0; r < pt->reps; r++) s->c->run(s->c->ctx, cfg, s->out);
        v[k] = (hn_now_s() - t0) * 1e9 / pt->reps;
    }
    return median(v, samples);
}

/* Validates and screens one configuration (memoized); returns its index or -1 on no memory. */
static int eval(search *s, const int *idx) {
    const tn_case *c = s->c;
    for (int i = 0; i < s->n_pts; i++)
        if (!memcmp(s->pts[i].idx, idx, sizeof(int) * (size_t)c->n_params)) return i;
    if (s->n_pts == s->cap_pts) {
        int cap = s->cap_pts ? 2 * s->cap_pts : 32;
        point *np = hn_realloc(s->pts, sizeof(point) * (size_t)cap);
        if (!np) return -1;
        s->pts = np;
        s->cap_pts = cap;
    }
    point *pt = &s->pts[s->n_pts];
    memset(pt, 0, sizeof *pt);
    memcpy(pt->idx, idx, sizeof(int) * (size_t)c->n_params);
    int cfg[TN_MAX_PARAMS];
    cfg_of(c, idx, cfg);
    for (size_t i = 0; i < c->n_out; i++) s->out[i] = NAN; /* catches outputs a candidate never writes */
    if (c->reset) c->reset(c->ctx);
    double t0 = hn_now_s();
    bool ran = c->run(c->ctx, cfg, s->out);
    double t1 = hn_now_s() - t0;
    if (!ran) {
        pt->state = 2;
        s->res->n_skipped++;
    } else {
        s->res->n_tried++;
        if (!tn_validate(s->ref, s->out, c->n_out, s->tol_abs, c->tol_rel, NULL)) {
            pt->state = 1;
            s->res->n_rejected++;
        } else {
            /* the validation run paid the first-use costs; calibrate on a second
             * run unless the first already fills a sample by itself */
            double dev = c->time ? c->time(c->ctx, cfg, 1) : 0;
            if (dev > 0) {
                t1 = dev * 1e-9; /* one run on the device's clock (the validation run paid the warm-up) */
            } else if (t1 < TN_MIN_SAMPLE_NS * 1e-9) {
                t0 = hn_now_s();
                c->run(c->ctx, cfg, s->out);
                t1 = hn_now_s() - t0;
            }
            double want = TN_MIN_SAMPLE_NS * 1e-9;
            int reps = t1 > 0 ? (int)(want / t1) + 1 : 1000;
            pt->reps = reps < 1 ? 1 : reps > 10000 ? 10000 : reps;
            if (s->n_pts > 0 && s->pts[0].state == 0 && t1 * 1e9 > TN_SLOW_FACTOR * s->pts[0].ns)
                pt->ns = t1 * 1e9; /* far slower than the default: cannot win, do not spend samples */
            else
                pt->ns = time_point(s, pt, TN_SCREEN_SAMPLES);
        }
    }
    (void)t1;
    s->n_pts++;
    progress(s->t, c, (double)s->n_pts / (double)(s->planned + 1));
    return s->n_pts - 1;
}

static bool out_of_time(search *s) {
    if (hn_now_s() < s->deadline) return false;
    s->partial = true;
    return true;
}

static int grid_size(const tn_case *c) {
    long n = 1;
    for (int p = 0; p < c->n_params; p++) {
        n *= c->params[p].n;
        if (n > 1000000) return 1000000;
    }
    return (int)n;
}

static hn_status search_run(search *s, hn_err *err) {
    const tn_case *c = s->c;
    int idx[TN_MAX_PARAMS];
    for (int p = 0; p < c->n_params; p++) idx[p] = c->params[p].def;
    int d = eval(s, idx);
    if (d < 0) return hn_errf(err, HN_ERR_NOMEM, "tune: out of memory");
    if (s->pts[d].state != 0)
        return hn_errf(err, HN_ERR_INTERNAL, "tune: %s %s: the default configuration %s", c->kernel, c->shape,
                       s->pts[d].state == 1 ? "fails validation" : "cannot run");
    if (grid_size(c) <= TN_EXHAUSTIVE) {
        int odo[TN_MAX_PARAMS] = {0};
        for (;;) {
            if (out_of_time(s)) break;
            if (eval(s, odo) < 0) return hn_errf(err, HN_ERR_NOMEM, "tune: out of memory");
            int p = 0;
            while (p < c->n_params && ++odo[p] == c->params[p].n) odo[p++] = 0;
            if (p == c->n_params) break;
        }
        return HN_OK;
    }
    /* coordinate descent from the default: sweep each parameter with the others held */
    int cur = d;
    for (int pass = 0; pass < 4; pass++) {
        int before = cur;
        for (int p = 0; p < c->n_params && !s->partial; p++) {
            for (int v = 0; v < c->params[p].n; v++) {
                if (out_of_time(s)) break;
                memcpy(idx, s->pts[cur].idx, sizeof idx);
                idx[p] = v;
                int k = eval(s, idx);
                if (k < 0) return hn_errf(err, HN_ERR_NOMEM, "tune: out of memory");
                if (s->pts[k].state == 0 && s->pts[k].ns < s->pts[cur].ns) cur = k;
            }
        }
        if (cur == before || s->partial) break;
    }
    return HN_OK;
}

hn_status tn_tune(tn_tuner *t, const tn_case *c, tn_result *res, hn_err *err) {
    memset(res, 0, sizeof *res);
    if (!c->kernel || !c->version || !*c->kernel || !*c->version || has_ws(c->kernel, false) ||
        has_ws(c->version, false) || has_ws(c->shape, true) || !c->shape[0] || c->n_params < 1 ||
        c->n_params > TN_MAX_PARAMS || !c->run || !c->reference || c->n_out == 0 ||
        strlen(c->kernel) >= sizeof(((entry *)0)->kernel) || strlen(c->version) >= sizeof(((entry *)0)->version))
        return hn_errf(err, HN_ERR_INVALID, "tune: malformed case");
    for (int p = 0; p < c->n_params; p++) {
        const tn_param *pr = &c->params[p];
        if (!pr->name || pr->n < 1 || pr->n > TN_MAX_VALUES || pr->def < 0 || pr->def >= pr->n ||
            has_ws(pr->name, false) || strchr(pr->name, '=') || strchr(pr->name, ','))
            return hn_errf(err, HN_ERR_INVALID, "tune: malformed parameter %d of %s", p, c->kernel);
    }
    for (int p = 0; p < c->n_params; p++) res->cfg[p] = c->params[p].values[c->params[p].def];
    if (!t->o.force && tn_tuner_lookup(t, c, res->cfg, &res->default_ns, &res->tuned_ns)) {
        res->cached = true;
        for (int p = 0; p < c->n_params; p++)
            res->changed |= res->cfg[p] != c->params[p].values[c->params[p].def];
        t->cases_done++;
        t->weight_done += c->weight > 0 ? c->weight : 1.0;
        progress(t, c, 0);
        return HN_OK;
    }

    if (tn_tuner_elapsed(t) >= t->o.budget_s) {
        res->not_reached = res->partial = true;
        t->cases_done++;
        t->weight_done += c->weight > 0 ? c->weight : 1.0;
        return HN_OK;
    }
    search s;
    memset(&s, 0, sizeof s);
    s.t = t;
    s.c = c;
    s.res = res;
    double w = c->weight > 0 ? c->weight : 1.0;
    double w_left = t->o.total_weight - t->weight_done;
    double remaining = t->o.budget_s - tn_tuner_elapsed(t);
    /* half shared equally (every case pays fixed costs: samples of at least
     * TN_MIN_SAMPLE_NS), half by weight (big shapes cost more per run) */
    int c_left = t->o.n_cases - t->cases_done;
    double share = 0.5 * (w_left > w ? w / w_left : 1.0) + 0.5 / (c_left > 1 ? c_left : 1);
    double t_case = (remaining > 0 ? remaining : 0) * share;
    s.deadline = hn_now_s() + 0.8 * t_case;
    s.end = hn_now_s() + t_case;
    int g = grid_size(c);
    if (g <= TN_EXHAUSTIVE) s.planned = g;
    else
        for (int p = 0; p < c->n_params; p++) s.planned += 2 * c->params[p].n;
    s.ref = hn_malloc(sizeof(float) * c->n_out);
    s.out = hn_malloc(sizeof(float) * c->n_out);
    hn_status st = HN_OK;
    if (!s.ref || !s.out) st = hn_errf(err, HN_ERR_NOMEM, "tune: out of memory for %zu outputs", c->n_out);
    if (st == HN_OK) st = c->reference(c->ctx, s.ref, err);
    if (st == HN_OK) {
        float mx = 0;
        for (size_t i = 0; i < c->n_out; i++)
            if (isfinite(s.ref[i]) && fabsf(s.ref[i]) > mx) mx = fabsf(s.ref[i]);
        s.tol_abs = c->tol_abs + c->tol_max * mx;
        st = search_run(&s, err);
    }
    if (st == HN_OK) {
        /* confirm: the fastest few and the default, timed in turn, more samples each */
        int top[TN_CONFIRM_TOP + 1], n_top = 0;
        top[n_top++] = 0; /* the default is point 0 */
        for (int k = 0; k < TN_CONFIRM_TOP; k++) {
            int b = -1;
            for (int i = 1; i < s.n_pts; i++) {
                bool taken = false;
                for (int j = 0; j < n_top; j++) taken |= top[j] == i;
                if (!taken && s.pts[i].state == 0 && (b < 0 || s.pts[i].ns < s.pts[b].ns)) b = i;
            }
            if (b < 0) break;
            top[n_top++] = b;
        }
        double med[TN_CONFIRM_TOP + 1];
        med[0] = s.pts[0].ns;
        if (n_top > 1) {
            double v[TN_CONFIRM_TOP + 1][TN_CONFIRM_SAMPLES];
            int k = 0;
            while (k < TN_CONFIRM_SAMPLES && (k < 3 || hn_now_s() < s.end)) {
                for (int j = 0; j < n_top; j++) v[j][k] = time_point(&s, &s.pts[top[j]], 1);
                k++;
            }
            for (int j = 0; j < n_top; j++) med[j] = median(v[j], k);
        }
        int best = 0;
        for (int j = 1; j < n_top; j++)
            if (med[j] < med[best]) best = j;
        if (best != 0 && !tn_margin_wins(med[0], med[best], t->o.margin)) best = 0;
        const point *win = &s.pts[top[best]];
        cfg_of(c, win->idx, res->cfg);
        res->default_ns = med[0];
        res->tuned_ns = med[best];
        res->changed = best != 0;
        res->partial = s.partial;
        if (!s.partial || t->o.cache_partial) {
            entry e;
            memset(&e, 0, sizeof e);
            snprintf(e.kernel, sizeof e.kernel, "%s", c->kernel);
            snprintf(e.version, sizeof e.version, "%s", c->version);
            snprintf(e.shape, sizeof e.shape, "%s", c->shape);
            tn_cfg_str(c, res->cfg, e.params, sizeof e.params);
            e.default_ns = res->default_ns;
            e.tuned_ns = res->tuned_ns;
            int i = find_entry(t, c->kernel, c->shape);
            if (i >= 0) t->e[i] = e; /* replaces an older version's entry */
            else st = push_entry(t, &e, err);
        }
    }
    t->cases_done++;
    t->weight_done += w;
    progress(t, c, 0);
    hn_free(s.pts);
    hn_free(s.ref);
    hn_free(s.out);
    return st;
}
