/* A fake CUDA driver (libcuda.so.1) for tests: the driver API entry points gpumm's CUDA
 * backend loads, implemented over host memory. Physical allocations (cuMemCreate) are
 * ranges of one memfd; virtual reservations are PROT_NONE mappings; cuMemMap maps memfd
 * ranges into them with MAP_FIXED | MAP_SHARED, so stitching behaves as on a GPU and the
 * bytes can be checked from the test. Environment:
 *   FAKE_CUDA_MEM      device memory in bytes (default 1 GiB)
 *   FAKE_CUDA_FAIL_AT  the N-th call of cuMemCreate / cuMemMap / cuMemAddressReserve /
 *                      cuMemHostRegister fails
 *                      with CUDA_ERROR_OUT_OF_MEMORY (0: never)
 * Build: cc -shared -fPIC -O2 -o libfakecuda.so fake_cuda.c
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <fcntl.h>
#include <errno.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef uint64_t CUdeviceptr;
typedef uint64_t CUmemGenericAllocationHandle;

typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage;
             unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;

enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, INVALID_DEVICE = 101 };
#define GRAN (2u << 20)

static int initialized;
static int fd = -1;
static uint64_t capacity;
static uint64_t next_off;        /* bump allocation of physical ranges */
static uint64_t freed_total;
static long calls, fail_at;

static int trip(void) {
    calls++;
    return fail_at && calls == fail_at;
}

CUresult cuInit(unsigned flags) {
    (void)flags;
    if (initialized) return OK;
    const char *m = getenv("FAKE_CUDA_MEM");
    capacity = m ? strtoull(m, 0, 10) : (1ull << 30);
    const char *f = getenv("FAKE_CUDA_FAIL_AT");
    fail_at = f ? atol(f) : 0;
    fd = memfd_create("fake-cuda", 0);
    if (fd < 0 || ftruncate(fd, (off_t)(capacity * 2)) != 0) return OUT_OF_MEMORY;
    initialized = 1;
    return OK;
}
CUresult cuDeviceGetCount(int *n) { *n = initialized ? 1 : 0; return initialized ? OK : NOT_INITIALIZED; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) { if (ordinal != 0) return INVALID_DEVICE; *d = 0; return OK; }
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    (void)d; strncpy(name, "Fake NVIDIA H100 80GB HBM3", (size_t)len); name[len - 1] = 0; return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) { (void)d; *bytes = capacity; return OK; }
CUresult cuDeviceGetAttribute(int *v, int attrib, CUdevice d) {
    (void)d;
    if (attrib == 75) *v = 9;       /* COMPUTE_CAPABILITY_MAJOR */
    else if (attrib == 76) *v = 0;  /* COMPUTE_CAPABILITY_MINOR */
    else *v = 0;
    return OK;
}
static int ctx_token;
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { (void)d; *c = &ctx_token; return OK; }
CUresult cuCtxSetCurrent(CUcontext c) { (void)c; return OK; }

CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p, int option) {
    (void)p; (void)option; *g = GRAN; return OK;
}
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *p,
                     unsigned long long flags) {
    (void)p; (void)flags;
    if (!initialized) return NOT_INITIALIZED;
    if (size == 0 || size % GRAN) return INVALID_VALUE;
    if (trip() || next_off - freed_total + size > capacity || next_off + size > capacity * 2)
        return OUT_OF_MEMORY;
    /* handle = offset in the memfd + 1 (0 is not a handle) */
    *h = next_off + 1;
    next_off += size;
    /* a fresh physical allocation reads as zeros, as on a GPU after cuMemCreate + memset */
    return OK;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    if (h == 0) return INVALID_VALUE;
    freed_total += GRAN; /* every handle gpumm makes is one granule */
    fallocate(fd, 0x02 | 0x01, (off_t)(h - 1), GRAN); /* punch hole, keep size */
    return OK;
}
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                             unsigned long long flags) {
    (void)addr; (void)flags;
    if (trip()) return OUT_OF_MEMORY;
    size_t a = align ? align : GRAN;
    void *p = mmap(0, size + a, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return OUT_OF_MEMORY;
    uintptr_t q = ((uintptr_t)p + a - 1) & ~(uintptr_t)(a - 1);
    *ptr = (CUdeviceptr)q;
    return OK;
}
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    munmap((void *)ptr, size);
    return OK;
}
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                  unsigned long long flags) {
    (void)flags;
    if (trip()) return OUT_OF_MEMORY;
    if (h == 0 || size % GRAN || ptr % GRAN) return INVALID_VALUE;
    void *p = mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, (off_t)(h - 1 + offset));
    return p == MAP_FAILED ? OUT_OF_MEMORY : OK;
}
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    (void)desc; (void)count;
    return mprotect((void *)ptr, size, PROT_READ | PROT_WRITE) ? INVALID_VALUE : OK;
}
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    void *p = mmap((void *)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    return p == MAP_FAILED ? INVALID_VALUE : OK;
}
/* Copies of overlapping ranges are undefined in the real driver: refused here. */
static int overlap(CUdeviceptr dst, CUdeviceptr src, size_t n) { return dst < src + n && src < dst + n && dst != src; }
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) { if (overlap(dst, src, n)) return INVALID_VALUE; memcpy((void *)dst, (void *)src, n); return OK; }
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) { memset((void *)dst, v, n); return OK; }
CUresult cuCtxSynchronize(void) { return OK; }
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) { (void)s; if (overlap(dst, src, n)) return INVALID_VALUE; memcpy((void *)dst, (void *)src, n); return OK; }
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) { (void)s; memset((void *)dst, v, n); return OK; }
CUresult cuStreamSynchronize(CUstream s) { (void)s; return OK; }

