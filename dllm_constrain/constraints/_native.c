/* Native core of the token automaton: the walk of the vocabulary's byte trie against a lazily expanded byte DFA.
 *
 * Built by the package's own build (setup.py, ext_modules); dllm_constrain/constraints/_cwalk.py wraps it and falls
 * back to the numpy walker of token_automaton.py when it is absent. Arrays are read through the buffer protocol
 * (numpy arrays qualify), so neither the build nor this module needs numpy's headers.
 *
 * The trie is in DFS preorder: a node's subtree is the contiguous range [i, i + size[i]), so a dead node skips its
 * whole subtree, and every node's parent comes before it. A `Trie` object copies and validates the four trie arrays
 * once; it is immutable afterwards, so any number of threads may walk it at once (each with its own scratch).
 *
 * The work of a walk runs with the GIL released: the mask of one request is computed beside the model's forward
 * and beside other requests' masks. The DFA tables it reads may be written meanwhile by a Python thread expanding a
 * state; DerivDFA.expand writes a row before marking it expanded, so a row seen as expanded is complete, and one
 * seen as not expanded is reported as pending (the caller expands it and walks again). Tables that grow are
 * replaced, never resized in place; the buffers held here keep the arrays of this call alive.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    int32_t n_nodes;
    int32_t *parent;   /* parent[i] < i; parent[0] = 0 (the root) */
    uint8_t *byte;     /* the byte on the edge into node i */
    int32_t *size;     /* subtree size, >= 1, i + size[i] <= n_nodes */
    int32_t *node_tok; /* the token id node i spells, -1 if none */
    int32_t n_tokens;  /* nodes with a token: the most a walk can output */
} TrieObject;

/* A C-contiguous buffer of int32 (itemsize 4) or bytes (itemsize 1); writable if asked. On failure a Python error
 * is set. */
static int get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous%s buffer of %zd-byte items", name,
                     writable ? " writable" : "", itemsize);
        return -1;
    }
    /* 4-byte items are signed integers (int32), 1-byte items any byte or bool: a float or unsigned table is refused
     * rather than read as something it is not */
    const char *fmt = view->format ? view->format : "B";
    char kind = fmt[0] ? fmt[strlen(fmt) - 1] : 'B';
    int ok = view->itemsize == itemsize &&
             (itemsize == 4 ? (kind == 'i' || kind == 'l') : (kind == 'B' || kind == 'b' || kind == '?' || kind == 'c'));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: expected %s, got %zd-byte items of format '%s'", name,
                     itemsize == 4 ? "4-byte items of int32" : "1-byte items (uint8 or bool)", view->itemsize, fmt);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static Py_ssize_t n_items(const Py_buffer *view) { return view->len / view->itemsize; }

static void Trie_dealloc(TrieObject *self) {
    free(self->parent);
    free(self->byte);
    free(self->size);
    free(self->node_tok);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Trie_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"parent", "byte", "size", "node_tok", NULL};
    PyObject *o_parent, *o_byte, *o_size, *o_tok;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO:Trie", kwlist, &o_parent, &o_byte, &o_size, &o_tok))
        return NULL;
    Py_buffer b_parent, b_byte, b_size, b_tok;
    if (get_buffer(o_parent, &b_parent, 4, 0, "parent") < 0) return NULL;
    if (get_buffer(o_byte, &b_byte, 1, 0, "byte") < 0) { PyBuffer_Release(&b_parent); return NULL; }
    if (get_buffer(o_size, &b_size, 4, 0, "size") < 0) {
        PyBuffer_Release(&b_parent); PyBuffer_Release(&b_byte); return NULL;
    }
    if (get_buffer(o_tok, &b_tok, 4, 0, "node_tok") < 0) {
        PyBuffer_Release(&b_parent); PyBuffer_Release(&b_byte); PyBuffer_Release(&b_size); return NULL;
    }
    TrieObject *self = NULL;
    Py_ssize_t n = n_items(&b_parent);
    if (n < 1 || n > INT32_MAX || n_items(&b_byte) != n || n_items(&b_size) != n || n_items(&b_tok) != n) {
        PyErr_SetString(PyExc_ValueError, "parent, byte, size and node_tok must have the same length >= 1");
        goto done;
    }
    const int32_t *parent = b_parent.buf, *size = b_size.buf, *tok = b_tok.buf;
    /* the walk trusts these invariants (no bounds checks in the loop): check them once here */
    if (size[0] != n) {
        PyErr_SetString(PyExc_ValueError, "size[0] must be the number of nodes (the root's subtree is the trie)");
        goto done;
    }
    int32_t n_tokens = 0;
    for (Py_ssize_t i = 1; i < n; i++) {
        if (parent[i] < 0 || parent[i] >= i || size[i] < 1 || size[i] > n - i) {
            PyErr_Format(PyExc_ValueError, "node %zd: not a preorder trie (parent %d, size %d)", i, (int)parent[i],
                         (int)size[i]);
            goto done;
        }
        if (tok[i] >= 0) n_tokens++;
    }
    self = (TrieObject *)type->tp_alloc(type, 0);
    if (self == NULL) goto done;
    self->n_nodes = (int32_t)n;
    self->n_tokens = n_tokens;
    self->parent = malloc((size_t)n * 4);
    self->byte = malloc((size_t)n);
    self->size = malloc((size_t)n * 4);
    self->node_tok = malloc((size_t)n * 4);
    if (!self->parent || !self->byte || !self->size || !self->node_tok) {
        Py_DECREF(self);
        self = NULL;
        PyErr_NoMemory();
        goto done;
    }
    memcpy(self->parent, parent, (size_t)n * 4);
    memcpy(self->byte, b_byte.buf, (size_t)n);
    memcpy(self->size, size, (size_t)n * 4);
    memcpy(self->node_tok, tok, (size_t)n * 4);
done:
    PyBuffer_Release(&b_parent);
    PyBuffer_Release(&b_byte);
    PyBuffer_Release(&b_size);
    PyBuffer_Release(&b_tok);
    return (PyObject *)self;
}

/* The DFA tables a walk reads: T (int32 [rows * 256]) and expanded (one byte per row), fetched from the DFA object
 * (its attributes T and expanded), and fetched again after a call to its expand() (which may replace them). */
typedef struct {
    Py_buffer T, expanded;
    int have;
    int64_t n_rows;
} Tables;

