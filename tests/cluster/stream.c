/*
 * stream.c - a long transfer of large messages between two hosts, that
 * either ends in order or is cut by a fault.
 *
 *   stream server PEER [options]     waits for the connection
 *   stream client PEER [options]     requests it
 *
 *   --seconds S       the client ends the transfer after S seconds (default 5)
 *   --expect-fault    run until the connection breaks, then check how it broke
 *   --level L         rd (reliable delivery, default) or rr (reliable reception)
 *   --size BYTES      largest message (default 1 MiB)
 *   --batch B         messages per turn (default 8)
 *   --rdma            each message an RDMA write with immediate data into the
 *                     receive slot where it would have landed as a send
 *
 * Both sides keep B receives posted.  The two take turns: the client sends B
 * messages, the server receives and re-posts them, then sends B messages
 * back, and so on, so a message never finds its receive missing.  Every
 * message carries its number in the immediate data; the receiver checks that
 * numbers come in order without gaps or repeats, and checks Length and every
 * byte.  Each process prints "pid N" first and "streaming" once data flows
 * both ways.
 *
 * With --rdma the two first exchange the address and memory handle of their
 * receive slots (a message each, into a receive posted before the others),
 * and each message is written into the slot of the receive its immediate
 * data then completes (VIP_STATUS_OP_REMOTE_RDMA_WRITE), checked there as a
 * message.
 *
 * The client's last batch is marked (the top bit of the immediate data); the
 * server answers with its last batch and disconnects once those sends have
 * completed; the client then sees its VI in the error state with
 * VIP_ERROR_CONN_LOST and disconnects too.
 *
 * With --expect-fault the transfer runs until the peer dies or the network
 * fails.  The process must then see, within FAULT_BOUND_MS of the last
 * completed descriptor: its VI in VIP_STATE_ERROR, VIP_ERROR_CONN_LOST
 * through VipErrorCallback, every posted descriptor completing in order with
 * DESC_FLUSHED_ERROR (TRANSPORT_ERROR only for ones before the first flushed
 * one, i.e. in flight), no success after a failure, and no message out of
 * order or twice before that.
 */
#include "cl.h"

#define FIN 0x80000000u
#define FAULT_BOUND_MS 15000.0  /* idle timeout (10 s) and then some */
#define WAIT_MS 30000UL         /* a completion or an error must come by then */
#define FAULT_DEADLINE_S 90     /* --expect-fault: the fault must come by then */
#define PATSPAN 65536           /* message data starts within this much pattern */

typedef struct {
    int errors;  /* error completions so far */
    int flushed; /* of which DESC_FLUSHED_ERROR */
} qstate;

typedef struct {
    int server;
    const char *peer;
    VIP_RELIABILITY_LEVEL level;
    size_t size, batch;
    int rdma; /* messages as RDMA writes into the peer's slots */
    VIP_UINT64 peer_slots; /* --rdma: the peer's receive slots */
    VIP_MEM_HANDLE peer_mh;
    vt_mem xchg; /* --rdma: the slot exchange's send and receive buffers */
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag;
    VIP_VI_HANDLE vi;
    vt_errlog errs;
    vt_mem rbuf; /* batch receive slots of size bytes */
    vt_mem pat;  /* the send pattern: size + PATSPAN bytes */
    vt_dpool pool; /* receives 0..batch-1, sends batch..2*batch-1, the exchange's receive */
    uint32_t rnext, snext; /* next message number to receive / to send */
    size_t rhead, rposted; /* next receive to complete; receives posted */
    size_t shead, sposted;
    qstate rq, sq;
    int peer_fin;
    int fault; /* an error completion was seen */
    double last_progress;
    unsigned long long bytes_in;
} st_t;

static uint32_t seed_from(int server) { return server ? 0x5E4E0000u : 0xC11E0000u; }

static size_t msg_len(const st_t *s, uint32_t n) { return s->size - (n % 5) * 1373u; }

static size_t msg_off(uint32_t n) { return ((size_t)n * 4099u) % PATSPAN; }

static VIP_DESCRIPTOR *rdesc(st_t *s, size_t i) { return vt_dpool_get(&s->pool, i); }

