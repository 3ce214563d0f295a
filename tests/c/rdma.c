/*
 * rdma.c - RDMA write (with and without immediate data) and RDMA read
 * between two processes, and the protection checks of the target: a region
 * without EnableRdmaWrite, a target VI without EnableRdmaWrite, a region of
 * another ptag, an unregistered address, a range past the region's end, a
 * forged memory handle, a region whose EnableRdmaWrite the target turned
 * off, a handle the target deregistered, and a read from a region without
 * EnableRdmaRead.  The writes are refused again as small writes with
 * immediate data, which go through the ring rather than a copy.  The last two changes are made by the target while
 * connected: the initiator must see them at once.
 *
 * A refused operation completes at the initiator with RDMA_PROT_ERROR and no
 * byte of the target's memory changes (the target checks canary patterns in
 * all its buffers).  On reliable VIs both ends then go to VIP_STATE_ERROR
 * and the target's error callback reports VIP_ERROR_RDMAW_PROT (or _RDMAR_);
 * on an unreliable VI the connection stays usable.
 *
 * The client drives; the server (the target) executes commands sent over
 * the control channel and answers each with an acknowledgement.
 */
#include "vt.h"

#define MTU VT_MAX_TRANSFER
#define WSIZE (1u << 20)   /* target region with RDMA enabled */
#define SSIZE (64u << 10)  /* the other target buffers */

enum { SEED_W = 0xC1, SEED_N = 0xC2, SEED_P = 0xC3, SEED_U = 0xC4, SEED_D = 0xC5 };

/* Where the target's buffers are. */
typedef struct {
    uint64_t w, n, p, u, d;
    VIP_MEM_HANDLE wh, nh, ph, dh;
} info_t;

enum op {
    C_CONNECT,     /* arg: EnableRdmaWrite of the target VI; then accept */
    C_WRITTEN,     /* W[off, off+len) holds pattern seed, the rest canary */
    C_POSTRECV,    /* post one receive */
    C_IMMWRITTEN,  /* that receive completes as the RDMA write with imm */
    C_FILL,        /* W[off, off+len) := pattern seed, for a read */
    C_RESET,       /* restore the canaries */
    C_RECVCHECK,   /* that receive completes as a send of len bytes, seed */
    C_REFUSED,     /* arg: the error code the target must report (reliable) */
    C_WENABLE,     /* arg: EnableRdmaWrite of region W, set by VipSetMemAttributes */
    C_DEREG,       /* deregister region D (its memory stays, with its canary) */
    C_DISCONNECT,
    C_END,
};

typedef struct {
    uint32_t op, arg;
    uint64_t off, len;
    uint32_t seed, imm;
} cmd_t;

static const VIP_RELIABILITY_LEVEL levels[] = {
    VIP_SERVICE_UNRELIABLE, VIP_SERVICE_RELIABLE_DELIVERY, VIP_SERVICE_RELIABLE_RECEPTION};

/* ------------------------------------------------------------------ */
/* Target                                                               */
/* ------------------------------------------------------------------ */

typedef struct {
    VIP_RELIABILITY_LEVEL level;
    char disc[VT_MAX_DISC];
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag, other;
    VIP_VI_HANDLE vi;
    vt_mem w, n, p, d, rbuf;
    int d_registered;
    VIP_UINT8 *u; /* never registered */
    vt_dpool descs;
    vt_errlog errs;
} target_t;

static void canaries_set(target_t *t)
{
    vt_fill(t->w.base, WSIZE, SEED_W);
    vt_fill(t->n.base, SSIZE, SEED_N);
    vt_fill(t->p.base, SSIZE, SEED_P);
    vt_fill(t->u, SSIZE, SEED_U);
    vt_fill(t->d.base, SSIZE, SEED_D);
}

