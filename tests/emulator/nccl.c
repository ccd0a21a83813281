/* An NCCL emulator for CI machines without GPUs, on top of MPI.
 *
 * NOT NCCL: buffers are the host memory that emulator/cuda.c hands out.
 * Calls are checked when made and run later on the stream they were given
 * (emulator/cuda.c's worker threads, found with dlopen), in stream order;
 * a failure there becomes the communicator's asynchronous error, as on a
 * GPU. The workers move data over the TCP mesh only (they must not call
 * MPI, which rankmesh initialises for one thread). With RANKMESH_EMU_ASYNC=0
 * each call runs synchronously when made, over MPI within a job. It gives the
 * device plane's logic (communicator creation over MPI, unique-id bytes,
 * offsets and block orders, grouped send/recv, error strings, async-error
 * polling and abort) a real multi-process peer in CI. Reductions run in rank
 * order after an all-gather and round to the dtype after every addition, as
 * NCCL rounds at every hop (its order differs; its per-hop rounding does
 * not), so device and host results of f16/bf16/fp8 sums differ as they do on
 * a GPU. fp8 (types 10, 11) converts with round-to-nearest-even, saturating
 * to the largest finite value like CUDA's __NV_SATFINITE.
 *
 * Bootstrap is TCP, as NCCL's is: ncclGetUniqueId listens on 127.0.0.1 and
 * puts the address in the id; every member connects there and says which
 * job (PMIX_NAMESPACE) it belongs to. When all share the root's job, the
 * communicator is an MPI communicator of that job (the data paths below);
 * when they do not (a group of separately launched jobs), the members form
 * a TCP mesh and the same calls run over it.
 *
 * RANKMESH_EMU_FAIL_AFTER=N: after N collective calls on this rank, report
 * ncclRemoteError (6) from ncclCommGetAsyncError (a "failed peer").
 * RANKMESH_EMU_INIT_FAIL=1: ncclCommInitRank fails on this rank.
 * RANKMESH_EMU_NCCL_VERSION=N: the version ncclGetVersion reports (default
 * 22703, 2.27.3); below 22400 the fp8 types are refused, as NCCL < 2.24 does.
 * RANKMESH_EMU_CC=M.m: the devices' compute capability (as cuda.c shows it,
 * default 9.0); below 9.0 fp8 reductions are refused with NCCL's own text.
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int ncclResult_t;
typedef struct {
    char internal[128];
} ncclUniqueId;

typedef struct Comm {
    MPI_Comm mpi;
    int *socks; /* TCP mode: the connection to each member (-1 for self); NULL in MPI mode */
    int rank, size;
    long calls;
    int aborted;
    int err;       /* asynchronous error of a call run on a stream */
    long inflight; /* calls enqueued on streams and not yet run */
} Comm;

enum { SUCCESS = 0, UNHANDLED_CUDA = 1, SYSTEM_ERROR = 2, INTERNAL = 3, INVALID_ARGUMENT = 4, INVALID_USAGE = 5, REMOTE = 6 };

static const char MAGIC[8] = "rkmEMU01";

/* emulator/cuda.c's stream queue, when that library is loaded and asynchronous. */
typedef int (*EnqueueFn)(void *, void (*)(void *), void *);
static EnqueueFn stream_queue(void) {
    static int tried;
    static EnqueueFn f;
    if (!tried) {
        tried = 1;
        const char *a = getenv("RANKMESH_EMU_ASYNC");
        if (a && strcmp(a, "0") == 0) return NULL;
        void *h = dlopen("libcuda.so", RTLD_LAZY | RTLD_NOLOAD);
        if (!h) h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (h) f = (EnqueueFn)dlsym(h, "rankmesh_emu_enqueue");
    }
    return f;
}

/* Read once: every call asks (element sizes), and getenv dominated small calls. */
static int version(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("RANKMESH_EMU_NCCL_VERSION");
        v = e ? atoi(e) : 22703;
    }
    return v;
}

ncclResult_t ncclGetVersion(int *v) {
    *v = version();
    return SUCCESS;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case SUCCESS: return "no error";
    case INVALID_ARGUMENT: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case INVALID_USAGE: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case REMOTE: return "remote process exited or there was a network error";
    case SYSTEM_ERROR: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    default: return "internal error - please report this issue to the NCCL developers";
    }
}