static void tables_release(Tables *t) {
    if (t->have) {
        PyBuffer_Release(&t->T);
        PyBuffer_Release(&t->expanded);
        t->have = 0;
    }
}

static int tables_fetch(Tables *t, PyObject *dfa) {
    tables_release(t);
    PyObject *T = PyObject_GetAttrString(dfa, "T");
    if (T == NULL) return -1;
    int r = get_buffer(T, &t->T, 4, 0, "dfa.T");
    Py_DECREF(T);
    if (r < 0) return -1;
    PyObject *e = PyObject_GetAttrString(dfa, "expanded");
    if (e == NULL) { PyBuffer_Release(&t->T); return -1; }
    r = get_buffer(e, &t->expanded, 1, 0, "dfa.expanded");
    Py_DECREF(e);
    if (r < 0) { PyBuffer_Release(&t->T); return -1; }
    t->have = 1;
    t->n_rows = n_items(&t->T) / 256;
    if (n_items(&t->expanded) < t->n_rows) t->n_rows = n_items(&t->expanded);
    return 0;
}

/* The walk proper, from node i on (no Python API: it runs without the GIL). st[k] is the DFA state after node k's
 * bytes. Stops at the end of the trie (returns n_nodes) or at the first node whose parent state has no computed
 * row in these tables (returns that node; the caller expands the state and resumes there). */
static int32_t trie_walk(const TrieObject *tr, const int32_t *T, int64_t n_rows, const uint8_t *expanded, int32_t i,
                         int32_t *st, int32_t *out_tok, int32_t *out_tgt, int32_t *n_out_io) {
    const int32_t *parent = tr->parent, *size = tr->size, *node_tok = tr->node_tok;
    const uint8_t *byte = tr->byte;
    const int32_t n = tr->n_nodes;
    int32_t n_out = *n_out_io;
    while (i < n) {
        int32_t p = st[parent[i]];
        if (p < 0 || p >= n_rows || !expanded[p]) break;
        int32_t q = T[(int64_t)p * 256 + byte[i]];
        st[i] = q;
        if (q == 0) { i += size[i]; continue; }
        int32_t t = node_tok[i];
        if (t >= 0) { out_tok[n_out] = t; out_tgt[n_out] = q; n_out++; }
        i++;
    }
    *n_out_io = n_out;
    return i;
}

PyDoc_STRVAR(Trie_walk_doc,
"walk(dfa, s, st, out_tok, out_tgt) -> n_out\n\n"
"Walk the trie from state s (> 0) of the lazy byte DFA `dfa` (attributes T: int32 [rows, 256], state 0 = DEAD;\n"
"expanded: bool [rows]; method expand(state)). Writes into out_tok, out_tgt (int32 [>= n_tokens]) the n_out token\n"
"ids allowed from s and their target states, in preorder (lexicographic order of the tokens' bytes). st: int32\n"
"scratch [>= n_nodes]. The walk runs with the GIL released; on meeting a state whose row is not computed it takes\n"
"the GIL back, calls dfa.expand(state) (whose exceptions propagate) and goes on from where it stopped.");

static PyObject *Trie_walk(TrieObject *self, PyObject *args) {
    PyObject *dfa, *o_st, *o_tok, *o_tgt;
    long long s;
    if (!PyArg_ParseTuple(args, "OLOOO:walk", &dfa, &s, &o_st, &o_tok, &o_tgt)) return NULL;
    Py_buffer bufs[3];
    PyObject *objs[3] = {o_st, o_tok, o_tgt};
    const char *names[3] = {"st", "out_tok", "out_tgt"};
    Tables tab = {.have = 0};
    int got = 0;
    PyObject *result = NULL;
    for (; got < 3; got++)
        if (get_buffer(objs[got], &bufs[got], 4, 1, names[got]) < 0) goto done;
    if (n_items(&bufs[0]) < self->n_nodes) {
        PyErr_Format(PyExc_ValueError, "st: need %d items, got %zd", (int)self->n_nodes, n_items(&bufs[0]));
        goto done;
    }
    if (n_items(&bufs[1]) < self->n_tokens || n_items(&bufs[2]) < self->n_tokens) {
        PyErr_Format(PyExc_ValueError, "out_tok and out_tgt: need %d items", (int)self->n_tokens);
        goto done;
    }
    if (s <= 0 || s > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "state %lld is not a live DFA state", s);
        goto done;
    }
    if (tables_fetch(&tab, dfa) < 0) goto done;
    if (s >= tab.n_rows) {
        PyErr_Format(PyExc_ValueError, "state %lld is not a live DFA state (the tables have %lld rows)", s,
                     (long long)tab.n_rows);
        goto done;
    }
    int32_t *st = bufs[0].buf, *out_tok = bufs[1].buf, *out_tgt = bufs[2].buf;
    st[0] = (int32_t)s;
    int32_t i = 1, n_out = 0, last_expanded = -1;
    for (;;) {
        int32_t stop;
        Py_BEGIN_ALLOW_THREADS
        stop = trie_walk(self, tab.T.buf, tab.n_rows, tab.expanded.buf, i, st, out_tok, out_tgt, &n_out);
        Py_END_ALLOW_THREADS
        if (stop >= self->n_nodes) break;
        i = stop;
        int32_t p = st[self->parent[i]];
        if (p <= 0) {
            PyErr_Format(PyExc_ValueError, "dfa.T holds state %d: not a state id", (int)p);
            goto done;
        }
        if (p == last_expanded) {
            /* a state just expanded but still without a row: the DFA object broke its contract (expand computes
             * the row into the tables T / expanded it exposes) */
            PyErr_Format(PyExc_RuntimeError, "dfa.expand(%d) did not compute the row of state %d", (int)p, (int)p);
            goto done;
        }
        tables_release(&tab);
        PyObject *r = PyObject_CallMethod(dfa, "expand", "i", (int)p);
        if (r == NULL) goto done;
        Py_DECREF(r);
        if (tables_fetch(&tab, dfa) < 0) goto done;
        last_expanded = p;
    }
    result = PyLong_FromLong(n_out);
done:
    tables_release(&tab);
    for (int k = 0; k < got; k++) PyBuffer_Release(&bufs[k]);
    return result;
}

static PyObject *Trie_get_n_nodes(TrieObject *self, void *closure) { return PyLong_FromLong(self->n_nodes); }
static PyObject *Trie_get_n_tokens(TrieObject *self, void *closure) { return PyLong_FromLong(self->n_tokens); }