static VIP_DESCRIPTOR *sdesc(st_t *s, size_t i) { return vt_dpool_get(&s->pool, s->batch + i); }

static void post_recv(st_t *s, size_t i)
{
    vt_desc_recv(rdesc(s, i), s->rbuf.base + i * s->size, s->rbuf.mh, s->size, 2);
    CHECK_OK(VipPostRecv(s->vi, rdesc(s, i), s->pool.mem.mh));
    s->rposted++;
}

/* An error completion on a queue: only DESC_FLUSHED_ERROR, or
 * TRANSPORT_ERROR before any flushed one; only when a fault is expected. */
static void error_completion(st_t *s, qstate *q, VIP_DESCRIPTOR *d, const char *what, uint32_t no)
{
    char b[160];
    VIP_UINT32 e = d->CS.Status & VT_ERRBITS;
    s->fault = 1;
    if (e == (VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR)) {
        q->flushed++;
    } else if (e == (VIP_STATUS_DONE | VIP_STATUS_TRANSPORT_ERROR)) {
        if (q->flushed)
            VT_FAIL("%s of message %u: TRANSPORT_ERROR after a flushed %s", what, no, what);
    } else {
        VT_FAIL("%s of message %u completed with %s; expected DESC_FLUSHED_ERROR or TRANSPORT_ERROR",
                what, no, cl_status(d, b, sizeof b));
    }
    q->errors++;
}

/* The next receive: 1 with a message (checked and re-posted), 0 with an
 * error completion.  Without an expected fault, an error fails. */
static int take_recv(st_t *s, int expect_fault, unsigned long ms)
{
    char b[160];
    VIP_DESCRIPTOR *d = NULL;
    VIP_RETURN r = VipRecvWait(s->vi, ms, &d);
    if (r != VIP_SUCCESS)
        VT_FAIL("VipRecvWait for message %u from the peer: expected VIP_SUCCESS within %lu ms, got %s "
                "(VI state %s)", s->rnext, ms, vt_ret_name(r), vt_state_name(vt_vi_state(s->vi)));
    CHECK_PTR(rdesc(s, s->rhead), d);
    size_t slot = s->rhead;
    s->rhead = (s->rhead + 1) % s->batch;
    s->rposted--;
    if ((d->CS.Status & VT_ERRBITS) != VIP_STATUS_DONE) {
        if (!expect_fault)
            VT_FAIL("receive of message %u: %s", s->rnext, cl_status(d, b, sizeof b));
        error_completion(s, &s->rq, d, "receive", s->rnext);
        return 0;
    }
    if (s->rq.errors)
        VT_FAIL("receive of message %u succeeded after an earlier receive failed", s->rnext);
    CHECK_STATUS(VIP_STATUS_DONE | (s->rdma ? VIP_STATUS_OP_REMOTE_RDMA_WRITE : VIP_STATUS_OP_RECEIVE) |
                     VIP_STATUS_IMMEDIATE,
                 d);
    uint32_t no = d->CS.ImmediateData & ~FIN;
    if (no != s->rnext)
        VT_FAIL("message %u arrived where message %u was due (out of order, lost or repeated)", no,
                s->rnext);
    size_t len = msg_len(s, no);
    if (d->CS.Length != len)
        VT_FAIL("message %u: Length %u, expected %zu", no, (unsigned)d->CS.Length, len);
    CHECK_PATTERN_AT(s->rbuf.base + slot * s->size, len, seed_from(!s->server), msg_off(no));
    s->peer_fin = (d->CS.ImmediateData & FIN) != 0;
    s->rnext++;
    s->bytes_in += len;
    s->last_progress = vt_now_ms();
    if (!s->fault)
        post_recv(s, slot);
    return 1;
}

