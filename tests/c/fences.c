/*
 * fences.c - VipDeregisterMem and VipDisconnect are fences: once they
 * return, no byte of the peer lands in that memory, even while the peer
 * streams large transfers at it (each one a cross-memory copy).
 *
 * Deregistration: the client RDMA-writes 1 MiB blocks of changing bytes
 * into a 4 MiB region of the server as fast as it can; the server
 * deregisters the region mid-stream, then clears it and checks, after the
 * client has gone on writing for a while, that no byte landed.
 * The client's writes after that are refused (RDMA_PROT_ERROR).  Several
 * rounds, one region each.
 *
 * Disconnect: the client streams 1 MiB sends into the server's posted
 * receives; the server disconnects mid-stream and checks the same way
 * that nothing lands in its receive buffers after VipDisconnect returned.
 */
#include "vt.h"

#include <poll.h>

#define MTU (4u << 20)
#define BLOCK (1u << 20)
#define REGION (4u << 20)
#define ROUNDS 8

static const vt_conf conf = {
    .level = VIP_SERVICE_UNRELIABLE, .mtu = MTU, .rdma_write = VIP_TRUE,
    .buf_size = BLOCK, .ndesc = 16, .maxseg = 2,
};

/* Clears memory the peer writes (never with 0) and, after the peer has
 * gone on for a while, fails if a byte of it landed since. */
static void check_nothing_lands(VIP_UINT8 *region, size_t len, const char *what)
{
    memset(region, 0, len);
    vt_sleep_ms(200);
    for (size_t i = 0; i < len; i++)
        if (region[i] != 0)
            VT_FAIL("%s: byte %zu became 0x%02x after it returned", what, i, region[i]);
}

static void server(int fd, void *arg)
{
    (void)arg;
    vt_end e;
    vt_end_open(&e, &conf, fd, 1);
    char disc[VT_MAX_DISC];
    vt_disc(disc, sizeof disc, "fences");
    vt_end_link(&e, disc);

    /* Deregistration under RDMA writes. */
    for (int round = 0; round < ROUNDS; round++) {
        VIP_UINT8 *region = vt_alloc(REGION);
        VIP_MEM_ATTRIBUTES ma = {e.ptag, VIP_TRUE, VIP_FALSE};
        VIP_MEM_HANDLE mh;
        CHECK_OK(VipRegisterMem(e.nic, region, REGION, &ma, &mh));
        vt_put_u64(fd, (uint64_t)(uintptr_t)region);
        vt_put_u64(fd, (uint64_t)mh);
        CHECK_EQ(1, vt_get_u64(fd)); /* the client's writes land */
        vt_sleep_ms(1 + 3 * round);
        CHECK_OK(VipDeregisterMem(e.nic, region, mh));
        check_nothing_lands(region, REGION, "VipDeregisterMem");
        vt_put_u64(fd, 2); /* checked: the client may stop */
        CHECK_EQ(3, vt_get_u64(fd));
        free(region);
    }

    /* Disconnect under large sends. */
    for (size_t i = 0; i < conf.ndesc; i++) {
        VIP_DESCRIPTOR *d = vt_dpool_get(&e.descs, i);
        VIP_UINT8 *buf = e.buf.base; /* every receive into the same 1 MiB */
        vt_desc_recv(d, buf, e.buf.mh, BLOCK, 1);
        CHECK_OK(VipPostRecv(e.vi, d, e.descs.mem.mh));
    }
    vt_put_u64(fd, 4);
    for (int m = 0; m < 4; m++)
        (void)vt_recv_wait(e.vi);
    CHECK_OK(VipDisconnect(e.vi));
    check_nothing_lands(e.buf.base, BLOCK, "VipDisconnect");
    vt_put_u64(fd, 5);
    CHECK_EQ(6, vt_get_u64(fd));
    vt_end_close(&e);
}

/* Posts descriptor d and waits for it; returns its status. */
static VIP_UINT32 post_and_wait(vt_end *e, VIP_DESCRIPTOR *d)
{
    if (VipPostSend(e->vi, d, e->descs.mem.mh) != VIP_SUCCESS)
        return VIP_STATUS_ERROR_MASK;
    VIP_DESCRIPTOR *done = NULL;
    if (VipSendWait(e->vi, VT_WAIT_MS, &done) != VIP_SUCCESS)
        return VIP_STATUS_ERROR_MASK;
    CHECK(done == d);
    return d->CS.Status;
}

static int readable(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, 0) > 0;
}

int main(void)
{
    vt_init();
    vt_child srv = vt_spawn("server", server, NULL);
    vt_role = "client";
    vt_end e;
    vt_end_open(&e, &conf, srv.fd, 0);
    char disc[VT_MAX_DISC];
    snprintf(disc, sizeof disc, "fences.%d", (int)vt_root_pid);
    vt_end_link(&e, disc);
    VIP_DESCRIPTOR *d = vt_dpool_get(&e.descs, 0);

    for (int round = 0; round < ROUNDS; round++) {
        uint64_t raddr = vt_get_u64(srv.fd);
        VIP_MEM_HANDLE rh = (VIP_MEM_HANDLE)vt_get_u64(srv.fd);
        unsigned writes = 0, refused = 0;
        while (!readable(srv.fd)) {
            memset(e.buf.base, 1 + (writes & 0x7f), BLOCK);
            size_t off = (size_t)(writes % (REGION / BLOCK)) * BLOCK;
            vt_desc_rdma(d, VIP_CONTROL_OP_RDMAWRITE, 0, raddr + off, rh, e.buf.base, e.buf.mh, BLOCK, 1);
            VIP_UINT32 st = post_and_wait(&e, d);
            if (st & VIP_STATUS_RDMA_PROT_ERROR)
                refused++;
            else
                CHECK((st & VIP_STATUS_ERROR_MASK) == 0);
            if (++writes == 3)
                vt_put_u64(srv.fd, 1);
        }
        CHECK_EQ(2, vt_get_u64(srv.fd));
        CHECK(refused > 0);
        printf("round %d: %u RDMA writes, %u refused after the deregistration\n", round, writes, refused);
        vt_put_u64(srv.fd, 3);
    }

    CHECK_EQ(4, vt_get_u64(srv.fd));
    unsigned sends = 0;
    while (!readable(srv.fd)) {
        vt_desc_send(d, 0, 0, e.buf.base, e.buf.mh, BLOCK, 1);
        memset(e.buf.base, 1 + (sends & 0x7f), BLOCK);
        VIP_UINT32 st = post_and_wait(&e, d);
        sends++;
        if (st & VIP_STATUS_ERROR_MASK)
            break;
    }
    CHECK_EQ(5, vt_get_u64(srv.fd));
    printf("%u sends of 1 MiB around the server's disconnect\n", sends);
    vt_put_u64(srv.fd, 6);
    vt_end_close(&e);
    vt_join(&srv);
    printf("fences: ok\n");
    return 0;
}