static PyMethodDef Trie_methods[] = {
    {"walk", (PyCFunction)Trie_walk, METH_VARARGS, Trie_walk_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Trie_getset[] = {
    {"n_nodes", (getter)Trie_get_n_nodes, NULL, "number of trie nodes (the root included)", NULL},
    {"n_tokens", (getter)Trie_get_n_tokens, NULL, "nodes that spell a token: the most one walk outputs", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(Trie_doc,
"Trie(parent, byte, size, node_tok)\n\n"
"The vocabulary trie in DFS preorder (int32 parent, uint8 byte, int32 subtree size, int32 token id or -1 per node;\n"
"node 0 is the root). The arrays are copied and validated once; the object is immutable and thread-safe.");

static PyTypeObject TrieType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dllm_constrain.constraints._native.Trie",
    .tp_basicsize = sizeof(TrieObject),
    .tp_dealloc = (destructor)Trie_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = Trie_doc,
    .tp_methods = Trie_methods,
    .tp_getset = Trie_getset,
    .tp_new = Trie_new,
};

/* ------------------------------------------------------------------------------------------------------------------
 * Grouping a walk's output by target state (TokenAutomaton._compute_trans): the same result as the numpy grouping,
 * without its passes over the vocabulary per group (a bool row, a scatter and a packbits for each large group and
 * for the row of every allowed token cost ~0.7 ms per state at 128K tokens).
 */

/* Sort n ids in [0, 2**bits) ascending: insertion sort when short, else LSD radix sort by 11-bit digits through
 * `tmp` (n items); qsort's compare calls cost ~60 ns per id at a few thousand. */
static void sort_ids(int64_t *a, int64_t *tmp, Py_ssize_t n, int bits) {
    if (n <= 48) {
        for (Py_ssize_t i = 1; i < n; i++) {
            int64_t x = a[i];
            Py_ssize_t j = i;
            for (; j > 0 && a[j - 1] > x; j--) a[j] = a[j - 1];
            a[j] = x;
        }
        return;
    }
    Py_ssize_t cnt[2048];
    int64_t *src = a, *dst = tmp;
    for (int shift = 0; shift < bits; shift += 11) {
        memset(cnt, 0, sizeof cnt);
        for (Py_ssize_t i = 0; i < n; i++) cnt[(src[i] >> shift) & 2047]++;
        Py_ssize_t pos = 0;
        for (int d = 0; d < 2048; d++) {
            Py_ssize_t c = cnt[d];
            cnt[d] = pos;
            pos += c;
        }
        for (Py_ssize_t i = 0; i < n; i++) dst[cnt[(src[i] >> shift) & 2047]++] = src[i];
        int64_t *t = src;
        src = dst, dst = t;
    }
    if (src != a) memcpy(a, src, (size_t)n * sizeof(int64_t));
}

typedef struct {
    Py_ssize_t n, nbytes, dense_min, small, n_groups;
    const int32_t *tok, *tgt;
    int64_t *order;      /* the sparse groups' ids by group (targets ascending), ascending within a group */
    int32_t *g_target;   /* per group: its target state */
    Py_ssize_t *g_start; /* per group: its first index in order (dense groups: an empty range) */
    uint8_t *all_row;    /* packed row of every token (also finds repeated ids) */
    int64_t *all_sorted; /* every token ascending (n <= dense_min), or NULL */
    uint8_t **dense;     /* per group: its packed row (more than dense_min tokens), or NULL */
    int32_t repeated;    /* an id found twice, or -1 */
} Grouping;

static void grouping_free(Grouping *g) {
    if (g->dense)
        for (Py_ssize_t k = 0; k < g->n_groups; k++) free(g->dense[k]);
    free(g->dense);
    free(g->order);
    free(g->g_target);
    free(g->g_start);
    free(g->all_row);
    free(g->all_sorted);
}

/* The grouping proper (no Python API: runs without the GIL), in passes over the walk's output, never over the
 * vocabulary: large groups go straight into their packed rows, small ones are gathered and radix-sorted. Returns
 * 0, or -1 when out of memory (g->repeated >= 0: the input repeats an id, and nothing else is done). */
static int grouping_run(Grouping *g, int32_t max_t) {
    Py_ssize_t n = g->n;
    int bits = 1;
    while (bits < 62 && ((Py_ssize_t)1 << bits) < g->nbytes * 8) bits++;
    Py_ssize_t *cnt = calloc((size_t)max_t + 1, sizeof(Py_ssize_t)); /* target -> count, then -> group */
    Py_ssize_t *fill = NULL;
    int64_t *tmp = NULL;
    int rc = -1;
    g->all_row = calloc((size_t)g->nbytes, 1);
    if (!cnt || !g->all_row) goto out;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t t = g->tok[i];
        uint8_t bit = (uint8_t)(1u << (t & 7));
        if (g->all_row[t >> 3] & bit) {
            g->repeated = t;
            rc = 0;
            goto out;
        }
        g->all_row[t >> 3] |= bit;
        cnt[g->tgt[i]]++;
    }
    Py_ssize_t k = 0;
    for (int32_t u = 0; u <= max_t; u++) k += cnt[u] > 0;
    g->n_groups = k;
    g->g_target = malloc((size_t)(k ? k : 1) * sizeof(int32_t));
    g->g_start = calloc((size_t)k + 1, sizeof(Py_ssize_t));
    g->dense = calloc((size_t)(k ? k : 1), sizeof(uint8_t *));
    fill = malloc((size_t)(k ? k : 1) * sizeof(Py_ssize_t));
    g->order = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    tmp = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (!g->g_target || !g->g_start || !g->dense || !fill || !g->order || !tmp) goto out;
    /* groups in target order; a dense group gets its row and no range of `order`; cnt[u] becomes u's group */
    Py_ssize_t j = 0, pos = 0;
    for (int32_t u = 0; u <= max_t; u++) {
        Py_ssize_t c = cnt[u];
        if (!c) continue;
        g->g_target[j] = u;
        g->g_start[j] = fill[j] = pos;
        if (c > g->dense_min) {
            if (!(g->dense[j] = calloc((size_t)g->nbytes, 1))) goto out;
        } else {
            pos += c;
        }
        cnt[u] = j++;
    }
    g->g_start[k] = pos;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t gj = cnt[g->tgt[i]];
        int32_t t = g->tok[i];
        if (g->dense[gj]) g->dense[gj][t >> 3] |= (uint8_t)(1u << (t & 7));
        else g->order[fill[gj]++] = t;
    }
    for (j = 0; j < k; j++)
        if (!g->dense[j]) sort_ids(g->order + g->g_start[j], tmp, fill[j] - g->g_start[j], bits);
    if (n <= g->dense_min) {
        if (!(g->all_sorted = malloc((size_t)(n ? n : 1) * sizeof(int64_t)))) goto out;
        for (Py_ssize_t i = 0; i < n; i++) g->all_sorted[i] = g->tok[i];
        sort_ids(g->all_sorted, tmp, n, bits);
    }
    rc = 0;
out:
    free(cnt);
    free(fill);
    free(tmp);
    return rc;
}

PyDoc_STRVAR(group_by_target_doc,
"group_by_target(tok, tgt, nbytes, dense_min, small) -> (groups, all_row, all_sorted)\n\n"
"tok, tgt: int32 buffers of equal length (a walk's token ids, distinct, in [0, 8 * nbytes), and their target\n"
"states, >= 1). groups: [(target, packed, data)] with the targets ascending; data is the group's packed row\n"
"(nbytes bytes, token t = bit t % 8 of byte t // 8) when it has more than dense_min tokens (packed True), else its\n"
"ids ascending as int64 bytes. all_row: the packed row of every token when there are more than `small`, else None;\n"
"all_sorted: every id ascending (int64 bytes) when there are at most dense_min, else None. Runs without the GIL.");

static PyObject *group_by_target(PyObject *module, PyObject *args) {
    PyObject *o_tok, *o_tgt;
    Py_ssize_t nbytes, dense_min, small;
    if (!PyArg_ParseTuple(args, "OOnnn:group_by_target", &o_tok, &o_tgt, &nbytes, &dense_min, &small)) return NULL;
    Py_buffer tv, gv;
    if (get_buffer(o_tok, &tv, 4, 0, "tok") < 0) return NULL;
    if (get_buffer(o_tgt, &gv, 4, 0, "tgt") < 0) {
        PyBuffer_Release(&tv);
        return NULL;
    }
    PyObject *result = NULL, *groups = NULL;
    Grouping g;
    memset(&g, 0, sizeof g);
    g.repeated = -1;
    g.n = n_items(&tv), g.nbytes = nbytes, g.dense_min = dense_min, g.small = small;
    g.tok = tv.buf, g.tgt = gv.buf;
    if (n_items(&gv) != g.n) {
        PyErr_Format(PyExc_ValueError, "tok and tgt differ in length (%zd, %zd)", g.n, n_items(&gv));
        goto done;
    }
    if (nbytes <= 0 || nbytes > ((Py_ssize_t)1 << 28) || dense_min < 0 || small < 0) {
        PyErr_SetString(PyExc_ValueError, "nbytes must be in 1 .. 2**28, dense_min and small >= 0");
        goto done;
    }
    int32_t max_t = 0;
    for (Py_ssize_t i = 0; i < g.n; i++) {
        if (g.tok[i] < 0 || (Py_ssize_t)g.tok[i] >= nbytes * 8) {
            PyErr_Format(PyExc_ValueError, "token id %d outside 0 .. %zd", (int)g.tok[i], nbytes * 8 - 1);
            goto done;
        }
        if (g.tgt[i] <= 0) {
            PyErr_Format(PyExc_ValueError, "target %d is not a live state", (int)g.tgt[i]);
            goto done;
        }
        if (g.tgt[i] > max_t) max_t = g.tgt[i];
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = grouping_run(&g, max_t);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (g.repeated >= 0) {
        PyErr_Format(PyExc_ValueError, "token id %d occurs twice", (int)g.repeated);
        goto done;
    }
    if (!(groups = PyList_New(g.n_groups))) goto done;
    for (Py_ssize_t j = 0; j < g.n_groups; j++) {
        Py_ssize_t a = g.g_start[j], c = g.g_start[j + 1] - a; /* (a dense group's range is empty) */
        PyObject *data = g.dense[j] ? PyBytes_FromStringAndSize((const char *)g.dense[j], nbytes)
                                    : PyBytes_FromStringAndSize((const char *)(g.order + a), c * (Py_ssize_t)sizeof(int64_t));
        PyObject *item = data ? Py_BuildValue("(iON)", (int)g.g_target[j], g.dense[j] ? Py_True : Py_False, data) : NULL;
        if (!item) goto done;
        PyList_SET_ITEM(groups, j, item);
    }
    PyObject *all_row = g.n > small ? PyBytes_FromStringAndSize((const char *)g.all_row, nbytes) : Py_NewRef(Py_None);
    PyObject *all_sorted = g.all_sorted ? PyBytes_FromStringAndSize((const char *)g.all_sorted,
                                                                    g.n * (Py_ssize_t)sizeof(int64_t))
                                        : Py_NewRef(Py_None);
    if (all_row && all_sorted) result = Py_BuildValue("(ONN)", groups, all_row, all_sorted);
    else {
        Py_XDECREF(all_row);
        Py_XDECREF(all_sorted);
    }
done:
    Py_XDECREF(groups);
    grouping_free(&g);
    PyBuffer_Release(&tv);
    PyBuffer_Release(&gv);
    return result;
}

/* ------------------------------------------------------------------------------------------------------------------
 * RowStore: the token transitions of the states whose transitions are known, in flat arrays, so that the mask row
 * between two state sets (SetAlgebra.row) is built in one C loop instead of a Python loop over the states of the
 * first set (split into "every successor in the second set" and "some", then an OR of interned rows and a scatter of
 * sparse ids). Same result as TokenAutomaton.packed_row over SetAlgebra._split_step; tests compare the two.
 *
 * Filled by the token automaton as it computes a state's transitions (add_state, under its lock) and as it interns
 * packed rows (add_row, the same numbering as its allp table). Calls hold the GIL throughout: a row build never
 * sees a state half added.
 */

typedef struct {
    PyObject_HEAD
    Py_ssize_t nbytes, words;      /* a packed row: nbytes (a multiple of 8) = words uint64 */
    Py_ssize_t cap_states;
    uint8_t *known;                /* per state: transitions added */
    int32_t *all_row;              /* per state: interned row of every allowed token, or -1 */
    int64_t *all_off;              /* per state: its sorted ids in `ids` (when all_row is -1) */
    int32_t *all_len;
    int64_t *e_first;              /* per state: its first entry */
    int32_t *e_count;
    int32_t *e_u, *e_row, *e_len;  /* per entry: target, its interned row or -1, its id count */
    int64_t *e_off;                /* per entry: its ids in `ids` (when e_row is -1) */
    Py_ssize_t n_e, cap_e;
    int32_t *ids;
    Py_ssize_t n_ids, cap_ids;
    uint64_t *rows;
    Py_ssize_t n_rows, cap_rows;
    uint32_t *stamp;               /* per row: the build that ORed it last */
    uint32_t cur;
    int32_t max_u;                 /* the largest target added so far */
} RowStoreObject;

static int grow(void **p, Py_ssize_t *cap, Py_ssize_t need, size_t item) {
    if (need <= *cap) return 0;
    Py_ssize_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * item);
    if (!q) {
        PyErr_NoMemory();
        return -1;
    }
    memset((char *)q + (size_t)*cap * item, 0, (size_t)(c - *cap) * item);
    *p = q;
    *cap = c;
    return 0;
}

static int grow_states(RowStoreObject *self, Py_ssize_t need) {
    if (need <= self->cap_states) return 0;
    Py_ssize_t c = self->cap_states ? self->cap_states : 64;
    while (c < need) c *= 2;
    Py_ssize_t old;
#define GROW_ARRAY(field, type)                                                    \
    old = self->cap_states;                                                        \
    if (grow((void **)&self->field, &old, c, sizeof(type)) < 0) return -1;
    GROW_ARRAY(known, uint8_t)
    GROW_ARRAY(all_row, int32_t)
    GROW_ARRAY(all_off, int64_t)
    GROW_ARRAY(all_len, int32_t)
    GROW_ARRAY(e_first, int64_t)
    GROW_ARRAY(e_count, int32_t)
#undef GROW_ARRAY
    self->cap_states = c;
    return 0;
}

/* the four per-entry arrays, grown together (cap_e counts only once all four have it) */
static int grow_entries(RowStoreObject *self, Py_ssize_t need) {
    if (need <= self->cap_e) return 0;
    Py_ssize_t c = self->cap_e ? self->cap_e : 64;
    while (c < need) c *= 2;
    void *p;
    if (!(p = realloc(self->e_u, (size_t)c * sizeof(int32_t)))) goto oom;
    self->e_u = p;
    if (!(p = realloc(self->e_row, (size_t)c * sizeof(int32_t)))) goto oom;
    self->e_row = p;
    if (!(p = realloc(self->e_len, (size_t)c * sizeof(int32_t)))) goto oom;
    self->e_len = p;
    if (!(p = realloc(self->e_off, (size_t)c * sizeof(int64_t)))) goto oom;
    self->e_off = p;
    self->cap_e = c;
    return 0;
oom:
    PyErr_NoMemory();
    return -1;
}

static void RowStore_dealloc(RowStoreObject *self) {
    free(self->known);
    free(self->all_row);
    free(self->all_off);
    free(self->all_len);
    free(self->e_first);
    free(self->e_count);
    free(self->e_u);
    free(self->e_row);
    free(self->e_len);
    free(self->e_off);
    free(self->ids);
    free(self->rows);
    free(self->stamp);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *RowStore_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"nbytes", NULL};
    Py_ssize_t nbytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &nbytes)) return NULL;
    if (nbytes <= 0 || nbytes % 8 || nbytes > ((Py_ssize_t)1 << 28)) {
        PyErr_Format(PyExc_ValueError, "nbytes must be a positive multiple of 8, got %zd", nbytes);
        return NULL;
    }
    RowStoreObject *self = (RowStoreObject *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->nbytes = nbytes;
    self->words = nbytes / 8;
    return (PyObject *)self;
}

