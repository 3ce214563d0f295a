/*
 * api_errors.c - argument checking, handle validation, NIC attributes,
 * state rules, VI attribute rules, timeouts and descriptor checks of the
 * VIPL, in one process.
 */
#include "vt.h"

static int stack_object;

/* Handles that no VIPL call may accept: NULL, small integers, a pointer
 * to a global and one to a local variable. */
static void *forged[4];

static void make_forged(void *local)
{
    forged[0] = NULL;
    forged[1] = (void *)0x1234;
    forged[2] = &stack_object;
    forged[3] = local;
}

#define NFORGED (sizeof forged / sizeof forged[0])

/* ------------------------------------------------------------------ */

static void nic_open_and_query(void)
{
    VIP_NIC_HANDLE nic = NULL;
    VIP_NIC_ATTRIBUTES at;

    printf("open and query\n");
    CHECK_RET(VIP_INVALID_PARAMETER, VipOpenNic(NULL, &nic));
    CHECK_RET(VIP_INVALID_PARAMETER, VipOpenNic(VT_DEV, NULL));
    CHECK_RET(VIP_INVALID_PARAMETER, VipOpenNic("/dev/via_nosuch", &nic));
    CHECK_RET(VIP_INVALID_PARAMETER, VipOpenNic("via_nosuch", &nic));
    CHECK_RET(VIP_INVALID_PARAMETER, VipOpenNic("", &nic));
    CHECK_RET(VIP_INVALID_PARAMETER, VipOpenNic("/dev/null", &nic));

    const char *names[] = {"/dev/via_lo", "via_lo"};
    for (size_t i = 0; i < 2; i++) {
        nic = NULL;
        CHECK_OK(VipOpenNic(names[i], &nic));
        CHECK(nic != NULL);
        memset(&at, 0xA5, sizeof at);
        CHECK_OK(VipQueryNic(nic, &at));
        CHECK(memchr(at.Name, '\0', sizeof at.Name) != NULL);
        CHECK(at.Name[0] != '\0');
        CHECK_EQ(4, at.NicAddressLen);
        CHECK(at.LocalNicAddress != NULL);
        CHECK(memcmp(at.LocalNicAddress, vt_loopback, 4) == 0);
        CHECK_EQ(VIP_TRUE, at.ThreadSafe);
        CHECK_EQ(64, at.MaxDiscriminatorLen);
        CHECK_EQ(1ULL << 40, at.MaxRegisterBytes);
        CHECK_EQ(65535, at.MaxRegisterRegions);
        CHECK_EQ(1ULL << 40, at.MaxRegisterBlockBytes);
        CHECK_EQ(1024, at.MaxVI);
        CHECK_EQ(1024, at.MaxDescriptorsPerQueue);
        CHECK_EQ(32, at.MaxSegmentsPerDesc);
        CHECK_EQ(256, at.MaxCQ);
        CHECK_EQ(4096, at.MaxCQEntries);
        CHECK_EQ(4194304, at.MaxTransferSize);
        CHECK_EQ(4194304, at.NativeMTU);
        CHECK_EQ(1024, at.MaxPtags);
        CHECK_EQ(7, at.ReliabilityLevelSupport);
        CHECK_EQ(6, at.RDMAReadSupport);
        CHECK_RET(VIP_INVALID_PARAMETER, VipQueryNic(nic, NULL));
        CHECK_OK(VipCloseNic(nic));
        /* Closed: the handle is stale now. */
        CHECK_RET(VIP_INVALID_PARAMETER, VipQueryNic(nic, &at));
        CHECK_RET(VIP_INVALID_PARAMETER, VipCloseNic(nic));
    }
}

/* ------------------------------------------------------------------ */

