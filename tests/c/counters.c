/*
 * counters: the provider publishes its transport counters to the host agent,
 * and `viad --stats` reports them while the NIC is open.
 *
 * A server child receives N messages of LEN bytes; the client sends them,
 * then asks the agent for its counters and checks what it sent.
 */
#include "vt.h"

#define N   10
#define LEN 3000 /* above the inline threshold: one cross-memory copy each */

static void server(int fd, void *arg)
{
    (void)arg;
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    VIP_PROTECTION_HANDLE ptag;
    CHECK_OK(VipCreatePtag(nic, &ptag));
    vt_mem buf;
    vt_dpool descs;
    vt_mem_reg(&buf, nic, ptag, N * LEN, VIP_FALSE, VIP_FALSE);
    vt_dpool_init(&descs, nic, ptag, N, 1);
    VIP_VI_ATTRIBUTES va = {VIP_SERVICE_RELIABLE_DELIVERY, 65536, NULL, ptag, VIP_FALSE, VIP_FALSE};
    VIP_VI_HANDLE vi;
    CHECK_OK(VipCreateVi(nic, &va, NULL, NULL, &vi));
    for (size_t i = 0; i < N; i++) {
        VIP_DESCRIPTOR *d = vt_dpool_get(&descs, i);
        vt_desc_recv(d, buf.base + i * LEN, buf.mh, LEN, 1);
        CHECK_OK(VipPostRecv(vi, d, descs.mem.mh));
    }
    char disc[64];
    vt_disc(disc, sizeof disc, "counters");
    VIP_NET_ADDRESS *local = vt_addr_local(nic, disc), *remote = vt_addr_buf();
    VIP_CONN_HANDLE conn;
    VIP_VI_ATTRIBUTES ra;
    CHECK_OK(VipConnectWait(nic, local, VT_WAIT_MS, remote, &ra, &conn));
    CHECK_OK(VipConnectAccept(conn, vi));
    free(local);
    free(remote);
    for (size_t i = 0; i < N; i++) {
        VIP_DESCRIPTOR *got = vt_recv_wait(vi);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, got);
    }
    vt_sync(fd, 1); /* the client reads its counters */
    vt_sync(fd, 2);
    CHECK_OK(VipDisconnect(vi));
    CHECK_OK(VipDestroyVi(vi));
    vt_mem_dereg(&buf);
    vt_dpool_fini(&descs);
    CHECK_OK(VipCloseNic(nic));
}

/* The value of `process.<pid>.via_lo.<name>` in `viad --stats`, or -1. */
static long long agent_counter(const char *name)
{
    const char *viad = getenv("VIA_VIAD");
    char cmd[512], key[128], line[256];
    snprintf(cmd, sizeof cmd, "%s --stats", viad != NULL ? viad : "viad");
    snprintf(key, sizeof key, "process.%d.via_lo.%s ", (int)getpid(), name);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    long long value = -1;
    while (fgets(line, sizeof line, p) != NULL)
        if (strncmp(line, key, strlen(key)) == 0)
            value = atoll(line + strlen(key));
    CHECK(pclose(p) == 0);
    return value;
}

int main(void)
{
    vt_init();
    vt_child srv = vt_spawn("server", server, NULL);
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    VIP_PROTECTION_HANDLE ptag;
    CHECK_OK(VipCreatePtag(nic, &ptag));
    vt_mem buf;
    vt_dpool descs;
    vt_mem_reg(&buf, nic, ptag, LEN, VIP_FALSE, VIP_FALSE);
    vt_dpool_init(&descs, nic, ptag, 1, 1);
    VIP_VI_ATTRIBUTES va = {VIP_SERVICE_RELIABLE_DELIVERY, 65536, NULL, ptag, VIP_FALSE, VIP_FALSE};
    VIP_VI_HANDLE vi;
    CHECK_OK(VipCreateVi(nic, &va, NULL, NULL, &vi));
    char disc[64];
    vt_disc(disc, sizeof disc, "counters");
    VIP_NET_ADDRESS *me = vt_addr_local(nic, "client"), *srvaddr = vt_addr_local(nic, disc);
    VIP_VI_ATTRIBUTES ra;
    CHECK_OK(VipConnectRequest(vi, me, srvaddr, VT_WAIT_MS, &ra));
    free(me);
    free(srvaddr);
    CHECK_EQ(0, agent_counter("msgs_sent"));
    VIP_DESCRIPTOR *d = vt_dpool_get(&descs, 0);
    for (int i = 0; i < N; i++) {
        vt_desc_send(d, 0, 0, buf.base, buf.mh, LEN, 1);
        CHECK_OK(VipPostSend(vi, d, descs.mem.mh));
        CHECK_PTR(d, vt_send_wait(vi));
    }
    vt_sync(srv.fd, 1);
    CHECK_EQ(N, agent_counter("msgs_sent"));
    CHECK_EQ((long long)N * LEN, agent_counter("bytes_sent"));
    CHECK_EQ(N, agent_counter("cma_copies"));
    CHECK_EQ(1, agent_counter("connects"));
    CHECK_EQ(0, agent_counter("dropped_malformed"));
    vt_sync(srv.fd, 2);
    CHECK_OK(VipDisconnect(vi));
    CHECK_OK(VipDestroyVi(vi));
    vt_mem_dereg(&buf);
    vt_dpool_fini(&descs);
    CHECK_OK(VipCloseNic(nic));
    vt_join(&srv);
    printf("counters: ok\n");
    return 0;
}
