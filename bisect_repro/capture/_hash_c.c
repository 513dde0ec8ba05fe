/* The CPU kernel of bisect-repro's tensor hash, format 1 (defined in hash_format.py).
 *
 * Plain C with no Python or torch headers: called through ctypes on tensors' data pointers.
 * One entry point hashes a whole batch of byte buffers (a model's tensors) in one call: the
 * buffers' words are laid end to end, split into one contiguous range per thread, and each
 * thread adds the terms of its range into its own copy of the per-buffer lane sums, which are
 * added at the end. Sums modulo 2**32 do not depend on the order, so every split, vector width
 * and thread count gives the same lanes, bit for bit.
 *
 * Vectorised by function multiversioning: AVX2 and AVX-512 versions of the word loop are
 * compiled with per-function target attributes and chosen at run time from what the CPU (and
 * the operating system) supports, so one shared library runs on any x86-64 machine; nothing is
 * built with -march=native. Elsewhere a portable loop, which compilers may vectorise.
 *
 * The same pass can also take the linear sketch (sketch.py) of some of the buffers: br_hash_sketch.
 *
 * Where the guarantees stop: little-endian hosts only (the build fails elsewhere, and the torch-
 * op path takes over); the caller must keep every buffer alive and unchanged during the call.
 */

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "format 1 reads little-endian words: this kernel supports little-endian hosts only"
#endif

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define BR_X86 1
#include <immintrin.h>
#else
#define BR_X86 0
#endif

#if defined(__GNUC__)
#define BR_EXPORT __attribute__((visibility("default")))
#else
#define BR_EXPORT
#endif

/* The constants of format 1. Overridable only so that the tests can build a wrong kernel and
 * check that the property tests catch it. */
#ifndef BR_STEP
#define BR_STEP 0x9E3779B1u
#endif
#ifndef BR_SEED
#define BR_SEED 0x7F4A7C15u
#endif
#ifndef BR_MIX1
#define BR_MIX1 0x85EBCA6Bu
#endif
#ifndef BR_MIX2
#define BR_MIX2 0xC2B2AE35u
#endif
#ifndef BR_SHIFT1
#define BR_SHIFT1 16
#endif
#ifndef BR_SHIFT2
#define BR_SHIFT2 13
#endif
#ifndef BR_SHIFT3
#define BR_SHIFT3 16
#endif

#define BR_MAX_THREADS 64
/* Bytes ahead of the loads that the vector loops prefetch. The mix keeps the core busy enough that
 * the hardware prefetcher alone falls behind: on the development machine (best of 12, 1 GiB from
 * memory, one thread) 7.7 GB/s without, 9.8 at 1 KiB, 11.1 at 2 KiB, 12.2 at 4 KiB, 11.7 at
 * 8 KiB; from the L3 cache (64 MiB) 15.0 without and 21.9 at 4 KiB. Prefetches never fault, so
 * reaching past the end of a buffer is harmless. */
#ifndef BR_PREFETCH
#define BR_PREFETCH 4096
#endif

enum { LEVEL_PORTABLE = 0, LEVEL_AVX2 = 1, LEVEL_AVX512 = 2 };

static inline uint32_t mix(uint32_t x) {
    x ^= x >> BR_SHIFT1;
    x *= BR_MIX1;
    x ^= x >> BR_SHIFT2;
    x *= BR_MIX2;
    x ^= x >> BR_SHIFT3;
    return x;
}

/* Adds the terms of ``count`` whole words at ``src`` (any alignment), the first at position
 * ``first``, to ``lanes``. */
static void words_portable(const unsigned char *src, uint64_t first, size_t count, uint32_t lanes[2]) {
    uint32_t p = (uint32_t)first * BR_STEP + BR_SEED;
    uint32_t lane0 = 0, lane1 = 0;
    for (size_t k = 0; k < count; k++) {
        uint32_t w;
        memcpy(&w, src + 4 * k, 4);
        uint32_t x = mix(w ^ p);
        lane0 += x;
        lane1 += x * (p | 1u);
        p += BR_STEP;
    }
    lanes[0] += lane0;
    lanes[1] += lane1;
}

#if BR_X86

__attribute__((target("avx2"))) static inline __m256i mix_avx2(__m256i x) {
    const __m256i m1 = _mm256_set1_epi32((int)BR_MIX1), m2 = _mm256_set1_epi32((int)BR_MIX2);
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, BR_SHIFT1));
    x = _mm256_mullo_epi32(x, m1);
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, BR_SHIFT2));
    x = _mm256_mullo_epi32(x, m2);
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, BR_SHIFT3));
}

