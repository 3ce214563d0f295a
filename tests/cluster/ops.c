/*
 * ops.c - every data operation of VIs between two hosts.
 *
 *   ops server PEER     on one host: waits for the connections
 *   ops client PEER     on the other: requests them
 *
 * PEER is the other host's name (h1, h2, ...), resolved with the VIA name
 * service; the device comes from VIA_DEVICE (default /dev/via_eth0).  The
 * two processes keep in step over a TCP control channel (port 7301).
 *
 * For each reliability level (unreliable, reliable delivery, reliable
 * reception) and both connection models (client-server, peer-to-peer), one
 * VI pair runs:
 *   1. sends of 0, 1, 1371, 1372, 1373, 4096 and 65536 bytes, 1 MiB and
 *      4 MiB (MaxTransferSize), each once from one segment without immediate
 *      data and once from five segments with immediate data, into receives of
 *      one segment resp. three segments plus spare room, in both directions;
 *      the status word, Length, ImmediateData and every byte are checked, and
 *      the bytes after the message must stay untouched;
 *   2. RDMA writes without and with immediate data (client to server); RDMA
 *      reads of 1, 1373 and 4 MiB - 7 bytes on the reliable levels, and on
 *      the unreliable level an RDMA read that completes with FORMAT_ERROR;
 *   3. forbidden RDMA writes: into memory registered without
 *      EnableRdmaWrite, with a forged memory handle, past the end of the
 *      target in one packet and across its end in many packets: the
 *      initiator sees RDMA_PROT_ERROR and the target memory is unchanged; on
 *      the reliable levels both VIs go to the error state, the target reports
 *      VIP_ERROR_RDMAW_PROT, and the next case runs on a new VI pair;
 *   4. the same VI connects again, after the broken connection (reliable
 *      levels) and after a disconnect, and carries a message each way.
 * Then, per level, 64 VIs between the two hosts, whose receive queues share
 * one completion queue on each side, carry 8 messages each way, reaped with
 * VipCQWait.
 *
 * Unreliable VIs may lose messages: the unreliable parts accept a missing
 * message but never a wrong, partial or repeated one, and need at least
 * one message of each part to arrive.
 *
 * A wrong result of a forbidden RDMA write, or a reconnected VI that is not
 * connected, is reported and the run goes on; the program then fails at the
 * end.  Every other check ends the program at once.
 */
#include "cl.h"

#define CTL_PORT 7301

#define MAXMSG   VT_MAX_TRANSFER
#define GUARD    64              /* bytes after a message that must stay put */
#define FILL     0xEE            /* what receive buffers hold before a receive */
#define SEVERAL  5               /* send segments of the "several" messages */
#define RSEGS    3               /* receive segments for them (plus the room) */

/* RDMA memory of the server. */
#define TSIZE    (MAXMSG + 4096) /* target: RDMA write and read */
#define PSIZE    65536           /* plain: no RDMA */
#define PFILL    0x5A
#define RSEED    0x0BADC0DEu     /* pattern of the RDMA read source */

/* The 64-VI part. */
#define NMANY      64
#define MANY_MSGS  8
#define MANY_MAX   9000
#define MANY_MTU   65536

/* Control channel words. */
#define T_READY   0x52000000ull
#define T_SENT    0x53000000ull
#define T_DONE    0x44000000ull
#define T_CHECKED 0x43000000ull

/* Message sizes: these, and the packet boundaries of the interface's MTU
 * (see init_sizes). */
static const size_t base_sizes[] = {0, 1, 1371, 1372, 1373, 4096, 65536, 1u << 20, 4u << 20};
#define MAXSIZES 32
static size_t sizes[MAXSIZES];
static size_t nsizes;
#define NMSG (2 * nsizes)

static const VIP_RELIABILITY_LEVEL levels[] = {
    VIP_SERVICE_UNRELIABLE, VIP_SERVICE_RELIABLE_DELIVERY, VIP_SERVICE_RELIABLE_RECEPTION,
};

typedef struct {
    VIP_UINT64 target, rsrc, plain;
    VIP_MEM_HANDLE htarget, hrsrc, hplain;
} rdma_info;

typedef struct {
    int server;
    const char *peer;
    int fd; /* control channel */
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag;
    vt_errlog errs;
    vt_mem src, dst;            /* message source; receive buffer */
    vt_mem target, rsrc, plain; /* the server's RDMA memory */
    VIP_UINT8 *shadow;          /* what target must hold */
    vt_dpool descs;
    VIP_VI_HANDLE vi;
    VIP_RELIABILITY_LEVEL level;
    int p2p;
    unsigned conns; /* connections made: keeps discriminators unique */
    unsigned lost;  /* unreliable messages that did not arrive */
    int pending;    /* receive descriptor 0 is still posted (a lost message) */
} ops_t;

static int reliable(const ops_t *o) { return o->level != VIP_SERVICE_UNRELIABLE; }

static const char *model(const ops_t *o) { return o->p2p ? "peer-to-peer" : "client-server"; }

