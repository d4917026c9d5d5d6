/* pack.c: the registry of packed-weight kernels (see pack.h). It walks the
 * kernel tables the pack_*.c files export, in a fixed order, and keeps the
 * entries this CPU runs and whose activation type is the dot registry's for
 * the weight type. */
#include "pack.h"

#include <stdbool.h>
#include <stddef.h>

#include "dot.h"

static int tables(const cpu_pack_table **out) {
    int n = 0;
    out[n++] = &cpu_pack_table_0;
    out[n++] = &cpu_pack_table_k;
#if defined(__x86_64__)
    out[n++] = &cpu_pack_table_0_x86;
    out[n++] = &cpu_pack_table_k_x86;
#endif
#if defined(__aarch64__)
    out[n++] = &cpu_pack_table_0_arm;
    out[n++] = &cpu_pack_table_k_arm;
#endif
    return n;
}

static bool isa_ok(unsigned isa) {
    const cpu_features *f = cpu_dot_features();
    unsigned have = 0;
    if (f->avx2 && f->fma && f->f16c) {
        have |= CPU_ISA_AVX2;
        if (f->avx_vnni) have |= CPU_ISA_AVXVNNI;
        if (f->avx512f && f->avx512bw) {
            have |= CPU_ISA_AVX512;
            if (f->avx512vnni) have |= CPU_ISA_VNNI512;
        }
    }
    if (f->neon) {
        have |= CPU_ISA_NEON;
        if (f->dotprod) have |= CPU_ISA_DOTPROD;
        if (f->dotprod && f->i8mm) have |= CPU_ISA_I8MM;
    }
    return (isa & ~have) == 0;
}

/* A kernel is usable only while it reads what the dot registry's converter writes. */
static bool usable(const cpu_pack_kernel *p, qt_type t) {
    if (p->wtype != t || !isa_ok(p->isa)) return false;
    const cpu_dot_kernel *d = cpu_dot_best(t);
    return d && d->act_type == p->act_type;
}

int cpu_pack_variants(qt_type t, const cpu_pack_kernel **out, int cap) {
    const cpu_pack_table *tab[4];
    int nt = tables(tab), n = 0;
    for (int i = 0; i < nt; i++)
        for (int j = 0; j < tab[i]->n; j++) {
            if (!usable(&tab[i]->k[j], t)) continue;
            if (n < cap) out[n] = &tab[i]->k[j];
            n++;
        }
    return n;
}

const cpu_pack_kernel *cpu_pack_best(qt_type t, int64_t k) {
    const cpu_pack_table *tab[4];
    int nt = tables(tab);
    const cpu_pack_kernel *best = NULL;
    /* a layout's reference (unpack + reference dot) is never worth repacking for */
    for (int i = 0; i < nt; i++)
        for (int j = 0; j < tab[i]->n; j++) {
            const cpu_pack_kernel *p = &tab[i]->k[j];
            if (usable(p, t) && cpu_pack_fits(p, k) && cpu_pack_ref(t, p->layout) != p) best = p;
        }
    return best;
}

const cpu_pack_kernel *cpu_pack_ref(qt_type t, int layout) {
    const cpu_pack_table *tab[4];
    int nt = tables(tab);
    /* the first entry of a layout in the portable tables is its reference */
    for (int i = 0; i < nt; i++)
        for (int j = 0; j < tab[i]->n; j++) {
            const cpu_pack_kernel *p = &tab[i]->k[j];
            if (p->layout == layout && p->isa == 0 && usable(p, t)) return p;
        }
    return NULL;
}