/* Every call that takes a NIC handle refuses h. */
static void nic_calls_refuse(VIP_NIC_HANDLE h, VIP_PROTECTION_HANDLE good_ptag, void *buf,
                             VIP_MEM_HANDLE good_mh)
{
    VIP_NIC_ATTRIBUTES at;
    VIP_PROTECTION_HANDLE p = NULL;
    VIP_MEM_ATTRIBUTES ma = {good_ptag, VIP_FALSE, VIP_FALSE};
    VIP_MEM_HANDLE mh = 0;
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(VIP_SERVICE_UNRELIABLE, good_ptag, 65536, 0, 0);
    VIP_VI_HANDLE vi = NULL;
    VIP_CQ_HANDLE cq = NULL;
    VIP_NET_ADDRESS *local = vt_addr_new(vt_loopback, 4, "x", 1);
    VIP_NET_ADDRESS *remote = vt_addr_buf();
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn = NULL;
    VIP_NET_ADDRESS *nsaddr = vt_addr_buf();
    char name[64];
    VIP_ULONG namelen = sizeof name;
    VIP_NET_ADDRESS *ad[1] = {vt_addr_buf()};
    VIP_AUTODISCOVERY_LIST list = {0, ad, 1};

    CHECK_RET(VIP_INVALID_PARAMETER, VipCloseNic(h));
    CHECK_RET(VIP_INVALID_PARAMETER, VipQueryNic(h, &at));
    CHECK_RET(VIP_INVALID_PARAMETER, VipCreatePtag(h, &p));
    CHECK_RET(VIP_INVALID_PARAMETER, VipDestroyPtag(h, good_ptag));
    CHECK_RET(VIP_INVALID_PARAMETER, VipRegisterMem(h, buf, 4096, &ma, &mh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipDeregisterMem(h, buf, good_mh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipQueryMem(h, buf, good_mh, &ma));
    CHECK_RET(VIP_INVALID_PARAMETER, VipSetMemAttributes(h, buf, good_mh, &ma));
    CHECK_RET(VIP_INVALID_PARAMETER, VipErrorCallback(h, NULL, NULL));
    CHECK_RET(VIP_INVALID_PARAMETER, VipQuerySystemManagementInfo(h, VIP_SMI_AUTODISCOVERY, &list));
    CHECK_RET(VIP_INVALID_PARAMETER, VipCreateVi(h, &va, NULL, NULL, &vi));
    CHECK_RET(VIP_INVALID_PARAMETER, VipCreateCQ(h, 16, &cq));
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectWait(h, local, 0, remote, &ra, &conn));
    CHECK_RET(VIP_INVALID_PARAMETER, VipNSInit(h, NULL));
    CHECK_RET(VIP_INVALID_PARAMETER, VipNSGetHostByName(h, "localhost", nsaddr, 0));
    CHECK_RET(VIP_INVALID_PARAMETER, VipNSGetHostByAddr(h, local, name, &namelen));
    CHECK_RET(VIP_INVALID_PARAMETER, VipNSShutdown(h));
    free(local);
    free(remote);
    free(nsaddr);
    free(ad[0]);
}

/* Every call that takes a VI handle refuses h. */
static void vi_calls_refuse(VIP_VI_HANDLE h, VIP_PROTECTION_HANDLE ptag, VIP_DESCRIPTOR *desc,
                            VIP_MEM_HANDLE dmh)
{
    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES va;
    VIP_BOOLEAN se, re;
    VIP_DESCRIPTOR *d = NULL;
    VIP_NET_ADDRESS *local = vt_addr_new(vt_loopback, 4, "l", 1);
    VIP_NET_ADDRESS *remote = vt_addr_new(vt_loopback, 4, "r", 1);

    memset(&va, 0, sizeof va);
    CHECK_RET(VIP_INVALID_PARAMETER, VipDestroyVi(h));
    CHECK_RET(VIP_INVALID_PARAMETER, VipQueryVi(h, &st, &va, &se, &re));
    va = vt_vi_attrs(VIP_SERVICE_UNRELIABLE, ptag, 65536, 0, 0);
    CHECK_RET(VIP_INVALID_PARAMETER, VipSetViAttributes(h, &va));
    CHECK_RET(VIP_INVALID_PARAMETER, VipPostSend(h, desc, dmh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipSendDone(h, &d));
    CHECK_RET(VIP_INVALID_PARAMETER, VipSendWait(h, 0, &d));
    CHECK_RET(VIP_INVALID_PARAMETER, VipSendNotify(h, NULL, NULL));
    CHECK_RET(VIP_INVALID_PARAMETER, VipPostRecv(h, desc, dmh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipRecvDone(h, &d));
    CHECK_RET(VIP_INVALID_PARAMETER, VipRecvWait(h, 0, &d));
    CHECK_RET(VIP_INVALID_PARAMETER, VipRecvNotify(h, NULL, NULL));
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectRequest(h, local, remote, 100, &va));
    CHECK_RET(VIP_INVALID_PARAMETER, VipDisconnect(h));
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectPeerRequest(h, local, remote, 100));
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectPeerDone(h, &va));
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectPeerWait(h, &va));
    CHECK(d == NULL);
    free(local);
    free(remote);
}

/* Every call that takes a CQ handle refuses h. */
static void cq_calls_refuse(VIP_CQ_HANDLE h)
{
    VIP_VI_HANDLE vi = NULL;
    VIP_BOOLEAN rq = VIP_FALSE;
    CHECK_RET(VIP_INVALID_PARAMETER, VipDestroyCQ(h));
    CHECK_RET(VIP_INVALID_PARAMETER, VipResizeCQ(h, 64));
    CHECK_RET(VIP_INVALID_PARAMETER, VipCQDone(h, &vi, &rq));
    CHECK_RET(VIP_INVALID_PARAMETER, VipCQWait(h, 0, &vi, &rq));
    CHECK_RET(VIP_INVALID_PARAMETER, VipCQNotify(h, NULL, NULL));
    CHECK(vi == NULL);
}

/* Every call that takes a connection handle refuses h. */
static void conn_calls_refuse(VIP_CONN_HANDLE h, VIP_VI_HANDLE idle_vi)
{
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectAccept(h, idle_vi));
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectReject(h));
}

/* Two VIs used by a second thread, in steps with the main thread. */
struct two_vis {
    VIP_VI_HANDLE destroyed_first, destroyed_second;
    int step;
};

static void step_to(struct two_vis *p, int step)
{
    __atomic_store_n(&p->step, step, __ATOMIC_RELEASE);
}

static void step_wait(struct two_vis *p, int step)
{
    while (__atomic_load_n(&p->step, __ATOMIC_ACQUIRE) != step)
        sched_yield();
}