static uint32_t level_no(VIP_RELIABILITY_LEVEL l) { return l == 4 ? 3 : l; }

/* ------------------------------------------------------------------ */
/* VIs and connections                                                  */

static void soft_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void create_vi(ops_t *o)
{
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(o->level, o->ptag, MAXMSG, VIP_TRUE,
                                       reliable(o) ? VIP_TRUE : VIP_FALSE);
    CHECK_OK(VipCreateVi(o->nic, &va, NULL, NULL, &o->vi));
}

/* Connect the VI; disc (n bytes) receives the discriminator used. */
static void ops_connect_as(ops_t *o, char *disc, size_t size)
{
    char mine[64], theirs[64];
    unsigned n = o->conns++;
    snprintf(disc, size, "ops.%u.%s.%u", (unsigned)o->level, o->p2p ? "p2p" : "cs", n);
    vt_sync(o->fd, 0xC0000 + n);
    if (o->p2p) {
        snprintf(mine, sizeof mine, "%s/%s", disc, o->server ? "s" : "c");
        snprintf(theirs, sizeof theirs, "%s/%s", disc, o->server ? "c" : "s");
        cl_peer_request(o->nic, o->vi, o->peer, mine, theirs);
        cl_peer_wait(o->vi, o->level);
    } else if (o->server) {
        cl_accept(o->nic, o->vi, disc, o->level);
    } else {
        cl_request(o->nic, o->vi, o->peer, disc, o->level);
    }
}

/* Connect; neither side goes on before both have seen their VI connected. */
static void ops_connect(ops_t *o)
{
    char disc[48];
    ops_connect_as(o, disc, sizeof disc);
    CHECK_STATE(VIP_STATE_CONNECTED, o->vi);
    vt_sync(o->fd, 0xC1000 + o->conns);
}

/* Both sides are done with the connection: disconnect, and take back what
 * is still posted (receives that unreliable messages never filled). */
static void ops_disconnect(ops_t *o)
{
    VIP_DESCRIPTOR *d;
    vt_sync(o->fd, 0xD0000 + o->conns);
    CHECK_OK(VipDisconnect(o->vi));
    CHECK_STATE(VIP_STATE_IDLE, o->vi);
    while (VipRecvDone(o->vi, &d) == VIP_SUCCESS)
        CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, d);
    while (VipSendDone(o->vi, &d) == VIP_SUCCESS)
        CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, d);
    vt_sync(o->fd, 0xD1000 + o->conns);
    vt_errlog_clear(&o->errs);
    o->pending = 0;
}

/* ------------------------------------------------------------------ */
/* 1. Send and receive                                                  */

static void add_size(size_t n)
{
    size_t i = 0;
    while (i < nsizes && sizes[i] < n)
        i++;
    if ((i < nsizes && sizes[i] == n) || nsizes == MAXSIZES || n > MAXMSG)
        return;
    memmove(&sizes[i + 1], &sizes[i], (nsizes - i) * sizeof sizes[0]);
    sizes[i] = n;
    nsizes++;
}

/* The fixed sizes, plus one byte either side of one and two packets' worth
 * of payload (the MTU less IPv4 or IPv6, UDP and the 80-byte header) for
 * the device's interface. */
static void init_sizes(void)
{
    char path[96];
    unsigned mtu = 0;
    const char *dev = cl_device();
    const char *ifname = strncmp(dev, "/dev/", 5) == 0 ? dev + 5 : dev;
    if (strncmp(ifname, "via_", 4) == 0)
        ifname += 4;
    for (size_t i = 0; i < sizeof base_sizes / sizeof base_sizes[0]; i++)
        add_size(base_sizes[i]);
    snprintf(path, sizeof path, "/sys/class/net/%s/mtu", ifname);
    FILE *f = fopen(path, "r");
    if (f != NULL) {
        if (fscanf(f, "%u", &mtu) != 1)
            mtu = 0;
        fclose(f);
    }
    if (mtu > 128 + 2) {
        size_t per[2] = {mtu - 28 - 80, mtu - 48 - 80};
        for (int k = 0; k < 2; k++)
            for (size_t n = 1; n <= 2; n++) {
                add_size(n * per[k] - 1);
                add_size(n * per[k]);
                add_size(n * per[k] + 1);
            }
    }
    printf("interface %s, MTU %u; message sizes:", ifname, mtu);
    for (size_t i = 0; i < nsizes; i++)
        printf(" %zu", sizes[i]);
    printf("\n");
}

static uint32_t msg_seed(const ops_t *o, int dir, size_t m)
{
    return level_no(o->level) * 1000u + (o->p2p ? 500u : 0u) + (uint32_t)dir * 100u + (uint32_t)m + 1u;
}

static VIP_UINT32 msg_imm(const ops_t *o, int dir, size_t m)
{
    return 0x5E000000u | (level_no(o->level) << 20) | ((VIP_UINT32)o->p2p << 17) |
           ((VIP_UINT32)dir << 16) | (VIP_UINT32)m;
}

