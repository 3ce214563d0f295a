/* openvia's adversarial suite: the victim, a VIA program written against
 * vipl.h that a hostile peer (via-hostile) attacks.  Each mode asserts
 * what the victim must see; run.sh asserts what the attacker and a
 * bystander see.
 *
 *   victim send DISC LEN     accept, send LEN bytes of 0x5A (a large send
 *                            is written by cross-memory attach into the
 *                            receive the peer published)
 *   victim table DISC        register memory, accept; after the peer has
 *                            tried to write the registry table, deregister
 *   victim break DISC        accept; the error callback must report only
 *                            the specification's codes, CONN_LOST among them
 *   victim listen DISC       wait (VIP_INFINITE) and accept the first
 *                            client that completes its handshake
 *   victim client DISC       an honest client of "victim listen"
 *   victim rdma DISC DIR     register a region with RDMA write enabled
 *                            (0x22) and one without (0x11), write their
 *                            addresses and handles to DIR/rdma.targets,
 *                            accept, poll the receive queue until the peer
 *                            breaks the connection; then only the first
 *                            100 bytes of the enabled region may have
 *                            changed (to 0x33), the other region not
 *   victim cq DISC DIR N     one CQ for the receive queues of two VIs:
 *                            one accepted on DISC (the hostile peer), one
 *                            on DISC-honest ("victim sender"); writes both
 *                            VI handles to DIR/cq.vis, then takes N
 *                            messages of the honest peer through the CQ:
 *                            every entry naming the honest VI must be a
 *                            real completion, none may wait past a bound,
 *                            the hostile VI's connection must break and
 *                            the CQ must report no error
 *   victim sender DISC DIR N an honest peer of "victim cq": connects to
 *                            DISC-honest, waits for DIR/cq.attacked, sends N
 *                            messages of 64 bytes, waits for DIR/cq.done
 *   victim rdma-read DISC DIR  a reliable VI with RDMA read enabled; register
 *                            a region with RDMA read enabled (0x22) and one
 *                            without (0x11), write their addresses and
 *                            handles to DIR/rdma-read.targets, accept, poll
 *                            the receive queue (which answers the peer's
 *                            reads) until the connection breaks over the
 *                            peer's unsolicited answer (CONN_LOST); both
 *                            regions unchanged
 *   victim open              open and close the NIC (with whatever agent
 *                            VIA_AGENT_SOCKET leads to)
 *
 * Across hosts, on $VIA_DEVICE (default /dev/via_eth0), reliable delivery:
 *
 *   victim remote-listen DISC LEN
 *                            accept one request for DISC from another host,
 *                            receive LEN bytes of pattern 1, check them,
 *                            send LEN bytes of pattern 2
 *   victim remote-client IPV4 DISC LEN
 *                            connect to DISC at host IPV4, send LEN bytes of
 *                            pattern 1, receive and check LEN bytes of
 *                            pattern 2: the real listener answered
 *   victim remote-unreachable IPV4 DISC
 *                            VipConnectRequest to DISC at host IPV4 must fail
 *                            with VIP_NOT_REACHABLE within 5 s
 */
#include "../c/vt.h"

#include <arpa/inet.h>

#define MTU 65536UL

typedef struct {
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag;
    VIP_VI_HANDLE vi;
    vt_errlog errs;
} victim;

static void victim_open_on(victim *v, const char *dev, VIP_RELIABILITY_LEVEL level, VIP_BOOLEAN rdma_read)
{
    v->nic = vt_open_nic(dev);
    vt_errlog_init(&v->errs);
    CHECK_OK(VipErrorCallback(v->nic, &v->errs, vt_errlog_handler));
    CHECK_OK(VipCreatePtag(v->nic, &v->ptag));
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(level, v->ptag, MTU, VIP_TRUE, rdma_read);
    CHECK_OK(VipCreateVi(v->nic, &va, NULL, NULL, &v->vi));
}

static void victim_open_vi(victim *v, VIP_RELIABILITY_LEVEL level, VIP_BOOLEAN rdma_read)
{
    victim_open_on(v, VT_DEV, level, rdma_read);
}

static void victim_open(victim *v) { victim_open_vi(v, VIP_SERVICE_UNRELIABLE, VIP_FALSE); }

/* The device of the cross-host modes. */
static const char *remote_dev(void)
{
    const char *d = getenv("VIA_DEVICE");
    return d != NULL && d[0] != '\0' ? d : "/dev/via_eth0";
}

