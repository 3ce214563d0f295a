/*
 * vt.h - the small kit shared by openvia's C conformance programs.
 *
 * Checks print file:line, the expression, the expected and the actual value,
 * then end the process with status 1.  Helpers open a NIC, build network
 * addresses with discriminators, register aligned buffers and descriptor
 * pools, fork a server child and collect its exit status, and fill and verify
 * data patterns.
 *
 * Two-process programs fork before their first Vip* call: the child is the
 * server, the parent the client.  The two processes synchronise over a
 * socket pair (the "control channel"), never through VIA itself unless the
 * test is about VIA delivering the data.
 *
 * Include this header first: it selects the GNU feature set.
 */
#ifndef OPENVIA_VT_H
#define OPENVIA_VT_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <vipl.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The provider limits that the contract promises (notes/contract.md). */
#define VT_DEV              "/dev/via_lo"
#define VT_MAX_TRANSFER     4194304UL
#define VT_MAX_DESC_PER_Q   1024
#define VT_MAX_SEGS         32
#define VT_MAX_DISC         64

/* How long a helper waits for something that must happen (ms). */
#define VT_WAIT_MS 20000UL

/* ------------------------------------------------------------------ */
/* Reporting                                                            */
/* ------------------------------------------------------------------ */

static const char *vt_role = "main";
static pid_t vt_root_pid;

/* Call first in main(): unbuffered output (safe across fork), and the
 * process id that makes this run's discriminators unique. */
static inline void vt_init(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    setvbuf(stderr, NULL, _IONBF, 0);
    vt_root_pid = getpid();
    signal(SIGPIPE, SIG_IGN);
}

__attribute__((noreturn, format(printf, 3, 4)))
static inline void vt_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "FAIL [%s pid %d] %s:%d: ", vt_role, (int)getpid(), file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(NULL);
    _exit(1);
}

#define VT_FAIL(...) vt_fail(__FILE__, __LINE__, __VA_ARGS__)

static inline const char *vt_ret_name(VIP_RETURN r)
{
    static const char *const names[] = {
        "VIP_SUCCESS", "VIP_NOT_DONE", "VIP_INVALID_PARAMETER", "VIP_ERROR_RESOURCE",
        "VIP_TIMEOUT", "VIP_REJECT", "VIP_INVALID_RELIABILITY_LEVEL", "VIP_INVALID_MTU",
        "VIP_INVALID_QOS", "VIP_INVALID_PTAG", "VIP_INVALID_RDMAREAD", "VIP_DESCRIPTOR_ERROR",
        "VIP_INVALID_STATE", "VIP_ERROR_NAMESERVICE", "VIP_NO_MATCH", "VIP_NOT_REACHABLE",
        "VIP_ERROR_NOT_SUPPORTED",
    };
    if ((unsigned)r < sizeof names / sizeof names[0])
        return names[r];
    return "(not a VIP_RETURN)";
}

static inline const char *vt_state_name(VIP_VI_STATE s)
{
    switch (s) {
    case VIP_STATE_IDLE: return "VIP_STATE_IDLE";
    case VIP_STATE_CONNECTED: return "VIP_STATE_CONNECTED";
    case VIP_STATE_CONNECT_PENDING: return "VIP_STATE_CONNECT_PENDING";
    case VIP_STATE_ERROR: return "VIP_STATE_ERROR";
    }
    return "(not a VIP_VI_STATE)";
}

static inline const char *vt_error_name(VIP_ERROR_CODE c)
{
    static const char *const names[] = {
        "VIP_ERROR_POST_DESC", "VIP_ERROR_CONN_LOST", "VIP_ERROR_RECVQ_EMPTY",
        "VIP_ERROR_VI_OVERRUN", "VIP_ERROR_RDMAW_PROT", "VIP_ERROR_RDMAW_DATA",
        "VIP_ERROR_RDMAW_ABORT", "VIP_ERROR_RDMAR_PROT", "VIP_ERROR_COMP_PROT",
        "VIP_ERROR_RDMA_TRANSPORT", "VIP_ERROR_CATASTROPHIC",
    };
    if ((unsigned)c < sizeof names / sizeof names[0])
        return names[c];
    return "(not a VIP_ERROR_CODE)";
}