static void *use_two_vis(void *arg)
{
    struct two_vis *p = arg;
    VIP_DESCRIPTOR *d = NULL;
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(p->destroyed_first, &d));
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(p->destroyed_second, &d));
    step_to(p, 1);
    step_wait(p, 2);
    CHECK_RET(VIP_INVALID_PARAMETER, VipRecvDone(p->destroyed_first, &d));
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(p->destroyed_second, &d));
    step_to(p, 3);
    step_wait(p, 4);
    CHECK_RET(VIP_INVALID_PARAMETER, VipRecvDone(p->destroyed_second, &d));
    CHECK(d == NULL);
    return NULL;
}

static void bad_handles(void)
{
    int local;
    make_forged(&local);
    printf("forged, stale and mixed-up handles\n");

    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    VIP_PROTECTION_HANDLE ptag;
    CHECK_OK(VipCreatePtag(nic, &ptag));
    vt_mem buf;
    vt_mem_reg(&buf, nic, ptag, 65536, 0, 0);
    vt_dpool dp;
    vt_dpool_init(&dp, nic, ptag, 4, 2);
    VIP_DESCRIPTOR *desc = vt_dpool_get(&dp, 0);
    vt_desc_recv(desc, buf.base, buf.mh, 64, 1);

    VIP_CQ_HANDLE cq;
    CHECK_OK(VipCreateCQ(nic, 64, &cq));
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(VIP_SERVICE_UNRELIABLE, ptag, 65536, 0, 0);
    VIP_VI_HANDLE vi;
    CHECK_OK(VipCreateVi(nic, &va, NULL, NULL, &vi));

    for (size_t i = 0; i < NFORGED; i++) {
        nic_calls_refuse(forged[i], ptag, buf.base, buf.mh);
        vi_calls_refuse(forged[i], ptag, desc, dp.mem.mh);
        cq_calls_refuse(forged[i]);
        conn_calls_refuse(forged[i], vi);
    }

    /* A handle of one kind is no handle of another kind. */
    nic_calls_refuse(vi, ptag, buf.base, buf.mh);
    nic_calls_refuse(cq, ptag, buf.base, buf.mh);
    vi_calls_refuse(nic, ptag, desc, dp.mem.mh);
    vi_calls_refuse(cq, ptag, desc, dp.mem.mh);
    cq_calls_refuse(vi);
    cq_calls_refuse(nic);
    conn_calls_refuse(vi, vi);
    conn_calls_refuse(nic, vi);

    /* Forged protection tags. */
    for (size_t i = 0; i < NFORGED; i++)
        CHECK_RET(VIP_INVALID_PARAMETER, VipDestroyPtag(nic, forged[i]));
    CHECK_RET(VIP_INVALID_PARAMETER, VipDestroyPtag(nic, vi));

    /* A forged CQ for a new VI. */
    VIP_VI_HANDLE vi2 = NULL;
    CHECK_RET(VIP_INVALID_PARAMETER, VipCreateVi(nic, &va, forged[1], NULL, &vi2));
    CHECK_RET(VIP_INVALID_PARAMETER, VipCreateVi(nic, &va, NULL, forged[2], &vi2));
    CHECK_RET(VIP_INVALID_PARAMETER, VipCreateVi(nic, &va, vi, NULL, &vi2));

    /* Stale handles: destroyed objects.  Each thread keeps the VIs it
     * used: a destroyed one is refused, by this thread and by another that
     * used it, while the others they used still work. */
    VIP_VI_HANDLE other;
    CHECK_OK(VipCreateVi(nic, &va, NULL, NULL, &other));
    VIP_DESCRIPTOR *nothing = NULL;
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(vi, &nothing));
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(other, &nothing));
    struct two_vis pair = {vi, other, 0};
    pthread_t user;
    CHECK(pthread_create(&user, NULL, use_two_vis, &pair) == 0);
    step_wait(&pair, 1);
    CHECK_OK(VipDestroyVi(vi));
    vi_calls_refuse(vi, ptag, desc, dp.mem.mh);
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(other, &nothing));
    step_to(&pair, 2);
    step_wait(&pair, 3);
    CHECK_OK(VipDestroyVi(other));
    step_to(&pair, 4);
    CHECK(pthread_join(user, NULL) == 0);
    CHECK_RET(VIP_INVALID_PARAMETER, VipRecvDone(other, &nothing));
    conn_calls_refuse(forged[1], vi);
    CHECK_OK(VipDestroyCQ(cq));
    cq_calls_refuse(cq);

    /* A new object does not bring the old handle back. */
    VIP_VI_HANDLE vi3;
    CHECK_OK(VipCreateVi(nic, &va, NULL, NULL, &vi3));
    vi_calls_refuse(vi, ptag, desc, dp.mem.mh);
    CHECK_STATE(VIP_STATE_IDLE, vi3);
    VIP_CQ_HANDLE cq3;
    CHECK_OK(VipCreateCQ(nic, 64, &cq3));
    cq_calls_refuse(cq);

    VIP_PROTECTION_HANDLE p2;
    CHECK_OK(VipCreatePtag(nic, &p2));
    CHECK_OK(VipDestroyPtag(nic, p2));
    CHECK_RET(VIP_INVALID_PARAMETER, VipDestroyPtag(nic, p2));

    /* Closing the NIC frees what is still open on it: its VIs and CQs are
     * stale afterwards, and so is the NIC, even the VI and CQ this thread
     * polled last. */
    VIP_DESCRIPTOR *none = NULL;
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(vi3, &none));
    VIP_VI_HANDLE from_cq = NULL;
    CHECK_RET(VIP_NOT_DONE, VipCQDone(cq3, &from_cq, &(VIP_BOOLEAN){0}));
    CHECK_OK(VipCloseNic(nic));
    CHECK_RET(VIP_INVALID_PARAMETER, VipRecvDone(vi3, &none));
    CHECK_RET(VIP_INVALID_PARAMETER, VipCQDone(cq3, &from_cq, &(VIP_BOOLEAN){0}));
    vi_calls_refuse(vi3, ptag, desc, dp.mem.mh);
    cq_calls_refuse(cq3);
    nic_calls_refuse(nic, ptag, buf.base, buf.mh);
    free(buf.base);
    free(dp.mem.base);
}

