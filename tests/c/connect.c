/*
 * connect.c - connection management: client-server accept and reject, no
 * server, an unreachable host, attribute mismatch at accept, timeouts of
 * VipConnectWait and VipConnectRequest, the peer-to-peer model, several
 * processes on one device told apart by discriminators, reconnecting a VI,
 * the name service and autodiscovery.
 */
#include "vt.h"

#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>

#define RD VIP_SERVICE_RELIABLE_DELIVERY
#define MTU 65536

typedef struct {
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag;
    vt_mem buf;
    vt_dpool descs;
    vt_errlog errs;
} side_t;

static void side_open(side_t *s)
{
    s->nic = vt_open_nic(VT_DEV);
    vt_errlog_init(&s->errs);
    CHECK_OK(VipErrorCallback(s->nic, &s->errs, vt_errlog_handler));
    CHECK_OK(VipCreatePtag(s->nic, &s->ptag));
    vt_mem_reg(&s->buf, s->nic, s->ptag, 1 << 20, VIP_FALSE, VIP_FALSE);
    vt_dpool_init(&s->descs, s->nic, s->ptag, 16, 2);
}

static void side_close(side_t *s)
{
    vt_dpool_fini(&s->descs);
    vt_mem_dereg(&s->buf);
    CHECK_OK(VipDestroyPtag(s->nic, s->ptag));
    CHECK_OK(VipCloseNic(s->nic));
}

static VIP_VI_HANDLE new_vi(side_t *s, VIP_RELIABILITY_LEVEL level, VIP_ULONG mtu,
                            VIP_BOOLEAN w, VIP_BOOLEAN r)
{
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(level, s->ptag, mtu, w, r);
    VIP_VI_HANDLE vi;
    CHECK_OK(VipCreateVi(s->nic, &va, NULL, NULL, &vi));
    return vi;
}

static VIP_NET_ADDRESS *addr(side_t *s, const char *name)
{
    char disc[VT_MAX_DISC];
    vt_disc(disc, sizeof disc, "%s", name);
    return vt_addr_local(s->nic, disc);
}

/* Descriptor slot i: receive into / send from the i-th 4 KiB of the buffer. */
static void post_recv(side_t *s, VIP_VI_HANDLE vi, size_t i)
{
    VIP_DESCRIPTOR *d = vt_dpool_get(&s->descs, i);
    vt_desc_recv(d, s->buf.base + 4096 * i, s->buf.mh, 4096, 1);
    CHECK_OK(VipPostRecv(vi, d, s->descs.mem.mh));
}

static void send_msg(side_t *s, VIP_VI_HANDLE vi, size_t i, size_t len, uint32_t seed,
                     VIP_UINT32 imm)
{
    VIP_DESCRIPTOR *d = vt_dpool_get(&s->descs, i);
    vt_fill(s->buf.base + 4096 * i, len, seed);
    vt_desc_send(d, VIP_CONTROL_IMMEDIATE, imm, s->buf.base + 4096 * i, s->buf.mh, len, 1);
    CHECK_OK(VipPostSend(vi, d, s->descs.mem.mh));
    VIP_DESCRIPTOR *got = vt_send_wait(vi);
    CHECK_PTR(d, got);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
}

static void expect_msg(side_t *s, VIP_VI_HANDLE vi, size_t i, size_t len, uint32_t seed,
                       VIP_UINT32 imm)
{
    VIP_DESCRIPTOR *got = vt_recv_wait(vi);
    CHECK_PTR(vt_dpool_get(&s->descs, i), got);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, got);
    CHECK_EQ(len, got->CS.Length);
    CHECK_EQ(imm, got->CS.ImmediateData);
    CHECK_PATTERN(s->buf.base + 4096 * i, len, seed);
}

static void check_attrs(const VIP_VI_ATTRIBUTES *a, VIP_RELIABILITY_LEVEL level, VIP_ULONG mtu,
                        VIP_BOOLEAN w, VIP_BOOLEAN r)
{
    CHECK_EQ(level, a->ReliabilityLevel);
    CHECK_EQ(mtu, a->MaxTransferSize);
    CHECK_EQ(w, a->EnableRdmaWrite);
    CHECK_EQ(r, a->EnableRdmaRead);
}

static double elapsed_since(double t0) { return vt_now_ms() - t0; }

