/*
 * cq.c - completion queues.  128 connections: the server's 128 VIs share one
 * receive CQ, the client's 128 VIs one send CQ.  Messages go out on random
 * VIs; each completion is reported exactly once as (vi, RecvQueue) and the
 * VI's *Done then returns the descriptor, in posting order.  Also: the
 * VipCQWait timeout, VipResizeCQ, and the one-shot VipCQNotify,
 * VipRecvNotify and VipSendNotify callbacks.
 */
#include "vt.h"

#define NVI 128
#define DEPTH 4          /* receives posted per VI; sends in flight per VI */
#define SLOT 512         /* bytes per message buffer */
#define BATCHES 8
#define PER_BATCH 100

typedef struct {
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag;
    VIP_CQ_HANDLE cq;
    VIP_VI_HANDLE vi[NVI];
    vt_mem buf;
    vt_dpool descs;
    unsigned head[NVI];  /* oldest outstanding descriptor slot of each VI */
    unsigned count[NVI]; /* outstanding sends (client) */
    uint32_t seq[NVI];   /* next message number of each VI */
    /* One extra connection without CQs, for VipSendNotify/VipRecvNotify. */
    VIP_VI_HANDLE x;
} side_t;

static VIP_DESCRIPTOR *slot_desc(side_t *s, int i, unsigned k)
{
    return vt_dpool_get(&s->descs, (size_t)i * DEPTH + k);
}

static VIP_UINT8 *slot_buf(side_t *s, int i, unsigned k)
{
    return s->buf.base + ((size_t)i * DEPTH + k) * SLOT;
}

static int vi_index(side_t *s, VIP_VI_HANDLE vi)
{
    for (int i = 0; i < NVI; i++)
        if (s->vi[i] == vi)
            return i;
    VT_FAIL("completion for a VI that is not one of ours: %p", vi);
}

/* The length of message seq on VI i. */
static size_t msg_len(int i, uint32_t seq) { return 8 + ((size_t)i * 37 + seq * 101) % (SLOT - 8); }
static uint32_t msg_seed(int i, uint32_t seq) { return ((uint32_t)i << 16) ^ seq; }

static void side_open(side_t *s, int server)
{
    memset(s, 0, sizeof *s);
    s->nic = vt_open_nic(VT_DEV);
    CHECK_OK(VipCreatePtag(s->nic, &s->ptag));
    CHECK_OK(VipCreateCQ(s->nic, 1024, &s->cq));
    vt_mem_reg(&s->buf, s->nic, s->ptag, (size_t)(NVI + 1) * DEPTH * SLOT, VIP_FALSE, VIP_FALSE);
    vt_dpool_init(&s->descs, s->nic, s->ptag, (size_t)(NVI + 1) * DEPTH, 1);
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(VIP_SERVICE_RELIABLE_DELIVERY, s->ptag, 65536, 0, 0);
    for (int i = 0; i < NVI; i++)
        CHECK_OK(VipCreateVi(s->nic, &va, server ? NULL : s->cq, server ? s->cq : NULL, &s->vi[i]));
    CHECK_OK(VipCreateVi(s->nic, &va, NULL, NULL, &s->x));
}

static void side_close(side_t *s)
{
    for (int i = 0; i < NVI; i++) {
        CHECK_OK(VipDisconnect(s->vi[i]));
        CHECK_OK(VipDestroyVi(s->vi[i]));
    }
    CHECK_OK(VipDisconnect(s->x));
    CHECK_OK(VipDestroyVi(s->x));
    CHECK_OK(VipDestroyCQ(s->cq));
    vt_dpool_fini(&s->descs);
    vt_mem_dereg(&s->buf);
    CHECK_OK(VipDestroyPtag(s->nic, s->ptag));
    CHECK_OK(VipCloseNic(s->nic));
}

