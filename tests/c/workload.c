/*
 * workload.c - seeded random workloads over VI pairs, checked at every step
 * against the VIA semantics.
 *
 * Each seed is one connection between this process (the client) and a
 * forked server, driven by a script both processes derive from the seed:
 * the reliability level, whether RDMA writes are enabled, whether each
 * side's receive queue completes through a CQ, whether completions are
 * polled or waited for; then rounds of transfers in either direction (sends
 * of 0 bytes to 64 KiB in 1 to 4 data segments, with or without immediate
 * data; RDMA writes with and without immediate data at random places; on
 * reliable VIs, RDMA reads of random ranges of the peer's memory), each
 * round ending with a send; in one seed of four the last round's closing
 * send is longer than its receive; and an ending: either side disconnects,
 * with receives left posted on both sides.
 *
 * Checked on every step:
 * - every descriptor completes exactly once, in the order of its queue,
 *   with the whole status word, length and immediate data it must have;
 * - a CQ names each completion of its queue once, before *Done returns it,
 *   and is empty at the end;
 * - received bytes are the sent ones, and no byte of a receive buffer past
 *   the message (or of one an RDMA write with immediate data consumed)
 *   changes;
 * - an RDMA write lands exactly in its range, visible once a later message
 *   of the same VI is received, and nothing else of the target area changes;
 * - an RDMA read brings exactly the bytes of its range, and nothing past
 *   them;
 * - a send longer than its receive completes that receive with a length
 *   error and changes no byte past it; the send's status and both VIs'
 *   states follow the reliability level (the connection breaks on a
 *   reliable VI and stays on an unreliable one);
 * - the side that disconnects is idle at once with its receives flushed;
 *   the other reaches the error state, hears VIP_ERROR_CONN_LOST (after an
 *   orderly run), and its receives are flushed, in order.
 * Over shared memory nothing is lost, so an unreliable VI is held to the
 * same delivery as a reliable one: its receives are always posted first.
 *
 * Across hosts (the UDP transport): `workload server TAG` on one host and
 * `workload client TAG HOST` on another, VIA_DEVICE naming the device; the
 * two talk over TCP port WL_PORT besides VIA.  There every VI is reliable:
 * an unreliable one may lose a datagram the kernel drops.
 *
 * VT_SEEDS=n runs seeds 1..n (default 40; 12 with VT_QUICK); VT_SEED=s
 * runs seed s alone.  A failure names its seed.
 */
#include "vt.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#define MAX_OPS    6                  /* transfers of a round, before its closing send */
#define MAX_ROUNDS 10
#define MAX_LEFT   3                  /* receives left posted at the end, per side */
#define MAX_SEND   65536              /* bytes of the largest send */
#define MAX_WRITE  16384              /* bytes of the largest RDMA write */
#define SEGS       4                  /* most data segments of a send or receive */
#define GUARD      64                 /* bytes between buffers that must not change */
#define JUNK       0xA5               /* what untouched bytes hold */

#define BUF_BYTES  (2u << 20)         /* each side's registered buffer: */
#define SEND_AREA  0u                 /* sources of sends and writes, places of reads */
#define RECV_AREA  (512u << 10)       /* receive buffers */
#define RDMA_AREA  (1u << 20)         /* RDMA write targets */
#define RDMA_BYTES (512u << 10)
#define READ_AREA  ((1u << 20) + (512u << 10)) /* RDMA read sources, one pattern per seed */
#define READ_BYTES (512u << 10)

#define WL_PORT    7411               /* the control channel across hosts */

#define NDESC      64
#define SEND_DESC  0                  /* descriptors [0, 16): sends */
#define RECV_DESC  16                 /* descriptors [16, 32): receives */

enum op_kind { OP_SEND, OP_WRITE_IMM, OP_WRITE, OP_READ };

typedef struct {
    enum op_kind kind;
    uint32_t len;
    unsigned nseg;       /* data segments on the sending side */
    int imm;             /* a send with immediate data */
    uint32_t immediate;
    uint32_t pattern;
    uint32_t target;     /* RDMA: offset in the peer's RDMA area (a read: its read area) */
} op_t;

typedef struct {
    int from_server;     /* who sends in this round */
    unsigned nops;       /* including the closing send */
    op_t ops[MAX_OPS + 1];
    uint32_t slack[MAX_OPS + 1]; /* receive room past the message */
    unsigned rsegs[MAX_OPS + 1]; /* segments of each receive */
} round_t;