/* ------------------------------------------------------------------ */
/* The server child: accept, reject, mismatch, unanswered, peer,         */
/* reconnect, in step with the client.                                   */
/* ------------------------------------------------------------------ */

static void server(int fd, void *arg)
{
    (void)arg;
    side_t s;
    side_open(&s);
    VIP_VI_HANDLE v1 = new_vi(&s, RD, MTU, VIP_TRUE, VIP_FALSE);
    VIP_VI_HANDLE v2 = new_vi(&s, RD, MTU, VIP_TRUE, VIP_FALSE);
    VIP_NET_ADDRESS *remote = vt_addr_buf();
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn;
    char cdisc[VT_MAX_DISC];

    /* Accept. */
    vt_sync(fd, 1);
    post_recv(&s, v1, 0);
    VIP_NET_ADDRESS *local = addr(&s, "accept");
    memset(&ra, 0, sizeof ra);
    CHECK_OK(VipConnectWait(s.nic, local, VT_WAIT_MS, remote, &ra, &conn));
    CHECK_EQ(4, remote->HostAddressLen);
    CHECK(memcmp(remote->HostAddress, vt_loopback, 4) == 0);
    vt_disc(cdisc, sizeof cdisc, "client-1");
    CHECK(vt_addr_disc_is(remote, cdisc));
    check_attrs(&ra, RD, MTU, VIP_FALSE, VIP_TRUE);
    CHECK_STATE(VIP_STATE_IDLE, v1);
    CHECK_OK(VipConnectAccept(conn, v1));
    CHECK_STATE(VIP_STATE_CONNECTED, v1);
    /* The connection handle is used up. */
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectAccept(conn, v2));
    expect_msg(&s, v1, 0, 1000, 11, 0x11);
    /* A second request: a connected VI cannot take it, an idle one can. */
    CHECK_OK(VipConnectWait(s.nic, local, VT_WAIT_MS, remote, &ra, &conn));
    vt_disc(cdisc, sizeof cdisc, "client-2");
    CHECK(vt_addr_disc_is(remote, cdisc));
    CHECK_RET(VIP_INVALID_STATE, VipConnectAccept(conn, v1));
    CHECK_OK(VipConnectAccept(conn, v2));
    CHECK_STATE(VIP_STATE_CONNECTED, v2);
    /* Connected VIs can be neither destroyed nor changed. */
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(RD, s.ptag, MTU, VIP_TRUE, VIP_FALSE);
    CHECK_RET(VIP_INVALID_STATE, VipDestroyVi(v1));
    CHECK_RET(VIP_INVALID_STATE, VipSetViAttributes(v1, &va));
    vt_sync(fd, 2);
    CHECK_OK(VipDisconnect(v1));
    CHECK_OK(VipDisconnect(v2));
    CHECK_STATE(VIP_STATE_IDLE, v1);
    CHECK_STATE(VIP_STATE_IDLE, v2);
    free(local);

    /* Reject. */
    vt_sync(fd, 3);
    local = addr(&s, "reject");
    CHECK_OK(VipConnectWait(s.nic, local, VT_WAIT_MS, remote, &ra, &conn));
    CHECK_OK(VipConnectReject(conn));
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectAccept(conn, v1));
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectReject(conn));
    CHECK_STATE(VIP_STATE_IDLE, v1);
    free(local);

    /* Attribute mismatch, fixed in place. */
    vt_sync(fd, 4);
    VIP_VI_HANDLE v3 = new_vi(&s, VIP_SERVICE_UNRELIABLE, MTU, VIP_FALSE, VIP_FALSE);
    local = addr(&s, "mismatch");
    CHECK_OK(VipConnectWait(s.nic, local, VT_WAIT_MS, remote, &ra, &conn));
    check_attrs(&ra, RD, MTU, VIP_FALSE, VIP_TRUE);
    CHECK_RET(VIP_INVALID_RELIABILITY_LEVEL, VipConnectAccept(conn, v3));
    va = vt_vi_attrs(RD, s.ptag, MTU / 2, VIP_FALSE, VIP_FALSE);
    CHECK_OK(VipSetViAttributes(v3, &va));
    CHECK_RET(VIP_INVALID_MTU, VipConnectAccept(conn, v3));
    va = vt_vi_attrs(RD, s.ptag, MTU, VIP_FALSE, VIP_FALSE);
    CHECK_OK(VipSetViAttributes(v3, &va));
    CHECK_STATE(VIP_STATE_IDLE, v3);
    CHECK_OK(VipConnectAccept(conn, v3));
    CHECK_STATE(VIP_STATE_CONNECTED, v3);
    vt_sync(fd, 5);
    CHECK_OK(VipDisconnect(v3));
    CHECK_OK(VipDestroyVi(v3));
    free(local);

    /* A request that the waiter does not answer in time. */
    vt_sync(fd, 6);
    local = addr(&s, "unanswered");
    CHECK_OK(VipConnectWait(s.nic, local, VT_WAIT_MS, remote, &ra, &conn));
    vt_put_u64(fd, 1);           /* picked up, not answered */
    CHECK_EQ(2, vt_get_u64(fd)); /* the client timed out */
    free(local);

    /* Peer to peer. */
    vt_sync(fd, 7);
    VIP_NET_ADDRESS *me = addr(&s, "peer-b"), *peer = addr(&s, "peer-a");
    post_recv(&s, v1, 1);
    CHECK_EQ(3, vt_get_u64(fd)); /* the client's request is pending */
    CHECK_OK(VipConnectPeerRequest(v1, me, peer, VT_WAIT_MS));
    memset(&ra, 0, sizeof ra);
    CHECK_OK(VipConnectPeerWait(v1, &ra));
    check_attrs(&ra, RD, MTU, VIP_FALSE, VIP_TRUE);
    CHECK_STATE(VIP_STATE_CONNECTED, v1);
    expect_msg(&s, v1, 1, 333, 12, 0x12);
    vt_sync(fd, 8);
    CHECK_OK(VipDisconnect(v1));
    free(me);
    free(peer);

    /* A request taken before its timeout and accepted after it. */
    vt_sync(fd, 40);
    local = addr(&s, "late-accept");
    post_recv(&s, v2, 3);
    CHECK_OK(VipConnectWait(s.nic, local, VT_WAIT_MS, remote, &ra, &conn));
    vt_sleep_ms(800); /* the client's timeout is 500 ms */
    CHECK_OK(VipConnectAccept(conn, v2));
    CHECK_STATE(VIP_STATE_CONNECTED, v2);
    expect_msg(&s, v2, 3, 200, 40, 0x40);
    vt_sync(fd, 41);
    CHECK_OK(VipDisconnect(v2));
    free(local);

    /* Reconnect the same VI, three times; the client disconnects first. */
    local = addr(&s, "reconnect");
    for (unsigned r = 0; r < 3; r++) {
        vt_sync(fd, 10 + r);
        vt_errlog_clear(&s.errs);
        post_recv(&s, v1, 2);
        CHECK_OK(VipConnectWait(s.nic, local, VT_WAIT_MS, remote, &ra, &conn));
        CHECK_OK(VipConnectAccept(conn, v1));
        expect_msg(&s, v1, 2, 100 + r, 20 + r, 0x20 + r);
        vt_sync(fd, 20 + r);
        CHECK_STATE_SOON(VIP_STATE_ERROR, v1);
        CHECK_ERROR_REPORTED(&s.errs, VIP_ERROR_CONN_LOST, v1);
        CHECK_OK(VipDisconnect(v1));
        CHECK_STATE(VIP_STATE_IDLE, v1);
    }
    free(local);
    vt_sync(fd, 30);

    CHECK_OK(VipDestroyVi(v1));
    CHECK_OK(VipDestroyVi(v2));
    side_close(&s);
    free(remote);
}

