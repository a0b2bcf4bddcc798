/* The term algebra of the derivative DFA in C: hash-consed regex terms and their byte derivatives.

   The same algebra as deriv_terms.Terms (which stays the reference and the fallback): a term is an int id of an
   interned (kind, payload); constructors normalise as they intern (alternations flattened, deduplicated and
   sorted, their byte classes merged into one; sequences right-nested, adjacent literals joined; nothing and
   empty absorbed), and per term the store memoises nullable, minimal length, the byte cuts of its first bytes,
   the derivative by one byte, and the first byte of a shortest member.

   Code-point classes, graph and member-list terms (CHARS, GAT, MEM) are "external": their payload lives in Python
   (deriv_terms.NativeTerms),
   which the store asks, once per term, for the term's expansion (an ordinary term of the same language) and for
   its nullable / minimal length. Every 4096 new terms the store calls the Python `tick` (deadlines, cancelled
   calls); an exception there or in a callback unwinds the C recursion with nothing half-made: a term exists
   once complete, a memo entry is written only after its value is whole.

   Ids are int32; payloads index pools (bytes of literals and byte ranges, member ids of alternations) that only
   grow, so offsets stay valid across reallocations; no raw pointer into a pool is held across a call that may
   add terms. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { K_NOTHING = 0, K_EMPTY, K_BYTES, K_LIT, K_CHARS, K_SEQ, K_ALT, K_REP, K_GAT, K_MEM };
#define T_NOTHING 0
#define T_EMPTY 1
#define INF_LEN ((int64_t)1 << 30)
#define MAX_DEPTH 20000
#define ERR (-1)

typedef struct {
    PyObject_HEAD
    int64_t n, cap;
    int8_t *kind;
    int64_t *a, *b, *c;
    int8_t *nullable;   /* -1 unknown */
    int64_t *minlen;    /* -1 unknown */
    int32_t *cuts;      /* index into cutpool (4 words), -1 unknown */
    int32_t *firsts;    /* index into cutpool (4 words): the bytes whose derivative is not nothing, -1 unknown */
    int16_t *first;     /* -3 unknown, -1 none, else a byte */
    int32_t *ext;       /* expansion of an external term, -1 unknown */
    uint8_t *bytes; int64_t nbytes, capbytes;
    int32_t *ids; int64_t nids, capids;
    uint64_t *cutpool; int64_t ncut, capcut;
    int32_t *itab; int64_t icap, icount;          /* intern table: term id + 1, 0 = free */
    int64_t *dkeys; int32_t *dvals; int64_t dcap, dcount;   /* derivative memo: (t << 8) | byte */
    int64_t *skeys; int32_t *svals; int64_t scap, scount;   /* re-nested sequence heads: (h << 32) | t */
    PyObject *expand_cb, *props_cb, *tick_cb;
    int depth;
} TermStore;

/* ------------------------------------------------------------------ growth */
static int grow_terms(TermStore *S) {
    int64_t cap = S->cap ? S->cap * 2 : 1024;
#define GROW(field, type) do { void *p = realloc(S->field, (size_t)cap * sizeof(type)); \
        if (!p) { PyErr_NoMemory(); return -1; } S->field = p; } while (0)
    GROW(kind, int8_t); GROW(a, int64_t); GROW(b, int64_t); GROW(c, int64_t);
    GROW(nullable, int8_t); GROW(minlen, int64_t); GROW(cuts, int32_t); GROW(firsts, int32_t); GROW(first, int16_t);
    GROW(ext, int32_t);
#undef GROW
    S->cap = cap;
    return 0;
}

static int reserve_bytes(TermStore *S, int64_t extra) {
    if (S->nbytes + extra <= S->capbytes) return 0;
    int64_t cap = S->capbytes ? S->capbytes : 4096;
    while (cap < S->nbytes + extra) cap *= 2;
    void *p = realloc(S->bytes, (size_t)cap);
    if (!p) { PyErr_NoMemory(); return -1; }
    S->bytes = p; S->capbytes = cap;
    return 0;
}

static int reserve_ids(TermStore *S, int64_t extra) {
    if (S->nids + extra <= S->capids) return 0;
    int64_t cap = S->capids ? S->capids : 4096;
    while (cap < S->nids + extra) cap *= 2;
    void *p = realloc(S->ids, (size_t)cap * sizeof(int32_t));
    if (!p) { PyErr_NoMemory(); return -1; }
    S->ids = p; S->capids = cap;
    return 0;
}

/* ------------------------------------------------------------------ int64 -> int32 hash maps */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
    return x;
}

/* keys are >= 0; -1 marks a free slot */
static int map_get(const int64_t *keys, const int32_t *vals, int64_t cap, int64_t key, int32_t *out) {
    if (!cap) return 0;
    uint64_t m = (uint64_t)cap - 1, i = mix64((uint64_t)key) & m;
    for (;;) {
        if (keys[i] == key) { *out = vals[i]; return 1; }
        if (keys[i] < 0) return 0;
        i = (i + 1) & m;
    }
}

