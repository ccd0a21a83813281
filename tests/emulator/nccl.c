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
 * ncclRemoteError (6) from ncclCommGetAsyncError (a "failed peer");
 * with RANKMESH_EMU_FAIL_RANK=R, on world rank R only (a failure that one
 * member sees first, while its peers' communicators stay healthy).
 * RANKMESH_EMU_INIT_FAIL=1: ncclCommInitRank fails on this rank.
 * RANKMESH_EMU_INIT_HANG=R: a non-blocking creation on world rank R
 * connects to its peers and then never finishes (a transport stuck in setup).
 * RANKMESH_EMU_STALL=R: world rank R accepts calls after each communicator's
 * first (rankmesh's warm-up) and never runs them (a peer alive but gone
 * quiet, with no error).
 * RANKMESH_EMU_FAIL_SEND=N: this rank's N-th ncclSend (from 1) is refused.
 *
 * As strict as NCCL where rankmesh could go wrong:
 *   - the bootstrap refuses members that disagree on nranks, a rank that
 *     checks in twice, and two ranks on one GPU of one host, by NCCL's rule:
 *     the same host hash (NCCL_HOSTID, else hostname and boot id, read
 *     once per process) and the same PCI bus id (Duplicate GPU detected);
 *   - on a non-blocking communicator, collectives, p2p calls and
 *     ncclGroupEnd answer ncclInProgress at random (RANKMESH_EMU_IN_PROGRESS
 *     percent, default 30), and the next call is refused until the caller
 *     has polled ncclCommGetAsyncError to ncclSuccess;
 *   - a send completes only once its receive is posted (a credit over TCP,
 *     MPI_Issend over MPI), so an unmatched send hangs as on NCCL;
 *   - a destroyed or aborted communicator refuses every call;
 *   - ncclCommShrink (2.27) refuses an excluded caller, an empty list and
 *     unknown flags as NCCL does, and also what NCCL leaves undefined: an
 *     excluded rank out of range or named twice, survivors that disagree on
 *     the list, and NCCL_SHRINK_DEFAULT with work in flight on the parent.
 *
 * Non-blocking creation (ncclCommInitRankConfig / ...Scalable with
 * blocking = 0) bootstraps in a thread and answers ncclInProgress until it
 * is done, as NCCL does; such communicators always move data over TCP (the
 * thread may not call MPI). ncclCommSplit exchanges colors over MPI (it is
 * called on rankmesh's MPI thread) and builds the children's mesh at once;
 * ncclCommShrink does the same among the survivors only (point to point
 * over MPI_COMM_WORLD, so nothing waits on an excluded, maybe dead, rank);
 * a non-blocking child still answers ncclInProgress to its first poll.
 * An aborted communicator is poisoned, not freed, so a later use of it is
 * reported (and the ASan build frees it, so ASan sees the use).
 * Compiled with -DEMU_NCCL_2_18, the library is NCCL 2.18.5: configs and
 * splits, but no registration (2.19), scalable init (2.23), windows (2.27)
 * or ncclAlltoAll / ncclGather / ncclScatter (2.28).
 * RANKMESH_EMU_NCCL_VERSION=N: the version ncclGetVersion reports (default
 * 22803, 2.28.3); below 22400 the fp8 types are refused, as NCCL < 2.24 does.
 * RANKMESH_EMU_CC=M.m: the devices' compute capability (as cuda.c shows it,
 * default 9.0); below 9.0 fp8 reductions are refused with NCCL's own text.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef RANKMESH_REAL_NCCL_H
/* The real header (tests/emulator/mod.rs builds with it when the wheels are
   there): every definition below must match its declaration, or the build
   fails with "conflicting types". */
#include <nccl.h>
#else
/* nccl.h's types as it spells them, for builds without the wheels. */
typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
typedef struct ncclConfig_v23100 ncclConfig_t;
typedef struct ncclWindow_vidmem *ncclWindow_t;
typedef struct CUstream_st *cudaStream_t;
#endif

typedef struct ncclComm {
    uint32_t magic; /* ALIVE; DEAD once aborted or destroyed (then never touched again) */
    MPI_Comm mpi;
    int *socks; /* TCP mode: the connection to each member (-1 for self); NULL in MPI mode */
    int *world; /* each member's MPI_COMM_WORLD rank (splits exchange over it) */
    int same_job;
    int rank, size;
    long calls;
    int aborted;
    int err;       /* asynchronous error of a call run on a stream */
    long inflight; /* calls enqueued on streams and not yet run */
    int nonblocking;
    int ready;      /* 0 while a non-blocking creation runs in the background */
    /* 0 until ncclCommGetAsyncError has told the caller a non-blocking
       creation finished: NCCL's contract is to poll to ncclSuccess before
       any call, and refusing calls until then keeps the emulator's answer
       from depending on whether the background thread happened to finish. */
    int polled;
    int polls_busy; /* ncclInProgress answers still due (a split settling) */
    /* An out-pointer NCCL fills in the background (a split's child, a
       window's handle), written when the communicator is polled to rest. */
    void **pending_out;
    void *pending_value;
    int finalizing;
    long splits;    /* splits of this communicator so far (their message tags) */
    pthread_t init_thread;
    int has_thread;
    int device; /* the current device when it was created (-1: unknown) */
} Comm;

enum { ALIVE = 0x4c4d4f43, DEAD = 0xdeadc0de };

/* Counters the tests read (dlsym): bootstraps from unique ids, splits, the
   roots of the last scalable bootstrap, registrations. */
static int count_inits, count_splits, count_shrinks, count_roots, count_registered, count_windows, live_registrations;
int rankmesh_emu_inits(void) { return count_inits; }
int rankmesh_emu_splits(void) { return count_splits; }
int rankmesh_emu_shrinks(void) { return count_shrinks; }
int rankmesh_emu_roots(void) { return count_roots; }
int rankmesh_emu_registered(void) { return count_registered; }
int rankmesh_emu_windows(void) { return count_windows; }
int rankmesh_emu_live_registrations(void) { return live_registrations; }

enum { SUCCESS = 0, UNHANDLED_CUDA = 1, SYSTEM_ERROR = 2, INTERNAL = 3, INVALID_ARGUMENT = 4, INVALID_USAGE = 5, REMOTE = 6, IN_PROGRESS_RC = 7 };

static const char MAGIC[8] = "rkmEMU01";

/* emulator/cuda.c's stream queue, when that library is loaded and asynchronous. */
typedef int (*EnqueueFn)(void *, void (*)(void *), void *);
/* A symbol of the emulated CUDA driver (emulator/cuda.c) already loaded in
 * the process; NULL without it. Every call into the driver emulator comes
 * through here. */
static void *cuda_symbol(const char *name) {
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so", RTLD_LAZY | RTLD_NOLOAD);
    return h ? dlsym(h, name) : NULL;
}

static EnqueueFn stream_queue(void) {
    static int tried;
    static EnqueueFn f;
    if (!tried) {
        tried = 1;
        const char *a = getenv("RANKMESH_EMU_ASYNC");
        if (a && strcmp(a, "0") == 0) return NULL;
        f = (EnqueueFn)cuda_symbol("rankmesh_emu_enqueue");
    }
    return f;
}

/* Read once: every call asks (element sizes), and getenv dominated small calls. */
static int version(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("RANKMESH_EMU_NCCL_VERSION");
#ifdef EMU_NCCL_2_18
        v = e ? atoi(e) : 21805;
#else
        v = e ? atoi(e) : 22803;
#endif
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

const char *ncclGetLastError(ncclComm_t comm) {
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
    else if (getenv("PMI_SIZE"))
        /* Hydra (MPICH, Intel MPI) names no job, but one node's ranks of a
           job are the children of one proxy (the emulator is one node). */
        snprintf(out, n, "hydra-%d", (int)getppid());
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
    uint64_t host; /* NCCL's host hash (host_hash) */
    char bus[32];  /* the current device's PCI bus id; empty if unknown */
} Hello;

/* NCCL's hostHash (getHostHashOnce): NCCL_HOSTID when set, else the
 * hostname and the boot id; computed once per process, as NCCL does, so
 * NCCL_HOSTID must be in the environment before the first NCCL call. */
static uint64_t the_host_hash;
static void compute_host_hash(void) {
    char buf[512] = {0};
    const char *id = getenv("NCCL_HOSTID");
    if (id && *id) {
        snprintf(buf, sizeof buf, "%s", id);
    } else {
        gethostname(buf, 255);
        FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
        size_t n = strlen(buf);
        if (f) {
            if (!fgets(buf + n, (int)(sizeof buf - n), f)) buf[n] = 0;
            fclose(f);
        }
    }
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *p = buf; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    the_host_hash = h;
}
static uint64_t host_hash(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, compute_host_hash);
    return the_host_hash;
}

/* The members' mesh: connect to the lower ranks (at their listeners'
 * `ports`), accept the higher ones on `listener`. */
static ncclResult_t mesh(int *socks, int rank, int nranks, const uint16_t *ports, int listener) {
    for (int j = 0; j < rank; j++) {
        if (socks[j] >= 0) continue; /* the root's connection, kept */
        socks[j] = dial(htonl(INADDR_LOOPBACK), ports[j]);
        if (socks[j] < 0 || put(socks[j], &rank, sizeof rank)) return SYSTEM_ERROR;
    }
    int missing = 0; /* higher ranks not yet connected: they dial in, in any order */
    for (int n = rank + 1; n < nranks; n++) missing += socks[n] < 0;
    while (missing--) {
        int who, fd = accept_one(listener);
        if (fd < 0 || get(fd, &who, sizeof who) || who <= rank || who >= nranks || socks[who] >= 0) return SYSTEM_ERROR;
        socks[who] = fd;
    }
    return SUCCESS;
}

/* The device of the calling thread's current context (emulator/cuda.c), -1 if unknown. */
static int current_device(void) {
    static int (*f)(void);
    static int tried;
    if (!tried) {
        tried = 1;
        f = (int (*)(void))cuda_symbol("rankmesh_emu_current_device");
    }
    return f ? f() : -1;
}

/* The PCI bus id of the calling thread's current device (emulator/cuda.c);
 * empty when no device is current or no emulated driver is loaded. */
static void current_bus(char *out, int n) {
    static int (*f)(char *, int, int);
    static int tried;
    out[0] = 0;
    if (!tried) {
        tried = 1;
        f = (int (*)(char *, int, int))cuda_symbol("cuDeviceGetPCIBusId");
    }
    int dev = current_device();
    if (f && dev >= 0 && f(out, n, dev) != 0) out[0] = 0;
}

static Comm *new_comm(int rank, int nranks) {
    Comm *c = calloc(1, sizeof *c);
    c->device = current_device();
    c->magic = ALIVE;
    c->rank = rank;
    c->size = nranks;
    c->ready = 1;
    c->polled = 1;
    c->world = calloc((size_t)nranks, sizeof(int));
    return c;
}

static int env_on(const char *name) {
    const char *v = getenv(name);
    return v && atoi(v);
}

/* Connects `c` to its members through the root in `f`: TCP when asked
 * (`force_tcp`), when a member is in another job or streams run
 * asynchronously, else an MPI communicator of the members' job. */
static ncclResult_t bootstrap(Comm *c, IdFields f, int world, int force_tcp) {
    int rank = c->rank, nranks = c->size;
    Hello me = {rank, nranks, world, 0, {0}, host_hash(), {0}};
    job_of(me.job, sizeof me.job);
    current_bus(me.bus, sizeof me.bus);
    int *socks = malloc(sizeof(int) * (size_t)nranks);
    for (int i = 0; i < nranks; i++) socks[i] = -1;
    Hello *all = calloc((size_t)nranks, sizeof *all);
    int listener = -1, tcp = force_tcp;
    /* The root's verdict, sent to every member that checked in before
       anything else: 0, or NCCL's code and its message. */
    int verdict = 0;
    char why[200] = {0};
    if (rank == 0) {
        all[0] = me;
        /* Every member that checked in, in arrival order: all hear the
           verdict, the ones that checked in wrongly too. */
        int *came = malloc(sizeof(int) * (size_t)nranks), ncame = 0;
        for (int i = 1; i < nranks; i++) {
            Hello h;
            int fd = accept_one(f.listener);
            if (fd < 0) {
                close(f.listener);
                for (int k = 0; k < ncame; k++) close(came[k]);
                free(came);
                free(socks);
                free(all);
                snprintf(last_error, sizeof last_error, "Bootstrap Root : %d of %d ranks checked in", i, nranks);
                return SYSTEM_ERROR;
            }
            if (get(fd, &h, sizeof h)) { /* a stranger that said nothing */
                close(fd);
                i--;
                continue;
            }
            came[ncame++] = fd;
            /* As NCCL's bootstrapRoot: a member that disagrees on the size, or
               a rank that already checked in, fails the bootstrap. */
            if (verdict) continue;
            if (h.nranks != nranks) {
                verdict = INVALID_USAGE;
                snprintf(why, sizeof why, "Bootstrap Root : mismatch in rank count from procs %d : %d", nranks,
                         h.nranks);
            } else if (h.rank <= 0 || h.rank >= nranks) {
                verdict = INVALID_ARGUMENT;
                snprintf(why, sizeof why, "Bootstrap Root : rank %d out of range (%d ranks)", h.rank, nranks);
            } else if (socks[h.rank] >= 0) {
                verdict = INVALID_USAGE;
                snprintf(why, sizeof why, "Bootstrap Root : rank %d of %d ranks has already checked in", h.rank,
                         nranks);
            } else {
                socks[h.rank] = fd;
                all[h.rank] = h;
                tcp |= strcmp(h.job, me.job) != 0 || stream_queue() != NULL;
            }
        }
        close(f.listener);
        /* As NCCL's initTransportsRank: two ranks on one host (hash) and
           one bus id are one GPU, refused. */
        for (int b = 0; b < nranks && !verdict; b++)
            for (int a = 0; a < b && !verdict; a++)
                if (all[a].bus[0] && all[a].host == all[b].host && strcmp(all[a].bus, all[b].bus) == 0) {
                    verdict = INVALID_USAGE;
                    snprintf(why, sizeof why, "Duplicate GPU detected : rank %d and rank %d both on CUDA device %s",
                             a, b, all[a].bus);
                }
        for (int k = 0; k < ncame; k++) {
            put(came[k], &verdict, sizeof verdict);
            if (verdict) {
                put(came[k], why, sizeof why);
                close(came[k]);
            } else {
                put(came[k], &tcp, sizeof tcp);
                put(came[k], all, sizeof *all * (size_t)nranks);
            }
        }
        free(came);
        if (verdict)
            for (int i = 0; i < nranks; i++) socks[i] = -1; /* closed above */
    } else {
        listener = listen_local(&me.port);
        socks[0] = dial(f.ip, f.port);
        if (socks[0] < 0 || put(socks[0], &me, sizeof me) || get(socks[0], &verdict, sizeof verdict) ||
            (verdict ? get(socks[0], why, sizeof why)
                     : (get(socks[0], &tcp, sizeof tcp) || get(socks[0], all, sizeof *all * (size_t)nranks)))) {
            verdict = verdict ? verdict : SYSTEM_ERROR;
            if (!why[0]) snprintf(why, sizeof why, "Bootstrap : rank %d lost the root (refused, or gone)", rank);
        }
    }
    if (verdict) {
        why[sizeof why - 1] = 0;
        fprintf(stderr, "rankmesh NCCL emulator: NCCL WARN %s\n", why);
        snprintf(last_error, sizeof last_error, "%s", why);
        for (int i = 0; i < nranks; i++)
            if (socks[i] >= 0) close(socks[i]);
        free(socks);
        free(all);
        if (listener >= 0) close(listener);
        return verdict;
    }
    c->same_job = 1;
    for (int i = 0; i < nranks; i++) {
        c->world[i] = all[i].world;
        c->same_job &= strcmp(all[i].job, me.job) == 0;
    }
    ncclResult_t rc = SUCCESS;
    if (tcp) {
        uint16_t *ports = calloc((size_t)nranks, sizeof *ports);
        for (int i = 0; i < nranks; i++) ports[i] = all[i].port;
        rc = mesh(socks, rank, nranks, ports, listener);
        free(ports);
        c->socks = socks;
    } else {
        /* One job: an MPI communicator of the members' world ranks. */
        MPI_Group wg, mine;
        MPI_Comm_group(MPI_COMM_WORLD, &wg);
        MPI_Group_incl(wg, nranks, c->world, &mine);
        MPI_Comm_create_group(MPI_COMM_WORLD, mine, 30000 + (int)(f.port % 1000), &c->mpi);
        MPI_Group_free(&mine);
        MPI_Group_free(&wg);
        for (int i = 0; i < nranks; i++)
            if (socks[i] >= 0) close(socks[i]);
        free(socks);
    }
    if (listener >= 0) close(listener);
    free(all);
    /* RANKMESH_EMU_INIT_FAIL: a creation that connected and then fails here. */
    return rc ? rc : env_on("RANKMESH_EMU_INIT_FAIL") ? SYSTEM_ERROR : SUCCESS;
}

/* The checks every creation from a unique id makes. */
static ncclResult_t valid_id(const ncclUniqueId *id, IdFields *f) {
    memcpy(f, id->internal, sizeof *f);
    if (memcmp(f->magic, MAGIC, 8) != 0 || (unsigned char)id->internal[127] != 0xff) {
        snprintf(last_error, sizeof last_error, "invalid unique id (not made by ncclGetUniqueId)");
        return INVALID_ARGUMENT;
    }
    return SUCCESS;
}

/* ---- configs and non-blocking creation ---- */

/* The prefix of ncclConfig_t the emulator reads (its layout is held to
   nccl.h by tests/nccl_abi.rs through rankmesh's own Config). */
typedef struct {
    size_t size;
    unsigned magic, version;
    int blocking;
} ConfigHead;

/* Whether a config asks for blocking calls; -1 for a config NCCL refuses. */
static int config_blocking(const void *config) {
    if (!config) return 1;
    ConfigHead h;
    memcpy(&h, config, sizeof h);
    if (h.magic != 0xcafebeef || h.size < sizeof h) {
        snprintf(last_error, sizeof last_error, "ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
        return -1;
    }
    return h.version < 21400 || h.blocking == (int)0x80000000 ? 1 : h.blocking != 0;
}

typedef struct {
    Comm *c;
    IdFields f;
    int world;
} InitJob;

static void *init_in_background(void *p) {
    InitJob *j = p;
    Comm *c = j->c;
    ncclResult_t rc = bootstrap(c, j->f, j->world, 1);
    if (rc) {
        __atomic_store_n(&c->err, rc, __ATOMIC_RELEASE);
    } else if (!(getenv("RANKMESH_EMU_INIT_HANG") && atoi(getenv("RANKMESH_EMU_INIT_HANG")) == j->world)) {
        __atomic_store_n(&c->ready, 1, __ATOMIC_RELEASE);
    }
    free(j);
    __atomic_store_n(&c->has_thread, 0, __ATOMIC_RELEASE);
    return NULL;
}

/* Creation from `id` as `config` asks: blocking, or in a thread. */
static ncclResult_t create(Comm **out, int nranks, IdFields f, int rank, const void *config) {
    int blocking = config_blocking(config);
    if (blocking < 0) return INVALID_ARGUMENT;
    if (rank < 0 || rank >= nranks) return INVALID_ARGUMENT;
    if ((rank == 0) != (f.pid == (int32_t)getpid())) return INVALID_USAGE;
    int world;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    Comm *c = new_comm(rank, nranks);
    count_inits++;
    if (blocking) {
        ncclResult_t rc = bootstrap(c, f, world, 0);
        if (rc) {
            release(c);
            return rc;
        }
        *out = c;
        return SUCCESS;
    }
    c->nonblocking = 1;
    c->ready = 0;
    c->polled = 0;
    InitJob *j = malloc(sizeof *j);
    *j = (InitJob){c, f, world};
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 << 10);
    c->has_thread = 1;
    int made = pthread_create(&c->init_thread, &attr, init_in_background, j);
    pthread_attr_destroy(&attr);
    if (made != 0) {
        fprintf(stderr, "rankmesh NCCL emulator: no thread for a non-blocking creation (%s)\n", strerror(made));
        c->has_thread = 0;
        free(j);
        release(c);
        return SYSTEM_ERROR;
    }
    *out = c;
    return IN_PROGRESS_RC;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    IdFields f;
    if (valid_id(&id, &f)) return INVALID_ARGUMENT;
    return create(out, nranks, f, rank, NULL);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
    IdFields f;
    if (valid_id(&id, &f)) return INVALID_ARGUMENT;
    return create(out, nranks, f, rank, config);
}

#ifndef EMU_NCCL_2_18
/* Several roots' ids: checked (valid, distinct, root 0 made by rank 0),
 * counted, and bootstrapped through the first root. */
ncclResult_t ncclCommInitRankScalable(ncclComm_t *out, int nranks, int rank, int nId, ncclUniqueId *ids,
                                      ncclConfig_t *config) {
    if (nId < 1 || nId > nranks || !ids) return INVALID_ARGUMENT;
    IdFields f, first;
    for (int i = 0; i < nId; i++) {
        if (valid_id(&ids[i], &f)) return INVALID_ARGUMENT;
        for (int j = 0; j < i; j++)
            if (memcmp(&ids[i], &ids[j], sizeof ids[i]) == 0) {
                snprintf(last_error, sizeof last_error, "unique ids %d and %d are the same", j, i);
                return INVALID_ARGUMENT;
            }
    }
    valid_id(&ids[0], &first);
    count_roots = nId;
    return create(out, nranks, first, rank, config);
}
#endif

/* Whether the background creation thread is gone (it runs detached and
 * clears the flag as its last touch of the communicator). */
static int thread_done(Comm *c) { return !__atomic_load_n(&c->has_thread, __ATOMIC_ACQUIRE); }

/* Frees what the communicator holds and poisons it: every later use is
 * reported instead of reading freed memory. The ASan build frees the
 * struct too, so AddressSanitizer reports such a use as use-after-free. */
static void release(Comm *c) {
    if (c->socks) {
        for (int i = 0; i < c->size; i++)
            if (c->socks[i] >= 0) close(c->socks[i]);
        free(c->socks);
        c->socks = NULL;
    } else if (c->mpi != MPI_COMM_NULL && c->mpi) {
        MPI_Comm_free(&c->mpi);
    }
    free(c->world);
    c->world = NULL;
    c->magic = DEAD;
#if defined(__SANITIZE_ADDRESS__)
    free(c);
#endif
}
static long inflight(Comm *c) { return __atomic_load_n(&c->inflight, __ATOMIC_ACQUIRE); }

/* A communicator handle that is not a live one (aborted, destroyed, never made). */
static int dead(const Comm *c, const char *call) {
    if (c && c->magic == ALIVE) return 0;
    fprintf(stderr, "rankmesh NCCL emulator: %s on communicator %p, which is %s\n", call, (void *)c,
            c ? "aborted or destroyed" : "null");
    snprintf(last_error, sizeof last_error, "%s: invalid communicator", call);
    return 1;
}

/* NCCL's ncclCommEnsureReady: a non-blocking communicator whose last call
 * still runs in the background refuses the next one, until the caller has
 * polled ncclCommGetAsyncError to success. */
static int busy(Comm *c, const char *call) {
    if (c->polls_busy <= 0) return 0;
    fprintf(stderr, "rankmesh NCCL emulator: NCCL WARN %s: Attempt to use communicator before the previous "
                    "operation returned ncclSuccess\n", call);
    snprintf(last_error, sizeof last_error,
             "Attempt to use communicator before the previous operation returned ncclSuccess");
    return 1;
}

/* Unlike NCCL, which blocks until the work is done (a peer that never
 * comes holds it forever), a destroy with calls in flight fails loudly:
 * finalize and wait first, or abort. */
ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (dead(c, "ncclCommDestroy")) return INVALID_USAGE;
    long n = inflight(c);
    if (n || !thread_done(c)) {
        fprintf(stderr, "rankmesh NCCL emulator: ncclCommDestroy with %ld call(s) in flight on rank %d: "
                        "finalize and wait for them, or abort\n", n, c->rank);
        snprintf(last_error, sizeof last_error, "ncclCommDestroy with %ld call(s) in flight", n);
        return INVALID_USAGE;
    }
    if (live_registrations)
        fprintf(stderr, "rankmesh NCCL emulator: ncclCommDestroy with %d buffer registration(s) left\n",
                live_registrations);
    release(c);
    return SUCCESS;
}