/* ids from a buffer of int64 (a numpy int64 array, or group_by_target's bytes) appended to the pool as int32 */
static int append_ids(RowStoreObject *self, PyObject *obj, int64_t *off, int32_t *len) {
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (v.len % 8) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_ValueError, "ids: expected int64 items");
        return -1;
    }
    Py_ssize_t n = v.len / 8, V = self->nbytes * 8;
    const int64_t *src = v.buf;
    if (grow((void **)&self->ids, &self->cap_ids, self->n_ids + n, sizeof(int32_t)) < 0) {
        PyBuffer_Release(&v);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (src[i] < 0 || src[i] >= V) {
            PyBuffer_Release(&v);
            PyErr_Format(PyExc_ValueError, "token id %lld outside 0 .. %zd", (long long)src[i], V - 1);
            return -1;
        }
        self->ids[self->n_ids + i] = (int32_t)src[i];
    }
    *off = self->n_ids;
    *len = (int32_t)n;
    self->n_ids += n;
    PyBuffer_Release(&v);
    return 0;
}

static int check_row_id(RowStoreObject *self, long r) {
    if (r < -1 || r >= self->n_rows) {
        PyErr_Format(PyExc_ValueError, "row %ld is not an added row (%zd so far)", r, self->n_rows);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(RowStore_add_row_doc,
"add_row(row) -> index\n\nAppend a packed row (nbytes bytes); indices count from 0 in the order of the calls.");

static PyObject *RowStore_add_row(RowStoreObject *self, PyObject *arg) {
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (v.len != self->nbytes) {
        PyErr_Format(PyExc_ValueError, "a row is %zd bytes, got %zd", self->nbytes, v.len);
        PyBuffer_Release(&v);
        return NULL;
    }
    Py_ssize_t cap = self->cap_rows;
    if (grow((void **)&self->stamp, &cap, self->n_rows + 1, sizeof(uint32_t)) < 0 ||
        grow((void **)&self->rows, &self->cap_rows, self->n_rows + 1, (size_t)self->nbytes) < 0) {
        PyBuffer_Release(&v);
        return NULL;
    }
    memcpy(self->rows + self->n_rows * self->words, v.buf, (size_t)self->nbytes);
    PyBuffer_Release(&v);
    return PyLong_FromSsize_t(self->n_rows++);
}

PyDoc_STRVAR(RowStore_add_state_doc,
"add_state(q, entries, all_row, all_ids)\n\n"
"The token transitions of state q (> 0, added once): entries [(target, row, ids)] with row an added row's index\n"
"(the tokens into that target, packed) or -1 and ids an int64 buffer of them; all_row: the index of the packed row\n"
"of every allowed token or -1, then all_ids (int64 buffer) lists them.");

static PyObject *RowStore_add_state(RowStoreObject *self, PyObject *args) {
    long long q;
    PyObject *entries, *all_ids;
    long all_row;
    if (!PyArg_ParseTuple(args, "LO!lO:add_state", &q, &PyList_Type, &entries, &all_row, &all_ids)) return NULL;
    if (q <= 0 || q > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "state %lld is not a live state", q);
        return NULL;
    }
    if (check_row_id(self, all_row) < 0 || grow_states(self, (Py_ssize_t)q + 1) < 0) return NULL;
    if (self->known[q]) {
        PyErr_Format(PyExc_ValueError, "state %lld was added before", q);
        return NULL;
    }
    Py_ssize_t k = PyList_GET_SIZE(entries), first = self->n_e, ids0 = self->n_ids;
    if (grow_entries(self, first + k) < 0) return NULL;
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *item = PyList_GET_ITEM(entries, j), *ids;
        int u;
        long r;
        if (!PyArg_ParseTuple(item, "ilO:entry", &u, &r, &ids)) goto fail;
        if (u <= 0) {
            PyErr_Format(PyExc_ValueError, "target %d is not a live state", u);
            goto fail;
        }
        if (check_row_id(self, r) < 0) goto fail;
        self->e_u[first + j] = u;
        if (u > self->max_u) self->max_u = u;
        self->e_row[first + j] = (int32_t)r;
        self->e_off[first + j] = 0;
        self->e_len[first + j] = 0;
        if (r < 0 && append_ids(self, ids, &self->e_off[first + j], &self->e_len[first + j]) < 0) goto fail;
    }
    self->all_row[q] = (int32_t)all_row;
    self->all_len[q] = 0;
    self->all_off[q] = 0;
    if (all_row < 0 && all_ids != Py_None && append_ids(self, all_ids, &self->all_off[q], &self->all_len[q]) < 0)
        goto fail;
    self->e_first[q] = first;
    self->e_count[q] = (int32_t)k;
    self->n_e = first + k;
    self->known[q] = 1;
    Py_RETURN_NONE;
fail:
    self->n_ids = ids0; /* nothing of the state is kept */
    return NULL;
}

