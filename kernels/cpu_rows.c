/* The row pass of the chunked CPU backend: softmax and every row statistic in one visit.
 *
 * torch does the two matmuls (scores = Q K^T before, out = P V after); this file does what
 * lies between them.  A score row (at most a few KiB) is read once from L2 and then stays
 * in L1 while it is turned into probabilities and every statistic is read off it:
 *
 *   s_j += bias_j, m = max_j s_j             -- pass 1 (the only pass that misses L1;
 *                                               bias: 0, or -FLT_MAX on padding keys)
 *   e_j = exp(s_j - m), z = sum e_j,
 *   t  = sum e_j (s_j - m)                   -- pass 2
 *   p_j = e_j / z                            -- pass 3, in place: P @ V reads it next
 *   H  = ln z - t / z                        -- entropy, = -sum p ln p without a log per key
 *   class mass c = sum_j p_j [class_j = c]   -- C short passes over the row in L1
 *   offset mass o = p_{i+o}, argmax = first j with s_j = m
 *
 * torch's own softmax + max + dot product read the L x L map six times from L2; this reads
 * it once.  Plain C (no torch headers) so it compiles in about a second on first use; the
 * loops are written for `omp simd` so gcc/clang vectorise them (AVX2/AVX-512/NEON), and the
 * rows are shared out with `omp parallel for` on the OpenMP runtime torch already loaded.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp(x) for x <= 0, branch-free so it vectorises (Cephes' expf polynomial, ~1 ulp).
 * Below -87 the true value is under 1.7e-38 and is returned as 0, so masked keys
 * (scores near -FLT_MAX) get exactly zero probability. */
static inline float exp_nonpositive(float x)
{
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    const float round_magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float xc = x < -87.0f ? -87.0f : x;
    float t = xc * log2e + round_magic;
    float n = t - round_magic; /* round(x / ln 2) */
    float r = xc - n * ln2_hi - n * ln2_lo;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23; /* 2^n, n in [-126, 0] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < -87.0f ? 0.0f : y * scale;
}

/* One row: s (Lk scores, overwritten by probabilities) of query i; bias may be NULL.
 * class_mask: n_classes rows of mask_stride floats, the first Lk of each read. */
static void row_pass(float *restrict s, int64_t Lk, int64_t i, const float *restrict bias,
                     const float *restrict class_mask, int64_t mask_stride, int n_classes,
                     const int64_t *restrict offsets, int n_offsets, float *restrict entropy,
                     float *restrict class_mass, float *restrict offset_mass, int64_t *restrict argmax)
{
    /* -- pass 1: padding bias and row max */
    float m = -INFINITY;
    if (bias) {
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < Lk; j++) {
            float x = s[j] + bias[j];
            s[j] = x;
            m = x > m ? x : m;
        }
    } else {
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < Lk; j++)
            m = s[j] > m ? s[j] : m;
    }
    if (argmax) {
        int64_t a = 0;
        while (a < Lk - 1 && s[a] != m)
            a++;
        *argmax = a;
    }
    /* -- pass 2: exponentials, their sum z and sum e (s - m) */
    float z = 0.0f, t = 0.0f;
#pragma omp simd reduction(+ : z, t)
    for (int64_t j = 0; j < Lk; j++) {
        float x = s[j] - m;
        float e = exp_nonpositive(x);
        s[j] = e;
        z += e;
        t += e > 0.0f ? e * x : 0.0f; /* masked keys: 0, even if s - m overflowed */
    }
    /* -- pass 3: normalise in place (z >= 1: the max contributes exp(0) = 1) */
    float inv = 1.0f / z;
#pragma omp simd
    for (int64_t j = 0; j < Lk; j++)
        s[j] *= inv;
    if (entropy)
        *entropy = logf(z) - t * inv;
    /* -- statistics read off the row while it is in L1 */
    for (int c = 0; c < n_classes; c++) {
        const float *mask = class_mask + c * mask_stride;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < Lk; j++)
            acc += s[j] * mask[j];
        class_mass[c] = acc;
    }
    for (int o = 0; o < n_offsets; o++) {
        int64_t j = i + offsets[o];
        offset_mass[o] = (j >= 0 && j < Lk) ? s[j] : 0.0f;
    }
}

