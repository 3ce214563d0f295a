/*
 * lastword.c - a VI whose DISCONNECT was lost connects again at once: its
 * old peer still learns at once how their connection ended (docs/wire.md,
 * "Ending a connection").
 *
 *   lastword server PEER    VI A
 *   lastword client PEER    VIs B and C
 *
 * PEER is the other host's name.  A accepts B (reliable delivery), B sends
 * a message that A takes, and A disconnects.  A rule on the client's host
 * (tests/cluster/run.sh, case last-word) drops that DISCONNECT, so B is
 * still connected.  A then accepts C at once: the same VI id on the wire,
 * with a new key.  B posts a send: A's port answers B's packets, which
 * carry the old key, with the DISCONNECT again, so B's send completes
 * flushed and B is in the error state within LEARN_MS, long before its own
 * retransmissions would give up (1.5 s and more).  C's message to A then
 * arrives whole.  The two keep in step over a TCP control channel (port
 * 7303).
 */
#include "cl.h"

#define CTL_PORT 7303
#define LEN      1000
#define LEARN_MS 500.0
#define LEVEL    VIP_SERVICE_RELIABLE_DELIVERY

static vt_mem buf, descs;

static VIP_DESCRIPTOR *desc(int i) { return (VIP_DESCRIPTOR *)(void *)(descs.base + 256 * i); }

static VIP_UINT8 *data(int i) { return buf.base + LEN * i; }

static VIP_VI_HANDLE new_vi(VIP_NIC_HANDLE nic, VIP_PROTECTION_HANDLE ptag)
{
    VIP_VI_ATTRIBUTES a = vt_vi_attrs(LEVEL, ptag, LEN, VIP_FALSE, VIP_FALSE);
    VIP_VI_HANDLE vi = NULL;
    CHECK_OK(VipCreateVi(nic, &a, NULL, NULL, &vi));
    return vi;
}

/* Posts the receive of slot i on vi. */
static void post_recv(VIP_VI_HANDLE vi, int i)
{
    vt_desc_recv(desc(i), data(i), buf.mh, LEN, 1);
    CHECK_OK(VipPostRecv(vi, desc(i), descs.mh));
}

/* Sends LEN bytes of seed's pattern from slot i; returns when posted. */
static void post_send(VIP_VI_HANDLE vi, int i, uint32_t seed)
{
    vt_fill(data(i), LEN, seed);
    vt_desc_send(desc(i), 0, 0, data(i), buf.mh, LEN, 1);
    CHECK_OK(VipPostSend(vi, desc(i), descs.mh));
}

/* The receive of slot i on vi completes with seed's pattern. */
static void take(VIP_VI_HANDLE vi, int i, uint32_t seed)
{
    VIP_DESCRIPTOR *got = NULL;
    CHECK_OK(VipRecvWait(vi, 20000, &got));
    CHECK_PTR(desc(i), got);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, got);
    CHECK_EQ(LEN, got->CS.Length);
    CHECK_PATTERN(data(i), LEN, seed);
}

/* The send of slot i on vi completes without error. */
static void sent(VIP_VI_HANDLE vi, int i)
{
    VIP_DESCRIPTOR *got = NULL;
    CHECK_OK(VipSendWait(vi, 20000, &got));
    CHECK_PTR(desc(i), got);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
}

int main(int argc, char **argv)
{
    vt_init();
    if (argc != 3 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
        fprintf(stderr, "usage: lastword server|client PEER\n");
        return 2;
    }
    int server = strcmp(argv[1], "server") == 0;
    const char *peer = argv[2];
    vt_role = server ? "lastword server" : "lastword client";
    vt_errlog log;
    VIP_NIC_HANDLE nic = cl_open_nic(&log);
    VIP_PROTECTION_HANDLE ptag;
    CHECK_OK(VipCreatePtag(nic, &ptag));
    vt_mem_reg(&buf, nic, ptag, 4 * LEN, VIP_FALSE, VIP_FALSE);
    vt_mem_reg(&descs, nic, ptag, 4096, VIP_FALSE, VIP_FALSE);
    int fd = server ? cl_ctl_accept(CTL_PORT) : cl_ctl_connect(cl_ip_of(nic, peer), CTL_PORT);

    if (server) {
        VIP_VI_HANDLE a = new_vi(nic, ptag);
        post_recv(a, 0);
        cl_accept(nic, a, "lw.b", LEVEL);
        take(a, 0, 0x1A57B);
        vt_sync(fd, 1);
        /* Its DISCONNECT is dropped on the way to B. */
        CHECK_OK(VipDisconnect(a));
        CHECK_STATE(VIP_STATE_IDLE, a);
        post_recv(a, 1);
        cl_accept(nic, a, "lw.c", LEVEL);
        take(a, 1, 0x1A57C);
        vt_sync(fd, 2);
        CHECK_OK(VipDisconnect(a));
        CHECK_OK(VipDestroyVi(a));
        printf("PASS [%s]\n", vt_role);
        return 0;
    }

    VIP_VI_HANDLE b = new_vi(nic, ptag), c = new_vi(nic, ptag);
    cl_request(nic, b, peer, "lw.b", LEVEL);
    post_send(b, 0, 0x1A57B);
    sent(b, 0);
    vt_sync(fd, 1);
    cl_request(nic, c, peer, "lw.c", LEVEL);
    /* B heard nothing: its keepalive, a second away, has not gone yet. */
    if (vt_vi_state(b) != VIP_STATE_CONNECTED)
        VT_FAIL("B left the connected state before A connected again: the case did not run");
    post_send(b, 1, 0x1A57D);
    double t0 = vt_now_ms();
    VIP_DESCRIPTOR *got = NULL;
    CHECK_OK(VipSendWait(b, 10000, &got));
    double took = vt_now_ms() - t0;
    CHECK_PTR(desc(1), got);
    if (!(got->CS.Status & VIP_STATUS_DESC_FLUSHED_ERROR)) {
        char sb[160];
        VT_FAIL("B's send after the lost DISCONNECT: %s, expected flushed",
                vt_status_str(got->CS.Status, sb, sizeof sb));
    }
    CHECK_STATE(VIP_STATE_ERROR, b);
    if (took > LEARN_MS)
        VT_FAIL("B learned of the disconnect after %.0f ms, not from A's last word (within %.0f ms)",
                took, LEARN_MS);
    post_send(c, 2, 0x1A57C);
    sent(c, 2);
    vt_sync(fd, 2);
    CHECK_OK(VipDisconnect(b));
    CHECK_OK(VipDisconnect(c));
    CHECK_OK(VipDestroyVi(b));
    CHECK_OK(VipDestroyVi(c));
    printf("PASS [%s] B learned in %.1f ms\n", vt_role, took);
    return 0;
}