/* The next CQ entry, by VipCQWait or by polling VipCQDone. */
static int cq_next(side_t *s, int wait, VIP_BOOLEAN expect_recv)
{
    VIP_VI_HANDLE vi = NULL;
    VIP_BOOLEAN rq = !expect_recv;
    if (wait) {
        CHECK_OK(VipCQWait(s->cq, VT_WAIT_MS, &vi, &rq));
    } else {
        VIP_RETURN r;
        double until = vt_now_ms() + VT_WAIT_MS;
        while ((r = VipCQDone(s->cq, &vi, &rq)) == VIP_NOT_DONE && vt_now_ms() < until)
            sched_yield();
        CHECK_RET(VIP_SUCCESS, r);
    }
    CHECK_EQ(expect_recv, rq);
    return vi_index(s, vi);
}

/* ------------------------------------------------------------------ */
/* Callbacks                                                            */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int count;
    VIP_PVOID ctx;
    VIP_NIC_HANDLE nic;
    VIP_VI_HANDLE vi;
    VIP_DESCRIPTOR *desc;
    VIP_BOOLEAN recvq;
} note_t;

static void note_init(note_t *n)
{
    memset(n, 0, sizeof *n);
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->cv, NULL);
}

static void vi_callback(VIP_PVOID ctx, VIP_NIC_HANDLE nic, VIP_VI_HANDLE vi, VIP_DESCRIPTOR *d)
{
    note_t *n = ctx;
    pthread_mutex_lock(&n->mu);
    n->count++;
    n->ctx = ctx;
    n->nic = nic;
    n->vi = vi;
    n->desc = d;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
}

static void cq_callback(VIP_PVOID ctx, VIP_NIC_HANDLE nic, VIP_VI_HANDLE vi, VIP_BOOLEAN recvq)
{
    note_t *n = ctx;
    pthread_mutex_lock(&n->mu);
    n->count++;
    n->ctx = ctx;
    n->nic = nic;
    n->vi = vi;
    n->recvq = recvq;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
}

/* Wait until the callback has run at least once; return how often it ran. */
static int note_wait(note_t *n)
{
    double until = vt_now_ms() + VT_WAIT_MS;
    pthread_mutex_lock(&n->mu);
    while (n->count == 0 && vt_now_ms() < until) {
        pthread_mutex_unlock(&n->mu);
        vt_sleep_ms(1);
        pthread_mutex_lock(&n->mu);
    }
    int c = n->count;
    pthread_mutex_unlock(&n->mu);
    if (c == 0)
        VT_FAIL("callback not called within %lu ms", VT_WAIT_MS);
    return c;
}

static int note_count(note_t *n)
{
    pthread_mutex_lock(&n->mu);
    int c = n->count;
    pthread_mutex_unlock(&n->mu);
    return c;
}

/* ------------------------------------------------------------------ */
/* Server: receives through the shared receive CQ                       */

static void post_recv(side_t *s, int i, unsigned k)
{
    VIP_DESCRIPTOR *d = slot_desc(s, i, k);
    vt_desc_recv(d, slot_buf(s, i, k), s->buf.mh, SLOT, 1);
    CHECK_OK(VipPostRecv(s->vi[i], d, s->descs.mem.mh));
}

/* d is the next message of VI i: check it and post its descriptor again. */
static void check_received(side_t *s, int i, VIP_DESCRIPTOR *d)
{
    unsigned k = s->head[i];
    CHECK_PTR(slot_desc(s, i, k), d);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, d);
    CHECK_EQ(i, d->CS.ImmediateData);
    uint32_t seq = s->seq[i]++;
    size_t len = msg_len(i, seq);
    CHECK_EQ(len, d->CS.Length);
    uint32_t hdr[2];
    memcpy(hdr, slot_buf(s, i, k), sizeof hdr);
    CHECK_EQ(i, hdr[0]);
    CHECK_EQ(seq, hdr[1]);
    CHECK_PATTERN(slot_buf(s, i, k) + 8, len - 8, msg_seed(i, seq));
    post_recv(s, i, k);
    s->head[i] = (k + 1) % DEPTH;
}

static void receive_one(side_t *s, int wait)
{
    int i = cq_next(s, wait, VIP_TRUE);
    VIP_DESCRIPTOR *d = NULL;
    CHECK_OK(VipRecvDone(s->vi[i], &d));
    check_received(s, i, d);
}