static inline int has_bit(const uint8_t *set, Py_ssize_t len, Py_ssize_t q) {
    return q < len * 8 && ((set[q >> 3] >> (q & 7)) & 1);
}

static inline void or_ids(uint8_t *row, const int32_t *ids, int32_t n) {
    for (int32_t i = 0; i < n; i++) row[ids[i] >> 3] |= (uint8_t)(1u << (ids[i] & 7));
}

static inline void or_row(RowStoreObject *self, uint64_t *dst, int32_t r) {
    if (self->stamp[r] == self->cur) return;
    self->stamp[r] = self->cur;
    const uint64_t *src = self->rows + (Py_ssize_t)r * self->words;
    for (Py_ssize_t w = 0; w < self->words; w++) dst[w] |= src[w];
}

PyDoc_STRVAR(RowStore_row_doc,
"row(bi, bn, accepting, eos_id) -> (row, unknown)\n\n"
"The packed mask row between the state sets bi and bn (little-endian bitsets as bytes; bit 0 = ENDED): every token\n"
"by which some state of bi reaches bn, and EOS when bn holds ENDED and bi holds ENDED or an accepting state\n"
"(accepting: a byte per state). unknown: some state of bi has no transitions added (the row then leaves it out).");

static PyObject *RowStore_row(RowStoreObject *self, PyObject *args) {
    Py_buffer bi, bn, acc;
    long long eos;
    if (!PyArg_ParseTuple(args, "y*y*y*L:row", &bi, &bn, &acc, &eos)) return NULL;
    PyObject *result = NULL, *out = NULL;
    if (eos < 0 || eos >= self->nbytes * 8) {
        PyErr_Format(PyExc_ValueError, "eos id %lld outside the row", eos);
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, self->nbytes);
    if (!out) goto done;
    uint64_t *dst = (uint64_t *)PyBytes_AS_STRING(out); /* PyBytes data is aligned to 8 on CPython */
    uint8_t *row = (uint8_t *)dst;
    memset(dst, 0, (size_t)self->nbytes);
    if (++self->cur == 0) { /* the stamps wrapped: forget them */
        memset(self->stamp, 0, (size_t)self->n_rows * sizeof(uint32_t));
        self->cur = 1;
    }
    const uint8_t *a = bi.buf, *b = bn.buf, *ac = acc.buf;
    Py_ssize_t alen = bi.len, blen = bn.len, aclen = acc.len;
    int ended_next = has_bit(b, blen, 0), eos_ok = 0, unknown = 0;
    for (Py_ssize_t byte = 0; byte < alen; byte++) {
        unsigned v = a[byte];
        while (v) {
            int bit = __builtin_ctz(v);
            v &= v - 1;
            Py_ssize_t q = byte * 8 + bit;
            if (q == 0) {
                eos_ok |= ended_next;
                continue;
            }
            if (ended_next && q < aclen && ac[q]) eos_ok = 1;
            if (q >= self->cap_states || !self->known[q]) {
                unknown = 1;
                continue;
            }
            Py_ssize_t e0 = self->e_first[q], e1 = e0 + self->e_count[q], e;
            for (e = e0; e < e1; e++)
                if (!has_bit(b, blen, self->e_u[e])) break;
            if (e == e1) { /* every successor in bn: every allowed token */
                if (self->all_row[q] >= 0) or_row(self, dst, self->all_row[q]);
                else or_ids(row, self->ids + self->all_off[q], self->all_len[q]);
                continue;
            }
            for (e = e0; e < e1; e++) {
                if (!has_bit(b, blen, self->e_u[e])) continue;
                if (self->e_row[e] >= 0) or_row(self, dst, self->e_row[e]);
                else or_ids(row, self->ids + self->e_off[e], self->e_len[e]);
            }
        }
    }
    if (eos_ok) row[eos >> 3] |= (uint8_t)(1u << (eos & 7));
    result = Py_BuildValue("(OO)", out, unknown ? Py_True : Py_False);
done:
    Py_XDECREF(out);
    PyBuffer_Release(&bi);
    PyBuffer_Release(&bn);
    PyBuffer_Release(&acc);
    return result;
}