/* A receive for a message of len bytes: one segment of MAXMSG bytes, or
 * RSEGS segments over the message and one over the rest of the room. */
static void post_receive(ops_t *o, VIP_DESCRIPTOR *d, size_t len, int several)
{
    memset(o->dst.base, FILL, MAXMSG + GUARD);
    if (!several) {
        vt_desc_recv(d, o->dst.base, o->dst.mh, MAXMSG, 1);
    } else {
        unsigned n = RSEGS;
        vt_desc_recv(d, o->dst.base, o->dst.mh, len, RSEGS);
        if (len < MAXMSG) {
            VIP_DESCRIPTOR_SEGMENT *room = vt_seg(d, n++);
            room->Local.Data.Address = o->dst.base + len;
            room->Local.Handle = o->dst.mh;
            room->Local.Length = (VIP_UINT32)(MAXMSG - len);
        }
        d->CS.SegCount = (VIP_UINT16)n;
    }
    CHECK_OK(VipPostRecv(o->vi, d, o->descs.mem.mh));
}

static void sendrecv(ops_t *o, int dir)
{
    int sending = dir == 0 ? !o->server : o->server;
    VIP_DESCRIPTOR *rd = vt_dpool_get(&o->descs, 0);
    VIP_DESCRIPTOR *sd = vt_dpool_get(&o->descs, 1);
    unsigned arrived = 0;
    double t0 = vt_now_ms();

    for (size_t m = 0; m < NMSG; m++) {
        size_t len = sizes[m / 2];
        int several = (int)(m & 1);
        uint32_t seed = msg_seed(o, dir, m);
        VIP_UINT32 imm = msg_imm(o, dir, m);
        VIP_DESCRIPTOR *got = NULL;
        printf("    %s %zu bytes, %s\n", sending ? "send" : "receive", len,
               several ? "5 segments, immediate data" : "1 segment");
        if (sending) {
            CHECK_EQ(T_READY + m, vt_get_u64(o->fd));
            vt_fill(o->src.base, len, seed);
            vt_desc_send(sd, (VIP_UINT16)(VIP_CONTROL_OP_SENDRECV | (several ? VIP_CONTROL_IMMEDIATE : 0)),
                         several ? imm : 0, o->src.base, o->src.mh, len, several ? SEVERAL : 1);
            CHECK_OK(VipPostSend(o->vi, sd, o->descs.mem.mh));
            got = vt_send_wait(o->vi);
            CHECK_PTR(sd, got);
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
            CHECK_EQ(len, got->CS.Length);
            vt_put_u64(o->fd, T_SENT + m);
            continue;
        }
        /* A receive left over from a lost unreliable message serves the next. */
        if (!o->pending)
            post_receive(o, rd, len, several);
        o->pending = 1;
        vt_put_u64(o->fd, T_READY + m);
        CHECK_EQ(T_SENT + m, vt_get_u64(o->fd));
        VIP_RETURN r = VipRecvWait(o->vi, reliable(o) ? VT_WAIT_MS : 2000, &got);
        if (r == VIP_TIMEOUT && !reliable(o)) {
            printf("    (lost: unreliable message %zu of %zu bytes)\n", m, len);
            o->lost++;
            continue;
        }
        if (r != VIP_SUCCESS)
            VT_FAIL("VipRecvWait for message %zu (%zu bytes): expected VIP_SUCCESS, got %s",
                    m, len, vt_ret_name(r));
        o->pending = 0;
        arrived++;
        CHECK_PTR(rd, got);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | (several ? VIP_STATUS_IMMEDIATE : 0), got);
        CHECK_EQ(len, got->CS.Length);
        if (several)
            CHECK_EQ(imm, got->CS.ImmediateData);
        CHECK_PATTERN(o->dst.base, len, seed);
        CHECK_BYTES(o->dst.base + len, GUARD, FILL);
    }
    if (!sending && arrived == 0)
        VT_FAIL("not one of %zu %s messages arrived", (size_t)NMSG, vt_level_name(o->level));
    vt_sync(o->fd, 0x5E0000 + (uint64_t)dir);
    printf("  sends %s: %zu messages in %.0f ms\n", dir == 0 ? "client to server" : "server to client",
           (size_t)NMSG, vt_now_ms() - t0);
}

/* ------------------------------------------------------------------ */
/* 2. and 3. RDMA (client to server)                                    */

/* Server: target must equal the shadow copy and plain its fill. */
static void check_target(ops_t *o, const char *after)
{
    for (size_t i = 0; i < TSIZE; i++)
        if (o->target.base[i] != o->shadow[i])
            VT_FAIL("after %s: target byte %zu is 0x%02x, expected 0x%02x", after, i,
                    o->target.base[i], o->shadow[i]);
    for (size_t i = 0; i < PSIZE; i++)
        if (o->plain.base[i] != PFILL)
            VT_FAIL("after %s: byte %zu of the region without RDMA write is 0x%02x, expected 0x%02x",
                    after, i, o->plain.base[i], PFILL);
}

