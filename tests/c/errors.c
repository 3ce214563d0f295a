/*
 * errors.c - how transfers fail: a message longer than the receive buffer,
 * a send with no receive posted, data segments outside registered memory,
 * malformed descriptors, a message longer than the VI's MaxTransferSize,
 * posting in the error state, disconnect, and the death of the peer process.
 */
#include "vt.h"

#define U  VIP_SERVICE_UNRELIABLE
#define RD VIP_SERVICE_RELIABLE_DELIVERY
#define RR VIP_SERVICE_RELIABLE_RECEPTION

static int reliable(const vt_end *e) { return e->conf->level != U; }

static VIP_DESCRIPTOR *desc(vt_end *e, size_t i) { return vt_dpool_get(&e->descs, i); }

static void post_recv(vt_end *e, size_t i, size_t off, size_t len)
{
    VIP_DESCRIPTOR *d = desc(e, i);
    vt_desc_recv(d, e->buf.base + off, e->buf.mh, len, 1);
    CHECK_OK(VipPostRecv(e->vi, d, e->descs.mem.mh));
}

/* Post a send of len bytes of pattern seed; return its completion. */
static VIP_DESCRIPTOR *send_bytes(vt_end *e, size_t i, size_t len, uint32_t seed, unsigned nseg)
{
    VIP_DESCRIPTOR *d = desc(e, i);
    vt_fill(e->buf.base, len, seed);
    vt_desc_send(d, 0, 0, e->buf.base, e->buf.mh, len, nseg);
    CHECK_OK(VipPostSend(e->vi, d, e->descs.mem.mh));
    VIP_DESCRIPTOR *got = vt_send_wait(e->vi);
    CHECK_PTR(d, got);
    return got;
}

static void expect_message(vt_end *e, size_t i, size_t off, size_t len, uint32_t seed)
{
    VIP_DESCRIPTOR *got = vt_recv_wait(e->vi);
    CHECK_PTR(desc(e, i), got);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, got);
    CHECK_EQ(len, got->CS.Length);
    CHECK_PATTERN(e->buf.base + off, len, seed);
}

/* In the error state posting succeeds and the descriptor completes at once,
 * flushed. */
static void posts_flush(vt_end *e, size_t i)
{
    VIP_DESCRIPTOR *s = desc(e, i), *r = desc(e, i + 1), *got;
    vt_desc_send(s, 0, 0, e->buf.base, e->buf.mh, 10, 1);
    CHECK_OK(VipPostSend(e->vi, s, e->descs.mem.mh));
    got = vt_send_done(e->vi);
    CHECK_PTR(s, got);
    CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, got);
    vt_desc_recv(r, e->buf.base, e->buf.mh, 10, 1);
    CHECK_OK(VipPostRecv(e->vi, r, e->descs.mem.mh));
    got = vt_recv_done(e->vi);
    CHECK_PTR(r, got);
    CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, got);
    CHECK_STATE(VIP_STATE_ERROR, e->vi);
}

/* ------------------------------------------------------------------ */
/* A message longer than the receive buffer                             */

static void short_server(vt_end *e)
{
    post_recv(e, 0, 0, 100);
    vt_sync(e->fd, 1);
    VIP_DESCRIPTOR *got = vt_recv_wait(e->vi);
    CHECK_PTR(desc(e, 0), got);
    CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_LENGTH_ERROR, got);
    if (reliable(e)) {
        CHECK_STATE_SOON(VIP_STATE_ERROR, e->vi);
        vt_sync(e->fd, 2);
    } else {
        CHECK_STATE(VIP_STATE_CONNECTED, e->vi);
        post_recv(e, 1, 4096, 1000);
        vt_sync(e->fd, 2);
        expect_message(e, 1, 4096, 50, 2);
    }
}

static void short_client(vt_end *e)
{
    vt_sync(e->fd, 1);
    VIP_DESCRIPTOR *got = send_bytes(e, 0, 200, 1, 1);
    CHECK_TOO_LONG_SEND(e->conf->level, got);
    if (reliable(e)) {
        CHECK_STATE_SOON(VIP_STATE_ERROR, e->vi);
        vt_sync(e->fd, 2);
    } else {
        CHECK_STATE(VIP_STATE_CONNECTED, e->vi);
        vt_sync(e->fd, 2);
        got = send_bytes(e, 1, 50, 2, 1);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
        CHECK_EQ(50, got->CS.Length);
    }
}