/* Flushes the communicator's work: non-blocking, it answers ncclInProgress
 * and ncclCommGetAsyncError says when the queue is empty. */
ncclResult_t ncclCommFinalize(ncclComm_t c) {
    if (dead(c, "ncclCommFinalize")) return INVALID_USAGE;
    if (!__atomic_load_n(&c->ready, __ATOMIC_ACQUIRE)) {
        snprintf(last_error, sizeof last_error, "ncclCommFinalize on a communicator still being created");
        return INVALID_USAGE;
    }
    c->finalizing = 1;
    if (c->nonblocking) return inflight(c) ? IN_PROGRESS_RC : SUCCESS;
    while (inflight(c) && !__atomic_load_n(&c->err, __ATOMIC_ACQUIRE)) usleep(50);
    return __atomic_load_n(&c->err, __ATOMIC_ACQUIRE);
}

/* Queued calls fail at once: the sockets are shut down under them. Like
 * NCCL's abort, it returns once they are done (up to 10 s; a communicator
 * still referenced by queued calls, or by a creation thread, after that is
 * left alive). */
ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (dead(c, "ncclCommAbort")) return INVALID_USAGE;
    __atomic_store_n(&c->aborted, 1, __ATOMIC_RELEASE);
    if (c->socks)
        for (int i = 0; i < c->size; i++)
            if (c->socks[i] >= 0) shutdown(c->socks[i], SHUT_RDWR);
    for (int i = 0; i < 1000000 && (inflight(c) || !thread_done(c)); i++) usleep(10);
    if (!inflight(c) && thread_done(c)) release(c);
    return SUCCESS;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *e) {
    if (dead(c, "ncclCommGetAsyncError")) return INVALID_USAGE;
    static long fail_after = -2, fail_rank = -1;
    if (fail_after == -2) {
        const char *after = getenv("RANKMESH_EMU_FAIL_AFTER");
        const char *only = getenv("RANKMESH_EMU_FAIL_RANK");
        fail_after = after ? atol(after) : -1;
        if (only) fail_rank = atol(only);
    }
    int err = __atomic_load_n(&c->err, __ATOMIC_ACQUIRE);
    if (err) {
        *e = err;
    } else if (!__atomic_load_n(&c->ready, __ATOMIC_ACQUIRE) || (c->finalizing && inflight(c))) {
        *e = IN_PROGRESS_RC;
    } else if (c->polls_busy > 0) {
        if (--c->polls_busy == 0 && c->pending_out) {
            *c->pending_out = c->pending_value;
            c->pending_out = NULL;
        }
        *e = IN_PROGRESS_RC;
    } else {
        /* The member's world rank as the (finished) bootstrap exchanged
           it: no MPI call, since the caller may be any thread. */
        int failing = fail_rank < 0 || (c->world && c->world[c->rank] == fail_rank);
        *e = (failing && fail_after >= 0 && c->calls >= fail_after) ? REMOTE : SUCCESS;
        __atomic_store_n(&c->polled, 1, __ATOMIC_RELEASE);
    }
    return SUCCESS;
}

