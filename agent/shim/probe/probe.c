/*
 * A test program that reaches the CUDA driver the ways applications do, so the shim is
 * tested on each of them:
 *
 *   direct      linked against libcuda.so.1, calling its exports
 *   dlopen      dlopen("libcuda.so.1") + dlsym
 *   procaddr    entry points from cuGetProcAddress_v2 (CUDA 12 runtimes, PyTorch)
 *   procaddr-v1 entry points from cuGetProcAddress (CUDA 11.3-11.8 runtimes)
 *   ptsz        cuGetProcAddress_v2 with the per-thread default stream flag
 *
 * Usage: probe MODE COMMAND...   (one output line per command)
 *
 *   ctx:N                   make device N current (retains its primary context)
 *   alloc:KIND:BYTES        KIND: mem pitch managed async pool create array array3d mipmap
 *                           prints "alloc KIND BYTES ok ID" or "alloc KIND BYTES err CODE"
 *   alloc-until:KIND:BYTES  retries every 50 ms (up to 60 s) until the allocation succeeds
 *                           (a limit being raised); prints as alloc does
 *   free:ID                 frees allocation ID with its matching free
 *   meminfo                 "meminfo FREE TOTAL" from cuMemGetInfo_v2
 *   totalmem:N              "totalmem N BYTES" from cuDeviceTotalMem_v2
 *   nvmlinfo:N              "nvmlinfo N TOTAL FREE USED TOTAL2 FREE2 USED2" (v1 and v2)
 *   launch:KIND             KIND: kernel ex coop graph; "launch KIND CODE"
 *   duty:US:WARM:MEASURE    launches US-microsecond kernels flat out; after WARM seconds
 *                           measures for MEASURE seconds; "duty FRACTION LAUNCHES"
 *   touch:PATH / wait:PATH  make a file / wait (up to 60 s) for one: syncs two probes
 *   bench:alloc:N           "bench alloc NS_PER_ALLOC NS_PER_FREE"
 *   bench:launch:N          "bench launch NS_PER_LAUNCH"
 *
 * The kernels are the fake driver's: a launch runs for gridDimX microseconds.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

/* Driver API, as cuda.h declares it (only what the probe calls). */
CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned int);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, void *);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, void *, void *);
CUresult cuMemCreate(unsigned long long *, size_t, const void *, unsigned long long);
CUresult cuArrayCreate_v2(unsigned long long *, const void *);
CUresult cuArray3DCreate_v2(unsigned long long *, const void *);
CUresult cuMipmappedArrayCreate(unsigned long long *, const void *, unsigned int);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemFreeAsync(CUdeviceptr, void *);
CUresult cuMemRelease(unsigned long long);
CUresult cuArrayDestroy(unsigned long long);
CUresult cuMipmappedArrayDestroy(unsigned long long);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);
CUresult cuLaunchKernelEx(const void *, void *, void **, void **);
CUresult cuLaunchCooperativeKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, unsigned, void *, void **);
CUresult cuGraphLaunch(void *, void *);
CUresult cuGetProcAddress(const char *, void **, int, unsigned long long);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

struct api {
    CUresult (*init)(unsigned int);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_alloc_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
    CUresult (*mem_alloc_managed)(CUdeviceptr *, size_t, unsigned int);
    CUresult (*mem_alloc_async)(CUdeviceptr *, size_t, void *);
    CUresult (*mem_alloc_pool)(CUdeviceptr *, size_t, void *, void *);
    CUresult (*mem_create)(unsigned long long *, size_t, const void *, unsigned long long);
    CUresult (*array_create)(unsigned long long *, const void *);
    CUresult (*array3d_create)(unsigned long long *, const void *);
    CUresult (*mipmap_create)(unsigned long long *, const void *, unsigned int);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*mem_free_async)(CUdeviceptr, void *);
    CUresult (*mem_release)(unsigned long long);
    CUresult (*array_destroy)(unsigned long long);
    CUresult (*mipmap_destroy)(unsigned long long);
    CUresult (*mem_get_info)(size_t *, size_t *);
    CUresult (*device_total_mem)(size_t *, CUdevice);
    CUresult (*launch_kernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, void *, void **, void **);
    CUresult (*launch_kernel_ex)(const void *, void *, void **, void **);
    CUresult (*launch_cooperative)(void *, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, unsigned, void *, void **);
    CUresult (*graph_launch)(void *, void *);
};

