/*
 * fork.c - a process that uses VIA forks, and its child uses VIA on its own.
 *
 * The parent connects a VI and exchanges a message, so its provider's
 * helper thread runs.  Then it forks a worker, which has no helper thread
 * (fork copies only the calling thread).  The worker opens a NIC of its
 * own, connects to a server, and the server dies: the worker must be told
 * as any process is, its VI in the Error state, VIP_ERROR_CONN_LOST at its
 * error callback and its posted receive flushed.  Noticing the death and
 * running the callback is the helper thread's work, so the worker's provider
 * needs one of its own.  Meanwhile the parent's connection keeps working.
 */
#include "vt.h"

static const vt_conf conf = {.level = VIP_SERVICE_RELIABLE_DELIVERY};

static VIP_DESCRIPTOR *desc(vt_end *e, size_t i) { return vt_dpool_get(&e->descs, i); }

static void post_recv(vt_end *e, size_t i)
{
    vt_desc_recv(desc(e, i), e->buf.base + 4096 * i, e->buf.mh, 4096, 1);
    CHECK_OK(VipPostRecv(e->vi, desc(e, i), e->descs.mem.mh));
}

static void send_pattern(vt_end *e, size_t i, uint32_t seed)
{
    VIP_UINT8 *at = e->buf.base + 4096 * i;
    vt_fill(at, 100, seed);
    vt_desc_send(desc(e, i), 0, 0, at, e->buf.mh, 100, 1);
    CHECK_OK(VipPostSend(e->vi, desc(e, i), e->descs.mem.mh));
    CHECK_PTR(desc(e, i), vt_send_wait(e->vi));
}

static void expect_pattern(vt_end *e, size_t i, uint32_t seed)
{
    VIP_DESCRIPTOR *got = vt_recv_wait(e->vi);
    CHECK_PTR(desc(e, i), got);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, got);
    CHECK_EQ(100, got->CS.Length);
    CHECK_PATTERN(e->buf.base + 4096 * i, 100, seed);
}

/* The parent's peer: echoes two messages back. */
static void echo_server(int fd, void *arg)
{
    (void)arg;
    vt_end e;
    vt_end_open(&e, &conf, fd, 1);
    vt_end_link(&e, "fork.parent");
    for (size_t round = 0; round < 2; round++) {
        post_recv(&e, 0);
        vt_sync(fd, 0xF0 + round);
        expect_pattern(&e, 0, 0xF00 + (uint32_t)round);
        send_pattern(&e, 1, 0xB00 + (uint32_t)round);
    }
    vt_sync(fd, 0xFE);
    vt_end_close(&e);
}

/* The worker's peer: connects, then exits without a word. */
static void dying_server(int fd, void *arg)
{
    (void)arg;
    vt_end e;
    vt_end_open(&e, &conf, fd, 1);
    vt_end_link(&e, "fork.worker");
    vt_sync(fd, 0xD0);
    _exit(0);
}

/* The parent's side of one echo. */
static void echo_round(vt_end *e, int fd, size_t round)
{
    post_recv(e, 1);
    vt_sync(fd, 0xF0 + round);
    send_pattern(e, 0, 0xF00 + (uint32_t)round);
    expect_pattern(e, 1, 0xB00 + (uint32_t)round);
}

/* Forked by a process whose provider runs a helper thread. */
static void worker(int fd, void *arg)
{
    (void)fd;
    (void)arg;
    vt_child peer = vt_spawn("dying server", dying_server, NULL);
    vt_end e;
    vt_end_open(&e, &conf, peer.fd, 0);
    vt_end_link(&e, "fork.worker");
    post_recv(&e, 0);
    vt_sync(peer.fd, 0xD0);
    CHECK_STATE_SOON(VIP_STATE_ERROR, e.vi);
    CHECK_ERROR_REPORTED(&e.errs, VIP_ERROR_CONN_LOST, e.vi);
    VIP_DESCRIPTOR *got = vt_recv_wait(e.vi);
    CHECK_PTR(desc(&e, 0), got);
    CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, got);
    CHECK_OK(VipDisconnect(e.vi));
    vt_end_close(&e);
    vt_join(&peer);
    printf("  worker: told of its peer's death\n");
    /* A child of a threaded process ends with _exit: what the parent's
     * other threads held is copied but unreachable here, and a leak
     * checker at exit would count it. */
    fflush(NULL);
    _exit(0);
}

int main(void)
{
    vt_init();
    vt_child srv = vt_spawn("server", echo_server, NULL);
    vt_end e;
    vt_end_open(&e, &conf, srv.fd, 0);
    vt_end_link(&e, "fork.parent");
    echo_round(&e, srv.fd, 0);

    vt_child w = vt_spawn("worker", worker, NULL);
    vt_join(&w);

    echo_round(&e, srv.fd, 1);
    vt_sync(srv.fd, 0xFE);
    vt_end_close(&e);
    vt_join(&srv);
    printf("fork: ok\n");
    return 0;
}