/* the members of a state set, a little-endian bitset: for (byte, v = set[byte]; v; v &= v - 1) q = byte * 8 + ctz */
#define FOR_MEMBERS(set, len, q)                                                                                   \
    for (Py_ssize_t _byte = 0; _byte < (len); _byte++)                                                             \
        for (unsigned _v = (set)[_byte]; _v; _v &= _v - 1)                                                         \
            for (Py_ssize_t q = _byte * 8 + __builtin_ctz(_v), _once = 1; _once; _once = 0)

static inline int known_state(const RowStoreObject *self, Py_ssize_t q) {
    return q < self->cap_states && self->known[q];
}

static int append_long(PyObject *list, Py_ssize_t q) {
    PyObject *v = PyLong_FromSsize_t(q);
    if (!v) return -1;
    int rc = PyList_Append(list, v);
    Py_DECREF(v);
    return rc;
}

PyDoc_STRVAR(RowStore_step_open_doc,
"step_open(f, accepting) -> (succ, unknown, any_accepting)\n\n"
"Over the live members of the state set f (a little-endian bitset as bytes; bit 0 = ENDED, skipped): succ, the\n"
"union of the known members' token successors (bytes); unknown, the members with no transitions added, ascending;\n"
"any_accepting, whether some live member accepts (accepting: a byte per state).");

