/*
 * threads.c - one NIC used by several threads at once.  The client process
 * runs 4 threads, each registering its own memory and driving its own VI
 * (connect, send, wait, check the echo).  The server process has the 4
 * peer VIs on one receive CQ and 2 threads polling that CQ, each echoing
 * whatever message it gets.  Every byte is checked on both sides.
 */
#include "vt.h"

#define NTHREADS 4
#define NPOLLERS 2
#define DEPTH 4
#define BIG (1u << 20)
#define MAXLEN BIG

static unsigned messages(void) { return getenv("VT_QUICK") ? 200 : 1500; }

/* Message m of thread t: length and pattern. */
static size_t msg_len(int t, unsigned m)
{
    if (m % 100 == 99)
        return BIG;
    return ((size_t)m * 2654435761u + (size_t)t * 977) % 16385;
}

static uint32_t msg_seed(int t, unsigned m) { return ((uint32_t)t << 24) ^ m; }

/* ------------------------------------------------------------------ */
/* Server                                                               */

typedef struct {
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag;
    VIP_CQ_HANDLE cq;
    VIP_VI_HANDLE vi[NTHREADS];
    pthread_mutex_t lock[NTHREADS];
    vt_mem buf[NTHREADS];   /* DEPTH receive slots of MAXLEN each */
    vt_dpool descs[NTHREADS]; /* DEPTH receives, then one send */
    unsigned head[NTHREADS];
    unsigned next[NTHREADS];  /* expected message number */
    unsigned total;           /* messages to serve in all */
    unsigned served;          /* guarded by done_mu */
    unsigned by_poller[NPOLLERS];
    pthread_mutex_t done_mu;
} server_t;

static VIP_UINT8 *srv_slot(server_t *s, int t, unsigned k) { return s->buf[t].base + (size_t)k * MAXLEN; }

static void srv_post_recv(server_t *s, int t, unsigned k)
{
    VIP_DESCRIPTOR *d = vt_dpool_get(&s->descs[t], k);
    vt_desc_recv(d, srv_slot(s, t, k), s->buf[t].mh, MAXLEN, 2);
    CHECK_OK(VipPostRecv(s->vi[t], d, s->descs[t].mem.mh));
}

typedef struct {
    server_t *s;
    int id;
} poller_arg;

static void *poller(void *p)
{
    poller_arg *a = p;
    server_t *s = a->s;
    for (;;) {
        pthread_mutex_lock(&s->done_mu);
        int finished = s->served == s->total;
        pthread_mutex_unlock(&s->done_mu);
        if (finished)
            return NULL;

        VIP_VI_HANDLE vi = NULL;
        VIP_BOOLEAN rq = VIP_FALSE;
        VIP_RETURN r = a->id == 0 ? VipCQWait(s->cq, 20, &vi, &rq) : VipCQDone(s->cq, &vi, &rq);
        if (r == VIP_TIMEOUT || r == VIP_NOT_DONE) {
            if (a->id != 0)
                sched_yield();
            continue;
        }
        CHECK_RET(VIP_SUCCESS, r);
        CHECK_EQ(VIP_TRUE, rq);
        int t = -1;
        for (int i = 0; i < NTHREADS; i++)
            if (s->vi[i] == vi)
                t = i;
        CHECK(t >= 0);

        pthread_mutex_lock(&s->lock[t]);
        VIP_DESCRIPTOR *d = NULL;
        CHECK_OK(VipRecvDone(vi, &d));
        unsigned k = s->head[t], m = s->next[t]++;
        CHECK_PTR(vt_dpool_get(&s->descs[t], k), d);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, d);
        CHECK_EQ(m, d->CS.ImmediateData);
        size_t len = msg_len(t, m);
        CHECK_EQ(len, d->CS.Length);
        CHECK_PATTERN(srv_slot(s, t, k), len, msg_seed(t, m));

        /* Echo from the receive slot, then give the slot back. */
        VIP_DESCRIPTOR *sd = vt_dpool_get(&s->descs[t], DEPTH);
        vt_desc_send(sd, VIP_CONTROL_IMMEDIATE, ~m, srv_slot(s, t, k), s->buf[t].mh, len, 1);
        CHECK_OK(VipPostSend(vi, sd, s->descs[t].mem.mh));
        VIP_DESCRIPTOR *got = vt_send_wait(vi);
        CHECK_PTR(sd, got);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
        srv_post_recv(s, t, k);
        s->head[t] = (k + 1) % DEPTH;
        pthread_mutex_unlock(&s->lock[t]);

        pthread_mutex_lock(&s->done_mu);
        s->served++;
        s->by_poller[a->id]++;
        pthread_mutex_unlock(&s->done_mu);
    }
}

