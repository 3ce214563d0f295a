/*
 * sendrecv.c - send/receive between two processes over /dev/via_lo, for each
 * reliability level: every size 0..64, then powers of two and their
 * neighbours up to MaxTransferSize; 1, 2 and 32 data segments on each side;
 * with and without immediate data; completion by polling and by blocking.
 *
 * The client sends message m; the server receives it into a buffer of
 * exactly the message's length (scattered over its own segment count),
 * checks status, length, immediate data and bytes, and echoes it back; the
 * client checks the echo the same way.  Each side posts the receive for the
 * next message before it sends, so a receive is always waiting.
 *
 * Then a full queue: the server posts 1024 receives, the client sends 1024
 * messages before the server completes any, and the server checks them all,
 * twice over; most wait in the lap of the ring and of the receive cache
 * rather than in their few hot slots.
 */
#include "vt.h"

#define MTU VT_MAX_TRANSFER

/* 1, 2 or 32 segments on the sending side; the receiving side differs. */
static const unsigned send_segs[3] = {1, 2, 32};
static const unsigned recv_segs[3] = {2, 32, 1};

static size_t sizes[256];
static size_t nsizes;

static void make_sizes(void)
{
    size_t max = getenv("VT_QUICK") ? 65536 : MTU;
    for (size_t s = 0; s <= 64; s++)
        sizes[nsizes++] = s;
    for (size_t p = 128; p <= max; p *= 2) {
        sizes[nsizes++] = p - 1;
        sizes[nsizes++] = p;
        if (p + 1 <= max)
            sizes[nsizes++] = p + 1;
    }
}

typedef struct {
    size_t len;
    unsigned ssegs, rsegs;
    int imm;       /* with immediate data */
    int blocking;  /* *Wait (VIP_INFINITE) instead of *Done polling */
    int fence;     /* VIP_CONTROL_QFENCE on the send */
    uint32_t seed;
    VIP_UINT32 immdata;
} msg_t;

#define VARIANTS 6

static size_t nmsgs(void) { return nsizes * VARIANTS; }

static msg_t message(size_t m)
{
    size_t si = m / VARIANTS, v = m % VARIANTS;
    msg_t x;
    x.len = sizes[si];
    x.ssegs = send_segs[v % 3];
    x.rsegs = recv_segs[v % 3];
    x.imm = v >= 3;
    x.blocking = (int)((si + v) & 1);
    x.fence = m % 7 == 3;
    x.seed = (uint32_t)(m * 2654435761u);
    x.immdata = 0xA5000000u ^ (VIP_UINT32)m;
    return x;
}

/* Layout of each side's registered buffer: send area, two receive areas. */
typedef struct {
    VIP_UINT8 *send;
    VIP_UINT8 *recv[2];
} areas_t;

static areas_t areas(vt_end *e)
{
    areas_t a = {e->buf.base, {e->buf.base + MTU, e->buf.base + 2 * MTU}};
    return a;
}

/* Descriptors: 0 send, 1 and 2 alternate receives. */
#define DSEND 0
#define DRECV(m) (1 + ((m) & 1))

static VIP_DESCRIPTOR *complete(VIP_VI_HANDLE vi, int recv, int blocking)
{
    VIP_DESCRIPTOR *d = NULL;
    if (!blocking)
        return recv ? vt_recv_done(vi) : vt_send_done(vi);
    if (recv)
        CHECK_OK(VipRecvWait(vi, VIP_INFINITE, &d));
    else
        CHECK_OK(VipSendWait(vi, VIP_INFINITE, &d));
    CHECK(d != NULL);
    return d;
}

static void post_recv(vt_end *e, size_t m, size_t len, unsigned segs)
{
    areas_t a = areas(e);
    VIP_DESCRIPTOR *d = vt_dpool_get(&e->descs, DRECV(m));
    vt_desc_recv(d, a.recv[m & 1], e->buf.mh, len, segs);
    CHECK_OK(VipPostRecv(e->vi, d, e->descs.mem.mh));
}

static void send_and_complete(vt_end *e, const msg_t *x, void *data, unsigned segs,
                              VIP_UINT32 immdata)
{
    VIP_DESCRIPTOR *d = vt_dpool_get(&e->descs, DSEND);
    VIP_UINT16 control = VIP_CONTROL_OP_SENDRECV;
    if (x->imm)
        control |= VIP_CONTROL_IMMEDIATE;
    if (x->fence)
        control |= VIP_CONTROL_QFENCE;
    vt_desc_send(d, control, immdata, data, e->buf.mh, x->len, segs);
    CHECK_OK(VipPostSend(e->vi, d, e->descs.mem.mh));
    VIP_DESCRIPTOR *got = complete(e->vi, 0, x->blocking);
    CHECK_PTR(d, got);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
    CHECK_EQ(x->len, got->CS.Length);
}

static void receive_and_check(vt_end *e, size_t m, const msg_t *x, VIP_UINT32 immdata)
{
    areas_t a = areas(e);
    VIP_DESCRIPTOR *want = vt_dpool_get(&e->descs, DRECV(m));
    VIP_DESCRIPTOR *got = complete(e->vi, 1, x->blocking);
    CHECK_PTR(want, got);
    if (x->imm) {
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, got);
        CHECK_EQ(immdata, got->CS.ImmediateData);
    } else {
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, got);
    }
    CHECK_EQ(x->len, got->CS.Length);
    CHECK_PATTERN(a.recv[m & 1], x->len, x->seed);
}