/* ------------------------------------------------------------------ */

static void null_outputs(void)
{
    printf("NULL pointers\n");
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    VIP_PROTECTION_HANDLE ptag;
    CHECK_RET(VIP_INVALID_PARAMETER, VipCreatePtag(nic, NULL));
    CHECK_OK(VipCreatePtag(nic, &ptag));

    vt_mem buf;
    vt_mem_reg(&buf, nic, ptag, 65536, 0, 0);
    VIP_MEM_ATTRIBUTES ma = {ptag, VIP_FALSE, VIP_FALSE};
    VIP_MEM_HANDLE mh;
    CHECK_RET(VIP_INVALID_PARAMETER, VipRegisterMem(nic, buf.base, 4096, &ma, NULL));
    CHECK_RET(VIP_INVALID_PARAMETER, VipRegisterMem(nic, buf.base, 4096, NULL, &mh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipQueryMem(nic, buf.base, buf.mh, NULL));
    CHECK_RET(VIP_INVALID_PARAMETER, VipSetMemAttributes(nic, buf.base, buf.mh, NULL));

    VIP_CQ_HANDLE cq;
    CHECK_RET(VIP_INVALID_PARAMETER, VipCreateCQ(nic, 16, NULL));
    CHECK_OK(VipCreateCQ(nic, 16, &cq));
    VIP_VI_HANDLE vh = NULL;
    VIP_BOOLEAN rq;
    CHECK_RET(VIP_INVALID_PARAMETER, VipCQDone(cq, NULL, &rq));
    CHECK_RET(VIP_INVALID_PARAMETER, VipCQDone(cq, &vh, NULL));
    CHECK_RET(VIP_INVALID_PARAMETER, VipCQWait(cq, 0, NULL, &rq));
    CHECK_RET(VIP_INVALID_PARAMETER, VipCQWait(cq, 0, &vh, NULL));

    VIP_VI_ATTRIBUTES va = vt_vi_attrs(VIP_SERVICE_RELIABLE_DELIVERY, ptag, 65536, 0, 0);
    VIP_VI_HANDLE vi;
    CHECK_RET(VIP_INVALID_PARAMETER, VipCreateVi(nic, NULL, NULL, NULL, &vi));
    CHECK_RET(VIP_INVALID_PARAMETER, VipCreateVi(nic, &va, NULL, NULL, NULL));
    CHECK_OK(VipCreateVi(nic, &va, cq, cq, &vi));

    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES got;
    VIP_BOOLEAN se, re;
    CHECK_RET(VIP_INVALID_PARAMETER, VipQueryVi(vi, NULL, &got, &se, &re));
    CHECK_RET(VIP_INVALID_PARAMETER, VipQueryVi(vi, &st, NULL, &se, &re));
    CHECK_RET(VIP_INVALID_PARAMETER, VipQueryVi(vi, &st, &got, NULL, &re));
    CHECK_RET(VIP_INVALID_PARAMETER, VipQueryVi(vi, &st, &got, &se, NULL));
    CHECK_RET(VIP_INVALID_PARAMETER, VipSetViAttributes(vi, NULL));

    vt_dpool dp;
    vt_dpool_init(&dp, nic, ptag, 4, 2);
    CHECK_RET(VIP_INVALID_PARAMETER, VipPostSend(vi, NULL, dp.mem.mh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipPostRecv(vi, NULL, dp.mem.mh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipSendDone(vi, NULL));
    CHECK_RET(VIP_INVALID_PARAMETER, VipSendWait(vi, 0, NULL));
    CHECK_RET(VIP_INVALID_PARAMETER, VipRecvDone(vi, NULL));
    CHECK_RET(VIP_INVALID_PARAMETER, VipRecvWait(vi, 0, NULL));

    char disc[VT_MAX_DISC];
    vt_disc(disc, sizeof disc, "nulls");
    VIP_NET_ADDRESS *local = vt_addr_local(nic, disc);
    VIP_NET_ADDRESS *remote = vt_addr_buf();
    VIP_CONN_HANDLE conn;
    VIP_VI_ATTRIBUTES ra;
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectWait(nic, NULL, 0, remote, &ra, &conn));
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectWait(nic, local, 0, NULL, &ra, &conn));
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectWait(nic, local, 0, remote, NULL, &conn));
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectWait(nic, local, 0, remote, &ra, NULL));
    VIP_NET_ADDRESS *target = vt_addr_local(nic, "nobody-listens");
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectRequest(vi, NULL, target, 100, &ra));
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectRequest(vi, local, NULL, 100, &ra));
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectRequest(vi, local, target, 100, NULL));
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectRequest(vi, local, target, 0, &ra));
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectPeerRequest(vi, NULL, target, 100));
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectPeerRequest(vi, local, NULL, 100));
    CHECK_RET(VIP_INVALID_PARAMETER, VipConnectPeerRequest(vi, local, target, 0));
    CHECK_STATE(VIP_STATE_IDLE, vi);

    CHECK_OK(VipNSInit(nic, NULL));
    VIP_NET_ADDRESS *ns = vt_addr_buf();
    char name[256];
    VIP_ULONG namelen = sizeof name;
    CHECK_RET(VIP_INVALID_PARAMETER, VipNSGetHostByName(nic, NULL, ns, 0));
    CHECK_RET(VIP_INVALID_PARAMETER, VipNSGetHostByName(nic, "localhost", NULL, 0));
    CHECK_RET(VIP_INVALID_PARAMETER, VipNSGetHostByAddr(nic, NULL, name, &namelen));
    CHECK_RET(VIP_INVALID_PARAMETER, VipNSGetHostByAddr(nic, local, NULL, &namelen));
    CHECK_RET(VIP_INVALID_PARAMETER, VipNSGetHostByAddr(nic, local, name, NULL));
    CHECK_OK(VipNSShutdown(nic));
    CHECK_RET(VIP_INVALID_PARAMETER, VipQuerySystemManagementInfo(nic, VIP_SMI_AUTODISCOVERY, NULL));
    VIP_NET_ADDRESS *ad[1] = {vt_addr_buf()};
    VIP_AUTODISCOVERY_LIST list = {0, ad, 1};
    CHECK_RET(VIP_INVALID_PARAMETER, VipQuerySystemManagementInfo(nic, 0, &list));
    CHECK_RET(VIP_INVALID_PARAMETER, VipQuerySystemManagementInfo(nic, 99, &list));

    /* A NULL error handler restores the default one. */
    CHECK_OK(VipErrorCallback(nic, NULL, NULL));

    CHECK_OK(VipDestroyVi(vi));
    CHECK_OK(VipDestroyCQ(cq));
    vt_dpool_fini(&dp);
    vt_mem_dereg(&buf);
    CHECK_OK(VipDestroyPtag(nic, ptag));
    CHECK_OK(VipCloseNic(nic));
    free(local);
    free(remote);
    free(target);
    free(ns);
    free(ad[0]);
}

