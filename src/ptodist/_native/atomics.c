/*
 * ptodist._atomics: the few operations Python cannot do on shared memory.
 *
 * Rank processes share one anonymous mapping; signal cells and locks are
 * 32-bit words in it.  Python has no atomic read-modify-write on such memory,
 * and no way to sleep until another process changes a word, so these helpers
 * exist: sequentially consistent atomics (which also order the data writes
 * that precede a notify), and a wait that spins briefly and then sleeps in
 * the kernel (futex on Linux) so ranks may outnumber cores without burning
 * them.  Every address is an integer taken from a numpy array the caller owns.
 *
 * The "sleepers" word counts waiters that are (about to be) asleep; notifiers
 * skip the wake-up system call when it is zero.  Both sides use seq_cst
 * operations, so either the notifier sees the sleeper or the sleeper sees the
 * new value (Dekker's argument).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <signal.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() do {} while (0)
#endif

#define CMP_EQ 0
#define CMP_GE 1

static inline int32_t *as_word(unsigned long long addr) { return (int32_t *)(uintptr_t)addr; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_on(int32_t *word, int32_t seen, double max_s) {
#ifdef __linux__
    struct timespec ts;
    ts.tv_sec = (time_t)max_s;
    ts.tv_nsec = (long)((max_s - (double)ts.tv_sec) * 1e9);
    /* Shared (not PRIVATE) futex: the word lives in memory mapped by several processes. */
    syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, NULL, 0);
#else
    (void)word; (void)seen;
    struct timespec ts = {0, (long)(max_s < 0.0002 ? max_s * 1e9 : 200000)};
    nanosleep(&ts, NULL);
#endif
}

static void wake_all(int32_t *word) {
#ifdef __linux__
    syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#else
    (void)word;
#endif
}

static inline void publish(int32_t *word, int32_t *sleepers) {
    if (__atomic_load_n(sleepers, __ATOMIC_SEQ_CST) > 0) wake_all(word);
}

/* The three-integer argument list of fetch_add and exchange: (addr, sleepers, value). */
static int three_ints(PyObject *const *args, Py_ssize_t n, const char *name, unsigned long long *addr,
                      unsigned long long *sleepers, long long *value) {
    if (n != 3) {
        PyErr_Format(PyExc_TypeError, "%s(addr, sleepers, value) takes 3 arguments, got %zd", name, n);
        return 0;
    }
    *addr = PyLong_AsUnsignedLongLong(args[0]);
    if (*addr == (unsigned long long)-1 && PyErr_Occurred()) return 0;
    *sleepers = PyLong_AsUnsignedLongLong(args[1]);
    if (*sleepers == (unsigned long long)-1 && PyErr_Occurred()) return 0;
    *value = PyLong_AsLongLong(args[2]);
    return !(*value == -1 && PyErr_Occurred());
}

static PyObject *py_fetch_add(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    unsigned long long addr, sleepers;
    long long delta;
    if (!three_ints(args, n, "fetch_add", &addr, &sleepers, &delta)) return NULL;
    int32_t old = __atomic_fetch_add(as_word(addr), (int32_t)delta, __ATOMIC_SEQ_CST);
    publish(as_word(addr), as_word(sleepers));
    return PyLong_FromLong(old);
}

static PyObject *py_exchange(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    unsigned long long addr, sleepers;
    long long value;
    if (!three_ints(args, n, "exchange", &addr, &sleepers, &value)) return NULL;
    int32_t old = __atomic_exchange_n(as_word(addr), (int32_t)value, __ATOMIC_SEQ_CST);
    publish(as_word(addr), as_word(sleepers));
    return PyLong_FromLong(old);
}