/* The next send completion: 1 done, 0 an error completion. */
static int take_send(st_t *s, int expect_fault, unsigned long ms)
{
    char b[160];
    VIP_DESCRIPTOR *d = NULL;
    uint32_t no = s->snext - (uint32_t)s->sposted;
    VIP_RETURN r = VipSendWait(s->vi, ms, &d);
    if (r != VIP_SUCCESS)
        VT_FAIL("VipSendWait for message %u: expected VIP_SUCCESS within %lu ms, got %s (VI state %s)", no,
                ms, vt_ret_name(r), vt_state_name(vt_vi_state(s->vi)));
    CHECK_PTR(sdesc(s, s->shead), d);
    s->shead = (s->shead + 1) % s->batch;
    s->sposted--;
    if ((d->CS.Status & VT_ERRBITS) != VIP_STATUS_DONE) {
        if (!expect_fault)
            VT_FAIL("send of message %u: %s", no, cl_status(d, b, sizeof b));
        error_completion(s, &s->sq, d, "send", no);
        return 0;
    }
    if (s->sq.errors)
        VT_FAIL("send of message %u succeeded after an earlier send failed", no);
    CHECK_STATUS(VIP_STATUS_DONE | (s->rdma ? VIP_STATUS_OP_RDMA_WRITE : VIP_STATUS_OP_SEND), d);
    CHECK_EQ(msg_len(s, no), d->CS.Length);
    s->last_progress = vt_now_ms();
    return 1;
}

static int send_turn(st_t *s, int expect_fault, int fin)
{
    for (size_t i = 0; i < s->batch; i++) {
        uint32_t no = s->snext++;
        VIP_UINT32 imm = no | (fin && i + 1 == s->batch ? FIN : 0);
        size_t slot = (s->shead + s->sposted) % s->batch;
        if (s->rdma) {
            /* Message n completes the peer's receive n mod batch. */
            VIP_UINT64 at = s->peer_slots + (no % s->batch) * s->size;
            vt_desc_rdma(sdesc(s, slot), VIP_CONTROL_OP_RDMAWRITE | VIP_CONTROL_IMMEDIATE, imm, at,
                         s->peer_mh, s->pat.base + msg_off(no), s->pat.mh, msg_len(s, no), 1);
        } else {
            vt_desc_send(sdesc(s, slot), VIP_CONTROL_OP_SENDRECV | VIP_CONTROL_IMMEDIATE, imm,
                         s->pat.base + msg_off(no), s->pat.mh, msg_len(s, no), 2);
        }
        CHECK_OK(VipPostSend(s->vi, sdesc(s, slot), s->pool.mem.mh));
        s->sposted++;
    }
    while (s->sposted > 0)
        if (!take_send(s, expect_fault, WAIT_MS))
            return 0;
    return 1;
}

static int recv_turn(st_t *s, int expect_fault)
{
    for (size_t i = 0; i < s->batch; i++)
        if (!take_recv(s, expect_fault, WAIT_MS))
            return 0;
    return 1;
}

/* --rdma: the exchange's receive, posted before the batch's receives, so
 * that no message of the transfer can find it missing. */
static VIP_DESCRIPTOR *xdesc(st_t *s) { return vt_dpool_get(&s->pool, 2 * s->batch); }

static void post_exchange_recv(st_t *s)
{
    vt_mem_reg(&s->xchg, s->nic, s->ptag, 4096, VIP_FALSE, VIP_FALSE);
    vt_desc_recv(xdesc(s), s->xchg.base + 2048, s->xchg.mh, 2048, 1);
    CHECK_OK(VipPostRecv(s->vi, xdesc(s), s->pool.mem.mh));
}

/* --rdma: each side tells the other where its receive slots are. */
static void exchange_slots(st_t *s)
{
    VIP_DESCRIPTOR *d;
    VIP_UINT64 mine[2] = {(VIP_UINT64)(uintptr_t)s->rbuf.base, (VIP_UINT64)s->rbuf.mh};
    memcpy(s->xchg.base, mine, sizeof mine);
    vt_desc_send(sdesc(s, 0), VIP_CONTROL_OP_SENDRECV, 0, s->xchg.base, s->xchg.mh, sizeof mine, 1);
    CHECK_OK(VipPostSend(s->vi, sdesc(s, 0), s->pool.mem.mh));
    d = vt_send_wait(s->vi);
    CHECK_PTR(sdesc(s, 0), d);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, d);
    d = vt_recv_wait(s->vi);
    CHECK_PTR(xdesc(s), d);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, d);
    CHECK_EQ(sizeof mine, d->CS.Length);
    VIP_UINT64 theirs[2];
    memcpy(theirs, s->xchg.base + 2048, sizeof theirs);
    s->peer_slots = theirs[0];
    s->peer_mh = (VIP_MEM_HANDLE)theirs[1];
    vt_mem_dereg(&s->xchg);
}