static void canaries_check(target_t *t)
{
    CHECK_PATTERN(t->w.base, WSIZE, SEED_W);
    CHECK_PATTERN(t->n.base, SSIZE, SEED_N);
    CHECK_PATTERN(t->p.base, SSIZE, SEED_P);
    CHECK_PATTERN(t->u, SSIZE, SEED_U);
    CHECK_PATTERN(t->d.base, SSIZE, SEED_D);
}

/* W holds the pattern in [off, off+len) and its canary elsewhere. */
static void check_written(target_t *t, uint64_t off, uint64_t len, uint32_t seed)
{
    VIP_UINT8 *w = t->w.base;
    CHECK_PATTERN(w + off, len, seed);
    for (uint64_t i = 0; i < off; i++)
        if (w[i] != vt_pat(SEED_W, i))
            VT_FAIL("W[%llu] changed before the written range", (unsigned long long)i);
    for (uint64_t i = off + len; i < WSIZE; i++)
        if (w[i] != vt_pat(SEED_W, i))
            VT_FAIL("W[%llu] changed after the written range", (unsigned long long)i);
    CHECK_PATTERN(t->n.base, SSIZE, SEED_N);
    CHECK_PATTERN(t->p.base, SSIZE, SEED_P);
    CHECK_PATTERN(t->u, SSIZE, SEED_U);
    CHECK_PATTERN(t->d.base, SSIZE, SEED_D);
    vt_fill(w, WSIZE, SEED_W);
}

