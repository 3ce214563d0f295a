/*
 * workload.c - seeded random workloads over VI pairs, checked at every step
 * against the VIA semantics.
 *
 * Each seed is one to four connections between this process (the client)
 * and a forked server, driven by a script both processes derive from the
 * seed: the reliability level, whether RDMA writes and reads are enabled,
 * whether each side's VIs complete their receives through one CQ they
 * share, whether completions are polled or waited for; then rounds of
 * transfers in either direction, each on a VI of its own choosing (sends of
 * 0 bytes to 64 KiB in 1 to 4 data segments, with or without immediate
 * data; RDMA writes with and without immediate data at random places; on
 * reliable VIs, RDMA reads of random ranges of the peer's memory), each
 * round ending with a send on every VI it used; in one seed of four the
 * last of those sends is longer than its receive, and in one of six more
 * on a reliable VI it finds no receive posted; and an ending: either side
 * disconnects every VI, with receives left posted on both sides.
 *
 * Checked on every step:
 * - every descriptor completes exactly once, in the order of its queue,
 *   with the whole status word, length and immediate data it must have;
 * - a CQ names each completion of its queues once, naming the right VI,
 *   before *Done returns it, and is empty at the end;
 * - received bytes are the sent ones, and no byte of a receive buffer past
 *   the message (or of one an RDMA write with immediate data consumed)
 *   changes;
 * - an RDMA write lands exactly in its range, visible once a later message
 *   of the same VI is received, and nothing else of the target area changes;
 * - an RDMA read brings exactly the bytes of its range, and nothing past
 *   them;
 * - a send longer than its receive completes that receive with a length
 *   error and changes no byte past it; the send's status and the VIs'
 *   states follow the reliability level (the connection breaks on a
 *   reliable VI and stays on an unreliable one), and the other VIs go on;
 * - a send on a reliable VI that finds no receive posted breaks its
 *   connection (VIP_ERROR_RECVQ_EMPTY at the receiver, VIP_ERROR_CONN_LOST
 *   at the sender, whose send fails with a transport error over shared
 *   memory), after everything before it on that VI arrived;
 * - the side that disconnects is idle at once with its receives flushed;
 *   the other reaches the error state, hears VIP_ERROR_CONN_LOST (unless
 *   its connection had broken already), and its receives are flushed, in
 *   order.
 * Over shared memory nothing is lost, so an unreliable VI is held to the
 * same delivery as a reliable one: its receives are always posted first.
 *
 * Across hosts (the UDP transport): `workload server TAG` on one host and
 * `workload client TAG HOST` on another, VIA_DEVICE naming the device; the
 * two talk over TCP port WL_PORT besides VIA.  There every VI is reliable:
 * an unreliable one may lose a datagram the kernel drops.
 *
 * VT_SEEDS=n runs seeds 1..n (default 200; 20 with VT_QUICK); VT_SEED=s
 * runs seed s alone.  A failure names its seed.
 */
#include "vt.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#define MAX_VIS    4                  /* VI pairs of a seed */
#define MAX_OPS    6                  /* transfers of a round, before its closing sends */
#define MAX_STEPS  (MAX_OPS + MAX_VIS)
#define MAX_ROUNDS 10
#define MAX_LEFT   3                  /* receives left posted at the end, per VI and side */
#define MAX_SEND   65536              /* bytes of the largest send */
#define MAX_WRITE  16384              /* bytes of the largest RDMA write or read */
#define SEGS       4                  /* most data segments of a send or receive */
#define GUARD      64                 /* bytes between buffers that must not change */
#define JUNK       0xA5               /* what untouched bytes hold */

#define BUF_BYTES  (4u << 20)         /* each side's registered buffer: */
#define SEND_AREA  0u                 /* sources of sends and writes, places of reads */
#define RECV_AREA  (1u << 20)         /* receive buffers */
#define RDMA_AREA  (2u << 20)         /* RDMA write targets */
#define RDMA_BYTES (1u << 20)
#define READ_AREA  (3u << 20)         /* RDMA read sources, one pattern per seed */
#define READ_BYTES (1u << 20)

#define WL_PORT    7411               /* the control channel across hosts */

#define PER_VI     32                 /* descriptors of a VI: */
#define SEND_DESC  0                  /* [0, 16): sends */
#define RECV_DESC  16                 /* [16, 32): receives */

enum op_kind { OP_SEND, OP_WRITE_IMM, OP_WRITE, OP_READ };