/* ---- the banded row pass (causal / sliding-window layouts) --------------------------------
 *
 * The same arithmetic as above, compiled without trapping math: a float compare may then be
 * turned into a select, so gcc vectorises the exponential pass (with trapping math, the
 * default, `x < -87 ? ...` stays a branch and the pass runs one float at a time, about 10x
 * slower).  Rows with an unlimited band (an encoder's) keep the plain pass above and its code
 * generation: their results are pinned bit for bit by the encoders' golden outputs, and
 * vectorised sums add in another order.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif

/* exp(x) for x <= 0, branch-free so it vectorises (Cephes' expf polynomial, ~1 ulp).
 * Below -87 the true value is under 1.7e-38 and is returned as 0, so masked keys
 * (scores near -FLT_MAX) get exactly zero probability. */
static inline float exp_nonpositive_band(float x)
{
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    const float round_magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float xc = x < -87.0f ? -87.0f : x;
    float t = xc * log2e + round_magic;
    float n = t - round_magic; /* round(x / ln 2) */
    float r = xc - n * ln2_hi - n * ln2_lo;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23; /* 2^n, n in [-126, 0] */
    union { int32_t i; float f; } pun = {.i = bits};
    float keep = x < -87.0f ? 0.0f : 1.0f;
    return y * pun.f * keep;
}

/* As row_pass (see there): one row: s (Lk scores, overwritten by probabilities) of query i; bias may be NULL.
 * class_mask: n_classes rows of mask_stride floats, the first Lk of each read. */
static void row_pass_band(float *restrict s, int64_t Lk, int64_t i, const float *restrict bias,
                     const float *restrict class_mask, int64_t mask_stride, int n_classes,
                     const int64_t *restrict offsets, int n_offsets, float *restrict entropy,
                     float *restrict class_mass, float *restrict offset_mass, int64_t *restrict argmax)
{
    /* -- pass 1: padding bias and row max */
    float m = -INFINITY;
    if (bias) {
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < Lk; j++) {
            float x = s[j] + bias[j];
            s[j] = x;
            m = x > m ? x : m;
        }
    } else {
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < Lk; j++)
            m = s[j] > m ? s[j] : m;
    }
    if (argmax) {
        int64_t a = 0;
        while (a < Lk - 1 && s[a] != m)
            a++;
        *argmax = a;
    }
    /* -- pass 2: exponentials, their sum z and sum e (s - m) */
    float z = 0.0f, t = 0.0f;
#pragma omp simd reduction(+ : z, t)
    for (int64_t j = 0; j < Lk; j++) {
        float x = s[j] - m;
        float e = exp_nonpositive_band(x);
        s[j] = e;
        z += e;
        float ex = e > 0.0f ? x : 0.0f;
        t += e * ex; /* masked keys: 0, even if s - m overflowed */
    }
    /* -- pass 3: normalise in place (z >= 1: the max contributes exp(0) = 1) */
    float inv = 1.0f / z;
#pragma omp simd
    for (int64_t j = 0; j < Lk; j++)
        s[j] *= inv;
    if (entropy)
        *entropy = logf(z) - t * inv;
    /* -- statistics read off the row while it is in L1 */
    for (int c = 0; c < n_classes; c++) {
        const float *mask = class_mask + c * mask_stride;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < Lk; j++)
            acc += s[j] * mask[j];
        class_mass[c] = acc;
    }
    for (int o = 0; o < n_offsets; o++) {
        int64_t j = i + offsets[o];
        offset_mass[o] = (j >= 0 && j < Lk) ? s[j] : 0.0f;
    }
}

/* The one entry point: one block of n heads, for every layout (an encoder's is a block of whole
 * maps: q0 = k0 = 0, left = right = -1).
 *
 * scores: (n, Lq, Lk), the scores of queries q0 .. q0+Lq-1 (absolute positions) against keys
 * k0 .. k0+Lk-1.  Query i sees keys max(0, i - left) .. min(seq_len - 1, i + right) (left or
 * right < 0: no limit), always itself included; only that part of its row is turned into
 * probabilities (exactly as `row_pass` does a whole row), the rest of the row is set to 0.
 * key_bias and class_mask start at key k0 (class_mask: n_classes rows of mask_stride floats).
 * Outputs: row i of head g at g * out_rows + (i - q0): entropy, class_mass (* n_classes),
 * offset_mass (* n_offsets), argmax (an absolute key position); entropy, argmax may be NULL.
 * threads: the OpenMP threads of the pass (explicit: a caller's own worker thread has its own
 * OpenMP settings, not those torch.set_num_threads gave the main thread). */