/* DISC at the host with IPv4 address `ip`. */
static VIP_NET_ADDRESS *remote_addr(const char *ip, const char *disc)
{
    VIP_UINT8 host[4];
    if (inet_pton(AF_INET, ip, host) != 1)
        VT_FAIL("not an IPv4 address: %s", ip);
    return vt_addr_new(host, 4, disc, (VIP_UINT16)strlen(disc));
}

/* Waits for a request on disc (timeout_ms) and accepts it. */
static VIP_RETURN victim_accept(victim *v, const char *disc, VIP_ULONG timeout_ms)
{
    VIP_NET_ADDRESS *local = vt_addr_local(v->nic, disc);
    VIP_NET_ADDRESS *remote = vt_addr_buf();
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn = NULL;
    VIP_RETURN r = VipConnectWait(v->nic, local, timeout_ms, remote, &ra, &conn);
    if (r == VIP_SUCCESS)
        r = VipConnectAccept(conn, v->vi);
    free(local);
    free(remote);
    return r;
}

/* Waits until the peer has gone (the VI leaves CONNECTED) or ms pass. */
static void victim_wait_peer_gone(victim *v, unsigned ms)
{
    double until = vt_now_ms() + ms;
    while (vt_vi_state(v->vi) == VIP_STATE_CONNECTED && vt_now_ms() < until)
        vt_sleep_ms(5);
}

static void victim_close(victim *v)
{
    if (vt_vi_state(v->vi) != VIP_STATE_IDLE)
        CHECK_OK(VipDisconnect(v->vi));
    CHECK_OK(VipDestroyVi(v->vi));
    CHECK_OK(VipDestroyPtag(v->nic, v->ptag));
    CHECK_OK(VipCloseNic(v->nic));
}

static int mode_send(const char *disc, size_t len)
{
    victim v;
    victim_open(&v);
    vt_mem buf, descs;
    vt_mem_reg(&buf, v.nic, v.ptag, len, VIP_FALSE, VIP_FALSE);
    memset(buf.base, 0x5A, len);
    vt_mem_reg(&descs, v.nic, v.ptag, 4096, VIP_FALSE, VIP_FALSE);
    CHECK_OK(victim_accept(&v, disc, VT_WAIT_MS));
    VIP_DESCRIPTOR *d = (VIP_DESCRIPTOR *)(void *)descs.base;
    vt_desc_send(d, 0, 0, buf.base, buf.mh, len, 1);
    CHECK_OK(VipPostSend(v.vi, d, descs.mh));
    VIP_DESCRIPTOR *done = NULL;
    CHECK_OK(VipSendWait(v.vi, VT_WAIT_MS, &done));
    CHECK(done == d);
    char s[128];
    printf("victim: send of %zu bytes completed: %s\n", len, vt_status_str(d->CS.Status, s, sizeof s));
    victim_wait_peer_gone(&v, 5000);
    vt_mem_dereg(&buf);
    vt_mem_dereg(&descs);
    victim_close(&v);
    return 0;
}

static int mode_table(const char *disc)
{
    victim v;
    victim_open(&v);
    vt_mem target;
    vt_mem_reg(&target, v.nic, v.ptag, 1 << 16, VIP_TRUE, VIP_TRUE);
    CHECK_OK(victim_accept(&v, disc, VT_WAIT_MS));
    victim_wait_peer_gone(&v, VT_WAIT_MS);
    /* Had the peer rewritten the table, these would fail. */
    vt_mem_dereg(&target);
    vt_mem again;
    vt_mem_reg(&again, v.nic, v.ptag, 1 << 16, VIP_TRUE, VIP_FALSE);
    vt_mem_dereg(&again);
    victim_close(&v);
    printf("victim: the registry is intact\n");
    return 0;
}

static int mode_break(const char *disc)
{
    victim v;
    victim_open(&v);
    CHECK_OK(victim_accept(&v, disc, VT_WAIT_MS));
    CHECK_ERROR_REPORTED(&v.errs, VIP_ERROR_CONN_LOST, v.vi);
    pthread_mutex_lock(&v.errs.mu);
    for (int i = 0; i < v.errs.n; i++)
        if ((unsigned)v.errs.e[i].ErrorCode > (unsigned)VIP_ERROR_CATASTROPHIC)
            VT_FAIL("the error callback got code %u, not one of the specification's",
                    (unsigned)v.errs.e[i].ErrorCode);
    pthread_mutex_unlock(&v.errs.mu);
    CHECK_STATE(VIP_STATE_ERROR, v.vi);
    victim_close(&v);
    printf("victim: the peer's bogus code reached the callback as VIP_ERROR_CONN_LOST\n");
    return 0;
}