static void target_level(int fd, VIP_RELIABILITY_LEVEL level)
{
    target_t t;
    memset(&t, 0, sizeof t);
    t.level = level;
    vt_disc(t.disc, sizeof t.disc, "rdma-%u", (unsigned)level);
    VIP_BOOLEAN rdma_read = level != VIP_SERVICE_UNRELIABLE;

    t.nic = vt_open_nic(VT_DEV);
    vt_errlog_init(&t.errs);
    CHECK_OK(VipErrorCallback(t.nic, &t.errs, vt_errlog_handler));
    CHECK_OK(VipCreatePtag(t.nic, &t.ptag));
    CHECK_OK(VipCreatePtag(t.nic, &t.other));
    vt_mem_reg(&t.w, t.nic, t.ptag, WSIZE, VIP_TRUE, VIP_TRUE);
    vt_mem_reg(&t.n, t.nic, t.ptag, SSIZE, VIP_FALSE, VIP_FALSE);
    vt_mem_reg(&t.p, t.nic, t.other, SSIZE, VIP_TRUE, VIP_TRUE);
    vt_mem_reg(&t.d, t.nic, t.ptag, SSIZE, VIP_TRUE, VIP_TRUE);
    t.d_registered = 1;
    vt_mem_reg(&t.rbuf, t.nic, t.ptag, 65536, VIP_FALSE, VIP_FALSE);
    t.u = vt_alloc(SSIZE);
    vt_dpool_init(&t.descs, t.nic, t.ptag, 4, 2);
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(level, t.ptag, MTU, VIP_TRUE, rdma_read);
    CHECK_OK(VipCreateVi(t.nic, &va, NULL, NULL, &t.vi));
    canaries_set(&t);

    info_t info = {(uintptr_t)t.w.base, (uintptr_t)t.n.base, (uintptr_t)t.p.base,
                   (uintptr_t)t.u,      (uintptr_t)t.d.base, t.w.mh,
                   t.n.mh,              t.p.mh,              t.d.mh};
    vt_put(fd, &info, sizeof info);

    VIP_DESCRIPTOR *rd = vt_dpool_get(&t.descs, 0);
    for (;;) {
        cmd_t c;
        vt_get(fd, &c, sizeof c);
        switch (c.op) {
        case C_CONNECT:
            va = vt_vi_attrs(level, t.ptag, MTU, (VIP_BOOLEAN)c.arg, rdma_read);
            CHECK_OK(VipSetViAttributes(t.vi, &va));
            vt_errlog_clear(&t.errs);
            vt_accept(t.nic, t.vi, t.disc);
            CHECK_STATE(VIP_STATE_CONNECTED, t.vi);
            break;
        case C_WRITTEN:
            check_written(&t, c.off, c.len, c.seed);
            break;
        case C_POSTRECV:
            vt_desc_recv(rd, t.rbuf.base, t.rbuf.mh, 4096, 1);
            CHECK_OK(VipPostRecv(t.vi, rd, t.descs.mem.mh));
            break;
        case C_IMMWRITTEN: {
            VIP_DESCRIPTOR *d = vt_recv_wait(t.vi);
            CHECK_PTR(rd, d);
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_REMOTE_RDMA_WRITE | VIP_STATUS_IMMEDIATE, d);
            CHECK_EQ(c.imm, d->CS.ImmediateData);
            CHECK_EQ(c.len, d->CS.Length);
            check_written(&t, c.off, c.len, c.seed);
            break;
        }
        case C_FILL:
            vt_fill(t.w.base + c.off, c.len, c.seed);
            break;
        case C_RESET:
            canaries_set(&t);
            break;
        case C_RECVCHECK: {
            VIP_DESCRIPTOR *d = vt_recv_wait(t.vi);
            CHECK_PTR(rd, d);
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, d);
            CHECK_EQ(c.len, d->CS.Length);
            CHECK_PATTERN(t.rbuf.base, c.len, c.seed);
            canaries_check(&t);
            break;
        }
        case C_REFUSED:
            canaries_check(&t);
            if (level == VIP_SERVICE_UNRELIABLE) {
                CHECK_STATE(VIP_STATE_CONNECTED, t.vi);
            } else {
                CHECK_STATE_SOON(VIP_STATE_ERROR, t.vi);
                CHECK_ERROR_REPORTED(&t.errs, (VIP_ERROR_CODE)c.arg, t.vi);
            }
            /* Still nothing changed. */
            canaries_check(&t);
            break;
        case C_WENABLE: {
            VIP_MEM_ATTRIBUTES ma;
            CHECK_OK(VipQueryMem(t.nic, t.w.base, t.w.mh, &ma));
            ma.EnableRdmaWrite = (VIP_BOOLEAN)c.arg;
            CHECK_OK(VipSetMemAttributes(t.nic, t.w.base, t.w.mh, &ma));
            break;
        }
        case C_DEREG:
            CHECK_OK(VipDeregisterMem(t.nic, t.d.base, t.d.mh));
            t.d_registered = 0;
            break;
        case C_DISCONNECT: {
            CHECK_OK(VipDisconnect(t.vi));
            CHECK_STATE(VIP_STATE_IDLE, t.vi);
            VIP_DESCRIPTOR *d;
            CHECK_RET(VIP_NOT_DONE, VipRecvDone(t.vi, &d));
            break;
        }
        case C_END:
            CHECK_OK(VipDestroyVi(t.vi));
            vt_dpool_fini(&t.descs);
            vt_mem_dereg(&t.w);
            vt_mem_dereg(&t.n);
            vt_mem_dereg(&t.p);
            if (t.d_registered)
                vt_mem_dereg(&t.d);
            else
                free(t.d.base);
            vt_mem_dereg(&t.rbuf);
            free(t.u);
            CHECK_OK(VipDestroyPtag(t.nic, t.other));
            CHECK_OK(VipDestroyPtag(t.nic, t.ptag));
            CHECK_OK(VipCloseNic(t.nic));
            vt_put_u64(fd, 1);
            return;
        default:
            VT_FAIL("unknown command %u", (unsigned)c.op);
        }
        vt_put_u64(fd, 1);
    }
}

static void target(int fd, void *arg)
{
    (void)arg;
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
        target_level(fd, levels[i]);
}

/* ------------------------------------------------------------------ */
/* Initiator                                                            */
/* ------------------------------------------------------------------ */

