/* An NCCL emulator for CI machines without GPUs, on top of MPI.
 *
 * NOT NCCL: buffers are the host memory that emulator/cuda.c hands out, and
 * each call runs synchronously through MPI when it is enqueued. It gives the
 * device plane's logic (communicator creation over MPI, unique-id bytes,
 * offsets and block orders, grouped send/recv, error strings, async-error
 * polling and abort) a real multi-process peer in CI. Reductions run in rank
 * order after an all-gather and round to the dtype after every addition, as
 * NCCL rounds at every hop (its order differs; its per-hop rounding does
 * not), so device and host results of f16/bf16/fp8 sums differ as they do on
 * a GPU. fp8 (types 10, 11) converts with round-to-nearest-even, saturating
 * to the largest finite value like CUDA's __NV_SATFINITE.
 *
 * RANKMESH_EMU_FAIL_AFTER=N: after N collective calls on this rank, report
 * ncclRemoteError (6) from ncclCommGetAsyncError (a "failed peer").
 * RANKMESH_EMU_INIT_FAIL=1: ncclCommInitRank fails on this rank.
 * RANKMESH_EMU_NCCL_VERSION=N: the version ncclGetVersion reports (default
 * 22703, 2.27.3); below 22400 the fp8 types are refused, as NCCL < 2.24 does.
 */
#include <math.h>
#include <mpi.h>
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
    int rank, size;
    long calls;
    int aborted;
} Comm;

enum { SUCCESS = 0, UNHANDLED_CUDA = 1, SYSTEM_ERROR = 2, INTERNAL = 3, INVALID_ARGUMENT = 4, INVALID_USAGE = 5, REMOTE = 6 };

static const char MAGIC[8] = "rkmEMU01";
static int next_id;

