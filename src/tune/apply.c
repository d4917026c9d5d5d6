/* apply.c: the tuner at model level (see apply.h): the model's matmul shapes,
 * both families tuned or looked up in one tuner (one budget, one progress
 * bar), and the winners handed to the CPU backend per shape and call size. */
#include "apply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../backend/registry.h"
#include "../core/alloc.h"
#include "../core/pool.h"
#include "../quant/quant.h"
#include "probe.h"

bool tn_no_tune_env(void) {
    const char *v = getenv("HONE_NO_TUNE");
    return v && *v && strcmp(v, "0");
}

int tn_model_shapes(const gguf_ctx *g, tn_shape **out, hn_err *err) {
    int n = 0, cap = 0;
    tn_shape *s = NULL;
    *out = NULL;
    bool has_output = gguf_find_tensor(g, "output.weight") != NULL;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        size_t len = strlen(t->name);
        if (t->n_dims != 2 || len < 7 || strcmp(t->name + len - 7, ".weight")) continue;
        bool out_w = !strcmp(t->name, "output.weight") || (!has_output && !strcmp(t->name, "token_embd.weight"));
        bool matmul = !strncmp(t->name, "blk.", 4) || out_w;
        const qt_type_traits *tr = qt_traits(t->type);
        if (!matmul || strstr(t->name, "norm") || !tr || !tr->to_float || !qt_row_size(t->type, t->ne[0])) continue;
        int j = 0;
        while (j < n && !(s[j].type == t->type && s[j].k == t->ne[0] && s[j].n == t->ne[1])) j++;
        if (j == n) {
            if (n == cap) {
                cap = cap ? 2 * cap : 16;
                tn_shape *ns = hn_realloc(s, sizeof *s * (size_t)cap);
                if (!ns) {
                    hn_free(s);
                    hn_errf(err, HN_ERR_NOMEM, "tune: out of memory");
                    return -1;
                }
                s = ns;
            }
            memset(&s[n], 0, sizeof s[n]);
            s[n].type = t->type;
            s[n].k = t->ne[0];
            s[n].n = t->ne[1];
            n++;
        }
        if (s[j].n_mats < TN_SHAPE_MATS) s[j].mats[s[j].n_mats++] = t->data;
        s[j].n_total++;
        s[j].is_output |= out_w;
    }
    *out = s;
    return n;
}

void tn_model_report_free(tn_model_report *rep) {
    if (!rep) return;
    hn_free(rep->e);
    rep->e = NULL;
    rep->n = 0;
}

hn_status tn_tune_model(const gguf_ctx *g, const tn_model_opts *o, tn_model_report *rep, hn_err *err) {
    memset(rep, 0, sizeof *rep);
    tn_shape *sh = NULL;
    int n_sh = tn_model_shapes(g, &sh, err);
    if (n_sh < 0) return HN_ERR_NOMEM;
    hn_status st = tn_tune_shapes(sh, n_sh, o, rep, err);
    hn_free(sh);
    return st;
}

static hn_status tune_on(be_backend *b, const tn_shape *sh, int n_sh, const tn_model_opts *o, tn_model_report *rep,
                         hn_err *err);

hn_status tn_tune_shapes(const tn_shape *sh, int n_sh, const tn_model_opts *o, tn_model_report *rep, hn_err *err) {
    memset(rep, 0, sizeof *rep);
    tn_model_opts opt = {0};
    if (o) opt = *o;
    be_backend *own = NULL, *b = opt.backend;
    if (!b) {
        be_config bc = {.n_threads = opt.n_threads};
        hn_status st = be_create("cpu", &bc, &own, err);
        if (st) return st;
        b = own;
    }
    hn_status st = tune_on(b, sh, n_sh, &opt, rep, err);
    be_free(own);
    return st;
}

