/*
 * acceptance.c - the acceptance program of the one-host provider, written
 * against the VIA 1.0 API alone (vipl.h and the C library).
 *
 * Two processes on /dev/via_lo, found by discriminator:
 *   1. over a reliable-delivery VI, the client sends two-segment messages
 *      with immediate data of every size from 0 to 65536 bytes; the server
 *      keeps receives posted and returns credits, and checks every byte;
 *   2. an RDMA write with immediate data lands in the server's memory and
 *      consumes one of its receives;
 *   3. over a second, unreliable VI, RDMA writes that the server's memory
 *      does not allow are refused (RDMA_PROT_ERROR) and change nothing;
 *   4. VipRecvWait on an empty queue times out;
 *   5. everything is torn down, each call returning VIP_SUCCESS.
 */
#define _GNU_SOURCE
#include <vipl.h>

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DEVICE "/dev/via_lo" /* VIA_DEVICE in the environment overrides it */

/* Cross-host runs: `acceptance server TAG` on one host and
 * `acceptance client TAG HOST` on another; without arguments the program
 * forks its own server on this host. */
static const char *server_host;

static const char *device(void)
{
    const char *d = getenv("VIA_DEVICE");
    return d != NULL ? d : DEVICE;
}
#define MAXMSG 65536u
#define RING 256         /* receives the server keeps posted */
#define CREDIT_BATCH 64  /* the server returns credits in batches */
#define CLIENT_RING 16   /* receives the client keeps posted */
#define TSIZE 65536u     /* the RDMA target region */
#define WAIT_MS 30000UL

/* ImmediateData of control messages. */
#define IMM_INFO   0xF0000001u
#define IMM_CREDIT 0xF0000002u
#define IMM_RESULT 0xF0000003u
#define IMM_CHECK  0xC0000001u
#define IMM_RDMA   0xAD000001u
#define IMM_DATA(s) (0xD0000000u | (uint32_t)(s))

/* The RDMA write that is allowed. */
#define RDMA_OFF 100u
#define RDMA_LEN 5000u

static const char *role = "client";

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "FAIL [%s] %s:%d: %s\n", role, __FILE__, __LINE__, #cond); \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