static int map_put(int64_t **keys, int32_t **vals, int64_t *cap, int64_t *count, int64_t key, int32_t val) {
    if ((*count + 1) * 2 > *cap) {
        int64_t ncap = *cap ? *cap * 2 : 4096;
        int64_t *nk = malloc((size_t)ncap * sizeof(int64_t));
        int32_t *nv = malloc((size_t)ncap * sizeof(int32_t));
        if (!nk || !nv) { free(nk); free(nv); PyErr_NoMemory(); return -1; }
        for (int64_t i = 0; i < ncap; i++) nk[i] = -1;
        uint64_t m = (uint64_t)ncap - 1;
        for (int64_t i = 0; i < *cap; i++) {
            if ((*keys)[i] < 0) continue;
            uint64_t j = mix64((uint64_t)(*keys)[i]) & m;
            while (nk[j] >= 0) j = (j + 1) & m;
            nk[j] = (*keys)[i]; nv[j] = (*vals)[i];
        }
        free(*keys); free(*vals);
        *keys = nk; *vals = nv; *cap = ncap;
    }
    uint64_t m = (uint64_t)*cap - 1, i = mix64((uint64_t)key) & m;
    while ((*keys)[i] >= 0 && (*keys)[i] != key) i = (i + 1) & m;
    if ((*keys)[i] < 0) (*count)++;
    (*keys)[i] = key; (*vals)[i] = val;
    return 0;
}

/* ------------------------------------------------------------------ interning */
static uint64_t payload_hash(int kind, int64_t a, int64_t b, int64_t c, const void *data, int64_t len) {
    uint64_t h = mix64((uint64_t)kind * 0x9e3779b97f4a7c15ULL + 1);
    if (kind == K_BYTES || kind == K_LIT) {
        const uint8_t *d = data;
        for (int64_t i = 0; i < len; i++) h = (h ^ d[i]) * 0x100000001b3ULL;
        h = mix64(h ^ (uint64_t)len);
    } else if (kind == K_ALT) {
        const int32_t *d = data;
        for (int64_t i = 0; i < len; i++) h = mix64(h ^ (uint64_t)(uint32_t)d[i]);
    } else {
        h = mix64(h ^ (uint64_t)a);
        h = mix64(h ^ (uint64_t)b);
        h = mix64(h ^ (uint64_t)c);
    }
    return h;
}

static int same_term(TermStore *S, int32_t t, int kind, int64_t a, int64_t b, int64_t c, const void *data,
                     int64_t len) {
    if (S->kind[t] != kind) return 0;
    if (kind == K_BYTES || kind == K_LIT)
        return S->b[t] == len && memcmp(S->bytes + S->a[t], data, (size_t)len) == 0;
    if (kind == K_ALT)
        return S->b[t] == len && memcmp(S->ids + S->a[t], data, (size_t)len * sizeof(int32_t)) == 0;
    return S->a[t] == a && S->b[t] == b && S->c[t] == c;
}

static int rehash_intern(TermStore *S) {
    int64_t ncap = S->icap ? S->icap * 2 : 4096;
    int32_t *nt = calloc((size_t)ncap, sizeof(int32_t));
    if (!nt) { PyErr_NoMemory(); return -1; }
    uint64_t m = (uint64_t)ncap - 1;
    for (int64_t i = 0; i < S->icap; i++) {
        int32_t e = S->itab[i];
        if (!e) continue;
        int32_t t = e - 1;
        int k = S->kind[t];
        uint64_t h;
        if (k == K_BYTES || k == K_LIT) h = payload_hash(k, 0, 0, 0, S->bytes + S->a[t], S->b[t]);
        else if (k == K_ALT) h = payload_hash(k, 0, 0, 0, S->ids + S->a[t], S->b[t]);
        else h = payload_hash(k, S->a[t], S->b[t], S->c[t], NULL, 0);
        uint64_t j = h & m;
        while (nt[j]) j = (j + 1) & m;
        nt[j] = e;
    }
    free(S->itab);
    S->itab = nt; S->icap = ncap;
    return 0;
}

static int32_t new_term(TermStore *S, int kind, int64_t a, int64_t b, int64_t c) {
    if (S->n == S->cap && grow_terms(S) < 0) return ERR;
    int64_t t = S->n;
    S->kind[t] = (int8_t)kind; S->a[t] = a; S->b[t] = b; S->c[t] = c;
    S->nullable[t] = -1; S->minlen[t] = -1; S->cuts[t] = -1; S->firsts[t] = -1; S->first[t] = -3; S->ext[t] = -1;
    S->n = t + 1;
    return (int32_t)t;
}