__attribute__((target("avx2"))) static uint32_t hsum_avx2(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return (uint32_t)_mm_cvtsi128_si32(s);
}

/* 16 words an iteration, as two independent 8-word streams (the multiplies' latency overlaps). */
__attribute__((target("avx2"))) static void words_avx2(const unsigned char *src, uint64_t first, size_t count, uint32_t lanes[2]) {
    size_t k = 0;
    if (count >= 16) {
        const __m256i one = _mm256_set1_epi32(1), step16 = _mm256_set1_epi32((int)(16u * BR_STEP));
        const __m256i ramp = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)BR_STEP));
        __m256i pa = _mm256_add_epi32(_mm256_set1_epi32((int)((uint32_t)first * BR_STEP + BR_SEED)), ramp);
        __m256i pb = _mm256_add_epi32(pa, _mm256_set1_epi32((int)(8u * BR_STEP)));
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, b0 = a0, b1 = a0;
        for (; k + 16 <= count; k += 16) {
            __builtin_prefetch(src + 4 * k + BR_PREFETCH, 0, 3);
            __m256i xa = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(src + 4 * k)), pa);
            __m256i xb = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(src + 4 * k + 32)), pb);
            xa = mix_avx2(xa);
            xb = mix_avx2(xb);
            a0 = _mm256_add_epi32(a0, xa);
            b0 = _mm256_add_epi32(b0, xb);
            a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(xa, _mm256_or_si256(pa, one)));
            b1 = _mm256_add_epi32(b1, _mm256_mullo_epi32(xb, _mm256_or_si256(pb, one)));
            pa = _mm256_add_epi32(pa, step16);
            pb = _mm256_add_epi32(pb, step16);
        }
        lanes[0] += hsum_avx2(_mm256_add_epi32(a0, b0));
        lanes[1] += hsum_avx2(_mm256_add_epi32(a1, b1));
    }
    words_portable(src + 4 * k, first + k, count - k, lanes);
}

__attribute__((target("avx512f"))) static inline __m512i mix_avx512(__m512i x) {
    const __m512i m1 = _mm512_set1_epi32((int)BR_MIX1), m2 = _mm512_set1_epi32((int)BR_MIX2);
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, BR_SHIFT1));
    x = _mm512_mullo_epi32(x, m1);
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, BR_SHIFT2));
    x = _mm512_mullo_epi32(x, m2);
    return _mm512_xor_si512(x, _mm512_srli_epi32(x, BR_SHIFT3));
}

/* 32 words an iteration, as two independent 16-word streams. */
__attribute__((target("avx512f"))) static void words_avx512(const unsigned char *src, uint64_t first, size_t count, uint32_t lanes[2]) {
    size_t k = 0;
    if (count >= 32) {
        const __m512i one = _mm512_set1_epi32(1), step32 = _mm512_set1_epi32((int)(32u * BR_STEP));
        const __m512i ramp = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                _mm512_set1_epi32((int)BR_STEP));
        __m512i pa = _mm512_add_epi32(_mm512_set1_epi32((int)((uint32_t)first * BR_STEP + BR_SEED)), ramp);
        __m512i pb = _mm512_add_epi32(pa, _mm512_set1_epi32((int)(16u * BR_STEP)));
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, b0 = a0, b1 = a0;
        for (; k + 32 <= count; k += 32) {
            __builtin_prefetch(src + 4 * k + BR_PREFETCH, 0, 3);
            __builtin_prefetch(src + 4 * k + BR_PREFETCH + 64, 0, 3);
            __m512i xa = _mm512_xor_si512(_mm512_loadu_si512((const void *)(src + 4 * k)), pa);
            __m512i xb = _mm512_xor_si512(_mm512_loadu_si512((const void *)(src + 4 * k + 64)), pb);
            xa = mix_avx512(xa);
            xb = mix_avx512(xb);
            a0 = _mm512_add_epi32(a0, xa);
            b0 = _mm512_add_epi32(b0, xb);
            a1 = _mm512_add_epi32(a1, _mm512_mullo_epi32(xa, _mm512_or_si512(pa, one)));
            b1 = _mm512_add_epi32(b1, _mm512_mullo_epi32(xb, _mm512_or_si512(pb, one)));
            pa = _mm512_add_epi32(pa, step32);
            pb = _mm512_add_epi32(pb, step32);
        }
        lanes[0] += (uint32_t)_mm512_reduce_add_epi32(_mm512_add_epi32(a0, b0));
        lanes[1] += (uint32_t)_mm512_reduce_add_epi32(_mm512_add_epi32(a1, b1));
    }
    words_avx2(src + 4 * k, first + k, count - k, lanes);  /* AVX-512F implies AVX2 on every CPU that has it */
}