static PyObject *py_load(PyObject *self, PyObject *arg) {
    unsigned long long addr = PyLong_AsUnsignedLongLong(arg);
    if (addr == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    return PyLong_FromLong(__atomic_load_n(as_word(addr), __ATOMIC_SEQ_CST));
}

static inline int satisfied(int32_t v, int cmp, int32_t expected) {
    return cmp == CMP_EQ ? v == expected : v >= expected;
}

/* Spin for spin_s seconds, then poll with sched_yield() for yield_s more (when ranks outnumber cores
 * this hands the core to the rank that will notify, and is far cheaper than a sleep and a wake-up),
 * then sleep until the word changes; at most timeout_s in all.  Returns whether the word satisfied
 * the comparison, its last value in *seen.  Call without the GIL. */
static int wait_word(int32_t *word, int32_t *sleepers, int cmp, int32_t expected, double spin_s, double yield_s,
                     double timeout_s, int32_t *seen) {
    double start = now_s(), deadline = start + timeout_s, spin_end = start + spin_s;
    double yield_end = spin_end + yield_s;
    int32_t v;
    for (;;) {
        v = __atomic_load_n(word, __ATOMIC_SEQ_CST);
        if (satisfied(v, cmp, expected)) { *seen = v; return 1; }
        double t = now_s();
        if (t >= deadline) { *seen = v; return 0; }
        if (t < spin_end) {
            for (int i = 0; i < 64; i++) CPU_RELAX();
            continue;
        }
        if (t < yield_end) {
            sched_yield();
            continue;
        }
        __atomic_fetch_add(sleepers, 1, __ATOMIC_SEQ_CST);
        v = __atomic_load_n(word, __ATOMIC_SEQ_CST);
        if (!satisfied(v, cmp, expected)) {
            double left = deadline - t;
            sleep_on(word, v, left < 0.05 ? left : 0.05);
        }
        __atomic_fetch_sub(sleepers, 1, __ATOMIC_SEQ_CST);
    }
}

/* wait(addr, sleepers, cmp, expected, spin_s, yield_s, timeout_s) -> (ok, value): wait_word, from Python.
 * The caller loops on timeout. */
static PyObject *py_wait(PyObject *self, PyObject *args) {
    unsigned long long addr, sleepers_addr;
    int cmp;
    long long expected_ll;
    double spin_s, yield_s, timeout_s;
    if (!PyArg_ParseTuple(args, "KKiLddd", &addr, &sleepers_addr, &cmp, &expected_ll, &spin_s, &yield_s,
                          &timeout_s))
        return NULL;
    int32_t v;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = wait_word(as_word(addr), as_word(sleepers_addr), cmp, (int32_t)expected_ll, spin_s, yield_s, timeout_s, &v);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(Oi)", ok ? Py_True : Py_False, v);
}

/* A futex mutex (0 free, 1 locked, 2 locked with sleepers) guarding atomic
 * tile accumulation, which has no single-instruction form for FP16/BF16.  lock_word may sleep: call it
 * without the GIL. */
static void lock_word(int32_t *word) {
    int32_t c = 0;
    if (!__atomic_compare_exchange_n(word, &c, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
        if (c != 2) c = __atomic_exchange_n(word, 2, __ATOMIC_ACQUIRE);
        while (c != 0) {
#ifdef __linux__
            syscall(SYS_futex, word, FUTEX_WAIT, 2, NULL, NULL, 0);
#else
            sched_yield();
#endif
            c = __atomic_exchange_n(word, 2, __ATOMIC_ACQUIRE);
        }
    }
}

static void unlock_word(int32_t *word) {
    if (__atomic_fetch_sub(word, 1, __ATOMIC_RELEASE) != 1) {
        __atomic_store_n(word, 0, __ATOMIC_RELEASE);
#ifdef __linux__
        syscall(SYS_futex, word, FUTEX_WAKE, 1, NULL, NULL, 0);
#endif
    }
}

static PyObject *py_lock(PyObject *self, PyObject *args) {
    unsigned long long addr;
    if (!PyArg_ParseTuple(args, "K", &addr)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    lock_word(as_word(addr));
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_unlock(PyObject *self, PyObject *args) {
    unsigned long long addr;
    if (!PyArg_ParseTuple(args, "K", &addr)) return NULL;
    unlock_word(as_word(addr));
    Py_RETURN_NONE;
}

/* Ask the kernel to kill this process when its parent dies, so a rank never
 * outlives a driver that was killed with SIGKILL.  Returns False where the
 * platform has no such facility. */
static PyObject *py_die_with_parent(PyObject *self, PyObject *noargs) {
#ifdef __linux__
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) == 0) Py_RETURN_TRUE;
#endif
    Py_RETURN_FALSE;
}

/* -- the per-operation bookkeeping of a rank, in one call -------------------------------------
 *
 * Every pld signal and RMA operation updates the rank's row of the status board: its progress
 * word (the hang detectors watch it), its last-operation word (what a rank that dies was doing)
 * and, for a notify, an entry in its ring of sent notifies (which notifies did a blocked cell
 * receive?).  A Ledger holds those addresses for one rank so that the update is one C call
 * instead of several Python statements; the layout of a ring entry is the Sent structure of
 * rank/status.py. */

typedef struct {
    PyObject_HEAD
    int64_t *progress;
    uint64_t *last_op;    /* NULL: the board keeps no last-operation word */
    char *history;        /* `entries` entries of ENTRY_BYTES */
    int64_t entries;
    int64_t seq;          /* the last sequence number written */
} Ledger;

#define ENTRY_BYTES 48

static int ledger_init(Ledger *self, PyObject *args, PyObject *kwds) {
    unsigned long long progress, last_op, history;
    long long entries;
    if (!PyArg_ParseTuple(args, "KKKL", &progress, &last_op, &history, &entries)) return -1;
    if (entries <= 0) {
        PyErr_SetString(PyExc_ValueError, "Ledger: the ring needs at least one entry");
        return -1;
    }
    self->progress = (int64_t *)(uintptr_t)progress;
    self->last_op = (uint64_t *)(uintptr_t)last_op;
    self->history = (char *)(uintptr_t)history;
    self->entries = entries;
    self->seq = 0;
    return 0;
}

static inline void ledger_step(Ledger *self, uint64_t word) {
    __atomic_store_n(self->progress, __atomic_load_n(self->progress, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
    if (word != 0 && self->last_op != NULL) __atomic_store_n(self->last_op, word, __ATOMIC_RELAXED);
}

/* One sent notify into the ring; its sequence number is written last, so a reader sees whole entries. */
static inline void ledger_record(Ledger *self, int64_t buffer, int64_t owner, int64_t offset, int is_set,
                                 int32_t value, int32_t old, int64_t slot) {
    int64_t seq = ++self->seq;
    char *e = self->history + (seq % self->entries) * ENTRY_BYTES;
    int32_t new_value = is_set ? value : (int32_t)((uint32_t)old + (uint32_t)value);  /* INT32 wraps */
    *(int64_t *)(e + 8) = offset;
    int32_t *w = (int32_t *)(e + 16);
    w[0] = (int32_t)buffer; w[1] = (int32_t)owner; w[2] = is_set; w[3] = value;
    w[4] = old; w[5] = new_value; w[6] = (int32_t)slot;
    __atomic_store_n((int64_t *)e, seq, __ATOMIC_RELEASE);
}

static int as_ll(PyObject *o, long long *out) {
    *out = PyLong_AsLongLong(o);
    return !(*out == -1 && PyErr_Occurred());
}

/* step(word): count one operation; word != 0 also becomes the last-operation word. */
static PyObject *ledger_step_py(Ledger *self, PyObject *arg) {
    unsigned long long word = PyLong_AsUnsignedLongLong(arg);
    if (word == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    ledger_step(self, word);
    Py_RETURN_NONE;
}

/* The wake slot of a rank (three words): `armed` counts the rank's waits for any of several cells; while
 * it is non-zero every notify to that rank also increments `seq` and wakes the rank if it sleeps on it
 * (`seq_sleepers`).  The cell's update comes before the load of `armed`, and the waiter increments
 * `armed` before it reads `seq` and then the cells, all sequentially consistent: either the notifier
 * sees the waiter armed (and moves `seq` after the cell, which the waiter then sees move), or the
 * waiter sees the cell's new value (Dekker's argument again). */
static inline void wake_any_waiter(int32_t *slot) {
    if (__atomic_load_n(slot, __ATOMIC_SEQ_CST) > 0) {
        __atomic_fetch_add(slot + 1, 1, __ATOMIC_SEQ_CST);
        publish(slot + 1, slot + 2);
    }
}

/* notify(addr, sleepers, value, is_set, word, buffer, owner, offset, slot[, wake]) -> old: the atomic add
 * (or exchange) on a shared-memory cell, the wake-up of its sleepers and of the owner's wait for any cell
 * (`wake`: the owner's wake slot, 0 for none), the step and the ring entry. */
static int32_t notify_cell(Ledger *self, int32_t *cell, int32_t *sleepers, int32_t value, int is_set,
                           uint64_t word, int64_t buffer, int64_t owner, int64_t offset, int64_t slot, int32_t *wake) {
    int32_t old = is_set ? __atomic_exchange_n(cell, value, __ATOMIC_SEQ_CST)
                         : __atomic_fetch_add(cell, value, __ATOMIC_SEQ_CST);
    publish(cell, sleepers);
    if (wake != NULL) wake_any_waiter(wake);
    ledger_step(self, word);
    ledger_record(self, buffer, owner, offset, is_set, value, old, slot);
    return old;
}

static PyObject *ledger_notify(Ledger *self, PyObject *const *args, Py_ssize_t n) {
    long long v[10];
    if (n != 9 && n != 10) {
        PyErr_SetString(PyExc_TypeError, "Ledger.notify takes 9 or 10 arguments");
        return NULL;
    }
    v[9] = 0;
    for (int i = 0; i < n; i++)
        if (i != 4 && !as_ll(args[i], &v[i])) return NULL;
    unsigned long long word = PyLong_AsUnsignedLongLong(args[4]);
    if (word == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    int32_t old = notify_cell(self, as_word((unsigned long long)v[0]), as_word((unsigned long long)v[1]),
                              (int32_t)v[2], (int)v[3], word, v[5], v[6], v[7], v[8],
                              v[9] ? as_word((unsigned long long)v[9]) : NULL);
    return PyLong_FromLong(old);
}

/* -- a recorded sequence of notifies, waits and copies, run in one call ------------------------
 *
 * A host orchestrator's collective runs the same operations on the same cells and regions every time
 * it is called from one line with the same windows.  Its first run through the Python primitives is
 * recorded (rank/replay.py); later runs replay that record here: each operation does what its
 * primitive does on shared memory - the same atomics, wake-ups, ledger steps and ring entries, the
 * same element-wise add under the owner's lock - without a Python call per operation.  Every step is
 * STEP_WORDS int64 words:
 *   NOTIFY  cell, sleepers, value, is_set, wake (0: none), buffer, owner, offset, slot
 *   WAIT    cell, sleepers, cmp, expected
 *   COPY    dst, src, row bytes, rows, dst row stride, src row stride           (bytes)
 *   ADD     dst, src, row elements, rows, dst row stride, src row stride, kind, lock (0: none)
 * A wait not satisfied within timeout_s stops the run: the caller waits for it the primitive's way
 * (publishing it for a hang report, answering an abort) and resumes at the next step. */

#define STEP_WORDS 10
enum { STEP_NOTIFY = 1, STEP_WAIT = 2, STEP_COPY = 3, STEP_ADD = 4 };
enum { ADD_F32 = 1, ADD_F64 = 2, ADD_I32 = 3, ADD_I16 = 4, ADD_I8 = 5, ADD_I64 = 6 };

/* numpy's `+=`: IEEE addition for floats, wrap-around for integers (done unsigned: no overflow in C). */
#define ADD_ROW(T, U) do { T *d = (T *)dst; const T *s = (const T *)src; \
        for (int64_t i = 0; i < count; i++) d[i] = (T)((U)d[i] + (U)s[i]); } while (0)

/* Vectorised like numpy's own loops (-O2 alone leaves them scalar); still element-wise IEEE adds, no
 * reassociation, so the bits are numpy's. */
__attribute__((optimize("O3")))
static void add_row(int kind, char *dst, const char *src, int64_t count) {
    switch (kind) {
        case ADD_F32: ADD_ROW(float, float); break;
        case ADD_F64: ADD_ROW(double, double); break;
        case ADD_I32: ADD_ROW(int32_t, uint32_t); break;
        case ADD_I16: ADD_ROW(int16_t, uint16_t); break;
        case ADD_I8: ADD_ROW(int8_t, uint8_t); break;
        case ADD_I64: ADD_ROW(int64_t, uint64_t); break;
    }
}

/* run_steps(steps, count, start, spin_s, yield_s, timeout_s) -> the index of the wait that did not hold
 * within timeout_s, or count once every step has run.  `steps`: the address of count * STEP_WORDS int64. */
static PyObject *ledger_run_steps(Ledger *self, PyObject *args) {
    unsigned long long addr;
    long long count, start;
    double spin_s, yield_s, timeout_s;
    if (!PyArg_ParseTuple(args, "KLLddd", &addr, &count, &start, &spin_s, &yield_s, &timeout_s)) return NULL;
    const int64_t *steps = (const int64_t *)(uintptr_t)addr;
    long long i;
    for (i = start; i < count; i++) {
        const int64_t *s = steps + i * STEP_WORDS;
        switch (s[0]) {
            case STEP_NOTIFY:
                notify_cell(self, as_word(s[1]), as_word(s[2]), (int32_t)s[3], (int)s[4], 0, s[6], s[7], s[8], s[9],
                            s[5] ? as_word(s[5]) : NULL);
                break;
            case STEP_WAIT: {
                int32_t *cell = as_word(s[1]);
                int32_t v = __atomic_load_n(cell, __ATOMIC_SEQ_CST);
                int ok = satisfied(v, (int)s[3], (int32_t)s[4]);
                if (!ok) {
                    Py_BEGIN_ALLOW_THREADS
                    ok = wait_word(cell, as_word(s[2]), (int)s[3], (int32_t)s[4], spin_s, yield_s, timeout_s, &v);
                    Py_END_ALLOW_THREADS
                }
                if (!ok) return PyLong_FromLongLong(i);
                ledger_step(self, 0);
                break;
            }
            case STEP_COPY: {
                ledger_step(self, 0);
                char *dst = (char *)(uintptr_t)s[1];
                const char *src = (const char *)(uintptr_t)s[2];
                for (int64_t r = 0; r < s[4]; r++)
                    memmove(dst + r * s[5], src + r * s[6], (size_t)s[3]);
                break;
            }
            case STEP_ADD: {
                ledger_step(self, 0);
                int32_t *lock = s[8] ? as_word(s[8]) : NULL, free_word = 0;  /* NULL: a rank's private memory */
                if (lock != NULL
                    && !__atomic_compare_exchange_n(lock, &free_word, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
                    Py_BEGIN_ALLOW_THREADS
                    lock_word(lock);
                    Py_END_ALLOW_THREADS
                }
                for (int64_t r = 0; r < s[4]; r++)
                    add_row((int)s[7], (char *)(uintptr_t)s[1] + r * s[5], (const char *)(uintptr_t)s[2] + r * s[6],
                            s[3]);
                if (lock != NULL) unlock_word(lock);
                break;
            }
            default:
                PyErr_Format(PyExc_ValueError, "run_steps: step %lld has no operation %lld", i, (long long)s[0]);
                return NULL;
        }
    }
    return PyLong_FromLongLong(i);
}

/* sent(buffer, owner, offset, is_set, value, old, slot): a ring entry for a notify made elsewhere (a
 * backend whose cells are not plain shared memory). */
static PyObject *ledger_sent(Ledger *self, PyObject *const *args, Py_ssize_t n) {
    long long v[7];
    if (n != 7) {
        PyErr_SetString(PyExc_TypeError, "Ledger.sent takes 7 arguments");
        return NULL;
    }
    for (int i = 0; i < 7; i++)
        if (!as_ll(args[i], &v[i])) return NULL;
    ledger_record(self, v[0], v[1], v[2], (int)v[3], (int32_t)v[4], (int32_t)v[5], v[6]);
    Py_RETURN_NONE;
}

static PyObject *ledger_step_at(Ledger *self, PyObject *const *args, Py_ssize_t n);

/* steps() -> the progress word: how many operations were counted so far. */
static PyObject *ledger_steps(Ledger *self, PyObject *noargs) {
    return PyLong_FromLongLong(__atomic_load_n(self->progress, __ATOMIC_RELAXED));
}

static PyMethodDef ledger_methods[] = {
    {"step", (PyCFunction)ledger_step_py, METH_O, "step(word): progress += 1; word != 0 is the last operation"},
    {"steps", (PyCFunction)ledger_steps, METH_NOARGS, "steps() -> the progress word"},
    {"step_at", (PyCFunction)(void (*)(void))ledger_step_at, METH_FASTCALL,
     "step_at(cache, depth, code) -> None, or the frame (NotImplemented) whose call site is not cached yet"},
    {"notify", (PyCFunction)(void (*)(void))ledger_notify, METH_FASTCALL,
     "notify(addr, sleepers, value, is_set, word, buffer, owner, offset, slot[, wake]) -> old value"},
    {"run_steps", (PyCFunction)ledger_run_steps, METH_VARARGS,
     "run_steps(steps, count, start, spin_s, yield_s, timeout_s) -> index of the wait that did not hold, or count"},
    {"sent", (PyCFunction)(void (*)(void))ledger_sent, METH_FASTCALL,
     "sent(buffer, owner, offset, is_set, value, old, slot): record a notify made elsewhere"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LedgerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ptodist._atomics.Ledger",
    .tp_basicsize = sizeof(Ledger),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Ledger(progress_addr, last_op_addr, history_addr, entries): one rank's status-board updates",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ledger_init,
    .tp_methods = ledger_methods,
};

/* -- argument checks of the usual kind, without a Python loop --------------------------------------
 * Both answer only the plain case (exact ints, inside the bounds) and return None / -1 otherwise: the
 * caller then takes its Python path, which accepts Scalars and numpy integers and explains errors. */

/* The exact int items of list or tuple `seq`, into out[0..n); 0 unless `seq` is one of n exact ints. */
static int plain_ints(PyObject *seq, Py_ssize_t n, long long *out) {
    if (!(PyList_CheckExact(seq) || PyTuple_CheckExact(seq)) || PySequence_Fast_GET_SIZE(seq) != n) return 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyLong_CheckExact(items[i])) return 0;
        out[i] = PyLong_AsLongLong(items[i]);
        if (out[i] == -1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    }
    return 1;
}

#define MAX_DIMS 16

/* region(offsets, shape, bounds) -> tuple of slices, or None: the slices of an array of shape `bounds`
 * that the region at `offsets` of size `shape` covers, when all three agree in length and it lies inside. */
static PyObject *py_region(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 3 || !PyTuple_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "region(offsets, shape, bounds: tuple)");
        return NULL;
    }
    Py_ssize_t dims = PyTuple_GET_SIZE(args[2]);
    long long o[MAX_DIMS], s[MAX_DIMS], b[MAX_DIMS];
    if (dims > MAX_DIMS || !plain_ints(args[0], dims, o) || !plain_ints(args[1], dims, s) || !plain_ints(args[2], dims, b))
        Py_RETURN_NONE;
    /* o + s could overflow (offsets near 2^63): compare o with b - s, which cannot, as 0 <= s <= b. */
    for (Py_ssize_t i = 0; i < dims; i++)
        if (o[i] < 0 || s[i] < 0 || s[i] > b[i] || o[i] > b[i] - s[i]) Py_RETURN_NONE;
    PyObject *out = PyTuple_New(dims);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < dims; i++) {
        PyObject *lo = PyLong_FromLongLong(o[i]), *hi = PyLong_FromLongLong(o[i] + s[i]);
        PyObject *sl = (lo && hi) ? PySlice_New(lo, hi, NULL) : NULL;
        Py_XDECREF(lo);
        Py_XDECREF(hi);
        if (sl == NULL) { Py_DECREF(out); return NULL; }
        PyTuple_SET_ITEM(out, i, sl);
    }
    return out;
}

/* flat(offsets, bounds) -> the row-major index of element `offsets` of an array of shape `bounds`, or -1. */
static PyObject *py_flat(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2 || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "flat(offsets, bounds: tuple)");
        return NULL;
    }
    Py_ssize_t dims = PyTuple_GET_SIZE(args[1]);
    long long o[MAX_DIMS], b[MAX_DIMS], flat = 0;
    if (dims > MAX_DIMS || !plain_ints(args[0], dims, o) || !plain_ints(args[1], dims, b)) return PyLong_FromLong(-1);
    /* With 0 <= o < b in every dimension, flat stays below the element count of a real array: no overflow. */
    for (Py_ssize_t i = 0; i < dims; i++) {
        if (o[i] < 0 || o[i] >= b[i]) return PyLong_FromLong(-1);
        flat = flat * b[i] + o[i];
    }
    return PyLong_FromLongLong(flat);
}

/* The call-site cache of a rank: (id(code), instruction offset) - Python's `id(f.f_code), f.f_lasti` - to
 * (code, entry), entry None for ptodist's own frames.  What an operation needs to name the user's line
 * without a stack walk per call. */

#define SITE_ERROR (-1)
#define SITE_NONE 0    /* the frames looked at are all cached as ptodist's own */
#define SITE_FOUND 1   /* *out: the entry (a new reference) */
#define SITE_MISS 2    /* *out: the first frame not cached yet (a new reference) */

/* Look at most four frames up from the one `depth` levels above the calling Python function. */
static int find_site(PyObject *cache, long depth, PyObject **out) {
#if PY_VERSION_HEX >= 0x030B0000
    PyFrameObject *frame = PyEval_GetFrame();  /* borrowed */
    Py_XINCREF(frame);
    for (long i = 0; i < depth && frame != NULL; i++) {
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    for (int i = 0; i < 4 && frame != NULL; i++) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        PyObject *key = Py_BuildValue("(Ni)", PyLong_FromVoidPtr(code), PyFrame_GetLasti(frame));
        Py_DECREF(code);
        if (key == NULL) { Py_DECREF(frame); return SITE_ERROR; }
        PyObject *known = PyDict_GetItemWithError(cache, key);  /* borrowed */
        Py_DECREF(key);
        if (known == NULL) {
            if (PyErr_Occurred()) { Py_DECREF(frame); return SITE_ERROR; }
            *out = (PyObject *)frame;
            return SITE_MISS;
        }
        if (!PyTuple_Check(known) || PyTuple_GET_SIZE(known) != 2) {
            Py_DECREF(frame);
            PyErr_SetString(PyExc_TypeError, "call-site cache values are (code, entry) pairs");
            return SITE_ERROR;
        }
        PyObject *entry = PyTuple_GET_ITEM(known, 1);
        if (entry != Py_None) {
            Py_DECREF(frame);
            Py_INCREF(entry);
            *out = entry;
            return SITE_FOUND;
        }
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    return SITE_NONE;
#else
    (void)cache; (void)depth;
    Py_INCREF(Py_NotImplemented);  /* no PyFrame_GetLasti before 3.11: the caller walks the stack itself */
    *out = Py_NotImplemented;
    return SITE_MISS;
#endif
}

static int site_args(PyObject *const *args, Py_ssize_t n, Py_ssize_t want, long *depth) {
    if (n != want || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, want == 2 ? "call_site(cache: dict, depth: int)"
                                                   : "Ledger.step_at(cache: dict, depth: int, code: int)");
        return 0;
    }
    *depth = PyLong_AsLong(args[1]);
    return !(*depth == -1 && PyErr_Occurred());
}

/* call_site(cache, depth): the cached entry of the first call site at or above the caller's frame `depth`
 * levels up whose entry is not None; the frame itself where a call site is not in the cache yet (the
 * caller adds it; NotImplemented before Python 3.11); None when all four frames looked at are ptodist's. */
static PyObject *py_call_site(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    long depth;
    PyObject *out = NULL;
    if (!site_args(args, n, 2, &depth)) return NULL;
    switch (find_site(args[0], depth, &out)) {
        case SITE_ERROR: return NULL;
        case SITE_NONE: Py_RETURN_NONE;
        default: return out;
    }
}

/* Ledger.step_at(cache, depth, code) -> None, or what call_site gives for a call site not cached yet (then
 * nothing is counted: the caller finds the site and calls step).  One step whose last-operation word is
 * `code` at the site call_site finds (its entry's second item is the site's slot word), 0 without one. */
static PyObject *ledger_step_at(Ledger *self, PyObject *const *args, Py_ssize_t n) {
    long depth;
    PyObject *entry = NULL;
    if (!site_args(args, n, 3, &depth)) return NULL;
    unsigned long long code = PyLong_AsUnsignedLongLong(args[2]);
    if (code == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    switch (find_site(args[0], depth, &entry)) {
        case SITE_ERROR: return NULL;
        case SITE_MISS: return entry;
        case SITE_NONE: ledger_step(self, 0); Py_RETURN_NONE;
    }
    unsigned long long slot_word = PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) >= 2
        ? PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(entry, 1)) : (unsigned long long)-1;
    Py_DECREF(entry);
    if (slot_word == (unsigned long long)-1) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "call-site entries are (site, slot word, slot)");
        return NULL;
    }
    ledger_step(self, code | slot_word);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"fetch_add", (PyCFunction)(void (*)(void))py_fetch_add, METH_FASTCALL,
     "fetch_add(addr, sleepers, delta) -> old int32 value"},
    {"exchange", (PyCFunction)(void (*)(void))py_exchange, METH_FASTCALL,
     "exchange(addr, sleepers, value) -> old int32 value"},
    {"load", py_load, METH_O, "load(addr) -> int32 value"},
    {"wait", py_wait, METH_VARARGS, "wait(addr, sleepers, cmp, expected, spin_s, yield_s, timeout_s) -> (ok, value)"},
    {"lock", py_lock, METH_VARARGS, "lock(addr): acquire a futex mutex word"},
    {"unlock", py_unlock, METH_VARARGS, "unlock(addr): release a futex mutex word"},
    {"die_with_parent", py_die_with_parent, METH_NOARGS, "kill this process when its parent exits"},
    {"region", (PyCFunction)(void (*)(void))py_region, METH_FASTCALL,
     "region(offsets, shape, bounds) -> tuple of slices, or None unless plain ints inside the bounds"},
    {"flat", (PyCFunction)(void (*)(void))py_flat, METH_FASTCALL,
     "flat(offsets, bounds) -> row-major element index, or -1 unless plain ints inside the bounds"},
    {"call_site", (PyCFunction)(void (*)(void))py_call_site, METH_FASTCALL,
     "call_site(cache, depth) -> cached entry, a frame not cached yet, or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_atomics", NULL, -1, methods};

PyMODINIT_FUNC PyInit__atomics(void) {
    if (PyType_Ready(&LedgerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&LedgerType);
    if (PyModule_AddObject(m, "Ledger", (PyObject *)&LedgerType) < 0) {
        Py_DECREF(&LedgerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