static int tick(TermStore *S) {
    if ((S->n & 4095) == 0 && S->tick_cb != Py_None) {
        PyObject *r = PyObject_CallNoArgs(S->tick_cb);
        if (!r) return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* data must not point into the store's pools (it is copied in after a possible reallocation) */
static int32_t intern(TermStore *S, int kind, int64_t a, int64_t b, int64_t c, const void *data, int64_t len) {
    if ((S->icount + 1) * 2 > S->icap && rehash_intern(S) < 0) return ERR;
    uint64_t m = (uint64_t)S->icap - 1, i = payload_hash(kind, a, b, c, data, len) & m;
    for (;;) {
        int32_t e = S->itab[i];
        if (!e) break;
        if (same_term(S, e - 1, kind, a, b, c, data, len)) return e - 1;
        i = (i + 1) & m;
    }
    if (kind == K_BYTES || kind == K_LIT) {
        if (reserve_bytes(S, len) < 0) return ERR;
        memcpy(S->bytes + S->nbytes, data, (size_t)len);
        a = S->nbytes; b = len;
        S->nbytes += len;
    } else if (kind == K_ALT) {
        if (reserve_ids(S, len) < 0) return ERR;
        memcpy(S->ids + S->nids, data, (size_t)len * sizeof(int32_t));
        a = S->nids; b = len;
        S->nids += len;
    }
    int32_t t = new_term(S, kind, a, b, c);
    if (t < 0) return ERR;
    S->itab[i] = t + 1;
    S->icount++;
    if (tick(S) < 0) return ERR;  /* after the term is complete: an expired deadline leaves nothing half-made */
    return t;
}

/* ------------------------------------------------------------------ constructors */
static int cmp_pair(const void *x, const void *y) {
    const uint8_t *p = x, *q = y;
    if (p[0] != q[0]) return (int)p[0] - (int)q[0];
    return (int)p[1] - (int)q[1];
}

/* pairs: n (lo, hi) byte pairs, modified in place (sorted and merged) */
static int32_t mk_bytes(TermStore *S, uint8_t *pairs, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (pairs[2 * i] <= pairs[2 * i + 1]) { pairs[2 * k] = pairs[2 * i]; pairs[2 * k + 1] = pairs[2 * i + 1]; k++; }
    if (k == 0) return T_NOTHING;
    qsort(pairs, (size_t)k, 2, cmp_pair);
    int64_t o = 0;
    for (int64_t i = 0; i < k; i++) {
        int lo = pairs[2 * i], hi = pairs[2 * i + 1];
        if (o && lo <= (int)pairs[2 * o - 1] + 1) {
            if (hi > pairs[2 * o - 1]) pairs[2 * o - 1] = (uint8_t)hi;
        } else {
            pairs[2 * o] = (uint8_t)lo; pairs[2 * o + 1] = (uint8_t)hi; o++;
        }
    }
    return intern(S, K_BYTES, 0, 0, 0, pairs, 2 * o);
}

static int32_t mk_lit(TermStore *S, const uint8_t *data, int64_t len) {
    if (len == 0) return T_EMPTY;
    return intern(S, K_LIT, 0, 0, 0, data, len);
}

/* a literal from a slice of the pool: copied out first (interning may reallocate the pool) */
static int32_t mk_lit_from_pool(TermStore *S, int64_t off, int64_t len) {
    if (len == 0) return T_EMPTY;
    uint8_t stackbuf[256];
    uint8_t *buf = len <= 256 ? stackbuf : malloc((size_t)len);
    if (!buf) { PyErr_NoMemory(); return ERR; }
    memcpy(buf, S->bytes + off, (size_t)len);
    int32_t r = mk_lit(S, buf, len);
    if (buf != stackbuf) free(buf);
    return r;
}

static int32_t lit_concat(TermStore *S, int32_t x, int32_t y) {
    int64_t lx = S->b[x], ly = S->b[y];
    uint8_t *buf = malloc((size_t)(lx + ly));
    if (!buf) { PyErr_NoMemory(); return ERR; }
    memcpy(buf, S->bytes + S->a[x], (size_t)lx);
    memcpy(buf + lx, S->bytes + S->a[y], (size_t)ly);
    int32_t r = mk_lit(S, buf, lx + ly);
    free(buf);
    return r;
}

static int32_t mk_seq(TermStore *S, int32_t h, int32_t t) {
    if (h == T_NOTHING || t == T_NOTHING) return T_NOTHING;
    if (h == T_EMPTY) return t;
    if (t == T_EMPTY) return h;
    int kh = S->kind[h], kt = S->kind[t];
    if (kh == K_SEQ) {
        /* re-nesting a sequence head walks its whole chain: remembered per (chain, tail) */
        int64_t key = ((int64_t)h << 32) | (int64_t)(uint32_t)t;
        int32_t r;
        if (map_get(S->skeys, S->svals, S->scap, key, &r)) return r;
        if (++S->depth > MAX_DEPTH) { S->depth--; PyErr_SetString(PyExc_RecursionError, "term nesting too deep"); return ERR; }
        int32_t inner = mk_seq(S, (int32_t)S->b[h], t);
        r = inner < 0 ? ERR : mk_seq(S, (int32_t)S->a[h], inner);
        S->depth--;
        if (r < 0) return ERR;
        if (map_put(&S->skeys, &S->svals, &S->scap, &S->scount, key, r) < 0) return ERR;
        return r;
    }
    if (kh == K_LIT && kt == K_LIT) return lit_concat(S, h, t);
    if (kh == K_LIT && kt == K_SEQ && S->kind[S->a[t]] == K_LIT) {
        int32_t tail = (int32_t)S->b[t];
        int32_t x = lit_concat(S, h, (int32_t)S->a[t]);
        if (x < 0) return ERR;
        return mk_seq(S, x, tail);
    }
    return intern(S, K_SEQ, h, t, 0, NULL, 0);
}

static int cmp_i32(const void *x, const void *y) {
    int32_t p = *(const int32_t *)x, q = *(const int32_t *)y;
    return (p > q) - (p < q);
}

typedef struct { int32_t *v; int64_t n, cap; } I32Vec;
typedef struct { uint8_t *v; int64_t n, cap; } U8Vec;

static int i32_push(I32Vec *x, int32_t val) {
    if (x->n == x->cap) {
        int64_t cap = x->cap ? x->cap * 2 : 16;
        void *p = realloc(x->v, (size_t)cap * sizeof(int32_t));
        if (!p) { PyErr_NoMemory(); return -1; }
        x->v = p; x->cap = cap;
    }
    x->v[x->n++] = val;
    return 0;
}

static int u8_push_ranges(U8Vec *x, const uint8_t *src, int64_t len) {
    if (x->n + len > x->cap) {
        int64_t cap = x->cap ? x->cap : 32;
        while (cap < x->n + len) cap *= 2;
        void *p = realloc(x->v, (size_t)cap);
        if (!p) { PyErr_NoMemory(); return -1; }
        x->v = p; x->cap = cap;
    }
    memcpy(x->v + x->n, src, (size_t)len);
    x->n += len;
    return 0;
}

/* items are copied out of any pool before this is called */
static int32_t mk_alt(TermStore *S, const int32_t *items, int64_t n) {
    I32Vec out = {0};
    U8Vec ranges = {0};
    int32_t r = ERR;
    for (int64_t i = 0; i < n; i++) {
        int32_t x = items[i];
        if (x == T_NOTHING) continue;
        int k = S->kind[x];
        if (k == K_ALT) {
            for (int64_t j = 0; j < S->b[x]; j++) {
                int32_t y = S->ids[S->a[x] + j];
                if (S->kind[y] == K_BYTES) {
                    if (u8_push_ranges(&ranges, S->bytes + S->a[y], S->b[y]) < 0) goto done;
                } else if (i32_push(&out, y) < 0) goto done;
            }
        } else if (k == K_BYTES) {
            if (u8_push_ranges(&ranges, S->bytes + S->a[x], S->b[x]) < 0) goto done;
        } else if (i32_push(&out, x) < 0) goto done;
    }
    if (ranges.n) {
        int32_t bt = mk_bytes(S, ranges.v, ranges.n / 2);
        if (bt < 0 || i32_push(&out, bt) < 0) goto done;
    }
    if (out.n == 0) { r = T_NOTHING; goto done; }
    qsort(out.v, (size_t)out.n, sizeof(int32_t), cmp_i32);
    int64_t o = 0;
    for (int64_t i = 0; i < out.n; i++)
        if (!o || out.v[o - 1] != out.v[i]) out.v[o++] = out.v[i];
    r = o == 1 ? out.v[0] : intern(S, K_ALT, 0, 0, 0, out.v, o);
done:
    free(out.v); free(ranges.v);
    return r;
}

static int32_t mk_alt2(TermStore *S, int32_t x, int32_t y) {
    int32_t items[2] = {x, y};
    return mk_alt(S, items, 2);
}

static int32_t mk_rep(TermStore *S, int32_t x, int64_t lo, int64_t hi) {
    if (hi >= 0 && hi < lo) return T_NOTHING;
    if (hi == 0) return T_EMPTY;
    if (x == T_NOTHING) return lo == 0 ? T_EMPTY : T_NOTHING;
    if (x == T_EMPTY) return T_EMPTY;
    if (lo == 1 && hi == 1) return x;
    return intern(S, K_REP, x, lo, hi, NULL, 0);
}

/* ------------------------------------------------------------------ external terms */
static int32_t expansion(TermStore *S, int32_t t) {
    if (S->ext[t] >= 0) return S->ext[t];
    PyObject *r = PyObject_CallFunction(S->expand_cb, "i", t);
    if (!r) return ERR;
    long e = PyLong_AsLong(r);
    Py_DECREF(r);
    if (e == -1 && PyErr_Occurred()) return ERR;
    if (e < 0 || e >= S->n) { PyErr_SetString(PyExc_ValueError, "expansion is not a term"); return ERR; }
    S->ext[t] = (int32_t)e;
    return (int32_t)e;
}

static int ext_props(TermStore *S, int32_t t) {
    PyObject *r = PyObject_CallFunction(S->props_cb, "i", t);
    if (!r) return -1;
    int nl;
    long long ml;
    if (!PyArg_ParseTuple(r, "pL", &nl, &ml)) { Py_DECREF(r); return -1; }
    Py_DECREF(r);
    S->nullable[t] = (int8_t)nl;
    S->minlen[t] = ml < INF_LEN ? ml : INF_LEN;
    return 0;
}

/* ------------------------------------------------------------------ properties */
static int nullable(TermStore *S, int32_t t) {
    int8_t v = S->nullable[t];
    if (v >= 0) return v;
    int k = S->kind[t], r;
    if (++S->depth > MAX_DEPTH) { S->depth--; PyErr_SetString(PyExc_RecursionError, "term nesting too deep"); return -1; }
    switch (k) {
    case K_SEQ: {
        r = nullable(S, (int32_t)S->a[t]);
        if (r == 1) r = nullable(S, (int32_t)S->b[t]);
        break;
    }
    case K_ALT: {
        r = 0;
        for (int64_t i = 0; i < S->b[t] && r == 0; i++) r = nullable(S, S->ids[S->a[t] + i]);
        break;
    }
    case K_REP:
        r = S->b[t] == 0 ? 1 : nullable(S, (int32_t)S->a[t]);
        break;
    case K_GAT: case K_MEM: case K_CHARS:
        r = ext_props(S, t) < 0 ? -1 : S->nullable[t];
        break;
    case K_EMPTY:
        r = 1;
        break;
    default:
        r = 0;
    }
    S->depth--;
    if (r >= 0) S->nullable[t] = (int8_t)r;
    return r;
}

static int64_t minlen(TermStore *S, int32_t t) {
    int64_t v = S->minlen[t];
    if (v >= 0) return v;
    int k = S->kind[t];
    int64_t r;
    if (++S->depth > MAX_DEPTH) { S->depth--; PyErr_SetString(PyExc_RecursionError, "term nesting too deep"); return -1; }
    switch (k) {
    case K_BYTES: r = 1; break;
    case K_LIT: r = S->b[t]; break;
    case K_SEQ: {
        int64_t x = minlen(S, (int32_t)S->a[t]);
        int64_t y = x < 0 ? -1 : minlen(S, (int32_t)S->b[t]);
        r = y < 0 ? -1 : (x + y < INF_LEN ? x + y : INF_LEN);
        break;
    }
    case K_ALT: {
        r = INF_LEN;
        for (int64_t i = 0; i < S->b[t]; i++) {
            int64_t x = minlen(S, S->ids[S->a[t] + i]);
            if (x < 0) { r = -1; break; }
            if (x < r) r = x;
        }
        break;
    }
    case K_REP: {
        if (S->b[t] == 0) { r = 0; break; }
        int64_t x = minlen(S, (int32_t)S->a[t]);
        if (x < 0) { r = -1; break; }
        r = (x >= INF_LEN || S->b[t] >= INF_LEN || x * S->b[t] >= INF_LEN) ? INF_LEN : x * S->b[t];
        break;
    }
    case K_GAT: case K_MEM: case K_CHARS:
        r = ext_props(S, t) < 0 ? -1 : S->minlen[t];
        break;
    case K_EMPTY: r = 0; break;
    default: r = INF_LEN;
    }
    S->depth--;
    if (r >= 0) S->minlen[t] = r;
    return r;
}

/* Two byte sets of a term, 256 bits each, memoised in the cut pool. CUTS: the bytes where t's derivative may change
   (class boundaries; 0 and 256 are implicit). FIRSTS: the bytes whose derivative of t is not nothing, so that a
   derivative by any other byte is nothing without a memo entry and an alternation skips such branches with a bit
   test (a member list's alternation has a branch per declared property, and almost every byte kills almost all of
   them). Both follow a sequence's head into its tail when the head is nullable, an alternation's branches, a
   repetition's body and an external term's expansion; only their leaves differ. */
enum { CUTS = 0, FIRSTS = 1 };

static int byte_set(TermStore *S, int32_t t, int which, uint64_t *out) {
    int32_t *memo = which == CUTS ? S->cuts : S->firsts;
    if (memo[t] >= 0) { memcpy(out, S->cutpool + 4 * (int64_t)memo[t], 32); return 0; }
    uint64_t w[4] = {0, 0, 0, 0}, v[4];
    int k = S->kind[t], rc = 0;
    if (++S->depth > MAX_DEPTH) { S->depth--; PyErr_SetString(PyExc_RecursionError, "term nesting too deep"); return -1; }
    switch (k) {
    case K_BYTES:
        for (int64_t i = 0; i < S->b[t]; i += 2) {
            int lo = S->bytes[S->a[t] + i], hi = S->bytes[S->a[t] + i + 1];
            if (which == FIRSTS) {
                for (int x = lo; x <= hi; x++) w[x >> 6] |= 1ULL << (x & 63);
            } else {
                w[lo >> 6] |= 1ULL << (lo & 63);
                if (hi + 1 < 256) w[(hi + 1) >> 6] |= 1ULL << ((hi + 1) & 63);
            }
        }
        break;
    case K_LIT: {
        int b0 = S->bytes[S->a[t]];
        w[b0 >> 6] |= 1ULL << (b0 & 63);
        if (which == CUTS && b0 + 1 < 256) w[(b0 + 1) >> 6] |= 1ULL << ((b0 + 1) & 63);
        break;
    }
    case K_SEQ: {
        int32_t h = (int32_t)S->a[t];
        rc = byte_set(S, h, which, w);
        if (rc == 0) {
            int nl = nullable(S, h);
            if (nl < 0) rc = -1;
            else if (nl) {
                rc = byte_set(S, (int32_t)S->b[t], which, v);
                for (int i = 0; i < 4; i++) w[i] |= v[i];
            }
        }
        break;
    }
    case K_ALT:
        for (int64_t i = 0; i < S->b[t] && rc == 0; i++) {
            rc = byte_set(S, S->ids[S->a[t] + i], which, v);
            for (int j = 0; j < 4; j++) w[j] |= v[j];
        }
        break;
    case K_REP:
        rc = byte_set(S, (int32_t)S->a[t], which, w);
        break;
    case K_GAT: case K_MEM: case K_CHARS: {
        int32_t e = expansion(S, t);
        rc = e < 0 ? -1 : byte_set(S, e, which, w);
        break;
    }
    default:
        break;
    }
    S->depth--;
    if (rc < 0) return -1;
    if (S->ncut == S->capcut) {
        int64_t cap = S->capcut ? S->capcut * 2 : 1024;
        void *p = realloc(S->cutpool, (size_t)cap * 32);
        if (!p) { PyErr_NoMemory(); return -1; }
        S->cutpool = p; S->capcut = cap;
    }
    memcpy(S->cutpool + 4 * S->ncut, w, 32);
    /* the memo array may have moved while the recursion added terms: indexed afresh */
    (which == CUTS ? S->cuts : S->firsts)[t] = (int32_t)S->ncut++;
    memcpy(out, w, 32);
    return 0;
}

static int cuts(TermStore *S, int32_t t, uint64_t *out) { return byte_set(S, t, CUTS, out); }

/* 1 if byte may start a member of t, 0 if not, -1 on error */
static inline int may_start(TermStore *S, int32_t t, int byte) {
    int32_t fi = S->firsts[t];
    if (fi < 0) {
        uint64_t w[4];
        if (byte_set(S, t, FIRSTS, w) < 0) return -1;
        fi = S->firsts[t];
    }
    return (int)(S->cutpool[4 * (int64_t)fi + (byte >> 6)] >> (byte & 63) & 1);
}

static int32_t deriv(TermStore *S, int32_t t, int byte) {
    int64_t key = ((int64_t)t << 8) | byte;
    int32_t r;
    if (map_get(S->dkeys, S->dvals, S->dcap, key, &r)) return r;
    int starts = may_start(S, t, byte);
    if (starts <= 0) return starts < 0 ? ERR : T_NOTHING;
    if (++S->depth > MAX_DEPTH) { S->depth--; PyErr_SetString(PyExc_RecursionError, "term nesting too deep"); return ERR; }
    int k = S->kind[t];
    switch (k) {
    case K_BYTES:
        r = T_NOTHING;
        for (int64_t i = 0; i < S->b[t]; i += 2) {
            int lo = S->bytes[S->a[t] + i], hi = S->bytes[S->a[t] + i + 1];
            if (lo <= byte && byte <= hi) { r = T_EMPTY; break; }
            if (byte < lo) break;
        }
        break;
    case K_LIT:
        r = S->bytes[S->a[t]] == byte ? mk_lit_from_pool(S, S->a[t] + 1, S->b[t] - 1) : T_NOTHING;
        break;
    case K_SEQ: {
        int32_t h = (int32_t)S->a[t], tail = (int32_t)S->b[t];
        int32_t dh = deriv(S, h, byte);
        r = dh < 0 ? ERR : mk_seq(S, dh, tail);
        if (r >= 0) {
            int nl = nullable(S, h);
            if (nl < 0) r = ERR;
            else if (nl) {
                int32_t r2 = deriv(S, tail, byte);
                if (r2 < 0) r = ERR;
                else if (r2 != T_NOTHING) r = mk_alt2(S, r, r2);
            }
        }
        break;
    }
    case K_ALT: {
        I32Vec ds = {0};
        r = T_NOTHING;
        for (int64_t i = 0; i < S->b[t]; i++) {
            int32_t x = S->ids[S->a[t] + i];
            int st = may_start(S, x, byte);
            if (st < 0) { r = ERR; break; }
            if (!st) continue;
            int32_t d = deriv(S, x, byte);
            if (d < 0 || (d != T_NOTHING && i32_push(&ds, d) < 0)) { r = ERR; break; }
        }
        if (r != ERR) r = mk_alt(S, ds.v, ds.n);
        free(ds.v);
        break;
    }
    case K_REP: {
        int32_t x = (int32_t)S->a[t];
        int64_t lo = S->b[t], hi = S->c[t];
        int32_t dx = deriv(S, x, byte);
        if (dx < 0) r = ERR;
        else if (dx == T_NOTHING) r = T_NOTHING;
        else {
            int32_t rest = mk_rep(S, x, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
            r = rest < 0 ? ERR : mk_seq(S, dx, rest);
        }
        break;
    }
    case K_GAT: case K_MEM: case K_CHARS: {
        int32_t e = expansion(S, t);
        r = e < 0 ? ERR : deriv(S, e, byte);
        break;
    }
    default:
        r = T_NOTHING;
    }
    S->depth--;
    if (r < 0) return ERR;
    if (map_put(&S->dkeys, &S->dvals, &S->dcap, &S->dcount, key, r) < 0) return ERR;
    return r;
}

/* the first byte of a shortest member of t: -1 none (t's shortest member is empty or t has none), -2 undecided
   (deeper than 64 steps), -3 error */
static int first_byte(TermStore *S, int32_t t, int depth) {
    if (S->first[t] > -3) return S->first[t];
    if (depth > 64) return -2;
    int64_t ml = minlen(S, t);
    if (ml < 0) return -3;
    int r;
    if (ml == 0 || ml >= INF_LEN) r = -1;
    else {
        int k = S->kind[t];
        switch (k) {
        case K_BYTES: r = S->bytes[S->a[t]]; break;
        case K_LIT: r = S->bytes[S->a[t]]; break;
        case K_SEQ: {
            int32_t h = (int32_t)S->a[t];
            int64_t mh = minlen(S, h);
            r = mh < 0 ? -3 : first_byte(S, mh > 0 ? h : (int32_t)S->b[t], depth + 1);
            break;
        }
        case K_ALT: {
            int32_t best = -1;
            int64_t bm = 0;
            for (int64_t i = 0; i < S->b[t]; i++) {
                int32_t x = S->ids[S->a[t] + i];
                int64_t m = minlen(S, x);
                if (m < 0) { best = -2; break; }
                if (best < 0 || m < bm) { best = x; bm = m; }
            }
            r = best == -2 ? -3 : first_byte(S, best, depth + 1);
            break;
        }
        case K_REP: r = first_byte(S, (int32_t)S->a[t], depth + 1); break;
        case K_GAT: case K_MEM: case K_CHARS: {
            int32_t e = expansion(S, t);
            r = e < 0 ? -3 : first_byte(S, e, depth + 1);
            break;
        }
        default: r = -1;
        }
    }
    if (r >= -1) S->first[t] = (int16_t)r;
    return r;
}

/* ------------------------------------------------------------------ Python type */
static int check_term(TermStore *S, long t) {
    if (t < 0 || t >= S->n) { PyErr_Format(PyExc_IndexError, "no term %ld", t); return -1; }
    return 0;
}

static PyObject *ret_term(TermStore *S, int32_t r) {
    if (r < 0) return NULL;
    return PyLong_FromLong(r);
}

static int TermStore_init(TermStore *S, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"expand", "props", "tick", NULL};
    PyObject *e, *p, *t = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O", kwlist, &e, &p, &t)) return -1;
    if (S->n) { PyErr_SetString(PyExc_RuntimeError, "TermStore is initialised once"); return -1; }
    Py_INCREF(e); Py_INCREF(p); Py_INCREF(t);
    S->expand_cb = e; S->props_cb = p; S->tick_cb = t;
    if (new_term(S, K_NOTHING, 0, 0, 0) < 0 || new_term(S, K_EMPTY, 0, 0, 0) < 0) return -1;
    S->nullable[T_NOTHING] = 0; S->minlen[T_NOTHING] = INF_LEN;
    S->nullable[T_EMPTY] = 1; S->minlen[T_EMPTY] = 0;
    return 0;
}

static int TermStore_traverse(TermStore *S, visitproc visit, void *arg) {
    Py_VISIT(S->expand_cb); Py_VISIT(S->props_cb); Py_VISIT(S->tick_cb);
    return 0;
}

static int TermStore_clear(TermStore *S) {
    Py_CLEAR(S->expand_cb); Py_CLEAR(S->props_cb); Py_CLEAR(S->tick_cb);
    return 0;
}

static void TermStore_dealloc(TermStore *S) {
    PyObject_GC_UnTrack(S);
    TermStore_clear(S);
    free(S->kind); free(S->a); free(S->b); free(S->c); free(S->nullable); free(S->minlen); free(S->cuts); free(S->firsts);
    free(S->first); free(S->ext); free(S->bytes); free(S->ids); free(S->cutpool); free(S->itab);
    free(S->dkeys); free(S->dvals); free(S->skeys); free(S->svals);
    Py_TYPE(S)->tp_free((PyObject *)S);
}

static PyObject *TS_bytes(TermStore *S, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "ranges must be a sequence of (lo, hi) pairs");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uint8_t *pairs = malloc((size_t)(2 * n + 2));
    if (!pairs) { Py_DECREF(seq); return PyErr_NoMemory(); }
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int lo, hi;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "ii", &lo, &hi)) goto fail;
        if (hi < lo) continue;  /* an empty range */
        if (lo < 0 || hi > 255) { PyErr_SetString(PyExc_ValueError, "byte ranges lie in [0, 255]"); goto fail; }
        pairs[2 * k] = (uint8_t)lo; pairs[2 * k + 1] = (uint8_t)hi; k++;
    }
    Py_DECREF(seq);
    int32_t r = mk_bytes(S, pairs, k);
    free(pairs);
    return ret_term(S, r);