#endif /* BR_X86 */

/* The best level this CPU and operating system support. */
BR_EXPORT int br_hash_best_level(void) {
#if BR_X86
    __builtin_cpu_init();
    /* __builtin_cpu_supports also checks that the OS saves the vector registers (XCR0). */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2"))
        return LEVEL_AVX512;
    if (__builtin_cpu_supports("avx2"))
        return LEVEL_AVX2;
#endif
    return LEVEL_PORTABLE;
}

static void hash_words(int level, const unsigned char *src, uint64_t first, size_t count, uint32_t lanes[2]) {
#if BR_X86
    if (level == LEVEL_AVX512) {
        words_avx512(src, first, count, lanes);
        return;
    }
    if (level == LEVEL_AVX2) {
        words_avx2(src, first, count, lanes);
        return;
    }
#endif
    (void)level;
    words_portable(src, first, count, lanes);
}

/* The linear sketch (defined in sketch.py, computed below): adds the sketch of ``n`` float32 values whose
 * first has the global index ``g`` to ``acc`` (k doubles), in element order per bucket. */
static void sketch_values(const float *x, uint64_t n, uint64_t g, uint64_t k, uint64_t seed, double *acc);

/* GOMP_parallel, the entry point of an OpenMP runtime (libgomp, or LLVM's libomp, which provides
 * it too): runs fn(data) on a team of threads, the caller among them, and returns when all are done. */
typedef void (*team_t)(void (*fn)(void *), void *data, unsigned threads, unsigned flags);

typedef struct {
    size_t count;
    const unsigned char *const *data;
    const uint64_t *nbytes;
    const uint64_t *offsets; /* offsets[t]: the first word of buffer t in the end-to-end layout; count + 1 of them */
    uint64_t total;          /* offsets[count] */
    uint64_t chunk;          /* words handed out at a time */
    uint64_t next;           /* the next chunk to hand out (atomic) */
    uint32_t *out;           /* the caller's lanes: the first thread's sums */
    uint32_t *partial;       /* the other threads' sums: (slots - 1) * count pairs, zeroed */
    unsigned slots;          /* threads that may take part */
    unsigned taken;          /* threads that have (atomic) */
    int level;
    const uint64_t *sketch_at; /* per buffer: the global index of its first element, or BR_NO_SKETCH; NULL: none sketched */
    uint64_t k, seed;          /* the sketch's width and seed */
    double *segments;          /* k doubles per (chunk c, buffer t) piece, at index c + t: the sketch's partial sums */
} batch_t;

#define BR_NO_SKETCH UINT64_MAX
#define BR_SKETCH_STEP 4096 /* words hashed, then sketched, at a time */

/* Adds the terms of words [begin, end) of the end-to-end layout to ``lanes``. */
static void hash_range(const batch_t *b, uint64_t begin, uint64_t end, uint32_t *out) {
    size_t lo = 0, hi = b->count; /* the first buffer that ends after begin */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (b->offsets[mid + 1] <= begin)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t t = lo; t < b->count && b->offsets[t] < end; t++) {
        uint64_t start = b->offsets[t], stop = b->offsets[t + 1];
        uint64_t first = (begin > start ? begin : start) - start;
        uint64_t last = (end < stop ? end : stop) - start; /* one past */
        uint64_t whole = b->nbytes[t] / 4;
        uint32_t lanes[2] = {0, 0};
        uint64_t upto = last < whole ? last : whole;
        if (b->sketch_at != NULL && b->sketch_at[t] != BR_NO_SKETCH) { /* each 16 KiB hashed, then sketched from the L1 cache */
            double *sums = b->segments + (begin / b->chunk + t) * b->k;
            for (uint64_t at = first; at < upto; at += BR_SKETCH_STEP) {
                uint64_t n = upto - at < BR_SKETCH_STEP ? upto - at : BR_SKETCH_STEP;
                hash_words(b->level, b->data[t] + 4 * at, at, (size_t)n, lanes);
                sketch_values((const float *)(const void *)(b->data[t] + 4 * at), n, b->sketch_at[t] + at, b->k, b->seed, sums);
            }
        } else if (first < whole) {
            hash_words(b->level, b->data[t] + 4 * first, first, (size_t)(upto - first), lanes);
        }
        if (last > whole) { /* the zero-padded last word */
            uint32_t w = 0;
            memcpy(&w, b->data[t] + 4 * whole, (size_t)(b->nbytes[t] % 4));
            uint32_t p = (uint32_t)whole * BR_STEP + BR_SEED;
            uint32_t x = mix(w ^ p);
            lanes[0] += x;
            lanes[1] += x * (p | 1u);
        }
        out[2 * t] += lanes[0];
        out[2 * t + 1] += lanes[1];
    }
}