/* Status bits spelled out, e.g. "0x00090001 DONE|OP_RECEIVE|IMMEDIATE". */
static inline const char *vt_status_str(VIP_UINT32 s, char *buf, size_t n)
{
    static const struct { VIP_UINT32 bit; const char *name; } bits[] = {
        {VIP_STATUS_DONE, "DONE"},
        {VIP_STATUS_FORMAT_ERROR, "FORMAT_ERROR"},
        {VIP_STATUS_PROTECTION_ERROR, "PROTECTION_ERROR"},
        {VIP_STATUS_LENGTH_ERROR, "LENGTH_ERROR"},
        {VIP_STATUS_PARTIAL_ERROR, "PARTIAL_ERROR"},
        {VIP_STATUS_DESC_FLUSHED_ERROR, "DESC_FLUSHED_ERROR"},
        {VIP_STATUS_TRANSPORT_ERROR, "TRANSPORT_ERROR"},
        {VIP_STATUS_RDMA_PROT_ERROR, "RDMA_PROT_ERROR"},
        {VIP_STATUS_REMOTE_DESC_ERROR, "REMOTE_DESC_ERROR"},
        {VIP_STATUS_IMMEDIATE, "IMMEDIATE"},
    };
    static const char *const ops[] = {
        "OP_SEND", "OP_RECEIVE", "OP_RDMA_WRITE", "OP_REMOTE_RDMA_WRITE",
        "OP_RDMA_READ", "OP_5?", "OP_6?", "OP_7?",
    };
    size_t used = (size_t)snprintf(buf, n, "0x%08x ", (unsigned)s);
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++)
        if ((s & bits[i].bit) && used < n)
            used += (size_t)snprintf(buf + used, n - used, "%s|", bits[i].name);
    if (used < n)
        used += (size_t)snprintf(buf + used, n - used, "%s",
                                 ops[(s & VIP_STATUS_OP_MASK) >> 16]);
    if ((s & VIP_STATUS_RESERVED) && used < n)
        snprintf(buf + used, n - used, "|RESERVED(0x%x)", (unsigned)(s & VIP_STATUS_RESERVED));
    return buf;
}

/* A condition. */
#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond))                                                           \
            VT_FAIL("check failed: %s", #cond);                                \
    } while (0)

/* Two integers. */
#define CHECK_EQ(expected, actual)                                             \
    do {                                                                       \
        unsigned long long e_ = (unsigned long long)(expected);                \
        unsigned long long a_ = (unsigned long long)(actual);                  \
        if (e_ != a_)                                                          \
            VT_FAIL("%s == %s: expected %llu (0x%llx), got %llu (0x%llx)",     \
                    #actual, #expected, e_, e_, a_, a_);                       \
    } while (0)

/* Two pointers. */
#define CHECK_PTR(expected, actual)                                            \
    do {                                                                       \
        const void *e_ = (const void *)(expected);                             \
        const void *a_ = (const void *)(actual);                               \
        if (e_ != a_)                                                          \
            VT_FAIL("%s == %s: expected %p, got %p", #actual, #expected, e_, a_); \
    } while (0)

/* The return code of a VIPL call. */
#define CHECK_RET(expected, call)                                              \
    do {                                                                       \
        VIP_RETURN e_ = (expected);                                            \
        VIP_RETURN a_ = (call);                                                \
        if (a_ != e_)                                                          \
            VT_FAIL("%s: expected %s, got %s (%d)", #call, vt_ret_name(e_),    \
                    vt_ret_name(a_), (int)a_);                                 \
    } while (0)

#define CHECK_OK(call) CHECK_RET(VIP_SUCCESS, call)

/* The whole Status word of a completed descriptor. */
#define CHECK_STATUS(expected, desc)                                           \
    do {                                                                       \
        VIP_UINT32 e_ = (expected);                                            \
        VIP_UINT32 a_ = (desc)->CS.Status;                                     \
        if (a_ != e_) {                                                        \
            char eb_[160], ab_[160];                                           \
            VT_FAIL("Status of %s: expected %s, got %s", #desc,                \
                    vt_status_str(e_, eb_, sizeof eb_),                        \
                    vt_status_str(a_, ab_, sizeof ab_));                       \
        }                                                                      \
    } while (0)

/* The done and error bits of a completed descriptor (the operation bits of
 * a failed descriptor are not checked). */
#define VT_ERRBITS (VIP_STATUS_DONE | VIP_STATUS_ERROR_MASK)
#define CHECK_ERRBITS(expected, desc)                                          \
    do {                                                                       \
        VIP_UINT32 e_ = (expected);                                            \
        VIP_UINT32 a_ = (desc)->CS.Status;                                     \
        if ((a_ & VT_ERRBITS) != e_) {                                         \
            char eb_[160], ab_[160];                                           \
            VT_FAIL("error bits of %s: expected %s, got %s", #desc,            \
                    vt_status_str(e_, eb_, sizeof eb_),                        \
                    vt_status_str(a_, ab_, sizeof ab_));                       \
        }                                                                      \
    } while (0)

/* The send of a message longer than the peer's receive buffer, by level
 * (notes/contract.md): unreliable DONE|OP_SEND; reliable delivery DONE;
 * reliable reception DONE|REMOTE_DESC_ERROR. */
#define CHECK_TOO_LONG_SEND(level, desc)                                       \
    do {                                                                       \
        switch (level) {                                                       \
        case VIP_SERVICE_UNRELIABLE:                                           \
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, desc);          \
            break;                                                             \
        case VIP_SERVICE_RELIABLE_DELIVERY:                                    \
            CHECK((desc)->CS.Status & VIP_STATUS_DONE);                        \
            break;                                                             \
        default:                                                               \
            CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_REMOTE_DESC_ERROR, desc); \
            break;                                                             \
        }                                                                      \
    } while (0)

