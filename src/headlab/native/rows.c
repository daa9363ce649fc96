/* headlab's row kernels: the per-row work of head statistics, in one pass over each row while
 * it sits in the L1 cache (torch runs each step as its own pass over a whole block).
 *
 * Built on first use by headlab.native (cc -O3 -march=native -fopenmp), loaded by ctypes.
 * Plain C99, no Python or torch headers: every array is a pointer plus sizes, contiguous,
 * row-major. Each function handles the slice [first, last) of its outer loop, split across
 * OpenMP threads. torch is loaded first, so the library's libgomp.so.1 is torch's own: the
 * same threads (waiting, spinning, right after torch's last operation) take the work. Built
 * without OpenMP, the loops run on the calling thread and Python splits them.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* 1 when built with OpenMP (the kernels split their loops themselves) */
int headlab_openmp(void) {
#if defined(_OPENMP)
    return 1;
#else
    return 0;
#endif
}

/* 512 when built with the AVX-512 paths, else 0 (portable C that the compiler vectorizes) */
int headlab_vector_bits(void) {
#if defined(__AVX512F__)
    return 512;
#else
    return 0;
#endif
}

/* exp(x) for x <= 0, to about 2 ulp; exactly 1 at 0 and exactly 0 below -87 (so masked scores,
 * -1e30 below the row's maximum, get exactly no weight). Written as straight-line arithmetic so
 * that the compiler vectorizes the loops that call it. Range reduction x = n ln 2 + r with
 * |r| <= ln 2 / 2 (ln 2 split in two parts), then a degree-7 polynomial for e^r: the constants
 * are Cephes' expf coefficients. */
static inline float exp_nonpositive(float x) {
    const float low = -87.0f;
    float xc = x < low ? low : x;
    float n = floorf(xc * 1.44269504088896341f + 0.5f);
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < low ? 0.0f : p * scale;
}

/* Softmax of rows [first, last) of scores (n_cols each) into weights, with each row's largest
 * weight (top) and entropy in nats:
 *   e_j = exp(s_j - m), Z = sum e_j, p_j = e_j / Z, top = 1 / Z,
 *   entropy = log Z - (1 / Z) sum e_j (s_j - m).
 * A row whose scores are all equal (every key masked) gets uniform weights. */
#if defined(__AVX512F__)
#include <immintrin.h>

/* exp_nonpositive on 16 lanes (the same arithmetic) */
static inline __m512 exp16(__m512 x) {
    const __m512 low = _mm512_set1_ps(-87.0f);
    __mmask16 keep = _mm512_cmp_ps_mask(x, low, _CMP_GE_OQ);
    __m512 xc = _mm512_max_ps(x, low);
    __m512 n = _mm512_roundscale_ps(
        _mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i bits = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(bits));
}
#endif

static void softmax_row(const float *s, float *w, int64_t n, float *top, float *entropy) {
    float m = -INFINITY, z = 0.0f, zs = 0.0f;
    int64_t j = 0;
#if defined(__AVX512F__)
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (; j + 16 <= n; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + j));
    m = _mm512_reduce_max_ps(mv);
#endif
#pragma omp simd reduction(max : m)
    for (int64_t t = j; t < n; t++) m = s[t] > m ? s[t] : m;
    j = 0;
#if defined(__AVX512F__)
    __m512 mm = _mm512_set1_ps(m), zv = _mm512_setzero_ps(), sv = _mm512_setzero_ps();
    const __m512 low = _mm512_set1_ps(-87.0f);
    for (; j + 16 <= n; j += 16) {
        __m512 d = _mm512_sub_ps(_mm512_loadu_ps(s + j), mm);
        __m512 e = exp16(d);
        _mm512_storeu_ps(w + j, e);
        zv = _mm512_add_ps(zv, e);
        __mmask16 keep = _mm512_cmp_ps_mask(d, low, _CMP_GE_OQ);
        sv = _mm512_mask3_fmadd_ps(e, d, sv, keep);
    }
    z = _mm512_reduce_add_ps(zv);
    zs = _mm512_reduce_add_ps(sv);