/* The last error's text, per thread, as NCCL keeps it. */
static __thread char last_error[256];

const char *ncclGetLastError(void *comm) {
    (void)comm;
    return last_error;
}

/* Below sm 9.0 NCCL refuses to reduce fp8 ("FP8 reduction support begins
   with sm90 capable devices", invalid argument). */
static int fp8_reduction_refused(int t) {
    int major = 9;
    const char *cc = getenv("RANKMESH_EMU_CC");
    if (cc) sscanf(cc, "%d", &major);
    if ((t == 10 || t == 11) && major < 9) {
        snprintf(last_error, sizeof last_error, "FP8 reduction support begins with sm90 capable devices");
        return 1;
    }
    return 0;
}

static void release(Comm *c);

/* ---- sockets ---- */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* A listener on 127.0.0.1 at an ephemeral port; the port in *port. */
static int listen_local(uint16_t *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 128) ||
        getsockname(fd, (struct sockaddr *)&a, &len)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static int dial(uint32_t ip, uint16_t port) {
    double until = now() + 60;
    while (now() < until) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = ip};
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            return fd;
        }
        close(fd);
        usleep(20000);
    }
    return -1;
}

static int accept_one(int listener) {
    struct pollfd p = {.fd = listener, .events = POLLIN};
    if (poll(&p, 1, 60000) != 1) return -1;
    int fd = accept(listener, NULL, NULL);
    int one = 1;
    if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int put(int fd, const void *b, size_t n) {
    for (const char *p = b; n;) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0 && errno != EINTR) return -1;
        if (k > 0) p += k, n -= (size_t)k;
    }
    return 0;
}

static int get(int fd, void *b, size_t n) {
    for (char *p = b; n;) {
        ssize_t k = recv(fd, p, n, 0);
        if (k == 0 || (k < 0 && errno != EINTR)) return -1;
        if (k > 0) p += k, n -= (size_t)k;
    }
    return 0;
}

/* Transfers on a mesh, progressed together with poll() so that no member
 * blocks another; on each connection, sends (and receives) run in order. */
typedef struct {
    int fd, send;
    char *buf;
    size_t len, done;
} Xfer;

static ncclResult_t run_xfers(Xfer *x, int n) {
    struct pollfd *p = calloc((size_t)n + 1, sizeof *p);
    int *which = calloc((size_t)n + 1, sizeof *which);
    ncclResult_t rc = SUCCESS;
    for (;;) {
        int k = 0;
        for (int i = 0; i < n; i++) {
            if (x[i].done == x[i].len) continue;
            int first = 1; /* the first unfinished transfer of its fd and direction */
            for (int j = 0; j < i; j++)
                if (x[j].fd == x[i].fd && x[j].send == x[i].send && x[j].done < x[j].len) first = 0;
            if (!first) continue;
            p[k] = (struct pollfd){.fd = x[i].fd, .events = x[i].send ? POLLOUT : POLLIN};
            which[k++] = i;
        }
        if (!k) break;
        if (poll(p, (nfds_t)k, 120000) <= 0) {
            rc = REMOTE;
            break;
        }
        for (int m = 0; m < k; m++) {
            if (!p[m].revents) continue;
            Xfer *t = &x[which[m]];
            ssize_t got = t->send ? send(t->fd, t->buf + t->done, t->len - t->done, MSG_NOSIGNAL | MSG_DONTWAIT)
                                  : recv(t->fd, t->buf + t->done, t->len - t->done, MSG_DONTWAIT);
            if (got > 0)
                t->done += (size_t)got;
            else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
                rc = REMOTE;
                goto out;
            }
        }
    }
out:
    free(p);
    free(which);
    return rc;
}

/* The id: MAGIC, the root's pid and listener, the root's job. */
typedef struct {
    char magic[8];
    int32_t pid, listener;
    uint32_t ip;
    uint16_t port;
    char job[94];
} IdFields;