/* Server: the first byte of target or plain that is not what it must be, as
 * one word for the control channel (0: none; else bit 63, the byte found in
 * bits 48-55, the byte expected in bits 40-47, the region in bit 32 (1:
 * plain) and the offset in bits 0-31).  Memory is then put right, so that
 * the next case starts clean. */
static uint64_t changed_byte(ops_t *o)
{
    uint64_t found = 0;
    for (size_t i = TSIZE; i-- > 0;)
        if (o->target.base[i] != o->shadow[i]) {
            found = 1ull << 63 | (uint64_t)o->target.base[i] << 48 | (uint64_t)o->shadow[i] << 40 | i;
            o->target.base[i] = o->shadow[i];
        }
    for (size_t i = PSIZE; i-- > 0 && !found;)
        if (o->plain.base[i] != PFILL) {
            found = 1ull << 63 | (uint64_t)o->plain.base[i] << 48 | (uint64_t)PFILL << 40 | 1ull << 32 | i;
            o->plain.base[i] = PFILL;
        }
    for (size_t i = 0; i < PSIZE; i++)
        o->plain.base[i] = PFILL;
    return found;
}

/* A failure that does not stop the run: reported now, counted, and the
 * program fails at the end. */
static unsigned soft_failures;

static void soft_fail(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "FAIL [%s pid %d] ", vt_role, (int)getpid());
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    soft_failures++;
}

/* Client: one RDMA operation from/into src resp. dst; returns the descriptor. */
static VIP_DESCRIPTOR *rdma_op(ops_t *o, VIP_UINT16 control, VIP_UINT32 imm, VIP_UINT64 raddr,
                               VIP_MEM_HANDLE rh, vt_mem *local, size_t len, unsigned nseg)
{
    VIP_DESCRIPTOR *d = vt_dpool_get(&o->descs, 2);
    vt_desc_rdma(d, control, imm, raddr, rh, local->base, local->mh, len, nseg);
    CHECK_OK(VipPostSend(o->vi, d, o->descs.mem.mh));
    VIP_DESCRIPTOR *got = vt_send_wait(o->vi);
    CHECK_PTR(d, got);
    return got;
}

typedef struct {
    const char *what;
    int region; /* 0 target, 1 plain */
    size_t off, len;
    VIP_MEM_HANDLE handle_xor;
} forbidden;

static const forbidden forbiddens[] = {
    {"region without EnableRdmaWrite", 1, 0, 1000, 0},
    {"forged memory handle", 0, 0, 1000, 0x40404040u},
    {"past the end of the region, one packet", 0, TSIZE - 10, 100, 0},
    {"across the end of the region, many packets", 0, TSIZE - 20000, 40000, 0},
};
#define NFORBIDDEN (sizeof forbiddens / sizeof forbiddens[0])

