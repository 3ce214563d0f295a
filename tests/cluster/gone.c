/*
 * gone.c - memory deregistered and unmapped under posted descriptors of VIs
 * between two hosts: the network data path neither reads nor writes it.
 *
 *   gone server PEER     on one host: receives (and answers RDMA reads)
 *   gone client PEER     on the other: sends
 *
 * PEER is the other host's name; the two keep in step over a TCP control
 * channel (port 7302).  For each reliability level, every case on a VI
 * pair of its own (a case may break its connection):
 *
 *   recv-buffer-small, recv-buffer-large: the server posts a receive whose
 *     buffer's region it then deregisters and unmaps; the client sends 100
 *     bytes, resp. 1 MiB (many packets, landed in place where they can be).
 *     The receive completes with PROTECTION_ERROR and Length 0; on the
 *     reliable levels the server's VI goes to the error state and reports
 *     VIP_ERROR_POST_DESC, and so does the client's (connection lost); on
 *     the unreliable level the next message arrives whole.
 *   recv-descriptor: the receive's descriptor's own region goes: the
 *     receive is handed back unwritten and the connection goes on (the next
 *     message, 1 MiB, arrives whole); then a receive whose descriptor's
 *     region went is flushed by the server's VipDisconnect.
 *   send-buffer: the client posts two 4 MiB sends, then deregisters and
 *     unmaps the second one's buffer region at once (its bytes go out only
 *     after the first's): none of it is read; the send completes with
 *     PROTECTION_ERROR (on the unreliable level it may have gone whole
 *     already: DONE), a reliable connection breaks with
 *     VIP_ERROR_POST_DESC at the client; an unreliable one carries the next
 *     message.
 *   send-descriptor: a 4 MiB send whose descriptor's own region goes right
 *     after the post: the message arrives whole, the send is handed back
 *     unwritten; then one flushed by the client's VipDisconnect.
 *   read-buffer (reliable levels): two RDMA reads of 4 MiB, the second's
 *     local buffer's region deregistered and unmapped right after the post
 *     (its answer comes after the first's): no byte of it lands, the read
 *     completes with PROTECTION_ERROR, the connection breaks.
 *
 * Before the provider checked, these crashed it (SIGSEGV in libvipl) or
 * wrote into memory that was no longer there.  GONE_ONLY=NAME (both ends)
 * runs only the case NAME.
 */
#include "cl.h"

#include <sys/mman.h>

#define CTL_PORT 7302
#define BIG      (4u << 20)
#define MIB      (1u << 20)

enum { RECV_SMALL, RECV_LARGE, RECV_DESC, SEND_BUF, SEND_DESC, READ_BUF, NCASES };
static const char *const case_names[] = {
    "recv-buffer-small", "recv-buffer-large", "recv-descriptor",
    "send-buffer", "send-descriptor", "read-buffer",
};

static const VIP_RELIABILITY_LEVEL levels[] = {
    VIP_SERVICE_UNRELIABLE, VIP_SERVICE_RELIABLE_DELIVERY, VIP_SERVICE_RELIABLE_RECEPTION,
};

typedef struct {
    int server;
    const char *peer;
    int fd;
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag;
    vt_errlog errs;
    vt_mem buf;    /* 2 x 4 MiB: sends come from here, receives land here */
    vt_mem rsrc;   /* server: RDMA read source */
    vt_dpool descs;
    VIP_VI_HANDLE vi;
    VIP_RELIABILITY_LEVEL level;
} gone_t;

static int reliable(const gone_t *g) { return g->level != VIP_SERVICE_UNRELIABLE; }

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* n bytes of fresh mappings, registered. */
static VIP_UINT8 *own_region(gone_t *g, size_t n, VIP_MEM_HANDLE *mh)
{
    n = (n + page_size() - 1) & ~(page_size() - 1);
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        VT_FAIL("mmap: %s", strerror(errno));
    VIP_MEM_ATTRIBUTES ma = {g->ptag, VIP_FALSE, VIP_FALSE};
    CHECK_OK(VipRegisterMem(g->nic, p, n, &ma, mh));
    return p;
}