static void server(int fd, void *arg)
{
    (void)arg;
    side_t s;
    char disc[VT_MAX_DISC], cdisc[VT_MAX_DISC];
    side_open(&s, 1);
    for (int i = 0; i < NVI; i++)
        for (unsigned k = 0; k < DEPTH; k++)
            post_recv(&s, i, k);

    /* Accept 128 requests on one discriminator; the client's discriminator
     * says which of its VIs asks. */
    vt_disc(disc, sizeof disc, "cq");
    VIP_NET_ADDRESS *local = vt_addr_local(s.nic, disc), *remote = vt_addr_buf();
    for (int i = 0; i < NVI; i++) {
        VIP_VI_ATTRIBUTES ra;
        VIP_CONN_HANDLE conn;
        CHECK_OK(VipConnectWait(s.nic, local, VT_WAIT_MS, remote, &ra, &conn));
        vt_disc(cdisc, sizeof cdisc, "cq-client-%d", i);
        CHECK(vt_addr_disc_is(remote, cdisc));
        CHECK_OK(VipConnectAccept(conn, s.vi[i]));
    }
    vt_disc(disc, sizeof disc, "cq-x");
    vt_accept(s.nic, s.x, disc);
    free(local);
    free(remote);

    VIP_VI_HANDLE vi;
    VIP_BOOLEAN rq;
    for (int b = 0; b < BATCHES; b++) {
        uint64_t n = vt_get_u64(fd);
        for (uint64_t j = 0; j < n; j++)
            receive_one(&s, (int)(j & 1));
        /* Every completion was reported once. */
        CHECK_RET(VIP_NOT_DONE, VipCQDone(s.cq, &vi, &rq));
        VIP_DESCRIPTOR *d;
        for (int i = 0; i < NVI; i += 17)
            CHECK_RET(VIP_NOT_DONE, VipRecvDone(s.vi[i], &d));
        if (b == BATCHES / 2)
            CHECK_OK(VipResizeCQ(s.cq, 2048));
        vt_put_u64(fd, 1);
    }

    double t0 = vt_now_ms();
    CHECK_RET(VIP_TIMEOUT, VipCQWait(s.cq, 50, &vi, &rq));
    CHECK(vt_now_ms() - t0 >= 49.0);

    /* VipCQNotify: once, with the CQ entry of the next completion. */
    note_t note;
    note_init(&note);
    CHECK_OK(VipCQNotify(s.cq, &note, cq_callback));
    vt_put_u64(fd, 2); /* armed; the client sends on VI 77 */
    CHECK_EQ(1, note_wait(&note));
    CHECK_PTR(&note, note.ctx);
    CHECK_PTR(s.nic, note.nic);
    CHECK_PTR(s.vi[77], note.vi);
    CHECK_EQ(VIP_TRUE, note.recvq);
    CHECK_RET(VIP_NOT_DONE, VipCQDone(s.cq, &vi, &rq));
    VIP_DESCRIPTOR *d = NULL;
    CHECK_OK(VipRecvDone(s.vi[77], &d));
    check_received(&s, 77, d);
    vt_put_u64(fd, 3); /* the client sends on VI 5 */
    receive_one(&s, 1);
    vt_sleep_ms(50);
    CHECK_EQ(1, note_count(&note));

    /* VipRecvNotify on the VI without CQ. */
    VIP_DESCRIPTOR *r0 = slot_desc(&s, NVI, 0), *r1 = slot_desc(&s, NVI, 1);
    vt_desc_recv(r0, slot_buf(&s, NVI, 0), s.buf.mh, SLOT, 1);
    vt_desc_recv(r1, slot_buf(&s, NVI, 1), s.buf.mh, SLOT, 1);
    CHECK_OK(VipPostRecv(s.x, r0, s.descs.mem.mh));
    CHECK_OK(VipPostRecv(s.x, r1, s.descs.mem.mh));
    note_t rn;
    note_init(&rn);
    CHECK_OK(VipRecvNotify(s.x, &rn, vi_callback));
    vt_put_u64(fd, 4);
    CHECK_EQ(1, note_wait(&rn));
    CHECK_PTR(&rn, rn.ctx);
    CHECK_PTR(s.nic, rn.nic);
    CHECK_PTR(s.x, rn.vi);
    CHECK_PTR(r0, rn.desc);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, r0);
    CHECK_EQ(0xABC0, r0->CS.ImmediateData);
    CHECK_EQ(100, r0->CS.Length);
    CHECK_PATTERN(slot_buf(&s, NVI, 0), 100, 0xABC0);
    /* The callback took the descriptor off the queue; the second message
     * completes the usual way. */
    d = vt_recv_wait(s.x);
    CHECK_PTR(r1, d);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, r1);
    CHECK_EQ(0xABC1, r1->CS.ImmediateData);
    CHECK_PATTERN(slot_buf(&s, NVI, 1), 101, 0xABC1);
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(s.x, &d));
    CHECK_EQ(1, note_count(&rn));

    vt_sync(fd, 5);
    side_close(&s);
}