typedef struct {
    enum op_kind kind;
    unsigned vi;         /* which VI pair carries it */
    uint32_t len;
    unsigned nseg;       /* data segments on the sending side */
    int imm;             /* a send with immediate data */
    uint32_t immediate;
    uint32_t pattern;
    uint32_t target;     /* RDMA: offset in the peer's RDMA area (a read: its read area) */
    uint32_t slack;      /* receive room past the message */
    unsigned rsegs;      /* segments of its receive */
} op_t;

typedef struct {
    int from_server;     /* who sends in this round */
    unsigned nops;       /* including the closing sends */
    op_t ops[MAX_STEPS];
} round_t;

typedef struct {
    uint32_t seed;
    VIP_RELIABILITY_LEVEL level;
    unsigned nvis;
    int rdma;
    int rdma_read;       /* RDMA reads enabled (reliable levels only) */
    int cq[2];           /* [server?]: the VIs' receive queues complete through one CQ */
    int wait[2];         /* [server?]: *Wait instead of polling *Done */
    unsigned nrounds;
    round_t rounds[MAX_ROUNDS];
    uint32_t over;       /* the last closing send is this much longer than its receive */
    int no_recv;         /* the last closing send finds no receive (reliable levels) */
    int closer_is_server;
    unsigned left[2][MAX_VIS]; /* receives left posted at the end, [server?][VI] */
} plan_t;

static uint32_t pick(uint32_t *r, uint32_t n) { return vt_rand(r) % n; }

/* A size, mostly small: the inline path, the copy path, several pieces. */
static uint32_t pick_len(uint32_t *r, uint32_t max)
{
    switch (pick(r, 4)) {
    case 0: return pick(r, 65);
    case 1: return pick(r, 2048);
    case 2: return pick(r, 16384 < max ? 16384 : max);
    default: return pick(r, max + 1);
    }
}

/* Across hosts: the server's host (by the name service), and the tag both
 * sides put in their discriminators. */
static const char *server_host;
static const char *tag;

static const char *device(void)
{
    const char *d = getenv("VIA_DEVICE");
    return d != NULL ? d : VT_DEV;
}

static void make_op(plan_t *p, op_t *o, uint32_t *r, int closing, unsigned vi, uint32_t *target)
{
    enum op_kind kinds[4] = {OP_SEND};
    unsigned nkinds = 1;
    if (p->rdma) {
        kinds[nkinds++] = OP_WRITE_IMM;
        kinds[nkinds++] = OP_WRITE;
    }
    if (p->rdma_read)
        kinds[nkinds++] = OP_READ;
    o->kind = closing ? OP_SEND : kinds[pick(r, nkinds)];
    o->vi = vi;
    o->len = pick_len(r, o->kind == OP_SEND ? MAX_SEND : MAX_WRITE);
    if (o->kind != OP_SEND && o->len == 0)
        o->len = 1;
    o->nseg = o->len == 0 ? 0 : 1 + pick(r, SEGS < o->len ? SEGS : o->len);
    o->imm = o->kind == OP_WRITE_IMM || (o->kind == OP_SEND && pick(r, 2));
    o->immediate = vt_rand(r);
    o->pattern = vt_rand(r);
    if (o->kind == OP_WRITE || o->kind == OP_WRITE_IMM) {
        *target += pick(r, 4) * GUARD;
        o->target = *target;
        *target += o->len + GUARD;
    } else if (o->kind == OP_READ) {
        o->target = pick(r, READ_BYTES - o->len + 1);
    }
    o->slack = pick(r, 3) == 0 ? 0 : pick(r, 200);
    o->rsegs = 1 + pick(r, SEGS);
}