/* ------------------------------------------------------------------ */
/* Three servers and three clients on one device                        */
/* ------------------------------------------------------------------ */

static int multi_index[3] = {0, 1, 2};

static void multi_server(int fd, void *arg)
{
    int k = *(int *)arg;
    char name[32], cdisc[VT_MAX_DISC];
    vt_get_u64(fd); /* go */
    side_t s;
    side_open(&s);
    VIP_VI_HANDLE vi = new_vi(&s, RD, MTU, VIP_FALSE, VIP_FALSE);
    post_recv(&s, vi, 0);
    snprintf(name, sizeof name, "multi-%d", k);
    VIP_NET_ADDRESS *local = addr(&s, name), *remote = vt_addr_buf();
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn;
    CHECK_OK(VipConnectWait(s.nic, local, VT_WAIT_MS, remote, &ra, &conn));
    vt_disc(cdisc, sizeof cdisc, "multi-client-%d", k);
    CHECK(vt_addr_disc_is(remote, cdisc));
    CHECK_OK(VipConnectAccept(conn, vi));
    expect_msg(&s, vi, 0, 64 + (size_t)k, 40 + (uint32_t)k, 0x40 + (VIP_UINT32)k);
    send_msg(&s, vi, 1, 32, 50 + (uint32_t)k, 0x50 + (VIP_UINT32)k);
    CHECK_STATE_SOON(VIP_STATE_ERROR, vi); /* the client disconnects */
    CHECK_OK(VipDisconnect(vi));
    CHECK_OK(VipDestroyVi(vi));
    side_close(&s);
    free(local);
    free(remote);
}