static void rdma(ops_t *o)
{
    rdma_info info;
    VIP_DESCRIPTOR *got;
    double t0 = vt_now_ms();

    if (o->server) {
        memset(o->target.base, 0, TSIZE);
        memset(o->shadow, 0, TSIZE);
        info = (rdma_info){(uintptr_t)o->target.base, (uintptr_t)o->rsrc.base, (uintptr_t)o->plain.base,
                           o->target.mh, o->rsrc.mh, o->plain.mh};
        vt_put(o->fd, &info, sizeof info);
    } else {
        vt_get(o->fd, &info, sizeof info);
    }

    /* RDMA write without immediate data: 1 MiB + 3 bytes from 4 segments. */
    size_t w1_off = 1000, w1_len = (1u << 20) + 3;
    uint32_t w1_seed = 0x11000 + level_no(o->level) * 10 + (uint32_t)o->p2p;
    if (!o->server) {
        vt_fill(o->src.base, w1_len, w1_seed);
        got = rdma_op(o, VIP_CONTROL_OP_RDMAWRITE, 0, info.target + w1_off, info.htarget, &o->src, w1_len, 4);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RDMA_WRITE, got);
        CHECK_EQ(w1_len, got->CS.Length);
        vt_put_u64(o->fd, T_DONE + 1);
        CHECK_EQ(T_CHECKED + 1, vt_get_u64(o->fd));
    } else {
        CHECK_EQ(T_DONE + 1, vt_get_u64(o->fd));
        vt_fill(o->shadow + w1_off, w1_len, w1_seed);
        check_target(o, "an RDMA write of 1 MiB + 3 bytes");
        vt_put_u64(o->fd, T_CHECKED + 1);
    }
    printf("  RDMA write, 1 MiB + 3 bytes: landed\n");

    /* RDMA write with immediate data: consumes a receive at the target. */
    size_t w2_off = (2u << 20) + 1, w2_len = 65541;
    uint32_t w2_seed = w1_seed + 0x100;
    VIP_UINT32 w2_imm = 0x1DA7A000u | (level_no(o->level) << 4) | (VIP_UINT32)o->p2p;
    if (!o->server) {
        CHECK_EQ(T_READY + 2, vt_get_u64(o->fd));
        vt_fill(o->src.base, w2_len, w2_seed);
        got = rdma_op(o, VIP_CONTROL_OP_RDMAWRITE | VIP_CONTROL_IMMEDIATE, w2_imm, info.target + w2_off,
                      info.htarget, &o->src, w2_len, 3);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RDMA_WRITE, got);
        CHECK_EQ(w2_len, got->CS.Length);
        vt_put_u64(o->fd, T_DONE + 2);
        CHECK_EQ(T_CHECKED + 2, vt_get_u64(o->fd));
    } else {
        /* A receive without data segments (or one a lost message left). */
        VIP_DESCRIPTOR *rd = vt_dpool_get(&o->descs, 0);
        if (!o->pending) {
            vt_desc_clear(rd, 0);
            CHECK_OK(VipPostRecv(o->vi, rd, o->descs.mem.mh));
        }
        o->pending = 0;
        vt_put_u64(o->fd, T_READY + 2);
        CHECK_EQ(T_DONE + 2, vt_get_u64(o->fd));
        got = vt_recv_wait(o->vi);
        CHECK_PTR(rd, got);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_REMOTE_RDMA_WRITE | VIP_STATUS_IMMEDIATE, got);
        CHECK_EQ(w2_imm, got->CS.ImmediateData);
        CHECK_EQ(w2_len, got->CS.Length);
        vt_fill(o->shadow + w2_off, w2_len, w2_seed);
        check_target(o, "an RDMA write with immediate data");
        vt_put_u64(o->fd, T_CHECKED + 2);
    }
    printf("  RDMA write with immediate data, 65541 bytes: landed, receive consumed\n");

    /* RDMA read, reliable levels; on an unreliable VI it is a format error. */
    if (!o->server) {
        static const size_t rlens[] = {1, 1373, MAXMSG - 7};
        if (reliable(o)) {
            for (size_t i = 0; i < sizeof rlens / sizeof rlens[0]; i++) {
                memset(o->dst.base, FILL, MAXMSG + GUARD);
                got = rdma_op(o, VIP_CONTROL_OP_RDMAREAD, 0, info.rsrc + 7, info.hrsrc, &o->dst, rlens[i], 3);
                CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RDMA_READ, got);
                CHECK_EQ(rlens[i], got->CS.Length);
                CHECK_PATTERN_AT(o->dst.base, rlens[i], RSEED, 7);
                CHECK_BYTES(o->dst.base + rlens[i], GUARD, FILL);
            }
            printf("  RDMA read of 1, 1373 and %lu bytes: verified\n", (unsigned long)(MAXMSG - 7));
        } else {
            got = rdma_op(o, VIP_CONTROL_OP_RDMAREAD, 0, info.rsrc, info.hrsrc, &o->dst, 100, 1);
            CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_FORMAT_ERROR, got);
            CHECK_STATE(VIP_STATE_CONNECTED, o->vi);
            printf("  RDMA read on an unreliable VI: FORMAT_ERROR, VI still connected\n");
        }
    }
    vt_sync(o->fd, 0xEAD);

    /* Forbidden RDMA writes.  A wrong status or a changed byte is reported
     * by both sides and the run goes on; the program fails at the end. */
    for (size_t f = 0; f < NFORBIDDEN; f++) {
        const forbidden *x = &forbiddens[f];
        VIP_UINT32 status;
        uint64_t changed;
        if (!o->server) {
            VIP_UINT64 base = x->region ? info.plain : info.target;
            VIP_MEM_HANDLE h = (x->region ? info.hplain : info.htarget) ^ x->handle_xor;
            memset(o->src.base, 0x77, x->len);
            got = rdma_op(o, VIP_CONTROL_OP_RDMAWRITE, 0, base + x->off, h, &o->src, x->len, 1);
            status = got->CS.Status;
            vt_put_u64(o->fd, T_DONE + 10 + f);
            vt_put_u64(o->fd, status);
            changed = vt_get_u64(o->fd);
        } else {
            CHECK_EQ(T_DONE + 10 + f, vt_get_u64(o->fd));
            status = (VIP_UINT32)vt_get_u64(o->fd);
            changed = changed_byte(o);
            vt_put_u64(o->fd, changed);
        }
        int wrong = 0;
        if ((status & VT_ERRBITS) != (VIP_STATUS_DONE | VIP_STATUS_RDMA_PROT_ERROR)) {
            char b[160];
            soft_fail("forbidden RDMA write (%s; %s, %s): the initiator's descriptor completed with %s, "
                      "expected DONE|RDMA_PROT_ERROR", x->what, vt_level_name(o->level), model(o),
                      vt_status_str(status, b, sizeof b));
            wrong = 1;
        }
        if (changed) {
            soft_fail("forbidden RDMA write (%s; %s, %s): byte %u of the %s is 0x%02x, expected 0x%02x: "
                      "the refused write changed target memory", x->what, vt_level_name(o->level), model(o),
                      (unsigned)(changed & 0xFFFFFFFFu), (changed >> 32) & 1 ? "region without RDMA write"
                                                                               : "RDMA target",
                      (unsigned)(changed >> 48) & 0xFF, (unsigned)(changed >> 40) & 0xFF);
            wrong = 1;
        }
        if (reliable(o)) {
            CHECK_STATE_SOON(VIP_STATE_ERROR, o->vi);
            if (o->server)
                CHECK_ERROR_REPORTED(&o->errs, VIP_ERROR_RDMAW_PROT, o->vi);
            printf("  forbidden RDMA write (%s): %s\n", x->what,
                   wrong ? "WRONG (see the FAIL lines)" : "RDMA_PROT_ERROR, both VIs in error, memory unchanged");
            ops_disconnect(o);
            /* The next case on a new VI pair; reconnect() covers the old one. */
            if (f + 1 < NFORBIDDEN) {
                CHECK_OK(VipDestroyVi(o->vi));
                create_vi(o);
                ops_connect(o);
            }
        } else {
            CHECK_STATE(VIP_STATE_CONNECTED, o->vi);
            printf("  forbidden RDMA write (%s): %s\n", x->what,
                   wrong ? "WRONG (see the FAIL lines)" : "RDMA_PROT_ERROR, memory unchanged");
        }
    }
    if (!reliable(o))
        ops_disconnect(o);
    printf("  RDMA: %.0f ms\n", vt_now_ms() - t0);
}

