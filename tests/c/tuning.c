/*
 * tuning: the provider's design alternatives (docs/tuning.md) are real code
 * paths, and the one the environment selects is the one that runs.
 *
 * 1. A setting with an unknown value makes VipOpenNic fail with
 *    VIP_INVALID_PARAMETER.
 * 2. With VIA_PROFILE, a client sends N messages (half below the inline
 *    threshold, half above) to a server whose receive queue is on a CQ.  The
 *    server checks the CQ's semantics (N completions reported once each,
 *    then none, then VipRecvDone in order with intact data) whatever
 *    VIA_CQ is.  Both processes append their counters at VipCloseNic; the
 *    test checks that they show the alternatives of the environment:
 *    doorbells rung only with VIA_DOORBELL=d1|d2, inline copies only above
 *    VIA_INLINE_MAX=0, the settings named in each line.
 *
 * The Makefile runs the whole C suite under each alternative as well
 * (test-c-tuning); this program is the one that would notice a setting
 * being ignored.
 */
#include "vt.h"

#define N     20
#define SMALL 64   /* inline unless VIA_INLINE_MAX=0 */
#define LARGE 3000 /* above the inline threshold: one cross-memory copy */

static size_t len_of(size_t i) { return i % 2 == 0 ? SMALL : LARGE; }

/* Each in a child of its own: the settings are read once, at the first
 * VipOpenNic.  arg: "NAME=VALUE". */
static void bad_setting(int fd, void *arg)
{
    (void)fd;
    CHECK(putenv((char *)arg) == 0);
    VIP_NIC_HANDLE nic = NULL;
    CHECK_RET(VIP_INVALID_PARAMETER, VipOpenNic(VT_DEV, &nic));
}

static void server(int fd, void *arg)
{
    (void)arg;
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    VIP_PROTECTION_HANDLE ptag;
    CHECK_OK(VipCreatePtag(nic, &ptag));
    vt_mem buf;
    vt_dpool descs;
    vt_mem_reg(&buf, nic, ptag, N * LARGE, VIP_FALSE, VIP_FALSE);
    vt_dpool_init(&descs, nic, ptag, N, 1);
    VIP_CQ_HANDLE cq;
    CHECK_OK(VipCreateCQ(nic, 64, &cq));
    VIP_VI_ATTRIBUTES va = {VIP_SERVICE_RELIABLE_DELIVERY, 65536, NULL, ptag, VIP_FALSE, VIP_FALSE};
    VIP_VI_HANDLE vi;
    CHECK_OK(VipCreateVi(nic, &va, NULL, cq, &vi));
    for (size_t i = 0; i < N; i++) {
        vt_desc_recv(vt_dpool_get(&descs, i), buf.base + i * LARGE, buf.mh, LARGE, 1);
        CHECK_OK(VipPostRecv(vi, vt_dpool_get(&descs, i), descs.mem.mh));
    }
    char disc[64];
    vt_disc(disc, sizeof disc, "tuning");
    VIP_NET_ADDRESS *local = vt_addr_local(nic, disc), *remote = vt_addr_buf();
    VIP_CONN_HANDLE conn;
    VIP_VI_ATTRIBUTES ra;
    CHECK_OK(VipConnectWait(nic, local, VT_WAIT_MS, remote, &ra, &conn));
    CHECK_OK(VipConnectAccept(conn, vi));
    free(local);
    free(remote);
    vt_sync(fd, 1); /* every message has been delivered */
    for (size_t i = 0; i < N; i++) {
        VIP_VI_HANDLE got = NULL;
        VIP_BOOLEAN recv = VIP_FALSE;
        CHECK_OK(VipCQWait(cq, VT_WAIT_MS, &got, &recv));
        CHECK_PTR(vi, got);
        CHECK_EQ(VIP_TRUE, recv);
    }
    VIP_VI_HANDLE got = NULL;
    VIP_BOOLEAN recv = VIP_FALSE;
    CHECK_RET(VIP_NOT_DONE, VipCQDone(cq, &got, &recv));
    for (size_t i = 0; i < N; i++) {
        VIP_DESCRIPTOR *d = NULL;
        CHECK_OK(VipRecvDone(vi, &d));
        CHECK_PTR(vt_dpool_get(&descs, i), d);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, d);
        CHECK_EQ(len_of(i), d->CS.Length);
        CHECK_PATTERN(buf.base + i * LARGE, len_of(i), (uint32_t)i);
    }
    CHECK_RET(VIP_NOT_DONE, VipCQDone(cq, &got, &recv));
    vt_sync(fd, 2);
    CHECK_OK(VipDisconnect(vi));
    CHECK_OK(VipDestroyVi(vi));
    CHECK_OK(VipDestroyCQ(cq));
    vt_mem_dereg(&buf);
    vt_dpool_fini(&descs);
    CHECK_OK(VipCloseNic(nic));
}

/* The sum over the profile's lines of counter `name`. */
static long long profile_sum(const char *text, const char *name)
{
    char key[64];
    snprintf(key, sizeof key, "\"%s\":", name);
    long long sum = 0;
    for (const char *p = strstr(text, key); p != NULL; p = strstr(p + 1, key))
        sum += atoll(p + strlen(key));
    return sum;
}