static struct api api;
static void *libcuda;

static void die(const char *what) {
    fprintf(stderr, "probe: %s\n", what);
    exit(2);
}

static void linked(void) {
    api.init = cuInit;
    api.device_get = cuDeviceGet;
    api.primary_ctx_retain = cuDevicePrimaryCtxRetain;
    api.ctx_set_current = cuCtxSetCurrent;
    api.mem_alloc = cuMemAlloc_v2;
    api.mem_alloc_pitch = cuMemAllocPitch_v2;
    api.mem_alloc_managed = cuMemAllocManaged;
    api.mem_alloc_async = cuMemAllocAsync;
    api.mem_alloc_pool = cuMemAllocFromPoolAsync;
    api.mem_create = cuMemCreate;
    api.array_create = cuArrayCreate_v2;
    api.array3d_create = cuArray3DCreate_v2;
    api.mipmap_create = cuMipmappedArrayCreate;
    api.mem_free = cuMemFree_v2;
    api.mem_free_async = cuMemFreeAsync;
    api.mem_release = cuMemRelease;
    api.array_destroy = cuArrayDestroy;
    api.mipmap_destroy = cuMipmappedArrayDestroy;
    api.mem_get_info = cuMemGetInfo_v2;
    api.device_total_mem = cuDeviceTotalMem_v2;
    api.launch_kernel = cuLaunchKernel;
    api.launch_kernel_ex = cuLaunchKernelEx;
    api.launch_cooperative = cuLaunchCooperativeKernel;
    api.graph_launch = cuGraphLaunch;
}

static void *sym(const char *name) {
    void *p = dlsym(libcuda, name);
    if (!p) {
        fprintf(stderr, "probe: dlsym(%s) failed\n", name);
        exit(2);
    }
    return p;
}

static void by_dlsym(void) {
    api.init = sym("cuInit");
    api.device_get = sym("cuDeviceGet");
    api.primary_ctx_retain = sym("cuDevicePrimaryCtxRetain");
    api.ctx_set_current = sym("cuCtxSetCurrent");
    api.mem_alloc = sym("cuMemAlloc_v2");
    api.mem_alloc_pitch = sym("cuMemAllocPitch_v2");
    api.mem_alloc_managed = sym("cuMemAllocManaged");
    api.mem_alloc_async = sym("cuMemAllocAsync");
    api.mem_alloc_pool = sym("cuMemAllocFromPoolAsync");
    api.mem_create = sym("cuMemCreate");
    api.array_create = sym("cuArrayCreate_v2");
    api.array3d_create = sym("cuArray3DCreate_v2");
    api.mipmap_create = sym("cuMipmappedArrayCreate");
    api.mem_free = sym("cuMemFree_v2");
    api.mem_free_async = sym("cuMemFreeAsync");
    api.mem_release = sym("cuMemRelease");
    api.array_destroy = sym("cuArrayDestroy");
    api.mipmap_destroy = sym("cuMipmappedArrayDestroy");
    api.mem_get_info = sym("cuMemGetInfo_v2");
    api.device_total_mem = sym("cuDeviceTotalMem_v2");
    api.launch_kernel = sym("cuLaunchKernel");
    api.launch_kernel_ex = sym("cuLaunchKernelEx");
    api.launch_cooperative = sym("cuLaunchCooperativeKernel");
    api.graph_launch = sym("cuGraphLaunch");
}

static int proc_version;      /* 0: cuGetProcAddress_v2, 1: cuGetProcAddress */
static unsigned long long proc_flags;
static CUresult (*get_proc_v2)(const char *, void **, int, unsigned long long, int *);
static CUresult (*get_proc_v1)(const char *, void **, int, unsigned long long);

static void *proc(const char *name) {
    void *p = NULL;
    int status = -1;
    CUresult r = proc_version == 0 ? get_proc_v2(name, &p, 12040, proc_flags, &status)
                                   : get_proc_v1(name, &p, 11080, proc_flags);
    if (r != 0 || !p) {
        fprintf(stderr, "probe: cuGetProcAddress(%s) failed: %d\n", name, r);
        exit(2);
    }
    return p;
}