static void job_of(char *out, size_t n) {
    const char *ns = getenv("PMIX_NAMESPACE");
    if (ns)
        snprintf(out, n, "%s", ns);
    else
        snprintf(out, n, "singleton-%d", (int)getpid());
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    IdFields f;
    memset(&f, 0, sizeof f);
    memcpy(f.magic, MAGIC, 8);
    f.pid = (int32_t)getpid();
    f.listener = listen_local(&f.port);
    if (f.listener < 0) return SYSTEM_ERROR;
    f.ip = htonl(INADDR_LOOPBACK);
    job_of(f.job, sizeof f.job);
    memset(id, 0, sizeof *id);
    memcpy(id->internal, &f, sizeof f);
    /* High-bit byte on purpose: the id must survive c_char's sign. */
    id->internal[127] = (char)0xff;
    return SUCCESS;
}

/* What a member tells the root. */
typedef struct {
    int32_t rank, nranks, world;
    uint16_t port;
    char job[94];
} Hello;

ncclResult_t ncclCommInitRank(Comm **out, int nranks, ncclUniqueId id, int rank) {
    IdFields f;
    memcpy(&f, id.internal, sizeof f);
    if (memcmp(f.magic, MAGIC, 8) != 0 || (unsigned char)id.internal[127] != 0xff)
        return INVALID_ARGUMENT;
    if (rank < 0 || rank >= nranks) return INVALID_ARGUMENT;
    if ((rank == 0) != (f.pid == (int32_t)getpid())) return INVALID_USAGE; /* rank 0 made the id */
    const char *fail = getenv("RANKMESH_EMU_INIT_FAIL");
    int world;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    Hello me = {rank, nranks, world, 0, {0}};
    job_of(me.job, sizeof me.job);
    int *socks = malloc(sizeof(int) * (size_t)nranks);
    for (int i = 0; i < nranks; i++) socks[i] = -1;
    Hello *all = calloc((size_t)nranks, sizeof *all);
    int listener = -1, tcp = 0;
    if (rank == 0) {
        all[0] = me;
        for (int i = 1; i < nranks; i++) {
            Hello h;
            int fd = accept_one(f.listener);
            if (fd < 0 || get(fd, &h, sizeof h) || h.rank <= 0 || h.rank >= nranks || socks[h.rank] >= 0) {
                if (fd >= 0) close(fd);
                i--;
                continue;
            }
            socks[h.rank] = fd;
            all[h.rank] = h;
            tcp |= strcmp(h.job, me.job) != 0 || stream_queue() != NULL;
        }
        close(f.listener);
        for (int i = 1; i < nranks; i++) {
            put(socks[i], &tcp, sizeof tcp);
            put(socks[i], all, sizeof *all * (size_t)nranks);
        }
    } else {
        listener = listen_local(&me.port);
        socks[0] = dial(f.ip, f.port);
        if (socks[0] < 0 || put(socks[0], &me, sizeof me) || get(socks[0], &tcp, sizeof tcp) ||
            get(socks[0], all, sizeof *all * (size_t)nranks))
            return SYSTEM_ERROR;
    }
    Comm *c = calloc(1, sizeof *c);
    c->rank = rank;
    c->size = nranks;
    if (tcp) {
        /* The mesh: connect to the lower ranks, accept the higher ones. */
        for (int j = 1; j < rank; j++) {
            socks[j] = dial(htonl(INADDR_LOOPBACK), all[j].port);
            if (socks[j] < 0 || put(socks[j], &rank, sizeof rank)) return SYSTEM_ERROR;
        }
        for (int n = rank + 1; n < nranks && rank > 0; n++) {
            int who, fd = accept_one(listener);
            if (fd < 0 || get(fd, &who, sizeof who) || who <= rank || who >= nranks) return SYSTEM_ERROR;
            socks[who] = fd;
        }
        c->socks = socks;
    } else {
        /* One job: an MPI communicator of the members' world ranks. */
        int *members = malloc(sizeof(int) * (size_t)nranks);
        for (int i = 0; i < nranks; i++) members[i] = all[i].world;
        MPI_Group wg, mine;
        MPI_Comm_group(MPI_COMM_WORLD, &wg);
        MPI_Group_incl(wg, nranks, members, &mine);
        MPI_Comm_create_group(MPI_COMM_WORLD, mine, 30000 + (int)(f.port % 1000), &c->mpi);
        MPI_Group_free(&mine);
        MPI_Group_free(&wg);
        free(members);
        for (int i = 0; i < nranks; i++)
            if (socks[i] >= 0) close(socks[i]);
        free(socks);
    }
    if (listener >= 0) close(listener);
    free(all);
    if (fail && atoi(fail)) {
        release(c);
        return SYSTEM_ERROR;
    }
    *out = c;
    return SUCCESS;
}