fail:
    Py_DECREF(seq); free(pairs);
    return NULL;
}

static PyObject *TS_lit(TermStore *S, PyObject *arg) {
    char *d; Py_ssize_t n;
    if (PyBytes_AsStringAndSize(arg, &d, &n) < 0) return NULL;
    return ret_term(S, mk_lit(S, (const uint8_t *)d, n));
}

static PyObject *TS_seq(TermStore *S, PyObject *args) {
    long h, t;
    if (!PyArg_ParseTuple(args, "ll", &h, &t) || check_term(S, h) < 0 || check_term(S, t) < 0) return NULL;
    return ret_term(S, mk_seq(S, (int32_t)h, (int32_t)t));
}

static PyObject *TS_alt(TermStore *S, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "alt takes a sequence of terms");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int32_t *items = malloc((size_t)(n + 1) * sizeof(int32_t));
    if (!items) { Py_DECREF(seq); return PyErr_NoMemory(); }
    for (Py_ssize_t i = 0; i < n; i++) {
        long x = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if ((x == -1 && PyErr_Occurred()) || check_term(S, x) < 0) { Py_DECREF(seq); free(items); return NULL; }
        items[i] = (int32_t)x;
    }
    Py_DECREF(seq);
    int32_t r = mk_alt(S, items, n);
    free(items);
    return ret_term(S, r);
}