static void make_plan(plan_t *p, uint32_t seed)
{
    uint32_t r = seed * 2654435761u + 1;
    static const VIP_RELIABILITY_LEVEL levels[] = {
        VIP_SERVICE_UNRELIABLE, VIP_SERVICE_RELIABLE_DELIVERY, VIP_SERVICE_RELIABLE_RECEPTION};
    memset(p, 0, sizeof *p);
    p->seed = seed;
    p->level = levels[pick(&r, 3)];
    if (tag != NULL && p->level == VIP_SERVICE_UNRELIABLE)
        p->level = VIP_SERVICE_RELIABLE_DELIVERY;
    p->nvis = 1 + pick(&r, MAX_VIS);
    p->rdma = (int)pick(&r, 3) != 0;
    p->rdma_read = p->level != VIP_SERVICE_UNRELIABLE && pick(&r, 2);
    for (int s = 0; s < 2; s++) {
        p->cq[s] = (int)pick(&r, 2);
        p->wait[s] = (int)pick(&r, 2);
    }
    p->nrounds = 1 + pick(&r, MAX_ROUNDS);
    for (unsigned k = 0; k < p->nrounds; k++) {
        round_t *rd = &p->rounds[k];
        uint32_t target = 0;
        int used[MAX_VIS] = {0};
        unsigned n = pick(&r, MAX_OPS + 1);
        rd->from_server = (int)pick(&r, 2);
        for (unsigned i = 0; i < n; i++) {
            unsigned vi = pick(&r, p->nvis);
            used[vi] = 1;
            make_op(p, &rd->ops[rd->nops++], &r, 0, vi, &target);
        }
        /* A closing send on every VI the round used (one at least): what
         * a VI wrote is visible once its closing send is received. */
        if (n == 0)
            used[pick(&r, p->nvis)] = 1;
        for (unsigned v = 0; v < p->nvis; v++)
            if (used[v])
                make_op(p, &rd->ops[rd->nops++], &r, 1, v, &target);
        if (target > RDMA_BYTES)
            VT_FAIL("seed %u: a round's writes need %u bytes", seed, target);
    }
    if (pick(&r, 4) == 0) {
        round_t *rd = &p->rounds[p->nrounds - 1];
        op_t *o = &rd->ops[rd->nops - 1];
        if (o->len == 0) {
            o->len = 1;
            o->nseg = 1;
        }
        p->over = 1 + pick(&r, o->len < 64 ? o->len : 64);
        o->slack = 0;
    } else if (p->level != VIP_SERVICE_UNRELIABLE && pick(&r, 6) == 0) {
        p->no_recv = 1;
    }
    p->closer_is_server = (int)pick(&r, 2);
    for (int s = 0; s < 2; s++)
        for (unsigned v = 0; v < p->nvis; v++)
            p->left[s][v] = pick(&r, MAX_LEFT + 1);
}

/* Whether op i of round k is the send longer than its receive. */
static int too_long(const plan_t *p, unsigned k, unsigned i)
{
    return p->over && k + 1 == p->nrounds && i + 1 == p->rounds[k].nops;
}

/* Whether op i of round k is the send that finds no receive. */
static int unreceived(const plan_t *p, unsigned k, unsigned i)
{
    return p->no_recv && k + 1 == p->nrounds && i + 1 == p->rounds[k].nops;
}

/* The VI whose connection the last closing send breaks, or -1. */
static int broken_vi(const plan_t *p)
{
    if (!(p->over || p->no_recv) || p->level == VIP_SERVICE_UNRELIABLE)
        return -1;
    const round_t *rd = &p->rounds[p->nrounds - 1];
    return (int)rd->ops[rd->nops - 1].vi;
}

/* ------------------------------------------------------------------ */

typedef struct {
    const plan_t *plan;
    int fd;
    int server;
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag;
    VIP_CQ_HANDLE cq;
    VIP_VI_HANDLE vi[MAX_VIS];
    vt_mem buf;
    vt_dpool descs;
    vt_errlog errs;
    uint64_t peer_base;
    VIP_MEM_HANDLE peer_mh;
} side_t;

static char role[64];

/* The pattern of both sides' read areas. */
static uint32_t read_pattern(const plan_t *p) { return p->seed ^ 0x5EAD5EADu; }

static VIP_DESCRIPTOR *desc(side_t *s, unsigned v, size_t i) { return vt_dpool_get(&s->descs, v * PER_VI + i); }

static int reliable(const plan_t *p) { return p->level != VIP_SERVICE_UNRELIABLE; }

static void side_open(side_t *s, const plan_t *p, int fd, int server)
{
    memset(s, 0, sizeof *s);
    s->plan = p;
    s->fd = fd;
    s->server = server;
    s->nic = vt_open_nic(device());
    vt_errlog_init(&s->errs);
    CHECK_OK(VipErrorCallback(s->nic, &s->errs, vt_errlog_handler));
    CHECK_OK(VipCreatePtag(s->nic, &s->ptag));
    vt_mem_reg(&s->buf, s->nic, s->ptag, BUF_BYTES, p->rdma ? VIP_TRUE : VIP_FALSE,
               p->rdma_read ? VIP_TRUE : VIP_FALSE);
    vt_fill(s->buf.base + READ_AREA, READ_BYTES, read_pattern(p));
    vt_dpool_init(&s->descs, s->nic, s->ptag, (size_t)PER_VI * MAX_VIS, SEGS + 1);
    if (p->cq[server])
        CHECK_OK(VipCreateCQ(s->nic, 128, &s->cq));
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(p->level, s->ptag, VT_MAX_TRANSFER,
                                       p->rdma ? VIP_TRUE : VIP_FALSE,
                                       p->rdma_read ? VIP_TRUE : VIP_FALSE);
    for (unsigned v = 0; v < p->nvis; v++)
        CHECK_OK(VipCreateVi(s->nic, &va, NULL, p->cq[server] ? s->cq : NULL, &s->vi[v]));
}