typedef struct {
    int fd;
    VIP_RELIABILITY_LEVEL level;
    char disc[VT_MAX_DISC];
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag;
    VIP_VI_HANDLE vi;
    vt_mem buf;
    vt_dpool descs;
    vt_errlog errs;
    info_t t;
} init_t;

static void cmd(init_t *in, uint32_t op, uint32_t arg, uint64_t off, uint64_t len, uint32_t seed,
                uint32_t imm)
{
    cmd_t c = {op, arg, off, len, seed, imm};
    vt_put(in->fd, &c, sizeof c);
    CHECK_EQ(1, vt_get_u64(in->fd));
}

static void connect_to(init_t *in, VIP_BOOLEAN target_vi_write)
{
    cmd_t c = {C_CONNECT, (uint32_t)target_vi_write, 0, 0, 0, 0};
    vt_put(in->fd, &c, sizeof c);
    vt_connect(in->nic, in->vi, in->disc);
    CHECK_EQ(1, vt_get_u64(in->fd));
    CHECK_STATE(VIP_STATE_CONNECTED, in->vi);
}

static void disconnect(init_t *in)
{
    cmd_t c = {C_DISCONNECT, 0, 0, 0, 0, 0};
    vt_put(in->fd, &c, sizeof c);
    CHECK_OK(VipDisconnect(in->vi));
    CHECK_STATE(VIP_STATE_IDLE, in->vi);
    CHECK_EQ(1, vt_get_u64(in->fd));
    VIP_DESCRIPTOR *d;
    CHECK_RET(VIP_NOT_DONE, VipSendDone(in->vi, &d));
}

/* Post an RDMA descriptor and wait for its completion. */
static VIP_DESCRIPTOR *rdma(init_t *in, VIP_UINT16 control, VIP_UINT32 imm, uint64_t raddr,
                            VIP_MEM_HANDLE rh, size_t len, unsigned nseg)
{
    VIP_DESCRIPTOR *d = vt_dpool_get(&in->descs, 0);
    vt_desc_rdma(d, control, imm, raddr, rh, in->buf.base, in->buf.mh, len, nseg);
    CHECK_OK(VipPostSend(in->vi, d, in->descs.mem.mh));
    VIP_DESCRIPTOR *got = vt_send_wait(in->vi);
    CHECK_PTR(d, got);
    return got;
}

static void good_operations(init_t *in)
{
    static const struct { uint64_t off, len; unsigned nseg; } w[] = {
        {0, 1, 1},         {1, 100, 2},          {4096, 4096, 1},   {333, 65539, 2},
        {0, WSIZE, 1},     {WSIZE - 7, 7, 2},    {12345, 200000, 3}, {64, 0, 1},
    };
    printf("    RDMA write\n");
    connect_to(in, VIP_TRUE);
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        uint32_t seed = 100 + (uint32_t)i;
        vt_fill(in->buf.base, w[i].len, seed);
        VIP_DESCRIPTOR *d = rdma(in, VIP_CONTROL_OP_RDMAWRITE, 0, in->t.w + w[i].off, in->t.wh,
                                 w[i].len, w[i].nseg);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RDMA_WRITE, d);
        CHECK_EQ(w[i].len, d->CS.Length);
        cmd(in, C_WRITTEN, 0, w[i].off, w[i].len, seed, 0);
    }

    printf("    RDMA write with immediate data\n");
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        uint32_t seed = 200 + (uint32_t)i;
        VIP_UINT32 imm = 0xC0FFEE00u + (VIP_UINT32)i;
        cmd(in, C_POSTRECV, 0, 0, 0, 0, 0);
        vt_fill(in->buf.base, w[i].len, seed);
        VIP_DESCRIPTOR *d = rdma(in, VIP_CONTROL_OP_RDMAWRITE | VIP_CONTROL_IMMEDIATE, imm,
                                 in->t.w + w[i].off, in->t.wh, w[i].len, w[i].nseg);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RDMA_WRITE, d);
        CHECK_EQ(w[i].len, d->CS.Length);
        cmd(in, C_IMMWRITTEN, 0, w[i].off, w[i].len, seed, imm);
    }

    if (in->level != VIP_SERVICE_UNRELIABLE) {
        printf("    RDMA read\n");
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
            uint32_t seed = 300 + (uint32_t)i;
            cmd(in, C_FILL, 0, w[i].off, w[i].len, seed, 0);
            memset(in->buf.base, 0, w[i].len + 64);
            VIP_DESCRIPTOR *d = rdma(in, VIP_CONTROL_OP_RDMAREAD, 0, in->t.w + w[i].off,
                                     in->t.wh, w[i].len, w[i].nseg);
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RDMA_READ, d);
            CHECK_EQ(w[i].len, d->CS.Length);
            CHECK_PATTERN(in->buf.base, w[i].len, seed);
            for (size_t k = 0; k < 64; k++)
                CHECK_EQ(0, in->buf.base[w[i].len + k]);
            cmd(in, C_RESET, 0, 0, 0, 0, 0);
        }
    }
    CHECK_STATE(VIP_STATE_CONNECTED, in->vi);
    disconnect(in);
}