#endif
#pragma omp simd reduction(+ : z, zs)
    for (int64_t t = j; t < n; t++) {
        float d = s[t] - m;
        float e = exp_nonpositive(d);
        w[t] = e;
        z += e;
        zs += e * (d < -87.0f ? 0.0f : d);
    }
    float inv = 1.0f / z;
    for (j = 0; j < n; j++) w[j] *= inv;
    *top = inv;
    *entropy = logf(z) - zs * inv;
}

void softmax_rows(const float *scores, float *weights, float *top, float *entropy,
                  int64_t n_cols, int64_t first, int64_t last) {
#pragma omp parallel for schedule(static) if (last - first > 1)
    for (int64_t i = first; i < last; i++)
        softmax_row(scores + i * n_cols, weights + i * n_cols, n_cols, top + i, entropy + i);
}

/* Softmax of a row's first `limit` scores (the rest of its n get weight 0); a row that sees
 * no key (limit <= 0) gets uniform weights, as a softmax over n equal masked scores. */
static void softmax_row_limited(float *w, int64_t n, int64_t limit, float *top,
                                float *entropy) {
    if (limit <= 0) {
        for (int64_t j = 0; j < n; j++) w[j] = 1.0f / (float)n;
        *top = 1.0f / (float)n;
        *entropy = logf((float)n);
        return;
    }
    if (limit > n) limit = n;
    softmax_row(w, w, limit, top, entropy);
    memset(w + limit, 0, (size_t)(n - limit) * sizeof(float));
}

/* Scores q k^T and their softmax for rows start..start+t of each (sentence, head) pair in
 * [first, last): one pass, each group of rows' scores still in the cache when the softmax reads
 * them. q: (B, H, T, D) already scaled; kt: (B, Hkv, D, S) (keys transposed, head by head);
 * weights: (B, H, t, s) for keys 0..s; top, entropy: (B, H, t). Row i of sentence b sees keys
 * j < lengths[b] (when lengths is given) and, when causal, j <= start + i + offset. */