/* ------------------------------------------------------------------ */

static void states(void)
{
    printf("state rules\n");
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    VIP_PROTECTION_HANDLE ptag, ptag2;
    CHECK_OK(VipCreatePtag(nic, &ptag));
    CHECK_OK(VipCreatePtag(nic, &ptag2));
    vt_mem buf;
    vt_mem_reg(&buf, nic, ptag, 65536, 0, 0);
    vt_dpool dp;
    vt_dpool_init(&dp, nic, ptag, 8, 2);
    VIP_CQ_HANDLE cq;
    CHECK_OK(VipCreateCQ(nic, 64, &cq));

    VIP_VI_ATTRIBUTES va = vt_vi_attrs(VIP_SERVICE_RELIABLE_DELIVERY, ptag, 65536, 1, 1);
    VIP_VI_HANDLE vi;
    CHECK_OK(VipCreateVi(nic, &va, cq, NULL, &vi));

    /* A fresh VI: idle, its attributes, empty queues. */
    VIP_VI_STATE st = VIP_STATE_ERROR;
    VIP_VI_ATTRIBUTES got;
    VIP_BOOLEAN se = VIP_FALSE, re = VIP_FALSE;
    CHECK_OK(VipQueryVi(vi, &st, &got, &se, &re));
    CHECK_EQ(VIP_STATE_IDLE, st);
    CHECK_EQ(VIP_SERVICE_RELIABLE_DELIVERY, got.ReliabilityLevel);
    CHECK_EQ(65536, got.MaxTransferSize);
    CHECK_PTR(ptag, got.Ptag);
    CHECK_PTR(NULL, got.QoS);
    CHECK_EQ(VIP_TRUE, got.EnableRdmaWrite);
    CHECK_EQ(VIP_TRUE, got.EnableRdmaRead);
    CHECK_EQ(VIP_TRUE, se);
    CHECK_EQ(VIP_TRUE, re);

    /* Idle VI: no sends, no disconnect. */
    VIP_DESCRIPTOR *d = vt_dpool_get(&dp, 0);
    vt_desc_send(d, 0, 0, buf.base, buf.mh, 16, 1);
    CHECK_RET(VIP_INVALID_STATE, VipPostSend(vi, d, dp.mem.mh));
    CHECK_RET(VIP_INVALID_STATE, VipDisconnect(vi));
    CHECK_OK(VipQueryVi(vi, &st, &got, &se, &re));
    CHECK_EQ(VIP_TRUE, se);

    /* Attributes may be changed while idle; a ptag used by a VI is busy. */
    VIP_VI_ATTRIBUTES nv = vt_vi_attrs(VIP_SERVICE_UNRELIABLE, ptag2, 8192, 0, 0);
    CHECK_OK(VipSetViAttributes(vi, &nv));
    CHECK_OK(VipQueryVi(vi, &st, &got, &se, &re));
    CHECK_EQ(VIP_STATE_IDLE, st);
    CHECK_EQ(VIP_SERVICE_UNRELIABLE, got.ReliabilityLevel);
    CHECK_EQ(8192, got.MaxTransferSize);
    CHECK_PTR(ptag2, got.Ptag);
    CHECK_EQ(VIP_FALSE, got.EnableRdmaWrite);
    CHECK_EQ(VIP_FALSE, got.EnableRdmaRead);
    CHECK_RET(VIP_INVALID_STATE, VipDestroyPtag(nic, ptag2));
    CHECK_OK(VipSetViAttributes(vi, &va));
    CHECK_OK(VipQueryVi(vi, &st, &got, &se, &re));
    CHECK_EQ(VIP_SERVICE_RELIABLE_DELIVERY, got.ReliabilityLevel);
    CHECK_EQ(65536, got.MaxTransferSize);
    CHECK_PTR(ptag, got.Ptag);
    CHECK_OK(VipDestroyPtag(nic, ptag2));

    /* Receives may be posted while idle; they stay posted. */
    VIP_DESCRIPTOR *r = vt_dpool_get(&dp, 1);
    vt_desc_recv(r, buf.base, buf.mh, 1024, 1);
    CHECK_OK(VipPostRecv(vi, r, dp.mem.mh));
    CHECK_OK(VipQueryVi(vi, &st, &got, &se, &re));
    CHECK_EQ(VIP_STATE_IDLE, st);
    CHECK_EQ(VIP_FALSE, re);
    VIP_DESCRIPTOR *out = NULL;
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(vi, &out));
    CHECK_RET(VIP_TIMEOUT, VipRecvWait(vi, 10, &out));

    /* Objects in use cannot be destroyed: the CQ (a VI's send CQ) and the
     * ptag (the VI's and the memory's). */
    CHECK_RET(VIP_INVALID_STATE, VipDestroyCQ(cq));
    CHECK_RET(VIP_INVALID_STATE, VipDestroyPtag(nic, ptag));

    CHECK_OK(VipDestroyVi(vi));
    CHECK_OK(VipDestroyCQ(cq));
    /* The memory still uses ptag. */
    CHECK_RET(VIP_INVALID_STATE, VipDestroyPtag(nic, ptag));
    vt_dpool_fini(&dp);
    vt_mem_dereg(&buf);
    CHECK_OK(VipDestroyPtag(nic, ptag));
    CHECK_OK(VipCloseNic(nic));
}