static PyObject *TS_rep(TermStore *S, PyObject *args) {
    long x;
    long long lo;
    PyObject *hio;
    if (!PyArg_ParseTuple(args, "lLO", &x, &lo, &hio) || check_term(S, x) < 0) return NULL;
    long long hi = -1;
    if (hio != Py_None) {
        hi = PyLong_AsLongLong(hio);
        if (hi == -1 && PyErr_Occurred()) return NULL;
        if (hi < 0) return ret_term(S, T_NOTHING);
    }
    if (lo < 0) { PyErr_SetString(PyExc_ValueError, "a repetition's lower bound is >= 0"); return NULL; }
    return ret_term(S, mk_rep(S, (int32_t)x, lo, hi));
}

static PyObject *TS_external(TermStore *S, PyObject *arg) {
    long k = PyLong_AsLong(arg);
    if (k == -1 && PyErr_Occurred()) return NULL;
    if (k != K_GAT && k != K_MEM && k != K_CHARS) {
        PyErr_SetString(PyExc_ValueError, "external terms are CHARS, GAT or MEM");
        return NULL;
    }
    int32_t t = new_term(S, (int)k, 0, 0, 0);
    if (t < 0) return NULL;
    if (tick(S) < 0) return NULL;
    return PyLong_FromLong(t);
}