/* Deregistered and unmapped: nobody may touch it again. */
static void drop_region(gone_t *g, void *p, size_t n, VIP_MEM_HANDLE mh)
{
    n = (n + page_size() - 1) & ~(page_size() - 1);
    CHECK_OK(VipDeregisterMem(g->nic, p, mh));
    CHECK(munmap(p, n) == 0);
}

static void connect_case(gone_t *g, int c)
{
    char disc[48];
    snprintf(disc, sizeof disc, "gone.%u.%d", (unsigned)g->level, c);
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(g->level, g->ptag, BIG, VIP_FALSE, reliable(g) ? VIP_TRUE : VIP_FALSE);
    CHECK_OK(VipCreateVi(g->nic, &va, NULL, NULL, &g->vi));
    vt_sync(g->fd, 0xC0000 + (unsigned)c * 8 + g->level);
    if (g->server)
        cl_accept(g->nic, g->vi, disc, g->level);
    else
        cl_request(g->nic, g->vi, g->peer, disc, g->level);
    CHECK_STATE(VIP_STATE_CONNECTED, g->vi);
    vt_sync(g->fd, 0xC1000 + (unsigned)c * 8 + g->level);
    vt_errlog_clear(&g->errs);
}

/* Both sides are done: disconnect, take back what is left without looking
 * at it (it may lie in memory that is gone), destroy the VI. */
static void end_case(gone_t *g, int c)
{
    VIP_DESCRIPTOR *d;
    vt_sync(g->fd, 0xD0000 + (unsigned)c * 8 + g->level);
    if (vt_vi_state(g->vi) != VIP_STATE_IDLE)
        CHECK_OK(VipDisconnect(g->vi));
    while (VipRecvDone(g->vi, &d) == VIP_SUCCESS)
        ;
    while (VipSendDone(g->vi, &d) == VIP_SUCCESS)
        ;
    CHECK_OK(VipDestroyVi(g->vi));
    vt_sync(g->fd, 0xD1000 + (unsigned)c * 8 + g->level);
}

static void post_recv(gone_t *g, VIP_DESCRIPTOR *d, VIP_MEM_HANDLE dmh, void *buf, VIP_MEM_HANDLE bmh,
                      size_t len)
{
    vt_desc_recv(d, buf, bmh, len, 1);
    CHECK_OK(VipPostRecv(g->vi, d, dmh));
}

/* The client sends len bytes (pattern seed len) from the good buffer and
 * reports the status; a send that does not complete is a failure. */
static VIP_UINT32 send_msg(gone_t *g, VIP_DESCRIPTOR *d, VIP_MEM_HANDLE dmh, size_t len)
{
    vt_fill(g->buf.base, len, (uint32_t)len);
    vt_desc_send(d, 0, 0, g->buf.base, g->buf.mh, len, 1);
    CHECK_OK(VipPostSend(g->vi, d, dmh));
    CHECK_PTR(d, vt_send_wait(g->vi));
    return d->CS.Status;
}

/* A receive of len bytes (pattern seed len) completed whole at `at`. */
static void expect_good_at(gone_t *g, VIP_DESCRIPTOR *d, size_t len, const VIP_UINT8 *at)
{
    CHECK_PTR(d, vt_recv_wait(g->vi));
    CHECK_ERRBITS(VIP_STATUS_DONE, d);
    CHECK_EQ(len, d->CS.Length);
    CHECK_PATTERN(at, len, (uint32_t)len);
}

static void expect_good(gone_t *g, VIP_DESCRIPTOR *d, size_t len) { expect_good_at(g, d, len, g->buf.base); }

/* The reliable levels break with `code` reported here. */
static void expect_broken(gone_t *g, VIP_ERROR_CODE code)
{
    CHECK_STATE_SOON(VIP_STATE_ERROR, g->vi);
    CHECK_ERROR_REPORTED(&g->errs, code, g->vi);
}

/* ------------------------------------------------------------------ */