static void side_close(side_t *s)
{
    VIP_VI_HANDLE vi;
    VIP_BOOLEAN recv;
    if (s->cq)
        CHECK_RET(VIP_NOT_DONE, VipCQDone(s->cq, &vi, &recv));
    for (unsigned v = 0; v < s->plan->nvis; v++) {
        CHECK_STATE(VIP_STATE_IDLE, s->vi[v]);
        CHECK_OK(VipDestroyVi(s->vi[v]));
    }
    if (s->cq)
        CHECK_OK(VipDestroyCQ(s->cq));
    vt_dpool_fini(&s->descs);
    vt_mem_dereg(&s->buf);
    CHECK_OK(VipDestroyPtag(s->nic, s->ptag));
    CHECK_OK(VipCloseNic(s->nic));
}

/* Through the CQ: the next receive completion of any VI, which the CQ must
 * name, and then *Done must have it at once.  Returns the VI's index. */
static unsigned cq_next(side_t *s, VIP_DESCRIPTOR **d)
{
    VIP_VI_HANDLE vi = NULL;
    VIP_BOOLEAN recv = VIP_FALSE;
    if (s->plan->wait[s->server]) {
        CHECK_OK(VipCQWait(s->cq, VT_WAIT_MS, &vi, &recv));
    } else {
        double until = vt_now_ms() + (double)VT_WAIT_MS;
        VIP_RETURN r;
        while ((r = VipCQDone(s->cq, &vi, &recv)) == VIP_NOT_DONE && vt_now_ms() < until)
            ;
        CHECK_OK(r);
    }
    CHECK_EQ(VIP_TRUE, recv);
    for (unsigned v = 0; v < s->plan->nvis; v++) {
        if (s->vi[v] == vi) {
            *d = NULL;
            CHECK_OK(VipRecvDone(vi, d));
            CHECK(*d != NULL);
            return v;
        }
    }
    VT_FAIL("the CQ named %p, none of this side's VIs", (void *)vi);
}

/* Without a CQ: the next receive completion of VI v. */
static VIP_DESCRIPTOR *recv_on(side_t *s, unsigned v)
{
    return s->plan->wait[s->server] ? vt_recv_wait(s->vi[v]) : vt_recv_done(s->vi[v]);
}

static VIP_DESCRIPTOR *send_on(side_t *s, unsigned v)
{
    return s->plan->wait[s->server] ? vt_send_wait(s->vi[v]) : vt_send_done(s->vi[v]);
}

/* Where the receive of op i of a round lies. */
static size_t recv_off(const round_t *rd, unsigned i)
{
    size_t off = RECV_AREA;
    for (unsigned k = 0; k < i; k++)
        off += rd->ops[k].len + rd->ops[k].slack + GUARD;
    return off;
}

/* The room of the receive of op i of round k: the message and its slack,
 * less what a too long send exceeds it by. */
static size_t room_of(const plan_t *p, unsigned k, unsigned i)
{
    const op_t *o = &p->rounds[k].ops[i];
    return o->len + o->slack - (too_long(p, k, i) ? p->over : 0);
}

/* Where the source of op i lies in the sender's buffer (a read's place). */
static size_t send_off(unsigned i) { return SEND_AREA + (size_t)i * (MAX_SEND + GUARD); }

static void check_junk(const side_t *s, size_t off, size_t n, const char *what, unsigned i)
{
    for (size_t k = 0; k < n; k++)
        if (s->buf.base[off + k] != JUNK)
            VT_FAIL("%s of transfer %u: byte %zu changed to 0x%02x", what, i, k,
                    s->buf.base[off + k]);
}

static int takes_receive(const plan_t *p, unsigned k, unsigned i)
{
    const op_t *o = &p->rounds[k].ops[i];
    return (o->kind == OP_SEND || o->kind == OP_WRITE_IMM) && !unreceived(p, k, i);
}

/* ------------------------------------------------------------------ */