/* ---- children of a parent (splits, shrinks) ---- */

/* The child of `parent` whose member i is parent rank `from[i]`, listening
 * at `ports[i]` (this process is member `rank` of `n`): its TCP mesh, built
 * through `listener`. NULL on a failed mesh, its code in *rc. */
static Comm *child_mesh(Comm *parent, int rank, int n, const int *from, const uint16_t *ports, int listener,
                        ncclResult_t *rc) {
    Comm *c = new_comm(rank, n);
    c->same_job = 1;
    c->socks = malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++) {
        c->socks[i] = -1;
        c->world[i] = parent->world[from[i]];
    }
    *rc = mesh(c->socks, rank, n, ports, listener);
    if (*rc) {
        release(c);
        return NULL;
    }
    return c;
}

/* Hands child `c` out as NCCL 2.28 does: a non-blocking child (`blocking`
 * 0) answers ncclInProgress to its first poll; a non-blocking parent's
 * call answers ncclSuccess and the child reaches *out only when the parent
 * is polled to rest. */
static ncclResult_t hand_out(Comm *parent, Comm *c, ncclComm_t *out, int blocking) {
    if (!blocking) {
        c->nonblocking = 1;
        c->polls_busy = 1;
    }
    if (parent->nonblocking) {
        parent->polls_busy = 1;
        parent->pending_out = (void **)out;
        parent->pending_value = c;
        return SUCCESS;
    }
    *out = c;
    return blocking ? SUCCESS : IN_PROGRESS_RC;
}

