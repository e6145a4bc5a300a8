/*
 * Word2Vec's reference training loop (skip-gram and CBOW with negative sampling), one corpus chunk per call.
 *
 * This is the algorithm of the C tool (word2vec.c) and gensim: every (context, centre) pair (CBOW: every centre
 * word) draws its own K negatives and updates the two tables at once with plain SGD, so each pair sees the effect
 * of the previous one. lmforge.embeddings.word2vec calls `sgns_train_chunk` from several Python threads through
 * ctypes, which releases the GIL: the threads update the shared tables without locks (Hogwild!, as the C tool).
 *
 * Random numbers come from one splitmix64 stream per call, seeded by the caller (seed, epoch, chunk), so a chunk's
 * subsampling, windows and negatives do not depend on which thread runs it.
 *
 * Differences from the C tool, all deliberate: the sigmoid and the loss are computed exactly (no 1,000-slot exp
 * table, no clipping at |f| > 6); negatives come from an exact alias table (Vose) of the noise distribution, not a
 * table of 10^8 slots; the learning rate decays linearly word by word inside the chunk.
 *
 * It is loaded with ctypes, not imported; the module init below exists only because the build makes a Python
 * extension file (and some linkers insist on its init symbol).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#define SGNS_EXPORT __declspec(dllexport)
#else
#define SGNS_EXPORT __attribute__((visibility("default")))
#endif

/* One build runs well on any x86-64 CPU: GCC compiles the hot function for AVX-512, AVX2 and the baseline and
 * picks one when the library is loaded. Elsewhere the compiler's default target is used. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define SGNS_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SGNS_CLONES
#endif

static inline uint64_t next_u64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline double next_unit(uint64_t *state) { /* uniform in [0, 1) */
    return (double)(next_u64(state) >> 11) * (1.0 / 9007199254740992.0);
}

static inline int64_t draw_noise(uint64_t *state, const double *prob, const int64_t *alias, int64_t vocab) {
    double u = next_unit(state) * (double)vocab;
    int64_t k = (int64_t)u;
    if (k >= vocab) k = vocab - 1;
    return (u - (double)k) < prob[k] ? k : alias[k];
}

static inline float dot(const float *restrict a, const float *restrict b, int64_t n) {
    /* eight partial sums: the compiler vectorises this without reassociating a single sum */
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    float total = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) total += a[i] * b[i];
    return total;
}