/* ------------------------------------------------------------------ */

static void vi_attributes(void)
{
    printf("VI attribute rules\n");
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    VIP_PROTECTION_HANDLE ptag;
    CHECK_OK(VipCreatePtag(nic, &ptag));
    VIP_VI_HANDLE vi = NULL;
    VIP_VI_ATTRIBUTES va;

    static const VIP_RELIABILITY_LEVEL bad_levels[] = {0, 3, 5, 6, 7, 8, 0x100, 0xFFFF};
    for (size_t i = 0; i < sizeof bad_levels / sizeof bad_levels[0]; i++) {
        va = vt_vi_attrs(bad_levels[i], ptag, 65536, 0, 0);
        CHECK_RET(VIP_INVALID_RELIABILITY_LEVEL, VipCreateVi(nic, &va, NULL, NULL, &vi));
    }
    va = vt_vi_attrs(VIP_SERVICE_RELIABLE_DELIVERY, ptag, 0, 0, 0);
    CHECK_RET(VIP_INVALID_MTU, VipCreateVi(nic, &va, NULL, NULL, &vi));
    va = vt_vi_attrs(VIP_SERVICE_RELIABLE_DELIVERY, ptag, VT_MAX_TRANSFER + 1, 0, 0);
    CHECK_RET(VIP_INVALID_MTU, VipCreateVi(nic, &va, NULL, NULL, &vi));
    va = vt_vi_attrs(VIP_SERVICE_UNRELIABLE, ptag, 65536, 0, VIP_TRUE);
    CHECK_RET(VIP_INVALID_RDMAREAD, VipCreateVi(nic, &va, NULL, NULL, &vi));
    int qos = 1;
    va = vt_vi_attrs(VIP_SERVICE_UNRELIABLE, ptag, 65536, 0, 0);
    va.QoS = &qos;
    CHECK_RET(VIP_INVALID_QOS, VipCreateVi(nic, &va, NULL, NULL, &vi));
    int local;
    va = vt_vi_attrs(VIP_SERVICE_UNRELIABLE, &local, 65536, 0, 0);
    CHECK_RET(VIP_INVALID_PTAG, VipCreateVi(nic, &va, NULL, NULL, &vi));
    va = vt_vi_attrs(VIP_SERVICE_UNRELIABLE, (void *)0x1234, 65536, 0, 0);
    CHECK_RET(VIP_INVALID_PTAG, VipCreateVi(nic, &va, NULL, NULL, &vi));
    CHECK(vi == NULL);

    /* Every valid combination works; the limits themselves are valid. */
    static const VIP_RELIABILITY_LEVEL levels[] = {
        VIP_SERVICE_UNRELIABLE, VIP_SERVICE_RELIABLE_DELIVERY, VIP_SERVICE_RELIABLE_RECEPTION};
    for (size_t i = 0; i < 3; i++) {
        VIP_BOOLEAN rd = levels[i] != VIP_SERVICE_UNRELIABLE;
        static const VIP_ULONG mtus[] = {1, 4096, VT_MAX_TRANSFER};
        for (size_t m = 0; m < 3; m++) {
            va = vt_vi_attrs(levels[i], ptag, mtus[m], VIP_TRUE, rd);
            CHECK_OK(VipCreateVi(nic, &va, NULL, NULL, &vi));
            VIP_VI_STATE st;
            VIP_VI_ATTRIBUTES got;
            VIP_BOOLEAN se, re;
            CHECK_OK(VipQueryVi(vi, &st, &got, &se, &re));
            CHECK_EQ(levels[i], got.ReliabilityLevel);
            CHECK_EQ(mtus[m], got.MaxTransferSize);
            CHECK_EQ(rd, got.EnableRdmaRead);
            CHECK_OK(VipDestroyVi(vi));
        }
    }

    /* The same rules when changing the attributes of an idle VI. */
    va = vt_vi_attrs(VIP_SERVICE_RELIABLE_DELIVERY, ptag, 65536, 0, 0);
    CHECK_OK(VipCreateVi(nic, &va, NULL, NULL, &vi));
    VIP_VI_ATTRIBUTES bad = vt_vi_attrs(3, ptag, 65536, 0, 0);
    CHECK_RET(VIP_INVALID_RELIABILITY_LEVEL, VipSetViAttributes(vi, &bad));
    bad = vt_vi_attrs(VIP_SERVICE_RELIABLE_DELIVERY, ptag, 0, 0, 0);
    CHECK_RET(VIP_INVALID_MTU, VipSetViAttributes(vi, &bad));
    bad = vt_vi_attrs(VIP_SERVICE_UNRELIABLE, ptag, 65536, 0, VIP_TRUE);
    CHECK_RET(VIP_INVALID_RDMAREAD, VipSetViAttributes(vi, &bad));
    CHECK_OK(VipDestroyVi(vi));

    CHECK_OK(VipDestroyPtag(nic, ptag));
    CHECK_OK(VipCloseNic(nic));
}