/* The connection broke: check how. */
static void survive(st_t *s)
{
    VIP_DESCRIPTOR *d;
    double seen = vt_now_ms();
    CHECK_STATE_SOON(VIP_STATE_ERROR, s->vi);
    double state = vt_now_ms();
    CHECK_ERROR_REPORTED(&s->errs, VIP_ERROR_CONN_LOST, s->vi);
    /* Whatever is still posted completes now, in order. */
    size_t sends = s->sposted, recvs = s->rposted;
    while (s->sposted > 0)
        take_send(s, 1, 5000);
    while (s->rposted > 0)
        take_recv(s, 1, 5000);
    CHECK_RET(VIP_NOT_DONE, VipSendDone(s->vi, &d));
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(s->vi, &d));
    /* In the error state a post succeeds and the descriptor is flushed. */
    vt_desc_recv(rdesc(s, 0), s->rbuf.base, s->rbuf.mh, s->size, 1);
    CHECK_OK(VipPostRecv(s->vi, rdesc(s, 0), s->pool.mem.mh));
    d = vt_recv_wait(s->vi);
    CHECK_PTR(rdesc(s, 0), d);
    CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, d);
    double lag = state - s->last_progress;
    printf("fault: first error completion %.0f ms after the last completed descriptor, VIP_STATE_ERROR "
           "after %.0f ms, VIP_ERROR_CONN_LOST reported\n", seen - s->last_progress, lag);
    printf("fault: %zu sends and %zu receives were still posted; receives %d failed (%d flushed), "
           "sends %d failed (%d flushed)\n", sends, recvs, s->rq.errors, s->rq.flushed, s->sq.errors,
           s->sq.flushed);
    if (lag > FAULT_BOUND_MS)
        VT_FAIL("the VI reached VIP_STATE_ERROR %.0f ms after the last completion; the bound is %.0f ms",
                lag, FAULT_BOUND_MS);
    CHECK_OK(VipDisconnect(s->vi));
    CHECK_STATE(VIP_STATE_IDLE, s->vi);
}