static inline void axpy(float *restrict y, float a, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* One target (label 1: the centre word; 0: a negative) against input vector l1: accumulates the input's error in
 * neu1e and updates the target's output vector. The target's loss, softplus(-f) for label 1 and softplus(f) for
 * label 0, is max(x, 0) + log(1 + e^-|x|): the first part is returned, the factor (1 + e^-|x|) multiplies *prod,
 * so that a pair's K + 1 terms take one logarithm. */
static inline float score_target(const float *l1, float *restrict l2, float *restrict neu1e, int64_t dim,
                                 float label, float lr, float *prod) {
    float f = dot(l1, l2, dim);
    float e = expf(-fabsf(f));  /* sigma(f) and the loss from one exp */
    float sig = f >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
    float g = (label - sig) * lr;
    axpy(neu1e, g, l2, dim);
    axpy(l2, g, l1, dim);
    *prod *= 1.0f + e;  /* each factor is in (1, 2]: fold the product into the sum before it could overflow */
    float fold = 0.0f;
    if (*prod > 1e30f) {
        fold = logf(*prod);
        *prod = 1.0f;
    }
    float x = label > 0.5f ? -f : f;
    return (x > 0 ? x : 0.0f) + fold;
}

/* Input vector l1 against the centre word (label 1) and K negatives drawn for it (label 0; a draw equal to the
 * word is skipped, as in the C tool): neu1e gets the input's error (zeroed first), the targets' output vectors
 * are updated, and the pair's loss is returned. */
static inline double score_word(const float *l1, int64_t word, float *syn1, float *restrict neu1e, int64_t dim,
                                float lr, uint64_t *state, const double *noise_prob, const int64_t *noise_alias,
                                int64_t vocab, int64_t negative) {
    memset(neu1e, 0, sizeof(float) * (size_t)dim);
    float prod = 1.0f;
    float hinge = score_target(l1, syn1 + word * dim, neu1e, dim, 1.0f, lr, &prod);
    for (int64_t d = 0; d < negative; d++) {
        int64_t target = draw_noise(state, noise_prob, noise_alias, vocab);
        if (target == word) continue;
        hinge += score_target(l1, syn1 + target * dim, neu1e, dim, 0.0f, lr, &prod);
    }
    return (double)hinge + log((double)prod);
}

/*
 * Train on one chunk of consecutive sentences.
 *
 * ids, sentence: (n,) vocabulary ids and the sentence number of each (windows stop where it changes).
 * keep_prob: (vocab,) probability of keeping each occurrence of a word (subsampling), or NULL to keep all.
 * noise_prob, noise_alias: (vocab,) Vose alias table of the noise distribution (sgns_build_alias).
 * The learning rate goes linearly from lr_start (first word of the chunk) to lr_end (after its last word),
 * following the word's position in the chunk before subsampling.
 * out[0] += summed loss, out[1] += pairs (skip-gram) or centre words with a context (CBOW).
 * Returns 0, or -1 when memory runs out.
 */
SGNS_EXPORT SGNS_CLONES int sgns_train_chunk(float *syn0, float *syn1, int64_t vocab, int64_t dim,
                                             const int64_t *ids, const int64_t *sentence, int64_t n,
                                             const double *keep_prob, const double *noise_prob,
                                             const int64_t *noise_alias, int64_t window, int64_t negative,
                                             int32_t cbow, double lr_start, double lr_end, uint64_t seed,
                                             double *out) {
    int64_t *kept = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    int64_t *sent = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    float *lrs = (float *)malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    float *neu1 = (float *)calloc((size_t)dim, sizeof(float));
    float *neu1e = (float *)calloc((size_t)dim, sizeof(float));
    if (!kept || !sent || !lrs || !neu1 || !neu1e) {
        free(kept); free(sent); free(lrs); free(neu1); free(neu1e);
        return -1;
    }
    uint64_t state = seed;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (keep_prob != NULL && keep_prob[ids[i]] < 1.0 && next_unit(&state) >= keep_prob[ids[i]]) continue;
        kept[m] = ids[i];
        sent[m] = sentence[i];
        lrs[m] = (float)(lr_start + (lr_end - lr_start) * ((double)i / (double)(n > 0 ? n : 1)));
        m++;
    }
    double loss = 0.0, count = 0.0;
    for (int64_t i = 0; i < m; i++) {
        int64_t word = kept[i];
        float lr = lrs[i];
        int64_t b = 1 + (int64_t)(next_u64(&state) % (uint64_t)window);  /* the dynamic window, 1..W */
        int64_t lo = i - b < 0 ? 0 : i - b, hi = i + b >= m ? m - 1 : i + b;
        while (sent[lo] != sent[i]) lo++;
        while (sent[hi] != sent[i]) hi--;
        if (!cbow) {
            for (int64_t j = lo; j <= hi; j++) {
                if (j == i) continue;
                float *l1 = syn0 + kept[j] * dim;
                loss += score_word(l1, word, syn1, neu1e, dim, lr, &state, noise_prob, noise_alias, vocab, negative);
                axpy(l1, 1.0f, neu1e, dim);
                count += 1.0;
            }
        } else {
            int64_t cw = hi - lo;  /* context words: the window without the centre */
            if (cw == 0) continue;
            memset(neu1, 0, sizeof(float) * (size_t)dim);
            for (int64_t j = lo; j <= hi; j++)
                if (j != i) axpy(neu1, 1.0f, syn0 + kept[j] * dim, dim);
            float inv = 1.0f / (float)cw;
            for (int64_t k = 0; k < dim; k++) neu1[k] *= inv;
            loss += score_word(neu1, word, syn1, neu1e, dim, lr, &state, noise_prob, noise_alias, vocab, negative);
            /* the error of the mean goes unscaled to every context word, as the C tool and gensim (cbow_mean=1) */
            for (int64_t j = lo; j <= hi; j++)
                if (j != i) axpy(syn0 + kept[j] * dim, 1.0f, neu1e, dim);
            count += 1.0;
        }
    }
    out[0] += loss;
    out[1] += count;
    free(kept); free(sent); free(lrs); free(neu1); free(neu1e);
    return 0;
}

/* Vose's alias method: prob/alias (vocab,) from probabilities p (vocab,) summing to 1. Returns 0, or -1 when
 * memory runs out. */
SGNS_EXPORT int sgns_build_alias(const double *p, int64_t vocab, double *prob, int64_t *alias) {
    int64_t *small = (int64_t *)malloc(sizeof(int64_t) * (size_t)vocab);
    int64_t *large = (int64_t *)malloc(sizeof(int64_t) * (size_t)vocab);
    double *scaled = (double *)malloc(sizeof(double) * (size_t)vocab);
    if (!small || !large || !scaled) {
        free(small); free(large); free(scaled);
        return -1;
    }
    int64_t ns = 0, nl = 0;
    for (int64_t i = 0; i < vocab; i++) {
        scaled[i] = p[i] * (double)vocab;
        alias[i] = i;
        if (scaled[i] < 1.0) small[ns++] = i; else large[nl++] = i;
    }
    while (ns > 0 && nl > 0) {
        int64_t s = small[--ns], l = large[--nl];
        prob[s] = scaled[s];
        alias[s] = l;
        scaled[l] = (scaled[l] + scaled[s]) - 1.0;
        if (scaled[l] < 1.0) small[ns++] = l; else large[nl++] = l;
    }
    while (nl > 0) prob[large[--nl]] = 1.0;
    while (ns > 0) prob[small[--ns]] = 1.0;  /* only rounding leaves these */
    free(small); free(large); free(scaled);
    return 0;
}

static struct PyModuleDef sgns_module = {PyModuleDef_HEAD_INIT, "_sgns",
                                         "Word2Vec's per-pair training loop, loaded with ctypes.", -1, NULL};

PyMODINIT_FUNC PyInit__sgns(void) { return PyModule_Create(&sgns_module); }