static int count_of(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(text, needle); p != NULL; p = strstr(p + 1, needle))
        n++;
    return n;
}

static int env_is(const char *name, const char *value)
{
    const char *v = getenv(name);
    return v != NULL && strcmp(v, value) == 0;
}

int main(void)
{
    vt_init();
    static char *bad_values[] = {"VIA_DOORBELL=d3", "VIA_GSO=2", "VIA_PIN_MEMORY=yes"};
    for (size_t i = 0; i < sizeof bad_values / sizeof bad_values[0]; i++) {
        vt_child bad = vt_spawn("bad-setting", bad_setting, bad_values[i]);
        vt_join(&bad);
    }

    char profile[] = "/tmp/openvia-tuning-XXXXXX";
    int pfd = mkstemp(profile);
    CHECK(pfd >= 0);
    close(pfd);
    setenv("VIA_PROFILE", profile, 1);

    vt_child srv = vt_spawn("server", server, NULL);
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    VIP_PROTECTION_HANDLE ptag;
    CHECK_OK(VipCreatePtag(nic, &ptag));
    vt_mem buf;
    vt_dpool descs;
    vt_mem_reg(&buf, nic, ptag, N * LARGE, VIP_FALSE, VIP_FALSE);
    vt_dpool_init(&descs, nic, ptag, N, 1);
    VIP_VI_ATTRIBUTES va = {VIP_SERVICE_RELIABLE_DELIVERY, 65536, NULL, ptag, VIP_FALSE, VIP_FALSE};
    VIP_VI_HANDLE vi;
    CHECK_OK(VipCreateVi(nic, &va, NULL, NULL, &vi));
    char disc[64];
    vt_disc(disc, sizeof disc, "tuning");
    VIP_NET_ADDRESS *me = vt_addr_local(nic, "client"), *srvaddr = vt_addr_local(nic, disc);
    VIP_VI_ATTRIBUTES ra;
    CHECK_OK(VipConnectRequest(vi, me, srvaddr, VT_WAIT_MS, &ra));
    free(me);
    free(srvaddr);
    /* All posted before any completes: with a doorbell they queue for the engine. */
    for (size_t i = 0; i < N; i++) {
        vt_fill(buf.base + i * LARGE, len_of(i), (uint32_t)i);
        vt_desc_send(vt_dpool_get(&descs, i), 0, 0, buf.base + i * LARGE, buf.mh, len_of(i), 1);
        CHECK_OK(VipPostSend(vi, vt_dpool_get(&descs, i), descs.mem.mh));
    }
    for (size_t i = 0; i < N; i++) {
        VIP_DESCRIPTOR *d = vt_send_wait(vi);
        CHECK_PTR(vt_dpool_get(&descs, i), d);
        CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, d);
    }
    vt_sync(srv.fd, 1);
    vt_sync(srv.fd, 2);
    CHECK_OK(VipDisconnect(vi));
    CHECK_OK(VipDestroyVi(vi));
    vt_mem_dereg(&buf);
    vt_dpool_fini(&descs);
    CHECK_OK(VipCloseNic(nic));
    vt_join(&srv);

    /* The profile: one line per process. */
    FILE *f = fopen(profile, "r");
    CHECK(f != NULL);
    static char text[65536];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    unlink(profile);
    text[n] = '\0';
    CHECK_EQ(2, count_of(text, "\"pid\":"));
    CHECK_EQ(N, profile_sum(text, "msgs_sent"));
    CHECK_EQ(N, profile_sum(text, "msgs_received"));
    CHECK_EQ(N, profile_sum(text, "post_send_calls"));
    CHECK_EQ(N, profile_sum(text, "transfers"));
    CHECK_EQ(N, profile_sum(text, "completions"));
    CHECK_EQ(N, profile_sum(text, "receives"));
    CHECK(profile_sum(text, "cq_done_calls") >= N + 2);

    const char *doorbell = getenv("VIA_DOORBELL") ? getenv("VIA_DOORBELL") : "direct";
    char setting[64];
    snprintf(setting, sizeof setting, "\"doorbell\":\"%s\"", doorbell);
    CHECK_EQ(2, count_of(text, setting));
    long long rung = profile_sum(text, "doorbell_rings");
    if (strcmp(doorbell, "direct") == 0)
        CHECK_EQ(0, rung);
    else
        CHECK_EQ(N, rung);

    CHECK_EQ(2, count_of(text, env_is("VIA_CQ", "cq2") ? "\"cq\":\"cq2\"" : "\"cq\":\"cq1\""));
    CHECK_EQ(env_is("VIA_INLINE_MAX", "0") ? 0 : N / 2, profile_sum(text, "inline_sends"));
    CHECK_EQ(env_is("VIA_INLINE_MAX", "0") ? N : N / 2, profile_sum(text, "cma_copies"));
    printf("tuning (doorbell %s): ok\n", doorbell);
    return 0;
}
