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
#include <stdint.h>
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

static PyObject *py_fetch_add(PyObject *self, PyObject *args) {
    unsigned long long addr, sleepers;
    long long delta;
    if (!PyArg_ParseTuple(args, "KKL", &addr, &sleepers, &delta)) return NULL;
    int32_t old = __atomic_fetch_add(as_word(addr), (int32_t)delta, __ATOMIC_SEQ_CST);
    publish(as_word(addr), as_word(sleepers));
    return PyLong_FromLong(old);
}

static PyObject *py_exchange(PyObject *self, PyObject *args) {
    unsigned long long addr, sleepers;
    long long value;
    if (!PyArg_ParseTuple(args, "KKL", &addr, &sleepers, &value)) return NULL;
    int32_t old = __atomic_exchange_n(as_word(addr), (int32_t)value, __ATOMIC_SEQ_CST);
    publish(as_word(addr), as_word(sleepers));
    return PyLong_FromLong(old);
}

static PyObject *py_load(PyObject *self, PyObject *args) {
    unsigned long long addr;
    if (!PyArg_ParseTuple(args, "K", &addr)) return NULL;
    return PyLong_FromLong(__atomic_load_n(as_word(addr), __ATOMIC_SEQ_CST));
}

static inline int satisfied(int32_t v, int cmp, int32_t expected) {
    return cmp == CMP_EQ ? v == expected : v >= expected;
}

/* wait(addr, sleepers, cmp, expected, spin_s, yield_s, timeout_s) -> (ok, value)
 * Spin for spin_s seconds, then poll with sched_yield() for yield_s more (when
 * ranks outnumber cores this hands the core to the rank that will notify, and
 * is far cheaper than a sleep and a wake-up), then sleep until the word
 * changes; at most timeout_s in all.  The caller loops on timeout. */
static PyObject *py_wait(PyObject *self, PyObject *args) {
    unsigned long long addr, sleepers_addr;
    int cmp;
    long long expected_ll;
    double spin_s, yield_s, timeout_s;
    if (!PyArg_ParseTuple(args, "KKiLddd", &addr, &sleepers_addr, &cmp, &expected_ll, &spin_s, &yield_s,
                          &timeout_s))
        return NULL;
    int32_t *word = as_word(addr), *sleepers = as_word(sleepers_addr);
    int32_t expected = (int32_t)expected_ll, v;
    int ok = 0;
    Py_BEGIN_ALLOW_THREADS
    double start = now_s(), deadline = start + timeout_s, spin_end = start + spin_s;
    double yield_end = spin_end + yield_s;
    for (;;) {
        v = __atomic_load_n(word, __ATOMIC_SEQ_CST);
        if (satisfied(v, cmp, expected)) { ok = 1; break; }
        double t = now_s();
        if (t >= deadline) break;
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
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(Oi)", ok ? Py_True : Py_False, v);
}

/* A futex mutex (0 free, 1 locked, 2 locked with sleepers) guarding atomic
 * tile accumulation, which has no single-instruction form for FP16/BF16. */
static PyObject *py_lock(PyObject *self, PyObject *args) {
    unsigned long long addr;
    if (!PyArg_ParseTuple(args, "K", &addr)) return NULL;
    int32_t *word = as_word(addr);
    Py_BEGIN_ALLOW_THREADS
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
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_unlock(PyObject *self, PyObject *args) {
    unsigned long long addr;
    if (!PyArg_ParseTuple(args, "K", &addr)) return NULL;
    int32_t *word = as_word(addr);
    if (__atomic_fetch_sub(word, 1, __ATOMIC_RELEASE) != 1) {
        __atomic_store_n(word, 0, __ATOMIC_RELEASE);
#ifdef __linux__
        syscall(SYS_futex, word, FUTEX_WAKE, 1, NULL, NULL, 0);
#endif
    }
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

static PyMethodDef methods[] = {
    {"fetch_add", py_fetch_add, METH_VARARGS, "fetch_add(addr, sleepers, delta) -> old int32 value"},
    {"exchange", py_exchange, METH_VARARGS, "exchange(addr, sleepers, value) -> old int32 value"},
    {"load", py_load, METH_VARARGS, "load(addr) -> int32 value"},
    {"wait", py_wait, METH_VARARGS, "wait(addr, sleepers, cmp, expected, spin_s, yield_s, timeout_s) -> (ok, value)"},
    {"lock", py_lock, METH_VARARGS, "lock(addr): acquire a futex mutex word"},
    {"unlock", py_unlock, METH_VARARGS, "unlock(addr): release a futex mutex word"},
    {"die_with_parent", py_die_with_parent, METH_NOARGS, "kill this process when its parent exits"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_atomics", NULL, -1, methods};

PyMODINIT_FUNC PyInit__atomics(void) { return PyModule_Create(&module); }