/* ------------------------------------------------------------------ */
/* Client: sends through the shared send CQ                             */

static void post_send(side_t *s, int i)
{
    CHECK(s->count[i] < DEPTH);
    unsigned k = (s->head[i] + s->count[i]) % DEPTH;
    uint32_t seq = s->seq[i]++;
    size_t len = msg_len(i, seq);
    uint32_t hdr[2] = {(uint32_t)i, seq};
    memcpy(slot_buf(s, i, k), hdr, sizeof hdr);
    vt_fill(slot_buf(s, i, k) + 8, len - 8, msg_seed(i, seq));
    VIP_DESCRIPTOR *d = slot_desc(s, i, k);
    vt_desc_send(d, VIP_CONTROL_IMMEDIATE, (VIP_UINT32)i, slot_buf(s, i, k), s->buf.mh, len, 1);
    CHECK_OK(VipPostSend(s->vi[i], d, s->descs.mem.mh));
    s->count[i]++;
}

static void send_completed(side_t *s, int wait)
{
    int i = cq_next(s, wait, VIP_FALSE);
    if (s->count[i] == 0)
        VT_FAIL("send CQ reports VI %d, which has no send outstanding", i);
    VIP_DESCRIPTOR *d = NULL;
    CHECK_OK(VipSendDone(s->vi[i], &d));
    unsigned k = s->head[i];
    CHECK_PTR(slot_desc(s, i, k), d);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, d);
    s->head[i] = (k + 1) % DEPTH;
    s->count[i]--;
}

/* How many mappings of this process name `what` with permissions `perms`
 * ("rw-s": read-write and shared). */
static int mappings_of(const char *what, const char *perms)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    CHECK(maps != NULL);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, maps)) {
        const char *p = strchr(line, ' ');
        n += strstr(line, what) != NULL && p != NULL && strncmp(p + 1, perms, 4) == 0;
    }
    fclose(maps);
    return n;
}

