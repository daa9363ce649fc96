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
#include <stdlib.h>
#include <string.h>

/* Each exported kernel's parameters, in order: p a pointer, q a pointer that may be NULL,
 * i int64_t, b int32_t, d double. headlab.native compares this table with its own ctypes
 * signatures when it loads the library and refuses the kernels on any difference (a wrong
 * argument type would corrupt memory, not raise). Change it with the functions below. */
const char *headlab_signatures(void) {
    return "softmax_rows:ppppiii;"
           "attend_rows:pppppiiiiiiiqbiqiqiiidii;"
           "word_argmax_rows:piiipiipppippippppbii;"
           "positional_rows:pppiiiiippii";
}

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
    float n = rintf(xc * 1.44269504088896341f);
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
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

/* exp_nonpositive on 16 lanes (the same arithmetic, 2^n applied by scalef): exactly 0 below
 * -87, also for -inf and huge negative inputs (the zero mask drops whatever the arithmetic made
 * of them) */
static inline __m512 exp16(__m512 x) {
    __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

/* The mask of the first n of 16 lanes (all for n >= 16, none for n <= 0) */
static inline __mmask16 lanes(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* The largest of s[0..n), two vectors per step, the last partial vector under a mask */
static inline float max16(const float *s, int64_t n) {
    int64_t j = 0;
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
    for (; j + 32 <= n; j += 32) {
        m0 = _mm512_max_ps(m0, _mm512_loadu_ps(s + j));
        m1 = _mm512_max_ps(m1, _mm512_loadu_ps(s + j + 16));
    }
    for (; j < n; j += 16) {
        __mmask16 t = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
        m0 = _mm512_mask_max_ps(m0, t, m0, _mm512_maskz_loadu_ps(t, s + j));
    }
    return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}
#endif

static void softmax_row(const float *s, float *w, int64_t n, float scale, float *top,
                        float *entropy) {
    float m = -INFINITY, z = 0.0f, zs = 0.0f;
#if defined(__AVX512F__)
    /* two vectors per step (independent sums), the last partial vector under a mask */
    int64_t j = 0;
    m = max16(s, n);
    const __m512 mm = _mm512_set1_ps(m), sc = _mm512_set1_ps(scale), low = _mm512_set1_ps(-87.0f);
    __m512 z0 = _mm512_setzero_ps(), z1 = z0, s0 = z0, s1 = z0;
    for (j = 0; j + 32 <= n; j += 32) {
        __m512 d0 = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), mm), sc);
        __m512 d1 = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j + 16), mm), sc);
        __m512 e0 = exp16(d0), e1 = exp16(d1);
        _mm512_storeu_ps(w + j, e0);
        _mm512_storeu_ps(w + j + 16, e1);
        z0 = _mm512_add_ps(z0, e0);
        z1 = _mm512_add_ps(z1, e1);
        s0 = _mm512_mask3_fmadd_ps(e0, d0, s0, _mm512_cmp_ps_mask(d0, low, _CMP_GE_OQ));
        s1 = _mm512_mask3_fmadd_ps(e1, d1, s1, _mm512_cmp_ps_mask(d1, low, _CMP_GE_OQ));
    }
    for (; j < n; j += 16) {
        __mmask16 t = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
        __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, s + j), mm), sc);
        __m512 e = _mm512_maskz_mov_ps(t, exp16(d));
        _mm512_mask_storeu_ps(w + j, t, e);
        z0 = _mm512_add_ps(z0, e);
        s0 = _mm512_mask3_fmadd_ps(e, d, s0, t & _mm512_cmp_ps_mask(d, low, _CMP_GE_OQ));
    }
    z = _mm512_reduce_add_ps(_mm512_add_ps(z0, z1));
    zs = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    float inv = 1.0f / z;
    const __m512 iv = _mm512_set1_ps(inv);
    for (j = 0; j + 16 <= n; j += 16)
        _mm512_storeu_ps(w + j, _mm512_mul_ps(_mm512_loadu_ps(w + j), iv));
    for (; j < n; j++) w[j] *= inv;
#else
#pragma omp simd reduction(max : m)
    for (int64_t t = 0; t < n; t++) m = s[t] > m ? s[t] : m;
#pragma omp simd reduction(+ : z, zs)
    for (int64_t t = 0; t < n; t++) {
        float d = (s[t] - m) * scale;
        float e = exp_nonpositive(d);
        w[t] = e;
        z += e;
        zs += e * (d < -87.0f ? 0.0f : d);
    }
    float inv = 1.0f / z;
    for (int64_t j = 0; j < n; j++) w[j] *= inv;
#endif
    *top = inv;
    *entropy = logf(z) - zs * inv;
}

void softmax_rows(const float *scores, float *weights, float *top, float *entropy,
                  int64_t n_cols, int64_t first, int64_t last) {
#pragma omp parallel for schedule(static) if (last - first > 1)
    for (int64_t i = first; i < last; i++)
        softmax_row(scores + i * n_cols, weights + i * n_cols, n_cols, 1.0f, top + i,
                    entropy + i);
}

