/*
 * alltoall.c - N hosts, each connected to every other by a reliable VI.
 *
 *   alltoall I N [K]      run as host I of h1..hN (one process per host)
 *
 * Host I connects one reliable-delivery VI to each other host with the
 * peer-to-peer model (host I's discriminator for host J is "a2a.I.J", the
 * other side's "a2a.J.I"), then every pair exchanges K messages (default
 * 100) of 0 to 65536 bytes both ways.  All VIs of a process share one
 * completion queue for both their send and receive queues; every receive
 * is checked for order, Length, immediate data and every byte.
 *
 * Ending: of each pair, the lower host sends one more, empty "fin" message
 * once its K sends have completed and its K receives have arrived, and
 * disconnects when the fin has completed.  The higher host waits for the
 * fin and its own sends, then for its VI to enter the error state (the
 * peer's disconnect, VIP_ERROR_CONN_LOST), and disconnects.  So no message
 * is lost to the disconnect.
 */
#include "cl.h"

#define MAXH 32
#define MAXLEN 65536
#define FIN_IMM 0xF1F1F1F1u

typedef struct {
    int here;                     /* this peer is a host other than me */
    VIP_VI_HANDLE vi;
    size_t recvd, sent_done;      /* K messages each */
    int fin_sent, fin_done, fin_recvd, closed;
    int fin_flushed;              /* the lower host's unused fin receive */
} peer_t;

static int me, nhosts;
static size_t K = 100;

static size_t msg_len(int from, int to, size_t k)
{
    return ((size_t)k * 7919u + (size_t)from * 131u + (size_t)to * 17u) % (MAXLEN + 1);
}

static size_t msg_off(int to, size_t k) { return ((size_t)to * 1031u + k * 97u) % MAXLEN; }

static uint32_t host_seed(int h) { return 0xA2A00000u + (uint32_t)h; }

int main(int argc, char **argv)
{
    peer_t peers[MAXH + 1];
    vt_errlog errs;
    char role[16];

    vt_init();
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: alltoall I N [K]\n");
        return 2;
    }
    me = atoi(argv[1]);
    nhosts = atoi(argv[2]);
    if (argc == 4)
        K = strtoul(argv[3], NULL, 0);
    if (nhosts < 2 || nhosts > MAXH || me < 1 || me > nhosts || K < 1 || K > 1000) {
        fprintf(stderr, "alltoall: need 2 <= N <= %d, 1 <= I <= N, 1 <= K <= 1000\n", MAXH);
        return 2;
    }
    snprintf(role, sizeof role, "h%d", me);
    vt_role = role;

    VIP_NIC_HANDLE nic = cl_open_nic(&errs);
    VIP_PROTECTION_HANDLE ptag;
    VIP_CQ_HANDLE cq;
    CHECK_OK(VipCreatePtag(nic, &ptag));
    size_t npeers = (size_t)nhosts - 1;
    CHECK_OK(VipCreateCQ(nic, npeers * (2 * K + 4), &cq));

    /* Sources: one pattern per sender, read at an offset per message.
     * Receives: K + 1 slots per peer (the last for the fin). */
    vt_mem src, rbuf;
    vt_dpool pool;
    vt_mem_reg(&src, nic, ptag, 2 * MAXLEN, VIP_FALSE, VIP_FALSE);
    vt_fill(src.base, 2 * MAXLEN, host_seed(me));
    vt_mem_reg(&rbuf, nic, ptag, (size_t)nhosts * (K + 1) * MAXLEN, VIP_FALSE, VIP_FALSE);
    vt_dpool_init(&pool, nic, ptag, (size_t)(nhosts + 1) * (2 * K + 2), 1);