static int mode_rdma(const char *disc, const char *dir)
{
    victim v;
    victim_open(&v);
    vt_mem open_, closed;
    vt_mem_reg(&open_, v.nic, v.ptag, 4096, VIP_TRUE, VIP_FALSE);
    vt_mem_reg(&closed, v.nic, v.ptag, 4096, VIP_FALSE, VIP_FALSE);
    memset(open_.base, 0x22, open_.size);
    memset(closed.base, 0x11, closed.size);
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/rdma.targets", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    CHECK(f != NULL);
    fprintf(f, "%llu %u %llu %u\n", (unsigned long long)(uintptr_t)open_.base, (unsigned)open_.mh,
            (unsigned long long)(uintptr_t)closed.base, (unsigned)closed.mh);
    CHECK(fclose(f) == 0);
    CHECK(rename(tmp, path) == 0);
    CHECK_OK(victim_accept(&v, disc, VT_WAIT_MS));
    /* The writes land, or are refused, as the receive queue is polled. */
    double until = vt_now_ms() + VT_WAIT_MS;
    VIP_DESCRIPTOR *d = NULL;
    while (vt_vi_state(v.vi) == VIP_STATE_CONNECTED && vt_now_ms() < until) {
        CHECK_RET(VIP_NOT_DONE, VipRecvDone(v.vi, &d));
        vt_sleep_ms(1);
    }
    CHECK_STATE(VIP_STATE_ERROR, v.vi);
    CHECK_ERROR_REPORTED(&v.errs, VIP_ERROR_CONN_LOST, v.vi);
    for (size_t i = 0; i < open_.size; i++)
        if (open_.base[i] != (i < 100 ? 0x33 : 0x22))
            VT_FAIL("byte %zu of the enabled region is 0x%02x", i, open_.base[i]);
    for (size_t i = 0; i < closed.size; i++)
        if (closed.base[i] != 0x11)
            VT_FAIL("byte %zu of the region without RDMA write is 0x%02x", i, closed.base[i]);
    vt_mem_dereg(&open_);
    vt_mem_dereg(&closed);
    victim_close(&v);
    printf("victim: the allowed write landed, the refused ones did not, the bad slot broke the connection\n");
    return 0;
}

static int mode_rdma_read(const char *disc, const char *dir)
{
    victim v;
    victim_open_vi(&v, VIP_SERVICE_RELIABLE_DELIVERY, VIP_TRUE);
    vt_mem open_, closed;
    vt_mem_reg(&open_, v.nic, v.ptag, 4096, VIP_FALSE, VIP_TRUE);
    vt_mem_reg(&closed, v.nic, v.ptag, 4096, VIP_FALSE, VIP_FALSE);
    memset(open_.base, 0x22, open_.size);
    memset(closed.base, 0x11, closed.size);
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/rdma-read.targets", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    CHECK(f != NULL);
    fprintf(f, "%llu %u %llu %u\n", (unsigned long long)(uintptr_t)open_.base, (unsigned)open_.mh,
            (unsigned long long)(uintptr_t)closed.base, (unsigned)closed.mh);
    CHECK(fclose(f) == 0);
    CHECK(rename(tmp, path) == 0);
    CHECK_OK(victim_accept(&v, disc, VT_WAIT_MS));
    /* The reads are answered, or refused, as the receive queue is polled. */
    double until = vt_now_ms() + VT_WAIT_MS;
    VIP_DESCRIPTOR *d = NULL;
    while (vt_vi_state(v.vi) == VIP_STATE_CONNECTED && vt_now_ms() < until) {
        CHECK_RET(VIP_NOT_DONE, VipRecvDone(v.vi, &d));
        vt_sleep_ms(1);
    }
    CHECK_STATE(VIP_STATE_ERROR, v.vi);
    CHECK_ERROR_REPORTED(&v.errs, VIP_ERROR_CONN_LOST, v.vi);
    for (size_t i = 0; i < open_.size; i++)
        if (open_.base[i] != 0x22)
            VT_FAIL("byte %zu of the region with RDMA read is 0x%02x", i, open_.base[i]);
    for (size_t i = 0; i < closed.size; i++)
        if (closed.base[i] != 0x11)
            VT_FAIL("byte %zu of the region without RDMA read is 0x%02x", i, closed.base[i]);
    vt_mem_dereg(&open_);
    vt_mem_dereg(&closed);
    victim_close(&v);
    printf("victim: the allowed read was answered, the others refused, the unsolicited answer broke the connection\n");
    return 0;
}