/* One thread's part: its own sums, and chunks until none is left. A thread that gets less of the
 * CPU (a machine shared with other work, a team thread that starts late) takes fewer chunks. */
static void take_part(void *arg) {
    batch_t *b = (batch_t *)arg;
    unsigned slot = __atomic_fetch_add(&b->taken, 1, __ATOMIC_RELAXED);
    if (slot >= b->slots)
        return; /* not expected: a runtime never gives more threads than asked */
    uint32_t *lanes = slot == 0 ? b->out : b->partial + (size_t)(slot - 1) * 2 * b->count;
    for (;;) {
        uint64_t c = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
        if (c >= (b->total + b->chunk - 1) / b->chunk)
            return;
        uint64_t begin = c * b->chunk;
        uint64_t end = b->total - begin > b->chunk ? begin + b->chunk : b->total;
        hash_range(b, begin, end, lanes);
    }
}

static void *take_part_thread(void *arg) {
    take_part(arg);
    return NULL;
}

/* Lane sums of ``count`` buffers into ``lanes`` (``2 * count`` words, overwritten).
 *
 * The buffers' words, end to end, are handed out ``chunk_words`` at a time to ``threads``
 * threads at most, the caller's included, and no more threads than chunks. With ``team``
 * (GOMP_parallel of the OpenMP runtime that torch runs its intra-op threads on) those are the
 * runtime's threads; without it, threads started here for the call. ``level``: -1 for the
 * best this CPU supports, else a level to force (the tests check every version on one machine).
 * Returns 0, or -1 if ``level`` is not supported here, -2 if memory ran out. */
static int hash_batch(size_t count, const void *const *data, const uint64_t *nbytes, uint32_t *lanes, int threads,
                      uint64_t chunk_words, int level, void *team, const uint64_t *sketch_at, uint64_t k, uint64_t seed, double *sketches);

BR_EXPORT int br_hash_lanes(size_t count, const void *const *data, const uint64_t *nbytes, uint32_t *lanes, int threads,
                            uint64_t chunk_words, int level, void *team) {
    return hash_batch(count, data, nbytes, lanes, threads, chunk_words, level, team, NULL, 0, 0, NULL);
}

/* br_hash_lanes, and in the same pass the sketches of the buffers with ``sketch_at[t] != BR_NO_SKETCH``
 * (float32 values, the first at global index ``sketch_at[t]``) into ``sketches`` (``k`` doubles per
 * buffer, overwritten; zeros for the others). Each piece of a buffer that one chunk covers is sketched
 * into its own partial sums, right after it is hashed (from the cache), and the pieces are added in
 * order at the end: the sums do not depend on the threads or on which took which chunk. Returns as
 * br_hash_lanes; -3 for ``k == 0``, or a seed other than the first one given. */
BR_EXPORT int br_hash_sketch(size_t count, const void *const *data, const uint64_t *nbytes, uint32_t *lanes, int threads,
                             uint64_t chunk_words, int level, void *team, const uint64_t *sketch_at, uint64_t k, uint64_t seed,
                             double *sketches) {
    return hash_batch(count, data, nbytes, lanes, threads, chunk_words, level, team, sketch_at, k, seed, sketches);
}

static int sketch_ready(uint64_t k, uint64_t seed);