/* ------------------------------------------------------------------ */
/* A send with no receive posted                                        */

static void norecv_server(vt_end *e)
{
    vt_sync(e->fd, 1); /* the client sends into an empty receive queue */
    vt_sync(e->fd, 2);
    if (reliable(e)) {
        CHECK_STATE_SOON(VIP_STATE_ERROR, e->vi);
        CHECK_ERROR_REPORTED(&e->errs, VIP_ERROR_RECVQ_EMPTY, e->vi);
        posts_flush(e, 2);
    } else {
        /* The message was dropped; the next one arrives. */
        CHECK_STATE(VIP_STATE_CONNECTED, e->vi);
        post_recv(e, 0, 8192, 4096);
        vt_sync(e->fd, 3);
        expect_message(e, 0, 8192, 64, 22);
        VIP_DESCRIPTOR *d;
        CHECK_RET(VIP_NOT_DONE, VipRecvDone(e->vi, &d));
    }
}

static void norecv_client(vt_end *e)
{
    vt_sync(e->fd, 1);
    VIP_DESCRIPTOR *got = send_bytes(e, 0, 64, 21, 1);
    if (reliable(e)) {
        CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_TRANSPORT_ERROR, got);
        CHECK_STATE_SOON(VIP_STATE_ERROR, e->vi);
        CHECK_ERROR_REPORTED(&e->errs, VIP_ERROR_CONN_LOST, e->vi);
        vt_sync(e->fd, 2);
        posts_flush(e, 2);
    } else {
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
        CHECK_STATE(VIP_STATE_CONNECTED, e->vi);
        vt_sync(e->fd, 2);
        vt_sync(e->fd, 3);
        got = send_bytes(e, 1, 64, 22, 2);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
    }
}

/* ------------------------------------------------------------------ */
/* Data segments outside registered memory                              */

static void prot_server(vt_end *e)
{
    post_recv(e, 0, 8192, 4096);
    vt_sync(e->fd, 1);
    vt_sync(e->fd, 2);
    if (!reliable(e)) {
        /* None of the refused sends consumed the receive. */
        expect_message(e, 0, 8192, 300, 35);
    }
}

static void prot_client(vt_end *e)
{
    VIP_UINT8 *raw = vt_alloc(4096);
    VIP_PROTECTION_HANDLE other;
    CHECK_OK(VipCreatePtag(e->nic, &other));
    vt_mem foreign;
    vt_mem_reg(&foreign, e->nic, other, 4096, VIP_FALSE, VIP_FALSE);
    vt_sync(e->fd, 1);

    struct { VIP_UINT8 *addr; VIP_MEM_HANDLE h; } bad[] = {
        {raw, e->buf.mh},                              /* unregistered */
        {foreign.base, foreign.mh},                    /* another ptag */
        {e->buf.base + e->buf.size - 20, e->buf.mh},   /* runs 30 bytes past the end */
        {e->buf.base, 0xDEAD0000u},                    /* forged handle */
        {e->buf.base, foreign.mh},                     /* another region's handle */
    };
    size_t nbad = reliable(e) ? 1 : sizeof bad / sizeof bad[0];
    for (size_t i = 0; i < nbad; i++) {
        VIP_DESCRIPTOR *d = desc(e, i);
        vt_desc_send(d, 0, 0, e->buf.base, e->buf.mh, 100, 2);
        vt_seg(d, 1)->Local.Data.Address = bad[i].addr;
        vt_seg(d, 1)->Local.Handle = bad[i].h;
        CHECK_OK(VipPostSend(e->vi, d, e->descs.mem.mh));
        VIP_DESCRIPTOR *got = vt_send_wait(e->vi);
        CHECK_PTR(d, got);
        CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_PROTECTION_ERROR, got);
    }
    if (reliable(e)) {
        CHECK_STATE_SOON(VIP_STATE_ERROR, e->vi);
        posts_flush(e, 10);
    } else {
        /* Receives are checked the same way. */
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            VIP_DESCRIPTOR *d = desc(e, 10 + i);
            vt_desc_recv(d, e->buf.base, e->buf.mh, 100, 2);
            vt_seg(d, 0)->Local.Data.Address = bad[i].addr;
            vt_seg(d, 0)->Local.Handle = bad[i].h;
            CHECK_OK(VipPostRecv(e->vi, d, e->descs.mem.mh));
            VIP_DESCRIPTOR *got = vt_recv_wait(e->vi);
            CHECK_PTR(d, got);
            CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_PROTECTION_ERROR, got);
        }
        CHECK_STATE(VIP_STATE_CONNECTED, e->vi);
        VIP_DESCRIPTOR *got = send_bytes(e, 20, 300, 35, 2);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
    }
    vt_sync(e->fd, 2);
    vt_mem_dereg(&foreign);
    CHECK_OK(VipDestroyPtag(e->nic, other));
    free(raw);
}

