/* A fake libnvidia-ml.so.1 for the peer benchmark (bench/bench_peer.py).
 *
 * Both exporters under test load NVML the same way, through nvidia-ml-py's ctypes
 * `CDLL("libnvidia-ml.so.1")`; with LD_LIBRARY_PATH pointing at the folder holding this
 * library, both load this one. It answers in C, at no Python cost, so what the benchmark
 * measures is each exporter's own work above the ctypes boundary, never the fake's.
 *
 * Shape from the environment, read at nvmlInit:
 *   FAKE_NVML_GPUS      number of GPUs (default 1)
 *   FAKE_NVML_PROCS     compute processes per GPU (default 8)
 *   FAKE_NVML_PID_FILE  file of whitespace-separated PIDs given to the processes in turn
 *                       (real processes, so /proc lookups succeed for both exporters);
 *                       without it PIDs are 100000 + n.
 * nvmlSystemGetProcessName gives each process a name of its own.
 * Values move a little with time (utilisation, power, energy), as a real GPU's do, so no
 * exporter can skip work because nothing changed. Functions absent here make the binding
 * raise NVMLError_FunctionNotFound, which both exporters treat as "not supported".
 *
 * Build: gcc -O2 -shared -fPIC -o libnvidia-ml.so.1 fake_nvml.c
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
#define OK 0
#define INVALID_ARGUMENT 2
#define NOT_SUPPORTED 3
#define NOT_FOUND 6
#define INSUFFICIENT_SIZE 7
#define MAX_GPUS 64
#define MAX_PIDS 8192

static unsigned ngpus = 1, nprocs = 8, npids = 0;
static unsigned pids[MAX_PIDS];

typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } mem2_t;
typedef struct { unsigned gpu, memory; } util_t;
typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } proc_t;
typedef struct { unsigned pid; unsigned long long ts; unsigned sm, mem, enc, dec; } psample_t;
typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} pci_t;

static unsigned long long now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (unsigned long long)t.tv_sec * 1000000ULL + t.tv_nsec / 1000;
}
static unsigned tick(void) { return (unsigned)(now_us() / 1000000ULL); }

static int gpu_of(nvmlDevice_t h, unsigned *i) {
    unsigned long v = (unsigned long)h;
    if (v < 0x1000 || v >= 0x1000 + ngpus) return 0;
    *i = (unsigned)(v - 0x1000);
    return 1;
}
#define GPU(h) unsigned g; if (!gpu_of(h, &g)) return INVALID_ARGUMENT

static unsigned pid_at(unsigned g, unsigned p) {
    unsigned n = g * nprocs + p;
    return npids ? pids[n % npids] : 100000 + n;
}

static void copy(char *dst, unsigned len, const char *src) {
    if (len == 0) return;
    snprintf(dst, len, "%s", src);
}

nvmlReturn_t nvmlInit_v2(void) {
    const char *s;
    if ((s = getenv("FAKE_NVML_GPUS"))) ngpus = (unsigned)atoi(s);
    if (ngpus > MAX_GPUS) ngpus = MAX_GPUS;
    if ((s = getenv("FAKE_NVML_PROCS"))) nprocs = (unsigned)atoi(s);
    if ((s = getenv("FAKE_NVML_PID_FILE"))) {
        FILE *f = fopen(s, "r");
        if (f) {
            while (npids < MAX_PIDS && fscanf(f, "%u", &pids[npids]) == 1) npids++;
            fclose(f);
        }
    }
    return OK;
}
nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
nvmlReturn_t nvmlInitWithFlags(unsigned flags) { (void)flags; return nvmlInit_v2(); }
nvmlReturn_t nvmlShutdown(void) { return OK; }

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case OK: return "Success";
    case INVALID_ARGUMENT: return "Invalid Argument";
    case NOT_SUPPORTED: return "Not Supported";
    case NOT_FOUND: return "Not Found";
    case INSUFFICIENT_SIZE: return "Insufficient Size";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned len) { copy(v, len, "550.54.15"); return OK; }
nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned len) { copy(v, len, "12.550.54.15"); return OK; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { *v = 12040; return OK; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 12040; return OK; }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { *n = ngpus; return OK; }
nvmlReturn_t nvmlDeviceGetCount(unsigned *n) { *n = ngpus; return OK; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *h) {
    if (i >= ngpus) return INVALID_ARGUMENT;
    *h = (nvmlDevice_t)(unsigned long)(0x1000 + i);
    return OK;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned i, nvmlDevice_t *h) { return nvmlDeviceGetHandleByIndex_v2(i, h); }

static void uuid_of(unsigned g, char *out, unsigned len) {
    char b[96];
    snprintf(b, sizeof b, "GPU-%08x-0000-4000-8000-%012x", 0xfa4e0000u + g, g);
    copy(out, len, b);
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *h) {
    char b[96];
    for (unsigned g = 0; g < ngpus; g++) {
        uuid_of(g, b, sizeof b);
        if (strcmp(b, uuid) == 0) { *h = (nvmlDevice_t)(unsigned long)(0x1000 + g); return OK; }
    }
    return NOT_FOUND;
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t h, unsigned *i) { GPU(h); *i = g; return OK; }
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t h, unsigned *m) { GPU(h); *m = g; return OK; }
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *n, unsigned len) { GPU(h); copy(n, len, "NVIDIA H100 80GB HBM3"); return OK; }
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *u, unsigned len) { GPU(h); uuid_of(g, u, len); return OK; }
nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t h, char *s, unsigned len) {
    GPU(h); char b[32]; snprintf(b, sizeof b, "16501234%05u", g); copy(s, len, b); return OK;
}
nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t h, char *s, unsigned len) { GPU(h); copy(s, len, "96.00.74.00.01"); return OK; }
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t h, pci_t *p) {
    GPU(h);
    memset(p, 0, sizeof *p);
    p->bus = 0x17 + g; p->pciDeviceId = 0x233010de; p->pciSubSystemId = 0x16c110de;
    snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", p->bus);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:%02X:00.0", p->bus);
    return OK;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t h, pci_t *p) { return nvmlDeviceGetPciInfo_v3(h, p); }
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t h, pci_t *p) { return nvmlDeviceGetPciInfo_v3(h, p); }

#define TOTAL 85899345920ULL
static unsigned long long used_of(unsigned g) { return 32212254720ULL + (unsigned long long)((tick() + g) % 16) * 1048576ULL; }
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, mem_t *m) {
    GPU(h); m->total = TOTAL; m->used = used_of(g); m->free = TOTAL - m->used; return OK;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, mem2_t *m) {
    GPU(h); m->total = TOTAL; m->reserved = 1073741824ULL; m->used = used_of(g);
    m->free = TOTAL - m->used - m->reserved; return OK;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, util_t *u) {
    GPU(h); u->gpu = 60 + (tick() + g) % 40; u->memory = 30 + (tick() + g) % 20; return OK;
}
nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t h, unsigned *u, unsigned *p) { GPU(h); *u = 3; *p = 167000; return OK; }
nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t h, unsigned *u, unsigned *p) { GPU(h); *u = 4; *p = 167000; return OK; }
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t h, int sensor, unsigned *t) { GPU(h); (void)sensor; *t = 60 + (tick() + g) % 10; return OK; }
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t h, unsigned *p) { GPU(h); *p = 300000 + ((tick() + g) % 100) * 1000; return OK; }
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t h, unsigned *p) { GPU(h); *p = 700000; return OK; }
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t h, unsigned *p) { GPU(h); *p = 700000; return OK; }
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t h, unsigned long long *e) {
    GPU(h); *e = 9876543210ULL + (now_us() / 1000ULL) % 1000000000ULL * 35ULL / 100ULL; return OK;
}
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t h, int type, unsigned *c) {
    GPU(h); *c = type == 2 ? 2619 : 1980; return OK;
}
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t h, int type, unsigned *c) { return nvmlDeviceGetClockInfo(h, type, c); }
nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t h, unsigned *f) { GPU(h); *f = 55; return OK; }
nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t h, unsigned *p) { GPU(h); *p = 0; return OK; }
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t h, unsigned long long *r) { GPU(h); *r = 0x1; return OK; }
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t h, unsigned long long *r) { GPU(h); *r = 0x1; return OK; }
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t h, int counter, unsigned *v) { GPU(h); *v = 1000 + counter; return OK; }
nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t h, unsigned *m) { GPU(h); *m = 1; return OK; }
nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t h, unsigned *m) { GPU(h); *m = 0; return OK; }
nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t h, unsigned *m) { GPU(h); *m = 0; return OK; }
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t h, int *maj, int *min) { GPU(h); *maj = 9; *min = 0; return OK; }
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t h, unsigned *c, unsigned *p) { GPU(h); (void)c; (void)p; return NOT_SUPPORTED; }

static nvmlReturn_t procs(nvmlDevice_t h, unsigned *count, proc_t *out, unsigned n) {
    GPU(h);
    if (out == NULL || *count < n) { *count = n; return n ? INSUFFICIENT_SIZE : OK; }
    for (unsigned p = 0; p < n; p++) {
        out[p].pid = pid_at(g, p);
        out[p].used = (unsigned long long)(256 + 16 * p) * 1048576ULL;
        out[p].gi = 0xFFFFFFFFu; out[p].ci = 0xFFFFFFFFu;
    }
    *count = n;
    return OK;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned *c, proc_t *o) { return procs(h, c, o, nprocs); }
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t h, unsigned *c, proc_t *o) { return procs(h, c, o, nprocs); }
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t h, unsigned *c, proc_t *o) { return procs(h, c, o, 0); }
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t h, unsigned *c, proc_t *o) { return procs(h, c, o, 0); }
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t h, unsigned *c, proc_t *o) { return procs(h, c, o, 0); }
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t h, unsigned *c, proc_t *o) { return procs(h, c, o, 0); }

/* Each process its own name (a job of its own), so every process is a series of its own
 * in gpu-audit's identity-keyed families, as on a node shared by many jobs. */
nvmlReturn_t nvmlSystemGetProcessName(unsigned pid, char *name, unsigned len) {
    for (unsigned n = 0; n < ngpus * nprocs; n++) {
        unsigned g = n / (nprocs ? nprocs : 1), p = n % (nprocs ? nprocs : 1);
        if (pid_at(g, p) == pid) {
            char b[64];
            snprintf(b, sizeof b, "python3 /srv/job%u/train.py", n);
            copy(name, len, b);
            return OK;
        }
    }
    return NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t h, psample_t *out, unsigned *count,
                                             unsigned long long last_seen) {
    GPU(h);
    unsigned long long ts = now_us();
    (void)last_seen;
    if (out == NULL || *count < nprocs) { *count = nprocs; return nprocs ? INSUFFICIENT_SIZE : NOT_FOUND; }
    for (unsigned p = 0; p < nprocs; p++) {
        out[p].pid = pid_at(g, p);
        out[p].ts = ts - 1000;
        out[p].sm = (tick() + p) % 100 / (nprocs > 1 ? 2 : 1);
        out[p].mem = (tick() + p) % 50;
        out[p].enc = 0; out[p].dec = 0;
    }
    *count = nprocs;
    return OK;
}