static PyObject *TS_kind(TermStore *S, PyObject *arg) {
    long t = PyLong_AsLong(arg);
    if ((t == -1 && PyErr_Occurred()) || check_term(S, t) < 0) return NULL;
    return PyLong_FromLong(S->kind[t]);
}

static PyObject *TS_nullable(TermStore *S, PyObject *arg) {
    long t = PyLong_AsLong(arg);
    if ((t == -1 && PyErr_Occurred()) || check_term(S, t) < 0) return NULL;
    int r = nullable(S, (int32_t)t);
    if (r < 0) return NULL;
    return PyBool_FromLong(r);
}

static PyObject *TS_minlen(TermStore *S, PyObject *arg) {
    long t = PyLong_AsLong(arg);
    if ((t == -1 && PyErr_Occurred()) || check_term(S, t) < 0) return NULL;
    int64_t r = minlen(S, (int32_t)t);
    if (r < 0) return NULL;
    return PyLong_FromLongLong(r);
}

static PyObject *TS_deriv(TermStore *S, PyObject *args) {
    long t;
    int byte;
    if (!PyArg_ParseTuple(args, "li", &t, &byte) || check_term(S, t) < 0) return NULL;
    if (byte < 0 || byte > 255) { PyErr_SetString(PyExc_ValueError, "a byte lies in [0, 255]"); return NULL; }
    return ret_term(S, deriv(S, (int32_t)t, byte));
}