static PyObject *RowStore_step_open(RowStoreObject *self, PyObject *args) {
    Py_buffer f, acc;
    if (!PyArg_ParseTuple(args, "y*y*:step_open", &f, &acc)) return NULL;
    PyObject *out = NULL, *unknown = NULL, *result = NULL;
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)self->max_u / 8 + 1);
    unknown = PyList_New(0);
    if (!out || !unknown) goto done;
    uint8_t *succ = (uint8_t *)PyBytes_AS_STRING(out);
    memset(succ, 0, (size_t)PyBytes_GET_SIZE(out));
    const uint8_t *a = f.buf, *ac = acc.buf;
    int any_acc = 0;
    FOR_MEMBERS(a, f.len, q) {
        if (q == 0) continue;
        if (q < acc.len && ac[q]) any_acc = 1;
        if (!known_state(self, q)) {
            if (append_long(unknown, q) < 0) goto done;
            continue;
        }
        Py_ssize_t e0 = self->e_first[q], e1 = e0 + self->e_count[q];
        for (Py_ssize_t e = e0; e < e1; e++) succ[self->e_u[e] >> 3] |= (uint8_t)(1u << (self->e_u[e] & 7));
    }
    result = Py_BuildValue("(OOO)", out, unknown, any_acc ? Py_True : Py_False);
done:
    Py_XDECREF(out);
    Py_XDECREF(unknown);
    PyBuffer_Release(&f);
    PyBuffer_Release(&acc);
    return result;
}

PyDoc_STRVAR(RowStore_back_open_doc,
"back_open(f, x, accepting, ended_ok) -> (back, unknown)\n\n"
"The members of state set f that an open position takes into state set x (bitsets as bytes, bit 0 = ENDED): ENDED\n"
"and accepting members when ended_ok (x holds ENDED: an EOS gets there), and the members with a known token\n"
"successor in x (back, bytes of f's length); unknown: the other members whose transitions are not added, ascending.");

static PyObject *RowStore_back_open(RowStoreObject *self, PyObject *args) {
    Py_buffer f, x, acc;
    int ended_ok;
    if (!PyArg_ParseTuple(args, "y*y*y*p:back_open", &f, &x, &acc, &ended_ok)) return NULL;
    PyObject *out = NULL, *unknown = NULL, *result = NULL;
    out = PyBytes_FromStringAndSize(NULL, f.len);
    unknown = PyList_New(0);
    if (!out || !unknown) goto done;
    uint8_t *back = (uint8_t *)PyBytes_AS_STRING(out);
    memset(back, 0, (size_t)f.len);
    const uint8_t *a = f.buf, *b = x.buf, *ac = acc.buf;
    FOR_MEMBERS(a, f.len, q) {
        int in = 0;
        if (q == 0 || (ended_ok && q < acc.len && ac[q])) {
            in = ended_ok;
        } else if (!known_state(self, q)) {
            if (append_long(unknown, q) < 0) goto done;
        } else {
            Py_ssize_t e0 = self->e_first[q], e1 = e0 + self->e_count[q];
            for (Py_ssize_t e = e0; e < e1 && !in; e++) in = has_bit(b, x.len, self->e_u[e]);
        }
        if (in) back[q >> 3] |= (uint8_t)(1u << (q & 7));
    }
    result = Py_BuildValue("(OO)", out, unknown);
done:
    Py_XDECREF(out);
    Py_XDECREF(unknown);
    PyBuffer_Release(&f);
    PyBuffer_Release(&x);
    PyBuffer_Release(&acc);
    return result;
}

PyDoc_STRVAR(finish_split_doc,
"finish_split(f, m, dist, accepting, fin_true, fin_false, easy, max_token_len) -> (finish, todo)\n\n"
"The members of state set f (a little-endian bitset as bytes; bit 0 = ENDED) that can reach acceptance within m\n"
"more positions by a table lookup, and those the tables leave open. finish (bytes of f's length): ENDED, accepting\n"
"states, states at most m bytes from acceptance when every byte is a token (easy), states whose smallest m known to\n"
"suffice (fin_true, int32 per state) is <= m. Left out as proven unable: every live state when m <= 0, states whose\n"
"largest m known not to suffice (fin_false, int32) is >= m, states more than m longest tokens from acceptance. todo:\n"
"the others, ascending (decided by the search). dist: int64 bytes to acceptance per state; accepting: a byte per\n"
"state; states past an array's end count as unknown there.");