typedef struct {
    const char *what;
    VIP_BOOLEAN target_vi_write;
    int read;
    int reliable_only;
} refusal_t;

static const refusal_t refusals[] = {
    {"write to a region without EnableRdmaWrite", VIP_TRUE, 0, 0},
    {"write through a target VI without EnableRdmaWrite", VIP_FALSE, 0, 0},
    {"write to a region of another ptag", VIP_TRUE, 0, 0},
    {"write to an unregistered address", VIP_TRUE, 0, 0},
    {"write past the end of the region", VIP_TRUE, 0, 0},
    {"write before the start of the region", VIP_TRUE, 0, 0},
    {"write with a forged memory handle", VIP_TRUE, 0, 0},
    {"write to a region whose EnableRdmaWrite the target turned off", VIP_TRUE, 0, 0},
    {"write with a handle the target deregistered", VIP_TRUE, 0, 0},
    {"read from a region without EnableRdmaRead", VIP_TRUE, 1, 1},
    {"read from an unregistered address", VIP_TRUE, 1, 1},
};

/* With `small_imm`, a write is a small one with immediate data, which goes
 * through the ring rather than a cross-memory copy: refused the same way. */
static void refused_operation(init_t *in, size_t k, int small_imm)
{
    const refusal_t *r = &refusals[k];
    if (r->reliable_only && in->level == VIP_SERVICE_UNRELIABLE)
        return;
    if (small_imm && r->read)
        return;
    printf("    refused: %s%s\n", r->what, small_imm ? " (64 B with immediate data)" : "");
    connect_to(in, r->target_vi_write);

    uint64_t addr = in->t.w;
    VIP_MEM_HANDLE h = in->t.wh;
    size_t len = 4096;
    switch (k) {
    case 0: addr = in->t.n; h = in->t.nh; break;
    case 1: break;
    case 2: addr = in->t.p; h = in->t.ph; break;
    case 3: addr = in->t.u; break;
    case 4: addr = in->t.w + WSIZE - 100; len = 200; break;
    case 5: addr = in->t.w - 64; len = 128; break;
    case 6: h = in->t.wh ^ 0x5A5A0000u; break;
    case 7: cmd(in, C_WENABLE, VIP_FALSE, 0, 0, 0, 0); break;
    case 8:
        addr = in->t.d;
        h = in->t.dh;
        if (!small_imm) /* deregistered already in the first pass */
            cmd(in, C_DEREG, 0, 0, 0, 0, 0);
        break;
    case 9: addr = in->t.n; h = in->t.nh; break;
    case 10: addr = in->t.u; break;
    }
    if (small_imm && len > 200)
        len = 64;
    uint32_t seed = 400 + (uint32_t)k;
    vt_fill(in->buf.base, len, seed);
    VIP_UINT16 control = r->read ? VIP_CONTROL_OP_RDMAREAD : VIP_CONTROL_OP_RDMAWRITE;
    if (small_imm)
        control |= VIP_CONTROL_IMMEDIATE;
    VIP_DESCRIPTOR *d = rdma(in, control, small_imm ? 0x5EEDu : 0, addr, h, len, 1);
    CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_RDMA_PROT_ERROR, d);
    /* A refused read brings nothing back either. */
    CHECK_PATTERN(in->buf.base, len, seed);

    if (in->level == VIP_SERVICE_UNRELIABLE) {
        CHECK_STATE(VIP_STATE_CONNECTED, in->vi);
        cmd(in, C_REFUSED, 0, 0, 0, 0, 0);
        /* The connection still carries messages. */
        cmd(in, C_POSTRECV, 0, 0, 0, 0, 0);
        vt_fill(in->buf.base, 1000, seed + 1);
        VIP_DESCRIPTOR *s = vt_dpool_get(&in->descs, 1);
        vt_desc_send(s, 0, 0, in->buf.base, in->buf.mh, 1000, 1);
        CHECK_OK(VipPostSend(in->vi, s, in->descs.mem.mh));
        VIP_DESCRIPTOR *got = vt_send_wait(in->vi);
        CHECK_PTR(s, got);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
        cmd(in, C_RECVCHECK, 0, 0, 1000, seed + 1, 0);
        CHECK_STATE(VIP_STATE_CONNECTED, in->vi);
    } else {
        CHECK_STATE_SOON(VIP_STATE_ERROR, in->vi);
        cmd(in, C_REFUSED, r->read ? VIP_ERROR_RDMAR_PROT : VIP_ERROR_RDMAW_PROT, 0, 0, 0, 0);
    }
    if (k == 7)
        cmd(in, C_WENABLE, VIP_TRUE, 0, 0, 0, 0);
    disconnect(in);
}