static int version(void) {
    const char *v = getenv("RANKMESH_EMU_NCCL_VERSION");
    return v ? atoi(v) : 22703;
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

const char *ncclGetLastError(void *comm) {
    (void)comm;
    return "";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    int world;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    memset(id, 0, sizeof *id);
    memcpy(id->internal, MAGIC, 8);
    int32_t fields[2] = {world, next_id++};
    /* High-bit bytes on purpose: the id must survive c_char's sign. */
    id->internal[16] = (char)0xff;
    memcpy(id->internal + 8, fields, sizeof fields);
    return SUCCESS;
}

ncclResult_t ncclCommInitRank(Comm **out, int nranks, ncclUniqueId id, int rank) {
    if (memcmp(id.internal, MAGIC, 8) != 0 || (unsigned char)id.internal[16] != 0xff)
        return INVALID_ARGUMENT;
    const char *fail = getenv("RANKMESH_EMU_INIT_FAIL");
    int32_t fields[2];
    memcpy(fields, id.internal + 8, sizeof fields);
    int root = fields[0], tag = 30000 + fields[1] % 1000;
    int world;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    /* The root learns every member's world rank, then tells everyone. */
    int *members = calloc((size_t)nranks, sizeof(int));
    if (rank == 0) {
        members[0] = world;
        for (int i = 1; i < nranks; i++) {
            int msg[2];
            MPI_Recv(msg, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            members[msg[0]] = msg[1];
        }
        for (int i = 1; i < nranks; i++)
            MPI_Send(members, nranks, MPI_INT, members[i], tag, MPI_COMM_WORLD);
    } else {
        int msg[2] = {rank, world};
        MPI_Send(msg, 2, MPI_INT, root, tag, MPI_COMM_WORLD);
        MPI_Recv(members, nranks, MPI_INT, root, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    MPI_Group all, mine;
    MPI_Comm_group(MPI_COMM_WORLD, &all);
    MPI_Group_incl(all, nranks, members, &mine);
    Comm *c = calloc(1, sizeof *c);
    MPI_Comm_create_group(MPI_COMM_WORLD, mine, tag, &c->mpi);
    MPI_Group_free(&mine);
    MPI_Group_free(&all);
    free(members);
    c->rank = rank;
    c->size = nranks;
    if (fail && atoi(fail)) {
        MPI_Comm_free(&c->mpi);
        free(c);
        return SYSTEM_ERROR;
    }
    *out = c;
    return SUCCESS;
}

static void release(Comm *c) {
    MPI_Comm_free(&c->mpi);
    free(c);
}
ncclResult_t ncclCommDestroy(Comm *c) {
    release(c);
    return SUCCESS;
}
ncclResult_t ncclCommAbort(Comm *c) {
    release(c);
    return SUCCESS;
}
ncclResult_t ncclCommGetAsyncError(Comm *c, ncclResult_t *e) {
    const char *after = getenv("RANKMESH_EMU_FAIL_AFTER");
    *e = (after && c->calls >= atol(after)) ? REMOTE : SUCCESS;
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

static ncclResult_t enter(Comm *c, int t) {
    if (!c || c->aborted) return INVALID_USAGE;
    if (!elem(t)) return INVALID_ARGUMENT;
    c->calls++;
    return SUCCESS;
}

static ncclResult_t all_reduce_bytes(const void *s, void *r, size_t count, int t, int op, Comm *c, int root) {
    size_t bytes = count * elem(t);
    char *all = malloc(bytes * (size_t)c->size + 1);
    MPI_Allgather(s, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, c->mpi);
    if (root < 0 || root == c->rank) reduce_into(r, all, count, t, op, c->size);
    free(all);
    return SUCCESS;
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, int t, int op, Comm *c, void *stream) {
    (void)stream;
    ncclResult_t e = enter(c, t);
    return e ? e : all_reduce_bytes(s, r, count, t, op, c, -1);
}

ncclResult_t ncclReduce(const void *s, void *r, size_t count, int t, int op, int root, Comm *c, void *stream) {
    (void)stream;
    ncclResult_t e = enter(c, t);
    if (e) return e;
    if (root < 0 || root >= c->size) return INVALID_ARGUMENT;
    return all_reduce_bytes(s, r, count, t, op, c, root);
}

ncclResult_t ncclReduceScatter(const void *s, void *r, size_t recvcount, int t, int op, Comm *c, void *stream) {
    (void)stream;
    ncclResult_t e = enter(c, t);
    if (e) return e;
    size_t bytes = recvcount * elem(t);
    char *full = malloc(bytes * (size_t)c->size + 1);
    all_reduce_bytes(s, full, recvcount * (size_t)c->size, t, op, c, -1);
    memcpy(r, full + (size_t)c->rank * bytes, bytes);
    free(full);
    return SUCCESS;
}

ncclResult_t ncclAllGather(const void *s, void *r, size_t sendcount, int t, Comm *c, void *stream) {
    (void)stream;
    ncclResult_t e = enter(c, t);
    if (e) return e;
    int bytes = (int)(sendcount * elem(t));
    MPI_Allgather(s, bytes, MPI_BYTE, r, bytes, MPI_BYTE, c->mpi);
    return SUCCESS;
}

ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, int t, int root, Comm *c, void *stream) {
    (void)stream;
    ncclResult_t e = enter(c, t);
    if (e) return e;
    if (root < 0 || root >= c->size) return INVALID_ARGUMENT;
    size_t bytes = count * elem(t);
    if (c->rank == root && s != r) memmove(r, s, bytes);
    MPI_Bcast(r, (int)bytes, MPI_BYTE, root, c->mpi);
    return SUCCESS;
}

/* Point-to-point calls are queued between ncclGroupStart and ncclGroupEnd. */
typedef struct {
    int send;
    void *buf;
    int bytes, peer;
    Comm *comm;
} P2p;
static P2p queue[4096];
static int queued, depth;

static ncclResult_t flush(void) {
    MPI_Request reqs[4096];
    for (int i = 0; i < queued; i++) {
        P2p *p = &queue[i];
        if (p->send)
            MPI_Isend(p->buf, p->bytes, MPI_BYTE, p->peer, 77, p->comm->mpi, &reqs[i]);
        else
            MPI_Irecv(p->buf, p->bytes, MPI_BYTE, p->peer, 77, p->comm->mpi, &reqs[i]);
    }
    MPI_Waitall(queued, reqs, MPI_STATUSES_IGNORE);
    queued = 0;
    return SUCCESS;
}

static ncclResult_t p2p(int send, const void *buf, size_t count, int t, int peer, Comm *c) {
    ncclResult_t e = enter(c, t);
    if (e) return e;
    if (peer < 0 || peer >= c->size || queued == 4096) return INVALID_ARGUMENT;
    queue[queued++] = (P2p){send, (void *)buf, (int)(count * elem(t)), peer, c};
    return depth ? SUCCESS : flush();
}

ncclResult_t ncclSend(const void *s, size_t count, int t, int peer, Comm *c, void *stream) {
    (void)stream;
    return p2p(1, s, count, t, peer, c);
}
ncclResult_t ncclRecv(void *r, size_t count, int t, int peer, Comm *c, void *stream) {
    (void)stream;
    return p2p(0, r, count, t, peer, c);
}
ncclResult_t ncclGroupStart(void) {
    depth++;
    return SUCCESS;
}
ncclResult_t ncclGroupEnd(void) {
    if (depth == 0) return INVALID_USAGE;
    return --depth ? SUCCESS : flush();
}