#define CHECK_RC(expected, call)                                               \
    do {                                                                       \
        VIP_RETURN rc_ = (call);                                               \
        if (rc_ != (expected)) {                                               \
            fprintf(stderr, "FAIL [%s] %s:%d: %s returned %d, expected %d\n",  \
                    role, __FILE__, __LINE__, #call, (int)rc_, (int)(expected)); \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

#define CHECK_EQU(expected, actual)                                            \
    do {                                                                       \
        unsigned long long e_ = (expected), a_ = (actual);                     \
        if (e_ != a_) {                                                        \
            fprintf(stderr, "FAIL [%s] %s:%d: %s is 0x%llx, expected 0x%llx\n", \
                    role, __FILE__, __LINE__, #actual, a_, e_);                \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

/* What the server tells the client about its memory. */
typedef struct {
    VIP_UINT64 target;          /* RDMA write allowed */
    VIP_UINT64 readonly;        /* registered without EnableRdmaWrite */
    VIP_MEM_HANDLE target_handle;
    VIP_MEM_HANDLE readonly_handle;
} info_t;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Both processes build the same two source patterns. */
static void make_patterns(VIP_UINT8 *a, VIP_UINT8 *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        a[i] = (VIP_UINT8)(i * 7 + (i >> 8) * 3 + 1);
        b[i] = (VIP_UINT8)(i * 13 + (i >> 9) * 5 + 2);
    }
}

/* Message s: its first half from pattern a at offset s % 61, the rest from
 * pattern b at offset s % 67. */
static size_t first_half(size_t s) { return s / 2; }
static size_t a_off(size_t s) { return s % 61; }
static size_t b_off(size_t s) { return s % 67; }

static void *alloc_aligned(size_t n)
{
    void *p = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
    CHECK(p != NULL);
    memset(p, 0, n);
    return p;
}

static VIP_NET_ADDRESS *make_addr(VIP_NIC_HANDLE nic, const char *disc)
{
    VIP_NIC_ATTRIBUTES at;
    CHECK_RC(VIP_SUCCESS, VipQueryNic(nic, &at));
    size_t dl = strlen(disc);
    VIP_NET_ADDRESS *a = calloc(1, sizeof *a + at.NicAddressLen + dl);
    CHECK(a != NULL);
    a->HostAddressLen = at.NicAddressLen;
    a->DiscriminatorLen = (VIP_UINT16)dl;
    memcpy(a->HostAddress, at.LocalNicAddress, at.NicAddressLen);
    memcpy(a->HostAddress + at.NicAddressLen, disc, dl);
    return a;
}

/* The server's address: this host, or server_host by the name service. */
static VIP_NET_ADDRESS *server_addr(VIP_NIC_HANDLE nic, const char *disc)
{
    VIP_NET_ADDRESS *a = make_addr(nic, disc);
    if (server_host != NULL) {
        size_t dl = a->DiscriminatorLen;
        char keep[64];
        memcpy(keep, a->HostAddress + a->HostAddressLen, dl);
        CHECK_RC(VIP_SUCCESS, VipNSInit(nic, NULL));
        CHECK_RC(VIP_SUCCESS, VipNSGetHostByName(nic, (VIP_CHAR *)server_host, a, 0));
        memcpy(a->HostAddress + a->HostAddressLen, keep, dl);
        a->DiscriminatorLen = (VIP_UINT16)dl;
    }
    return a;
}

static void disc_name(char *out, size_t n, const char *what, pid_t pid)
{
    snprintf(out, n, "acceptance-%s-%d", what, (int)pid);
}

static VIP_DESCRIPTOR *desc_at(VIP_UINT8 *pool, size_t i)
{
    return (VIP_DESCRIPTOR *)(void *)(pool + i * 64);
}

static void fill_send(VIP_DESCRIPTOR *d, VIP_UINT32 imm, void *buf, VIP_MEM_HANDLE h, size_t len)
{
    memset(d, 0, 64);
    d->CS.Control = VIP_CONTROL_OP_SENDRECV | VIP_CONTROL_IMMEDIATE;
    d->CS.ImmediateData = imm;
    d->CS.SegCount = 1;
    d->CS.Length = (VIP_UINT32)len;
    d->DS[0].Local.Data.Address = buf;
    d->DS[0].Local.Handle = h;
    d->DS[0].Local.Length = (VIP_UINT32)len;
}

static void fill_recv(VIP_DESCRIPTOR *d, void *buf, VIP_MEM_HANDLE h, size_t len)
{
    size_t half = len / 2;
    memset(d, 0, 64);
    d->CS.SegCount = 2;
    d->DS[0].Local.Data.Address = buf;
    d->DS[0].Local.Handle = h;
    d->DS[0].Local.Length = (VIP_UINT32)half;
    d->DS[1].Local.Data.Address = (VIP_UINT8 *)buf + half;
    d->DS[1].Local.Handle = h;
    d->DS[1].Local.Length = (VIP_UINT32)(len - half);
}

/* ------------------------------------------------------------------ */
/* Server                                                               */

static int server(pid_t parent)
{
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag;
    VIP_VI_HANDLE vi, vi2;
    VIP_MEM_ATTRIBUTES plain = {0}, rdmaw = {0};
    VIP_MEM_HANDLE hbuf, hdesc, htarget, hro, hsend;
    char disc[64];

    role = "server";
    CHECK_RC(VIP_SUCCESS, VipOpenNic(device(), &nic));
    CHECK_RC(VIP_SUCCESS, VipCreatePtag(nic, &ptag));
    plain.Ptag = ptag;
    rdmaw.Ptag = ptag;
    rdmaw.EnableRdmaWrite = VIP_TRUE;

    /* Receive slots of 64 KiB, descriptors, the RDMA target, a region
     * without RDMA write, a small send buffer. */
    VIP_UINT8 *slots = alloc_aligned((size_t)RING * MAXMSG);
    VIP_UINT8 *descs = alloc_aligned((RING + 8) * 64);
    VIP_UINT8 *target = alloc_aligned(TSIZE);
    VIP_UINT8 *ro = alloc_aligned(TSIZE);
    VIP_UINT8 *sendbuf = alloc_aligned(4096);
    memset(ro, 0x5A, TSIZE);
    CHECK_RC(VIP_SUCCESS, VipRegisterMem(nic, slots, (VIP_ULONG)RING * MAXMSG, &plain, &hbuf));
    CHECK_RC(VIP_SUCCESS, VipRegisterMem(nic, descs, (RING + 8) * 64, &plain, &hdesc));
    CHECK_RC(VIP_SUCCESS, VipRegisterMem(nic, target, TSIZE, &rdmaw, &htarget));
    CHECK_RC(VIP_SUCCESS, VipRegisterMem(nic, ro, TSIZE, &plain, &hro));
    CHECK_RC(VIP_SUCCESS, VipRegisterMem(nic, sendbuf, 4096, &plain, &hsend));

    VIP_VI_ATTRIBUTES va = {0};
    va.ReliabilityLevel = VIP_SERVICE_RELIABLE_DELIVERY;
    va.MaxTransferSize = MAXMSG;
    va.Ptag = ptag;
    va.EnableRdmaWrite = VIP_TRUE;
    CHECK_RC(VIP_SUCCESS, VipCreateVi(nic, &va, NULL, NULL, &vi));
    va.ReliabilityLevel = VIP_SERVICE_UNRELIABLE;
    CHECK_RC(VIP_SUCCESS, VipCreateVi(nic, &va, NULL, NULL, &vi2));

    /* Receives are posted before the connection exists. */
    for (size_t i = 0; i < RING; i++) {
        fill_recv(desc_at(descs, i), slots + i * MAXMSG, hbuf, MAXMSG);
        CHECK_RC(VIP_SUCCESS, VipPostRecv(vi, desc_at(descs, i), hdesc));
    }

    VIP_NET_ADDRESS *remote = calloc(1, sizeof *remote + 256);
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn;
    CHECK(remote != NULL);
    const char *what[2] = {"data", "rdma"};
    VIP_VI_HANDLE vis[2] = {vi, vi2};
    for (int k = 0; k < 2; k++) {
        disc_name(disc, sizeof disc, what[k], parent);
        VIP_NET_ADDRESS *local = make_addr(nic, disc);
        CHECK_RC(VIP_SUCCESS, VipConnectWait(nic, local, WAIT_MS, remote, &ra, &conn));
        CHECK_RC(VIP_SUCCESS, VipConnectAccept(conn, vis[k]));
        free(local);
    }

    /* Control messages to the client go out one at a time. */
    VIP_DESCRIPTOR *sd = desc_at(descs, RING);
    VIP_DESCRIPTOR *got;
#define SERVER_SEND(imm, data, len)                                            \
    do {                                                                       \
        memcpy(sendbuf, (data), (len));                                        \
        fill_send(sd, (imm), sendbuf, hsend, (len));                           \
        CHECK_RC(VIP_SUCCESS, VipPostSend(vi, sd, hdesc));                     \
        CHECK_RC(VIP_SUCCESS, VipSendWait(vi, WAIT_MS, &got));                 \
        CHECK(got == sd);                                                      \
        CHECK_EQU(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got->CS.Status);       \
    } while (0)

    info_t info = {(uintptr_t)target, (uintptr_t)ro, htarget, hro};
    SERVER_SEND(IMM_INFO, &info, sizeof info);

    VIP_UINT8 *pa = malloc(MAXMSG + 128), *pb = malloc(MAXMSG + 128);
    CHECK(pa && pb);
    make_patterns(pa, pb, MAXMSG + 128);

    /* Receive everything in order: the messages, the RDMA write, CHECK. */
    size_t consumed = 0;
    for (size_t n = 0;; n++) {
        size_t slot = n % RING;
        CHECK_RC(VIP_SUCCESS, VipRecvWait(vi, WAIT_MS, &got));
        CHECK(got == desc_at(descs, slot));
        VIP_UINT8 *data = slots + slot * MAXMSG;
        if (n <= MAXMSG) {
            size_t s = n, h = first_half(s);
            CHECK_EQU(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, got->CS.Status);
            CHECK_EQU(IMM_DATA(s), got->CS.ImmediateData);
            CHECK_EQU(s, got->CS.Length);
            CHECK(memcmp(data, pa + a_off(s), h) == 0);
            CHECK(memcmp(data + h, pb + b_off(s), s - h) == 0);
        } else if (n == MAXMSG + 1) {
            /* The RDMA write with immediate data. */
            CHECK_EQU(VIP_STATUS_DONE | VIP_STATUS_OP_REMOTE_RDMA_WRITE | VIP_STATUS_IMMEDIATE,
                      got->CS.Status);
            CHECK_EQU(IMM_RDMA, got->CS.ImmediateData);
            CHECK_EQU(RDMA_LEN, got->CS.Length);
            CHECK(memcmp(target + RDMA_OFF, pa, RDMA_LEN) == 0);
        } else {
            CHECK_EQU(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, got->CS.Status);
            CHECK_EQU(IMM_CHECK, got->CS.ImmediateData);
            break;
        }
        fill_recv(got, data, hbuf, MAXMSG);
        CHECK_RC(VIP_SUCCESS, VipPostRecv(vi, got, hdesc));
        if (++consumed % CREDIT_BATCH == 0) {
            uint32_t c = CREDIT_BATCH;
            SERVER_SEND(IMM_CREDIT, &c, sizeof c);
        }
    }

    /* The refused RDMA writes left no trace: the target holds exactly the
     * allowed write, the read-only region its 0x5A bytes. */
    uint32_t failures = 0;
    for (size_t i = 0; i < TSIZE; i++) {
        VIP_UINT8 want = (i >= RDMA_OFF && i < RDMA_OFF + RDMA_LEN) ? pa[i - RDMA_OFF] : 0;
        if (target[i] != want)
            failures |= 1;
        if (ro[i] != 0x5A)
            failures |= 2;
    }
    VIP_VI_STATE st;
    VIP_BOOLEAN se, re;
    CHECK_RC(VIP_SUCCESS, VipQueryVi(vi2, &st, &ra, &se, &re));
    if (st != VIP_STATE_CONNECTED)
        failures |= 4;
    SERVER_SEND(IMM_RESULT, &failures, sizeof failures);

    /* The client disconnects first; then this side. */
    for (int k = 0; k < 2; k++) {
        double until = now_ms() + WAIT_MS;
        do {
            CHECK_RC(VIP_SUCCESS, VipQueryVi(vis[k], &st, &ra, &se, &re));
            if (st == VIP_STATE_ERROR)
                break;
            usleep(1000);
        } while (now_ms() < until);
        CHECK_EQU(VIP_STATE_ERROR, st);
        CHECK_RC(VIP_SUCCESS, VipDisconnect(vis[k]));
        CHECK_RC(VIP_SUCCESS, VipDestroyVi(vis[k]));
    }
    CHECK_RC(VIP_SUCCESS, VipDeregisterMem(nic, slots, hbuf));
    CHECK_RC(VIP_SUCCESS, VipDeregisterMem(nic, descs, hdesc));
    CHECK_RC(VIP_SUCCESS, VipDeregisterMem(nic, target, htarget));
    CHECK_RC(VIP_SUCCESS, VipDeregisterMem(nic, ro, hro));
    CHECK_RC(VIP_SUCCESS, VipDeregisterMem(nic, sendbuf, hsend));
    CHECK_RC(VIP_SUCCESS, VipDestroyPtag(nic, ptag));
    CHECK_RC(VIP_SUCCESS, VipCloseNic(nic));
    free(slots);
    free(descs);
    free(target);
    free(ro);
    free(sendbuf);
    free(remote);
    free(pa);
    free(pb);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Client                                                               */

typedef struct {
    VIP_VI_HANDLE vi;
    VIP_UINT8 *descs;   /* CLIENT_RING receive descriptors */
    VIP_MEM_HANDLE hdesc;
    VIP_UINT8 *bufs;    /* CLIENT_RING buffers of 64 bytes */
    VIP_MEM_HANDLE hbuf;
    size_t next;        /* the receive that completes next */
    unsigned credits;
    info_t info;
    int have_info;
    int have_result;
    uint32_t result;
} client_t;

/* Handle one message from the server; d is the descriptor it came in. */
static void client_message(client_t *c, VIP_DESCRIPTOR *d)
{
    size_t slot = c->next;
    VIP_UINT8 *data = c->bufs + slot * 64;
    CHECK(d == desc_at(c->descs, slot));
    CHECK_EQU(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, d->CS.Status);
    switch (d->CS.ImmediateData) {
    case IMM_INFO:
        CHECK_EQU(sizeof(info_t), d->CS.Length);
        memcpy(&c->info, data, sizeof c->info);
        c->have_info = 1;
        break;
    case IMM_CREDIT: {
        uint32_t n;
        CHECK_EQU(sizeof n, d->CS.Length);
        memcpy(&n, data, sizeof n);
        CHECK_EQU(CREDIT_BATCH, n);
        c->credits += n;
        break;
    }
    case IMM_RESULT:
        CHECK_EQU(sizeof c->result, d->CS.Length);
        memcpy(&c->result, data, sizeof c->result);
        c->have_result = 1;
        break;
    default:
        CHECK(!"unexpected message from the server");
    }
    fill_recv(d, data, c->hbuf, 64);
    CHECK_RC(VIP_SUCCESS, VipPostRecv(c->vi, d, c->hdesc));
    c->next = (slot + 1) % CLIENT_RING;
}

/* Take what the server sent; wait for it if wait is set. */
static void client_poll(client_t *c, int wait)
{
    VIP_DESCRIPTOR *d;
    if (wait) {
        CHECK_RC(VIP_SUCCESS, VipRecvWait(c->vi, WAIT_MS, &d));
        client_message(c, d);
    }
    for (;;) {
        VIP_RETURN r = VipRecvDone(c->vi, &d);
        if (r == VIP_NOT_DONE)
            return;
        CHECK_RC(VIP_SUCCESS, r);
        client_message(c, d);
    }
}

/* Post a send on the data VI and reap it through the send CQ. */
static void client_send(client_t *c, VIP_CQ_HANDLE cq, VIP_DESCRIPTOR *d, VIP_MEM_HANDLE hd,
                        VIP_UINT32 want_status, size_t len)
{
    while (c->credits == 0)
        client_poll(c, 1);
    c->credits--;
    CHECK_RC(VIP_SUCCESS, VipPostSend(c->vi, d, hd));
    VIP_VI_HANDLE who;
    VIP_BOOLEAN rq;
    VIP_DESCRIPTOR *got;
    CHECK_RC(VIP_SUCCESS, VipCQWait(cq, WAIT_MS, &who, &rq));
    CHECK(who == c->vi);
    CHECK(rq == VIP_FALSE);
    CHECK_RC(VIP_SUCCESS, VipSendDone(c->vi, &got));
    CHECK(got == d);
    CHECK_EQU(want_status, got->CS.Status);
    CHECK_EQU(len, got->CS.Length);
}

static int client(pid_t parent)
{
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag;
    VIP_CQ_HANDLE cq;
    VIP_VI_HANDLE vi2;
    VIP_MEM_ATTRIBUTES plain = {0};
    VIP_MEM_HANDLE hsrc, hsd;
    client_t c;
    char disc[64];

    memset(&c, 0, sizeof c);
    c.credits = RING;
    CHECK_RC(VIP_SUCCESS, VipOpenNic(device(), &nic));
    CHECK_RC(VIP_SUCCESS, VipCreatePtag(nic, &ptag));
    plain.Ptag = ptag;
    CHECK_RC(VIP_SUCCESS, VipCreateCQ(nic, 64, &cq));

    /* The two source patterns, one send descriptor, the receive ring. */
    VIP_UINT8 *src = alloc_aligned(2 * (MAXMSG + 128));
    VIP_UINT8 *pa = src, *pb = src + MAXMSG + 128;
    make_patterns(pa, pb, MAXMSG + 128);
    VIP_UINT8 *sdesc = alloc_aligned(4096);
    c.descs = alloc_aligned(CLIENT_RING * 64);
    c.bufs = alloc_aligned(CLIENT_RING * 64);
    CHECK_RC(VIP_SUCCESS, VipRegisterMem(nic, src, 2 * (MAXMSG + 128), &plain, &hsrc));
    CHECK_RC(VIP_SUCCESS, VipRegisterMem(nic, sdesc, 4096, &plain, &hsd));
    CHECK_RC(VIP_SUCCESS, VipRegisterMem(nic, c.descs, CLIENT_RING * 64, &plain, &c.hdesc));
    CHECK_RC(VIP_SUCCESS, VipRegisterMem(nic, c.bufs, CLIENT_RING * 64, &plain, &c.hbuf));

    VIP_VI_ATTRIBUTES va = {0}, ra;
    va.ReliabilityLevel = VIP_SERVICE_RELIABLE_DELIVERY;
    va.MaxTransferSize = MAXMSG;
    va.Ptag = ptag;
    va.EnableRdmaWrite = VIP_TRUE;
    CHECK_RC(VIP_SUCCESS, VipCreateVi(nic, &va, cq, NULL, &c.vi));
    va.ReliabilityLevel = VIP_SERVICE_UNRELIABLE;
    CHECK_RC(VIP_SUCCESS, VipCreateVi(nic, &va, NULL, NULL, &vi2));
    for (size_t i = 0; i < CLIENT_RING; i++) {
        fill_recv(desc_at(c.descs, i), c.bufs + i * 64, c.hbuf, 64);
        CHECK_RC(VIP_SUCCESS, VipPostRecv(c.vi, desc_at(c.descs, i), c.hdesc));
    }

    /* Connect both VIs by discriminator; the requests wait for the server. */
    disc_name(disc, sizeof disc, "client", parent);
    VIP_NET_ADDRESS *local = make_addr(nic, disc);
    disc_name(disc, sizeof disc, "data", parent);
    VIP_NET_ADDRESS *srv = server_addr(nic, disc);
    CHECK_RC(VIP_SUCCESS, VipConnectRequest(c.vi, local, srv, WAIT_MS, &ra));
    CHECK_EQU(VIP_SERVICE_RELIABLE_DELIVERY, ra.ReliabilityLevel);
    free(srv);
    disc_name(disc, sizeof disc, "rdma", parent);
    srv = server_addr(nic, disc);
    CHECK_RC(VIP_SUCCESS, VipConnectRequest(vi2, local, srv, WAIT_MS, &ra));
    free(srv);
    free(local);
    while (!c.have_info)
        client_poll(&c, 1);

    /* 1. Every size from 0 to 65536, two segments, immediate data. */
    double t0 = now_ms();
    VIP_DESCRIPTOR *d = desc_at(sdesc, 0);
    for (size_t s = 0; s <= MAXMSG; s++) {
        size_t h = first_half(s);
        memset(d, 0, 64);
        d->CS.Control = VIP_CONTROL_OP_SENDRECV | VIP_CONTROL_IMMEDIATE;
        d->CS.ImmediateData = IMM_DATA(s);
        d->CS.SegCount = 2;
        d->CS.Length = (VIP_UINT32)s;
        d->DS[0].Local.Data.Address = pa + a_off(s);
        d->DS[0].Local.Handle = hsrc;
        d->DS[0].Local.Length = (VIP_UINT32)h;
        d->DS[1].Local.Data.Address = pb + b_off(s);
        d->DS[1].Local.Handle = hsrc;
        d->DS[1].Local.Length = (VIP_UINT32)(s - h);
        client_send(&c, cq, d, hsd, VIP_STATUS_DONE | VIP_STATUS_OP_SEND, s);
        client_poll(&c, 0);
    }
    double t1 = now_ms();
    printf("65537 messages of 0..65536 bytes (2 GiB) in %.0f ms\n", t1 - t0);

    /* 2. RDMA write with immediate data. */
    memset(d, 0, 64);
    d->CS.Control = VIP_CONTROL_OP_RDMAWRITE | VIP_CONTROL_IMMEDIATE;
    d->CS.ImmediateData = IMM_RDMA;
    d->CS.SegCount = 2;
    d->CS.Length = RDMA_LEN;
    d->DS[0].Remote.Data.AddressBits = c.info.target + RDMA_OFF;
    d->DS[0].Remote.Handle = c.info.target_handle;
    d->DS[1].Local.Data.Address = pa;
    d->DS[1].Local.Handle = hsrc;
    d->DS[1].Local.Length = RDMA_LEN;
    client_send(&c, cq, d, hsd, VIP_STATUS_DONE | VIP_STATUS_OP_RDMA_WRITE, RDMA_LEN);
    printf("RDMA write with immediate data: done\n");

    /* 3. Forbidden RDMA writes, on the unreliable VI: to memory registered
     * without EnableRdmaWrite, past the end of the target, with a forged
     * memory handle. */
    struct { VIP_UINT64 addr; VIP_MEM_HANDLE h; VIP_UINT32 len; } bad[3] = {
        {c.info.readonly, c.info.readonly_handle, 1000},
        {c.info.target + TSIZE - 10, c.info.target_handle, 100},
        {c.info.target, c.info.target_handle ^ 0x40404040u, 1000},
    };
    for (int i = 0; i < 3; i++) {
        memset(d, 0, 64);
        d->CS.Control = VIP_CONTROL_OP_RDMAWRITE;
        d->CS.SegCount = 2;
        d->CS.Length = bad[i].len;
        d->DS[0].Remote.Data.AddressBits = bad[i].addr;
        d->DS[0].Remote.Handle = bad[i].h;
        d->DS[1].Local.Data.Address = pb;
        d->DS[1].Local.Handle = hsrc;
        d->DS[1].Local.Length = bad[i].len;
        CHECK_RC(VIP_SUCCESS, VipPostSend(vi2, d, hsd));
        VIP_DESCRIPTOR *got;
        CHECK_RC(VIP_SUCCESS, VipSendWait(vi2, WAIT_MS, &got));
        CHECK(got == d);
        CHECK_EQU(VIP_STATUS_DONE | VIP_STATUS_RDMA_PROT_ERROR,
                  got->CS.Status & (VIP_STATUS_DONE | VIP_STATUS_ERROR_MASK));
    }
    /* Ask the server to look at its memory. */
    memset(d, 0, 64);
    d->CS.Control = VIP_CONTROL_OP_SENDRECV | VIP_CONTROL_IMMEDIATE;
    d->CS.ImmediateData = IMM_CHECK;
    d->CS.SegCount = 1;
    d->DS[0].Local.Data.Address = pa;
    d->DS[0].Local.Handle = hsrc;
    client_send(&c, cq, d, hsd, VIP_STATUS_DONE | VIP_STATUS_OP_SEND, 0);
    while (!c.have_result)
        client_poll(&c, 1);
    CHECK_EQU(0, c.result);
    printf("forbidden RDMA writes refused, target memory unchanged\n");

    /* 4. Nothing will arrive on the second VI. */
    VIP_DESCRIPTOR *none = NULL;
    t0 = now_ms();
    CHECK_RC(VIP_TIMEOUT, VipRecvWait(vi2, 100, &none));
    CHECK(now_ms() - t0 >= 99.0);
    printf("VipRecvWait on an empty queue: VIP_TIMEOUT after %.0f ms\n", now_ms() - t0);

    /* 5. Tear down. */
    VIP_VI_HANDLE who;
    VIP_BOOLEAN rq;
    CHECK_RC(VIP_NOT_DONE, VipCQDone(cq, &who, &rq));
    CHECK_RC(VIP_SUCCESS, VipDisconnect(c.vi));
    CHECK_RC(VIP_SUCCESS, VipDisconnect(vi2));
    CHECK_RC(VIP_SUCCESS, VipDestroyVi(c.vi));
    CHECK_RC(VIP_SUCCESS, VipDestroyVi(vi2));
    CHECK_RC(VIP_SUCCESS, VipDeregisterMem(nic, src, hsrc));
    CHECK_RC(VIP_SUCCESS, VipDeregisterMem(nic, sdesc, hsd));
    CHECK_RC(VIP_SUCCESS, VipDeregisterMem(nic, c.descs, c.hdesc));
    CHECK_RC(VIP_SUCCESS, VipDeregisterMem(nic, c.bufs, c.hbuf));
    CHECK_RC(VIP_SUCCESS, VipDestroyPtag(nic, ptag));
    CHECK_RC(VIP_SUCCESS, VipDestroyCQ(cq));
    CHECK_RC(VIP_SUCCESS, VipCloseNic(nic));
    free(src);
    free(sdesc);
    free(c.descs);
    free(c.bufs);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc >= 3 && strcmp(argv[1], "server") == 0) {
        CHECK(server((pid_t)atoi(argv[2])) == 0);
        printf("acceptance server: ok\n");
        return 0;
    }
    if (argc >= 4 && strcmp(argv[1], "client") == 0) {
        server_host = argv[3];
        CHECK(client((pid_t)atoi(argv[2])) == 0);
        printf("acceptance client: ok\n");
        return 0;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        exit(server(parent));
    }
    int rc = client(parent);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    printf("acceptance: ok\n");
    return rc;
}