/* Checks the receive d that op i of round k completed. */
static void check_received(side_t *s, unsigned k, unsigned i, VIP_DESCRIPTOR *got)
{
    const plan_t *p = s->plan;
    const op_t *o = &p->rounds[k].ops[i];
    size_t off = recv_off(&p->rounds[k], i);
    if (too_long(p, k, i)) {
        /* Too long: a length error, and nothing past the buffer. */
        CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_LENGTH_ERROR, got);
        check_junk(s, off + room_of(p, k, i), GUARD, "bytes after a too short receive", i);
        if (reliable(p))
            CHECK_STATE_SOON(VIP_STATE_ERROR, s->vi[o->vi]);
        else
            CHECK_STATE(VIP_STATE_CONNECTED, s->vi[o->vi]);
    } else if (o->kind == OP_SEND) {
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | (o->imm ? VIP_STATUS_IMMEDIATE : 0), got);
        CHECK_EQ(o->len, got->CS.Length);
        CHECK_PATTERN(s->buf.base + off, o->len, o->pattern);
        check_junk(s, off + o->len, o->slack + GUARD, "bytes after the message", i);
    } else {
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_REMOTE_RDMA_WRITE | VIP_STATUS_IMMEDIATE, got);
        CHECK_EQ(o->len, got->CS.Length);
        check_junk(s, off, room_of(p, k, i) + GUARD, "the receive buffer of an RDMA write", i);
    }
    if (o->imm)
        CHECK_EQ(o->immediate, got->CS.ImmediateData);
}

static void receive_round(side_t *s, unsigned k)
{
    const plan_t *p = s->plan;
    const round_t *rd = &p->rounds[k];
    unsigned posted[MAX_VIS] = {0}, taken[MAX_VIS] = {0}, total = 0;
    unsigned which[MAX_VIS][MAX_STEPS]; /* per VI, the ops of its receives in order */
    memset(s->buf.base + RECV_AREA, JUNK, RDMA_AREA + RDMA_BYTES - RECV_AREA);
    for (unsigned i = 0; i < rd->nops; i++) {
        const op_t *o = &rd->ops[i];
        if (!takes_receive(p, k, i))
            continue;
        VIP_DESCRIPTOR *d = desc(s, o->vi, RECV_DESC + posted[o->vi]);
        size_t n = room_of(p, k, i);
        if (n == 0) {
            vt_desc_clear(d, 0);
        } else {
            unsigned segs = o->rsegs < n ? o->rsegs : (unsigned)n;
            vt_desc_recv(d, s->buf.base + recv_off(rd, i), s->buf.mh, n, segs);
        }
        CHECK_OK(VipPostRecv(s->vi[o->vi], d, s->descs.mem.mh));
        which[o->vi][posted[o->vi]++] = i;
        total++;
    }
    vt_sync(s->fd, 0x100 + k);
    if (s->cq) {
        /* In any order across VIs, in posting order on each. */
        for (unsigned n = 0; n < total; n++) {
            VIP_DESCRIPTOR *got;
            unsigned v = cq_next(s, &got);
            if (taken[v] == posted[v])
                VT_FAIL("a completion on VI %u beyond the %u receives posted", v, posted[v]);
            CHECK_PTR(desc(s, v, RECV_DESC + taken[v]), got);
            check_received(s, k, which[v][taken[v]++], got);
        }
    } else {
        for (unsigned v = 0; v < p->nvis; v++)
            for (; taken[v] < posted[v]; taken[v]++) {
                VIP_DESCRIPTOR *got = recv_on(s, v);
                CHECK_PTR(desc(s, v, RECV_DESC + taken[v]), got);
                check_received(s, k, which[v][taken[v]], got);
            }
    }
    if (p->no_recv && k + 1 == p->nrounds) {
        /* The last send found no receive: the connection broke after
         * everything before it on that VI arrived. */
        unsigned v = (unsigned)broken_vi(p);
        CHECK_STATE_SOON(VIP_STATE_ERROR, s->vi[v]);
        CHECK_ERROR_REPORTED(&s->errs, VIP_ERROR_RECVQ_EMPTY, s->vi[v]);
    }
    /* Every VI's closing send came after its writes: all of them have landed. */
    size_t at = 0;
    for (unsigned i = 0; i < rd->nops; i++) {
        const op_t *o = &rd->ops[i];
        if (o->kind != OP_WRITE && o->kind != OP_WRITE_IMM)
            continue;
        check_junk(s, RDMA_AREA + at, o->target - at, "RDMA area before the write", i);
        CHECK_PATTERN(s->buf.base + RDMA_AREA + o->target, o->len, o->pattern);
        at = o->target + o->len;
    }
    check_junk(s, RDMA_AREA + at, RDMA_BYTES - at, "RDMA area after the writes", rd->nops);
    VIP_DESCRIPTOR *none = NULL;
    VIP_VI_HANDLE vi;
    VIP_BOOLEAN recv;
    for (unsigned v = 0; v < p->nvis; v++) {
        CHECK_RET(VIP_NOT_DONE, VipRecvDone(s->vi[v], &none));
        if ((int)v != broken_vi(p) || k + 1 < p->nrounds)
            CHECK_STATE(VIP_STATE_CONNECTED, s->vi[v]);
    }
    if (s->cq)
        CHECK_RET(VIP_NOT_DONE, VipCQDone(s->cq, &vi, &recv));
}

