/*
 * cl.h - what openvia's multi-host test programs share, on top of the
 * conformance kit tests/c/vt.h (checks, patterns, descriptors, error log).
 *
 * Each program runs on one emulated host (a network namespace made by
 * tests/cluster/cluster.sh), opens the device named by VIA_DEVICE (default
 * /dev/via_eth0) and finds its peers by host name (h1, h2, ...) through the
 * VIA name service, VipNSGetHostByName.  Programs that must agree on more
 * than VIA carries (memory addresses, "ready" and "sent" steps) use a TCP
 * control channel to the peer's address, never VIA itself.
 */
#ifndef OPENVIA_CL_H
#define OPENVIA_CL_H

#include "../c/vt.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#define CL_DEVICE "/dev/via_eth0"

/* How long a connection set-up may take (ms). */
#define CL_CONNECT_MS 20000UL

/* The control channel gives up when the peer is silent this long (s). */
#define CL_CTL_TIMEOUT_S 120

static inline const char *cl_device(void)
{
    const char *d = getenv("VIA_DEVICE");
    return d != NULL && d[0] != '\0' ? d : CL_DEVICE;
}

/* Open the device, the error log as its error callback, the name service. */
static inline VIP_NIC_HANDLE cl_open_nic(vt_errlog *log)
{
    VIP_NIC_HANDLE nic = vt_open_nic(cl_device());
    if (log != NULL) {
        vt_errlog_init(log);
        CHECK_OK(VipErrorCallback(nic, log, vt_errlog_handler));
    }
    CHECK_OK(VipNSInit(nic, NULL));
    return nic;
}

/* The VI network address of host `name` (by the name service) with a
 * discriminator. */
static inline VIP_NET_ADDRESS *cl_addr_of(VIP_NIC_HANDLE nic, const char *name, const char *disc)
{
    VIP_NET_ADDRESS *a = vt_addr_buf();
    VIP_RETURN r = VipNSGetHostByName(nic, (VIP_CHAR *)name, a, 0);
    if (r != VIP_SUCCESS)
        VT_FAIL("VipNSGetHostByName(\"%s\"): expected VIP_SUCCESS, got %s", name, vt_ret_name(r));
    if (a->HostAddressLen != 4)
        VT_FAIL("VipNSGetHostByName(\"%s\"): HostAddressLen %u, expected 4", name,
                (unsigned)a->HostAddressLen);
    size_t dl = strlen(disc);
    CHECK(dl <= VT_MAX_DISC);
    memcpy(a->HostAddress + a->HostAddressLen, disc, dl);
    a->DiscriminatorLen = (VIP_UINT16)dl;
    return a;
}

/* The IPv4 address of host `name`, as the name service gives it. */
static inline struct in_addr cl_ip_of(VIP_NIC_HANDLE nic, const char *name)
{
    VIP_NET_ADDRESS *a = cl_addr_of(nic, name, "");
    struct in_addr ip;
    memcpy(&ip, a->HostAddress, 4);
    free(a);
    return ip;
}

/* ------------------------------------------------------------------ */
/* Connections                                                          */
/* ------------------------------------------------------------------ */

/* Client-server model, server side: wait for the request on disc, check the
 * requester's attributes, accept it with vi. */
static inline void cl_accept(VIP_NIC_HANDLE nic, VIP_VI_HANDLE vi, const char *disc,
                             VIP_RELIABILITY_LEVEL level)
{
    VIP_NET_ADDRESS *local = vt_addr_local(nic, disc);
    VIP_NET_ADDRESS *remote = vt_addr_buf();
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn = NULL;
    memset(&ra, 0, sizeof ra);
    CHECK_OK(VipConnectWait(nic, local, CL_CONNECT_MS, remote, &ra, &conn));
    CHECK(conn != NULL);
    CHECK_EQ(4, remote->HostAddressLen);
    CHECK_EQ(level, ra.ReliabilityLevel);
    CHECK_OK(VipConnectAccept(conn, vi));
    free(local);
    free(remote);
}

/* Client-server model, client side: ask host `peer` for disc. */
static inline void cl_request(VIP_NIC_HANDLE nic, VIP_VI_HANDLE vi, const char *peer,
                              const char *disc, VIP_RELIABILITY_LEVEL level)
{
    char mine[VT_MAX_DISC + 1];
    snprintf(mine, sizeof mine, "%.60s/c", disc);
    VIP_NET_ADDRESS *local = vt_addr_local(nic, mine);
    VIP_NET_ADDRESS *remote = cl_addr_of(nic, peer, disc);
    VIP_VI_ATTRIBUTES ra;
    memset(&ra, 0, sizeof ra);
    CHECK_OK(VipConnectRequest(vi, local, remote, CL_CONNECT_MS, &ra));
    CHECK_EQ(level, ra.ReliabilityLevel);
    free(local);
    free(remote);
}