static int mode_listen(const char *disc)
{
    victim v;
    victim_open(&v);
    double t0 = vt_now_ms();
    CHECK_OK(victim_accept(&v, disc, VIP_INFINITE));
    printf("victim: accepted an honest client after %.0f ms\n", vt_now_ms() - t0);
    victim_wait_peer_gone(&v, VT_WAIT_MS);
    victim_close(&v);
    return 0;
}

static int mode_client(const char *disc)
{
    victim v;
    victim_open(&v);
    VIP_NET_ADDRESS *local = vt_addr_local(v.nic, "honest-client");
    VIP_NET_ADDRESS *remote = vt_addr_local(v.nic, disc);
    VIP_VI_ATTRIBUTES ra;
    double t0 = vt_now_ms();
    CHECK_OK(VipConnectRequest(v.vi, local, remote, VT_WAIT_MS, &ra));
    printf("victim client: connected after %.0f ms\n", vt_now_ms() - t0);
    free(local);
    free(remote);
    victim_close(&v);
    return 0;
}

/* Writes text to DIR/name atomically. */
static void victim_write_file(const char *dir, const char *name, const char *text)
{
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    CHECK(f != NULL);
    fputs(text, f);
    CHECK(fclose(f) == 0);
    CHECK(rename(tmp, path) == 0);
}

/* Waits up to ms for DIR/name to exist. */
static int victim_await_file(const char *dir, const char *name, unsigned ms)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    double until = vt_now_ms() + ms;
    while (access(path, F_OK) != 0) {
        if (vt_now_ms() > until)
            return 0;
        vt_sleep_ms(5);
    }
    return 1;
}

#define CQ_MSG 64