static void send_round(side_t *s, unsigned k)
{
    const plan_t *p = s->plan;
    const round_t *rd = &p->rounds[k];
    unsigned posted[MAX_VIS] = {0};
    unsigned which[MAX_VIS][MAX_STEPS];
    vt_sync(s->fd, 0x100 + k);
    for (unsigned i = 0; i < rd->nops; i++) {
        const op_t *o = &rd->ops[i];
        VIP_DESCRIPTOR *d = desc(s, o->vi, SEND_DESC + posted[o->vi]);
        void *src = s->buf.base + send_off(i);
        which[o->vi][posted[o->vi]++] = i;
        if (o->kind == OP_READ) {
            memset(src, JUNK, o->len + GUARD);
            vt_desc_rdma(d, VIP_CONTROL_OP_RDMAREAD, 0, s->peer_base + READ_AREA + o->target, s->peer_mh,
                         src, s->buf.mh, o->len, o->nseg);
        } else {
            vt_fill(src, o->len, o->pattern);
            if (o->kind != OP_SEND) {
                VIP_UINT16 control = VIP_CONTROL_OP_RDMAWRITE | (o->imm ? VIP_CONTROL_IMMEDIATE : 0);
                vt_desc_rdma(d, control, o->immediate, s->peer_base + RDMA_AREA + o->target, s->peer_mh,
                             src, s->buf.mh, o->len, o->nseg);
            } else if (o->nseg == 0) {
                vt_desc_clear(d, 0);
                d->CS.Control = o->imm ? VIP_CONTROL_IMMEDIATE : 0;
                d->CS.ImmediateData = o->immediate;
            } else {
                vt_desc_send(d, o->imm ? VIP_CONTROL_IMMEDIATE : 0, o->immediate, src, s->buf.mh,
                             o->len, o->nseg);
            }
        }
        CHECK_OK(VipPostSend(s->vi[o->vi], d, s->descs.mem.mh));
    }
    for (unsigned v = 0; v < p->nvis; v++) {
        for (unsigned n = 0; n < posted[v]; n++) {
            unsigned i = which[v][n];
            const op_t *o = &rd->ops[i];
            VIP_DESCRIPTOR *got = send_on(s, v);
            CHECK_PTR(desc(s, v, SEND_DESC + n), got);
            VIP_UINT32 op = o->kind == OP_SEND   ? VIP_STATUS_OP_SEND
                            : o->kind == OP_READ ? VIP_STATUS_OP_RDMA_READ
                                                 : VIP_STATUS_OP_RDMA_WRITE;
            if (unreceived(p, k, i)) {
                /* No receive there (tests/c/errors.c has the same); across
                 * hosts the peer's transport may have acknowledged it. */
                if (tag == NULL)
                    CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_TRANSPORT_ERROR, got);
                else
                    CHECK(got->CS.Status & VIP_STATUS_DONE);
                CHECK_STATE_SOON(VIP_STATE_ERROR, s->vi[v]);
                CHECK_ERROR_REPORTED(&s->errs, VIP_ERROR_CONN_LOST, s->vi[v]);
                continue;
            }
            if (too_long(p, k, i)) {
                /* Longer than its receive. */
                CHECK_TOO_LONG_SEND(p->level, got);
                if (reliable(p))
                    CHECK_STATE_SOON(VIP_STATE_ERROR, s->vi[v]);
                else
                    CHECK_STATE(VIP_STATE_CONNECTED, s->vi[v]);
                continue;
            }
            CHECK_STATUS(VIP_STATUS_DONE | op, got);
            if (o->kind == OP_READ) {
                const VIP_UINT8 *b = s->buf.base + send_off(i);
                CHECK_EQ(o->len, got->CS.Length);
                for (uint32_t j = 0; j < o->len; j++)
                    if (b[j] != vt_pat(read_pattern(p), o->target + j))
                        VT_FAIL("byte %u of an RDMA read of %u bytes from offset %u: expected 0x%02x, got 0x%02x",
                                j, o->len, o->target, vt_pat(read_pattern(p), o->target + j), b[j]);
                check_junk(s, send_off(i) + o->len, GUARD, "bytes after an RDMA read", i);
            }
        }
        VIP_DESCRIPTOR *none = NULL;
        CHECK_RET(VIP_NOT_DONE, VipSendDone(s->vi[v], &none));
    }
}

