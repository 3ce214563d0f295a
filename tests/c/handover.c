/*
 * handover.c - one VI used by one thread long enough that its work queues
 * belong to that thread, then by two threads at once.
 *
 * The client's main thread first makes ROUNDS round trips alone.  Then it
 * and a second thread share the VI: each posts receives and sends (a
 * pthread mutex keeps a message's receive and send together, so message
 * m's echo lands in the receive posted with it) and each polls VipRecvDone
 * and VipSendDone, so both take both work-queue locks: the new thread from
 * the one that used them alone, while that one goes on using them.  Every
 * echo is checked (immediate data, length, bytes) exactly once, by
 * whichever thread completes it.  The server echoes every message from one
 * thread.  Reliable delivery: a lost or misplaced message breaks the
 * connection.
 */
#include "vt.h"

#define DEPTH 8           /* client messages in flight at most (receive slots) */
#define SRV_RECVS (2 * DEPTH)
#define SLOT 4096         /* bytes per buffer slot */
#define ROUNDS 3000       /* alone, then shared */

static size_t msg_len(unsigned m) { return ((size_t)m * 2654435761u) % (SLOT + 1); }
static uint32_t msg_seed(unsigned m) { return 0x4a000000u ^ m; }

/* ------------------------------------------------------------------ */
/* Server: echo every message back, from one thread.                    */

static void server(vt_end *e)
{
    VIP_UINT8 *base = e->buf.base;
    for (unsigned k = 0; k < SRV_RECVS; k++) {
        VIP_DESCRIPTOR *d = vt_dpool_get(&e->descs, k);
        vt_desc_recv(d, base + (size_t)k * SLOT, e->buf.mh, SLOT, 1);
        CHECK_OK(VipPostRecv(e->vi, d, e->descs.mem.mh));
    }
    vt_sync(e->fd, 1); /* the client sends once the receives are posted */
    VIP_DESCRIPTOR *sd = vt_dpool_get(&e->descs, SRV_RECVS);
    for (unsigned i = 0; i < 2 * ROUNDS; i++) {
        VIP_DESCRIPTOR *d = (i & 1) ? vt_recv_done(e->vi) : vt_recv_wait(e->vi);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, d);
        size_t k = (size_t)(d - vt_dpool_get(&e->descs, 0));
        CHECK(k < SRV_RECVS);
        size_t len = d->CS.Length;
        vt_desc_send(sd, VIP_CONTROL_IMMEDIATE, ~d->CS.ImmediateData, base + k * SLOT, e->buf.mh, len, 1);
        CHECK_OK(VipPostSend(e->vi, sd, e->descs.mem.mh));
        CHECK_PTR(sd, vt_send_wait(e->vi));
        vt_desc_recv(d, base + k * SLOT, e->buf.mh, SLOT, 1);
        CHECK_OK(VipPostRecv(e->vi, d, e->descs.mem.mh));
    }
}

/* ------------------------------------------------------------------ */
/* Client                                                               */

/* Descriptors: DEPTH receives, then DEPTH sends; buffers likewise. */
typedef struct {
    vt_end *e;
    pthread_mutex_t mu;   /* posting: a message's receive and send together */
    unsigned next;        /* next message to send, under mu */
    unsigned slot_msg[DEPTH];    /* the message each receive slot waits for */
    int recv_busy[DEPTH];        /* posted, echo not yet checked, under mu */
    int send_free[DEPTH];        /* send slots not posted, under mu */
    unsigned checked;            /* echoes checked, under mu */
    unsigned char seen[ROUNDS];  /* each message checked once, under mu */
    unsigned end;                /* messages to send: ROUNDS after the first ROUNDS */
} shared_t;

static VIP_DESCRIPTOR *recv_desc(vt_end *e, unsigned k) { return vt_dpool_get(&e->descs, k); }
static VIP_DESCRIPTOR *send_desc(vt_end *e, unsigned k) { return vt_dpool_get(&e->descs, DEPTH + k); }
static VIP_UINT8 *recv_buf(vt_end *e, unsigned k) { return e->buf.base + (size_t)k * SLOT; }
static VIP_UINT8 *send_buf(vt_end *e, unsigned k) { return e->buf.base + (size_t)(DEPTH + k) * SLOT; }

static void check_echo(VIP_DESCRIPTOR *d, VIP_UINT8 *buf, unsigned m)
{
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, d);
    CHECK_EQ(~m, d->CS.ImmediateData);
    CHECK_EQ(msg_len(m), d->CS.Length);
    CHECK_PATTERN(buf, msg_len(m), msg_seed(m));
}

/* Phase one: the main thread alone, one message at a time. */
static void alone(vt_end *e)
{
    for (unsigned m = 0; m < ROUNDS; m++) {
        unsigned k = m % DEPTH;
        vt_desc_recv(recv_desc(e, k), recv_buf(e, k), e->buf.mh, SLOT, 1);
        CHECK_OK(VipPostRecv(e->vi, recv_desc(e, k), e->descs.mem.mh));
        vt_fill(send_buf(e, k), msg_len(m), msg_seed(m));
        vt_desc_send(send_desc(e, k), VIP_CONTROL_IMMEDIATE, m, send_buf(e, k), e->buf.mh, msg_len(m), 1);
        CHECK_OK(VipPostSend(e->vi, send_desc(e, k), e->descs.mem.mh));
        CHECK_PTR(send_desc(e, k), vt_send_done(e->vi));
        VIP_DESCRIPTOR *d = vt_recv_done(e->vi);
        CHECK_PTR(recv_desc(e, k), d);
        check_echo(d, recv_buf(e, k), m);
    }
}