static int mode_cq(const char *disc, const char *dir, unsigned n)
{
    victim v;
    v.nic = vt_open_nic(VT_DEV);
    vt_errlog_init(&v.errs);
    CHECK_OK(VipErrorCallback(v.nic, &v.errs, vt_errlog_handler));
    CHECK_OK(VipCreatePtag(v.nic, &v.ptag));
    VIP_CQ_HANDLE cq;
    CHECK_OK(VipCreateCQ(v.nic, 1024, &cq));
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(VIP_SERVICE_UNRELIABLE, v.ptag, MTU, VIP_TRUE, VIP_FALSE);
    VIP_VI_HANDLE hostile_vi, honest_vi;
    CHECK_OK(VipCreateVi(v.nic, &va, NULL, cq, &hostile_vi));
    CHECK_OK(VipCreateVi(v.nic, &va, NULL, cq, &honest_vi));
    vt_mem buf;
    vt_dpool descs;
    vt_mem_reg(&buf, v.nic, v.ptag, (size_t)(n + 16) * CQ_MSG, VIP_FALSE, VIP_FALSE);
    vt_dpool_init(&descs, v.nic, v.ptag, n + 16, 1);
    for (unsigned i = 0; i < n + 16; i++) {
        VIP_DESCRIPTOR *d = vt_dpool_get(&descs, i);
        vt_desc_recv(d, buf.base + (size_t)i * CQ_MSG, buf.mh, CQ_MSG, 1);
        CHECK_OK(VipPostRecv(i < n ? honest_vi : hostile_vi, d, descs.mem.mh));
    }
    v.vi = hostile_vi;
    CHECK_OK(victim_accept(&v, disc, VT_WAIT_MS));
    char honest_disc[VT_MAX_DISC];
    snprintf(honest_disc, sizeof honest_disc, "%s-honest", disc);
    v.vi = honest_vi;
    CHECK_OK(victim_accept(&v, honest_disc, VT_WAIT_MS));
    char text[128];
    snprintf(text, sizeof text, "%llu %llu\n", (unsigned long long)(uintptr_t)honest_vi,
             (unsigned long long)(uintptr_t)hostile_vi);
    victim_write_file(dir, "cq.vis", text);

    unsigned got = 0, hostile_reports = 0, waits = 0;
    double until = vt_now_ms() + VT_WAIT_MS;
    while (got < n) {
        if (vt_now_ms() > until)
            VT_FAIL("%u of %u messages of the honest peer within %lu ms", got, n, VT_WAIT_MS);
        VIP_VI_HANDLE vi = NULL;
        VIP_BOOLEAN recv = VIP_FALSE;
        VIP_RETURN r = VipCQWait(cq, 1000, &vi, &recv);
        if (r == VIP_TIMEOUT) {
            waits++;
            continue;
        }
        CHECK_OK(r);
        CHECK(recv == VIP_TRUE);
        VIP_DESCRIPTOR *d = NULL;
        if (vi == hostile_vi) {
            /* The hostile peer may name its own VI: that is its connection. */
            hostile_reports++;
            r = VipRecvDone(hostile_vi, &d);
            CHECK(r == VIP_SUCCESS || r == VIP_NOT_DONE);
            continue;
        }
        CHECK(vi == honest_vi);
        r = VipRecvDone(honest_vi, &d);
        if (r != VIP_SUCCESS)
            VT_FAIL("the CQ named the honest VI for a completion it does not have (%s)", vt_ret_name(r));
        CHECK(d == vt_dpool_get(&descs, got));
        CHECK(d->CS.Status & VIP_STATUS_DONE);
        CHECK((d->CS.Status & VIP_STATUS_ERROR_MASK) == 0);
        CHECK_EQ(CQ_MSG, d->CS.Length);
        for (unsigned k = 0; k < CQ_MSG; k++)
            if (buf.base[(size_t)got * CQ_MSG + k] != (VIP_UINT8)(got + k))
                VT_FAIL("message %u, byte %u", got, k);
        got++;
    }
    /* The sender sent at once: a wait that ran out means a stalled CQ. */
    CHECK_EQ(0, waits);
    /* The hostile peer overflowed its lane: its connection, and only its, breaks. */
    CHECK_ERROR_REPORTED(&v.errs, VIP_ERROR_CONN_LOST, hostile_vi);
    pthread_mutex_lock(&v.errs.mu);
    for (int i = 0; i < v.errs.n; i++) {
        if (v.errs.e[i].ViHandle == honest_vi)
            VT_FAIL("an error was reported on the honest VI: %s", vt_error_name(v.errs.e[i].ErrorCode));
        if (v.errs.e[i].CQHandle != NULL)
            VT_FAIL("an error was reported on the CQ: %s", vt_error_name(v.errs.e[i].ErrorCode));
    }
    pthread_mutex_unlock(&v.errs.mu);
    CHECK(vt_vi_state(honest_vi) == VIP_STATE_CONNECTED);
    victim_write_file(dir, "cq.done", "done\n");
    printf("victim: %u honest messages through the CQ, %u entries naming the hostile VI, its connection broken\n",
           got, hostile_reports);
    CHECK_OK(VipDisconnect(honest_vi));
    if (vt_vi_state(hostile_vi) != VIP_STATE_IDLE)
        CHECK_OK(VipDisconnect(hostile_vi));
    CHECK_OK(VipDestroyVi(honest_vi));
    CHECK_OK(VipDestroyVi(hostile_vi));
    CHECK_OK(VipDestroyCQ(cq));
    vt_dpool_fini(&descs);
    vt_mem_dereg(&buf);
    CHECK_OK(VipDestroyPtag(v.nic, v.ptag));
    CHECK_OK(VipCloseNic(v.nic));
    return 0;
}