/* ------------------------------------------------------------------ */
/* Malformed descriptors                                                */

static void format_server(vt_end *e)
{
    post_recv(e, 0, 8192, 4096);
    vt_sync(e->fd, 1);
    vt_sync(e->fd, 2);
    if (!reliable(e))
        expect_message(e, 0, 8192, 77, 41);
}

static void format_client(vt_end *e)
{
    vt_sync(e->fd, 1);
    /* Sends: an RDMA write without its address segment, 33 segments,
     * reserved control bits, the reserved operation, RDMA read on an
     * unreliable VI.  (A send with no segment is a valid empty message.) */
    for (int k = 0; k < (reliable(e) ? 1 : 6); k++) {
        VIP_DESCRIPTOR *d = desc(e, (size_t)k);
        switch (k) {
        case 0:
            vt_desc_send(d, VIP_CONTROL_OP_RDMAWRITE, 0, e->buf.base, e->buf.mh, 0, 1);
            d->CS.SegCount = 0;
            break;
        case 1:
            vt_desc_send(d, 0, 0, e->buf.base, e->buf.mh, 33, 33);
            break;
        case 2:
            vt_desc_send(d, 0x0010, 0, e->buf.base, e->buf.mh, 16, 1);
            break;
        case 3:
            vt_desc_send(d, 0x8000, 0, e->buf.base, e->buf.mh, 16, 1);
            break;
        case 4:
            vt_desc_send(d, VIP_CONTROL_OP_RESERVED, 0, e->buf.base, e->buf.mh, 16, 1);
            break;
        case 5:
            vt_desc_rdma(d, VIP_CONTROL_OP_RDMAREAD, 0, (uintptr_t)e->buf.base, e->buf.mh,
                         e->buf.base + 4096, e->buf.mh, 16, 1);
            break;
        }
        CHECK_OK(VipPostSend(e->vi, d, e->descs.mem.mh));
        VIP_DESCRIPTOR *got = vt_send_wait(e->vi);
        CHECK_PTR(d, got);
        CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_FORMAT_ERROR, got);
    }
    if (reliable(e)) {
        CHECK_STATE_SOON(VIP_STATE_ERROR, e->vi);
        posts_flush(e, 10);
        vt_sync(e->fd, 2);
        return;
    }
    /* Receives: an RDMA write, an RDMA read, the reserved operation, 33
     * segments, reserved control bits.  (No segment is a valid empty buffer;
     * the immediate bit means nothing on a receive.) */
    for (int k = 0; k < 5; k++) {
        VIP_DESCRIPTOR *d = desc(e, 10 + (size_t)k);
        vt_desc_recv(d, e->buf.base, e->buf.mh, 64, k == 3 ? 33 : 1);
        switch (k) {
        case 0: d->CS.Control = VIP_CONTROL_OP_RDMAWRITE; break;
        case 1: d->CS.Control = VIP_CONTROL_OP_RDMAREAD; break;
        case 2: d->CS.Control = VIP_CONTROL_OP_RESERVED; break;
        case 3: break;
        case 4: d->CS.Control = 0x0100; break;
        }
        CHECK_OK(VipPostRecv(e->vi, d, e->descs.mem.mh));
        VIP_DESCRIPTOR *got = vt_recv_wait(e->vi);
        CHECK_PTR(d, got);
        CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_FORMAT_ERROR, got);
    }
    CHECK_STATE(VIP_STATE_CONNECTED, e->vi);
    VIP_DESCRIPTOR *got = send_bytes(e, 20, 77, 41, 1);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
    vt_sync(e->fd, 2);
}