/* ------------------------------------------------------------------ */
/* Time                                                                 */
/* ------------------------------------------------------------------ */

static inline double vt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline void vt_sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ------------------------------------------------------------------ */
/* Data patterns                                                        */
/* ------------------------------------------------------------------ */

static inline VIP_UINT8 vt_pat(uint32_t seed, size_t i)
{
    return (VIP_UINT8)(seed * 131u + (uint32_t)i * 7u + (uint32_t)(i >> 8) * 13u +
                       (uint32_t)(i >> 16) + (seed >> 8));
}

static inline void vt_fill(void *p, size_t n, uint32_t seed)
{
    VIP_UINT8 *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = vt_pat(seed, i);
}

/* Offset of the first byte that differs from the pattern, or (size_t)-1. */
static inline size_t vt_mismatch(const void *p, size_t n, uint32_t seed)
{
    const VIP_UINT8 *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != vt_pat(seed, i))
            return i;
    return (size_t)-1;
}

#define CHECK_PATTERN(buf, len, seed)                                          \
    do {                                                                       \
        const VIP_UINT8 *pb_ = (const VIP_UINT8 *)(buf);                       \
        size_t pn_ = (size_t)(len);                                            \
        uint32_t ps_ = (uint32_t)(seed);                                       \
        size_t at_ = vt_mismatch(pb_, pn_, ps_);                               \
        if (at_ != (size_t)-1)                                                 \
            VT_FAIL("data of %s (%zu bytes, seed %u) differs at offset %zu: "  \
                    "expected 0x%02x, got 0x%02x", #buf, pn_, (unsigned)ps_,   \
                    at_, vt_pat(ps_, at_), pb_[at_]);                          \
    } while (0)

/* A small deterministic generator (xorshift32), for "random" choices that
 * both processes can repeat. */
static inline uint32_t vt_rand(uint32_t *state)
{
    uint32_t x = *state ? *state : 0x9e3779b9u;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *state = x;
}

/* ------------------------------------------------------------------ */
/* Processes and the control channel                                    */
/* ------------------------------------------------------------------ */

typedef struct {
    pid_t pid;
    int fd; /* the parent's end of the control channel */
} vt_child;

typedef void (*vt_child_fn)(int fd, void *arg);

/* Fork a child that runs fn(fd, arg) and exits 0 when fn returns.  The child
 * dies with its parent. */