static int hash_batch(size_t count, const void *const *data, const uint64_t *nbytes, uint32_t *lanes, int threads,
                      uint64_t chunk_words, int level, void *team, const uint64_t *sketch_at, uint64_t k, uint64_t seed, double *sketches) {
    int best = br_hash_best_level();
    if (level < 0)
        level = best;
    if (level > best)
        return -1;
    if (sketch_at != NULL && sketch_ready(k, seed) != 0)
        return -3;
    memset(lanes, 0, 2 * count * sizeof(uint32_t));
    if (sketch_at != NULL)
        memset(sketches, 0, count * k * sizeof(double));
    if (count == 0)
        return 0;
    uint64_t *offsets = (uint64_t *)malloc((count + 1) * sizeof(uint64_t));
    if (offsets == NULL)
        return -2;
    offsets[0] = 0;
    for (size_t t = 0; t < count; t++)
        offsets[t + 1] = offsets[t] + (nbytes[t] + 3) / 4;
    batch_t b = {count, (const unsigned char *const *)data, nbytes, offsets, offsets[count], chunk_words ? chunk_words : 1, 0,
                 lanes, NULL, 1, 0, level, NULL, k, seed, NULL};

    uint64_t chunks = (b.total + b.chunk - 1) / b.chunk;
    if (sketch_at != NULL) { /* pieces at c + t, below chunks + count: calloc maps large tables lazily, so untouched ones cost nothing */
        b.segments = (double *)calloc((size_t)(chunks + count) * k, sizeof(double));
        if (b.segments == NULL) {
            free(offsets);
            return -2;
        }
        b.sketch_at = sketch_at;
    }
    unsigned n = threads < 1 ? 1 : threads > BR_MAX_THREADS ? BR_MAX_THREADS : (unsigned)threads;
    if (n > chunks) /* no more threads than chunks: small batches stay on the caller's thread */
        n = chunks ? (unsigned)chunks : 1;
    if (n > 1) {
        b.partial = (uint32_t *)calloc((size_t)(n - 1) * 2 * count, sizeof(uint32_t));
        if (b.partial == NULL)
            n = 1;
    }
    b.slots = n;
    if (n > 1 && team != NULL) {
        ((team_t)team)(take_part, &b, n, 0);
    } else {
        pthread_t ids[BR_MAX_THREADS];
        int started[BR_MAX_THREADS] = {0};
        for (unsigned i = 1; i < n; i++)
            started[i] = pthread_create(&ids[i], NULL, take_part_thread, &b) == 0; /* if not, the others take its chunks */
        take_part(&b);
        for (unsigned i = 1; i < n; i++)
            if (started[i])
                pthread_join(ids[i], NULL);
    }
    for (unsigned i = 1; i < n; i++) {
        const uint32_t *mine = b.partial + (size_t)(i - 1) * 2 * count;
        for (size_t k = 0; k < 2 * count; k++)
            lanes[k] += mine[k];
    }
    for (size_t t = 0; b.segments != NULL && t < count; t++) { /* the pieces, added in order */
        if (sketch_at[t] == BR_NO_SKETCH || offsets[t + 1] == offsets[t])
            continue;
        for (uint64_t c = offsets[t] / b.chunk; c <= (offsets[t + 1] - 1) / b.chunk; c++) {
            const double *piece = b.segments + (c + t) * k;
            for (uint64_t j = 0; j < k; j++)
                sketches[t * k + j] += piece[j];
        }
    }
    free(b.segments);
    free(b.partial);
    free(offsets);
    return 0;
}


/* The linear sketch of float32 values (defined in sketch.py): the element at global index g adds
 * sign(g) * x, in double, to bucket g % k, where sign(g) = s(B) * T[(g % 2^16 + r(B)) % 2^16] for the
 * block B = g / 2^16: s(B) and r(B) the top bit and the low 16 bits of mix(B ^ seed), T[j] the top bit
 * of mix(j ^ seed ^ BR_TABLE_KEY). The signs are kept as float32 sign bits (the table holds T's, s(B)
 * is XORed in per span) and applied to the values' own sign bits: exact, like the product it equals,
 * and 4 bytes of table an element. Within a block the signs are read from T in order, so each span is a
 * plain loop over consecutive buckets. */
#define BR_BLOCK_BITS 16
#define BR_BLOCK (1u << BR_BLOCK_BITS)
#define BR_TABLE_KEY 0x7AB1E5ULL
#define BR_SIGN 0x80000000u

static inline uint64_t br_mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint32_t br_table[BR_BLOCK]; /* T as sign bits: BR_SIGN for -1, 0 for +1 */
static uint64_t br_table_seed;
static pthread_once_t br_table_once = PTHREAD_ONCE_INIT;
static int br_span_level; /* 1: the AVX2 span loop */

static void br_fill_table(void) {
    for (uint64_t j = 0; j < BR_BLOCK; j++) br_table[j] = (br_mix(j ^ br_table_seed ^ BR_TABLE_KEY) >> 63) ? BR_SIGN : 0u;
#if BR_X86
    br_span_level = br_hash_best_level() >= LEVEL_AVX2;
#endif
}