static void server(vt_end *e)
{
    size_t n = nmsgs();
    areas_t a = areas(e);
    /* The first receive is posted before the client sends anything. */
    msg_t first = message(0);
    post_recv(e, 0, first.len, first.rsegs);
    vt_sync(e->fd, 1);
    for (size_t m = 0; m < n; m++) {
        msg_t x = message(m);
        receive_and_check(e, m, &x, x.immdata);
        if (m + 1 < n) {
            msg_t y = message(m + 1);
            post_recv(e, m + 1, y.len, y.rsegs);
        }
        /* Echo from where it arrived. */
        send_and_complete(e, &x, a.recv[m & 1], x.rsegs, x.immdata ^ 0xFFFFu);
    }
    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES at;
    VIP_BOOLEAN se = VIP_FALSE, re = VIP_FALSE;
    CHECK_OK(VipQueryVi(e->vi, &st, &at, &se, &re));
    CHECK_EQ(VIP_STATE_CONNECTED, st);
    CHECK_EQ(VIP_TRUE, se);
    CHECK_EQ(VIP_TRUE, re);
    VIP_DESCRIPTOR *d;
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(e->vi, &d));
    CHECK_RET(VIP_NOT_DONE, VipSendDone(e->vi, &d));
}

static void client(vt_end *e)
{
    size_t n = nmsgs();
    areas_t a = areas(e);
    size_t bytes = 0;
    double t0 = vt_now_ms();
    vt_sync(e->fd, 1);
    for (size_t m = 0; m < n; m++) {
        msg_t x = message(m);
        /* The echo comes back scattered over the sender's segment count. */
        post_recv(e, m, x.len, x.ssegs);
        vt_fill(a.send, x.len, x.seed);
        send_and_complete(e, &x, a.send, x.ssegs, x.immdata);
        receive_and_check(e, m, &x, x.immdata ^ 0xFFFFu);
        bytes += x.len;
    }
    VIP_DESCRIPTOR *d;
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(e->vi, &d));
    CHECK_STATE(VIP_STATE_CONNECTED, e->vi);
    printf("    %zu messages, %zu bytes each way, %.0f ms\n", n, bytes, vt_now_ms() - t0);
}

/* A full queue: DEEP receives posted, DEEP messages sent before any is
 * completed.  Sizes cycle through inline and cross-memory-attach lengths. */
#define DEEP 1024
#define DEEP_SLOT 2048
#define DEEP_ROUNDS 2

static size_t deep_len(size_t m) { return m % 5 == 4 ? DEEP_SLOT : (m * 37) % 200; }
static uint32_t deep_seed(size_t round, size_t m) { return (uint32_t)(round * 7919 + m * 31 + 1); }

static void deep_server(vt_end *e)
{
    for (size_t round = 0; round < DEEP_ROUNDS; round++) {
        for (size_t m = 0; m < DEEP; m++) {
            VIP_DESCRIPTOR *d = vt_dpool_get(&e->descs, m);
            vt_desc_recv(d, e->buf.base + m * DEEP_SLOT, e->buf.mh, DEEP_SLOT, 1);
            CHECK_OK(VipPostRecv(e->vi, d, e->descs.mem.mh));
        }
        vt_sync(e->fd, 10 + round);
        /* Every message has been sent before the first is completed. */
        vt_sync(e->fd, 20 + round);
        for (size_t m = 0; m < DEEP; m++) {
            VIP_DESCRIPTOR *got = vt_recv_done(e->vi);
            CHECK_PTR(vt_dpool_get(&e->descs, m), got);
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, got);
            CHECK_EQ(deep_len(m), got->CS.Length);
            CHECK_PATTERN(e->buf.base + m * DEEP_SLOT, deep_len(m), deep_seed(round, m));
        }
        VIP_DESCRIPTOR *none;
        CHECK_RET(VIP_NOT_DONE, VipRecvDone(e->vi, &none));
    }
}

static void deep_client(vt_end *e)
{
    for (size_t round = 0; round < DEEP_ROUNDS; round++) {
        vt_sync(e->fd, 10 + round);
        for (size_t m = 0; m < DEEP; m++) {
            VIP_DESCRIPTOR *d = vt_dpool_get(&e->descs, m);
            VIP_UINT8 *data = e->buf.base + m * DEEP_SLOT;
            vt_fill(data, deep_len(m), deep_seed(round, m));
            vt_desc_send(d, VIP_CONTROL_OP_SENDRECV, 0, data, e->buf.mh, deep_len(m), 1);
            CHECK_OK(VipPostSend(e->vi, d, e->descs.mem.mh));
        }
        for (size_t m = 0; m < DEEP; m++) {
            VIP_DESCRIPTOR *got = vt_send_done(e->vi);
            CHECK_PTR(vt_dpool_get(&e->descs, m), got);
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
        }
        vt_sync(e->fd, 20 + round);
    }
    printf("    %d rounds of %d messages sent before any was received\n", DEEP_ROUNDS, DEEP);
}

#define CONF(lvl) {.level = (lvl), .buf_size = 3 * MTU, .ndesc = 4, .maxseg = 32}

static const vt_scenario scenarios[] = {
    {"sendrecv", CONF(VIP_SERVICE_UNRELIABLE), client, server},
    {"sendrecv", CONF(VIP_SERVICE_RELIABLE_DELIVERY), client, server},
    {"sendrecv", CONF(VIP_SERVICE_RELIABLE_RECEPTION), client, server},
    {"deep", {.level = VIP_SERVICE_RELIABLE_DELIVERY, .buf_size = DEEP * DEEP_SLOT, .ndesc = DEEP, .maxseg = 1},
     deep_client, deep_server},
};

int main(void)
{
    vt_init();
    make_sizes();
    vt_scenarios all = {scenarios, sizeof scenarios / sizeof scenarios[0]};
    vt_child srv = vt_scenarios_spawn(&all);
    vt_scenarios_client(&all, &srv);
    printf("sendrecv: ok\n");
    return 0;
}