static void server_case(gone_t *g, int c)
{
    VIP_DESCRIPTOR *r = vt_dpool_get(&g->descs, 0), *r2 = vt_dpool_get(&g->descs, 1);
    VIP_MEM_HANDLE dmh = g->descs.mem.mh, mh;
    switch (c) {
    case RECV_SMALL:
    case RECV_LARGE: {
        size_t len = c == RECV_SMALL ? 100 : MIB;
        VIP_UINT8 *x = own_region(g, MIB, &mh);
        post_recv(g, r, dmh, x, mh, MIB);
        drop_region(g, x, MIB, mh);
        vt_put_u64(g->fd, len);
        (void)vt_get_u64(g->fd); /* sent */
        CHECK_PTR(r, vt_recv_wait(g->vi));
        CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_PROTECTION_ERROR, r);
        CHECK_EQ(0, r->CS.Length);
        if (reliable(g)) {
            expect_broken(g, VIP_ERROR_POST_DESC);
        } else {
            CHECK_STATE(VIP_STATE_CONNECTED, g->vi);
            post_recv(g, r2, dmh, g->buf.base, g->buf.mh, MIB);
            vt_put_u64(g->fd, len);
            (void)vt_get_u64(g->fd);
            expect_good(g, r2, len);
        }
        vt_put_u64(g->fd, 0);
        break;
    }
    case RECV_DESC: {
        VIP_DESCRIPTOR *dd = (VIP_DESCRIPTOR *)(void *)own_region(g, 1, &mh);
        post_recv(g, dd, mh, g->buf.base, g->buf.mh, MIB);
        drop_region(g, dd, 1, mh);
        vt_put_u64(g->fd, 100);
        (void)vt_get_u64(g->fd);
        CHECK_PTR(dd, vt_recv_wait(g->vi));
        CHECK_STATE(VIP_STATE_CONNECTED, g->vi);
        post_recv(g, r, dmh, g->buf.base, g->buf.mh, MIB);
        vt_put_u64(g->fd, MIB);
        (void)vt_get_u64(g->fd);
        expect_good(g, r, MIB);
        /* Flushed by VipDisconnect. */
        dd = (VIP_DESCRIPTOR *)(void *)own_region(g, 1, &mh);
        post_recv(g, dd, mh, g->buf.base, g->buf.mh, MIB);
        drop_region(g, dd, 1, mh);
        CHECK_OK(VipDisconnect(g->vi));
        CHECK_PTR(dd, vt_recv_done(g->vi));
        vt_put_u64(g->fd, 0);
        break;
    }
    case SEND_BUF: {
        VIP_UINT8 *second = g->buf.base + BIG;
        post_recv(g, r, dmh, g->buf.base, g->buf.mh, BIG);
        post_recv(g, r2, dmh, second, g->buf.mh, BIG);
        vt_put_u64(g->fd, 1);
        VIP_UINT32 sent = (VIP_UINT32)vt_get_u64(g->fd);
        if (reliable(g)) {
            /* The first may have arrived before the break. */
            CHECK_STATE_SOON(VIP_STATE_ERROR, g->vi);
            CHECK_PTR(r, vt_recv_wait(g->vi));
            CHECK_PTR(r2, vt_recv_wait(g->vi));
            CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, r2);
        } else {
            expect_good(g, r, BIG);
            if (sent & VIP_STATUS_PROTECTION_ERROR) {
                /* The rest of it never came: the next message takes the receive. */
                vt_put_u64(g->fd, 100);
                (void)vt_get_u64(g->fd);
                expect_good_at(g, r2, 100, second);
            } else {
                CHECK_PTR(r2, vt_recv_wait(g->vi));
                CHECK_ERRBITS(VIP_STATUS_DONE, r2);
                CHECK_EQ(BIG, r2->CS.Length);
            }
            CHECK_STATE(VIP_STATE_CONNECTED, g->vi);
        }
        vt_put_u64(g->fd, 0);
        break;
    }
    case SEND_DESC:
        post_recv(g, r, dmh, g->buf.base, g->buf.mh, BIG);
        vt_put_u64(g->fd, 1);
        expect_good(g, r, BIG);
        (void)vt_get_u64(g->fd);
        /* The next one may go in part before the client disconnects. */
        post_recv(g, r2, dmh, g->buf.base, g->buf.mh, BIG);
        vt_put_u64(g->fd, 1);
        (void)vt_get_u64(g->fd);
        CHECK_STATE_SOON(VIP_STATE_ERROR, g->vi);
        CHECK_PTR(r2, vt_recv_wait(g->vi));
        CHECK((r2->CS.Status & VIP_STATUS_ERROR_MASK & ~VIP_STATUS_DESC_FLUSHED_ERROR) == 0);
        vt_put_u64(g->fd, 0);
        break;
    case READ_BUF:
        vt_put_u64(g->fd, (uint64_t)(uintptr_t)g->rsrc.base);
        vt_put_u64(g->fd, g->rsrc.mh);
        (void)vt_get_u64(g->fd);
        CHECK_STATE_SOON(VIP_STATE_ERROR, g->vi);
        vt_put_u64(g->fd, 0);
        break;
    }
}