static void server(int fd, void *arg)
{
    (void)arg;
    server_t s;
    memset(&s, 0, sizeof s);
    s.total = NTHREADS * messages();
    pthread_mutex_init(&s.done_mu, NULL);
    s.nic = vt_open_nic(VT_DEV);
    CHECK_OK(VipCreatePtag(s.nic, &s.ptag));
    CHECK_OK(VipCreateCQ(s.nic, 256, &s.cq));
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(VIP_SERVICE_RELIABLE_DELIVERY, s.ptag, VT_MAX_TRANSFER, 0, 0);
    for (int t = 0; t < NTHREADS; t++) {
        pthread_mutex_init(&s.lock[t], NULL);
        vt_mem_reg(&s.buf[t], s.nic, s.ptag, (size_t)DEPTH * MAXLEN, VIP_FALSE, VIP_FALSE);
        vt_dpool_init(&s.descs[t], s.nic, s.ptag, DEPTH + 1, 2);
        CHECK_OK(VipCreateVi(s.nic, &va, NULL, s.cq, &s.vi[t]));
        for (unsigned k = 0; k < DEPTH; k++)
            srv_post_recv(&s, t, k);
    }
    /* The client's threads connect in any order; their discriminators say
     * which is which. */
    char disc[VT_MAX_DISC];
    vt_disc(disc, sizeof disc, "threads");
    VIP_NET_ADDRESS *local = vt_addr_local(s.nic, disc), *remote = vt_addr_buf();
    int taken[NTHREADS] = {0};
    for (int n = 0; n < NTHREADS; n++) {
        VIP_VI_ATTRIBUTES ra;
        VIP_CONN_HANDLE conn;
        CHECK_OK(VipConnectWait(s.nic, local, VT_WAIT_MS, remote, &ra, &conn));
        int t = -1;
        for (int i = 0; i < NTHREADS; i++) {
            char cdisc[VT_MAX_DISC];
            vt_disc(cdisc, sizeof cdisc, "threads-%d", i);
            if (vt_addr_disc_is(remote, cdisc))
                t = i;
        }
        CHECK(t >= 0 && !taken[t]);
        taken[t] = 1;
        CHECK_OK(VipConnectAccept(conn, s.vi[t]));
    }
    free(local);
    free(remote);

    pthread_t th[NPOLLERS];
    poller_arg pa[NPOLLERS];
    for (int i = 0; i < NPOLLERS; i++) {
        pa[i] = (poller_arg){&s, i};
        CHECK(pthread_create(&th[i], NULL, poller, &pa[i]) == 0);
    }
    for (int i = 0; i < NPOLLERS; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ(s.total, s.served);
    for (int t = 0; t < NTHREADS; t++)
        CHECK_EQ(messages(), s.next[t]);
    printf("  pollers served %u and %u messages\n", s.by_poller[0], s.by_poller[1]);
    VIP_VI_HANDLE vi;
    VIP_BOOLEAN rq;
    CHECK_RET(VIP_NOT_DONE, VipCQDone(s.cq, &vi, &rq));

    vt_sync(fd, 1);
    for (int t = 0; t < NTHREADS; t++) {
        CHECK_OK(VipDisconnect(s.vi[t]));
        CHECK_OK(VipDestroyVi(s.vi[t]));
        vt_dpool_fini(&s.descs[t]);
        vt_mem_dereg(&s.buf[t]);
    }
    CHECK_OK(VipDestroyCQ(s.cq));
    CHECK_OK(VipDestroyPtag(s.nic, s.ptag));
    CHECK_OK(VipCloseNic(s.nic));
}

/* ------------------------------------------------------------------ */
/* Client                                                               */

typedef struct {
    int t;
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag;
    VIP_VI_HANDLE vi;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *a = p;
    int t = a->t;
    vt_mem buf;
    vt_dpool descs;
    vt_mem_reg(&buf, a->nic, a->ptag, 2 * MAXLEN, VIP_FALSE, VIP_FALSE);
    vt_dpool_init(&descs, a->nic, a->ptag, 2, 2);
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(VIP_SERVICE_RELIABLE_DELIVERY, a->ptag, VT_MAX_TRANSFER, 0, 0);
    CHECK_OK(VipCreateVi(a->nic, &va, NULL, NULL, &a->vi));

    char disc[VT_MAX_DISC], cdisc[VT_MAX_DISC];
    vt_disc(disc, sizeof disc, "threads");
    vt_disc(cdisc, sizeof cdisc, "threads-%d", t);
    VIP_NET_ADDRESS *local = vt_addr_local(a->nic, cdisc), *remote = vt_addr_local(a->nic, disc);
    VIP_VI_ATTRIBUTES ra;
    CHECK_OK(VipConnectRequest(a->vi, local, remote, VT_WAIT_MS, &ra));
    free(local);
    free(remote);

    VIP_UINT8 *out = buf.base, *in = buf.base + MAXLEN;
    VIP_DESCRIPTOR *sd = vt_dpool_get(&descs, 0), *rd = vt_dpool_get(&descs, 1);
    unsigned n = messages();
    for (unsigned m = 0; m < n; m++) {
        size_t len = msg_len(t, m);
        vt_desc_recv(rd, in, buf.mh, MAXLEN, 1);
        CHECK_OK(VipPostRecv(a->vi, rd, descs.mem.mh));
        vt_fill(out, len, msg_seed(t, m));
        vt_desc_send(sd, VIP_CONTROL_IMMEDIATE, m, out, buf.mh, len, 2);
        CHECK_OK(VipPostSend(a->vi, sd, descs.mem.mh));
        VIP_DESCRIPTOR *d = (m & 1) ? vt_send_done(a->vi) : vt_send_wait(a->vi);
        CHECK_PTR(sd, d);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, d);
        d = (m & 2) ? vt_recv_done(a->vi) : vt_recv_wait(a->vi);
        CHECK_PTR(rd, d);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, d);
        CHECK_EQ(~m, d->CS.ImmediateData);
        CHECK_EQ(len, d->CS.Length);
        CHECK_PATTERN(in, len, msg_seed(t, m));
    }
    CHECK_STATE(VIP_STATE_CONNECTED, a->vi);
    vt_dpool_fini(&descs);
    vt_mem_dereg(&buf);
    return NULL;
}

