/* CPU kernels of the token bitmask (xgrammar's layout, kernels/bitmask.py), without the GIL: masking a float32 logits
 * block in place by an int32 bitmask, in one pass; and the one token of each row that allows exactly one (the forced
 * tokens of a canvas step), in one read of the words.
 *
 * The torch reference (unpack the bits into a bool [rows, V] buffer, then masked_fill) writes and reads one byte per
 * token twice before touching the logits; at 32 rows of 128K tokens that is ~5 ms per step on one core, longer than
 * a small model's decoding step. Here a word of 32 allowed tokens is skipped, a word of none is 32 stores, and the
 * rest goes bit by bit. Built by the package's build (setup.py, optional); kernels/bitmask.py falls back to the
 * torch reference when it is absent.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static int get_2d(PyObject *obj, Py_buffer *view, int writable, char kind, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous%s 2-D buffer", name, writable ? " writable" : "");
        return -1;
    }
    const char *fmt = view->format ? view->format : "B";
    char k = fmt[0] ? fmt[strlen(fmt) - 1] : 'B';
    int ok = view->ndim == 2 && view->itemsize == 4 && (kind == 'f' ? k == 'f' : (k == 'i' || k == 'l'));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: expected a 2-D buffer of %s, got %d-D of format '%s'", name,
                     kind == 'f' ? "float32" : "int32", view->ndim, fmt);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(apply_doc,
"apply_token_bitmask(logits, bitmask, value)\n\n"
"logits: float32 [rows, V], C-contiguous, written in place; bitmask: int32 [>= rows, >= ceil(V / 32)]. Sets\n"
"logits[r, t] = value wherever bit t %% 32 of word t // 32 of bitmask row r is 0 (token t not allowed).");

static PyObject *apply_token_bitmask(PyObject *module, PyObject *args) {
    PyObject *o_logits, *o_mask;
    float value;
    if (!PyArg_ParseTuple(args, "OOf:apply_token_bitmask", &o_logits, &o_mask, &value)) return NULL;
    Py_buffer lv, mv;
    if (get_2d(o_logits, &lv, 1, 'f', "logits") < 0) return NULL;
    if (get_2d(o_mask, &mv, 0, 'i', "bitmask") < 0) {
        PyBuffer_Release(&lv);
        return NULL;
    }
    Py_ssize_t rows = lv.shape[0], V = lv.shape[1], W = mv.shape[1];
    PyObject *result = NULL;
    if (mv.shape[0] < rows || W * 32 < V) {
        PyErr_Format(PyExc_ValueError, "bitmask [%zd, %zd] does not cover logits [%zd, %zd]", mv.shape[0], W, rows, V);
        goto done;
    }
    float *x = lv.buf;
    const int32_t *m = mv.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < rows; r++) {
        float *xr = x + r * V;
        const uint32_t *mr = (const uint32_t *)(m + r * W);
        for (Py_ssize_t w = 0; w * 32 < V; w++) {
            uint32_t bits = mr[w];
            if (bits == 0xffffffffu) continue;
            Py_ssize_t base = w * 32, lim = V - base < 32 ? V - base : 32;
            float *xw = xr + base;
            if (bits == 0) {
                for (Py_ssize_t b = 0; b < lim; b++) xw[b] = value;
            } else {
                for (Py_ssize_t b = 0; b < lim; b++)
                    if (!((bits >> b) & 1u)) xw[b] = value;
            }
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&lv);
    PyBuffer_Release(&mv);
    return result;
}

PyDoc_STRVAR(single_doc,
"single_tokens(bitmask, out)\n\n"
"bitmask: int32 [rows, W], C-contiguous; out: int64 [>= rows], written: the token row r allows when it allows exactly\n"
"one, else -1. Stops reading a row at its second allowed token.");

static PyObject *single_tokens(PyObject *module, PyObject *args) {
    PyObject *o_mask, *o_out;
    if (!PyArg_ParseTuple(args, "OO:single_tokens", &o_mask, &o_out)) return NULL;
    Py_buffer mv, ov;
    if (get_2d(o_mask, &mv, 0, 'i', "bitmask") < 0) return NULL;
    if (PyObject_GetBuffer(o_out, &ov, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&mv);
        return NULL;
    }
    PyObject *result = NULL;
    const char *fmt = ov.format ? ov.format : "B";
    char k = fmt[0] ? fmt[strlen(fmt) - 1] : 'B';
    Py_ssize_t rows = mv.shape[0], W = mv.shape[1];
    if (ov.ndim != 1 || ov.itemsize != 8 || !(k == 'q' || k == 'l') || ov.shape[0] < rows) {
        PyErr_Format(PyExc_TypeError, "out: expected a 1-D int64 buffer of >= %zd items", rows);
        goto done;
    }
    const uint32_t *m = (const uint32_t *)mv.buf;
    int64_t *out = ov.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < rows; r++) {
        const uint32_t *mr = m + r * W;
        int64_t token = -1;
        int seen = 0;
        for (Py_ssize_t w = 0; w < W; w++) {
            uint32_t bits = mr[w];
            if (!bits) continue;
            if (seen || (bits & (bits - 1u))) {
                seen = 2;
                break;
            }
            seen = 1;
            token = (int64_t)w * 32 + __builtin_ctz(bits);
        }
        out[r] = seen == 1 ? token : -1;
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&mv);
    PyBuffer_Release(&ov);
    return result;
}

static PyMethodDef methods[] = {
    {"apply_token_bitmask", (PyCFunction)apply_token_bitmask, METH_VARARGS, apply_doc},
    {"single_tokens", (PyCFunction)single_tokens, METH_VARARGS, single_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "dllm_constrain.kernels._bitmask_cpu",
    .m_doc = "CPU kernels of the int32 token bitmask: logits masked in place, single-token rows (kernels/bitmask.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__bitmask_cpu(void) { return PyModule_Create(&module); }