/* ------------------------------------------------------------------ */

static void timeouts(void)
{
    printf("timeouts on empty queues\n");
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    VIP_PROTECTION_HANDLE ptag;
    CHECK_OK(VipCreatePtag(nic, &ptag));
    VIP_CQ_HANDLE cq;
    CHECK_OK(VipCreateCQ(nic, 16, &cq));
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(VIP_SERVICE_RELIABLE_DELIVERY, ptag, 65536, 0, 0);
    VIP_VI_HANDLE vi;
    CHECK_OK(VipCreateVi(nic, &va, NULL, NULL, &vi));
    VIP_DESCRIPTOR *d = NULL;

    CHECK_RET(VIP_NOT_DONE, VipRecvDone(vi, &d));
    CHECK_RET(VIP_NOT_DONE, VipSendDone(vi, &d));
    VIP_VI_HANDLE cvi = NULL;
    VIP_BOOLEAN rq;
    CHECK_RET(VIP_NOT_DONE, VipCQDone(cq, &cvi, &rq));

    double t0 = vt_now_ms();
    CHECK_RET(VIP_TIMEOUT, VipRecvWait(vi, 0, &d));
    CHECK_RET(VIP_TIMEOUT, VipSendWait(vi, 0, &d));
    CHECK_RET(VIP_TIMEOUT, VipCQWait(cq, 0, &cvi, &rq));
    double polled = vt_now_ms() - t0;
    CHECK(polled < 40);

    t0 = vt_now_ms();
    CHECK_RET(VIP_TIMEOUT, VipRecvWait(vi, 50, &d));
    double waited = vt_now_ms() - t0;
    printf("  VipRecvWait(50 ms) returned after %.1f ms\n", waited);
    CHECK(waited >= 49.0);
    CHECK(waited < 5000.0);

    t0 = vt_now_ms();
    CHECK_RET(VIP_TIMEOUT, VipSendWait(vi, 30, &d));
    waited = vt_now_ms() - t0;
    CHECK(waited >= 29.0 && waited < 5000.0);

    t0 = vt_now_ms();
    CHECK_RET(VIP_TIMEOUT, VipCQWait(cq, 50, &cvi, &rq));
    waited = vt_now_ms() - t0;
    CHECK(waited >= 49.0 && waited < 5000.0);
    CHECK(d == NULL);

    CHECK_OK(VipDestroyVi(vi));
    CHECK_OK(VipDestroyCQ(cq));
    CHECK_OK(VipDestroyPtag(nic, ptag));
    CHECK_OK(VipCloseNic(nic));
}

/* ------------------------------------------------------------------ */