/* A thread that waits for ever on a NIC that another thread closes. */
typedef struct {
    VIP_NIC_HANDLE nic;
    VIP_VI_HANDLE vi;   /* NULL: VipConnectWait; else VipConnectRequest */
    VIP_RETURN ret;
} closed_wait_arg;

static void *wait_forever(void *p)
{
    closed_wait_arg *a = p;
    char disc[VT_MAX_DISC];
    vt_disc(disc, sizeof disc, "nobody-comes-%p", (void *)a);
    VIP_NET_ADDRESS *local = vt_addr_local(a->nic, disc);
    VIP_NET_ADDRESS *remote = vt_addr_buf();
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn = NULL;
    if (a->vi == NULL) {
        a->ret = VipConnectWait(a->nic, local, VIP_INFINITE, remote, &ra, &conn);
    } else {
        free(remote);
        vt_disc(disc, sizeof disc, "nobody-listens");
        remote = vt_addr_local(a->nic, disc);
        a->ret = VipConnectRequest(a->vi, local, remote, VIP_INFINITE, &ra);
    }
    free(local);
    free(remote);
    return NULL;
}

/* VipCloseNic ends other threads' waits on that NIC, however long they
 * asked to wait. */
static void close_ends_waits(void)
{
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    VIP_PROTECTION_HANDLE ptag;
    CHECK_OK(VipCreatePtag(nic, &ptag));
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(VIP_SERVICE_RELIABLE_DELIVERY, ptag, 65536, VIP_FALSE, VIP_FALSE);
    VIP_VI_HANDLE vi;
    CHECK_OK(VipCreateVi(nic, &va, NULL, NULL, &vi));
    closed_wait_arg args[2] = {{nic, NULL, VIP_SUCCESS}, {nic, vi, VIP_SUCCESS}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&th[i], NULL, wait_forever, &args[i]) == 0);
    vt_sleep_ms(300);
    double t0 = vt_now_ms();
    CHECK_OK(VipCloseNic(nic));
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    double took = vt_now_ms() - t0;
    CHECK(took < 5000);
    CHECK_EQ(VIP_INVALID_PARAMETER, args[0].ret);
    CHECK_EQ(VIP_INVALID_PARAMETER, args[1].ret);
    printf("VipCloseNic ended a VipConnectWait and a VipConnectRequest (VIP_INFINITE) in %.0f ms\n", took);
}