void tn_backend_info(be_backend *b, be_tune_info *out) {
    memset(out, 0, sizeof *out);
    if (b && b->ops->version >= 9 && b->ops->tune_info) {
        b->ops->tune_info(b, out);
    } else {
        out->decode_rows[0] = 1;
        out->n_decode = 1;
        out->prefill = true;
    }
    /* a malformed answer: the CPU's decode rows */
    bool ok = out->n_decode >= 1 && out->n_decode <= BE_TUNE_ROWS && out->decode_rows[0] == 1;
    for (int i = 1; ok && i < out->n_decode; i++)
        ok = out->decode_rows[i] > out->decode_rows[i - 1] && out->decode_rows[i] <= TN_DECODE_MAX_ROWS;
    if (!ok) {
        out->decode_rows[0] = 1;
        out->n_decode = 1;
    }
    out->fingerprint[sizeof out->fingerprint - 1] = 0;
    out->device[sizeof out->device - 1] = 0;
}

static hn_status tune_on(be_backend *b, const tn_shape *sh, int n_sh, const tn_model_opts *o, tn_model_report *rep,
                         hn_err *err) {
    tn_model_opts opt = *o;
    if (opt.budget_s <= 0) opt.budget_s = TN_DEFAULT_BUDGET_S;
    if (!opt.families) opt.families = TN_FAM_DECODE | TN_FAM_PREFILL;
    be_tune_info info;
    tn_backend_info(b, &info);
    const bool host = !info.fingerprint[0]; /* the CPU: keyed by the host probe, threads tuned */
    tn_probe probe;
    tn_probe_detect(&probe);
    snprintf(rep->fingerprint, sizeof rep->fingerprint, "%s", host ? probe.fingerprint : info.fingerprint);
    double la[1];
    rep->load_avg = getloadavg(la, 1) == 1 ? la[0] : -1;
    rep->usable_cpus = probe.usable;
    rep->busy_start = host && rep->load_avg >= (double)(probe.usable > 0 ? probe.usable : 1);
    /* entries: every shape's decode cases first (decode speed matters most), then prefill */
    rep->e = hn_calloc((size_t)((info.n_decode + 2) * (n_sh > 0 ? n_sh : 1)), sizeof *rep->e);
    if (!rep->e) return hn_errf(err, HN_ERR_NOMEM, "tune: out of memory");
    static const int prows[2] = {TN_PREFILL_ROWS_A, TN_PREFILL_ROWS_B};
    static const int pmin[2] = {TN_DECODE_MAX_ROWS + 1, TN_PREFILL_SWITCH};
    for (int f = 0; f < info.n_decode + 2; f++) {
        const bool dec = f < info.n_decode;
        if (dec && !(opt.families & TN_FAM_DECODE)) continue;
        if (!dec && (!(opt.families & TN_FAM_PREFILL) || !info.prefill)) continue;
        for (int i = 0; i < n_sh; i++) {
            if (!dec && sh[i].is_output) continue; /* prefill runs the logits matrix on the wanted rows only */
            if (!b->ops->mm_tunable || !b->ops->mm_tunable(b, sh[i].type)) continue;
            tn_model_entry *e = &rep->e[rep->n++];
            e->kernel = dec ? "gemv" : "prefill"; /* the case's name replaces it */
            e->family = dec ? TN_FAM_DECODE : TN_FAM_PREFILL;
            e->type = sh[i].type;
            e->k = sh[i].k;
            e->n = sh[i].n;
            e->rows = dec ? info.decode_rows[f] : prows[f - info.n_decode];
            e->min_rows = dec ? info.decode_rows[f] : pmin[f - info.n_decode];
            e->n_tensors = sh[i].n_total;
            e->is_output = sh[i].is_output;
            e->bytes = qt_row_size(e->type, e->k) * (size_t)e->n;
            e->macs = (double)e->rows * (double)e->k * (double)e->n;
            e->tuned = false;
        }
    }
    /* the budget is shared by expected run time: decode streams bytes (~20 GB/s), prefill multiplies (~50 G/s) */
    double total_w = 0;
    for (int i = 0; i < rep->n; i++)
        total_w += rep->e[i].family == TN_FAM_DECODE ? (double)rep->e[i].bytes / 20.0 : rep->e[i].macs / 50.0;
    size_t llc = probe.l3 ? probe.l3 : probe.l2 ? probe.l2 : ((size_t)8 << 20);
    size_t rotate = 2 * llc < ((size_t)16 << 20) ? ((size_t)16 << 20) : 2 * llc;
    if (rotate > ((size_t)256 << 20)) rotate = (size_t)256 << 20;

    tn_tuner *tuner = NULL;
    tn_opts to = {.budget_s = opt.budget_s, .n_cases = rep->n, .total_weight = total_w, .margin = -1,
                  .force = opt.force, .progress = opt.progress, .cache_partial = true};
    hn_status st = tn_tuner_open(rep->fingerprint, &to, &tuner, err);
    hn_status cache_st = HN_OK; /* the cache's own failure: tuning goes on without it */
    if ((st == HN_ERR_IO || st == HN_ERR_NOT_FOUND || st == HN_ERR_RANGE) && !opt.cache_only) {
        /* no cache directory (none can be made, none is set): tune anyway, keep nothing */
        cache_st = st;
        snprintf(rep->save_msg, sizeof rep->save_msg, "%s", err->msg);
        hn_err_clear(err);
        to.no_cache = true;
        st = tn_tuner_open(rep->fingerprint, &to, &tuner, err);
    }
    if (st == HN_OK) {
        rep->cache_corrupt = tn_tuner_cache_was_corrupt(tuner);
        snprintf(rep->cache_path, sizeof rep->cache_path, "%s", tn_tuner_cache_path(tuner));
    }
    for (int i = 0; i < rep->n && st == HN_OK; i++) {
        tn_model_entry *e = &rep->e[i];
        const tn_shape *s = NULL;
        for (int j = 0; j < n_sh && !s; j++)
            if (sh[j].type == e->type && sh[j].k == e->k && sh[j].n == e->n) s = &sh[j];
        double t0 = tuner ? tn_tuner_elapsed(tuner) : 0;
        be_mm_case mc = {.type = e->type, .k = e->k, .n = e->n, .rows = e->rows,
                         .mats = s->n_mats ? s->mats : NULL, .n_mats = s->n_mats,
                         .rotate_bytes = e->family == TN_FAM_DECODE ? rotate : rotate / 4, .all_threads = rep->busy_start};
        tn_case c;
        st = b->ops->mm_case_new(b, &mc, &c, err);
        if (st == HN_ERR_UNSUPPORTED) { /* nothing to tune at this shape or call size: the defaults */
            st = HN_OK;
            hn_err_clear(err);
            continue;
        }
        if (st != HN_OK) break;
        e->kernel = c.kernel;
        snprintf(e->shape, sizeof e->shape, "%s", c.shape);
        if (opt.cache_only) {
            memset(&e->res, 0, sizeof e->res);
            for (int p = 0; p < c.n_params; p++) e->res.cfg[p] = c.params[p].values[c.params[p].def];
            if (!opt.force && tn_tuner_lookup(tuner, &c, e->res.cfg, &e->res.default_ns, &e->res.tuned_ns)) {
                e->res.cached = true;
                for (int p = 0; p < c.n_params; p++)
                    e->res.changed |= e->res.cfg[p] != c.params[p].values[c.params[p].def];
                e->tuned = true;
            } else {
                rep->n_missing++;
            }
        } else {
            st = tn_tune(tuner, &c, &e->res, err);
            e->tuned = st == HN_OK && !e->res.not_reached;
            rep->n_not_reached += e->res.not_reached;
        }
        if (e->tuned) {
            tn_cfg_str(&c, e->res.cfg, e->cfg, sizeof e->cfg);
            if (e->res.changed) b->ops->mm_case_params(b, &c, e->res.cfg, &e->params);
            else memset(&e->params, 0, sizeof e->params); /* the defaults: nothing to set */
            rep->n_cached += e->res.cached;
            rep->n_tuned += !e->res.cached;
            rep->n_partial += e->res.partial;
        }
        b->ops->mm_case_free(b, &c);
        e->secs = tn_tuner_elapsed(tuner) - t0;
    }
    if (opt.progress) fprintf(stderr, "\r%*s\r", 100, "");
    rep->busy = rep->n_tuned > 0 && rep->busy_start;
    if (tuner) {
        rep->elapsed_s = tn_tuner_elapsed(tuner);
        if (st == HN_OK && rep->n_tuned > 0 && !to.no_cache) {
            hn_status sv = tn_tuner_save(tuner, err);
            if (sv != HN_OK) {
                cache_st = sv;
                snprintf(rep->save_msg, sizeof rep->save_msg, "%s", err->msg);
            }
        }
    }
    tn_tuner_close(tuner);
    if (st == HN_OK && cache_st != HN_OK) { /* the results stand (tn_load_tune applies them); the error is the cache's */
        rep->not_saved = true;
        st = hn_errf(err, cache_st, "%s", rep->save_msg);
    }
    return st;
}