void attend_rows(const float *q, const float *kt, float *weights, float *top, float *entropy,
                 int64_t n_heads, int64_t group, int64_t n_queries, int64_t n_keys, int64_t d,
                 int64_t start, int64_t n_rows, int64_t seen, const int64_t *lengths,
                 int32_t causal, int64_t offset, int64_t first, int64_t last) {
#pragma omp parallel for schedule(static) if (last - first > 1)
    for (int64_t i = first; i < last; i++) {
        int64_t b = i / n_heads, h = i % n_heads;
        const float *qh = q + ((i * n_queries) + start) * d;
        const float *kh = kt + ((b * (n_heads / group) + h / group) * d) * n_keys;
        float *wh = weights + i * n_rows * seen;
        int64_t keys = lengths ? (lengths[b] < seen ? lengths[b] : seen) : seen;
        for (int64_t r0 = 0; r0 < n_rows; r0 += 4) {
            int64_t rows = n_rows - r0 < 4 ? n_rows - r0 : 4;
            int64_t limit[4];
            int64_t widest = 0;
            for (int64_t r = 0; r < rows; r++) {
                int64_t lim = keys;
                if (causal && start + r0 + r + offset + 1 < lim) lim = start + r0 + r + offset + 1;
                limit[r] = lim;
                if (lim > widest) widest = lim;
            }
            const float *qr = qh + r0 * d;
            float *wr = wh + r0 * seen;
            int64_t j = 0;
#if defined(__AVX512F__)
            for (; j < widest; j += 32) {
                __mmask16 m0 = widest - j >= 16 ? (__mmask16)0xFFFF
                                                : (__mmask16)((1u << (widest - j)) - 1);
                __mmask16 m1 = widest - j >= 32   ? (__mmask16)0xFFFF
                               : widest - j <= 16 ? (__mmask16)0
                                                  : (__mmask16)((1u << (widest - j - 16)) - 1);
                const float *q0 = qr, *q1 = qr + (rows > 1 ? d : 0);
                const float *q2 = qr + (rows > 2 ? 2 * d : 0), *q3 = qr + (rows > 3 ? 3 * d : 0);
                __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
                __m512 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
                const float *kr = kh + j;
                for (int64_t k = 0; k < d; k++, kr += n_keys) {
                    __m512 k0 = _mm512_maskz_loadu_ps(m0, kr);
                    __m512 k1 = _mm512_maskz_loadu_ps(m1, kr + 16);
                    __m512 x = _mm512_set1_ps(q0[k]);
                    a00 = _mm512_fmadd_ps(x, k0, a00);
                    a01 = _mm512_fmadd_ps(x, k1, a01);
                    x = _mm512_set1_ps(q1[k]);
                    a10 = _mm512_fmadd_ps(x, k0, a10);
                    a11 = _mm512_fmadd_ps(x, k1, a11);
                    x = _mm512_set1_ps(q2[k]);
                    a20 = _mm512_fmadd_ps(x, k0, a20);
                    a21 = _mm512_fmadd_ps(x, k1, a21);
                    x = _mm512_set1_ps(q3[k]);
                    a30 = _mm512_fmadd_ps(x, k0, a30);
                    a31 = _mm512_fmadd_ps(x, k1, a31);
                }
                float *o = wr + j;
                _mm512_mask_storeu_ps(o, m0, a00);
                _mm512_mask_storeu_ps(o + 16, m1, a01);
                if (rows > 1) {
                    _mm512_mask_storeu_ps(o + seen, m0, a10);
                    _mm512_mask_storeu_ps(o + seen + 16, m1, a11);
                }
                if (rows > 2) {
                    _mm512_mask_storeu_ps(o + 2 * seen, m0, a20);
                    _mm512_mask_storeu_ps(o + 2 * seen + 16, m1, a21);
                }
                if (rows > 3) {
                    _mm512_mask_storeu_ps(o + 3 * seen, m0, a30);
                    _mm512_mask_storeu_ps(o + 3 * seen + 16, m1, a31);
                }
            }
#else
            /* tiles in plain C: 4 rows x TILE keys of partial sums that the compiler keeps
             * in vector registers */
            enum { TILE = 16 };
            for (; j < widest; j += TILE) {
                int64_t cols = widest - j < TILE ? widest - j : TILE;
                float a[4][TILE] = {{0}};
                const float *kr = kh + j;
                for (int64_t k = 0; k < d; k++, kr += n_keys) {
                    float x[4];
                    for (int r = 0; r < 4; r++) x[r] = qr[(r < rows ? r : 0) * d + k];
                    if (cols == TILE) {
                        for (int r = 0; r < 4; r++)
#pragma omp simd
                            for (int c = 0; c < TILE; c++) a[r][c] += x[r] * kr[c];
                    } else {
                        for (int r = 0; r < 4; r++)
                            for (int64_t c = 0; c < cols; c++) a[r][c] += x[r] * kr[c];
                    }
                }
                for (int64_t r = 0; r < rows; r++)
                    memcpy(wr + r * seen + j, a[r], (size_t)cols * sizeof(float));
            }
#endif
            for (int64_t r = 0; r < rows; r++) {
                int64_t at = i * n_rows + r0 + r;
                softmax_row_limited(wr + r * seen, seen, limit[r], top + at, entropy + at);
            }
        }
    }
}