#define RDESC(j, k) vt_dpool_get(&pool, ((size_t)(j) * (2 * K + 2)) + (k))
#define SDESC(j, k) vt_dpool_get(&pool, ((size_t)(j) * (2 * K + 2)) + K + 1 + (k))
#define RSLOT(j, k) (rbuf.base + ((size_t)((j) - 1) * (K + 1) + (k)) * MAXLEN)

    VIP_VI_ATTRIBUTES va = vt_vi_attrs(VIP_SERVICE_RELIABLE_DELIVERY, ptag, MAXLEN, VIP_FALSE, VIP_FALSE);
    memset(peers, 0, sizeof peers);
    for (int j = 1; j <= nhosts; j++) {
        if (j == me)
            continue;
        peer_t *p = &peers[j];
        p->here = 1;
        CHECK_OK(VipCreateVi(nic, &va, cq, cq, &p->vi));
        for (size_t k = 0; k <= K; k++) {
            vt_desc_recv(RDESC(j, k), RSLOT(j, k), rbuf.mh, MAXLEN, 1);
            CHECK_OK(VipPostRecv(p->vi, RDESC(j, k), pool.mem.mh));
        }
    }

    /* Connect to everybody: all requests first, then wait for each. */
    double t0 = vt_now_ms();
    for (int j = 1; j <= nhosts; j++) {
        char host[16], mine[32], theirs[32];
        if (j == me)
            continue;
        snprintf(host, sizeof host, "h%d", j);
        snprintf(mine, sizeof mine, "a2a.%d.%d", me, j);
        snprintf(theirs, sizeof theirs, "a2a.%d.%d", j, me);
        cl_peer_request(nic, peers[j].vi, host, mine, theirs);
    }
    for (int j = 1; j <= nhosts; j++)
        if (j != me)
            cl_peer_wait(peers[j].vi, VIP_SERVICE_RELIABLE_DELIVERY);
    double t1 = vt_now_ms();
    printf("h%d: connected to %zu hosts in %.0f ms\n", me, npeers, t1 - t0);

    /* K messages to everybody, interleaved. */
    for (size_t k = 0; k < K; k++)
        for (int j = 1; j <= nhosts; j++) {
            if (j == me)
                continue;
            size_t len = msg_len(me, j, k);
            vt_desc_send(SDESC(j, k), VIP_CONTROL_OP_SENDRECV | VIP_CONTROL_IMMEDIATE,
                         (VIP_UINT32)((me << 24) | (j << 16) | (int)k), src.base + msg_off(j, k), src.mh,
                         len, 1);
            CHECK_OK(VipPostSend(peers[j].vi, SDESC(j, k), pool.mem.mh));
        }

    size_t finished = 0;
    unsigned long long bytes = 0;
    while (finished < npeers) {
        VIP_VI_HANDLE who = NULL;
        VIP_BOOLEAN rq = VIP_FALSE;
        VIP_DESCRIPTOR *d = NULL;
        VIP_RETURN r = VipCQWait(cq, VT_WAIT_MS, &who, &rq);
        if (r != VIP_SUCCESS)
            VT_FAIL("VipCQWait with %zu of %zu peers finished: expected VIP_SUCCESS, got %s", finished, npeers,
                    vt_ret_name(r));
        int j = 1;
        while (j <= nhosts && !(peers[j].here && peers[j].vi == who))
            j++;
        if (j > nhosts)
            VT_FAIL("VipCQWait returned VI %p, not one of this process's", who);
        peer_t *p = &peers[j];
        if (rq) {
            CHECK_OK(VipRecvDone(p->vi, &d));
            if (p->closed) {
                /* Flushed by this side's disconnect. */
                CHECK(me < j && !p->fin_flushed);
                CHECK_PTR(RDESC(j, K), d);
                CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, d);
                p->fin_flushed = 1;
                continue;
            }
            if (p->recvd < K) {
                size_t k = p->recvd, len = msg_len(j, me, k);
                CHECK_PTR(RDESC(j, k), d);
                CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, d);
                VIP_UINT32 want = (VIP_UINT32)((j << 24) | (me << 16) | (int)k);
                if (d->CS.ImmediateData != want)
                    VT_FAIL("from h%d: message 0x%08x arrived where 0x%08x was due", j,
                            (unsigned)d->CS.ImmediateData, (unsigned)want);
                if (d->CS.Length != len)
                    VT_FAIL("from h%d, message %zu: Length %u, expected %zu", j, k, (unsigned)d->CS.Length, len);
                CHECK_PATTERN_AT(RSLOT(j, k), len, host_seed(j), msg_off(me, k));
                p->recvd++;
                bytes += len;
            } else {
                CHECK(j < me && !p->fin_recvd);
                CHECK_PTR(RDESC(j, K), d);
                CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, d);
                CHECK_EQ(FIN_IMM, d->CS.ImmediateData);
                CHECK_EQ(0, d->CS.Length);
                p->fin_recvd = 1;
            }
        } else {
            CHECK_OK(VipSendDone(p->vi, &d));
            if (p->sent_done < K) {
                size_t k = p->sent_done;
                CHECK_PTR(SDESC(j, k), d);
                CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, d);
                CHECK_EQ(msg_len(me, j, k), d->CS.Length);
                p->sent_done++;
            } else {
                CHECK(me < j && p->fin_sent && !p->fin_done);
                CHECK_PTR(SDESC(j, K), d);
                CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, d);
                p->fin_done = 1;
            }
        }
        /* The lower host of a pair: fin, then disconnect. */
        if (me < j && !p->fin_sent && p->recvd == K && p->sent_done == K) {
            vt_desc_send(SDESC(j, K), VIP_CONTROL_OP_SENDRECV | VIP_CONTROL_IMMEDIATE, FIN_IMM, src.base,
                         src.mh, 0, 1);
            CHECK_OK(VipPostSend(p->vi, SDESC(j, K), pool.mem.mh));
            p->fin_sent = 1;
        }
        if (me < j && p->fin_done && !p->closed) {
            CHECK_OK(VipDisconnect(p->vi));
            CHECK_STATE(VIP_STATE_IDLE, p->vi);
            p->closed = 1;
            finished++;
        }
        /* The higher host: everything received and sent; the peer leaves. */
        if (me > j && p->fin_recvd && p->recvd == K && p->sent_done == K && !p->closed) {
            CHECK_STATE_SOON(VIP_STATE_ERROR, p->vi);
            CHECK_ERROR_REPORTED(&errs, VIP_ERROR_CONN_LOST, p->vi);
            CHECK_OK(VipDisconnect(p->vi));
            CHECK_STATE(VIP_STATE_IDLE, p->vi);
            p->closed = 1;
            finished++;
        }
    }
    double t2 = vt_now_ms();

    /* The lower host's unused fin receives were flushed by the disconnect. */
    for (int j = 1; j <= nhosts; j++) {
        VIP_DESCRIPTOR *d;
        if (!peers[j].here)
            continue;
        if (me < j && !peers[j].fin_flushed) {
            CHECK_OK(VipRecvDone(peers[j].vi, &d));
            CHECK_PTR(RDESC(j, K), d);
            CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, d);
        }
        CHECK_RET(VIP_NOT_DONE, VipRecvDone(peers[j].vi, &d));
        CHECK_RET(VIP_NOT_DONE, VipSendDone(peers[j].vi, &d));
        CHECK_OK(VipDestroyVi(peers[j].vi));
    }
    CHECK_OK(VipDestroyCQ(cq));
    vt_dpool_fini(&pool);
    vt_mem_dereg(&src);
    vt_mem_dereg(&rbuf);
    CHECK_OK(VipDestroyPtag(nic, ptag));
    CHECK_OK(VipCloseNic(nic));
    printf("h%d: %zu messages from each of %zu hosts verified (%.1f MB) in %.0f ms: ok\n", me, K, npeers,
           (double)bytes / 1e6, t2 - t1);
    return 0;
}