static PyObject *finish_split(PyObject *module, PyObject *args) {
    Py_buffer f, dist, acc, ft, ff;
    long long m;
    int easy;
    Py_ssize_t L;
    if (!PyArg_ParseTuple(args, "y*Ly*y*y*y*pn:finish_split", &f, &m, &dist, &acc, &ft, &ff, &easy, &L)) return NULL;
    PyObject *out = NULL, *todo = NULL, *result = NULL;
    if (L < 1) L = 1;
    out = PyBytes_FromStringAndSize(NULL, f.len);
    todo = PyList_New(0);
    if (!out || !todo) goto done;
    uint8_t *fin = (uint8_t *)PyBytes_AS_STRING(out);
    memset(fin, 0, (size_t)f.len);
    const uint8_t *a = f.buf, *ac = acc.buf;
    const int64_t *d = dist.buf;
    const int32_t *t_true = ft.buf, *t_false = ff.buf;
    Py_ssize_t n_dist = dist.len / (Py_ssize_t)sizeof(int64_t), n_true = ft.len / (Py_ssize_t)sizeof(int32_t),
               n_false = ff.len / (Py_ssize_t)sizeof(int32_t);
    FOR_MEMBERS(a, f.len, q) {
        int yes = 0;
        if (q == 0 || (q < acc.len && ac[q])) {
            yes = 1;
        } else if (m <= 0) {
            continue;
        } else if (q < n_dist && easy && d[q] <= m) {
            yes = 1;
        } else if (q < n_true && t_true[q] <= m) {
            yes = 1;
        } else if (q < n_false && t_false[q] >= m) {
            continue;
        } else if (q < n_dist && (d[q] + L - 1) / L > m) {
            continue;
        } else {
            if (append_long(todo, q) < 0) goto done;
            continue;
        }
        if (yes) fin[q >> 3] |= (uint8_t)(1u << (q & 7));
    }
    result = Py_BuildValue("(OO)", out, todo);
done:
    Py_XDECREF(out);
    Py_XDECREF(todo);
    PyBuffer_Release(&f);
    PyBuffer_Release(&dist);
    PyBuffer_Release(&acc);
    PyBuffer_Release(&ft);
    PyBuffer_Release(&ff);
    return result;
}

PyDoc_STRVAR(back_tok_walk_doc,
"back_tok_walk(f, token, x, table, expanded) -> (back, todo)\n\n"
"The members of state set f (a little-endian bitset as bytes; bit 0 = ENDED, skipped) that the bytes of a committed\n"
"token take into state set x, walking the byte DFA's table (int32 [states, 256], state 0 = DEAD) through expanded\n"
"rows only. back: bytes of f's length; todo: the members whose walk reaches a row not expanded yet, ascending\n"
"(walked by the caller, which expands rows).");

static PyObject *back_tok_walk(PyObject *module, PyObject *args) {
    Py_buffer f, tok, x, tab, exp;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*:back_tok_walk", &f, &tok, &x, &tab, &exp)) return NULL;
    PyObject *out = NULL, *todo = NULL, *result = NULL;
    Py_ssize_t n_states = exp.len;
    if (tab.len < n_states * 256 * (Py_ssize_t)sizeof(int32_t)) {
        PyErr_SetString(PyExc_ValueError, "table: fewer rows than expanded flags");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, f.len);
    todo = PyList_New(0);
    if (!out || !todo) goto done;
    uint8_t *back = (uint8_t *)PyBytes_AS_STRING(out);
    memset(back, 0, (size_t)f.len);
    const uint8_t *a = f.buf, *tb = tok.buf, *xs = x.buf, *ex = exp.buf;
    const int32_t *T = tab.buf;
    FOR_MEMBERS(a, f.len, q) {
        if (q == 0) continue;
        Py_ssize_t s = q;
        int stuck = 0;
        for (Py_ssize_t i = 0; i < tok.len && s != 0; i++) {
            if (s >= n_states || !ex[s]) {
                stuck = 1;
                break;
            }
            s = T[s * 256 + tb[i]];
            if (s < 0 || s >= n_states) {
                PyErr_Format(PyExc_ValueError, "table: target %zd outside the %zd states", s, n_states);
                goto done;
            }
        }
        if (stuck) {
            if (append_long(todo, q) < 0) goto done;
        } else if (s != 0 && has_bit(xs, x.len, s)) {
            back[q >> 3] |= (uint8_t)(1u << (q & 7));
        }
    }
    result = Py_BuildValue("(OO)", out, todo);
done:
    Py_XDECREF(out);
    Py_XDECREF(todo);
    PyBuffer_Release(&f);
    PyBuffer_Release(&tok);
    PyBuffer_Release(&x);
    PyBuffer_Release(&tab);
    PyBuffer_Release(&exp);
    return result;
}

static PyObject *RowStore_get_n_rows(RowStoreObject *self, void *closure) { return PyLong_FromSsize_t(self->n_rows); }

static PyMethodDef RowStore_methods[] = {
    {"add_row", (PyCFunction)RowStore_add_row, METH_O, RowStore_add_row_doc},
    {"add_state", (PyCFunction)RowStore_add_state, METH_VARARGS, RowStore_add_state_doc},
    {"row", (PyCFunction)RowStore_row, METH_VARARGS, RowStore_row_doc},
    {"step_open", (PyCFunction)RowStore_step_open, METH_VARARGS, RowStore_step_open_doc},
    {"back_open", (PyCFunction)RowStore_back_open, METH_VARARGS, RowStore_back_open_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef RowStore_getset[] = {
    {"n_rows", (getter)RowStore_get_n_rows, NULL, "rows added so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RowStoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dllm_constrain.constraints._native.RowStore",
    .tp_basicsize = sizeof(RowStoreObject),
    .tp_dealloc = (destructor)RowStore_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RowStore(nbytes): the known states' token transitions, flat, for mask rows between state sets.",
    .tp_methods = RowStore_methods,
    .tp_getset = RowStore_getset,
    .tp_new = RowStore_new,
};

static PyMethodDef module_methods[] = {
    {"group_by_target", (PyCFunction)group_by_target, METH_VARARGS, group_by_target_doc},
    {"finish_split", (PyCFunction)finish_split, METH_VARARGS, finish_split_doc},
    {"back_tok_walk", (PyCFunction)back_tok_walk, METH_VARARGS, back_tok_walk_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "dllm_constrain.constraints._native",
    .m_doc = "Native token-trie walk of the token automaton and the grouping of its output (see _cwalk.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&TrieType) < 0 || PyType_Ready(&RowStoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL) return NULL;
    Py_INCREF(&TrieType);
    if (PyModule_AddObject(m, "Trie", (PyObject *)&TrieType) < 0) {
        Py_DECREF(&TrieType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&RowStoreType);
    if (PyModule_AddObject(m, "RowStore", (PyObject *)&RowStoreType) < 0) {
        Py_DECREF(&RowStoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