static void descriptors(void)
{
    printf("descriptor checks at post time\n");
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    VIP_PROTECTION_HANDLE ptag, other;
    CHECK_OK(VipCreatePtag(nic, &ptag));
    CHECK_OK(VipCreatePtag(nic, &other));
    vt_mem buf;
    vt_mem_reg(&buf, nic, ptag, 1 << 20, 0, 0);
    vt_dpool dp, dp2, foreign;
    vt_dpool_init(&dp, nic, ptag, VT_MAX_DESC_PER_Q + 2, 1);
    vt_dpool_init(&dp2, nic, ptag, 4, 2);
    vt_dpool_init(&foreign, nic, other, 4, 2);
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(VIP_SERVICE_RELIABLE_DELIVERY, ptag, 65536, 0, 0);
    VIP_VI_HANDLE vi;
    CHECK_OK(VipCreateVi(nic, &va, NULL, NULL, &vi));

    /* Not 64-byte aligned (but inside the registered region). */
    VIP_DESCRIPTOR *mis = (VIP_DESCRIPTOR *)(void *)(dp2.mem.base + 64 + 8);
    vt_desc_recv(mis, buf.base, buf.mh, 64, 1);
    CHECK_RET(VIP_DESCRIPTOR_ERROR, VipPostRecv(vi, mis, dp2.mem.mh));
    mis = (VIP_DESCRIPTOR *)(void *)(dp2.mem.base + 32);
    vt_desc_recv(mis, buf.base, buf.mh, 64, 1);
    CHECK_RET(VIP_DESCRIPTOR_ERROR, VipPostRecv(vi, mis, dp2.mem.mh));

    /* Aligned, but in memory that is not registered. */
    VIP_DESCRIPTOR *unreg = vt_alloc(4096);
    vt_desc_recv(unreg, buf.base, buf.mh, 64, 1);
    CHECK_RET(VIP_DESCRIPTOR_ERROR, VipPostRecv(vi, unreg, dp2.mem.mh));
    CHECK_RET(VIP_DESCRIPTOR_ERROR, VipPostRecv(vi, unreg, buf.mh));

    /* Registered, but the memory handle is another region's, or forged. */
    VIP_DESCRIPTOR *good = vt_dpool_get(&dp2, 0);
    vt_desc_recv(good, buf.base, buf.mh, 64, 1);
    CHECK_RET(VIP_DESCRIPTOR_ERROR, VipPostRecv(vi, good, buf.mh));
    CHECK_RET(VIP_DESCRIPTOR_ERROR, VipPostRecv(vi, good, dp.mem.mh));
    CHECK_RET(VIP_DESCRIPTOR_ERROR, VipPostRecv(vi, good, 0));
    CHECK_RET(VIP_DESCRIPTOR_ERROR, VipPostRecv(vi, good, 0xDEADBEEF));
    CHECK_RET(VIP_DESCRIPTOR_ERROR, VipPostRecv(vi, good, dp2.mem.mh ^ 0x00010000));

    /* Registered with a protection tag that is not the VI's. */
    VIP_DESCRIPTOR *fd = vt_dpool_get(&foreign, 0);
    vt_desc_recv(fd, buf.base, buf.mh, 64, 1);
    CHECK_RET(VIP_DESCRIPTOR_ERROR, VipPostRecv(vi, fd, foreign.mem.mh));

    /* None of those reached the queue. */
    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES got;
    VIP_BOOLEAN se, re;
    CHECK_OK(VipQueryVi(vi, &st, &got, &se, &re));
    CHECK_EQ(VIP_TRUE, re);

    /* A full receive queue: 1024 posted, the next one is refused. */
    for (size_t i = 0; i < VT_MAX_DESC_PER_Q; i++) {
        VIP_DESCRIPTOR *d = vt_dpool_get(&dp, i);
        vt_desc_recv(d, buf.base + 64 * i, buf.mh, 64, 1);
        CHECK_OK(VipPostRecv(vi, d, dp.mem.mh));
    }
    VIP_DESCRIPTOR *extra = vt_dpool_get(&dp, VT_MAX_DESC_PER_Q);
    vt_desc_recv(extra, buf.base, buf.mh, 64, 1);
    CHECK_RET(VIP_ERROR_RESOURCE, VipPostRecv(vi, extra, dp.mem.mh));
    CHECK_RET(VIP_ERROR_RESOURCE, VipPostRecv(vi, extra, dp.mem.mh));
    CHECK_OK(VipQueryVi(vi, &st, &got, &se, &re));
    CHECK_EQ(VIP_FALSE, re);
    CHECK_EQ(VIP_STATE_IDLE, st);
    VIP_DESCRIPTOR *out = NULL;
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(vi, &out));

    CHECK_OK(VipDestroyVi(vi));
    free(unreg);
    vt_dpool_fini(&foreign);
    vt_dpool_fini(&dp2);
    vt_dpool_fini(&dp);
    vt_mem_dereg(&buf);
    CHECK_OK(VipDestroyPtag(nic, other));
    CHECK_OK(VipDestroyPtag(nic, ptag));
    CHECK_OK(VipCloseNic(nic));
}

int main(void)
{
    vt_init();
    nic_open_and_query();
    bad_handles();
    null_outputs();
    states();
    vi_attributes();
    timeouts();
    descriptors();
    printf("api_errors: ok\n");
    return 0;
}