static void by_proc_address(void) {
    /* The runtime finds cuGetProcAddress itself by dlsym, then everything else through it. */
    get_proc_v2 = sym("cuGetProcAddress_v2");
    get_proc_v1 = sym("cuGetProcAddress");
    if (proc_version == 0) {
        /* And through itself: the address it returns for its own name is the one used. */
        void *self = proc("cuGetProcAddress");
        get_proc_v2 = self;
    }
    api.init = proc("cuInit");
    api.device_get = proc("cuDeviceGet");
    api.primary_ctx_retain = proc("cuDevicePrimaryCtxRetain");
    api.ctx_set_current = proc("cuCtxSetCurrent");
    api.mem_alloc = proc("cuMemAlloc");
    api.mem_alloc_pitch = proc("cuMemAllocPitch");
    api.mem_alloc_managed = proc("cuMemAllocManaged");
    api.mem_alloc_async = proc("cuMemAllocAsync");
    api.mem_alloc_pool = proc("cuMemAllocFromPoolAsync");
    api.mem_create = proc("cuMemCreate");
    api.array_create = proc("cuArrayCreate");
    api.array3d_create = proc("cuArray3DCreate");
    api.mipmap_create = proc("cuMipmappedArrayCreate");
    api.mem_free = proc("cuMemFree");
    api.mem_free_async = proc("cuMemFreeAsync");
    api.mem_release = proc("cuMemRelease");
    api.array_destroy = proc("cuArrayDestroy");
    api.mipmap_destroy = proc("cuMipmappedArrayDestroy");
    api.mem_get_info = proc("cuMemGetInfo");
    api.device_total_mem = proc("cuDeviceTotalMem");
    api.launch_kernel = proc("cuLaunchKernel");
    api.launch_kernel_ex = proc("cuLaunchKernelEx");
    api.launch_cooperative = proc("cuLaunchCooperativeKernel");
    api.graph_launch = proc("cuGraphLaunch");
}

/* Allocations made so far, to free by id. */
enum kind { MEM, PITCH, MANAGED, ASYNC, POOL, CREATE, ARRAY, ARRAY3D, MIPMAP };
static const char *kinds[] = {"mem",    "pitch", "managed", "async", "pool",
                              "create", "array", "array3d", "mipmap"};
struct allocation {
    enum kind kind;
    unsigned long long handle;
};
static struct allocation held[4096];
static int nheld;

struct array_desc {
    size_t width, height;
    unsigned format, channels;
};
struct array3d_desc {
    size_t width, height, depth;
    unsigned format, channels, flags;
};
struct alloc_prop {
    int type, handle_types, location_type, location_id;
    void *win32;
    unsigned char compression, gpu_direct_rdma, usage[6];
};

static CUresult allocate(enum kind k, size_t bytes, unsigned long long *out) {
    size_t pitch = 0;
    switch (k) {
    case MEM:
        return api.mem_alloc(out, bytes);
    case PITCH:
        /* Rows of 4096 bytes (a multiple of 512: the pitch is the width). */
        return api.mem_alloc_pitch(out, &pitch, 4096, bytes / 4096, 4);
    case MANAGED:
        return api.mem_alloc_managed(out, bytes, 1);
    case ASYNC:
        return api.mem_alloc_async(out, bytes, NULL);
    case POOL:
        return api.mem_alloc_pool(out, bytes, NULL, NULL);
    case CREATE: {
        struct alloc_prop prop = {.type = 1, .location_type = 1, .location_id = 0};
        CUdevice dev = 0;
        prop.location_id = dev;
        return api.mem_create(out, bytes, &prop, 0);
    }
    case ARRAY: {
        /* 1-byte texels, rows of 4096. */
        struct array_desc d = {4096, bytes / 4096, 0x01, 1};
        return api.array_create(out, &d);
    }
    case ARRAY3D: {
        struct array3d_desc d = {4096, 1, bytes / 4096, 0x01, 1, 0};
        return api.array3d_create(out, &d);
    }
    case MIPMAP: {
        /* One level: exactly `bytes`. */
        struct array3d_desc d = {4096, bytes / 4096, 0, 0x01, 1, 0};
        return api.mipmap_create(out, &d, 1);
    }
    }
    return 1;
}