static void initiator_level(int fd, VIP_RELIABILITY_LEVEL level)
{
    init_t in;
    memset(&in, 0, sizeof in);
    in.fd = fd;
    in.level = level;
    vt_disc(in.disc, sizeof in.disc, "rdma-%u", (unsigned)level);
    printf("  %s\n", vt_level_name(level));
    VIP_BOOLEAN rdma_read = level != VIP_SERVICE_UNRELIABLE;

    in.nic = vt_open_nic(VT_DEV);
    vt_errlog_init(&in.errs);
    CHECK_OK(VipErrorCallback(in.nic, &in.errs, vt_errlog_handler));
    CHECK_OK(VipCreatePtag(in.nic, &in.ptag));
    vt_mem_reg(&in.buf, in.nic, in.ptag, 2 * WSIZE, VIP_FALSE, VIP_FALSE);
    vt_dpool_init(&in.descs, in.nic, in.ptag, 4, 4);
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(level, in.ptag, MTU, VIP_TRUE, rdma_read);
    CHECK_OK(VipCreateVi(in.nic, &va, NULL, NULL, &in.vi));
    vt_get(fd, &in.t, sizeof in.t);

    good_operations(&in);
    for (int small_imm = 0; small_imm <= 1; small_imm++)
        for (size_t k = 0; k < sizeof refusals / sizeof refusals[0]; k++)
            refused_operation(&in, k, small_imm);

    cmd(&in, C_END, 0, 0, 0, 0, 0);
    CHECK_OK(VipDestroyVi(in.vi));
    vt_dpool_fini(&in.descs);
    vt_mem_dereg(&in.buf);
    CHECK_OK(VipDestroyPtag(in.nic, in.ptag));
    CHECK_OK(VipCloseNic(in.nic));
}

int main(void)
{
    vt_init();
    vt_child srv = vt_spawn("target", target, NULL);
    vt_role = "initiator";
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
        initiator_level(srv.fd, levels[i]);
    vt_join(&srv);
    printf("rdma: ok\n");
    return 0;
}