/* ------------------------------------------------------------------ */
/* Longer than the VI's MaxTransferSize (4096 here)                      */

static void mtu_server(vt_end *e)
{
    post_recv(e, 0, 16384, 4096); /* no more than the VI's MaxTransferSize */
    vt_sync(e->fd, 1);
    vt_sync(e->fd, 2);
    if (!reliable(e))
        expect_message(e, 0, 16384, 4096, 52);
}

static void mtu_client(vt_end *e)
{
    vt_sync(e->fd, 1);
    VIP_DESCRIPTOR *got = send_bytes(e, 0, 4097, 51, 2);
    CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_LENGTH_ERROR, got);
    if (reliable(e)) {
        CHECK_STATE_SOON(VIP_STATE_ERROR, e->vi);
        posts_flush(e, 10);
    } else {
        CHECK_STATE(VIP_STATE_CONNECTED, e->vi);
        got = send_bytes(e, 1, 4096, 52, 2);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
    }
    vt_sync(e->fd, 2);
}

/* ------------------------------------------------------------------ */
/* Disconnect flushes both sides                                        */

static void disc_server(vt_end *e)
{
    for (size_t i = 0; i < 3; i++)
        post_recv(e, i, 4096 * i, 4096);
    vt_sync(e->fd, 1);
    /* The client disconnects. */
    CHECK_STATE_SOON(VIP_STATE_ERROR, e->vi);
    CHECK_ERROR_REPORTED(&e->errs, VIP_ERROR_CONN_LOST, e->vi);
    for (size_t i = 0; i < 3; i++) {
        VIP_DESCRIPTOR *got = vt_recv_wait(e->vi);
        CHECK_PTR(desc(e, i), got);
        CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, got);
    }
    VIP_DESCRIPTOR *d;
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(e->vi, &d));
    posts_flush(e, 10);
    CHECK_OK(VipDisconnect(e->vi));
    CHECK_STATE(VIP_STATE_IDLE, e->vi);
    CHECK_RET(VIP_INVALID_STATE, VipDisconnect(e->vi));
    vt_sync(e->fd, 2);
}

static void disc_client(vt_end *e)
{
    for (size_t i = 0; i < 2; i++)
        post_recv(e, i, 4096 * i, 4096);
    vt_sync(e->fd, 1);
    CHECK_OK(VipDisconnect(e->vi));
    CHECK_STATE(VIP_STATE_IDLE, e->vi);
    for (size_t i = 0; i < 2; i++) {
        VIP_DESCRIPTOR *got = vt_recv_done(e->vi);
        CHECK_PTR(desc(e, i), got);
        CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, got);
    }
    VIP_DESCRIPTOR *d;
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(e->vi, &d));
    /* Idle again: no sends. */
    vt_desc_send(desc(e, 5), 0, 0, e->buf.base, e->buf.mh, 1, 1);
    CHECK_RET(VIP_INVALID_STATE, VipPostSend(e->vi, desc(e, 5), e->descs.mem.mh));
    vt_sync(e->fd, 2);
}

/* ------------------------------------------------------------------ */

#define CONF(lvl, ...) {.level = (lvl), .maxseg = 34, __VA_ARGS__}