static void client_case(gone_t *g, int c)
{
    VIP_DESCRIPTOR *s = vt_dpool_get(&g->descs, 0);
    VIP_MEM_HANDLE dmh = g->descs.mem.mh, mh;
    char sb[160];
    switch (c) {
    case RECV_SMALL:
    case RECV_LARGE:
    case RECV_DESC:
        for (;;) {
            uint64_t len = vt_get_u64(g->fd);
            if (len == 0)
                break;
            VIP_UINT32 st = send_msg(g, s, dmh, (size_t)len);
            printf("    sent %llu bytes: %s\n", (unsigned long long)len, vt_status_str(st, sb, sizeof sb));
            vt_put_u64(g->fd, st);
        }
        if (c != RECV_DESC && reliable(g))
            CHECK_STATE_SOON(VIP_STATE_ERROR, g->vi);
        if (c == RECV_DESC)
            CHECK_STATE_SOON(VIP_STATE_ERROR, g->vi); /* the server disconnected */
        break;
    case SEND_BUF: {
        (void)vt_get_u64(g->fd);
        VIP_DESCRIPTOR *s0 = vt_dpool_get(&g->descs, 1);
        VIP_UINT8 *x = own_region(g, BIG, &mh);
        vt_fill(g->buf.base, BIG, BIG);
        vt_fill(x, BIG, BIG);
        vt_desc_send(s0, 0, 0, g->buf.base, g->buf.mh, BIG, 1);
        vt_desc_send(s, 0, 0, x, mh, BIG, 1);
        CHECK_OK(VipPostSend(g->vi, s0, dmh));
        CHECK_OK(VipPostSend(g->vi, s, dmh));
        drop_region(g, x, BIG, mh);
        CHECK_PTR(s0, vt_send_wait(g->vi));
        printf("    the 4 MiB send before it: %s\n", vt_status_str(s0->CS.Status, sb, sizeof sb));
        CHECK_PTR(s, vt_send_wait(g->vi));
        printf("    4 MiB send whose buffer went: %s\n", vt_status_str(s->CS.Status, sb, sizeof sb));
        VIP_UINT32 st = s->CS.Status;
        if (reliable(g)) {
            CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_PROTECTION_ERROR, s);
            CHECK_EQ(0, s->CS.Length);
            expect_broken(g, VIP_ERROR_POST_DESC);
        } else if (!(st & VIP_STATUS_PROTECTION_ERROR)) {
            CHECK_ERRBITS(VIP_STATUS_DONE, s);
        }
        vt_put_u64(g->fd, st);
        for (;;) {
            uint64_t len = vt_get_u64(g->fd);
            if (len == 0)
                break;
            vt_put_u64(g->fd, send_msg(g, s, dmh, (size_t)len));
        }
        break;
    }
    case SEND_DESC: {
        (void)vt_get_u64(g->fd);
        VIP_DESCRIPTOR *sd = (VIP_DESCRIPTOR *)(void *)own_region(g, 1, &mh);
        vt_fill(g->buf.base, BIG, BIG);
        vt_desc_send(sd, 0, 0, g->buf.base, g->buf.mh, BIG, 1);
        CHECK_OK(VipPostSend(g->vi, sd, mh));
        drop_region(g, sd, 1, mh);
        CHECK_PTR(sd, vt_send_wait(g->vi));
        CHECK_STATE(VIP_STATE_CONNECTED, g->vi);
        vt_put_u64(g->fd, 0);
        /* Flushed by VipDisconnect while it is under way. */
        (void)vt_get_u64(g->fd);
        sd = (VIP_DESCRIPTOR *)(void *)own_region(g, 1, &mh);
        vt_desc_send(sd, 0, 0, g->buf.base, g->buf.mh, BIG, 1);
        CHECK_OK(VipPostSend(g->vi, sd, mh));
        drop_region(g, sd, 1, mh);
        CHECK_OK(VipDisconnect(g->vi));
        CHECK_PTR(sd, vt_send_done(g->vi));
        vt_put_u64(g->fd, 0);
        (void)vt_get_u64(g->fd);
        break;
    }
    case READ_BUF: {
        VIP_UINT64 raddr = vt_get_u64(g->fd);
        VIP_MEM_HANDLE rmh = (VIP_MEM_HANDLE)vt_get_u64(g->fd);
        VIP_DESCRIPTOR *s0 = vt_dpool_get(&g->descs, 1);
        VIP_UINT8 *x = own_region(g, BIG, &mh);
        vt_desc_rdma(s0, VIP_CONTROL_OP_RDMAREAD, 0, raddr, rmh, g->buf.base, g->buf.mh, BIG, 1);
        vt_desc_rdma(s, VIP_CONTROL_OP_RDMAREAD, 0, raddr, rmh, x, mh, BIG, 1);
        CHECK_OK(VipPostSend(g->vi, s0, dmh));
        CHECK_OK(VipPostSend(g->vi, s, dmh));
        drop_region(g, x, BIG, mh);
        CHECK_PTR(s0, vt_send_wait(g->vi));
        printf("    the 4 MiB RDMA read before it: %s\n", vt_status_str(s0->CS.Status, sb, sizeof sb));
        CHECK_PTR(s, vt_send_wait(g->vi));
        printf("    4 MiB RDMA read whose buffer went: %s\n", vt_status_str(s->CS.Status, sb, sizeof sb));
        CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_PROTECTION_ERROR, s);
        expect_broken(g, VIP_ERROR_POST_DESC);
        vt_put_u64(g->fd, 0);
        (void)vt_get_u64(g->fd);
        break;
    }
    }
}