/* Events: reached after FAKE_CUDA_EVENT_DELAY queries (default 0: at once). */
typedef struct { long queries; int done; } fake_event;
static long event_delay = -1;
static long events_live;
CUresult cuEventCreate(void **ev, unsigned flags) {
    (void)flags;
    if (event_delay < 0) { const char *d = getenv("FAKE_CUDA_EVENT_DELAY"); event_delay = d ? atol(d) : 0; }
    fake_event *e = calloc(1, sizeof *e);
    if (!e) return OUT_OF_MEMORY;
    *ev = e; events_live++;
    return OK;
}
CUresult cuEventRecord(void *ev, CUstream s) { (void)s; ((fake_event *)ev)->queries = 0; ((fake_event *)ev)->done = 0; return OK; }
CUresult cuEventQuery(void *ev) {
    fake_event *e = ev;
    if (e->done || e->queries++ >= event_delay) { e->done = 1; return OK; }
    return 600; /* CUDA_ERROR_NOT_READY */
}
CUresult cuEventDestroy_v2(void *ev) { free(ev); events_live--; return OK; }
/* for tests: events created and not destroyed */
long fake_cuda_events_live(void) { return events_live; }
/* Host registration (pinning): ranges must not overlap one already registered and must be
 * mapped writable (checked by populating them, as pinning does); fails with the failure
 * counter too. */
#define MAX_REGS 65536
static struct { uintptr_t p; size_t n; } regs[MAX_REGS];
static long nregs;
static uint64_t reg_bytes;
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
    (void)flags;
    if (!initialized) return NOT_INITIALIZED;
    if (!p || n == 0) return INVALID_VALUE;
    if (trip()) return OUT_OF_MEMORY;
    uintptr_t a = (uintptr_t)p;
    for (long i = 0; i < nregs; i++)
        if (a < regs[i].p + regs[i].n && regs[i].p < a + n) return 712; /* ALREADY_REGISTERED */
    if (nregs == MAX_REGS) return OUT_OF_MEMORY;
#ifdef MADV_POPULATE_WRITE
    if (madvise((void *)(a & ~(uintptr_t)4095), n + (a & 4095), MADV_POPULATE_WRITE) != 0 && errno != EINVAL)
        return INVALID_VALUE; /* not mapped, or not writable */
#endif
    regs[nregs].p = a; regs[nregs].n = n; nregs++;
    reg_bytes += n;
    return OK;
}
CUresult cuMemHostUnregister(void *p) {
    for (long i = 0; i < nregs; i++)
        if (regs[i].p == (uintptr_t)p) {
            reg_bytes -= regs[i].n;
            regs[i] = regs[--nregs];
            return OK;
        }
    return 713; /* HOST_MEMORY_NOT_REGISTERED */
}
/* for tests: bytes registered now */
uint64_t fake_cuda_registered_bytes(void) { return reg_bytes; }
CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) { (void)flags; *p = malloc(n); return *p ? OK : OUT_OF_MEMORY; }
CUresult cuMemFreeHost(void *p) { free(p); return OK; }

/* for tests: how many calls the failure counter has seen */
long fake_cuda_calls(void) { return calls; }