typedef struct {
    int what; /* 0: VipRecvWait, 1: VipSendWait, 2: VipCQWait */
    VIP_VI_HANDLE vi;
    VIP_CQ_HANDLE cq;
    VIP_RETURN ret;
} object_wait_arg;

static void *wait_on_object(void *p)
{
    object_wait_arg *a = p;
    VIP_DESCRIPTOR *d = NULL;
    VIP_VI_HANDLE vi = NULL;
    VIP_BOOLEAN rq = VIP_FALSE;
    switch (a->what) {
    case 0:
        a->ret = VipRecvWait(a->vi, VIP_INFINITE, &d);
        break;
    case 1:
        a->ret = VipSendWait(a->vi, VIP_INFINITE, &d);
        break;
    default:
        a->ret = VipCQWait(a->cq, VIP_INFINITE, &vi, &rq);
    }
    return NULL;
}

/* VipDestroyVi and VipDestroyCQ end other threads' waits on them, however
 * long they asked to wait: the handle is no longer valid. */
static void destroy_ends_waits(void)
{
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    VIP_PROTECTION_HANDLE ptag;
    CHECK_OK(VipCreatePtag(nic, &ptag));
    VIP_CQ_HANDLE cq;
    CHECK_OK(VipCreateCQ(nic, 16, &cq));
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(VIP_SERVICE_RELIABLE_DELIVERY, ptag, 65536, VIP_FALSE, VIP_FALSE);
    VIP_VI_HANDLE recv_vi, send_vi, cq_vi;
    CHECK_OK(VipCreateVi(nic, &va, NULL, NULL, &recv_vi));
    CHECK_OK(VipCreateVi(nic, &va, NULL, NULL, &send_vi));
    CHECK_OK(VipCreateVi(nic, &va, NULL, cq, &cq_vi));
    object_wait_arg args[3] = {{0, recv_vi, NULL, VIP_SUCCESS}, {1, send_vi, NULL, VIP_SUCCESS},
                               {2, NULL, cq, VIP_SUCCESS}};
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        CHECK(pthread_create(&th[i], NULL, wait_on_object, &args[i]) == 0);
    vt_sleep_ms(300);
    double t0 = vt_now_ms();
    CHECK_OK(VipDestroyVi(recv_vi));
    CHECK_OK(VipDestroyVi(send_vi));
    CHECK_OK(VipDestroyVi(cq_vi));
    CHECK_OK(VipDestroyCQ(cq));
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    double took = vt_now_ms() - t0;
    CHECK(took < 5000);
    for (int i = 0; i < 3; i++)
        if (args[i].ret != VIP_INVALID_PARAMETER)
            VT_FAIL("wait %d ended with %s, not VIP_INVALID_PARAMETER", i, vt_ret_name(args[i].ret));
    CHECK_OK(VipDestroyPtag(nic, ptag));
    CHECK_OK(VipCloseNic(nic));
    printf("VipDestroyVi and VipDestroyCQ ended a VipRecvWait, a VipSendWait and a VipCQWait (VIP_INFINITE) in %.0f ms\n",
           took);
}

int main(void)
{
    vt_init();
    vt_child srv = vt_spawn("server", server, NULL);
    vt_role = "client";
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    VIP_PROTECTION_HANDLE ptag;
    CHECK_OK(VipCreatePtag(nic, &ptag));

    printf("%d threads x %u messages, %d pollers on one CQ\n", NTHREADS, messages(), NPOLLERS);
    double t0 = vt_now_ms();
    pthread_t th[NTHREADS];
    worker_arg wa[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
        wa[t] = (worker_arg){t, nic, ptag, NULL};
        CHECK(pthread_create(&th[t], NULL, worker, &wa[t]) == 0);
    }
    for (int t = 0; t < NTHREADS; t++)
        pthread_join(th[t], NULL);
    printf("  %.0f ms\n", vt_now_ms() - t0);

    vt_sync(srv.fd, 1);
    for (int t = 0; t < NTHREADS; t++) {
        CHECK_OK(VipDisconnect(wa[t].vi));
        CHECK_OK(VipDestroyVi(wa[t].vi));
    }
    CHECK_OK(VipDestroyPtag(nic, ptag));
    CHECK_OK(VipCloseNic(nic));
    vt_join(&srv);
    close_ends_waits();
    destroy_ends_waits();
    printf("threads: ok\n");
    return 0;
}