static void client(side_t *s, int fd)
{
    char disc[VT_MAX_DISC], cdisc[VT_MAX_DISC];
    vt_disc(disc, sizeof disc, "cq");
    VIP_NET_ADDRESS *remote = vt_addr_local(s->nic, disc);
    for (int i = 0; i < NVI; i++) {
        vt_disc(cdisc, sizeof cdisc, "cq-client-%d", i);
        VIP_NET_ADDRESS *local = vt_addr_local(s->nic, cdisc);
        VIP_VI_ATTRIBUTES ra;
        CHECK_OK(VipConnectRequest(s->vi[i], local, remote, VT_WAIT_MS, &ra));
        free(local);
    }
    free(remote);
    vt_disc(disc, sizeof disc, "cq-x");
    vt_connect(s->nic, s->x, disc);
    /* One completion lane each way serves all 129 connections to the
     * server: ours, into which the server pushes, and the server's, into
     * which we push; the server's bell is mapped once, next to this NIC's
     * own, and so is the memory registry the server publishes, read-only,
     * next to this NIC's own.  This NIC's private inbox is shared with
     * nobody. */
    CHECK_EQ(1, mappings_of("memfd:openvia-inbox", "rw-s"));
    CHECK_EQ(2, mappings_of("memfd:openvia-lane", "rw-s"));
    CHECK_EQ(2, mappings_of("memfd:openvia-bell", "rw-s"));
    CHECK_EQ(0, mappings_of("memfd:openvia-inbox", "r--s"));
    CHECK_EQ(1, mappings_of("memfd:openvia-registry", "rw-s"));
    CHECK_EQ(1, mappings_of("memfd:openvia-registry", "r--s"));

    uint32_t rng = 12345;
    VIP_VI_HANDLE vi;
    VIP_BOOLEAN rq;
    printf("%d batches of %d messages on random VIs of %d\n", BATCHES, PER_BATCH, NVI);
    for (int b = 0; b < BATCHES; b++) {
        unsigned in_batch[NVI] = {0};
        for (int j = 0; j < PER_BATCH;) {
            int i = (int)(vt_rand(&rng) % NVI);
            if (in_batch[i] == DEPTH)
                continue;
            in_batch[i]++;
            post_send(s, i);
            j++;
        }
        vt_put_u64(fd, PER_BATCH);
        for (int j = 0; j < PER_BATCH; j++)
            send_completed(s, j & 1);
        CHECK_RET(VIP_NOT_DONE, VipCQDone(s->cq, &vi, &rq));
        for (int i = 0; i < NVI; i++)
            CHECK_EQ(0, s->count[i]);
        if (b == BATCHES / 2)
            CHECK_OK(VipResizeCQ(s->cq, 4096));
        CHECK_EQ(1, vt_get_u64(fd));
    }

    printf("VipCQNotify\n");
    CHECK_EQ(2, vt_get_u64(fd));
    post_send(s, 77);
    send_completed(s, 1);
    CHECK_EQ(3, vt_get_u64(fd));
    post_send(s, 5);
    send_completed(s, 0);

    printf("VipSendNotify, VipRecvNotify\n");
    CHECK_EQ(4, vt_get_u64(fd));
    VIP_DESCRIPTOR *s0 = slot_desc(s, NVI, 0), *s1 = slot_desc(s, NVI, 1);
    vt_fill(slot_buf(s, NVI, 0), 100, 0xABC0);
    vt_fill(slot_buf(s, NVI, 1), 101, 0xABC1);
    vt_desc_send(s0, VIP_CONTROL_IMMEDIATE, 0xABC0, slot_buf(s, NVI, 0), s->buf.mh, 100, 1);
    vt_desc_send(s1, VIP_CONTROL_IMMEDIATE, 0xABC1, slot_buf(s, NVI, 1), s->buf.mh, 101, 1);
    note_t sn;
    note_init(&sn);
    CHECK_OK(VipSendNotify(s->x, &sn, vi_callback));
    CHECK_OK(VipPostSend(s->x, s0, s->descs.mem.mh));
    CHECK_EQ(1, note_wait(&sn));
    CHECK_PTR(&sn, sn.ctx);
    CHECK_PTR(s->nic, sn.nic);
    CHECK_PTR(s->x, sn.vi);
    CHECK_PTR(s0, sn.desc);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, s0);
    VIP_DESCRIPTOR *d;
    CHECK_RET(VIP_NOT_DONE, VipSendDone(s->x, &d));
    CHECK_OK(VipPostSend(s->x, s1, s->descs.mem.mh));
    d = vt_send_wait(s->x);
    CHECK_PTR(s1, d);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, s1);
    vt_sleep_ms(20);
    CHECK_EQ(1, note_count(&sn));
    vt_sync(fd, 5);
}

int main(void)
{
    vt_init();
    vt_child srv = vt_spawn("server", server, NULL);
    side_t s;
    vt_role = "client";
    side_open(&s, 0);
    client(&s, srv.fd);
    side_close(&s);
    vt_join(&srv);
    printf("cq: ok\n");
    return 0;
}