/* The ending: receives left posted on every VI of both sides, then one side
 * disconnects them all. */
static void finish(side_t *s)
{
    const plan_t *p = s->plan;
    const unsigned *left = p->left[s->server];
    unsigned total = 0, taken[MAX_VIS] = {0};
    for (unsigned v = 0; v < p->nvis; v++) {
        for (unsigned i = 0; i < left[v]; i++) {
            VIP_DESCRIPTOR *d = desc(s, v, RECV_DESC + i);
            vt_desc_recv(d, s->buf.base + RECV_AREA + (v * MAX_LEFT + i) * 4096, s->buf.mh, 4096, 1);
            CHECK_OK(VipPostRecv(s->vi[v], d, s->descs.mem.mh));
        }
        total += left[v];
    }
    vt_sync(s->fd, 0xE00);
    int closer = p->closer_is_server == s->server;
    for (unsigned v = 0; v < p->nvis; v++) {
        if (closer) {
            CHECK_OK(VipDisconnect(s->vi[v]));
            CHECK_STATE(VIP_STATE_IDLE, s->vi[v]);
        } else {
            CHECK_STATE_SOON(VIP_STATE_ERROR, s->vi[v]);
            if ((int)v != broken_vi(p))
                CHECK_ERROR_REPORTED(&s->errs, VIP_ERROR_CONN_LOST, s->vi[v]);
        }
    }
    /* Every receive left is flushed, in order on each VI. */
    for (unsigned n = 0; n < total; n++) {
        VIP_DESCRIPTOR *got;
        unsigned v;
        if (s->cq) {
            v = cq_next(s, &got);
        } else {
            for (v = 0; taken[v] == left[v]; v++)
                ;
            got = recv_on(s, v);
        }
        if (taken[v] == left[v])
            VT_FAIL("a completion on VI %u beyond the %u receives left", v, left[v]);
        CHECK_PTR(desc(s, v, RECV_DESC + taken[v]++), got);
        CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, got);
    }
    for (unsigned v = 0; v < p->nvis; v++) {
        VIP_DESCRIPTOR *none = NULL;
        CHECK_RET(VIP_NOT_DONE, VipRecvDone(s->vi[v], &none));
        if (!closer) {
            CHECK_OK(VipDisconnect(s->vi[v]));
            CHECK_STATE(VIP_STATE_IDLE, s->vi[v]);
        }
    }
    vt_sync(s->fd, 0xE01);
}

/* The server's host address by the name service. */
static VIP_NET_ADDRESS *host_addr(VIP_NIC_HANDLE nic, const char *disc)
{
    VIP_NET_ADDRESS *a = vt_addr_buf();
    CHECK_OK(VipNSInit(nic, NULL));
    CHECK_OK(VipNSGetHostByName(nic, (VIP_CHAR *)server_host, a, 0));
    size_t dl = strlen(disc);
    memcpy(a->HostAddress + a->HostAddressLen, disc, dl);
    a->DiscriminatorLen = (VIP_UINT16)dl;
    return a;
}

static void connect_remote(side_t *s, VIP_VI_HANDLE vi, const char *disc)
{
    char cdisc[VT_MAX_DISC + 8];
    snprintf(cdisc, sizeof cdisc, "%.48s/c", disc);
    VIP_NET_ADDRESS *local = vt_addr_local(s->nic, cdisc);
    VIP_NET_ADDRESS *remote = host_addr(s->nic, disc);
    VIP_VI_ATTRIBUTES ra;
    CHECK_OK(VipConnectRequest(vi, local, remote, VT_WAIT_MS, &ra));
    free(local);
    free(remote);
}

