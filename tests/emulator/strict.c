/* The NCCL emulator refuses what NCCL refuses: called directly (no
 * rankmesh), on 2 ranks, each call's code is checked. Prints
 * "STRICT-OK rank R" or "STRICT-FAILED rank R: ..." lines.
 *
 * Built by tests/emulator/mod.rs against the emulators (libnccl.so.2,
 * libcuda.so); run with RANKMESH_EMU_GPUS=2 under mpirun -np 3: the
 * bootstrap's refusals take all three, the rest ranks 0 and 1.
 * STRICT_HOSTS=distinct gives each rank its own NCCL_HOSTID, so that two
 * ranks on one GPU are two nodes to NCCL and their bootstrap succeeds. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int ncclResult_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
typedef struct {
    size_t size;
    unsigned magic, version;
    int blocking, cga, min_ctas, max_ctas;
    const char *net;
    int split_share;
} Config;

ncclResult_t ncclGetUniqueId(ncclUniqueId *);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *, int, ncclUniqueId, int, Config *);
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t *);
ncclResult_t ncclCommDestroy(ncclComm_t);
ncclResult_t ncclCommAbort(ncclComm_t);
ncclResult_t ncclAllReduce(const void *, void *, size_t, int, int, ncclComm_t, void *);
ncclResult_t ncclAllGather(const void *, void *, size_t, int, ncclComm_t, void *);
ncclResult_t ncclReduceScatter(const void *, void *, size_t, int, int, ncclComm_t, void *);
ncclResult_t ncclSend(const void *, size_t, int, int, ncclComm_t, void *);
ncclResult_t ncclRecv(void *, size_t, int, int, ncclComm_t, void *);
ncclResult_t ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int);
ncclResult_t ncclCommShrink(ncclComm_t, int *, int, ncclComm_t *, Config *, int);
ncclResult_t ncclBroadcast(const void *, void *, size_t, int, int, ncclComm_t, void *);
typedef int CUresult;
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuStreamCreate(void **, unsigned);
CUresult cuMemAlloc_v2(uint64_t *, size_t);
CUresult cuStreamSynchronize(void *);
CUresult cuStreamQuery(void *);
CUresult cuStreamDestroy_v2(void *);
CUresult cuMemFree_v2(uint64_t);
CUresult cuMemAllocAsync(uint64_t *, size_t, void *);
CUresult cuMemsetD8Async(uint64_t, unsigned char, size_t, void *);
CUresult cuMemcpyDtoHAsync_v2(void *, uint64_t, size_t, void *);
CUresult cuEventCreate(void **, unsigned);
CUresult cuEventDestroy_v2(void *);
CUresult cuEventRecord(void *, void *);
CUresult cuEventQuery(void *);
CUresult cuStreamWaitEvent(void *, void *, unsigned);

enum { F32 = 7, SUM = 0, UNHANDLED_CUDA = 1, INVALID_ARGUMENT = 4, INVALID_USAGE = 5, IN_PROGRESS = 7 };
enum { CU_INVALID_VALUE = 1, CU_INVALID_HANDLE = 400 };

static int rank, failed;

static void expect(const char *what, ncclResult_t got, ncclResult_t want) {
    if (got != want) {
        printf("STRICT-FAILED rank %d: %s returned %d, want %d\n", rank, what, got, want);
        failed = 1;
    }
}

/* A blocking creation of `nranks` as `me` from world rank 0's id. */
static ncclResult_t init(ncclComm_t *comm, int nranks, int me, MPI_Comm over) {
    ncclUniqueId id;
    int r;
    MPI_Comm_rank(over, &r);
    if (r == 0) ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, over);
    return ncclCommInitRank(comm, nranks, id, me);
}

/* NCCL's bootstrap refuses a size the members disagree on, a rank that
   checks in twice and two ranks on one GPU of one host. */