static void multi_client(int fd, void *arg)
{
    int k = *(int *)arg;
    char name[32], cname[32];
    vt_get_u64(fd); /* go */
    side_t s;
    side_open(&s);
    VIP_VI_HANDLE vi = new_vi(&s, RD, MTU, VIP_FALSE, VIP_FALSE);
    post_recv(&s, vi, 1);
    snprintf(name, sizeof name, "multi-%d", k);
    snprintf(cname, sizeof cname, "multi-client-%d", k);
    VIP_NET_ADDRESS *local = addr(&s, cname), *remote = addr(&s, name);
    VIP_VI_ATTRIBUTES ra;
    CHECK_OK(VipConnectRequest(vi, local, remote, VT_WAIT_MS, &ra));
    send_msg(&s, vi, 0, 64 + (size_t)k, 40 + (uint32_t)k, 0x40 + (VIP_UINT32)k);
    expect_msg(&s, vi, 1, 32, 50 + (uint32_t)k, 0x50 + (VIP_UINT32)k);
    CHECK_OK(VipDisconnect(vi));
    CHECK_OK(VipDestroyVi(vi));
    side_close(&s);
    free(local);
    free(remote);
}

/* ------------------------------------------------------------------ */
/* An unreachable host, from a network namespace of its own              */
/* ------------------------------------------------------------------ */

/* Bring up the loopback interface of a fresh network namespace. */
static int loopback_up(void)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr;
    int ok;
    if (s < 0)
        return 0;
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    ok = ioctl(s, SIOCGIFFLAGS, &ifr) == 0;
    ifr.ifr_flags |= IFF_UP;
    ok = ok && ioctl(s, SIOCSIFFLAGS, &ifr) == 0;
    close(s);
    return ok;
}

/* The request for a host that is not this one runs in a new network
 * namespace whose only interface is lo: whatever the host agent (a new one,
 * in that namespace) sends while it tries, nothing leaves this machine. */
static void unreachable(int fd, void *arg)
{
    (void)arg;
    if (unshare(CLONE_NEWNET) != 0 || !loopback_up()) {
        vt_put_u64(fd, (uint64_t)errno);
        return;
    }
    vt_put_u64(fd, 0);
    setenv("VIA_VIAD_IDLE", "1", 1); /* that agent leaves when we are done */
    side_t s;
    side_open(&s);
    VIP_VI_HANDLE vi = new_vi(&s, RD, MTU, VIP_FALSE, VIP_FALSE);
    static const VIP_UINT8 elsewhere[4] = {10, 255, 255, 1};
    char disc[VT_MAX_DISC];
    vt_disc(disc, sizeof disc, "accept");
    VIP_NET_ADDRESS *me = addr(&s, "client-1");
    VIP_NET_ADDRESS *srv = vt_addr_new(elsewhere, 4, disc, (VIP_UINT16)strlen(disc));
    VIP_VI_ATTRIBUTES ra;
    CHECK_RET(VIP_NOT_REACHABLE, VipConnectRequest(vi, me, srv, 2000, &ra));
    CHECK_STATE(VIP_STATE_IDLE, vi);
    CHECK_OK(VipDestroyVi(vi));
    side_close(&s);
    free(me);
    free(srv);
}

/* ------------------------------------------------------------------ */
/* The client (this process)                                            */
/* ------------------------------------------------------------------ */