typedef struct {
    uint32_t seed;
    VIP_RELIABILITY_LEVEL level;
    int rdma;
    int rdma_read;       /* RDMA reads enabled (reliable levels only) */
    int cq[2];           /* [server?]: the receive queue completes through a CQ */
    int wait[2];         /* [server?]: *Wait instead of polling *Done */
    unsigned nrounds;
    round_t rounds[MAX_ROUNDS];
    uint32_t over;       /* the last closing send is this much longer than its receive */
    int closer_is_server;
    unsigned left[2];    /* receives left posted at the end, [server?] */
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
    p->rdma = (int)pick(&r, 3) != 0;
    p->rdma_read = p->level != VIP_SERVICE_UNRELIABLE && pick(&r, 2);
    for (int s = 0; s < 2; s++) {
        p->cq[s] = (int)pick(&r, 2);
        p->wait[s] = (int)pick(&r, 2);
    }
    p->nrounds = 1 + pick(&r, MAX_ROUNDS);
    for (unsigned k = 0; k < p->nrounds; k++) {
        round_t *rd = &p->rounds[k];
        rd->from_server = (int)pick(&r, 2);
        rd->nops = pick(&r, MAX_OPS + 1) + 1;
        uint32_t target = 0;
        for (unsigned i = 0; i < rd->nops; i++) {
            op_t *o = &rd->ops[i];
            int last = i + 1 == rd->nops;
            enum op_kind kinds[4] = {OP_SEND};
            unsigned nkinds = 1;
            if (p->rdma) {
                kinds[nkinds++] = OP_WRITE_IMM;
                kinds[nkinds++] = OP_WRITE;
            }
            if (p->rdma_read)
                kinds[nkinds++] = OP_READ;
            o->kind = last ? OP_SEND : kinds[pick(&r, nkinds)];
            o->len = pick_len(&r, o->kind == OP_SEND ? MAX_SEND : MAX_WRITE);
            if (o->kind != OP_SEND && o->len == 0)
                o->len = 1;
            o->nseg = o->len == 0 ? 0 : 1 + pick(&r, SEGS < o->len ? SEGS : o->len);
            o->imm = o->kind == OP_WRITE_IMM || (o->kind == OP_SEND && pick(&r, 2));
            o->immediate = vt_rand(&r);
            o->pattern = vt_rand(&r);
            if (o->kind == OP_WRITE || o->kind == OP_WRITE_IMM) {
                target += pick(&r, 4) * GUARD;
                o->target = target;
                target += o->len + GUARD;
            } else if (o->kind == OP_READ) {
                o->target = pick(&r, READ_BYTES - o->len + 1);
            }
            rd->slack[i] = pick(&r, 3) == 0 ? 0 : pick(&r, 200);
            rd->rsegs[i] = 1 + pick(&r, SEGS);
        }
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
        rd->slack[rd->nops - 1] = 0;
    }
    p->closer_is_server = (int)pick(&r, 2);
    p->left[0] = pick(&r, MAX_LEFT + 1);
    p->left[1] = pick(&r, MAX_LEFT + 1);
}

/* ------------------------------------------------------------------ */

typedef struct {
    const plan_t *plan;
    int fd;
    int server;
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag;
    VIP_CQ_HANDLE cq;
    VIP_VI_HANDLE vi;
    vt_mem buf;
    vt_dpool descs;
    vt_errlog errs;
    uint64_t peer_base;
    VIP_MEM_HANDLE peer_mh;
} side_t;

static char role[64];

/* The pattern of both sides' read areas. */
static uint32_t read_pattern(const plan_t *p) { return p->seed ^ 0x5EAD5EADu; }

static VIP_DESCRIPTOR *desc(side_t *s, size_t i) { return vt_dpool_get(&s->descs, i); }

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
    vt_dpool_init(&s->descs, s->nic, s->ptag, NDESC, SEGS + 1);
    if (p->cq[server])
        CHECK_OK(VipCreateCQ(s->nic, 64, &s->cq));
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(p->level, s->ptag, VT_MAX_TRANSFER,
                                       p->rdma ? VIP_TRUE : VIP_FALSE,
                                       p->rdma_read ? VIP_TRUE : VIP_FALSE);
    CHECK_OK(VipCreateVi(s->nic, &va, NULL, p->cq[server] ? s->cq : NULL, &s->vi));
}