static void bootstrap_refusals(void *device0) {
    ncclComm_t comm = NULL;
    expect("members disagreeing on nranks", init(&comm, rank == 2 ? 4 : 3, rank, MPI_COMM_WORLD), INVALID_USAGE);
    expect("a rank that checks in twice", init(&comm, 3, rank == 2 ? 1 : rank, MPI_COMM_WORLD), INVALID_USAGE);
    MPI_Comm pair;
    MPI_Comm_split(MPI_COMM_WORLD, rank < 2 ? 0 : MPI_UNDEFINED, rank, &pair);
    if (pair == MPI_COMM_NULL) return;
    /* Both on device 0, whose bus id is forced alike in both processes. */
    setenv("RANKMESH_EMU_BUS", "0000:42:00.0", 1);
    cuCtxSetCurrent(device0);
    int distinct = getenv("STRICT_HOSTS") && strcmp(getenv("STRICT_HOSTS"), "distinct") == 0;
    ncclResult_t rc = init(&comm, 2, rank, pair);
    if (distinct) {
        expect("two ranks on one GPU with distinct NCCL_HOSTIDs", rc, 0);
        if (!rc) expect("its destroy", ncclCommDestroy(comm), 0);
    } else {
        expect("two ranks on one GPU of one host", rc, INVALID_USAGE);
    }
    unsetenv("RANKMESH_EMU_BUS");
    MPI_Comm_free(&pair);
}

/* ncclCommShrink (NCCL 2.27), as its header and user guide say: only the
   survivors call it, with the same excluded ranks; they are renumbered
   densely in parent order; a NULL config inherits the parent's (blocking
   here); NCCL_SHRINK_DEFAULT wants no work in flight on the parent,
   NCCL_SHRINK_ABORT ends it first. The emulator also refuses what NCCL
   leaves undefined (a rank out of range or named twice). All three ranks,
   each on its own host (two share a GPU). */