static void client_steps(side_t *s, int fd)
{
    VIP_VI_HANDLE v1 = new_vi(s, RD, MTU, VIP_FALSE, VIP_TRUE);
    VIP_VI_HANDLE v2 = new_vi(s, RD, MTU, VIP_FALSE, VIP_TRUE);
    VIP_VI_ATTRIBUTES ra;
    double t0;

    printf("accept\n");
    vt_sync(fd, 1);
    VIP_NET_ADDRESS *me1 = addr(s, "client-1"), *me2 = addr(s, "client-2");
    VIP_NET_ADDRESS *srv = addr(s, "accept");
    memset(&ra, 0, sizeof ra);
    CHECK_OK(VipConnectRequest(v1, me1, srv, VT_WAIT_MS, &ra));
    check_attrs(&ra, RD, MTU, VIP_TRUE, VIP_FALSE);
    CHECK_STATE(VIP_STATE_CONNECTED, v1);
    send_msg(s, v1, 0, 1000, 11, 0x11);
    CHECK_OK(VipConnectRequest(v2, me2, srv, VT_WAIT_MS, &ra));
    CHECK_STATE(VIP_STATE_CONNECTED, v2);
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(RD, s->ptag, MTU, VIP_FALSE, VIP_TRUE);
    CHECK_RET(VIP_INVALID_STATE, VipDestroyVi(v1));
    CHECK_RET(VIP_INVALID_STATE, VipSetViAttributes(v1, &va));
    CHECK_RET(VIP_INVALID_STATE, VipConnectRequest(v1, me1, srv, VT_WAIT_MS, &ra));
    CHECK_RET(VIP_INVALID_STATE, VipConnectPeerRequest(v1, me1, srv, VT_WAIT_MS));
    vt_sync(fd, 2);
    CHECK_OK(VipDisconnect(v1));
    CHECK_OK(VipDisconnect(v2));
    CHECK_STATE(VIP_STATE_IDLE, v1);
    free(srv);

    printf("reject\n");
    vt_sync(fd, 3);
    srv = addr(s, "reject");
    CHECK_RET(VIP_REJECT, VipConnectRequest(v1, me1, srv, VT_WAIT_MS, &ra));
    CHECK_STATE(VIP_STATE_IDLE, v1);
    free(srv);

    printf("no server\n");
    srv = addr(s, "nobody");
    t0 = vt_now_ms();
    CHECK_RET(VIP_NO_MATCH, VipConnectRequest(v1, me1, srv, 300, &ra));
    CHECK(elapsed_since(t0) >= 299.0);
    CHECK_STATE(VIP_STATE_IDLE, v1);
    free(srv);

    printf("attribute mismatch at accept\n");
    vt_sync(fd, 4);
    srv = addr(s, "mismatch");
    CHECK_OK(VipConnectRequest(v1, me1, srv, VT_WAIT_MS, &ra));
    check_attrs(&ra, RD, MTU, VIP_FALSE, VIP_FALSE);
    vt_sync(fd, 5);
    CHECK_OK(VipDisconnect(v1));
    free(srv);

    printf("VipConnectWait timeout\n");
    VIP_NET_ADDRESS *lonely = addr(s, "lonely"), *remote = vt_addr_buf();
    VIP_CONN_HANDLE conn = NULL;
    t0 = vt_now_ms();
    CHECK_RET(VIP_TIMEOUT, VipConnectWait(s->nic, lonely, 200, remote, &ra, &conn));
    CHECK(elapsed_since(t0) >= 199.0);
    free(lonely);
    free(remote);

    printf("unanswered request\n");
    vt_sync(fd, 6);
    srv = addr(s, "unanswered");
    t0 = vt_now_ms();
    /* Taken by a waiter at once, it waits for the answer for 6 s from
     * then, past its 500 ms timeout. */
    CHECK_RET(VIP_TIMEOUT, VipConnectRequest(v1, me1, srv, 500, &ra));
    CHECK(elapsed_since(t0) >= 5999.0);
    CHECK_STATE(VIP_STATE_IDLE, v1);
    CHECK_EQ(1, vt_get_u64(fd));
    vt_put_u64(fd, 2);
    free(srv);

    printf("peer to peer\n");
    vt_sync(fd, 7);
    VIP_NET_ADDRESS *me = addr(s, "peer-a"), *peer = addr(s, "peer-b");
    CHECK_OK(VipConnectPeerRequest(v1, me, peer, VT_WAIT_MS));
    CHECK_STATE(VIP_STATE_CONNECT_PENDING, v1);
    for (int i = 0; i < 3; i++) {
        CHECK_RET(VIP_NOT_DONE, VipConnectPeerDone(v1, &ra));
        vt_sleep_ms(20);
    }
    vt_put_u64(fd, 3);
    VIP_RETURN r;
    double until = vt_now_ms() + VT_WAIT_MS;
    memset(&ra, 0, sizeof ra);
    while ((r = VipConnectPeerDone(v1, &ra)) == VIP_NOT_DONE && vt_now_ms() < until)
        vt_sleep_ms(1);
    CHECK_RET(VIP_SUCCESS, r);
    check_attrs(&ra, RD, MTU, VIP_TRUE, VIP_FALSE);
    CHECK_STATE(VIP_STATE_CONNECTED, v1);
    send_msg(s, v1, 1, 333, 12, 0x12);
    vt_sync(fd, 8);
    CHECK_OK(VipDisconnect(v1));
    free(me);
    free(peer);

    printf("peer request timeout\n");
    me = addr(s, "peer-x");
    peer = addr(s, "peer-y");
    t0 = vt_now_ms();
    CHECK_OK(VipConnectPeerRequest(v2, me, peer, 200));
    CHECK_RET(VIP_TIMEOUT, VipConnectPeerWait(v2, &ra));
    CHECK(elapsed_since(t0) >= 199.0);
    CHECK_STATE(VIP_STATE_IDLE, v2);
    CHECK_OK(VipConnectPeerRequest(v2, me, peer, 200));
    vt_sleep_ms(300);
    CHECK_RET(VIP_TIMEOUT, VipConnectPeerDone(v2, &ra));
    CHECK_STATE(VIP_STATE_IDLE, v2);
    free(me);
    free(peer);

    printf("request accepted after its timeout\n");
    vt_sync(fd, 40);
    srv = addr(s, "late-accept");
    t0 = vt_now_ms();
    CHECK_OK(VipConnectRequest(v2, me2, srv, 500, &ra));
    CHECK(elapsed_since(t0) >= 799.0);
    CHECK_STATE(VIP_STATE_CONNECTED, v2);
    send_msg(s, v2, 3, 200, 40, 0x40);
    vt_sync(fd, 41);
    CHECK_OK(VipDisconnect(v2));
    free(srv);

    printf("reconnect\n");
    srv = addr(s, "reconnect");
    for (unsigned k = 0; k < 3; k++) {
        vt_sync(fd, 10 + k);
        CHECK_OK(VipConnectRequest(v1, me1, srv, VT_WAIT_MS, &ra));
        CHECK_STATE(VIP_STATE_CONNECTED, v1);
        send_msg(s, v1, 2, 100 + k, 20 + k, 0x20 + k);
        vt_sync(fd, 20 + k);
        CHECK_OK(VipDisconnect(v1));
        CHECK_STATE(VIP_STATE_IDLE, v1);
    }
    vt_sync(fd, 30);
    free(srv);

    CHECK_OK(VipDestroyVi(v1));
    CHECK_OK(VipDestroyVi(v2));
    free(me1);
    free(me2);
}