static void side_close(side_t *s)
{
    VIP_VI_HANDLE vi;
    VIP_BOOLEAN recv;
    CHECK_STATE(VIP_STATE_IDLE, s->vi);
    if (s->cq)
        CHECK_RET(VIP_NOT_DONE, VipCQDone(s->cq, &vi, &recv));
    CHECK_OK(VipDestroyVi(s->vi));
    if (s->cq)
        CHECK_OK(VipDestroyCQ(s->cq));
    vt_dpool_fini(&s->descs);
    vt_mem_dereg(&s->buf);
    CHECK_OK(VipDestroyPtag(s->nic, s->ptag));
    CHECK_OK(VipCloseNic(s->nic));
}

/* The next receive completion: through the CQ first when there is one, which
 * must name this VI's receive queue, and then *Done must have it at once. */
static VIP_DESCRIPTOR *next_recv(side_t *s)
{
    if (s->cq) {
        VIP_VI_HANDLE vi = NULL;
        VIP_BOOLEAN recv = VIP_FALSE;
        VIP_DESCRIPTOR *d = NULL;
        if (s->plan->wait[s->server]) {
            CHECK_OK(VipCQWait(s->cq, VT_WAIT_MS, &vi, &recv));
        } else {
            double until = vt_now_ms() + (double)VT_WAIT_MS;
            VIP_RETURN r;
            while ((r = VipCQDone(s->cq, &vi, &recv)) == VIP_NOT_DONE && vt_now_ms() < until)
                ;
            CHECK_OK(r);
        }
        CHECK_PTR(s->vi, vi);
        CHECK_EQ(VIP_TRUE, recv);
        CHECK_OK(VipRecvDone(s->vi, &d));
        CHECK(d != NULL);
        return d;
    }
    return s->plan->wait[s->server] ? vt_recv_wait(s->vi) : vt_recv_done(s->vi);
}

static VIP_DESCRIPTOR *next_send(side_t *s)
{
    return s->plan->wait[s->server] ? vt_send_wait(s->vi) : vt_send_done(s->vi);
}

/* Where receive i of a round lies, and its room. */
static size_t recv_off(const round_t *rd, unsigned i)
{
    size_t off = RECV_AREA;
    for (unsigned k = 0; k < i; k++)
        off += rd->ops[k].len + rd->slack[k] + GUARD;
    return off;
}

/* The room of receive i: the message and its slack, less what a too long
 * closing send exceeds it by. */
static size_t room_of(const plan_t *p, const round_t *rd, unsigned i)
{
    int faulty = rd == &p->rounds[p->nrounds - 1] && i + 1 == rd->nops;
    return rd->ops[i].len + rd->slack[i] - (faulty ? p->over : 0);
}

static int reliable(const plan_t *p) { return p->level != VIP_SERVICE_UNRELIABLE; }

/* Where the source of op i lies in the sender's buffer. */
static size_t send_off(unsigned i) { return SEND_AREA + (size_t)i * (MAX_SEND + GUARD); }

static void check_junk(const side_t *s, size_t off, size_t n, const char *what, unsigned i)
{
    for (size_t k = 0; k < n; k++)
        if (s->buf.base[off + k] != JUNK)
            VT_FAIL("%s of transfer %u: byte %zu changed to 0x%02x", what, i, k,
                    s->buf.base[off + k]);
}

/* ------------------------------------------------------------------ */