/* ------------------------------------------------------------------ */
/* 4. The same VI connects again                                        */

/* Connect the (idle) VI again and send one message each way.  A VI that is
 * not connected right after the set-up is reported, and the pair goes on. */
static void reconnect(ops_t *o, const char *after)
{
    char disc[48];
    VIP_DESCRIPTOR *rd = vt_dpool_get(&o->descs, 0), *sd = vt_dpool_get(&o->descs, 1), *got;
    const size_t len = 4096;
    uint32_t seed = 0x4EC0 + level_no(o->level) * 4 + (uint32_t)o->p2p * 2 + (uint32_t)o->server;

    CHECK_STATE(VIP_STATE_IDLE, o->vi);
    vt_desc_recv(rd, o->dst.base, o->dst.mh, MAXMSG, 1);
    CHECK_OK(VipPostRecv(o->vi, rd, o->descs.mem.mh));
    ops_connect_as(o, disc, sizeof disc);
    VIP_VI_STATE st = vt_vi_state(o->vi);
    vt_put_u64(o->fd, st);
    VIP_VI_STATE peer = (VIP_VI_STATE)vt_get_u64(o->fd);
    if (st != VIP_STATE_CONNECTED)
        soft_fail("%s, %s: the VI connected again after %s is in %s right after the connection "
                  "was set up (discriminator %s), expected VIP_STATE_CONNECTED", vt_level_name(o->level),
                  model(o), after, vt_state_name(st), disc);
    if (st == VIP_STATE_CONNECTED && peer == VIP_STATE_CONNECTED) {
        vt_fill(o->src.base, len, seed);
        vt_desc_send(sd, VIP_CONTROL_OP_SENDRECV, 0, o->src.base, o->src.mh, len, 1);
        CHECK_OK(VipPostSend(o->vi, sd, o->descs.mem.mh));
        got = vt_send_wait(o->vi);
        CHECK_PTR(sd, got);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
        vt_sync(o->fd, T_SENT + 0xFFFF); /* both sends completed successfully */
        VIP_RETURN r = VipRecvWait(o->vi, 3000, &got);
        if (r == VIP_TIMEOUT && !reliable(o)) {
            printf("    (lost: the unreliable message after reconnecting)\n");
            o->lost++;
        } else if (r == VIP_TIMEOUT) {
            soft_fail("%s, %s: connected again after %s: the peer's send of %zu bytes completed with "
                      "DONE but the receive posted for it did not complete within 3 s (VI %s)",
                      vt_level_name(o->level), model(o), after, len, vt_state_name(vt_vi_state(o->vi)));
        } else {
            CHECK_OK(r);
            CHECK_PTR(rd, got);
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, got);
            CHECK_EQ(len, got->CS.Length);
            CHECK_PATTERN(o->dst.base, len, seed ^ 1u);
            printf("  connected again after %s: a message each way\n", after);
        }
    }
    ops_disconnect(o);
}

/* ------------------------------------------------------------------ */
/* One VI pair: everything above                                        */

static void one_pair(ops_t *o)
{
    printf("%s, %s\n", vt_level_name(o->level), model(o));
    create_vi(o);
    ops_connect(o);
    sendrecv(o, 0);
    sendrecv(o, 1);
    rdma(o); /* ends disconnected */
    if (reliable(o))
        reconnect(o, "a refused RDMA write broke its connection");
    reconnect(o, "a disconnect");
    CHECK_OK(VipDestroyVi(o->vi));
}

/* ------------------------------------------------------------------ */
/* 64 VIs, one receive completion queue                                 */

static size_t many_len(int dir, size_t j, size_t k)
{
    return ((j * MANY_MSGS + k) * 2741u + (size_t)dir * 13u) % (MANY_MAX + 1);
}