static PyObject *TS_cuts(TermStore *S, PyObject *arg) {
    long t = PyLong_AsLong(arg);
    if ((t == -1 && PyErr_Occurred()) || check_term(S, t) < 0) return NULL;
    uint64_t w[4];
    int rc = cuts(S, (int32_t)t, w);
    if (rc < 0) return NULL;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (int v = 0; v < 256; v++) {
        if (!(w[v >> 6] >> (v & 63) & 1)) continue;
        PyObject *x = PyLong_FromLong(v);
        if (!x || PyList_Append(out, x) < 0) { Py_XDECREF(x); Py_DECREF(out); return NULL; }
        Py_DECREF(x);
    }
    return out;
}

/* classes(t) -> [(lo, hi, derivative)]: the bytes [lo, hi) whose derivative is not nothing, neighbouring classes
   of one derivative merged (the row of t's DFA state, every byte not listed going to the dead state) */
static PyObject *TS_classes(TermStore *S, PyObject *arg) {
    long t = PyLong_AsLong(arg);
    if ((t == -1 && PyErr_Occurred()) || check_term(S, t) < 0) return NULL;
    uint64_t w[4];
    if (cuts(S, (int32_t)t, w) < 0) return NULL;
    w[0] |= 1;
    int bounds[258], nb = 0;
    for (int v = 0; v < 256; v++)
        if (w[v >> 6] >> (v & 63) & 1) bounds[nb++] = v;
    bounds[nb] = 256;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    int run_lo = -1;
    int32_t run_d = T_NOTHING;
    for (int i = 0; i <= nb; i++) {
        int32_t d = T_NOTHING;
        if (i < nb) {
            d = deriv(S, (int32_t)t, bounds[i]);
            if (d < 0) { Py_DECREF(out); return NULL; }
            if (d == run_d) continue;
        }
        if (run_d != T_NOTHING) {
            PyObject *item = Py_BuildValue("(iii)", run_lo, bounds[i], run_d);
            if (!item || PyList_Append(out, item) < 0) { Py_XDECREF(item); Py_DECREF(out); return NULL; }
            Py_DECREF(item);
        }
        run_lo = i < nb ? bounds[i] : 256;
        run_d = d;
    }
    return out;
}

