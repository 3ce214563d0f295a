/*
 * startorder.c - a VIA program of a cluster launcher's kind: its two sides
 * start in any order, and the client retries until the server is there.
 *
 *   startorder server|client cs|peer PEER TAG DELAY_MS TIMEOUT_MS
 *
 * The side sleeps DELAY_MS before it opens its NIC (so that on a host with
 * no VIA process yet, no agent runs until then), then connects one
 * reliable-delivery VI to host PEER (a host name; the own one for two
 * processes on one host), discriminators "so.TAG.s" and "so.TAG.c":
 *
 *   cs    the server loops on VipConnectWait with TIMEOUT_MS, retrying on
 *         VIP_TIMEOUT, then accepts; the client loops on VipConnectRequest
 *         with TIMEOUT_MS, retrying on VIP_NO_MATCH only, as the programs
 *         of the era do.  Any other answer fails.
 *   peer  both sides loop on VipConnectPeerRequest and VipConnectPeerWait
 *         with TIMEOUT_MS, retrying on VIP_TIMEOUT (an unmatched peer
 *         request) only.
 *
 * Then the client sends 4 KiB with immediate data, the server checks it and
 * answers with 4 KiB of its own, which the client checks; both disconnect.
 * Prints "PASS ... tries=N" and exits 0; everything must be done within
 * 60 s of the start.
 */
#include "cl.h"

#define LEN 4096
#define GIVE_UP_MS 60000.0

static int server;
static VIP_RELIABILITY_LEVEL level = VIP_SERVICE_RELIABLE_DELIVERY;

static vt_mem buf, descs;

/* A VI with its receive posted: the other side may send as soon as it is
 * connected. */
static VIP_VI_HANDLE new_vi(VIP_NIC_HANDLE nic, VIP_PROTECTION_HANDLE ptag)
{
    VIP_VI_ATTRIBUTES a = vt_vi_attrs(level, ptag, LEN, VIP_FALSE, VIP_FALSE);
    VIP_VI_HANDLE vi = NULL;
    CHECK_OK(VipCreateVi(nic, &a, NULL, NULL, &vi));
    VIP_DESCRIPTOR *rd = (VIP_DESCRIPTOR *)(void *)descs.base;
    vt_desc_recv(rd, buf.base, buf.mh, LEN, 1);
    CHECK_OK(VipPostRecv(vi, rd, descs.mh));
    return vi;
}

/* Whether the start is too long ago to try again. */
static int late(double start)
{
    return vt_now_ms() - start > GIVE_UP_MS;
}