/* The word each word attends to most (Clark et al. 2019: a word's weight to another word is
 * the sum over the attended word's tokens, averaged over its own tokens), fed block by block.
 * A word's rows are added up in token space (one vectorized add per row); when its last row
 * has been added, one pass over the tokens finds the best single-token word and the few words
 * of several tokens are summed apart.
 *
 * weights: (B, H, t, s) rows start..start+t of every head; keys 0..s.
 * key_word: (B, T) each token's word, non-decreasing along a row; padding tokens hold n_real.
 * n_real: (B,) real words. allowed: (B, T) 1 on the token of a real, non-special word of one
 *   token (the tokens an argmax may land on directly).
 * first_token: (B, W) each word's first token.
 * spans: (B, 3, M) int32, the real, non-special words of several tokens (in order): the
 *   words, their first tokens, their numbers of tokens; n_spans: (B,) how many.
 * acc: (B, H, T) the running sums of each head's current word's rows (zeros between words).
 * current: (B,) the word being summed when the block begins (-1: none); next_current gets the
 *   word being summed when it ends (written by the slice that holds head 0 of a sentence).
 * argmax: (B, H, W) written when a word's last token row has been added: the first maximum
 *   over real words, the word itself and special words excluded (all excluded: word 0).
 * finish: the input ends with this block: words still open are finished too.
 * [first, last) indexes the B * H (sentence, head) pairs. */
typedef struct {
    const int64_t *key_word, *first_token;
    const int32_t *spans;
    const uint8_t *allowed;
    int64_t n_tokens, n_spans, max_spans;
} sentence_t;

/* The first allowed token with the largest sum (its sum in *best), or -1 when none is
 * allowed. */
static int64_t best_token(const float *acc, const uint8_t *ok, int64_t n, float *best) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    /* each lane keeps its first strict maximum; then the smallest index among the lanes that
     * hold the overall maximum */
    const __m512 none = _mm512_set1_ps(-1.0f);
    __m512 bv = none;
    __m512i bi = _mm512_set1_epi32(INT32_MAX);
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 tail = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
        __m128i bytes = _mm_maskz_loadu_epi8(tail, ok + j);
        __mmask16 k = _mm_test_epi8_mask(bytes, bytes);
        __m512 v = _mm512_mask_loadu_ps(none, k, acc + j);
        __mmask16 gt = _mm512_cmp_ps_mask(v, bv, _CMP_GT_OQ);
        bv = _mm512_mask_mov_ps(bv, gt, v);
        bi = _mm512_mask_mov_epi32(bi, gt, idx);
        idx = _mm512_add_epi32(idx, step);
    }
    float m = _mm512_reduce_max_ps(bv);
    *best = m;
    if (m <= -1.0f) return -1;
    __mmask16 at = _mm512_cmp_ps_mask(bv, _mm512_set1_ps(m), _CMP_EQ_OQ);
    return _mm512_mask_reduce_min_epi32(at, bi);
#else
    float m = -1.0f;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; j++) {
        float x = ok[j] ? acc[j] : -1.0f;
        m = x > m ? x : m;
    }
    *best = m;
    if (m <= -1.0f) return -1;
    for (int64_t j = 0; j < n; j++)
        if (ok[j] && acc[j] == m) return j;
    return -1;
#endif
}

/* Fold a candidate (sum, word) into (best, where): larger sums win, ties go to the first
 * word. */
static inline void consider(float sum, int64_t word, float *best, int64_t *where) {
    if (sum > *best || (sum == *best && word < *where)) {
        *best = sum;
        *where = word;
    }
}

