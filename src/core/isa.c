/* isa.c: the CPU-feature probe (see isa.h). */
#include "isa.h"

#include <pthread.h>
#include <stdbool.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define ISA_X86 1
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

static const char *const k_names[HN_ISA_COUNT] = {
    "sse4.2",   "avx",        "avx2",       "fma",        "f16c",     "avx512f",
    "avx512bw", "avx512vl",   "avx512vnni", "avx512bf16", "avx-vnni", "amx-tile",
    "amx-int8", "amx-bf16",   "neon",       "dotprod",    "i8mm",     "sve",
};

#ifdef ISA_X86
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

static uint32_t detect(void) {
    uint32_t f = 0;
#ifdef ISA_X86
    unsigned a, b, c, d;
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 1 || !__get_cpuid(1, &a, &b, &c, &d)) return 0;
    if ((c >> 20) & 1) f |= HN_ISA_SSE42;
    bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    bool ymm = (xcr0 & 0x6) == 0x6;          /* SSE + AVX state */
    bool zmm = ymm && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    bool tmm = (xcr0 & 0x60000) == 0x60000;  /* XTILECFG + XTILEDATA */
    if (!(avx && ymm)) return f;
    f |= HN_ISA_AVX;
    if ((c >> 12) & 1) f |= HN_ISA_FMA;
    if ((c >> 29) & 1) f |= HN_ISA_F16C;
    if (max_leaf < 7) return f;
    __cpuid_count(7, 0, a, b, c, d);
    unsigned sub = a;
    if ((b >> 5) & 1) f |= HN_ISA_AVX2;
    if (zmm && ((b >> 16) & 1)) f |= HN_ISA_AVX512F;
    if (zmm && ((b >> 30) & 1)) f |= HN_ISA_AVX512BW;
    if (zmm && ((b >> 31) & 1)) f |= HN_ISA_AVX512VL;
    if (zmm && ((c >> 11) & 1)) f |= HN_ISA_AVX512VNNI;
    if (tmm && ((d >> 24) & 1)) f |= HN_ISA_AMX_TILE;
    if (tmm && ((d >> 25) & 1)) f |= HN_ISA_AMX_INT8;
    if (tmm && ((d >> 22) & 1)) f |= HN_ISA_AMX_BF16;
    if (sub >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        if ((a >> 4) & 1) f |= HN_ISA_AVXVNNI;
        if (zmm && ((a >> 5) & 1)) f |= HN_ISA_AVX512BF16;
    }
#elif defined(__aarch64__)
    f |= HN_ISA_NEON; /* Advanced SIMD is mandatory on AArch64 */
#ifdef __linux__
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
#ifdef HWCAP_ASIMDDP
    if (hw & HWCAP_ASIMDDP) f |= HN_ISA_DOTPROD;
#endif
#ifdef HWCAP_SVE
    if (hw & HWCAP_SVE) f |= HN_ISA_SVE;
#endif
#ifdef HWCAP2_I8MM
    if (hw2 & HWCAP2_I8MM) f |= HN_ISA_I8MM;
#endif
    (void)hw;
    (void)hw2;
#endif
#endif
    return f;
}

static uint32_t g_isa;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void probe_once(void) { g_isa = detect(); }

uint32_t hn_isa(void) {
    pthread_once(&g_once, probe_once);
    return g_isa;
}

const char *hn_isa_name(int i) { return i >= 0 && i < HN_ISA_COUNT ? k_names[i] : NULL; }