static void release(Comm *c) {
    if (c->socks) {
        for (int i = 0; i < c->size; i++)
            if (c->socks[i] >= 0) close(c->socks[i]);
        free(c->socks);
    } else {
        MPI_Comm_free(&c->mpi);
    }
    free(c);
}
static long inflight(Comm *c) { return __atomic_load_n(&c->inflight, __ATOMIC_ACQUIRE); }

/* Waits (up to 30 s) for the calls still queued on streams, as NCCL's
 * destroy flushes them; a communicator they never release is leaked. */
ncclResult_t ncclCommDestroy(Comm *c) {
    for (int i = 0; i < 3000000 && inflight(c); i++) usleep(10);
    if (!inflight(c)) release(c);
    return SUCCESS;
}
/* Queued calls fail at once: the sockets are shut down under them. Like
 * NCCL's abort, it returns once they are done (up to 10 s; a communicator
 * still referenced by queued calls after that is leaked). */
ncclResult_t ncclCommAbort(Comm *c) {
    __atomic_store_n(&c->aborted, 1, __ATOMIC_RELEASE);
    if (c->socks)
        for (int i = 0; i < c->size; i++)
            if (c->socks[i] >= 0) shutdown(c->socks[i], SHUT_RDWR);
    for (int i = 0; i < 1000000 && inflight(c); i++) usleep(10);
    if (!inflight(c)) release(c);
    return SUCCESS;
}
ncclResult_t ncclCommGetAsyncError(Comm *c, ncclResult_t *e) {
    static long fail_after = -2;
    if (fail_after == -2) {
        const char *after = getenv("RANKMESH_EMU_FAIL_AFTER");
        fail_after = after ? atol(after) : -1;
    }
    int err = __atomic_load_n(&c->err, __ATOMIC_ACQUIRE);
    *e = err ? err : (fail_after >= 0 && c->calls >= fail_after) ? REMOTE : SUCCESS;
    return SUCCESS;
}

/* ncclDataType_t: element sizes. */
static size_t elem(int t) {
    static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    int types = version() >= 22400 ? 12 : 10;
    return (t >= 0 && t < types) ? sizes[t] : 0;
}

/* fp8 value of code `b` (e5m2 != 0: 5 exponent bits, else 4 with no
 * infinities, E4M3FN). */
static double fp8_decode(uint8_t b, int e5m2) {
    int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
    int exp = (b & 0x7f) >> mbits, man = b & ((1 << mbits) - 1);
    double v = exp ? ldexp(1.0 + man / (double)(1 << mbits), exp - bias)
                   : ldexp(man / (double)(1 << mbits), 1 - bias);
    if (e5m2 ? exp == 31 : (b & 0x7f) == 0x7f) v = exp == 31 && !man ? INFINITY : NAN;
    return (b & 0x80) ? -v : v;
}

/* Nearest fp8 code to `v`, ties to the even code, saturating at the largest
 * finite value. A scan over the positive codes: slow, and plainly right. */
static uint8_t fp8_encode(double v, int e5m2) {
    if (isnan(v)) return 0x7f;
    uint8_t sign = signbit(v) ? 0x80 : 0, max = e5m2 ? 0x7b : 0x7e, best = 0;
    double a = fabs(v), err = INFINITY;
    for (int c = 0; c <= max; c++) {
        double d = fabs(fp8_decode((uint8_t)c, e5m2) - a);
        if (d < err || (d == err && !(c & 1))) {
            err = d;
            best = (uint8_t)c;
        }
    }
    return sign | best;
}