/* ---- splits ---- */

/* What each member of a split's parent says: its color, key and listener. */
typedef struct {
    int32_t color, key, rank;
    uint16_t port;
} SplitHello;

static int by_key(const void *a, const void *b) {
    const SplitHello *x = a, *y = b;
    return x->key != y->key ? (x->key < y->key ? -1 : 1) : (x->rank < y->rank ? -1 : x->rank > y->rank);
}

/* Collective over the parent: members of one color get a communicator,
 * ordered by key (then parent rank); NCCL_SPLIT_NOCOLOR (-1) gets none.
 * The exchange runs over MPI_COMM_WORLD between the parent's members (the
 * parent's own links may carry queued work on a stream thread). */
ncclResult_t ncclCommSplit(ncclComm_t parent, int color, int key, ncclComm_t *out, ncclConfig_t *config) {
    if (dead(parent, "ncclCommSplit")) return INVALID_USAGE;
    if (busy(parent, "ncclCommSplit")) return INVALID_ARGUMENT;
    int blocking = config_blocking(config);
    if (blocking < 0) return INVALID_ARGUMENT;
    if (!__atomic_load_n(&parent->ready, __ATOMIC_ACQUIRE) || !parent->same_job) {
        snprintf(last_error, sizeof last_error, "ncclCommSplit: parent %s",
                 parent->same_job ? "still being created" : "spans jobs (not emulated)");
        return INVALID_USAGE;
    }
    if (color < -1) return INVALID_ARGUMENT;
    SplitHello me = {color, key, parent->rank, 0};
    int listener = color >= 0 ? listen_local(&me.port) : -1;
    SplitHello *all = calloc((size_t)parent->size, sizeof *all);
    int tag = 31000 + (int)(parent->splits++ % 1000);
    /* Gather at parent rank 0, which sends the table back to everyone. */
    if (parent->rank == 0) {
        all[0] = me;
        for (int r = 1; r < parent->size; r++)
            MPI_Recv(&all[r], sizeof *all, MPI_BYTE, parent->world[r], tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (int r = 1; r < parent->size; r++)
            MPI_Send(all, (int)(sizeof *all * (size_t)parent->size), MPI_BYTE, parent->world[r], tag, MPI_COMM_WORLD);
    } else {
        MPI_Send(&me, sizeof me, MPI_BYTE, parent->world[0], tag, MPI_COMM_WORLD);
        MPI_Recv(all, (int)(sizeof *all * (size_t)parent->size), MPI_BYTE, parent->world[0], tag, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    }
    *out = NULL;
    /* As NCCL 2.28 on a non-blocking parent: the call answers ncclSuccess,
       the split finishes in the background, and the child reaches *out only
       when the parent is polled to rest. */
    if (parent->nonblocking) parent->polls_busy = 1;
    if (color < 0) {
        free(all);
        return SUCCESS;
    }
    unsigned n = 0;
    for (int r = 0; r < parent->size; r++)
        if (all[r].color == color) all[n++] = all[r];
    qsort(all, (size_t)n, sizeof *all, by_key);
    int rank = 0, *from = malloc(sizeof(int) * n);
    uint16_t *ports = calloc(n, sizeof *ports);
    for (unsigned i = 0; i < n; i++) {
        if (all[i].rank == parent->rank) rank = (int)i;
        from[i] = all[i].rank;
        ports[i] = all[i].port;
    }
    ncclResult_t rc;
    Comm *c = child_mesh(parent, rank, (int)n, from, ports, listener, &rc);
    close(listener);
    free(ports);
    free(from);
    free(all);
    if (!c) return rc;
    count_splits++;
    return hand_out(parent, c, out, blocking);
}

#ifndef EMU_NCCL_2_18
/* ---- shrink (2.27) ---- */

static int by_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* What each survivor of a shrink says: its parent rank, its listener, and
   a digest of the exclusion list it was given. */
typedef struct {
    int32_t rank;
    uint16_t port;
    uint64_t digest;
} ShrinkHello;

/* Survivor i's exchange with the first survivor over MPI_COMM_WORLD (the
   excluded ranks may be dead, so nothing may wait on them); 0 or -1. */
static int shrink_exchange(Comm *parent, const int *alive, int n, ShrinkHello *all, int tag) {
    int me = 0;
    while (alive[me] != parent->rank) me++;
    int root = parent->world[alive[0]];
    size_t table = sizeof *all * (size_t)n;
    if (me == 0) {
        for (int i = 1; i < n; i++)
            if (MPI_Recv(&all[i], sizeof *all, MPI_BYTE, parent->world[alive[i]], tag, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE) != MPI_SUCCESS)
                return -1;
        for (int i = 1; i < n; i++)
            if (MPI_Send(all, (int)table, MPI_BYTE, parent->world[alive[i]], tag, MPI_COMM_WORLD) != MPI_SUCCESS)
                return -1;
        return 0;
    }
    if (MPI_Send(&all[me], sizeof *all, MPI_BYTE, root, tag, MPI_COMM_WORLD) != MPI_SUCCESS) return -1;
    return MPI_Recv(all, (int)table, MPI_BYTE, root, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE) == MPI_SUCCESS ? 0 : -1;
}

/* NCCL 2.27's contract: only the survivors call it, with the same list of
 * excluded ranks (which NCCL sorts in place); they are renumbered densely
 * in parent order; a NULL config inherits the parent's. NCCL_SHRINK_DEFAULT
 * needs a parent with nothing in flight; NCCL_SHRINK_ABORT first ends the
 * parent's work in flight (here: its links are shut, so queued calls fail)
 * and leaves the parent for the caller to abort. Stricter than NCCL, which
 * hangs or numbers the survivors wrongly: an excluded rank out of range or
 * named twice, survivors that disagree on the list, and a default-mode
 * shrink with calls in flight are refused with a message. */
ncclResult_t ncclCommShrink(ncclComm_t parent, int *exclude, int n, ncclComm_t *out, ncclConfig_t *config, int flags) {
    if (dead(parent, "ncclCommShrink")) return INVALID_USAGE;
    if (!out || !exclude || n <= 0 || (flags & ~1)) {
        snprintf(last_error, sizeof last_error, "ncclCommShrink: %s",
                 !out ? "newcomm is NULL" : !exclude ? "excludeRanksList is NULL"
                 : n <= 0 ? "excludeRanksCount must be positive" : "unknown shrinkFlags");
        return INVALID_ARGUMENT;
    }
    qsort(exclude, (size_t)n, sizeof *exclude, by_int);
    for (int i = 0; i < n; i++)
        if (exclude[i] < 0 || exclude[i] >= parent->size || (i && exclude[i] == exclude[i - 1])) {
            snprintf(last_error, sizeof last_error,
                     "ncclCommShrink: excluded rank %d %s (NCCL does not check, and numbers the survivors wrongly)",
                     exclude[i], exclude[i] < 0 || exclude[i] >= parent->size ? "is out of range" : "is named twice");
            return INVALID_ARGUMENT;
        }
    if (bsearch(&parent->rank, exclude, (size_t)n, sizeof *exclude, by_int)) {
        snprintf(last_error, sizeof last_error, "ncclCommShrink: rank %d is excluded, and excluded ranks must not call it",
                 parent->rank);
        return INVALID_ARGUMENT;
    }
    if (busy(parent, "ncclCommShrink")) return INVALID_ARGUMENT;
    int blocking = config ? config_blocking(config) : !parent->nonblocking;
    if (blocking < 0) return INVALID_ARGUMENT;
    if (!__atomic_load_n(&parent->ready, __ATOMIC_ACQUIRE) || !parent->same_job) {
        snprintf(last_error, sizeof last_error, "ncclCommShrink: parent %s",
                 parent->same_job ? "still being created" : "spans jobs (not emulated)");
        return INVALID_USAGE;
    }
    if (flags & 1) {
        /* As setCommAbortFlags + a stream synchronize: work in flight ends
           (with an error) before the survivors connect. */
        __atomic_store_n(&parent->aborted, 1, __ATOMIC_RELEASE);
        if (parent->socks)
            for (int i = 0; i < parent->size; i++)
                if (parent->socks[i] >= 0) shutdown(parent->socks[i], SHUT_RDWR);
        for (int i = 0; i < 1000000 && inflight(parent); i++) usleep(10);
        if (inflight(parent)) {
            snprintf(last_error, sizeof last_error, "ncclCommShrink: the parent's calls in flight did not end in 10 s");
            return INTERNAL;
        }
    } else if (inflight(parent)) {
        snprintf(last_error, sizeof last_error,
                 "ncclCommShrink (NCCL_SHRINK_DEFAULT) with %ld call(s) in flight on the parent: NCCL needs none; "
                 "after a failure pass NCCL_SHRINK_ABORT", inflight(parent));
        return INVALID_USAGE;
    }
    int size = parent->size - n, *alive = malloc(sizeof(int) * (size_t)size);
    for (int r = 0, k = 0, j = 0; r < parent->size; r++) {
        if (j < n && exclude[j] == r) {
            j++;
            continue;
        }
        alive[k++] = r;
    }
    int rank = 0;
    while (alive[rank] != parent->rank) rank++;
    uint64_t digest = 1469598103934665603ull;
    for (int i = 0; i < n; i++) digest = (digest ^ (uint64_t)exclude[i]) * 1099511628211ull;
    ShrinkHello *all = calloc((size_t)size, sizeof *all);
    all[rank] = (ShrinkHello){parent->rank, 0, digest};
    int listener = listen_local(&all[rank].port);
    int tag = 32000 + (int)(parent->splits++ % 1000);
    ncclResult_t rc = shrink_exchange(parent, alive, size, all, tag) ? REMOTE : SUCCESS;
    for (int i = 0; i < size && !rc; i++)
        if (all[i].digest != digest) {
            snprintf(last_error, sizeof last_error,
                     "ncclCommShrink: parent ranks %d and %d name different ranks to exclude (NCCL would hang)",
                     alive[0], alive[i]);
            rc = INVALID_USAGE;
        }
    *out = NULL;
    Comm *c = NULL;
    if (!rc) {
        uint16_t *ports = calloc((size_t)size, sizeof *ports);
        for (int i = 0; i < size; i++) ports[i] = all[i].port;
        c = child_mesh(parent, rank, size, alive, ports, listener, &rc);
        free(ports);
    }
    if (listener >= 0) close(listener);
    free(all);
    free(alive);
    if (flags & 1) __atomic_store_n(&parent->aborted, 0, __ATOMIC_RELEASE);
    if (rc) {
        fprintf(stderr, "rankmesh NCCL emulator: NCCL WARN %s\n", last_error[0] ? last_error : "ncclCommShrink failed");
        return rc;
    }
    count_shrinks++;
    return hand_out(parent, c, out, blocking);
}
#endif

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
 * partial result rounded to the dtype after each step (a hop). avg is
 * NCCL's: for floating types a sum of the contributions each first
 * multiplied by 1/n rounded to the type (its PreMulSum), for integers the
 * sum divided by n (SumPostDiv, truncating). */
static void reduce_into(void *dst, const char *all, size_t count, int t, int op, int n) {
    size_t e = elem(t), stride = count * e;
    int floating = t >= 6;
    double scale = op == 4 && floating ? rounded(1.0 / n, t) : 1.0;
    for (size_t i = 0; i < count; i++) {
        double acc = rounded(load(all + i * e, t) * scale, t);
        for (int r = 1; r < n; r++) {
            double v = rounded(load(all + (size_t)r * stride + i * e, t) * scale, t);
            switch (op) {
            case 0: case 4: acc += v; break;
            case 1: acc *= v; break;
            case 2: acc = v > acc ? v : acc; break;
            default: acc = v < acc ? v : acc; break;
            }
            acc = rounded(acc, t);
        }
        if (op == 4 && !floating) acc = (double)(int64_t)(acc / n); /* integer avg truncates */
        store((char *)dst + i * e, t, acc);
    }
}

/* Every member's `bytes` from `s`, in rank order, into `r`. */
static ncclResult_t allgather(const void *s, void *r, size_t bytes, Comm *c) {
    if (!c->socks) {
        MPI_Allgather(s, (int)bytes, MPI_BYTE, r, (int)bytes, MPI_BYTE, c->mpi);
        return SUCCESS;
    }
    /* In place (s is this rank's block) or apart: overlaps were refused. */
    if ((char *)r + (size_t)c->rank * bytes != s) memcpy((char *)r + (size_t)c->rank * bytes, s, bytes);
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

/* The checks NCCL makes of every call (ncclEnqueueCheck / ArgsCheck). */
static ncclResult_t enter(Comm *c, int t, const char *call) {
    if (dead(c, call)) return INVALID_USAGE;
    if (c->aborted) return INVALID_USAGE;
    if (busy(c, call)) return INVALID_ARGUMENT;
    if (!__atomic_load_n(&c->ready, __ATOMIC_ACQUIRE) || !__atomic_load_n(&c->polled, __ATOMIC_ACQUIRE)) {
        snprintf(last_error, sizeof last_error, "%s: communicator is still being created (poll ncclCommGetAsyncError)",
                 call);
        return INVALID_USAGE;
    }
    if (!elem(t)) {
        snprintf(last_error, sizeof last_error, "%s: invalid type %d", call, t);
        return INVALID_ARGUMENT;
    }
    int dev = current_device();
    if (c->device >= 0 && dev != c->device) {
        snprintf(last_error, sizeof last_error, "%s: communicator of device %d used while device %d is current", call,
                 c->device, dev);
        return INVALID_USAGE;
    }
    c->calls++;
    return SUCCESS;
}

/* emulator/cuda.c's answer to "is [p, p+n) device memory?"; NULL without
   the emulated driver (then nothing is checked). */
typedef int (*RangeFn)(const void *, size_t);
static RangeFn device_range(void) {
    static int tried;
    static RangeFn f;
    if (!tried) {
        tried = 1;
        f = (RangeFn)cuda_symbol("rankmesh_emu_device_range");
    }
    return f;
}

/* A buffer NCCL cannot use: null for a non-zero count (NCCL: "%s : %s
 * argument is NULL"), or bytes outside device memory. NCCL checks that
 * only with NCCL_CHECK_POINTERS=1 ("%s : %s %p is not a valid pointer");
 * by default its kernel faults, an illegal address that kills the
 * context. Refused here, always, so such a call never passes CI. */
static ncclResult_t unusable_buffer(const void *p, size_t bytes, const char *call, const char *which) {
    if (!bytes) return SUCCESS;
    if (!p) {
        snprintf(last_error, sizeof last_error, "%s : %s argument is NULL", call, which);
        return INVALID_ARGUMENT;
    }
    RangeFn inside = device_range();
    if (inside && !inside(p, bytes)) {
        snprintf(last_error, sizeof last_error, "%s : %s %p is not a valid pointer (%zu B not inside device memory)",
                 call, which, p, bytes);
        return INVALID_ARGUMENT;
    }
    return SUCCESS;
}

/* Whether [a, a+n) and [b, b+m) share a byte. */
static int overlap(const void *a, size_t n, const void *b, size_t m) {
    const char *x = a, *y = b;
    return n && m && x < y + m && y < x + n;
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
enum { ALL_REDUCE, REDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST, P2P, ALL_TO_ALL, GATHER, SCATTER };
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

/* Over TCP a send would complete into the socket's buffer with no receive
 * posted. So each batch first trades credits: every receive sends its peer
 * one byte, every send waits for one, and only then does data move. A send
 * whose receive is never posted waits, as on NCCL. All of a batch's
 * credits precede its data on each connection, so the two never mix. */
static ncclResult_t trade_credits(P2p *q, int n) {
    Xfer *x = calloc((size_t)n + 1, sizeof *x);
    char *bytes = calloc((size_t)n + 1, 1);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (q[i].comm->socks && q[i].peer != q[i].comm->rank)
            x[k++] = (Xfer){q[i].comm->socks[q[i].peer], !q[i].send, &bytes[i], 1, 0};
    ncclResult_t rc = run_xfers(x, k);
    free(x);
    free(bytes);
    return rc;
}

static ncclResult_t run_p2p(P2p *q, int n) {
    ncclResult_t credited = trade_credits(q, n);
    if (credited) return credited;
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
            /* Synchronous: a send completes only once its receive is posted,
               as on NCCL, where an unmatched send never completes. */
            MPI_Issend(p->buf, p->bytes, MPI_BYTE, p->peer, 77, p->comm->mpi, &reqs[nreq++]);
        else
            MPI_Irecv(p->buf, p->bytes, MPI_BYTE, p->peer, 77, p->comm->mpi, &reqs[nreq++]);
    }
    ncclResult_t rc = run_xfers(xfers, nx);
    /* One by one: MPICH's MPI_STATUSES_IGNORE, passed for MPI_Waitall's
     * array parameter, trips GCC's -Wstringop-overflow (a false positive). */
    for (int i = 0; i < nreq; i++)
        MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
    free(reqs);
    free(xfers);
    return rc;
}

/* ncclAlltoAll / ncclGather / ncclScatter as the point-to-point calls they
 * are made of (block p of the send side goes to p; block p of the receive
 * side comes from p). */
static ncclResult_t rooted_or_all(Job *j, size_t chunk) {
    Comm *c = j->c;
    P2p *q = calloc(2 * (size_t)c->size, sizeof *q);
    int n = 0, me = c->rank;
    char *s = (char *)j->s, *r = j->r;
    for (int p = 0; p < c->size; p++) {
        int send = j->kind == ALL_TO_ALL || (j->kind == GATHER && p == j->root) || (j->kind == SCATTER && me == j->root);
        int recv = j->kind == ALL_TO_ALL || (j->kind == GATHER && me == j->root) || (j->kind == SCATTER && p == j->root);
        char *from = j->kind == GATHER ? s : s + (size_t)p * chunk;
        char *into = j->kind == SCATTER ? r : r + (size_t)p * chunk;
        if (p == me && send && recv) {
            if (from != into) memcpy(into, from, chunk);
            continue;
        }
        if (send) q[n++] = (P2p){1, from, (int)chunk, p, c, NULL};
        if (recv) q[n++] = (P2p){0, into, (int)chunk, p, c, NULL};
    }
    ncclResult_t rc = run_p2p(q, n);
    free(q);
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
        if (c->rank == j->root && j->s != j->r) memcpy(j->r, j->s, bytes);
        return bcast(j->r, bytes, j->root, c);
    case ALL_TO_ALL: case GATHER: case SCATTER:
        return rooted_or_all(j, bytes);
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

/* Whether this is RANKMESH_EMU_STALL's rank (asked on the calling thread, which may call MPI). */
static int stalled(void) {
    static int stall = -1;
    if (stall < 0) {
        const char *v = getenv("RANKMESH_EMU_STALL");
        int world = -2;
        if (v) MPI_Comm_rank(MPI_COMM_WORLD, &world);
        stall = v && atoi(v) == world;
    }
    return stall;
}

static ncclResult_t submit(Job j, void *stream) {
    if (skip_transfers() || (j.c->calls > 1 && stalled())) {
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
    if (q(stream, run_queued, queued)) {
        /* A destroyed stream: cudaErrorInvalidResourceHandle to NCCL's launch. */
        __atomic_sub_fetch(&j.c->inflight, 1, __ATOMIC_ACQ_REL);
        free(queued);
        free(j.batch);
        snprintf(last_error, sizeof last_error, "Cuda failure 'invalid resource handle' (a destroyed stream)");
        return UNHANDLED_CUDA;
    }
    return SUCCESS;
}

/* The calls queued since ncclGroupStart, and how deep the groups are. */
static P2p queue[4096];
static int queued, depth;

/* NCCL's non-blocking communicators may answer ncclInProgress from any
 * collective, p2p call or ncclGroupEnd: the call is being enqueued in the
 * background, and the next call must wait until ncclCommGetAsyncError
 * says ncclSuccess (busy() refuses it before). The emulator answers so at
 * random, RANKMESH_EMU_IN_PROGRESS percent of such calls (default 30), so
 * that the caller's settling path runs in every test. */
static int in_progress_pct(void) {
    const char *v = getenv("RANKMESH_EMU_IN_PROGRESS");
    return v ? atoi(v) : 30;
}
static ncclResult_t maybe_in_progress(Comm *c, ncclResult_t rc) {
    static __thread unsigned seed;
    if (rc || !c->nonblocking || in_progress_pct() <= 0) return rc;
    if (!seed) seed = (unsigned)getpid() * 2654435761u + 1;
    if ((int)(rand_r(&seed) % 100) >= in_progress_pct()) return rc;
    c->polls_busy = 1 + (int)(rand_r(&seed) % 3);
    return IN_PROGRESS_RC;
}

static const char *const CALLS[] = {"AllReduce", "Reduce", "ReduceScatter", "AllGather", "Broadcast", "P2P",
                                    "AlltoAll", "Gather", "Scatter"};

static ncclResult_t collective(int kind, const void *s, void *r, size_t count, int t, int op, int root, Comm *c,
                               void *stream) {
    const char *call = CALLS[kind];
    ncclResult_t e = enter(c, t, call);
    if (e) return e;
    int rooted = kind == REDUCE || kind == BROADCAST || kind == GATHER || kind == SCATTER;
    if (rooted && (root < 0 || root >= c->size)) {
        snprintf(last_error, sizeof last_error, "%s : invalid root %d (root should be in the 0..%d range)", call, root,
                 c->size);
        return INVALID_ARGUMENT;
    }
    int reducing = kind == ALL_REDUCE || kind == REDUCE || kind == REDUCE_SCATTER;
    if (reducing && (op < 0 || op > 4)) {
        snprintf(last_error, sizeof last_error, "%s : invalid reduction operation %d", call, op);
        return INVALID_ARGUMENT;
    }
    if (reducing && fp8_reduction_refused(t)) return INVALID_ARGUMENT;
    /* NCCL 2.28.3 on an H100 refused ncclAvg of fp8 (invalid argument, no
       message): its average is defined for the integer and the 16-, 32- and
       64-bit float types only. */
    if (reducing && op == 4 && (t == 10 || t == 11)) {
        snprintf(last_error, sizeof last_error, "%s", "");
        return INVALID_ARGUMENT;
    }
    /* What each side holds, in bytes, on this rank. */
    size_t e_ = elem(t), n = (size_t)c->size, chunk = count * e_, sbytes = chunk, rbytes = chunk;
    if (kind == ALL_GATHER || kind == GATHER) rbytes = chunk * n;
    if (kind == REDUCE_SCATTER || kind == SCATTER) sbytes = chunk * n;
    if (kind == ALL_TO_ALL) sbytes = rbytes = chunk * n;
    /* NCCL reads a broadcast's and a scatter's send buffer on the root only,
       and writes a reduce's and a gather's receive buffer there only. */
    int sends = !((kind == SCATTER || kind == BROADCAST) && c->rank != root),
        recvs = !((kind == GATHER || kind == REDUCE) && c->rank != root);
    if ((sends && (e = unusable_buffer(s, sbytes, call, "sendbuff"))) || (recvs && (e = unusable_buffer(r, rbytes, call, "recvbuff"))))
        return e;
    /* In place is only where NCCL defines it; any other overlap is refused. */
    const char *sc = s, *rc_ = r;
    int in_place_ok = (kind == ALL_GATHER && sc == rc_ + (size_t)c->rank * chunk) ||
                      (kind == GATHER && sc == rc_ + (size_t)root * chunk) ||
                      (kind == REDUCE_SCATTER && rc_ == sc + (size_t)c->rank * chunk) ||
                      (kind == SCATTER && rc_ == sc + (size_t)root * chunk) ||
                      ((kind == ALL_REDUCE || kind == REDUCE || kind == BROADCAST) && sc == rc_);
    if (sends && recvs && !in_place_ok && overlap(s, sbytes, r, rbytes)) {
        snprintf(last_error, sizeof last_error, "%s : send and receive buffers overlap but are not in place", call);
        return INVALID_ARGUMENT;
    }
    e = submit((Job){kind, s, r, count, t, op, root, c, NULL, 0}, stream);
    return depth ? e : maybe_in_progress(c, e);
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t stream) {
    return collective(ALL_REDUCE, s, r, count, t, op, 0, c, stream);
}
ncclResult_t ncclReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, int root, ncclComm_t c,
                        cudaStream_t stream) {
    return collective(REDUCE, s, r, count, t, op, root, c, stream);
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t recvcount, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t stream) {
    return collective(REDUCE_SCATTER, s, r, recvcount, t, op, 0, c, stream);
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t sendcount, ncclDataType_t t, ncclComm_t c, cudaStream_t stream) {
    return collective(ALL_GATHER, s, r, sendcount, t, 0, 0, c, stream);
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t stream) {
    return collective(BROADCAST, s, r, count, t, 0, root, c, stream);
}

#ifndef EMU_NCCL_2_18
ncclResult_t ncclAlltoAll(const void *s, void *r, size_t count, ncclDataType_t t, ncclComm_t c, cudaStream_t stream) {
    return collective(ALL_TO_ALL, s, r, count, t, 0, 0, c, stream);
}
ncclResult_t ncclGather(const void *s, void *r, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                        cudaStream_t stream) {
    return collective(GATHER, s, r, count, t, 0, root, c, stream);
}
ncclResult_t ncclScatter(const void *s, void *r, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                         cudaStream_t stream) {
    return collective(SCATTER, s, r, count, t, 0, root, c, stream);
}

/* ---- registration (2.19) and symmetric windows (2.27) ---- */

typedef struct {
    uint32_t magic;
    Comm *comm;
    void *buf;
    size_t size;
} Registration;

static ncclResult_t register_buffer(Comm *c, void *buf, size_t size, void **handle, const char *call, int window) {
    if (dead(c, call)) return INVALID_USAGE;
    if (!buf || !size || !handle) {
        snprintf(last_error, sizeof last_error, "%s: null buffer or zero size", call);
        return INVALID_ARGUMENT;
    }
    /* NCCL's registration asks the driver for the buffer's range
       (cuMemGetAddressRange), which fails outside device memory. */
    ncclResult_t e = unusable_buffer(buf, size, call, "buff");
    if (e) return e;
    if (window && (uintptr_t)buf % 4096) {
        snprintf(last_error, sizeof last_error,
                 "%s: buffer %p is not aligned to NCCL_WIN_REQUIRED_ALIGNMENT (4096)", call, buf);
        return INVALID_ARGUMENT;
    }
    if (busy(c, call)) return INVALID_ARGUMENT;
    Registration *reg = malloc(sizeof *reg);
    *reg = (Registration){ALIVE, c, buf, size};
    live_registrations++;
    if (window) count_windows++; else count_registered++;
    if (window && c->nonblocking) {
        /* A window is collective: on a non-blocking communicator NCCL 2.28
           registers it in the background and writes the handle then. */
        *handle = NULL;
        c->polls_busy = 1;
        c->pending_out = handle;
        c->pending_value = reg;
        return SUCCESS;
    }
    *handle = reg;
    return SUCCESS;
}

static ncclResult_t deregister(Comm *c, void *handle, const char *call) {
    Registration *reg = handle;
    if (dead(c, call)) return INVALID_USAGE;
    if (!reg || reg->magic != ALIVE || reg->comm != c) {
        snprintf(last_error, sizeof last_error, "%s: not a registration of this communicator", call);
        return INVALID_ARGUMENT;
    }
    reg->magic = DEAD;
    free(reg);
    live_registrations--;
    return SUCCESS;
}

/* emulator/cuda.c's record of device memory handed out here. */
static void track(void *p, size_t n, int live) {
    static int tried;
    static int (*f)(const void *, size_t, int);
    if (!tried) {
        tried = 1;
        f = (int (*)(const void *, size_t, int))cuda_symbol("rankmesh_emu_track");
    }
    if (f) f(p, n, live);
}
/* Memory NCCL can register: page-aligned, as cuMem allocations are. */
ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
    if (!ptr || !size) return INVALID_ARGUMENT;
    if (posix_memalign(ptr, 4096, size)) return SYSTEM_ERROR;
    track(*ptr, size, 1);
    return SUCCESS;
}
ncclResult_t ncclMemFree(void *ptr) {
    track(ptr, 0, 0);
    free(ptr);
    return SUCCESS;
}

/* RANKMESH_EMU_COUNTS=1: the registration counters, printed at exit. */
static void print_counts(void) {
    printf("emulator counts: registered=%d windows=%d live=%d\n", count_registered, count_windows,
           live_registrations);
}
__attribute__((constructor)) static void counts_at_exit(void) {
    if (env_on("RANKMESH_EMU_COUNTS")) atexit(print_counts);
}

ncclResult_t ncclCommRegister(const ncclComm_t c, void *buf, size_t size, void **handle) {
    return register_buffer(c, buf, size, handle, "ncclCommRegister", 0);
}
ncclResult_t ncclCommDeregister(const ncclComm_t c, void *handle) { return deregister(c, handle, "ncclCommDeregister"); }
ncclResult_t ncclCommWindowRegister(ncclComm_t c, void *buf, size_t size, ncclWindow_t *win, int flags) {
    (void)flags;
    return register_buffer(c, buf, size, (void **)win, "ncclCommWindowRegister", 1);
}
ncclResult_t ncclCommWindowDeregister(ncclComm_t c, ncclWindow_t win) {
    return deregister(c, (void *)win, "ncclCommWindowDeregister");
}
#endif


/* The calls queued since the group began, as one job on the first call's stream. */
static ncclResult_t flush(void) {
    if (!queued) return SUCCESS;
    for (int i = 0; i < queued; i++)
        if (queue[i].comm->magic != ALIVE) {
            fprintf(stderr, "rankmesh NCCL emulator: ncclGroupEnd: a call queued in the group refers to "
                            "communicator %p, aborted inside the group (use after free)\n", (void *)queue[i].comm);
            queued = 0;
            return INTERNAL;
        }
    P2p *batch = malloc(sizeof *batch * (size_t)queued);
    memcpy(batch, queue, sizeof *batch * (size_t)queued);
    int n = queued;
    queued = 0;
    Comm *first = batch[0].comm;
    return maybe_in_progress(first, submit((Job){P2P, NULL, NULL, 0, 0, 0, 0, first, batch, n}, batch[0].stream));
}

static ncclResult_t p2p(int send, const void *buf, size_t count, int t, int peer, Comm *c, void *stream) {
    const char *call = send ? "Send" : "Recv";
    ncclResult_t e = enter(c, t, call);
    if (e) return e;
    if ((e = unusable_buffer(buf, count * elem(t), call, "buff"))) return e;
    static long sends, fail_send = -2;
    if (fail_send == -2) {
        const char *v = getenv("RANKMESH_EMU_FAIL_SEND");
        fail_send = v ? atol(v) : -1;
    }
    if (send && ++sends == fail_send) {
        snprintf(last_error, sizeof last_error, "Send : refused (RANKMESH_EMU_FAIL_SEND=%ld)", fail_send);
        return SYSTEM_ERROR;
    }
    if (peer < 0 || peer >= c->size || queued == 4096) return INVALID_ARGUMENT;
    queue[queued++] = (P2p){send, (void *)buf, (int)(count * elem(t)), peer, c, stream};
    return depth ? SUCCESS : flush();
}

ncclResult_t ncclSend(const void *s, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t stream) {
    return p2p(1, s, count, t, peer, c, stream);
}
ncclResult_t ncclRecv(void *r, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t stream) {
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