static void shrink_contract(void *device) {
    ncclComm_t world = NULL, small = NULL;
    cuCtxSetCurrent(device);
    void *stream;
    cuStreamCreate(&stream, 0);
    uint64_t a;
    cuMemAlloc_v2(&a, 4096);
    float *buf = (float *)(uintptr_t)a;
    expect("a world of 3", init(&world, 3, rank, MPI_COMM_WORLD), 0);
    if (rank != 1) {
        int mine[1] = {rank}, out_of_range[1] = {3}, twice[2] = {1, 1}, one[1] = {1};
        expect("a shrink that excludes the caller", ncclCommShrink(world, mine, 1, &small, NULL, 0), INVALID_ARGUMENT);
        expect("a shrink excluding a rank out of range", ncclCommShrink(world, out_of_range, 1, &small, NULL, 0),
               INVALID_ARGUMENT);
        expect("a shrink naming a rank twice", ncclCommShrink(world, twice, 2, &small, NULL, 0), INVALID_ARGUMENT);
        expect("a shrink excluding no rank", ncclCommShrink(world, one, 0, &small, NULL, 0), INVALID_ARGUMENT);
        expect("a shrink with unknown flags", ncclCommShrink(world, one, 1, &small, NULL, 4), INVALID_ARGUMENT);
        /* World rank 0's all-reduce waits for ranks that never make it. */
        if (rank == 0) {
            expect("an all_reduce the others never match", ncclAllReduce(buf, buf, 4, F32, SUM, world, stream), 0);
            expect("NCCL_SHRINK_DEFAULT with work in flight", ncclCommShrink(world, one, 1, &small, NULL, 0),
                   INVALID_USAGE);
        }
        /* Rank 1 is lost: ranks 0 and 2 go on as 0 and 1. */
        expect("NCCL_SHRINK_ABORT without rank 1", ncclCommShrink(world, one, 1, &small, NULL, 1), 0);
        cuStreamSynchronize(stream);
        if (small) {
            float v[4] = {1.5f + rank, 1.5f + rank, 1.5f + rank, 1.5f + rank};
            memcpy(buf, v, sizeof v);
            expect("an all_reduce on the shrunk communicator", ncclAllReduce(buf, buf, 4, F32, SUM, small, stream), 0);
            cuStreamSynchronize(stream);
            /* 1.5 + 3.5: both survivors, no third. */
            if (buf[0] != 5.0f) {
                printf("STRICT-FAILED rank %d: the shrunk all_reduce gave %g, want 5\n", rank, buf[0]);
                failed = 1;
            }
            buf[0] = 40.0f + rank;
            /* New rank 1 is world rank 2: its value, 42, reaches both. */
            expect("a broadcast from new rank 1", ncclBroadcast(buf, buf, 1, F32, 1, small, stream), 0);
            cuStreamSynchronize(stream);
            if (buf[0] != 42.0f) {
                printf("STRICT-FAILED rank %d: new rank 1's broadcast gave %g, want 42 (world rank 2's)\n",
                       rank, buf[0]);
                failed = 1;
            }
            expect("the shrunk communicator's destroy", ncclCommDestroy(small), 0);
        } else {
            printf("STRICT-FAILED rank %d: the shrink gave no communicator\n", rank);
            failed = 1;
        }
    }
    /* NCCL leaves the parent to the caller: aborted, on every rank. */
    expect("the parent's abort", ncclCommAbort(world), 0);
    cuMemFree_v2(a);
    cuStreamDestroy_v2(stream);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* The driver refuses what a GPU would refuse or fault on: memory that is
   not device memory, handles used after their destroy. Local calls only,
   so a refusal on one rank leaves the other's calls matched. */
static void driver_refusals(ncclComm_t comm, void *stream, float *buf, uint64_t a) {
    float host[4] = {0};
    expect("an all_reduce of host memory", ncclAllReduce(host, buf, 4, F32, SUM, comm, stream), INVALID_ARGUMENT);
    expect("an all_reduce past its allocation's end", ncclAllReduce(buf, buf, 1025, F32, SUM, comm, stream),
           INVALID_ARGUMENT);
    expect("a send of host memory", ncclSend(host, 4, F32, 1 - rank, comm, stream), INVALID_ARGUMENT);
    expect("cuMemsetD8Async on host memory", cuMemsetD8Async((uint64_t)(uintptr_t)host, 0, 16, stream),
           CU_INVALID_VALUE);
    expect("cuMemFree inside an allocation", cuMemFree_v2(a + 16), CU_INVALID_VALUE);
    uint64_t spare;
    cuMemAlloc_v2(&spare, 64);
    expect("cuMemFree", cuMemFree_v2(spare), 0);
    expect("cuMemFree of a freed block", cuMemFree_v2(spare), CU_INVALID_VALUE);
    expect("cuMemsetD8Async on a freed block", cuMemsetD8Async(spare, 0, 16, stream), CU_INVALID_VALUE);

    void *gone, *event;
    cuStreamCreate(&gone, 0);
    expect("cuStreamDestroy", cuStreamDestroy_v2(gone), 0);
    expect("cuStreamSynchronize on a destroyed stream", cuStreamSynchronize(gone), CU_INVALID_HANDLE);
    expect("cuMemsetD8Async on a destroyed stream", cuMemsetD8Async(a, 0, 16, gone), CU_INVALID_HANDLE);
    expect("an all_reduce on a destroyed stream", ncclAllReduce(buf, buf, 4, F32, SUM, comm, gone), UNHANDLED_CUDA);
    cuEventCreate(&event, 0);
    expect("cuEventDestroy", cuEventDestroy_v2(event), 0);
    expect("cuEventQuery on a destroyed event", cuEventQuery(event), CU_INVALID_HANDLE);
    expect("cuEventRecord of a destroyed event", cuEventRecord(event, stream), CU_INVALID_HANDLE);
    if (rank != 0) return;

    /* cuMemAllocAsync's block is its stream's from the allocation on:
       `busy` is a gigabyte of memsets behind, and a set on `stream` that
       does not wait for it is lost to the pool's stale fill. */
    void *busy, *ready;
    uint64_t big, block;
    unsigned char got = 0;
    cuStreamCreate(&busy, 0);
    cuMemAlloc_v2(&big, 256u << 20);
    for (int i = 0; i < 4; i++) cuMemsetD8Async(big, (unsigned char)i, 256u << 20, busy);
    expect("cuMemAllocAsync", cuMemAllocAsync(&block, 4096, busy), 0);
    cuMemsetD8Async(block, 0x11, 4096, stream);
    cuStreamSynchronize(stream);
    cuStreamSynchronize(busy);
    cuMemcpyDtoHAsync_v2(&got, block, 1, stream);
    expect("a set that did not wait for cuMemAllocAsync's stream (0xA5: lost)", got, 0xA5);
    /* Ordered by an event, the set holds. */
    for (int i = 0; i < 4; i++) cuMemsetD8Async(big, (unsigned char)i, 256u << 20, busy);
    expect("cuMemAllocAsync", cuMemAllocAsync(&block, 4096, busy), 0);
    cuEventCreate(&ready, 0);
    cuEventRecord(ready, busy);
    cuStreamWaitEvent(stream, ready, 0);
    cuMemsetD8Async(block, 0x11, 4096, stream);
    cuMemcpyDtoHAsync_v2(&got, block, 1, stream);
    expect("a set that waited for cuMemAllocAsync's stream (0x11: kept)", got, 0x11);
    cuStreamSynchronize(busy);
    cuMemFree_v2(big);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    /* Before the first NCCL call, as NCCL reads it once. */
    char host[64];
    snprintf(host, sizeof host, "strict-host-%d", getenv("STRICT_HOSTS") ? rank : 0);
    setenv("NCCL_HOSTID", host, 1);
    void *ctx[2], *stream;
    cuInit(0);
    cuDevicePrimaryCtxRetain(&ctx[0], rank % 2);
    cuDevicePrimaryCtxRetain(&ctx[1], 1 - rank % 2);
    expect("cuMemAlloc without a current context", cuMemAlloc_v2(&(uint64_t){0}, 64), 201);
    /* Calls answer ncclInProgress only where this asks them to. */
    setenv("RANKMESH_EMU_IN_PROGRESS", "0", 1);
    bootstrap_refusals(rank == 1 ? ctx[1] : ctx[0]);
    if (getenv("STRICT_HOSTS") && strcmp(getenv("STRICT_HOSTS"), "distinct") == 0) shrink_contract(ctx[0]);
    MPI_Comm pair;
    MPI_Comm_split(MPI_COMM_WORLD, rank < 2 ? 0 : MPI_UNDEFINED, rank, &pair);
    if (pair == MPI_COMM_NULL) {
        printf("%s rank %d\n", failed ? "STRICT-FAILED" : "STRICT-OK", rank);
        MPI_Finalize();
        return failed;
    }
    cuCtxSetCurrent(ctx[0]);
    cuStreamCreate(&stream, 0);
    uint64_t a, b;
    cuMemAlloc_v2(&a, 4096);
    cuMemAlloc_v2(&b, 4096);
    float *buf = (float *)(uintptr_t)a, *other = (float *)(uintptr_t)b;

    ncclUniqueId id;
    if (rank == 0) ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, pair);
    Config bad = {sizeof bad, 0x12345678u, 21800, 0, 0, 0, 0, NULL, 0};
    ncclComm_t comm = NULL;
    expect("a config not made by NCCL_CONFIG_INITIALIZER", ncclCommInitRankConfig(&comm, 2, id, rank, &bad),
           INVALID_ARGUMENT);
    Config cfg = {sizeof cfg, 0xcafebeefu, 21800, 0, (int)0x80000000, (int)0x80000000, (int)0x80000000, NULL,
                  (int)0x80000000};
    expect("non-blocking ncclCommInitRankConfig", ncclCommInitRankConfig(&comm, 2, id, rank, &cfg), IN_PROGRESS);
    ncclResult_t state = IN_PROGRESS;
    int early = ncclAllReduce(buf, buf, 4, F32, SUM, comm, stream);
    expect("a call while the communicator is still being created", early, INVALID_USAGE);
    for (int i = 0; i < 600000 && state == IN_PROGRESS; i++) {
        ncclCommGetAsyncError(comm, &state);
        usleep(10);
    }
    expect("creation", state, 0);

    expect("null send buffer", ncclAllReduce(NULL, buf, 4, F32, SUM, comm, stream), INVALID_ARGUMENT);
    expect("null receive buffer", ncclAllReduce(buf, NULL, 4, F32, SUM, comm, stream), INVALID_ARGUMENT);
    expect("operator out of range", ncclAllReduce(buf, other, 4, F32, 9, comm, stream), INVALID_ARGUMENT);
    /* all_gather of 4 per rank: in place only at recv + rank * 4. */
    expect("all_gather, overlapping at the wrong offset",
           ncclAllGather(buf + (rank == 0 ? 1 : 0), buf, 4, F32, comm, stream), INVALID_ARGUMENT);
    /* reduce_scatter of 4 per rank: in place only at send + rank * 4. */
    expect("reduce_scatter, overlapping at the wrong offset",
           ncclReduceScatter(buf, buf + (rank == 0 ? 2 : 1), 4, F32, SUM, comm, stream), INVALID_ARGUMENT);
    cuCtxSetCurrent(ctx[1]);
    expect("the communicator used while another device is current",
           ncclAllReduce(buf, other, 4, F32, SUM, comm, stream), INVALID_USAGE);
    cuCtxSetCurrent(ctx[0]);
    /* Rank 0's all-reduce waits for rank 1, which has not called it yet:
       a destroy now would wait forever on a real GPU. */
    if (rank == 0) {
        expect("an all_reduce", ncclAllReduce(buf, other, 4, F32, SUM, comm, stream), 0);
        usleep(100000);
        expect("a destroy with work in flight", ncclCommDestroy(comm), INVALID_USAGE);
    }
    MPI_Barrier(pair);
    if (rank == 1) expect("the matching all_reduce", ncclAllReduce(buf, other, 4, F32, SUM, comm, stream), 0);
    cuStreamSynchronize(stream);

    /* Every call of a non-blocking communicator answers ncclInProgress
       here; the next call is refused until it has been polled to rest. */
    setenv("RANKMESH_EMU_IN_PROGRESS", "100", 1);
    expect("an all_reduce answering ncclInProgress", ncclAllReduce(buf, other, 4, F32, SUM, comm, stream),
           IN_PROGRESS);
    expect("a call before the last one was polled to rest", ncclAllReduce(buf, other, 4, F32, SUM, comm, stream),
           INVALID_ARGUMENT);
    state = IN_PROGRESS;
    for (int i = 0; i < 100 && state == IN_PROGRESS; i++) ncclCommGetAsyncError(comm, &state);
    expect("the in-progress all_reduce, polled", state, 0);
    setenv("RANKMESH_EMU_IN_PROGRESS", "0", 1);
    cuStreamSynchronize(stream);

    /* A send whose receive is not posted does not complete (NCCL: "blocking
       for the GPU"); it does once the receive comes. */
    float sent[4] = {1.5f, 2.5f, 3.5f, 4.5f};
    if (rank == 0) {
        for (int i = 0; i < 4; i++) other[i] = sent[i];
        expect("an unmatched send", ncclSend(other, 4, F32, 1, comm, stream), 0);
        usleep(300000);
        expect("the unmatched send's stream, still running", cuStreamQuery(stream), 600);
    }
    MPI_Barrier(pair);
    if (rank == 1) expect("the receive that matches it", ncclRecv(other, 4, F32, 0, comm, stream), 0);
    cuStreamSynchronize(stream);
    if (rank == 1 && memcmp(other, sent, sizeof sent) != 0) {
        printf("STRICT-FAILED rank %d: the received data differs\n", rank);
        failed = 1;
    }
    driver_refusals(comm, stream, buf, a);
    expect("a destroy once the work is done", ncclCommDestroy(comm), 0);
    expect("a call on a destroyed communicator", ncclAllReduce(buf, other, 4, F32, SUM, comm, stream),
           INVALID_USAGE);
    if (!failed) printf("STRICT-OK rank %d\n", rank);
    MPI_Finalize();
    return failed;
}