static void name_service(side_t *s)
{
    printf("name service\n");
    CHECK_OK(VipNSInit(s->nic, NULL));
    VIP_NET_ADDRESS *a = vt_addr_buf();
    a->DiscriminatorLen = 3;
    CHECK_OK(VipNSGetHostByName(s->nic, "localhost", a, 0));
    CHECK_EQ(4, a->HostAddressLen);
    CHECK(memcmp(a->HostAddress, vt_loopback, 4) == 0);
    CHECK_EQ(3, a->DiscriminatorLen);
    CHECK_RET(VIP_ERROR_NAMESERVICE, VipNSGetHostByName(s->nic, "no-such-host.invalid", a, 0));
    CHECK_RET(VIP_ERROR_NAMESERVICE, VipNSGetHostByName(s->nic, "localhost", a, 1000));

    /* 127.0.0.1 -> name -> 127.0.0.1 */
    VIP_NET_ADDRESS *lo = vt_addr_new(vt_loopback, 4, NULL, 0);
    char name[256];
    VIP_ULONG len = sizeof name;
    memset(name, 'x', sizeof name);
    CHECK_OK(VipNSGetHostByAddr(s->nic, lo, name, &len));
    CHECK(memchr(name, '\0', sizeof name) != NULL);
    CHECK_EQ(strlen(name) + 1, len);
    printf("  127.0.0.1 is \"%s\"\n", name);
    int found = 0;
    for (VIP_ULONG i = 0; i < 64 && !found; i++) {
        VIP_NET_ADDRESS *b = vt_addr_buf();
        VIP_RETURN r = VipNSGetHostByName(s->nic, name, b, i);
        if (r == VIP_ERROR_NAMESERVICE) {
            free(b);
            break;
        }
        CHECK_RET(VIP_SUCCESS, r);
        CHECK_EQ(4, b->HostAddressLen);
        found = memcmp(b->HostAddress, vt_loopback, 4) == 0;
        free(b);
    }
    CHECK(found);

    /* A buffer too small for the name. */
    VIP_ULONG small = 1;
    CHECK_RET(VIP_ERROR_RESOURCE, VipNSGetHostByAddr(s->nic, lo, name, &small));
    small = (VIP_ULONG)strlen(name); /* no room for the NUL */
    CHECK_RET(VIP_ERROR_RESOURCE, VipNSGetHostByAddr(s->nic, lo, name, &small));
    CHECK_OK(VipNSShutdown(s->nic));
    free(a);
    free(lo);
}