/* The table for ``seed``: the first seed given fills it (sketch.py passes one constant); 0, or -1 for
 * ``k == 0`` or another seed. */
static int sketch_ready(uint64_t k, uint64_t seed) {
    if (k == 0) return -1;
    uint64_t none = 0;
    __atomic_compare_exchange_n(&br_table_seed, &none, seed, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    pthread_once(&br_table_once, br_fill_table);
    return seed == br_table_seed ? 0 : -1;
}

/* Adds n values (from x, their signs from ``signs``, in order) to the buckets from ``column`` on,
 * row after row of k buckets; returns the column after the last. */
static uint64_t sketch_rows_portable(double *acc, uint64_t k, uint64_t column, const uint32_t *signs, const float *x, uint64_t n,
                                     uint32_t flip) {
    for (uint64_t j = 0; j < n; j++) {
        uint32_t w;
        float f;
        memcpy(&w, x + j, 4);
        w ^= signs[j] ^ flip;
        memcpy(&f, &w, 4);
        acc[column] += (double)f;
        if (++column == k) column = 0;
    }
    return column;
}

#if BR_X86
/* The same sums, eight values a step along each row: each bucket's sum in the same order, so the same bits. */
__attribute__((target("avx2"))) static uint64_t sketch_rows_avx2(double *acc, uint64_t k, uint64_t column, const uint32_t *signs,
                                                                 const float *x, uint64_t n, uint32_t flip) {
    const __m256i f = _mm256_set1_epi32((int)flip);
    while (n > 0) {
        uint64_t span = k - column < n ? k - column : n, j = 0;
        double *a = acc + column;
        for (; j + 8 <= span; j += 8) {
            __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + j)),
                                         _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(const void *)(signs + j)), f));
            __m256 v = _mm256_castsi256_ps(w);
            _mm256_storeu_pd(a + j, _mm256_add_pd(_mm256_loadu_pd(a + j), _mm256_cvtps_pd(_mm256_castps256_ps128(v))));
            _mm256_storeu_pd(a + j + 4, _mm256_add_pd(_mm256_loadu_pd(a + j + 4), _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1))));
        }
        sketch_rows_portable(a + j, span - j, 0, signs + j, x + j, span - j, flip); /* the row's last few: no wrap within */
        column = column + span == k ? 0 : column + span;
        signs += span;
        x += span;
        n -= span;
    }
    return column;
}
#endif

static void sketch_values(const float *x, uint64_t n, uint64_t g, uint64_t k, uint64_t seed, double *acc) {
    uint64_t column = g % k;
    while (n > 0) { /* one block of 2^16 global indices at a time: one sign s(B), one rotation r(B) of the table */
        uint64_t z = br_mix((g >> BR_BLOCK_BITS) ^ seed);
        uint32_t flip = (z >> 63) ? BR_SIGN : 0u;
        uint64_t at = g & (BR_BLOCK - 1), slot = (at + z) & (BR_BLOCK - 1);
        uint64_t inside = BR_BLOCK - at < n ? BR_BLOCK - at : n;
        uint64_t first = BR_BLOCK - slot < inside ? BR_BLOCK - slot : inside; /* up to the end of the table, then from its start */
#if BR_X86
        if (br_span_level) {
            column = sketch_rows_avx2(acc, k, column, br_table + slot, x, first, flip);
            column = sketch_rows_avx2(acc, k, column, br_table, x + first, inside - first, flip);
        } else
#endif
        {
            column = sketch_rows_portable(acc, k, column, br_table + slot, x, first, flip);
            column = sketch_rows_portable(acc, k, column, br_table, x + first, inside - first, flip);
        }
        x += inside;
        g += inside;
        n -= inside;
    }
}

/* The sketches of ``count`` float32 buffers, one thread: element i of buffer t has the global index
 * offset[t] + i; ``out``: k doubles per buffer, added to (the caller zeroes it). 0, or -2 for
 * ``k == 0`` or another seed than the first given. */
BR_EXPORT int br_sketch_f32(size_t count, const float *const *data, const uint64_t *numel, const uint64_t *offset, uint64_t k,
                            uint64_t seed, double *out) {
    if (sketch_ready(k, seed) != 0) return k == 0 ? -1 : -2;
    for (size_t t = 0; t < count; t++) sketch_values(data[t], numel[t], offset[t], k, seed, out + t * k);
    return 0;
}