static int mode_sender(const char *disc, const char *dir, unsigned n)
{
    victim v;
    victim_open(&v);
    char honest_disc[VT_MAX_DISC];
    snprintf(honest_disc, sizeof honest_disc, "%s-honest", disc);
    VIP_NET_ADDRESS *local = vt_addr_local(v.nic, "honest-sender");
    VIP_NET_ADDRESS *remote = vt_addr_local(v.nic, honest_disc);
    VIP_VI_ATTRIBUTES ra;
    /* The victim listens for us once it has accepted the hostile peer. */
    VIP_RETURN r;
    double until = vt_now_ms() + VT_WAIT_MS;
    while ((r = VipConnectRequest(v.vi, local, remote, 2000, &ra)) != VIP_SUCCESS && vt_now_ms() < until)
        CHECK(r == VIP_NO_MATCH || r == VIP_TIMEOUT);
    CHECK_OK(r);
    free(local);
    free(remote);
    vt_mem buf;
    vt_dpool descs;
    vt_mem_reg(&buf, v.nic, v.ptag, (size_t)n * CQ_MSG, VIP_FALSE, VIP_FALSE);
    vt_dpool_init(&descs, v.nic, v.ptag, n, 1);
    if (!victim_await_file(dir, "cq.attacked", VT_WAIT_MS))
        VT_FAIL("the hostile peer never said it attacked");
    for (unsigned i = 0; i < n; i++) {
        for (unsigned k = 0; k < CQ_MSG; k++)
            buf.base[(size_t)i * CQ_MSG + k] = (VIP_UINT8)(i + k);
        VIP_DESCRIPTOR *d = vt_dpool_get(&descs, i);
        vt_desc_send(d, 0, 0, buf.base + (size_t)i * CQ_MSG, buf.mh, CQ_MSG, 1);
        CHECK_OK(VipPostSend(v.vi, d, descs.mem.mh));
    }
    for (unsigned i = 0; i < n; i++) {
        VIP_DESCRIPTOR *d = NULL;
        CHECK_OK(VipSendWait(v.vi, VT_WAIT_MS, &d));
        CHECK((d->CS.Status & VIP_STATUS_ERROR_MASK) == 0);
    }
    if (!victim_await_file(dir, "cq.done", VT_WAIT_MS))
        VT_FAIL("the victim did not take every message");
    vt_dpool_fini(&descs);
    vt_mem_dereg(&buf);
    victim_close(&v);
    return 0;
}

/* Sends len bytes of pattern `out` and receives len bytes of pattern `in`
 * (the receive is posted before the send); both must complete. */
static void exchange(victim *v, vt_mem *buf, vt_mem *descs, size_t len, uint32_t out, uint32_t in,
                     int receive_first)
{
    VIP_DESCRIPTOR *rd = (VIP_DESCRIPTOR *)(void *)descs->base;
    VIP_DESCRIPTOR *sd = (VIP_DESCRIPTOR *)(void *)(descs->base + 256);
    VIP_UINT8 *rbuf = buf->base, *sbuf = buf->base + len;
    if (receive_first) {
        VIP_DESCRIPTOR *got = vt_recv_wait(v->vi);
        CHECK(got == rd);
        CHECK(rd->CS.Length == len);
        size_t at = vt_mismatch(rbuf, len, in);
        if (at != (size_t)-1)
            VT_FAIL("received byte %zu differs from the pattern", at);
    }
    vt_fill(sbuf, len, out);
    vt_desc_send(sd, 0, 0, sbuf, buf->mh, len, 1);
    CHECK_OK(VipPostSend(v->vi, sd, descs->mh));
    CHECK(vt_send_wait(v->vi) == sd);
    if (!receive_first) {
        VIP_DESCRIPTOR *got = vt_recv_wait(v->vi);
        CHECK(got == rd);
        CHECK(rd->CS.Length == len);
        size_t at = vt_mismatch(rbuf, len, in);
        if (at != (size_t)-1)
            VT_FAIL("received byte %zu differs from the pattern", at);
    }
}

/* Registers 2*len bytes (receive half, send half) and posts the receive. */
static void prepare(victim *v, vt_mem *buf, vt_mem *descs, size_t len)
{
    vt_mem_reg(buf, v->nic, v->ptag, 2 * len, VIP_FALSE, VIP_FALSE);
    vt_mem_reg(descs, v->nic, v->ptag, 4096, VIP_FALSE, VIP_FALSE);
    VIP_DESCRIPTOR *rd = (VIP_DESCRIPTOR *)(void *)descs->base;
    vt_desc_recv(rd, buf->base, buf->mh, len, 1);
    CHECK_OK(VipPostRecv(v->vi, rd, descs->mh));
}

static int mode_remote_listen(const char *disc, size_t len)
{
    victim v;
    victim_open_on(&v, remote_dev(), VIP_SERVICE_RELIABLE_DELIVERY, VIP_FALSE);
    vt_mem buf, descs;
    prepare(&v, &buf, &descs, len);
    CHECK_OK(victim_accept(&v, disc, VT_WAIT_MS));
    exchange(&v, &buf, &descs, len, 2, 1, 1);
    printf("victim remote-listen: received %zu bytes of the client's pattern, sent %zu back\n", len, len);
    victim_wait_peer_gone(&v, 5000);
    vt_mem_dereg(&buf);
    vt_mem_dereg(&descs);
    victim_close(&v);
    return 0;
}