static uint32_t many_seed(const ops_t *o, int dir, size_t j, size_t k)
{
    return 0x200000u + level_no(o->level) * 0x10000u + (uint32_t)dir * 0x8000u +
           (uint32_t)(j * MANY_MSGS + k);
}

static void many(ops_t *o)
{
    const size_t n = NMANY * MANY_MSGS;
    int rdir = o->server ? 0 : 1; /* direction of what this side receives */
    int sdir = 1 - rdir;
    VIP_CQ_HANDLE cq;
    VIP_VI_HANDLE vis[NMANY];
    vt_mem rbuf, sbuf;
    vt_dpool pool;
    size_t next[NMANY];     /* next receive descriptor to complete, per VI */
    long last[NMANY];       /* newest message received, per VI */
    size_t arrived = 0;
    double t0 = vt_now_ms();

    printf("%s: %d VIs sharing one receive completion queue\n", vt_level_name(o->level), NMANY);
    CHECK_OK(VipCreateCQ(o->nic, 2 * n, &cq));
    vt_mem_reg(&rbuf, o->nic, o->ptag, n * MANY_MAX, VIP_FALSE, VIP_FALSE);
    vt_mem_reg(&sbuf, o->nic, o->ptag, n * MANY_MAX, VIP_FALSE, VIP_FALSE);
    vt_dpool_init(&pool, o->nic, o->ptag, 2 * n, 1);
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(o->level, o->ptag, MANY_MTU, VIP_FALSE, VIP_FALSE);
    for (size_t j = 0; j < NMANY; j++) {
        CHECK_OK(VipCreateVi(o->nic, &va, NULL, cq, &vis[j]));
        for (size_t k = 0; k < MANY_MSGS; k++) {
            size_t i = j * MANY_MSGS + k;
            VIP_DESCRIPTOR *d = vt_dpool_get(&pool, i);
            vt_desc_recv(d, rbuf.base + i * MANY_MAX, rbuf.mh, MANY_MAX, 1);
            CHECK_OK(VipPostRecv(vis[j], d, pool.mem.mh));
        }
        next[j] = 0;
        last[j] = -1;
    }
    vt_sync(o->fd, 0x3A000);
    for (size_t j = 0; j < NMANY; j++) {
        char disc[40];
        snprintf(disc, sizeof disc, "many.%u.%zu", (unsigned)o->level, j);
        if (o->server)
            cl_accept(o->nic, vis[j], disc, o->level);
        else
            cl_request(o->nic, vis[j], o->peer, disc, o->level);
    }
    double t1 = vt_now_ms();
    vt_sync(o->fd, 0x3A001);

    /* Every send at once, VI after VI. */
    for (size_t k = 0; k < MANY_MSGS; k++)
        for (size_t j = 0; j < NMANY; j++) {
            size_t i = j * MANY_MSGS + k, len = many_len(sdir, j, k);
            VIP_DESCRIPTOR *d = vt_dpool_get(&pool, n + i);
            vt_fill(sbuf.base + i * MANY_MAX, len, many_seed(o, sdir, j, k));
            vt_desc_send(d, VIP_CONTROL_OP_SENDRECV | VIP_CONTROL_IMMEDIATE, (VIP_UINT32)((j << 8) | k),
                         sbuf.base + i * MANY_MAX, sbuf.mh, len, 1);
            CHECK_OK(VipPostSend(vis[j], d, pool.mem.mh));
        }

    /* Receives, as the completion queue announces them. */
    while (arrived < n) {
        VIP_VI_HANDLE who = NULL;
        VIP_BOOLEAN rq = VIP_FALSE;
        VIP_DESCRIPTOR *d = NULL;
        VIP_RETURN r = VipCQWait(cq, reliable(o) ? VT_WAIT_MS : 3000, &who, &rq);
        if (r == VIP_TIMEOUT && !reliable(o))
            break;
        if (r != VIP_SUCCESS)
            VT_FAIL("VipCQWait after %zu of %zu messages: expected VIP_SUCCESS, got %s", arrived, n,
                    vt_ret_name(r));
        CHECK_EQ(VIP_TRUE, rq);
        size_t j = 0;
        while (j < NMANY && vis[j] != who)
            j++;
        if (j == NMANY)
            VT_FAIL("VipCQWait returned VI %p, not one of this side's %d VIs", who, NMANY);
        CHECK_OK(VipRecvDone(who, &d));
        CHECK(next[j] < MANY_MSGS);
        CHECK_PTR(vt_dpool_get(&pool, j * MANY_MSGS + next[j]), d);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, d);
        size_t k = d->CS.ImmediateData & 0xFF;
        if ((d->CS.ImmediateData >> 8) != j)
            VT_FAIL("message for VI %zu arrived on VI %zu", (size_t)(d->CS.ImmediateData >> 8), j);
        if ((long)k <= last[j] || k >= MANY_MSGS || (reliable(o) && k != next[j]))
            VT_FAIL("VI %zu: message %zu arrived after message %ld (receive %zu)", j, k, last[j], next[j]);
        CHECK_EQ(many_len(rdir, j, k), d->CS.Length);
        CHECK_PATTERN(rbuf.base + (j * MANY_MSGS + next[j]) * MANY_MAX, d->CS.Length,
                      many_seed(o, rdir, j, k));
        last[j] = (long)k;
        next[j]++;
        arrived++;
    }
    if (arrived == 0)
        VT_FAIL("not one of %zu messages arrived on %d VIs", n, NMANY);
    if (arrived < n) {
        printf("  (lost: %zu of %zu unreliable messages)\n", n - arrived, n);
        o->lost += (unsigned)(n - arrived);
    }
    for (size_t j = 0; j < NMANY; j++)
        for (size_t k = 0; k < MANY_MSGS; k++) {
            VIP_DESCRIPTOR *d = vt_send_wait(vis[j]);
            CHECK_PTR(vt_dpool_get(&pool, n + j * MANY_MSGS + k), d);
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, d);
            CHECK_EQ(many_len(sdir, j, k), d->CS.Length);
        }
    double t2 = vt_now_ms();

    vt_sync(o->fd, 0x3A002);
    for (size_t j = 0; j < NMANY; j++) {
        VIP_DESCRIPTOR *d;
        CHECK_OK(VipDisconnect(vis[j]));
        CHECK_STATE(VIP_STATE_IDLE, vis[j]);
        while (VipRecvDone(vis[j], &d) == VIP_SUCCESS)
            CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, d);
    }
    vt_sync(o->fd, 0x3A003);
    for (size_t j = 0; j < NMANY; j++)
        CHECK_OK(VipDestroyVi(vis[j]));
    CHECK_OK(VipDestroyCQ(cq));
    vt_dpool_fini(&pool);
    vt_mem_dereg(&rbuf);
    vt_mem_dereg(&sbuf);
    vt_errlog_clear(&o->errs);
    printf("  %d connections in %.0f ms; %zu messages each way in %.0f ms\n", NMANY, t1 - t0, n, t2 - t1);
}