static void receive_round(side_t *s, const round_t *rd, unsigned k)
{
    const plan_t *p = s->plan;
    memset(s->buf.base + RECV_AREA, JUNK, RDMA_AREA + RDMA_BYTES - RECV_AREA);
    unsigned nrecv = 0;
    for (unsigned i = 0; i < rd->nops; i++) {
        if (rd->ops[i].kind == OP_WRITE || rd->ops[i].kind == OP_READ)
            continue;
        VIP_DESCRIPTOR *d = desc(s, RECV_DESC + nrecv++);
        size_t n = room_of(p, rd, i);
        if (n == 0) {
            vt_desc_clear(d, 0);
        } else {
            unsigned segs = rd->rsegs[i] < n ? rd->rsegs[i] : (unsigned)n;
            vt_desc_recv(d, s->buf.base + recv_off(rd, i), s->buf.mh, n, segs);
        }
        CHECK_OK(VipPostRecv(s->vi, d, s->descs.mem.mh));
    }
    vt_sync(s->fd, 0x100 + k);
    nrecv = 0;
    for (unsigned i = 0; i < rd->nops; i++) {
        const op_t *o = &rd->ops[i];
        if (o->kind == OP_WRITE || o->kind == OP_READ)
            continue;
        VIP_DESCRIPTOR *want = desc(s, RECV_DESC + nrecv++);
        VIP_DESCRIPTOR *got = next_recv(s);
        CHECK_PTR(want, got);
        size_t off = recv_off(rd, i);
        if (o->kind == OP_SEND && p->over && k + 1 == p->nrounds && i + 1 == rd->nops) {
            /* Too long: a length error, and nothing past the buffer. */
            CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_LENGTH_ERROR, got);
            check_junk(s, off + room_of(p, rd, i), GUARD, "bytes after a too short receive", i);
            if (reliable(p))
                CHECK_STATE_SOON(VIP_STATE_ERROR, s->vi);
            else
                CHECK_STATE(VIP_STATE_CONNECTED, s->vi);
        } else if (o->kind == OP_SEND) {
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | (o->imm ? VIP_STATUS_IMMEDIATE : 0), got);
            CHECK_EQ(o->len, got->CS.Length);
            CHECK_PATTERN(s->buf.base + off, o->len, o->pattern);
            check_junk(s, off + o->len, rd->slack[i] + GUARD, "bytes after the message", i);
        } else {
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_REMOTE_RDMA_WRITE | VIP_STATUS_IMMEDIATE, got);
            CHECK_EQ(o->len, got->CS.Length);
            check_junk(s, off, room_of(p, rd, i) + GUARD, "the receive buffer of an RDMA write", i);
        }
        if (o->imm)
            CHECK_EQ(o->immediate, got->CS.ImmediateData);
    }
    /* The closing send came after every write: all of them have landed. */
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
    if (!s->cq)
        CHECK_RET(VIP_NOT_DONE, VipRecvDone(s->vi, &none));
}

static void send_round(side_t *s, const round_t *rd, unsigned k)
{
    vt_sync(s->fd, 0x100 + k);
    for (unsigned i = 0; i < rd->nops; i++) {
        const op_t *o = &rd->ops[i];
        VIP_DESCRIPTOR *d = desc(s, SEND_DESC + i);
        void *src = s->buf.base + send_off(i);
        if (o->kind == OP_READ) {
            memset(src, JUNK, o->len + GUARD);
            vt_desc_rdma(d, VIP_CONTROL_OP_RDMAREAD, 0, s->peer_base + READ_AREA + o->target, s->peer_mh,
                         src, s->buf.mh, o->len, o->nseg);
            CHECK_OK(VipPostSend(s->vi, d, s->descs.mem.mh));
            continue;
        }
        vt_fill(src, o->len, o->pattern);
        if (o->kind == OP_SEND) {
            if (o->nseg == 0) {
                vt_desc_clear(d, 0);
                d->CS.Control = o->imm ? VIP_CONTROL_IMMEDIATE : 0;
                d->CS.ImmediateData = o->immediate;
            } else {
                vt_desc_send(d, o->imm ? VIP_CONTROL_IMMEDIATE : 0, o->immediate, src, s->buf.mh,
                             o->len, o->nseg);
            }
        } else {
            VIP_UINT16 control = VIP_CONTROL_OP_RDMAWRITE | (o->imm ? VIP_CONTROL_IMMEDIATE : 0);
            vt_desc_rdma(d, control, o->immediate, s->peer_base + RDMA_AREA + o->target, s->peer_mh,
                         src, s->buf.mh, o->len, o->nseg);
        }
        CHECK_OK(VipPostSend(s->vi, d, s->descs.mem.mh));
    }
    const plan_t *p = s->plan;
    for (unsigned i = 0; i < rd->nops; i++) {
        VIP_DESCRIPTOR *got = next_send(s);
        CHECK_PTR(desc(s, SEND_DESC + i), got);
        const op_t *o = &rd->ops[i];
        VIP_UINT32 op = o->kind == OP_SEND   ? VIP_STATUS_OP_SEND
                        : o->kind == OP_READ ? VIP_STATUS_OP_RDMA_READ
                                             : VIP_STATUS_OP_RDMA_WRITE;
        if (p->over && k + 1 == p->nrounds && i + 1 == rd->nops) {
            /* Longer than its receive (tests/c/errors.c has the same). */
            switch (p->level) {
            case VIP_SERVICE_UNRELIABLE:
                CHECK_STATUS(VIP_STATUS_DONE | op, got);
                break;
            case VIP_SERVICE_RELIABLE_DELIVERY:
                CHECK(got->CS.Status & VIP_STATUS_DONE);
                break;
            default:
                CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_REMOTE_DESC_ERROR, got);
                break;
            }
            if (reliable(p))
                CHECK_STATE_SOON(VIP_STATE_ERROR, s->vi);
            else
                CHECK_STATE(VIP_STATE_CONNECTED, s->vi);
        } else {
            CHECK_STATUS(VIP_STATUS_DONE | op, got);
        }
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
    CHECK_RET(VIP_NOT_DONE, VipSendDone(s->vi, &none));
}