int main(int argc, char **argv)
{
    vt_init();
    if (argc != 7 || (strcmp(argv[1], "server") && strcmp(argv[1], "client")) ||
        (strcmp(argv[2], "cs") && strcmp(argv[2], "peer"))) {
        fprintf(stderr, "usage: startorder server|client cs|peer PEER TAG DELAY_MS TIMEOUT_MS\n");
        return 2;
    }
    server = strcmp(argv[1], "server") == 0;
    int peer_model = strcmp(argv[2], "peer") == 0;
    const char *peer = argv[3];
    unsigned long delay = strtoul(argv[5], NULL, 0), timeout = strtoul(argv[6], NULL, 0);
    char mine[VT_MAX_DISC + 1], theirs[VT_MAX_DISC + 1], role[64];
    snprintf(mine, sizeof mine, "so.%.40s.%c", argv[4], server ? 's' : 'c');
    snprintf(theirs, sizeof theirs, "so.%.40s.%c", argv[4], server ? 'c' : 's');
    snprintf(role, sizeof role, "%s %s %s", argv[1], argv[2], argv[4]);
    vt_role = role;

    double start = vt_now_ms();
    vt_sleep_ms((unsigned)delay);
    VIP_NIC_HANDLE nic = cl_open_nic(NULL);
    VIP_PROTECTION_HANDLE ptag;
    CHECK_OK(VipCreatePtag(nic, &ptag));
    vt_mem_reg(&buf, nic, ptag, 2 * LEN, VIP_FALSE, VIP_FALSE);
    vt_mem_reg(&descs, nic, ptag, 4096, VIP_FALSE, VIP_FALSE);
    VIP_DESCRIPTOR *rd = (VIP_DESCRIPTOR *)(void *)descs.base;
    VIP_DESCRIPTOR *sd = (VIP_DESCRIPTOR *)(void *)(descs.base + 256);
    VIP_VI_HANDLE vi = new_vi(nic, ptag);
    VIP_NET_ADDRESS *local = vt_addr_local(nic, mine);
    VIP_NET_ADDRESS *remote = cl_addr_of(nic, peer, theirs);
    VIP_VI_ATTRIBUTES ra;
    unsigned tries = 0;
    VIP_RETURN r;

    for (;;) {
        tries++;
        memset(&ra, 0, sizeof ra);
        if (peer_model) {
            r = VipConnectPeerRequest(vi, local, remote, timeout);
            if (r == VIP_SUCCESS)
                r = VipConnectPeerWait(vi, &ra);
            if (r == VIP_SUCCESS)
                break;
            if (r != VIP_TIMEOUT)
                VT_FAIL("try %u: VipConnectPeerRequest/Wait: %s", tries, vt_ret_name(r));
            /* The unmatched request leaves the VI to be used again; a
             * program that cannot tell makes a new one. */
            if (vt_vi_state(vi) != VIP_STATE_IDLE) {
                CHECK_OK(VipDestroyVi(vi));
                vi = new_vi(nic, ptag);
            }
        } else if (server) {
            VIP_NET_ADDRESS *from = vt_addr_buf();
            VIP_CONN_HANDLE conn = NULL;
            r = VipConnectWait(nic, local, timeout, from, &ra, &conn);
            free(from);
            if (r == VIP_SUCCESS) {
                r = VipConnectAccept(conn, vi);
                if (r != VIP_SUCCESS)
                    VT_FAIL("try %u: VipConnectAccept: %s", tries, vt_ret_name(r));
                break;
            }
            if (r != VIP_TIMEOUT)
                VT_FAIL("try %u: VipConnectWait: %s", tries, vt_ret_name(r));
        } else {
            r = VipConnectRequest(vi, local, remote, timeout, &ra);
            if (r == VIP_SUCCESS)
                break;
            if (r != VIP_NO_MATCH)
                VT_FAIL("try %u: VipConnectRequest: %s (only VIP_NO_MATCH is retried)", tries,
                        vt_ret_name(r));
        }
        if (late(start))
            VT_FAIL("not connected after %u tries in %.0f ms", tries, vt_now_ms() - start);
    }
    CHECK_EQ(level, ra.ReliabilityLevel);
    CHECK_STATE(VIP_STATE_CONNECTED, vi);
    double connected = vt_now_ms() - start;

    /* The client speaks first; each side checks the other's pattern. */
    uint32_t seed_c = 0x50C00000u ^ (uint32_t)strlen(argv[4]), seed_s = seed_c ^ 0xFFu;
    VIP_UINT8 *in = buf.base, *out = buf.base + LEN;
    if (!server) {
        vt_fill(out, LEN, seed_c);
        vt_desc_send(sd, VIP_CONTROL_IMMEDIATE, seed_c, out, buf.mh, LEN, 1);
        CHECK_OK(VipPostSend(vi, sd, descs.mh));
    }
    VIP_DESCRIPTOR *got = NULL;
    CHECK_OK(VipRecvWait(vi, 20000, &got));
    CHECK_PTR(rd, got);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_IMMEDIATE | VIP_STATUS_OP_RECEIVE, rd);
    CHECK_EQ(LEN, rd->CS.Length);
    CHECK_EQ(server ? seed_c : seed_s, rd->CS.ImmediateData);
    CHECK_PATTERN(in, LEN, server ? seed_c : seed_s);
    if (server) {
        vt_fill(out, LEN, seed_s);
        vt_desc_send(sd, VIP_CONTROL_IMMEDIATE, seed_s, out, buf.mh, LEN, 1);
        CHECK_OK(VipPostSend(vi, sd, descs.mh));
    }
    CHECK_OK(VipSendWait(vi, 20000, &got));
    CHECK_PTR(sd, got);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, sd);
    /* The server's send completes before it disconnects, once the client
     * has its answer: the client disconnects first. */
    if (server)
        vt_sleep_ms(200);
    VipDisconnect(vi);
    printf("PASS [%s] tries=%u connected_ms=%.0f delay_ms=%lu timeout_ms=%lu\n", role, tries,
           connected, delay, timeout);
    free(local);
    free(remote);
    return 0;
}