/* Peer-to-peer model: this side's request; the peer's request must name
 * the same two discriminators the other way round.  Complete it with
 * cl_peer_wait. */
static inline void cl_peer_request(VIP_NIC_HANDLE nic, VIP_VI_HANDLE vi, const char *peer,
                                   const char *mine, const char *theirs)
{
    VIP_NET_ADDRESS *local = vt_addr_local(nic, mine);
    VIP_NET_ADDRESS *remote = cl_addr_of(nic, peer, theirs);
    CHECK_OK(VipConnectPeerRequest(vi, local, remote, CL_CONNECT_MS));
    free(local);
    free(remote);
}

static inline void cl_peer_wait(VIP_VI_HANDLE vi, VIP_RELIABILITY_LEVEL level)
{
    VIP_VI_ATTRIBUTES ra;
    memset(&ra, 0, sizeof ra);
    CHECK_OK(VipConnectPeerWait(vi, &ra));
    CHECK_EQ(level, ra.ReliabilityLevel);
    CHECK_STATE(VIP_STATE_CONNECTED, vi);
}

/* ------------------------------------------------------------------ */
/* The TCP control channel                                              */
/* ------------------------------------------------------------------ */

static inline void cl_ctl_options(int fd)
{
    int one = 1;
    struct timeval tv = {CL_CTL_TIMEOUT_S, 0};
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* Server: accept one control connection on port. */
static inline int cl_ctl_accept(uint16_t port)
{
    int one = 1;
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (ls < 0)
        VT_FAIL("control socket: %s", strerror(errno));
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(ls, 1) != 0)
        VT_FAIL("control port %u: %s", (unsigned)port, strerror(errno));
    struct timeval tv = {CL_CTL_TIMEOUT_S, 0};
    setsockopt(ls, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int fd;
    while ((fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC)) < 0)
        if (errno != EINTR)
            VT_FAIL("control port %u: accept: %s", (unsigned)port, strerror(errno));
    close(ls);
    cl_ctl_options(fd);
    return fd;
}

/* Client: connect to the server's control port, retrying while it starts. */
static inline int cl_ctl_connect(struct in_addr ip, uint16_t port)
{
    double until = vt_now_ms() + 30000.0;
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            VT_FAIL("control socket: %s", strerror(errno));
        struct sockaddr_in sa;
        memset(&sa, 0, sizeof sa);
        sa.sin_family = AF_INET;
        sa.sin_port = htons(port);
        sa.sin_addr = ip;
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
            cl_ctl_options(fd);
            return fd;
        }
        int e = errno;
        close(fd);
        if (vt_now_ms() > until)
            VT_FAIL("control channel to %s:%u: %s", inet_ntoa(ip), (unsigned)port, strerror(e));
        vt_sleep_ms(50);
    }
}

/* ------------------------------------------------------------------ */
/* Data                                                                 */
/* ------------------------------------------------------------------ */

/* Check n bytes at p against the pattern of seed from position `from` on. */
#define CHECK_PATTERN_AT(p, n, seed, from)                                     \
    do {                                                                       \
        const VIP_UINT8 *cb_ = (const VIP_UINT8 *)(p);                         \
        size_t cn_ = (size_t)(n), cf_ = (size_t)(from);                        \
        uint32_t cs_ = (uint32_t)(seed);                                       \
        for (size_t ci_ = 0; ci_ < cn_; ci_++)                                 \
            if (cb_[ci_] != vt_pat(cs_, cf_ + ci_))                            \
                VT_FAIL("data of %s (%zu bytes, seed %u from %zu) differs at " \
                        "offset %zu: expected 0x%02x, got 0x%02x", #p, cn_,     \
                        (unsigned)cs_, cf_, ci_, vt_pat(cs_, cf_ + ci_), cb_[ci_]); \
    } while (0)

/* Check that n bytes at p all hold the byte v. */
#define CHECK_BYTES(p, n, v)                                                   \
    do {                                                                       \
        const VIP_UINT8 *kb_ = (const VIP_UINT8 *)(p);                         \
        size_t kn_ = (size_t)(n);                                              \
        for (size_t ki_ = 0; ki_ < kn_; ki_++)                                 \
            if (kb_[ki_] != (VIP_UINT8)(v))                                    \
                VT_FAIL("%s: byte %zu of %zu is 0x%02x, expected 0x%02x", #p,   \
                        ki_, kn_, kb_[ki_], (unsigned)(VIP_UINT8)(v));         \
    } while (0)

/* The error bits of a completed descriptor, spelled out. */
static inline const char *cl_status(const VIP_DESCRIPTOR *d, char *buf, size_t n)
{
    return vt_status_str(d->CS.Status, buf, n);
}

#endif /* OPENVIA_CL_H */