/* Softmax of a row's first `limit` scores (the rest of its n get weight 0); a row that sees
 * no key (limit <= 0) gets uniform weights, as a softmax over n equal masked scores. */
static void softmax_row_limited(float *w, int64_t n, int64_t limit, float scale, float *top,
                                float *entropy) {
    if (limit <= 0) {
        for (int64_t j = 0; j < n; j++) w[j] = 1.0f / (float)n;
        *top = 1.0f / (float)n;
        *entropy = logf((float)n);
        return;
    }
    if (limit > n) limit = n;
    softmax_row(w, w, limit, scale, top, entropy);
    memset(w + limit, 0, (size_t)(n - limit) * sizeof(float));
}

/* out[x] = sum_j w_j columns[x * stride + j] over n keys, for x < n_columns <= 4, in one pass
 * over the row (independent sums per column and per half, so that no sum waits on the
 * previous step's result) */
static void row_sums(const float *w, const float *columns, int64_t stride, int64_t n_columns,
                     int64_t n, float *out) {
    const float *c[4];
    for (int x = 0; x < 4; x++) c[x] = columns + (x < n_columns ? x : 0) * stride;
    int64_t j = 0;
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#if defined(__AVX512F__)
    __m512 a[4], b[4];
    for (int x = 0; x < 4; x++) a[x] = b[x] = _mm512_setzero_ps();
    for (; j + 32 <= n; j += 32) {
        __m512 w0 = _mm512_loadu_ps(w + j), w1 = _mm512_loadu_ps(w + j + 16);
        for (int x = 0; x < 4; x++) {
            a[x] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(c[x] + j), a[x]);
            b[x] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(c[x] + j + 16), b[x]);
        }
    }
    for (int x = 0; x < 4; x++) s[x] = _mm512_reduce_add_ps(_mm512_add_ps(a[x], b[x]));
#endif
    for (; j < n; j++)
        for (int x = 0; x < 4; x++) s[x] += w[j] * c[x][j];
    for (int64_t x = 0; x < n_columns; x++) out[x] = s[x];
}

/* Keys per tile of score_tile: 32 (two vectors) with AVX-512, else 16 */
#if defined(__AVX512F__)
enum { KEY_TILE = 32 };
#else
enum { KEY_TILE = 16 };
#endif

/* Scores of up to 4 query rows (q: rows x d, q_row floats apart) against keys j..j+n of one head
 * (kt: d x n_keys, keys transposed; n <= KEY_TILE): w[r * seen + c] = sum_k q[r, k] kt[k, c]. */
static void score_tile(const float *q, int64_t rows, int64_t d, int64_t q_row, const float *kt,
                       int64_t n_keys, int64_t n, float *w, int64_t seen) {
#if defined(__AVX512F__)
    __mmask16 m0 = lanes(n), m1 = lanes(n - 16);
    const float *q0 = q, *q1 = q + (rows > 1 ? q_row : 0);
    const float *q2 = q + (rows > 2 ? 2 * q_row : 0), *q3 = q + (rows > 3 ? 3 * q_row : 0);
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
    __m512 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
    const float *kr = kt;
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
    _mm512_mask_storeu_ps(w, m0, a00);
    _mm512_mask_storeu_ps(w + 16, m1, a01);
    if (rows > 1) {
        _mm512_mask_storeu_ps(w + seen, m0, a10);
        _mm512_mask_storeu_ps(w + seen + 16, m1, a11);
    }
    if (rows > 2) {
        _mm512_mask_storeu_ps(w + 2 * seen, m0, a20);
        _mm512_mask_storeu_ps(w + 2 * seen + 16, m1, a21);
    }
    if (rows > 3) {
        _mm512_mask_storeu_ps(w + 3 * seen, m0, a30);
        _mm512_mask_storeu_ps(w + 3 * seen + 16, m1, a31);
    }
#else
    /* 4 rows x KEY_TILE keys of partial sums that the compiler keeps in vector registers */
    float a[4][KEY_TILE] = {{0}};
    const float *kr = kt;
    for (int64_t k = 0; k < d; k++, kr += n_keys) {
        float x[4];
        for (int r = 0; r < 4; r++) x[r] = q[(r < rows ? r : 0) * q_row + k];
        if (n == KEY_TILE) {
            for (int r = 0; r < 4; r++)
#pragma omp simd
                for (int c = 0; c < KEY_TILE; c++) a[r][c] += x[r] * kr[c];
        } else {
            for (int r = 0; r < 4; r++)
                for (int64_t c = 0; c < n; c++) a[r][c] += x[r] * kr[c];
        }
    }
    for (int64_t r = 0; r < rows; r++) memcpy(w + r * seen, a[r], (size_t)n * sizeof(float));
#endif
}