int main(int argc, char **argv)
{
    gone_t g;
    vt_init();
    if (argc != 3 || (strcmp(argv[1], "server") != 0 && strcmp(argv[1], "client") != 0)) {
        fprintf(stderr, "usage: gone server|client PEER\n");
        return 2;
    }
    memset(&g, 0, sizeof g);
    g.server = strcmp(argv[1], "server") == 0;
    g.peer = argv[2];
    vt_role = argv[1];
    printf("pid %d\n", (int)getpid());

    g.nic = cl_open_nic(&g.errs);
    g.fd = g.server ? cl_ctl_accept(CTL_PORT) : cl_ctl_connect(cl_ip_of(g.nic, g.peer), CTL_PORT);
    CHECK_OK(VipCreatePtag(g.nic, &g.ptag));
    vt_mem_reg(&g.buf, g.nic, g.ptag, 2 * (size_t)BIG, VIP_FALSE, VIP_FALSE);
    if (g.server) {
        vt_mem_reg(&g.rsrc, g.nic, g.ptag, BIG, VIP_FALSE, VIP_TRUE);
        vt_fill(g.rsrc.base, BIG, 7);
    }
    vt_dpool_init(&g.descs, g.nic, g.ptag, 4, 2);

    const char *only = getenv("GONE_ONLY");
    double t0 = vt_now_ms();
    for (size_t l = 0; l < sizeof levels / sizeof levels[0]; l++) {
        g.level = levels[l];
        for (int c = 0; c < NCASES; c++) {
            if ((c == READ_BUF && !reliable(&g)) || (only != NULL && strcmp(only, case_names[c]) != 0))
                continue;
            printf("  %-20s %s\n", case_names[c], vt_level_name(g.level));
            connect_case(&g, c);
            (g.server ? server_case : client_case)(&g, c);
            end_case(&g, c);
        }
    }

    vt_sync(g.fd, 0xE0D);
    vt_dpool_fini(&g.descs);
    vt_mem_dereg(&g.buf);
    if (g.server)
        vt_mem_dereg(&g.rsrc);
    CHECK_OK(VipDestroyPtag(g.nic, g.ptag));
    CHECK_OK(VipCloseNic(g.nic));
    close(g.fd);
    printf("gone %s: ok in %.0f ms\n", argv[1], vt_now_ms() - t0);
    return 0;
}