static double load(const void *p, int t) {
    switch (t) {
    case 0: return *(const int8_t *)p;
    case 1: return *(const uint8_t *)p;
    case 2: return *(const int32_t *)p;
    case 3: return *(const uint32_t *)p;
    case 4: return (double)*(const int64_t *)p;
    case 5: return (double)*(const uint64_t *)p;
    case 6: return (double)*(const _Float16 *)p;
    case 7: return *(const float *)p;
    case 8: return *(const double *)p;
    case 10: return fp8_decode(*(const uint8_t *)p, 0);
    case 11: return fp8_decode(*(const uint8_t *)p, 1);
    default: { /* bf16 */
        uint32_t bits = (uint32_t)(*(const uint16_t *)p) << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    }
}

static void store(void *p, int t, double v) {
    switch (t) {
    case 0: *(int8_t *)p = (int8_t)(int64_t)v; break;
    case 1: *(uint8_t *)p = (uint8_t)(int64_t)v; break;
    case 2: *(int32_t *)p = (int32_t)(int64_t)v; break;
    case 3: *(uint32_t *)p = (uint32_t)(int64_t)v; break;
    case 4: *(int64_t *)p = (int64_t)v; break;
    case 5: *(uint64_t *)p = (uint64_t)v; break;
    case 6: *(_Float16 *)p = (_Float16)(float)v; break;
    case 7: *(float *)p = (float)v; break;
    case 8: *(double *)p = v; break;
    case 10: *(uint8_t *)p = fp8_encode(v, 0); break;
    case 11: *(uint8_t *)p = fp8_encode(v, 1); break;
    default: { /* bf16, round to nearest even */
        float f = (float)v;
        uint32_t bits;
        memcpy(&bits, &f, 4);
        bits += 0x7fff + ((bits >> 16) & 1);
        *(uint16_t *)p = (uint16_t)(bits >> 16);
    }
    }
}

/* `v` rounded to type `t`, as a value of `t` holds it. */
static double rounded(double v, int t) {
    char cell[8];
    store(cell, t, v);
    return load(cell, t);
}

/* Element-wise reduction of `n` contributions (rank order) into dst, the
 * partial result rounded to the dtype after each step (a hop). */
static void reduce_into(void *dst, const char *all, size_t count, int t, int op, int n) {
    size_t e = elem(t), stride = count * e;
    for (size_t i = 0; i < count; i++) {
        double acc = load(all + i * e, t);
        for (int r = 1; r < n; r++) {
            double v = load(all + (size_t)r * stride + i * e, t);
            switch (op) {
            case 0: case 4: acc += v; break;
            case 1: acc *= v; break;
            case 2: acc = v > acc ? v : acc; break;
            default: acc = v < acc ? v : acc; break;
            }
            acc = rounded(acc, t);
        }
        if (op == 4) {
            acc /= n;
            if (t <= 5) acc = (double)(int64_t)acc; /* integer avg truncates */
        }
        store((char *)dst + i * e, t, acc);
    }
}

/* Every member's `bytes` from `s`, in rank order, into `r`. */
static ncclResult_t allgather(const void *s, void *r, size_t bytes, Comm *c) {
    if (!c->socks) {
        MPI_Allgather(s, (int)bytes, MPI_BYTE, r, (int)bytes, MPI_BYTE, c->mpi);
        return SUCCESS;
    }
    memmove((char *)r + (size_t)c->rank * bytes, s, bytes);
    Xfer *x = calloc(2 * (size_t)c->size, sizeof *x);
    int n = 0;
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        x[n++] = (Xfer){c->socks[p], 1, (char *)r + (size_t)c->rank * bytes, bytes, 0};
        x[n++] = (Xfer){c->socks[p], 0, (char *)r + (size_t)p * bytes, bytes, 0};
    }
    ncclResult_t rc = run_xfers(x, n);
    free(x);
    return rc;
}

/* `root`'s `bytes` at `r` everywhere. */
static ncclResult_t bcast(void *r, size_t bytes, int root, Comm *c) {
    if (!c->socks) {
        MPI_Bcast(r, (int)bytes, MPI_BYTE, root, c->mpi);
        return SUCCESS;
    }
    Xfer *x = calloc((size_t)c->size, sizeof *x);
    int n = 0;
    if (c->rank == root) {
        for (int p = 0; p < c->size; p++)
            if (p != root) x[n++] = (Xfer){c->socks[p], 1, r, bytes, 0};
    } else {
        x[n++] = (Xfer){c->socks[root], 0, r, bytes, 0};
    }
    ncclResult_t rc = run_xfers(x, n);
    free(x);
    return rc;
}