/* The ending: receives left posted on both sides, then one disconnects. */
static void finish(side_t *s)
{
    const plan_t *p = s->plan;
    unsigned left = p->left[s->server];
    for (unsigned i = 0; i < left; i++) {
        VIP_DESCRIPTOR *d = desc(s, RECV_DESC + i);
        vt_desc_recv(d, s->buf.base + RECV_AREA + i * 4096, s->buf.mh, 4096, 1);
        CHECK_OK(VipPostRecv(s->vi, d, s->descs.mem.mh));
    }
    vt_sync(s->fd, 0xE00);
    int closer = p->closer_is_server == s->server;
    int broken = p->over && reliable(p);
    if (closer) {
        CHECK_OK(VipDisconnect(s->vi));
        CHECK_STATE(VIP_STATE_IDLE, s->vi);
    } else {
        CHECK_STATE_SOON(VIP_STATE_ERROR, s->vi);
        if (!broken)
            CHECK_ERROR_REPORTED(&s->errs, VIP_ERROR_CONN_LOST, s->vi);
    }
    for (unsigned i = 0; i < left; i++) {
        VIP_DESCRIPTOR *got = next_recv(s);
        CHECK_PTR(desc(s, RECV_DESC + i), got);
        CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, got);
    }
    VIP_DESCRIPTOR *none = NULL;
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(s->vi, &none));
    if (!closer) {
        CHECK_OK(VipDisconnect(s->vi));
        CHECK_STATE(VIP_STATE_IDLE, s->vi);
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

static void connect_remote(side_t *s, const char *disc)
{
    char cdisc[VT_MAX_DISC + 8];
    snprintf(cdisc, sizeof cdisc, "%.48s/c", disc);
    VIP_NET_ADDRESS *local = vt_addr_local(s->nic, cdisc);
    VIP_NET_ADDRESS *remote = host_addr(s->nic, disc);
    VIP_VI_ATTRIBUTES ra;
    CHECK_OK(VipConnectRequest(s->vi, local, remote, VT_WAIT_MS, &ra));
    free(local);
    free(remote);
}

static void run_seed(int fd, int server, uint32_t seed)
{
    plan_t p;
    side_t s;
    char disc[VT_MAX_DISC];
    make_plan(&p, seed);
    snprintf(role, sizeof role, "%s, seed %u", server ? "server" : "client", seed);
    vt_role = role;
    vt_sync(fd, 0x5EED0000u + seed);
    side_open(&s, &p, fd, server);
    if (tag != NULL)
        snprintf(disc, sizeof disc, "wl.%.40s.%u", tag, seed);
    else
        vt_disc(disc, sizeof disc, "workload.%u", seed);
    if (server)
        vt_accept(s.nic, s.vi, disc);
    else if (server_host != NULL)
        connect_remote(&s, disc);
    else
        vt_connect(s.nic, s.vi, disc);
    CHECK_STATE(VIP_STATE_CONNECTED, s.vi);
    vt_put_u64(fd, (uint64_t)(uintptr_t)s.buf.base);
    vt_put_u64(fd, s.buf.mh);
    s.peer_base = vt_get_u64(fd);
    s.peer_mh = (VIP_MEM_HANDLE)vt_get_u64(fd);
    for (unsigned k = 0; k < p.nrounds; k++) {
        const round_t *rd = &p.rounds[k];
        if (rd->from_server == server)
            send_round(&s, rd, k);
        else
            receive_round(&s, rd, k);
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
    seeds_t seeds = {1, getenv("VT_QUICK") ? 12 : 40};
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