/* Posts the next message with its receive, if one may be in flight. */
static void post_next(shared_t *s)
{
    vt_end *e = s->e;
    pthread_mutex_lock(&s->mu);
    int slot = -1;
    for (int i = 0; i < DEPTH && slot < 0; i++)
        if (s->send_free[i])
            slot = i;
    /* Message m's receive slot is m % DEPTH, free once the echo of
     * m - DEPTH is checked (by either thread, in either order). */
    if (s->next < s->end && slot >= 0 && !s->recv_busy[s->next % DEPTH]) {
        unsigned m = s->next++;
        unsigned k = m % DEPTH;
        s->slot_msg[k] = m;
        s->recv_busy[k] = 1;
        vt_desc_recv(recv_desc(e, k), recv_buf(e, k), e->buf.mh, SLOT, 1);
        CHECK_OK(VipPostRecv(e->vi, recv_desc(e, k), e->descs.mem.mh));
        s->send_free[slot] = 0;
        vt_fill(send_buf(e, (unsigned)slot), msg_len(m), msg_seed(m));
        vt_desc_send(send_desc(e, (unsigned)slot), VIP_CONTROL_IMMEDIATE, m, send_buf(e, (unsigned)slot),
                     e->buf.mh, msg_len(m), 1);
        CHECK_OK(VipPostSend(e->vi, send_desc(e, (unsigned)slot), e->descs.mem.mh));
    }
    pthread_mutex_unlock(&s->mu);
}

static void *sharer(void *p)
{
    shared_t *s = p;
    vt_end *e = s->e;
    double until = vt_now_ms() + (double)VT_WAIT_MS;
    for (;;) {
        post_next(s);
        VIP_DESCRIPTOR *d = NULL;
        if (VipSendDone(e->vi, &d) == VIP_SUCCESS) {
            size_t slot = (size_t)(d - send_desc(e, 0));
            CHECK(slot < DEPTH);
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, d);
            pthread_mutex_lock(&s->mu);
            CHECK(!s->send_free[slot]);
            s->send_free[slot] = 1;
            pthread_mutex_unlock(&s->mu);
        }
        if (VipRecvDone(e->vi, &d) == VIP_SUCCESS) {
            size_t k = (size_t)(d - recv_desc(e, 0));
            CHECK(k < DEPTH);
            pthread_mutex_lock(&s->mu);
            unsigned m = s->slot_msg[k];
            pthread_mutex_unlock(&s->mu);
            /* The slot is not posted again before its echo is counted. */
            check_echo(d, recv_buf(e, (unsigned)k), m);
            pthread_mutex_lock(&s->mu);
            CHECK(!s->seen[m - ROUNDS]);
            s->seen[m - ROUNDS] = 1;
            s->checked++;
            s->recv_busy[k] = 0;
            pthread_mutex_unlock(&s->mu);
        }
        pthread_mutex_lock(&s->mu);
        int finished = s->checked == ROUNDS;
        pthread_mutex_unlock(&s->mu);
        if (finished)
            return NULL;
        if (vt_now_ms() > until)
            VT_FAIL("shared VI: %u of %u echoes after %lu ms", s->checked, ROUNDS, VT_WAIT_MS);
    }
}

static void client(vt_end *e)
{
    vt_sync(e->fd, 1);
    alone(e);
    shared_t s;
    memset(&s, 0, sizeof s);
    s.e = e;
    pthread_mutex_init(&s.mu, NULL);
    s.next = ROUNDS;
    s.end = 2 * ROUNDS;
    for (int i = 0; i < DEPTH; i++)
        s.send_free[i] = 1;
    /* The thread the queues belong to keeps using them beside a new one. */
    pthread_t other;
    CHECK(pthread_create(&other, NULL, sharer, &s) == 0);
    sharer(&s);
    pthread_join(other, NULL);
    CHECK_EQ(ROUNDS, s.checked);
    for (unsigned i = 0; i < ROUNDS; i++)
        CHECK(s.seen[i]);
    /* Every send completes, and nothing more arrives. */
    unsigned outstanding = 0;
    for (int i = 0; i < DEPTH; i++)
        outstanding += !s.send_free[i];
    VIP_DESCRIPTOR *d;
    while (outstanding-- > 0) {
        d = vt_send_done(e->vi);
        size_t slot = (size_t)(d - send_desc(e, 0));
        CHECK(slot < DEPTH && !s.send_free[slot]);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, d);
        s.send_free[slot] = 1;
    }
    d = NULL;
    CHECK_RET(VIP_NOT_DONE, VipSendDone(e->vi, &d));
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(e->vi, &d));
    CHECK_STATE(VIP_STATE_CONNECTED, e->vi);
    pthread_mutex_destroy(&s.mu);
}

static const vt_scenario scenarios[] = {
    {"alone, then shared by two threads", {VIP_SERVICE_RELIABLE_DELIVERY, 0, 0, 0, (2 * SRV_RECVS + 1) * SLOT, 2 * SRV_RECVS + 1, 1}, client, server},
};

int main(void)
{
    vt_init();
    vt_scenarios all = {scenarios, sizeof scenarios / sizeof scenarios[0]};
    vt_child srv = vt_scenarios_spawn(&all);
    vt_scenarios_client(&all, &srv);
    printf("handover: ok\n");
    return 0;
}