static ncclResult_t enter(Comm *c, int t) {
    if (!c || c->aborted) return INVALID_USAGE;
    if (!elem(t)) return INVALID_ARGUMENT;
    c->calls++;
    return SUCCESS;
}

static ncclResult_t all_reduce_bytes(const void *s, void *r, size_t count, int t, int op, Comm *c, int root) {
    size_t bytes = count * elem(t);
    char *all = malloc(bytes * (size_t)c->size + 1);
    ncclResult_t rc = allgather(s, all, bytes, c);
    if (!rc && (root < 0 || root == c->rank)) reduce_into(r, all, count, t, op, c->size);
    free(all);
    return rc;
}

/* Point-to-point calls are queued between ncclGroupStart and ncclGroupEnd. */
typedef struct {
    int send;
    void *buf;
    int bytes, peer;
    Comm *comm;
    void *stream;
} P2p;

/* One call as it runs on its stream. */
enum { ALL_REDUCE, REDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST, P2P };
typedef struct {
    int kind;
    const void *s;
    void *r;
    size_t count;
    int t, op, root;
    Comm *c;
    P2p *batch;
    int nbatch;
} Job;

static ncclResult_t run_p2p(P2p *q, int n) {
    MPI_Request *reqs = calloc((size_t)n + 1, sizeof *reqs);
    Xfer *xfers = calloc((size_t)n + 1, sizeof *xfers);
    int nreq = 0, nx = 0;
    for (int i = 0; i < n; i++) {
        P2p *p = &q[i];
        if (p->comm->socks && p->peer == p->comm->rank) {
            /* To itself over TCP: the k-th send meets the k-th receive. */
            if (!p->send) continue;
            int k = 0;
            for (int j = 0; j < i; j++) k += q[j].send && q[j].comm == p->comm && q[j].peer == p->peer;
            for (int j = 0; j < n; j++)
                if (!q[j].send && q[j].comm == p->comm && q[j].peer == p->peer && k-- == 0) {
                    memmove(q[j].buf, p->buf, (size_t)(p->bytes < q[j].bytes ? p->bytes : q[j].bytes));
                    break;
                }
        } else if (p->comm->socks)
            xfers[nx++] = (Xfer){p->comm->socks[p->peer], p->send, p->buf, (size_t)p->bytes, 0};
        else if (p->send)
            MPI_Isend(p->buf, p->bytes, MPI_BYTE, p->peer, 77, p->comm->mpi, &reqs[nreq++]);
        else
            MPI_Irecv(p->buf, p->bytes, MPI_BYTE, p->peer, 77, p->comm->mpi, &reqs[nreq++]);
    }
    ncclResult_t rc = run_xfers(xfers, nx);
    MPI_Waitall(nreq, reqs, MPI_STATUSES_IGNORE);
    free(reqs);
    free(xfers);
    return rc;
}

static ncclResult_t run_job(Job *j) {
    Comm *c = j->c;
    size_t bytes = j->count * elem(j->t);
    switch (j->kind) {
    case ALL_REDUCE:
        return all_reduce_bytes(j->s, j->r, j->count, j->t, j->op, c, -1);
    case REDUCE:
        return all_reduce_bytes(j->s, j->r, j->count, j->t, j->op, c, j->root);
    case REDUCE_SCATTER: {
        char *full = malloc(bytes * (size_t)c->size + 1);
        ncclResult_t rc = all_reduce_bytes(j->s, full, j->count * (size_t)c->size, j->t, j->op, c, -1);
        if (!rc) memcpy(j->r, full + (size_t)c->rank * bytes, bytes);
        free(full);
        return rc;
    }
    case ALL_GATHER:
        return allgather(j->s, j->r, bytes, c);
    case BROADCAST:
        if (c->rank == j->root && j->s != j->r) memmove(j->r, j->s, bytes);
        return bcast(j->r, bytes, j->root, c);
    default:
        return run_p2p(j->batch, j->nbatch);
    }
}

static void run_queued(void *p) {
    Job *j = p;
    Comm *c = j->c;
    ncclResult_t rc = __atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE) ? REMOTE : run_job(j);
    if (rc) __atomic_store_n(&c->err, rc, __ATOMIC_RELEASE);
    __atomic_sub_fetch(&c->inflight, 1, __ATOMIC_ACQ_REL);
    free(j->batch);
    free(j);
}