static int mode_remote_client(const char *ip, const char *disc, size_t len)
{
    victim v;
    victim_open_on(&v, remote_dev(), VIP_SERVICE_RELIABLE_DELIVERY, VIP_FALSE);
    vt_mem buf, descs;
    prepare(&v, &buf, &descs, len);
    VIP_NET_ADDRESS *local = vt_addr_local(v.nic, "remote-client");
    VIP_NET_ADDRESS *remote = remote_addr(ip, disc);
    VIP_VI_ATTRIBUTES ra;
    double t0 = vt_now_ms();
    CHECK_OK(VipConnectRequest(v.vi, local, remote, VT_WAIT_MS, &ra));
    printf("victim remote-client: connected after %.0f ms\n", vt_now_ms() - t0);
    exchange(&v, &buf, &descs, len, 1, 2, 0);
    printf("victim remote-client: sent %zu bytes, received the listener's %zu\n", len, len);
    free(local);
    free(remote);
    vt_mem_dereg(&buf);
    vt_mem_dereg(&descs);
    victim_close(&v);
    return 0;
}

static int mode_remote_unreachable(const char *ip, const char *disc)
{
    victim v;
    victim_open_on(&v, remote_dev(), VIP_SERVICE_RELIABLE_DELIVERY, VIP_FALSE);
    VIP_NET_ADDRESS *local = vt_addr_local(v.nic, "remote-client");
    VIP_NET_ADDRESS *remote = remote_addr(ip, disc);
    VIP_VI_ATTRIBUTES ra;
    double t0 = vt_now_ms();
    CHECK_RET(VIP_NOT_REACHABLE, VipConnectRequest(v.vi, local, remote, VT_WAIT_MS, &ra));
    double ms = vt_now_ms() - t0;
    if (ms > 5000)
        VT_FAIL("VIP_NOT_REACHABLE came after %.0f ms, not at once", ms);
    printf("victim remote-unreachable: VIP_NOT_REACHABLE after %.0f ms\n", ms);
    free(local);
    free(remote);
    victim_close(&v);
    return 0;
}

int main(int argc, char **argv)
{
    vt_init();
    if (argc == 4 && strcmp(argv[1], "send") == 0)
        return mode_send(argv[2], (size_t)strtoul(argv[3], NULL, 0));
    if (argc == 3 && strcmp(argv[1], "table") == 0)
        return mode_table(argv[2]);
    if (argc == 3 && strcmp(argv[1], "break") == 0)
        return mode_break(argv[2]);
    if (argc == 4 && strcmp(argv[1], "rdma") == 0)
        return mode_rdma(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "rdma-read") == 0)
        return mode_rdma_read(argv[2], argv[3]);
    if (argc == 3 && strcmp(argv[1], "listen") == 0)
        return mode_listen(argv[2]);
    if (argc == 3 && strcmp(argv[1], "client") == 0)
        return mode_client(argv[2]);
    if (argc == 5 && strcmp(argv[1], "cq") == 0)
        return mode_cq(argv[2], argv[3], (unsigned)strtoul(argv[4], NULL, 0));
    if (argc == 5 && strcmp(argv[1], "sender") == 0)
        return mode_sender(argv[2], argv[3], (unsigned)strtoul(argv[4], NULL, 0));
    if (argc == 4 && strcmp(argv[1], "remote-listen") == 0)
        return mode_remote_listen(argv[2], (size_t)strtoul(argv[3], NULL, 0));
    if (argc == 5 && strcmp(argv[1], "remote-client") == 0)
        return mode_remote_client(argv[2], argv[3], (size_t)strtoul(argv[4], NULL, 0));
    if (argc == 4 && strcmp(argv[1], "remote-unreachable") == 0)
        return mode_remote_unreachable(argv[2], argv[3]);
    if (argc == 2 && strcmp(argv[1], "open") == 0) {
        VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
        CHECK_OK(VipCloseNic(nic));
        printf("victim: opened and closed %s\n", VT_DEV);
        return 0;
    }
    fprintf(stderr, "usage: victim send DISC LEN | table DISC | break DISC | rdma DISC DIR | rdma-read DISC DIR | listen DISC\n"
                    "       | client DISC | cq DISC DIR N | sender DISC DIR N | open | remote-listen DISC LEN\n"
                    "       | remote-client IPV4 DISC LEN | remote-unreachable IPV4 DISC\n");
    return 2;
}