static CUresult release(struct allocation *a) {
    switch (a->kind) {
    case ASYNC:
    case POOL:
        return api.mem_free_async(a->handle, NULL);
    case CREATE:
        return api.mem_release(a->handle);
    case ARRAY:
    case ARRAY3D:
        return api.array_destroy(a->handle);
    case MIPMAP:
        return api.mipmap_destroy(a->handle);
    default:
        return api.mem_free(a->handle);
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static CUresult launch(const char *kind, unsigned micros) {
    if (!strcmp(kind, "kernel"))
        return api.launch_kernel(NULL, micros, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    if (!strcmp(kind, "ex")) {
        unsigned config[16] = {micros, 1, 1, 1, 1, 1, 0};
        return api.launch_kernel_ex(config, NULL, NULL, NULL);
    }
    if (!strcmp(kind, "coop"))
        return api.launch_cooperative(NULL, micros, 1, 1, 1, 1, 1, 0, NULL, NULL);
    if (!strcmp(kind, "graph"))
        return api.graph_launch((void *)(uintptr_t)micros, NULL);
    die("unknown launch kind");
    return 1;
}

static void nvmlinfo(int index) {
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml)
        die("cannot dlopen libnvidia-ml.so.1");
    int (*init)(void) = dlsym(nvml, "nvmlInit_v2");
    int (*by_index)(unsigned, void **) = dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
    int (*info)(void *, unsigned long long *) = dlsym(nvml, "nvmlDeviceGetMemoryInfo");
    int (*info2)(void *, unsigned long long *) = dlsym(nvml, "nvmlDeviceGetMemoryInfo_v2");
    if (!init || !by_index || !info || !info2)
        die("NVML entry points missing");
    void *dev = NULL;
    if (init() || by_index(index, &dev))
        die("NVML device lookup failed");
    unsigned long long m1[3] = {0}, m2[5] = {0};
    m2[0] = (2u << 24) | 40; /* nvmlMemory_v2 */
    int r1 = info(dev, m1), r2 = info2(dev, m2);
    printf("nvmlinfo %d %llu %llu %llu %llu %llu %llu %d %d\n", index, m1[0], m1[1], m1[2],
           m2[1], m2[3], m2[4], r1, r2);
}

static void wait_for(const char *path) {
    struct stat st;
    for (int i = 0; i < 6000; i++) {
        if (stat(path, &st) == 0)
            return;
        usleep(10000);
    }
    die("timed out waiting for a file");
}

int main(int argc, char **argv) {
    if (argc < 2)
        die("usage: probe MODE COMMAND...");
    const char *mode = argv[1];
    setvbuf(stdout, NULL, _IOLBF, 0);
    libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!libcuda)
        die("cannot dlopen libcuda.so.1");
    if (!strcmp(mode, "direct"))
        linked();
    else if (!strcmp(mode, "dlopen"))
        by_dlsym();
    else if (!strcmp(mode, "procaddr"))
        by_proc_address();
    else if (!strcmp(mode, "procaddr-v1")) {
        proc_version = 1;
        by_proc_address();
    } else if (!strcmp(mode, "ptsz")) {
        proc_flags = 1ull << 1;
        by_proc_address();
    } else
        die("unknown mode");

    CUresult r = api.init(0);
    printf("init %d\n", r);
    if (r != 0)
        return 3;

    for (int i = 2; i < argc; i++) {
        char *cmd = argv[i];
        if (!strncmp(cmd, "ctx:", 4)) {
            CUdevice dev;
            CUcontext ctx;
            r = api.device_get(&dev, atoi(cmd + 4));
            if (!r)
                r = api.primary_ctx_retain(&ctx, dev);
            if (!r)
                r = api.ctx_set_current(ctx);
            printf("ctx %s %d\n", cmd + 4, r);
        } else if (!strncmp(cmd, "alloc:", 6) || !strncmp(cmd, "alloc-until:", 12)) {
            int until = !strncmp(cmd, "alloc-until:", 12);
            char *kind = cmd + (until ? 12 : 6), *colon = strchr(kind, ':');
            if (!colon)
                die("alloc:KIND:BYTES");
            *colon = 0;
            size_t bytes = strtoull(colon + 1, NULL, 10);
            int k = -1;
            for (int j = 0; j < 9; j++)
                if (!strcmp(kinds[j], kind))
                    k = j;
            if (k < 0)
                die("unknown allocation kind");
            unsigned long long h = 0;
            r = allocate(k, bytes, &h);
            for (int tries = 0; until && r != 0 && tries < 1200; tries++) {
                usleep(50000);
                r = allocate(k, bytes, &h);
            }
            if (r == 0) {
                held[nheld].kind = k;
                held[nheld].handle = h;
                printf("alloc %s %zu ok %d\n", kind, bytes, nheld++);
            } else {
                printf("alloc %s %zu err %d\n", kind, bytes, r);
            }
        } else if (!strncmp(cmd, "free:", 5)) {
            int id = atoi(cmd + 5);
            if (id < 0 || id >= nheld)
                die("no such allocation");
            printf("free %d %d\n", id, release(&held[id]));
        } else if (!strcmp(cmd, "meminfo")) {
            size_t free_b = 0, total = 0;
            r = api.mem_get_info(&free_b, &total);
            printf("meminfo %zu %zu %d\n", free_b, total, r);
        } else if (!strncmp(cmd, "totalmem:", 9)) {
            size_t bytes = 0;
            r = api.device_total_mem(&bytes, atoi(cmd + 9));
            printf("totalmem %s %zu %d\n", cmd + 9, bytes, r);
        } else if (!strncmp(cmd, "nvmlinfo:", 9)) {
            nvmlinfo(atoi(cmd + 9));
        } else if (!strncmp(cmd, "launch:", 7)) {
            printf("launch %s %d\n", cmd + 7, launch(cmd + 7, 10));
        } else if (!strncmp(cmd, "duty:", 5)) {
            unsigned micros;
            double warm, measure;
            if (sscanf(cmd + 5, "%u:%lf:%lf", &micros, &warm, &measure) != 3)
                die("duty:US:WARM:MEASURE");
            unsigned long long (*busy)(void) = sym("fakeCudaBusyNanos");
            double start = now_s();
            while (now_s() - start < warm)
                launch("kernel", micros);
            unsigned long long b0 = busy(), n = 0;
            double t0 = now_s();
            while (now_s() - t0 < measure) {
                launch("kernel", micros);
                n++;
            }
            double wall = now_s() - t0;
            printf("duty %.4f %llu\n", (busy() - b0) / 1e9 / wall, n);
        } else if (!strncmp(cmd, "touch:", 6)) {
            FILE *f = fopen(cmd + 6, "w");
            if (f)
                fclose(f);
        } else if (!strncmp(cmd, "wait:", 5)) {
            wait_for(cmd + 5);
        } else if (!strncmp(cmd, "bench:alloc:", 12)) {
            int n = atoi(cmd + 12);
            if (n <= 0 || n > 4096)
                die("bench:alloc:N takes 1..4096");
            static CUdeviceptr ptrs[4096];
            double best_alloc = 1e9, best_free = 1e9;
            /* Many rounds of N: the best round is the cost without scheduler noise. */
            for (int round = 0; round < 200; round++) {
                double t0 = now_s();
                for (int j = 0; j < n; j++)
                    api.mem_alloc(&ptrs[j], 256);
                double t1 = now_s();
                for (int j = 0; j < n; j++)
                    api.mem_free(ptrs[j]);
                double t2 = now_s();
                if ((t1 - t0) < best_alloc)
                    best_alloc = t1 - t0;
                if ((t2 - t1) < best_free)
                    best_free = t2 - t1;
            }
            printf("bench alloc %.1f %.1f\n", best_alloc / n * 1e9, best_free / n * 1e9);
        } else if (!strncmp(cmd, "bench:launch:", 13)) {
            int n = atoi(cmd + 13);
            if (n <= 0)
                die("bench:launch:N takes N > 0");
            double best = 1e9;
            for (int round = 0; round < 200; round++) {
                double t0 = now_s();
                for (int j = 0; j < n; j++)
                    api.launch_kernel(NULL, 0, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
                double t = now_s() - t0;
                if (t < best)
                    best = t;
            }
            printf("bench launch %.1f\n", best / n * 1e9);
        } else {
            fprintf(stderr, "probe: unknown command %s\n", cmd);
            return 2;
        }
    }
    return 0;
}