/* The words of several tokens: each one's sum over its tokens, the word `own` excluded. */
static void best_span(const float *acc, const sentence_t *st, int64_t own, float *best,
                      int64_t *where) {
    const int32_t *words = st->spans, *firsts = st->spans + st->max_spans;
    const int32_t *lengths = st->spans + 2 * st->max_spans;
    int64_t k = 0;
#if defined(__AVX512F__)
    __m512 bv = _mm512_set1_ps(-1.0f);
    __m512i bw = _mm512_set1_epi32(INT32_MAX);
    const __m512i mine = _mm512_set1_epi32((int32_t)own);
    for (; k < st->n_spans; k += 16) {
        __mmask16 live = st->n_spans - k >= 16 ? (__mmask16)0xFFFF
                                               : (__mmask16)((1u << (st->n_spans - k)) - 1);
        __m512i w = _mm512_maskz_loadu_epi32(live, words + k);
        __m512i f = _mm512_maskz_loadu_epi32(live, firsts + k);
        __m512i len = _mm512_maskz_loadu_epi32(live, lengths + k);
        live &= _mm512_cmpneq_epi32_mask(w, mine);
        __m512 sum = _mm512_setzero_ps();
        int32_t longest = _mm512_reduce_max_epi32(len);
        for (int32_t t = 0; t < longest; t++) {
            __mmask16 in = live & _mm512_cmpgt_epi32_mask(len, _mm512_set1_epi32(t));
            __m512i at = _mm512_add_epi32(f, _mm512_set1_epi32(t));
            sum = _mm512_add_ps(
                sum, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), in, at, acc, 4));
        }
        __mmask16 gt = live & _mm512_cmp_ps_mask(sum, bv, _CMP_GT_OQ);
        bv = _mm512_mask_mov_ps(bv, gt, sum);
        bw = _mm512_mask_mov_epi32(bw, gt, w);
    }
    float m = _mm512_reduce_max_ps(bv);
    if (m > -1.0f) {
        __mmask16 at = _mm512_cmp_ps_mask(bv, _mm512_set1_ps(m), _CMP_EQ_OQ);
        consider(m, _mm512_mask_reduce_min_epi32(at, bw), best, where);
    }
#else
    for (; k < st->n_spans; k++) {
        if (words[k] == own) continue;
        float sum = 0.0f;
        for (int32_t j = firsts[k]; j < firsts[k] + lengths[k]; j++) sum += acc[j];
        consider(sum, words[k], best, where);
    }
#endif
}

static void finish_word(float *acc, const sentence_t *st, int64_t word, int64_t *out) {
    int64_t own = st->first_token[word];
    if (st->allowed[own]) acc[own] = -1.0f; /* a word of one token: its own cell */
    float best;
    int64_t token = best_token(acc, st->allowed, st->n_tokens, &best);
    int64_t where = token >= 0 ? st->key_word[token] : 0;
    best_span(acc, st, word, &best, &where);
    out[word] = where;
}

void word_argmax_rows(const float *weights, int64_t n_heads, int64_t n_rows, int64_t n_keys,
                      const int64_t *key_word, int64_t n_tokens, int64_t start,
                      const int64_t *n_real, const uint8_t *allowed, const int64_t *first_token,
                      int64_t n_words, const int32_t *spans, const int64_t *n_spans,
                      int64_t max_spans, float *acc,
                      const int64_t *current, int64_t *next_current, int64_t *argmax,
                      int32_t finish, int64_t first, int64_t last) {
#pragma omp parallel for schedule(static) if (last - first > 1)
    for (int64_t i = first; i < last; i++) {
        int64_t b = i / n_heads, h = i % n_heads;
        sentence_t st = {key_word + b * n_tokens, first_token + b * n_words,
                         spans + b * max_spans * 3, allowed + b * n_tokens, n_tokens,
                         n_spans[b], max_spans};
        float *a = acc + i * n_tokens;
        int64_t *out = argmax + i * n_words;
        int64_t real = n_real[b];
        int64_t word = current[b];
        const float *w = weights + i * n_rows * n_keys;
        for (int64_t r = 0; r < n_rows; r++) {
            int64_t q = st.key_word[start + r];
            if (q != word) {
                if (word >= 0) {
                    finish_word(a, &st, word, out);
                    memset(a, 0, (size_t)n_tokens * sizeof(float));
                }
                word = q < real ? q : -1;
            }
            if (word < 0) continue;
            const float *row = w + r * n_keys;
#pragma omp simd
            for (int64_t j = 0; j < n_keys; j++) a[j] += row[j];
        }
        if (finish && word >= 0) {
            finish_word(a, &st, word, out);
            memset(a, 0, (size_t)n_tokens * sizeof(float));
            word = -1;
        }
        if (h == 0) next_current[b] = word;
    }
}