static void run_seed(int fd, int server, uint32_t seed)
{
    plan_t p;
    side_t s;
    make_plan(&p, seed);
    snprintf(role, sizeof role, "%s, seed %u", server ? "server" : "client", seed);
    vt_role = role;
    vt_sync(fd, 0x5EED0000u + seed);
    side_open(&s, &p, fd, server);
    for (unsigned v = 0; v < p.nvis; v++) {
        char disc[VT_MAX_DISC];
        if (tag != NULL)
            snprintf(disc, sizeof disc, "wl.%.40s.%u.%u", tag, seed, v);
        else
            vt_disc(disc, sizeof disc, "workload.%u.%u", seed, v);
        if (server)
            vt_accept(s.nic, s.vi[v], disc);
        else if (server_host != NULL)
            connect_remote(&s, s.vi[v], disc);
        else
            vt_connect(s.nic, s.vi[v], disc);
        CHECK_STATE(VIP_STATE_CONNECTED, s.vi[v]);
    }
    vt_put_u64(fd, (uint64_t)(uintptr_t)s.buf.base);
    vt_put_u64(fd, s.buf.mh);
    s.peer_base = vt_get_u64(fd);
    s.peer_mh = (VIP_MEM_HANDLE)vt_get_u64(fd);
    for (unsigned k = 0; k < p.nrounds; k++) {
        if (p.rounds[k].from_server == server)
            send_round(&s, k);
        else
            receive_round(&s, k);
        vt_sync(fd, 0x200 + k);
    }
    finish(&s);
    side_close(&s);
}

typedef struct {
    uint32_t first, last;
} seeds_t;

static void run_seeds(int fd, int server, const seeds_t *seeds)
{
    for (uint32_t seed = seeds->first; seed <= seeds->last; seed++)
        run_seed(fd, server, seed);
}

static void server_main(int fd, void *arg) { run_seeds(fd, 1, arg); }

/* Across hosts, the server: the control channel's first connection. */
static int control_listen(void)
{
    int l = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, zero = 0;
    struct sockaddr_in6 a;
    CHECK(l >= 0);
    CHECK(setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
    CHECK(setsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) == 0);
    memset(&a, 0, sizeof a);
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(WL_PORT);
    a.sin6_addr = in6addr_any;
    if (bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 1) != 0)
        VT_FAIL("control channel on port %d: %s", WL_PORT, strerror(errno));
    printf("workload server: listening on port %d\n", WL_PORT);
    int fd = accept4(l, NULL, NULL, SOCK_CLOEXEC);
    CHECK(fd >= 0);
    close(l);
    return fd;
}

/* Across hosts, the client: the control channel to the server's host, whose
 * address the name service gives; tried again while the server starts. */
static int control_connect(void)
{
    VIP_NIC_HANDLE nic = vt_open_nic(device());
    VIP_NET_ADDRESS *a = host_addr(nic, "");
    struct sockaddr_storage ss;
    socklen_t len;
    memset(&ss, 0, sizeof ss);
    if (a->HostAddressLen == 4) {
        struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
        v4->sin_family = AF_INET;
        v4->sin_port = htons(WL_PORT);
        memcpy(&v4->sin_addr, a->HostAddress, 4);
        len = sizeof *v4;
    } else {
        struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
        CHECK_EQ(16, a->HostAddressLen);
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(WL_PORT);
        memcpy(&v6->sin6_addr, a->HostAddress, 16);
        len = sizeof *v6;
    }
    free(a);
    CHECK_OK(VipCloseNic(nic));
    double until = vt_now_ms() + (double)VT_WAIT_MS;
    for (;;) {
        int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(fd >= 0);
        if (connect(fd, (struct sockaddr *)&ss, len) == 0)
            return fd;
        int e = errno;
        close(fd);
        if (vt_now_ms() > until)
            VT_FAIL("control channel to %s port %d: %s", server_host, WL_PORT, strerror(e));
        vt_sleep_ms(100);
    }
}

int main(int argc, char **argv)
{
    vt_init();
    seeds_t seeds = {1, getenv("VT_QUICK") ? 20 : 200};
    const char *one = getenv("VT_SEED"), *many = getenv("VT_SEEDS");
    if (one) {
        seeds.first = seeds.last = (uint32_t)strtoul(one, NULL, 0);
    } else if (many) {
        seeds.last = (uint32_t)strtoul(many, NULL, 0);
    }
    if (argc == 3 && strcmp(argv[1], "server") == 0) {
        tag = argv[2];
        run_seeds(control_listen(), 1, &seeds);
        printf("workload server: seeds %u to %u passed\n", seeds.first, seeds.last);
        return 0;
    }
    if (argc == 4 && strcmp(argv[1], "client") == 0) {
        tag = argv[2];
        server_host = argv[3];
        run_seeds(control_connect(), 0, &seeds);
        printf("workload client: seeds %u to %u passed\n", seeds.first, seeds.last);
        return 0;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: workload [server TAG | client TAG HOST]\n");
        return 2;
    }
    vt_child server = vt_spawn("server", server_main, &seeds);
    run_seeds(server.fd, 0, &seeds);
    vt_join_at(__FILE__, __LINE__, &server);
    printf("workload: seeds %u to %u passed\n", seeds.first, seeds.last);
    return 0;
}