/* Runs `j` on `stream` (asynchronously), or now when no stream queue is loaded. */
/* RANKMESH_EMU_NCCL_SKIP=1 (benchmarks only): calls are checked and then
   move nothing, so a bench loop measures the host time of the layers above
   NCCL without the emulated transfer's time and noise. Results are wrong. */
static int skip_transfers(void) {
    static int skip = -1;
    if (skip < 0) {
        const char *v = getenv("RANKMESH_EMU_NCCL_SKIP");
        skip = v && strcmp(v, "1") == 0;
    }
    return skip;
}

static ncclResult_t submit(Job j, void *stream) {
    if (skip_transfers()) {
        free(j.batch);
        return SUCCESS;
    }
    EnqueueFn q = stream_queue();
    if (!q) {
        ncclResult_t rc = run_job(&j);
        free(j.batch);
        return rc;
    }
    Job *queued = malloc(sizeof *queued);
    *queued = j;
    __atomic_add_fetch(&j.c->inflight, 1, __ATOMIC_ACQ_REL);
    q(stream, run_queued, queued);
    return SUCCESS;
}

static ncclResult_t collective(int kind, const void *s, void *r, size_t count, int t, int op, int root, Comm *c,
                               void *stream) {
    ncclResult_t e = enter(c, t);
    if (e) return e;
    if ((kind == REDUCE || kind == BROADCAST) && (root < 0 || root >= c->size)) return INVALID_ARGUMENT;
    if ((kind == ALL_REDUCE || kind == REDUCE || kind == REDUCE_SCATTER) && fp8_reduction_refused(t))
        return INVALID_ARGUMENT;
    return submit((Job){kind, s, r, count, t, op, root, c, NULL, 0}, stream);
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, int t, int op, Comm *c, void *stream) {
    return collective(ALL_REDUCE, s, r, count, t, op, 0, c, stream);
}
ncclResult_t ncclReduce(const void *s, void *r, size_t count, int t, int op, int root, Comm *c, void *stream) {
    return collective(REDUCE, s, r, count, t, op, root, c, stream);
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t recvcount, int t, int op, Comm *c, void *stream) {
    return collective(REDUCE_SCATTER, s, r, recvcount, t, op, 0, c, stream);
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t sendcount, int t, Comm *c, void *stream) {
    return collective(ALL_GATHER, s, r, sendcount, t, 0, 0, c, stream);
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, int t, int root, Comm *c, void *stream) {
    return collective(BROADCAST, s, r, count, t, 0, root, c, stream);
}

static P2p queue[4096];
static int queued, depth;

/* The calls queued since the group began, as one job on the first call's stream. */
static ncclResult_t flush(void) {
    if (!queued) return SUCCESS;
    P2p *batch = malloc(sizeof *batch * (size_t)queued);
    memcpy(batch, queue, sizeof *batch * (size_t)queued);
    int n = queued;
    queued = 0;
    return submit((Job){P2P, NULL, NULL, 0, 0, 0, 0, batch[0].comm, batch, n}, batch[0].stream);
}

static ncclResult_t p2p(int send, const void *buf, size_t count, int t, int peer, Comm *c, void *stream) {
    ncclResult_t e = enter(c, t);
    if (e) return e;
    if (peer < 0 || peer >= c->size || queued == 4096) return INVALID_ARGUMENT;
    queue[queued++] = (P2p){send, (void *)buf, (int)(count * elem(t)), peer, c, stream};
    return depth ? SUCCESS : flush();
}

ncclResult_t ncclSend(const void *s, size_t count, int t, int peer, Comm *c, void *stream) {
    return p2p(1, s, count, t, peer, c, stream);
}
ncclResult_t ncclRecv(void *r, size_t count, int t, int peer, Comm *c, void *stream) {
    return p2p(0, r, count, t, peer, c, stream);
}
ncclResult_t ncclGroupStart(void) {
    depth++;
    return SUCCESS;
}
ncclResult_t ncclGroupEnd(void) {
    if (depth == 0) return INVALID_USAGE;
    return --depth ? SUCCESS : flush();
}