int tn_apply_report(be_backend *b, const tn_model_report *rep) {
    int set = 0;
    for (int i = 0; i < rep->n; i++) {
        const tn_model_entry *e = &rep->e[i];
        /* a shape's entries are set together once any differs from the defaults, so
         * that a call finds its own call size's entry, not a smaller one's */
        bool any = false;
        for (int j = 0; j < rep->n; j++) {
            const tn_model_entry *f = &rep->e[j];
            if (f->tuned && f->res.changed && f->type == e->type && f->k == e->k && f->n == e->n) any = true;
        }
        if (!any || !e->tuned) continue;
        if (b->ops->set_mm_params(b, e->type, e->k, e->n, e->min_rows, &e->params)) set += e->res.changed;
    }
    return set;
}

hn_status tn_load_tune(be_backend *b, const gguf_ctx *g, int n_threads, const char *who, hn_err *err) {
    if (tn_no_tune_env()) return HN_OK;
    tn_model_opts o = {.backend = b, .n_threads = n_threads, .progress = isatty(2) != 0};
    const char *bs = getenv("HONE_TUNE_BUDGET");
    if (bs && *bs) {
        char *end;
        double v = strtod(bs, &end);
        if (!*end && v > 0 && v <= 3600) o.budget_s = v;
    }
    tn_model_report rep;
    hn_status st = tn_tune_model(g, &o, &rep, err);
    if (st != HN_OK && rep.not_saved) {
        /* a cache that cannot be written costs the next start a new search, not this run its results */
        fprintf(stderr, "%s: the tuning cache could not be written (%s): the tuned parameters apply to this run only\n",
                who, rep.save_msg);
        hn_err_clear(err);
        st = HN_OK;
    }
    if (st == HN_OK) {
        int set = tn_apply_report(b, &rep);
        if (rep.n_tuned == 0 && rep.n_not_reached == 0)
            fprintf(stderr, "%s: kernel parameters from the tuning cache (%d shapes, %d differ from the defaults)\n",
                    who, rep.n_cached, set);
        else
            fprintf(stderr,
                    "%s: tuned %d kernel shapes for this machine in %.1f s (%d from the cache, %d differ from the "
                    "defaults%s)%s\n",
                    who, rep.n_tuned, rep.elapsed_s, rep.n_cached, set,
                    rep.n_partial ? ", some cut short by the budget" : "",
                    rep.not_saved ? "" : "; the next start reuses them (HONE_NO_TUNE=1 skips tuning)");
        if (rep.n_not_reached)
            fprintf(stderr, "%s: %d shapes were not reached within the budget: defaults now, tuned on a later start\n",
                    who, rep.n_not_reached);
        if (rep.busy)
            fprintf(stderr,
                    "%s: the machine was busy while tuning (load %.1f on %d CPUs); run `hone tune -m FILE --force` "
                    "when it is idle\n",
                    who, rep.load_avg, rep.usable_cpus);
    }
    tn_model_report_free(&rep);
    return st;
}