void bertscope_softmax_stats_band(float *scores, int64_t n, int64_t Lq, int64_t Lk, int64_t q0, int64_t k0,
                                  int64_t left, int64_t right, int64_t seq_len, const float *key_bias,
                                  const float *class_mask, int64_t mask_stride, int n_classes,
                                  const int64_t *offsets, int n_offsets, int64_t out_rows, float *entropy,
                                  float *class_mass, float *offset_mass, int64_t *argmax, int threads)
{
    int64_t rows = n * Lq;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < rows; r++) {
        int64_t g = r / Lq, i = q0 + r % Lq, o = g * out_rows + r % Lq;
        int64_t lo = left < 0 ? 0 : (i - left > 0 ? i - left : 0);
        int64_t hi = right < 0 ? seq_len - 1 : (i + right < seq_len - 1 ? i + right : seq_len - 1);
        int64_t a = lo - k0, b = hi - k0 + 1; /* the row's band in the block: [a, b) */
        if (a < 0)
            a = 0;
        if (b > Lk)
            b = Lk;
        float *s = scores + r * Lk;
        for (int64_t j = 0; j < a; j++)
            s[j] = 0.0f;
        for (int64_t j = b; j < Lk; j++)
            s[j] = 0.0f;
        int64_t am = 0;
        /* an unlimited band (an encoder's rows, whole maps): the plain row pass, whose code
         * generation pins the encoders' outputs bit for bit; a limited one: the vectorised pass */
        void (*pass)(float *restrict, int64_t, int64_t, const float *restrict, const float *restrict, int64_t,
                     int, const int64_t *restrict, int, float *restrict, float *restrict, float *restrict,
                     int64_t *restrict) = left < 0 && right < 0 ? row_pass : row_pass_band;
        pass(s + a, b - a, i - k0 - a, key_bias ? key_bias + a : 0, class_mask + a, mask_stride, n_classes,
             offsets, n_offsets, entropy ? entropy + o : 0, class_mass + o * n_classes,
             offset_mass + o * n_offsets, argmax ? &am : 0);
        if (argmax)
            argmax[o] = k0 + a + am;
    }
}

/* The norm-based twins' sums (Kobayashi et al. 2020; kernels/norms.py), a second visit of a block whose
 * rows are probabilities already (after bertscope_softmax_stats_band), separate from the row pass so that
 * the pass's code, and the statistics it gives, stay what they were.
 *
 * probs: (n, Lq, Lk); norms: n rows of norm_stride floats (head g's keys k0 .. k0+Lk-1, 0 on padding);
 * class_mask: n_classes rows of mask_stride floats. For row i of head g, at g * out_rows + (i - q0):
 * weighted[.] = sum_j p_j n_j and class_sums[. * n_classes + c] = sum_j p_j n_j [class_j = c]. */
void bertscope_norm_sums(const float *probs, int64_t n, int64_t Lq, int64_t Lk, const float *norms,
                         int64_t norm_stride, const float *class_mask, int64_t mask_stride, int n_classes,
                         int64_t out_rows, float *weighted, float *class_sums, int threads)
{
    int64_t rows = n * Lq;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < rows; r++) {
        int64_t g = r / Lq, o = g * out_rows + r % Lq;
        const float *restrict p = probs + r * Lk;
        const float *restrict w = norms + g * norm_stride;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < Lk; j++)
            acc += p[j] * w[j];
        weighted[o] = acc;
        for (int c = 0; c < n_classes; c++) {
            const float *restrict mask = class_mask + c * mask_stride;
            float cs = 0.0f;
#pragma omp simd reduction(+ : cs)
            for (int64_t j = 0; j < Lk; j++)
                cs += p[j] * w[j] * mask[j];
            class_sums[o * n_classes + c] = cs;
        }
    }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