static const vt_scenario scenarios[] = {
    {"longer-than-receive-buffer", CONF(U), short_client, short_server},
    {"longer-than-receive-buffer", CONF(RD), short_client, short_server},
    {"longer-than-receive-buffer", CONF(RR), short_client, short_server},
    {"no-receive-posted", CONF(U), norecv_client, norecv_server},
    {"no-receive-posted", CONF(RD), norecv_client, norecv_server},
    {"no-receive-posted", CONF(RR), norecv_client, norecv_server},
    {"segment-outside-registered-memory", CONF(U), prot_client, prot_server},
    {"segment-outside-registered-memory", CONF(RD), prot_client, prot_server},
    {"malformed-descriptors", CONF(U), format_client, format_server},
    {"malformed-descriptors", CONF(RD), format_client, format_server},
    {"longer-than-max-transfer-size", CONF(U, .mtu = 4096), mtu_client, mtu_server},
    {"longer-than-max-transfer-size", CONF(RR, .mtu = 4096), mtu_client, mtu_server},
    {"disconnect-flushes", CONF(U), disc_client, disc_server},
    {"disconnect-flushes", CONF(RD), disc_client, disc_server},
    {"disconnect-flushes", CONF(RR), disc_client, disc_server},
};

/* ------------------------------------------------------------------ */
/* The peer process dies                                                */

typedef struct {
    vt_conf conf;
    int kill; /* SIGKILLed by the client, else it calls _exit */
    int index;
} death_t;

static death_t deaths[] = {
    {{.level = U}, 0, 0},  {{.level = RD}, 0, 1}, {{.level = RR}, 0, 2},
    {{.level = U}, 1, 3},  {{.level = RD}, 1, 4}, {{.level = RR}, 1, 5},
};
#define NDEATHS (sizeof deaths / sizeof deaths[0])

static void dying_server(int fd, void *arg)
{
    death_t *d = arg;
    char disc[VT_MAX_DISC];
    vt_end e;
    vt_disc(disc, sizeof disc, "death.%d", d->index);
    vt_get_u64(fd); /* go */
    vt_end_open(&e, &d->conf, fd, 1);
    vt_end_link(&e, disc);
    for (size_t i = 0; i < 2; i++)
        post_recv(&e, i, 4096 * i, 4096);
    vt_put_u64(fd, 1);
    if (!d->kill)
        _exit(0);
    for (;;)
        pause();
}

static void peer_dies(death_t *d, vt_child *c)
{
    char disc[VT_MAX_DISC];
    vt_end e;
    printf("  peer %s (%s)\n", d->kill ? "killed" : "exits", vt_level_name(d->conf.level));
    vt_disc(disc, sizeof disc, "death.%d", d->index);
    vt_put_u64(c->fd, 1);
    vt_end_open(&e, &d->conf, c->fd, 0);
    vt_end_link(&e, disc);
    for (size_t i = 0; i < 3; i++)
        post_recv(&e, i, 4096 * i, 4096);
    CHECK_EQ(1, vt_get_u64(c->fd));
    if (d->kill)
        CHECK(kill(c->pid, SIGKILL) == 0);

    CHECK_STATE_SOON(VIP_STATE_ERROR, e.vi);
    CHECK_ERROR_REPORTED(&e.errs, VIP_ERROR_CONN_LOST, e.vi);
    for (size_t i = 0; i < 3; i++) {
        VIP_DESCRIPTOR *got = vt_recv_wait(e.vi);
        CHECK_PTR(desc(&e, i), got);
        CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, got);
    }
    VIP_DESCRIPTOR *x;
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(e.vi, &x));
    posts_flush(&e, 10);
    CHECK_OK(VipDisconnect(e.vi));
    vt_end_close(&e);

    int st;
    char buf[96];
    close(c->fd);
    CHECK(waitpid(c->pid, &st, 0) == c->pid);
    if (d->kill) {
        if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
            VT_FAIL("server: expected death by SIGKILL, %s", vt_describe_status(st, buf, sizeof buf));
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        VT_FAIL("server %s", vt_describe_status(st, buf, sizeof buf));
    }
}

int main(void)
{
    vt_init();
    /* Every child is forked before this process makes a Vip* call. */
    vt_child dying[NDEATHS];
    for (size_t i = 0; i < NDEATHS; i++)
        dying[i] = vt_spawn("server", dying_server, &deaths[i]);
    vt_scenarios all = {scenarios, sizeof scenarios / sizeof scenarios[0]};
    vt_child srv = vt_scenarios_spawn(&all);

    vt_scenarios_client(&all, &srv);
    for (size_t i = 0; i < NDEATHS; i++)
        peer_dies(&deaths[i], &dying[i]);
    printf("errors: ok\n");
    return 0;
}