static void autodiscovery(side_t *s)
{
    printf("autodiscovery\n");
    enum { N = 8 };
    VIP_NET_ADDRESS *addrs[N];
    for (int i = 0; i < N; i++)
        addrs[i] = vt_addr_buf();
    VIP_AUTODISCOVERY_LIST list = {0, addrs, N};
    CHECK_OK(VipQuerySystemManagementInfo(s->nic, VIP_SMI_AUTODISCOVERY, &list));
    CHECK(list.NumAdAddrs >= 1 && list.NumAdAddrs <= N);
    int lo = 0;
    for (VIP_ULONG i = 0; i < list.NumAdAddrs; i++) {
        CHECK_EQ(4, addrs[i]->HostAddressLen);
        printf("  %u.%u.%u.%u\n", addrs[i]->HostAddress[0], addrs[i]->HostAddress[1],
               addrs[i]->HostAddress[2], addrs[i]->HostAddress[3]);
        lo |= memcmp(addrs[i]->HostAddress, vt_loopback, 4) == 0;
    }
    CHECK(lo);
    /* Room for one address only. */
    list.NumAdAddrs = 1;
    CHECK_OK(VipQuerySystemManagementInfo(s->nic, VIP_SMI_AUTODISCOVERY, &list));
    CHECK(list.NumAdAddrs >= 1);
    CHECK_EQ(4, addrs[0]->HostAddressLen);
    CHECK_RET(VIP_INVALID_PARAMETER, VipQuerySystemManagementInfo(s->nic, 2, &list));
    for (int i = 0; i < N; i++)
        free(addrs[i]);
}

int main(void)
{
    vt_init();
    /* Every child is forked before this process makes a Vip* call. */
    vt_child srv = vt_spawn("server", server, NULL);
    vt_child iso = vt_spawn("isolated", unreachable, NULL);
    vt_child ms[3], mc[3];
    for (int k = 0; k < 3; k++) {
        ms[k] = vt_spawn("multi-server", multi_server, &multi_index[k]);
        mc[k] = vt_spawn("multi-client", multi_client, &multi_index[k]);
    }

    side_t s;
    side_open(&s);
    client_steps(&s, srv.fd);
    vt_join(&srv);

    printf("three servers, three clients, one device\n");
    /* Clients first (they wait for their servers), in reverse order. */
    for (int k = 2; k >= 0; k--)
        vt_put_u64(mc[k].fd, 1);
    vt_sleep_ms(50);
    for (int k = 0; k < 3; k++)
        vt_put_u64(ms[k].fd, 1);
    for (int k = 0; k < 3; k++) {
        vt_join(&mc[k]);
        vt_join(&ms[k]);
    }

    printf("unreachable host\n");
    uint64_t err = vt_get_u64(iso.fd);
    if (err != 0)
        printf("  SKIPPED: no network namespace of our own (%s); needs root\n",
               strerror((int)err));
    vt_join(&iso);

    name_service(&s);
    autodiscovery(&s);
    side_close(&s);
    printf("connect: ok\n");
    return 0;
}