static PyObject *TS_first_byte(TermStore *S, PyObject *arg) {
    long t = PyLong_AsLong(arg);
    if ((t == -1 && PyErr_Occurred()) || check_term(S, t) < 0) return NULL;
    int r = first_byte(S, (int32_t)t, 0);
    if (r == -3) return NULL;
    if (r == -2) Py_RETURN_NONE;
    return PyLong_FromLong(r);
}

static PyObject *TS_n_terms(TermStore *S, void *closure) { return PyLong_FromLongLong(S->n); }

static PyMethodDef TermStore_methods[] = {
    {"bytes_", (PyCFunction)TS_bytes, METH_O, "bytes_(ranges) -> the term of one byte in the (lo, hi) ranges"},
    {"lit", (PyCFunction)TS_lit, METH_O, "lit(data) -> the term of the literal bytes"},
    {"seq", (PyCFunction)TS_seq, METH_VARARGS, "seq(h, t) -> the sequence h then t"},
    {"alt", (PyCFunction)TS_alt, METH_O, "alt(items) -> the alternation of the terms"},
    {"rep", (PyCFunction)TS_rep, METH_VARARGS, "rep(x, lo, hi or None) -> x repeated lo..hi times"},
    {"external", (PyCFunction)TS_external, METH_O, "external(kind) -> a new GAT or MEM term (payload in Python)"},
    {"kind", (PyCFunction)TS_kind, METH_O, "kind(t) -> the term's kind"},
    {"nullable", (PyCFunction)TS_nullable, METH_O, "nullable(t) -> whether t matches the empty word"},
    {"minlen", (PyCFunction)TS_minlen, METH_O, "minlen(t) -> the length of t's shortest member (1 << 30: none)"},
    {"deriv", (PyCFunction)TS_deriv, METH_VARARGS, "deriv(t, byte) -> the derivative of t by the byte"},
    {"cuts", (PyCFunction)TS_cuts, METH_O, "cuts(t) -> sorted byte values where t's derivative may change"},
    {"classes", (PyCFunction)TS_classes, METH_O, "classes(t) -> [(lo, hi, derivative)] over bytes 0..255"},
    {"shortest_first_byte", (PyCFunction)TS_first_byte, METH_O,
     "shortest_first_byte(t) -> first byte of a shortest member, -1 if none or empty, None if undecided"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef TermStore_getset[] = {
    {"n_terms", (getter)TS_n_terms, NULL, "number of terms", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TermStoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dllm_constrain.constraints._terms.TermStore",
    .tp_basicsize = sizeof(TermStore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Hash-consed regex terms and their byte derivatives (see deriv_terms.NativeTerms).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)TermStore_init,
    .tp_dealloc = (destructor)TermStore_dealloc,
    .tp_traverse = (traverseproc)TermStore_traverse,
    .tp_clear = (inquiry)TermStore_clear,
    .tp_methods = TermStore_methods,
    .tp_getset = TermStore_getset,
};

static struct PyModuleDef terms_module = {
    PyModuleDef_HEAD_INIT, "_terms", "The derivative term algebra in C (deriv_terms.py is the reference).", -1, NULL,
};

PyMODINIT_FUNC PyInit__terms(void) {
    if (PyType_Ready(&TermStoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&terms_module);
    if (!m) return NULL;
    Py_INCREF(&TermStoreType);
    if (PyModule_AddObject(m, "TermStore", (PyObject *)&TermStoreType) < 0) {
        Py_DECREF(&TermStoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