static inline vt_child vt_spawn(const char *role, vt_child_fn fn, void *arg)
{
    int sv[2];
    pid_t parent = getpid();
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        VT_FAIL("socketpair: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        VT_FAIL("fork: %s", strerror(errno));
    if (pid == 0) {
        close(sv[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        vt_role = role;
        fn(sv[1], arg);
        close(sv[1]);
        exit(0);
    }
    close(sv[1]);
    return (vt_child){pid, sv[0]};
}

static inline const char *vt_describe_status(int st, char *buf, size_t n)
{
    if (WIFEXITED(st))
        snprintf(buf, n, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, n, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, n, "wait status 0x%x", st);
    return buf;
}

/* Close the control channel and wait for the child; it must exit 0. */
#define vt_join(c) vt_join_at(__FILE__, __LINE__, (c))
static inline void vt_join_at(const char *file, int line, vt_child *c)
{
    int st;
    char buf[96];
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    while (waitpid(c->pid, &st, 0) < 0)
        if (errno != EINTR)
            vt_fail(file, line, "waitpid: %s", strerror(errno));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        vt_fail(file, line, "child %d %s", (int)c->pid, vt_describe_status(st, buf, sizeof buf));
}

static inline void vt_put(int fd, const void *p, size_t n)
{
    const char *b = p;
    while (n > 0) {
        ssize_t k = write(fd, b, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            VT_FAIL("control channel write: %s", strerror(errno));
        b += k;
        n -= (size_t)k;
    }
}

static inline void vt_get(int fd, void *p, size_t n)
{
    char *b = p;
    while (n > 0) {
        ssize_t k = read(fd, b, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k == 0)
            VT_FAIL("control channel: the other process went away");
        if (k < 0)
            VT_FAIL("control channel read: %s", strerror(errno));
        b += k;
        n -= (size_t)k;
    }
}

static inline void vt_put_u64(int fd, uint64_t v) { vt_put(fd, &v, sizeof v); }

static inline uint64_t vt_get_u64(int fd)
{
    uint64_t v;
    vt_get(fd, &v, sizeof v);
    return v;
}

/* Both processes reach the same point; tag catches a protocol mix-up. */
static inline void vt_sync(int fd, uint64_t tag)
{
    vt_put_u64(fd, tag);
    uint64_t got = vt_get_u64(fd);
    if (got != tag)
        VT_FAIL("control channel out of step: expected sync %llu, got %llu",
                (unsigned long long)tag, (unsigned long long)got);
}

/* ------------------------------------------------------------------ */
/* NICs and addresses                                                   */
/* ------------------------------------------------------------------ */

static inline VIP_NIC_HANDLE vt_open_nic(const char *dev)
{
    VIP_NIC_HANDLE nic = NULL;
    CHECK_OK(VipOpenNic(dev, &nic));
    CHECK(nic != NULL);
    return nic;
}

/* A discriminator unique to this run of this program: "<name>.<pid>"
 * (name is cut at 47 characters; out needs 64 bytes). */
__attribute__((format(printf, 3, 4)))
static inline void vt_disc(char *out, size_t n, const char *fmt, ...)
{
    char name[48];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    snprintf(out, n, "%.47s.%d", name, (int)vt_root_pid);
}

/* A network address: host address bytes, then discriminator bytes. */
static inline VIP_NET_ADDRESS *vt_addr_new(const VIP_UINT8 *host, VIP_UINT16 hostlen,
                                           const void *disc, VIP_UINT16 disclen)
{
    VIP_NET_ADDRESS *a = calloc(1, sizeof *a + hostlen + disclen);
    CHECK(a != NULL);
    a->HostAddressLen = hostlen;
    a->DiscriminatorLen = disclen;
    if (hostlen)
        memcpy(a->HostAddress, host, hostlen);
    if (disclen)
        memcpy(a->HostAddress + hostlen, disc, disclen);
    return a;
}

/* A zeroed buffer large enough to receive any address from the provider. */
static inline VIP_NET_ADDRESS *vt_addr_buf(void)
{
    VIP_NET_ADDRESS *a = calloc(1, sizeof *a + 16 + 256);
    CHECK(a != NULL);
    return a;
}

/* The NIC's own host address with the given discriminator string. */
static inline VIP_NET_ADDRESS *vt_addr_local(VIP_NIC_HANDLE nic, const char *disc)
{
    VIP_NIC_ATTRIBUTES at;
    memset(&at, 0, sizeof at);
    CHECK_OK(VipQueryNic(nic, &at));
    CHECK(at.NicAddressLen > 0 && at.LocalNicAddress != NULL);
    return vt_addr_new(at.LocalNicAddress, at.NicAddressLen, disc, (VIP_UINT16)strlen(disc));
}

static inline int vt_addr_disc_is(const VIP_NET_ADDRESS *a, const char *disc)
{
    size_t n = strlen(disc);
    return a->DiscriminatorLen == n && memcmp(a->HostAddress + a->HostAddressLen, disc, n) == 0;
}

static const VIP_UINT8 vt_loopback[4] = {127, 0, 0, 1};

/* ------------------------------------------------------------------ */
/* Registered memory and descriptors                                    */
/* ------------------------------------------------------------------ */

typedef struct {
    VIP_NIC_HANDLE nic;
    VIP_UINT8 *base;
    size_t size;
    VIP_MEM_HANDLE mh;
} vt_mem;

static inline void *vt_alloc(size_t size)
{
    size_t n = (size + 4095) & ~(size_t)4095;
    void *p = aligned_alloc(4096, n ? n : 4096);
    CHECK(p != NULL);
    memset(p, 0, n ? n : 4096);
    return p;
}

static inline void vt_mem_reg(vt_mem *m, VIP_NIC_HANDLE nic, VIP_PROTECTION_HANDLE ptag,
                              size_t size, VIP_BOOLEAN rdma_write, VIP_BOOLEAN rdma_read)
{
    VIP_MEM_ATTRIBUTES ma = {ptag, rdma_write, rdma_read};
    m->nic = nic;
    m->size = (size + 4095) & ~(size_t)4095;
    m->base = vt_alloc(m->size);
    m->mh = 0;
    CHECK_OK(VipRegisterMem(nic, m->base, m->size, &ma, &m->mh));
    CHECK(m->mh != 0);
}

static inline void vt_mem_dereg(vt_mem *m)
{
    CHECK_OK(VipDeregisterMem(m->nic, m->base, m->mh));
    free(m->base);
    m->base = NULL;
}

/* A registered pool of 64-byte aligned descriptors with room for maxseg
 * segments each. */
typedef struct {
    vt_mem mem;
    size_t stride;
    size_t count;
} vt_dpool;

static inline void vt_dpool_init(vt_dpool *p, VIP_NIC_HANDLE nic, VIP_PROTECTION_HANDLE ptag,
                                 size_t count, unsigned maxseg)
{
    size_t bytes = sizeof(VIP_CONTROL_SEGMENT) + (size_t)maxseg * sizeof(VIP_DESCRIPTOR_SEGMENT);
    p->stride = (bytes + VIP_DESCRIPTOR_ALIGNMENT - 1) & ~(size_t)(VIP_DESCRIPTOR_ALIGNMENT - 1);
    p->count = count;
    vt_mem_reg(&p->mem, nic, ptag, p->stride * count, VIP_FALSE, VIP_FALSE);
}

static inline VIP_DESCRIPTOR *vt_dpool_get(vt_dpool *p, size_t i)
{
    if (i >= p->count)
        VT_FAIL("descriptor %zu of a pool of %zu", i, p->count);
    return (VIP_DESCRIPTOR *)(void *)(p->mem.base + i * p->stride);
}

static inline void vt_dpool_fini(vt_dpool *p) { vt_mem_dereg(&p->mem); }

/* Segment i of a descriptor (descriptors may hold more than DS[2]). */
static inline VIP_DESCRIPTOR_SEGMENT *vt_seg(VIP_DESCRIPTOR *d, unsigned i)
{
    return (VIP_DESCRIPTOR_SEGMENT *)(void *)((char *)d + sizeof(VIP_CONTROL_SEGMENT)) + i;
}

static inline void vt_desc_clear(VIP_DESCRIPTOR *d, unsigned nseg)
{
    memset(d, 0, sizeof(VIP_CONTROL_SEGMENT) + (size_t)nseg * sizeof(VIP_DESCRIPTOR_SEGMENT));
}

/* Data segments first..first+nseg-1 cover len bytes at buf, as evenly as
 * possible (the first len % nseg segments get one byte more). */
static inline void vt_desc_split(VIP_DESCRIPTOR *d, unsigned first, void *buf, VIP_MEM_HANDLE mh,
                                 size_t len, unsigned nseg)
{
    VIP_UINT8 *p = buf;
    size_t piece = len / nseg, extra = len % nseg;
    for (unsigned i = 0; i < nseg; i++) {
        size_t n = piece + (i < extra ? 1 : 0);
        VIP_DESCRIPTOR_SEGMENT *s = vt_seg(d, first + i);
        s->Local.Data.Address = p;
        s->Local.Handle = mh;
        s->Local.Length = (VIP_UINT32)n;
        p += n;
    }
}

/* A send of len bytes at buf in nseg segments. */
static inline void vt_desc_send(VIP_DESCRIPTOR *d, VIP_UINT16 control, VIP_UINT32 imm,
                                void *buf, VIP_MEM_HANDLE mh, size_t len, unsigned nseg)
{
    vt_desc_clear(d, nseg);
    d->CS.Control = control;
    d->CS.SegCount = (VIP_UINT16)nseg;
    d->CS.ImmediateData = imm;
    d->CS.Length = (VIP_UINT32)len;
    vt_desc_split(d, 0, buf, mh, len, nseg);
}

/* A receive with room for len bytes at buf in nseg segments. */
static inline void vt_desc_recv(VIP_DESCRIPTOR *d, void *buf, VIP_MEM_HANDLE mh, size_t len,
                                unsigned nseg)
{
    vt_desc_clear(d, nseg);
    d->CS.SegCount = (VIP_UINT16)nseg;
    vt_desc_split(d, 0, buf, mh, len, nseg);
}

/* An RDMA write or read: the address segment (remote buffer), then nseg
 * local data segments covering len bytes at buf. */
static inline void vt_desc_rdma(VIP_DESCRIPTOR *d, VIP_UINT16 control, VIP_UINT32 imm,
                                VIP_UINT64 raddr, VIP_MEM_HANDLE rhandle,
                                void *buf, VIP_MEM_HANDLE mh, size_t len, unsigned nseg)
{
    vt_desc_clear(d, nseg + 1);
    d->CS.Control = control;
    d->CS.SegCount = (VIP_UINT16)(nseg + 1);
    d->CS.ImmediateData = imm;
    d->CS.Length = (VIP_UINT32)len;
    vt_seg(d, 0)->Remote.Data.AddressBits = raddr;
    vt_seg(d, 0)->Remote.Handle = rhandle;
    vt_desc_split(d, 1, buf, mh, len, nseg);
}

/* ------------------------------------------------------------------ */
/* VIs and completions                                                  */
/* ------------------------------------------------------------------ */

static inline VIP_VI_ATTRIBUTES vt_vi_attrs(VIP_RELIABILITY_LEVEL level, VIP_PROTECTION_HANDLE ptag,
                                            VIP_ULONG mtu, VIP_BOOLEAN rdma_write,
                                            VIP_BOOLEAN rdma_read)
{
    VIP_VI_ATTRIBUTES a;
    memset(&a, 0, sizeof a);
    a.ReliabilityLevel = level;
    a.MaxTransferSize = mtu;
    a.QoS = NULL;
    a.Ptag = ptag;
    a.EnableRdmaWrite = rdma_write;
    a.EnableRdmaRead = rdma_read;
    return a;
}

static inline const char *vt_level_name(VIP_RELIABILITY_LEVEL l)
{
    switch (l) {
    case VIP_SERVICE_UNRELIABLE: return "unreliable";
    case VIP_SERVICE_RELIABLE_DELIVERY: return "reliable-delivery";
    case VIP_SERVICE_RELIABLE_RECEPTION: return "reliable-reception";
    }
    return "(bad level)";
}

static inline VIP_VI_STATE vt_vi_state(VIP_VI_HANDLE vi)
{
    VIP_VI_STATE st = (VIP_VI_STATE)-1;
    VIP_VI_ATTRIBUTES at;
    VIP_BOOLEAN se, re;
    CHECK_OK(VipQueryVi(vi, &st, &at, &se, &re));
    return st;
}

#define CHECK_STATE(expected, vi)                                              \
    do {                                                                       \
        VIP_VI_STATE e_ = (expected), a_ = vt_vi_state(vi);                    \
        if (a_ != e_)                                                          \
            VT_FAIL("state of %s: expected %s, got %s", #vi, vt_state_name(e_), \
                    vt_state_name(a_));                                        \
    } while (0)

/* Wait (polling VipQueryVi) until the VI reaches a state. */
#define CHECK_STATE_SOON(expected, vi)                                         \
    do {                                                                       \
        VIP_VI_STATE e_ = (expected), a_;                                      \
        double until_ = vt_now_ms() + (double)VT_WAIT_MS;                      \
        while ((a_ = vt_vi_state(vi)) != e_ && vt_now_ms() < until_)           \
            vt_sleep_ms(1);                                                    \
        if (a_ != e_)                                                          \
            VT_FAIL("state of %s after %lu ms: expected %s, got %s", #vi,      \
                    VT_WAIT_MS, vt_state_name(e_), vt_state_name(a_));         \
    } while (0)

/* The next completed descriptor, by polling *Done (which must answer
 * VIP_NOT_DONE until then) or by *Wait. */
#define vt_send_done(vi) vt_done_at(__FILE__, __LINE__, (vi), 0, 0)
#define vt_recv_done(vi) vt_done_at(__FILE__, __LINE__, (vi), 1, 0)
#define vt_send_wait(vi) vt_done_at(__FILE__, __LINE__, (vi), 0, 1)
#define vt_recv_wait(vi) vt_done_at(__FILE__, __LINE__, (vi), 1, 1)

static inline VIP_DESCRIPTOR *vt_done_at(const char *file, int line, VIP_VI_HANDLE vi,
                                         int recv, int wait)
{
    VIP_DESCRIPTOR *d = NULL;
    VIP_RETURN r;
    const char *what = recv ? (wait ? "VipRecvWait" : "VipRecvDone")
                            : (wait ? "VipSendWait" : "VipSendDone");
    if (wait) {
        r = recv ? VipRecvWait(vi, VT_WAIT_MS, &d) : VipSendWait(vi, VT_WAIT_MS, &d);
    } else {
        double until = vt_now_ms() + (double)VT_WAIT_MS;
        unsigned spins = 0;
        do {
            r = recv ? VipRecvDone(vi, &d) : VipSendDone(vi, &d);
            if (r != VIP_NOT_DONE)
                break;
            if (++spins > 1000)
                sched_yield();
        } while (vt_now_ms() < until);
    }
    if (r != VIP_SUCCESS)
        vt_fail(file, line, "%s: expected VIP_SUCCESS, got %s", what, vt_ret_name(r));
    if (d == NULL)
        vt_fail(file, line, "%s returned VIP_SUCCESS and a NULL descriptor", what);
    return d;
}

/* ------------------------------------------------------------------ */
/* Asynchronous errors                                                  */
/* ------------------------------------------------------------------ */

#define VT_ERRLOG_MAX 64

/* Records what the provider reports through VipErrorCallback. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
    VIP_ERROR_DESCRIPTOR e[VT_ERRLOG_MAX];
} vt_errlog;

static inline void vt_errlog_init(vt_errlog *l)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, &ca);
    pthread_condattr_destroy(&ca);
    l->n = 0;
}

static inline void vt_errlog_handler(VIP_PVOID ctx, VIP_ERROR_DESCRIPTOR *ed)
{
    vt_errlog *l = ctx;
    pthread_mutex_lock(&l->mu);
    if (l->n < VT_ERRLOG_MAX)
        l->e[l->n++] = *ed;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

static inline void vt_errlog_clear(vt_errlog *l)
{
    pthread_mutex_lock(&l->mu);
    l->n = 0;
    pthread_mutex_unlock(&l->mu);
}

static inline int vt_errlog_count_locked(vt_errlog *l, VIP_ERROR_CODE code, VIP_VI_HANDLE vi)
{
    int c = 0;
    for (int i = 0; i < l->n; i++)
        if (l->e[i].ErrorCode == code && (vi == NULL || l->e[i].ViHandle == vi))
            c++;
    return c;
}

/* Wait until the log holds a report of code for vi (any VI if vi is NULL). */
static inline int vt_errlog_wait(vt_errlog *l, VIP_ERROR_CODE code, VIP_VI_HANDLE vi,
                                 unsigned long ms)
{
    struct timespec dl;
    int found;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += (time_t)(ms / 1000);
    dl.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&l->mu);
    while (!(found = vt_errlog_count_locked(l, code, vi)))
        if (pthread_cond_timedwait(&l->cv, &l->mu, &dl) == ETIMEDOUT) {
            found = vt_errlog_count_locked(l, code, vi);
            break;
        }
    pthread_mutex_unlock(&l->mu);
    return found;
}

#define CHECK_ERROR_REPORTED(log, code, vi)                                    \
    do {                                                                       \
        if (!vt_errlog_wait((log), (code), (vi), VT_WAIT_MS)) {                \
            char seen_[512] = "";                                              \
            size_t u_ = 0;                                                     \
            pthread_mutex_lock(&(log)->mu);                                    \
            for (int i_ = 0; i_ < (log)->n && u_ < sizeof seen_; i_++)         \
                u_ += (size_t)snprintf(seen_ + u_, sizeof seen_ - u_, " %s(vi %p)", \
                                       vt_error_name((log)->e[i_].ErrorCode),  \
                                       (log)->e[i_].ViHandle);                 \
            pthread_mutex_unlock(&(log)->mu);                                  \
            VT_FAIL("no %s reported for %s (%p) within %lu ms; reported:%s",   \
                    #code, #vi, (void *)(vi), VT_WAIT_MS, seen_[0] ? seen_ : " nothing"); \
        }                                                                      \
    } while (0)

/* ------------------------------------------------------------------ */
/* One end of a connection                                              */
/* ------------------------------------------------------------------ */

typedef struct {
    VIP_RELIABILITY_LEVEL level;
    VIP_ULONG mtu;           /* 0: VT_MAX_TRANSFER */
    VIP_BOOLEAN rdma_write;  /* on the VI and the data buffer */
    VIP_BOOLEAN rdma_read;
    size_t buf_size;         /* registered data buffer; 0: 1 MiB */
    size_t ndesc;            /* descriptors in the pool; 0: 64 */
    unsigned maxseg;         /* segments per descriptor; 0: 2 */
} vt_conf;

typedef struct {
    const vt_conf *conf;
    int fd;      /* control channel to the other process */
    int server;
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag;
    VIP_VI_HANDLE vi;
    vt_mem buf;
    vt_dpool descs;
    vt_errlog errs;
} vt_end;

/* NIC, error log as error callback, ptag, data buffer, descriptors, VI. */
static inline void vt_end_open(vt_end *e, const vt_conf *c, int fd, int server)
{
    memset(e, 0, sizeof *e);
    e->conf = c;
    e->fd = fd;
    e->server = server;
    e->nic = vt_open_nic(VT_DEV);
    vt_errlog_init(&e->errs);
    CHECK_OK(VipErrorCallback(e->nic, &e->errs, vt_errlog_handler));
    CHECK_OK(VipCreatePtag(e->nic, &e->ptag));
    vt_mem_reg(&e->buf, e->nic, e->ptag, c->buf_size ? c->buf_size : (1u << 20),
               c->rdma_write, c->rdma_read);
    vt_dpool_init(&e->descs, e->nic, e->ptag, c->ndesc ? c->ndesc : 64,
                  c->maxseg ? c->maxseg : 2);
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(c->level, e->ptag, c->mtu ? c->mtu : VT_MAX_TRANSFER,
                                       c->rdma_write, c->rdma_read);
    CHECK_OK(VipCreateVi(e->nic, &va, NULL, NULL, &e->vi));
}

/* Server: wait for the request on disc and accept it. */
static inline void vt_accept(VIP_NIC_HANDLE nic, VIP_VI_HANDLE vi, const char *disc)
{
    VIP_NET_ADDRESS *local = vt_addr_local(nic, disc);
    VIP_NET_ADDRESS *remote = vt_addr_buf();
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn = NULL;
    CHECK_OK(VipConnectWait(nic, local, VT_WAIT_MS, remote, &ra, &conn));
    CHECK(conn != NULL);
    CHECK_OK(VipConnectAccept(conn, vi));
    free(local);
    free(remote);
}

/* Client: connect to disc on this host. */
static inline void vt_connect(VIP_NIC_HANDLE nic, VIP_VI_HANDLE vi, const char *disc)
{
    char cdisc[VT_MAX_DISC + 8];
    snprintf(cdisc, sizeof cdisc, "%.48s/c", disc);
    VIP_NET_ADDRESS *local = vt_addr_local(nic, cdisc);
    VIP_NET_ADDRESS *remote = vt_addr_local(nic, disc);
    VIP_VI_ATTRIBUTES ra;
    CHECK_OK(VipConnectRequest(vi, local, remote, VT_WAIT_MS, &ra));
    free(local);
    free(remote);
}

static inline void vt_end_link(vt_end *e, const char *disc)
{
    if (e->server)
        vt_accept(e->nic, e->vi, disc);
    else
        vt_connect(e->nic, e->vi, disc);
    CHECK_STATE(VIP_STATE_CONNECTED, e->vi);
}

/* Tear down, checking VIP_SUCCESS at every step. */
static inline void vt_end_close(vt_end *e)
{
    if (vt_vi_state(e->vi) != VIP_STATE_IDLE)
        CHECK_OK(VipDisconnect(e->vi));
    CHECK_STATE(VIP_STATE_IDLE, e->vi);
    CHECK_OK(VipDestroyVi(e->vi));
    vt_dpool_fini(&e->descs);
    vt_mem_dereg(&e->buf);
    CHECK_OK(VipDestroyPtag(e->nic, e->ptag));
    CHECK_OK(VipCloseNic(e->nic));
}

typedef void (*vt_pair_fn)(vt_end *e);

/* A two-process scenario: both ends open one VI with conf, connect on a
 * discriminator made from name, run their function (the client in this
 * process, the server in the child), meet, and tear down (disconnecting a
 * VI that is not idle). */
typedef struct {
    const char *name;
    vt_conf conf;
    vt_pair_fn client;
    vt_pair_fn server;
} vt_scenario;

typedef struct {
    const vt_scenario *list;
    size_t n;
} vt_scenarios;

static inline void vt_scenario_run(const vt_scenario *s, size_t index, int fd, int server)
{
    char disc[VT_MAX_DISC];
    vt_end e;
    vt_disc(disc, sizeof disc, "%.32s.%zu", s->name, index);
    vt_sync(fd, 0x5C00 + index);
    vt_end_open(&e, &s->conf, fd, server);
    vt_end_link(&e, disc);
    (server ? s->server : s->client)(&e);
    vt_sync(fd, 0xE0D00 + index);
    vt_end_close(&e);
}

static inline void vt_scenarios_server(int fd, void *arg)
{
    vt_scenarios *all = arg;
    for (size_t i = 0; i < all->n; i++)
        vt_scenario_run(&all->list[i], i, fd, 1);
}

/* Fork the server child for a list of scenarios.  Call before this process
 * makes any Vip* call; run the list with vt_scenarios_client. */
static inline vt_child vt_scenarios_spawn(vt_scenarios *all)
{
    return vt_spawn("server", vt_scenarios_server, all);
}

static inline void vt_scenarios_client(vt_scenarios *all, vt_child *server)
{
    const char *role = vt_role;
    vt_role = "client";
    for (size_t i = 0; i < all->n; i++) {
        const vt_scenario *s = &all->list[i];
        printf("  %-40s %s\n", s->name, vt_level_name(s->conf.level));
        vt_scenario_run(s, i, server->fd, 0);
    }
    vt_join(server);
    vt_role = role;
}

#endif /* OPENVIA_VT_H */