/* ------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    ops_t o;
    vt_init();
    if (argc != 3 || (strcmp(argv[1], "server") != 0 && strcmp(argv[1], "client") != 0)) {
        fprintf(stderr, "usage: ops server|client PEER\n");
        return 2;
    }
    memset(&o, 0, sizeof o);
    o.server = strcmp(argv[1], "server") == 0;
    o.peer = argv[2];
    vt_role = argv[1];
    init_sizes();

    o.nic = cl_open_nic(&o.errs);
    o.fd = o.server ? cl_ctl_accept(CTL_PORT) : cl_ctl_connect(cl_ip_of(o.nic, o.peer), CTL_PORT);
    CHECK_OK(VipCreatePtag(o.nic, &o.ptag));
    vt_mem_reg(&o.src, o.nic, o.ptag, MAXMSG + GUARD, VIP_FALSE, VIP_FALSE);
    vt_mem_reg(&o.dst, o.nic, o.ptag, MAXMSG + GUARD, VIP_FALSE, VIP_FALSE);
    vt_dpool_init(&o.descs, o.nic, o.ptag, 4, 8);
    if (o.server) {
        vt_mem_reg(&o.target, o.nic, o.ptag, TSIZE, VIP_TRUE, VIP_TRUE);
        vt_mem_reg(&o.rsrc, o.nic, o.ptag, MAXMSG, VIP_FALSE, VIP_TRUE);
        vt_mem_reg(&o.plain, o.nic, o.ptag, PSIZE, VIP_FALSE, VIP_FALSE);
        vt_fill(o.rsrc.base, MAXMSG, RSEED);
        memset(o.plain.base, PFILL, PSIZE);
        o.shadow = vt_alloc(TSIZE);
    }

    double t0 = vt_now_ms();
    for (size_t l = 0; l < sizeof levels / sizeof levels[0]; l++) {
        o.level = levels[l];
        for (o.p2p = 0; o.p2p < 2; o.p2p++)
            one_pair(&o);
        o.p2p = 0;
        many(&o);
    }

    vt_sync(o.fd, 0xE0D);
    if (o.server) {
        vt_mem_dereg(&o.target);
        vt_mem_dereg(&o.rsrc);
        vt_mem_dereg(&o.plain);
        free(o.shadow);
    }
    vt_dpool_fini(&o.descs);
    vt_mem_dereg(&o.src);
    vt_mem_dereg(&o.dst);
    CHECK_OK(VipDestroyPtag(o.nic, o.ptag));
    CHECK_OK(VipCloseNic(o.nic));
    close(o.fd);
    if (soft_failures) {
        fprintf(stderr, "ops %s: %u checks failed (the FAIL lines above)\n", argv[1], soft_failures);
        return 1;
    }
    printf("ops %s: ok in %.0f ms (%u unreliable messages lost)\n", argv[1], vt_now_ms() - t0, o.lost);
    return 0;
}