/* Scores q k^T times scale and their softmax for rows start..start+t of each (sentence, head)
 * pair in [first, last). A pair's scores are computed key tile by key tile: each tile of keys
 * (4 KiB at D = 32) stays in the L1 cache while every row of the block reads it, and the
 * block's scores (t x s) stay in the L2 cache until each row's softmax, right after; the scale
 * is applied there (one product per score, none per query).
 * q: (B, H, T, D), element (b, h, t, k) at b * q_batch + h * q_head + t * q_row + k (a model's
 *   head view, read in place); kt: (B, Hkv, D, S) (keys transposed, head by head);
 * weights: (B, H, t, s) for keys 0..s; top, entropy: (B, H, t). Row i of sentence b sees keys
 * j < lengths[b] (when lengths is given) and, when causal, j <= start + i + offset.
 * columns: (B, X, S) per-key values (X <= 4) or NULL; mixed: (B, H, t, X) each row's weighted
 * sums of them (sum_j p_j columns[b, x, j]), computed while the row's weights are in the L1
 * cache. */
void attend_rows(const float *q, const float *kt, float *weights, float *top, float *entropy,
                 int64_t n_heads, int64_t group, int64_t n_keys, int64_t d, int64_t start,
                 int64_t n_rows, int64_t seen, const int64_t *lengths,
                 int32_t causal, int64_t offset, const float *columns, int64_t n_columns,
                 float *mixed, int64_t q_batch, int64_t q_head, int64_t q_row, double scale,
                 int64_t first, int64_t last) {
#pragma omp parallel for schedule(static) if (last - first > 1)
    for (int64_t i = first; i < last; i++) {
        int64_t b = i / n_heads, h = i % n_heads;
        const float *qh = q + b * q_batch + h * q_head + start * q_row;
        const float *kh = kt + ((b * (n_heads / group) + h / group) * d) * n_keys;
        float *wh = weights + i * n_rows * seen;
        int64_t keys = lengths ? (lengths[b] < seen ? lengths[b] : seen) : seen;
        /* the keys row r sees: 0..limit(r) (non-decreasing in r) */
#define ROW_LIMIT(r) (causal && start + (r) + offset + 1 < keys ? start + (r) + offset + 1 : keys)
        int64_t widest_all = ROW_LIMIT(n_rows - 1);
        for (int64_t j = 0; j < widest_all; j += KEY_TILE) {
            for (int64_t r0 = 0; r0 < n_rows; r0 += 4) {
                int64_t rows = n_rows - r0 < 4 ? n_rows - r0 : 4;
                int64_t widest = ROW_LIMIT(r0 + rows - 1);
                if (j >= widest) continue;
                int64_t n = widest - j < KEY_TILE ? widest - j : KEY_TILE;
                score_tile(qh + r0 * q_row, rows, d, q_row, kh + j, n_keys, n,
                           wh + r0 * seen + j, seen);
            }
        }
        for (int64_t r = 0; r < n_rows; r++) {
            int64_t at = i * n_rows + r, limit = ROW_LIMIT(r);
            softmax_row_limited(wh + r * seen, seen, limit, (float)scale, top + at, entropy + at);
            if (!columns) continue;
            /* the row's weighted sums of the per-key columns, while it is in L1 */
            int64_t used = limit <= 0 ? seen : (limit < seen ? limit : seen);
            row_sums(wh + r * seen, columns + b * n_columns * n_keys, n_keys, n_columns, used,
                     mixed + at * n_columns);
        }
#undef ROW_LIMIT
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

/* Positional heads (Voita et al. 2019; Clark et al. 2019) for rows start..start+t of every
 * (sentence, head) pair in [first, last): the number of counted query rows whose largest weight
 * lies at offset k = -3..+3 from the row's own position (the leftmost such offset when several
 * tie; an offset outside 0..s is never hit), and the summed weights on the previous and the next
 * token.
 * weights: (B, H, t, s); top: (B, H, t) each row's largest weight; query: (B, T) 1 on the rows
 * that count; hits: (B, H, 7); near: (B, H, 2) previous, next. Both are overwritten. */
void positional_rows(const float *weights, const float *top, const uint8_t *query,
                     int64_t n_heads, int64_t n_rows, int64_t n_keys, int64_t n_tokens,
                     int64_t start, float *hits, float *near, int64_t first, int64_t last) {
#pragma omp parallel for schedule(static) if (last - first > 1)
    for (int64_t i = first; i < last; i++) {
        int64_t b = i / n_heads;
        double count[7] = {0}, previous = 0.0, next = 0.0;
        for (int64_t r = 0; r < n_rows; r++) {
            int64_t t = start + r;
            if (!query[b * n_tokens + t]) continue;
            const float *row = weights + (i * n_rows + r) * n_keys;
            float best = top[i * n_rows + r];
            for (int64_t k = 0; k < 7; k++) {
                int64_t key = t + k - 3;
                if (key >= 0 && key < n_keys && row[key] >= best) {
                    count[k] += 1.0;
                    break;
                }
            }
            if (t >= 1 && t - 1 < n_keys) previous += row[t - 1];
            if (t + 1 < n_keys) next += row[t + 1];
        }
        for (int64_t k = 0; k < 7; k++) hits[i * 7 + k] = (float)count[k];
        near[i * 2] = (float)previous;
        near[i * 2 + 1] = (float)next;
    }
}