static void usage(void)
{
    fprintf(stderr, "usage: stream server|client PEER [--seconds S] [--expect-fault] [--level rd|rr] "
                    "[--size BYTES] [--batch B] [--rdma]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    st_t s;
    int expect_fault = 0;
    double seconds = 5;

    vt_init();
    if (argc < 3 || (strcmp(argv[1], "server") != 0 && strcmp(argv[1], "client") != 0))
        usage();
    memset(&s, 0, sizeof s);
    s.server = strcmp(argv[1], "server") == 0;
    s.peer = argv[2];
    s.level = VIP_SERVICE_RELIABLE_DELIVERY;
    s.size = 1u << 20;
    s.batch = 8;
    vt_role = argv[1];
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--expect-fault") == 0) {
            expect_fault = 1;
        } else if (strcmp(a, "--rdma") == 0) {
            s.rdma = 1;
        } else if (v == NULL) {
            usage();
        } else if (strcmp(a, "--seconds") == 0) {
            seconds = atof(v), i++;
        } else if (strcmp(a, "--size") == 0) {
            s.size = strtoul(v, NULL, 0), i++;
        } else if (strcmp(a, "--batch") == 0) {
            s.batch = strtoul(v, NULL, 0), i++;
        } else if (strcmp(a, "--level") == 0) {
            if (strcmp(v, "rd") == 0)
                s.level = VIP_SERVICE_RELIABLE_DELIVERY;
            else if (strcmp(v, "rr") == 0)
                s.level = VIP_SERVICE_RELIABLE_RECEPTION;
            else
                usage();
            i++;
        } else {
            usage();
        }
    }
    if (s.size < 5 * 1373 || s.size > VT_MAX_TRANSFER || s.batch < 1 || s.batch > 256)
        usage();
    printf("pid %d\n", (int)getpid());

    s.nic = cl_open_nic(&s.errs);
    CHECK_OK(VipCreatePtag(s.nic, &s.ptag));
    vt_mem_reg(&s.rbuf, s.nic, s.ptag, s.batch * s.size, s.rdma ? VIP_TRUE : VIP_FALSE, VIP_FALSE);
    vt_mem_reg(&s.pat, s.nic, s.ptag, s.size + PATSPAN, VIP_FALSE, VIP_FALSE);
    vt_fill(s.pat.base, s.size + PATSPAN, seed_from(s.server));
    vt_dpool_init(&s.pool, s.nic, s.ptag, 2 * s.batch + 1, 2);
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(s.level, s.ptag, s.size, s.rdma ? VIP_TRUE : VIP_FALSE, VIP_FALSE);
    CHECK_OK(VipCreateVi(s.nic, &va, NULL, NULL, &s.vi));
    if (s.rdma)
        post_exchange_recv(&s);
    for (size_t i = 0; i < s.batch; i++)
        post_recv(&s, i);
    if (s.server)
        cl_accept(s.nic, s.vi, "stream", s.level);
    else
        cl_request(s.nic, s.vi, s.peer, "stream", s.level);
    CHECK_STATE(VIP_STATE_CONNECTED, s.vi);
    if (s.rdma)
        exchange_slots(&s);

    double t0 = vt_now_ms();
    s.last_progress = t0;
    int my_turn = !s.server, ok = 1;
    unsigned turns = 0;
    for (;;) {
        if (my_turn) {
            int fin = !expect_fault && (s.server ? s.peer_fin : vt_now_ms() - t0 >= seconds * 1000.0);
            ok = send_turn(&s, expect_fault, fin);
            if (!ok || (s.server && fin))
                break;
        } else {
            ok = recv_turn(&s, expect_fault);
            if (!ok || (!s.server && s.peer_fin))
                break;
        }
        my_turn = !my_turn;
        if (++turns == 4)
            printf("streaming\n");
        if (expect_fault && vt_now_ms() - t0 > FAULT_DEADLINE_S * 1000.0)
            VT_FAIL("no fault within %d s (%u messages each way)", FAULT_DEADLINE_S, s.rnext);
    }
    double secs = (vt_now_ms() - t0) / 1000.0;
    printf("%u messages sent, %u received in order (%.1f MB in %.1f s)\n", s.snext - (uint32_t)s.sposted,
           s.rnext, (double)s.bytes_in / 1e6, secs);

    VIP_DESCRIPTOR *d;
    if (!ok) {
        survive(&s);
    } else if (s.server) {
        /* The server sent the last message: it disconnects first. */
        CHECK_OK(VipDisconnect(s.vi));
        CHECK_STATE(VIP_STATE_IDLE, s.vi);
        for (size_t i = 0; i < s.batch; i++) {
            CHECK_OK(VipRecvDone(s.vi, &d));
            CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, d);
        }
    } else {
        CHECK_STATE_SOON(VIP_STATE_ERROR, s.vi);
        CHECK_ERROR_REPORTED(&s.errs, VIP_ERROR_CONN_LOST, s.vi);
        CHECK_OK(VipDisconnect(s.vi));
        CHECK_STATE(VIP_STATE_IDLE, s.vi);
        for (size_t i = 0; i < s.batch; i++) {
            CHECK_OK(VipRecvDone(s.vi, &d));
            CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, d);
        }
    }
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(s.vi, &d));
    CHECK_OK(VipDestroyVi(s.vi));
    vt_dpool_fini(&s.pool);
    vt_mem_dereg(&s.rbuf);
    vt_mem_dereg(&s.pat);
    CHECK_OK(VipDestroyPtag(s.nic, s.ptag));
    CHECK_OK(VipCloseNic(s.nic));
    printf("stream %s: ok\n", argv[1]);
    return 0;
}
