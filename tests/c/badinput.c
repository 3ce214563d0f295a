/*
 * badinput.c - bad input from the application gets the specification's
 * error and never a crash.
 *
 * - VipRegisterMem refuses memory that is not entirely mapped readable and
 *   writable with VIP_INVALID_PARAMETER: an unmapped range, a PROT_NONE
 *   page, a PROT_READ page, a range whose second page is unmapped, a huge
 *   range; malloc'd and mmap'd memory, and a range over several mappings
 *   that are all readable and writable, still register.
 * - A descriptor posted again before it completed is refused with
 *   VIP_INVALID_PARAMETER (VipPostRecv; VipPostSend where the first send is
 *   still pending); once it completed it posts again; nothing completes
 *   twice.
 * - A receive posted, then its buffer's region deregistered and unmapped:
 *   the message that arrives completes the receive with an error status
 *   (PROTECTION_ERROR where the receiver places the bytes itself; where the
 *   sender writes them by cross-memory attach its write fails and the
 *   connection breaks: DESC_FLUSHED_ERROR).  A receive whose descriptor's
 *   own region went that way is handed back unwritten.
 * - A descriptor whose own region is deregistered and unmapped while it is
 *   posted is handed back unwritten however it completes: a receive
 *   flushed by VipDisconnect, or by the peer's disconnect (the provider's
 *   thread flushes it), or completed with its content error after the
 *   receive ahead of it; a send still at the doorbell (VIA_DOORBELL=d1/d2)
 *   when its region goes.  Nothing crashes, and VipRecvDone/VipSendDone
 *   return it in its turn.  (Over the network, where sends are pending
 *   until acknowledged and receives are placed from packets: the cluster
 *   case `deregistered`, tests/cluster/gone.c.)
 */
#include "vt.h"

#include <sys/mman.h>

#define U  VIP_SERVICE_UNRELIABLE
#define RD VIP_SERVICE_RELIABLE_DELIVERY
#define RR VIP_SERVICE_RELIABLE_RECEPTION

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static VIP_UINT8 *map_pages(size_t n)
{
    void *p = mmap(NULL, n * page_size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        VT_FAIL("mmap: %s", strerror(errno));
    return p;
}

/* ------------------------------------------------------------------ */
/* VipRegisterMem and the mappings of the process                       */
/* ------------------------------------------------------------------ */

static void registration(void)
{
    printf("  registration checks the mappings\n");
    const size_t pg = page_size();
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    VIP_PROTECTION_HANDLE ptag;
    CHECK_OK(VipCreatePtag(nic, &ptag));
    VIP_MEM_ATTRIBUTES ma = {ptag, VIP_FALSE, VIP_FALSE};
    VIP_MEM_HANDLE mh = 0;

    /* Unmapped: mapped, then unmapped again. */
    VIP_UINT8 *gone = map_pages(2);
    CHECK(munmap(gone, 2 * pg) == 0);
    CHECK_RET(VIP_INVALID_PARAMETER, VipRegisterMem(nic, gone, pg, &ma, &mh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipRegisterMem(nic, gone + 100, 10, &ma, &mh));

    /* Page 0 fine, page 1 PROT_NONE, page 2 PROT_READ, page 3 unmapped. */
    VIP_UINT8 *p = map_pages(4);
    CHECK(mprotect(p + pg, pg, PROT_NONE) == 0);
    CHECK(mprotect(p + 2 * pg, pg, PROT_READ) == 0);
    CHECK(munmap(p + 3 * pg, pg) == 0);
    CHECK_RET(VIP_INVALID_PARAMETER, VipRegisterMem(nic, p + pg, pg, &ma, &mh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipRegisterMem(nic, p + 2 * pg, pg, &ma, &mh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipRegisterMem(nic, p + 2 * pg + 17, 1, &ma, &mh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipRegisterMem(nic, p + 3 * pg, pg, &ma, &mh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipRegisterMem(nic, p, 2 * pg, &ma, &mh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipRegisterMem(nic, p + pg - 1, 2, &ma, &mh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipRegisterMem(nic, p, 4 * pg, &ma, &mh));
    mh = 0;
    CHECK_OK(VipRegisterMem(nic, p, pg, &ma, &mh));
    CHECK(mh != 0);
    CHECK_OK(VipDeregisterMem(nic, p, mh));

    /* Two pages whose second one is unmapped. */
    VIP_UINT8 *half = map_pages(2);
    CHECK(munmap(half + pg, pg) == 0);
    CHECK_RET(VIP_INVALID_PARAMETER, VipRegisterMem(nic, half, 2 * pg, &ma, &mh));
    CHECK_OK(VipRegisterMem(nic, half, pg, &ma, &mh));
    CHECK_OK(VipDeregisterMem(nic, half, mh));

    /* Huge, and wrapping around the address space. */
    VIP_UINT8 *heap = malloc(10000);
    CHECK(heap != NULL);
    CHECK_RET(VIP_INVALID_PARAMETER, VipRegisterMem(nic, heap, (VIP_ULONG)1 << 39, &ma, &mh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipRegisterMem(nic, (void *)(uintptr_t)-4096, 8192, &ma, &mh));

    /* Usable memory still registers: malloc'd (unaligned), mmap'd, and a
     * range over three mappings that are all readable and writable. */
    CHECK_OK(VipRegisterMem(nic, heap + 3, 9000, &ma, &mh));
    CHECK_OK(VipDeregisterMem(nic, heap + 3, mh));
    VIP_UINT8 *big = map_pages(256);
    CHECK_OK(VipRegisterMem(nic, big, 256 * pg, &ma, &mh));
    CHECK_OK(VipDeregisterMem(nic, big, mh));
    /* MADV_DONTFORK on the middle page splits the mapping in three. */
    CHECK(madvise(big + pg, pg, MADV_DONTFORK) == 0);
    CHECK_OK(VipRegisterMem(nic, big, 3 * pg, &ma, &mh));
    CHECK_OK(VipDeregisterMem(nic, big, mh));

    /* Refused registrations left nothing behind: the ptag goes. */
    CHECK_OK(VipDestroyPtag(nic, ptag));
    CHECK_OK(VipCloseNic(nic));
    CHECK(munmap(p, 3 * pg) == 0);
    CHECK(munmap(half, pg) == 0);
    CHECK(munmap(big, 256 * pg) == 0);
    free(heap);
}

/* ------------------------------------------------------------------ */
/* The client sends what the server asks for                            */
/* ------------------------------------------------------------------ */

#define CMD_END 0
#define CMD_TWICE 1000000 /* twice_client: one descriptor posted twice */
/* Any other command: send that many bytes, then report how it went. */

static void client_sends(vt_end *e)
{
    VIP_DESCRIPTOR *d = vt_dpool_get(&e->descs, 0);
    for (;;) {
        uint64_t len = vt_get_u64(e->fd);
        if (len == CMD_END)
            return;
        vt_fill(e->buf.base, (size_t)len, (uint32_t)len);
        vt_desc_send(d, 0, 0, e->buf.base, e->buf.mh, (size_t)len, 1);
        CHECK_OK(VipPostSend(e->vi, d, e->descs.mem.mh));
        VIP_DESCRIPTOR *got = vt_send_wait(e->vi);
        CHECK_PTR(d, got);
        CHECK(got->CS.Status & VIP_STATUS_DONE);
        vt_put_u64(e->fd, got->CS.Status);
    }
}

static void ask(vt_end *e, uint64_t len)
{
    vt_put_u64(e->fd, len);
    (void)vt_get_u64(e->fd); /* the sender's status: it may have failed */
}

static void post_recv(vt_end *e, VIP_DESCRIPTOR *d, VIP_MEM_HANDLE dmh, void *buf, VIP_MEM_HANDLE bmh,
                      size_t len)
{
    vt_desc_recv(d, buf, bmh, len, 1);
    CHECK_OK(VipPostRecv(e->vi, d, dmh));
}

static void expect_good(vt_end *e, VIP_DESCRIPTOR *d, void *buf, size_t len)
{
    VIP_DESCRIPTOR *got = vt_recv_wait(e->vi);
    CHECK_PTR(d, got);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, got);
    CHECK_EQ(len, got->CS.Length);
    CHECK_PATTERN(buf, len, (uint32_t)len);
}

static void expect_nothing_more(vt_end *e)
{
    VIP_DESCRIPTOR *d = NULL;
    CHECK_RET(VIP_NOT_DONE, VipRecvDone(e->vi, &d));
    CHECK(d == NULL);
}

/* ------------------------------------------------------------------ */
/* The same descriptor posted twice                                     */
/* ------------------------------------------------------------------ */

static void twice_server(vt_end *e)
{
    VIP_DESCRIPTOR *a = vt_dpool_get(&e->descs, 0), *b = vt_dpool_get(&e->descs, 1);
    VIP_DESCRIPTOR *c = vt_dpool_get(&e->descs, 2);
    VIP_MEM_HANDLE dmh = e->descs.mem.mh;
    VIP_UINT8 *buf = e->buf.base;

    post_recv(e, a, dmh, buf, e->buf.mh, 64);
    CHECK_RET(VIP_INVALID_PARAMETER, VipPostRecv(e->vi, a, dmh));
    post_recv(e, b, dmh, buf + 64, e->buf.mh, 64);
    CHECK_RET(VIP_INVALID_PARAMETER, VipPostRecv(e->vi, a, dmh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipPostRecv(e->vi, b, dmh));
    /* A copy of a posted descriptor elsewhere is another descriptor. */
    memcpy(c, a, sizeof(VIP_CONTROL_SEGMENT) + sizeof(VIP_DESCRIPTOR_SEGMENT));
    vt_seg(c, 0)->Local.Data.Address = buf + 128;
    CHECK_OK(VipPostRecv(e->vi, c, dmh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipPostRecv(e->vi, c, dmh));

    ask(e, 10);
    ask(e, 20);
    ask(e, 30);
    expect_good(e, a, buf, 10);
    expect_good(e, b, buf + 64, 20);
    expect_good(e, c, buf + 128, 30);
    expect_nothing_more(e);

    /* Complete: it posts again, and completes once more. */
    vt_desc_recv(a, buf, e->buf.mh, 64, 1);
    CHECK_OK(VipPostRecv(e->vi, a, dmh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipPostRecv(e->vi, a, dmh));
    ask(e, 40);
    expect_good(e, a, buf, 40);
    expect_nothing_more(e);

    /* The client posts one send descriptor twice (CMD_TWICE): two
     * messages, whether the second post was taken or refused. */
    VIP_DESCRIPTOR *r1 = vt_dpool_get(&e->descs, 3), *r2 = vt_dpool_get(&e->descs, 4);
    post_recv(e, r1, dmh, buf + 256, e->buf.mh, 64);
    post_recv(e, r2, dmh, buf + 320, e->buf.mh, 64);
    ask(e, CMD_TWICE);
    expect_good(e, r1, buf + 256, 8);
    expect_good(e, r2, buf + 320, 8);
    expect_nothing_more(e);
    vt_put_u64(e->fd, CMD_END);
}

static void twice_client(vt_end *e)
{
    VIP_DESCRIPTOR *d = vt_dpool_get(&e->descs, 0);
    for (;;) {
        uint64_t len = vt_get_u64(e->fd);
        if (len == CMD_END)
            return;
        if (len != CMD_TWICE) {
            vt_fill(e->buf.base, (size_t)len, (uint32_t)len);
            vt_desc_send(d, 0, 0, e->buf.base, e->buf.mh, (size_t)len, 1);
            CHECK_OK(VipPostSend(e->vi, d, e->descs.mem.mh));
            VIP_DESCRIPTOR *got = vt_send_wait(e->vi);
            CHECK_PTR(d, got);
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
            vt_put_u64(e->fd, got->CS.Status);
            continue;
        }
        /* The same send descriptor twice.  On one host a send completes
         * inside VipPostSend, so the second post is of a completed (not yet
         * reaped) descriptor and is taken; where a doorbell left the first
         * one pending it is refused, and another descriptor sends the
         * second message.  Either way each send taken completes once. */
        VIP_DESCRIPTOR *s = vt_dpool_get(&e->descs, 1);
        vt_fill(e->buf.base, 8, 8);
        vt_desc_send(d, 0, 0, e->buf.base, e->buf.mh, 8, 1);
        vt_desc_send(s, 0, 0, e->buf.base, e->buf.mh, 8, 1);
        CHECK_OK(VipPostSend(e->vi, d, e->descs.mem.mh));
        VIP_RETURN again = VipPostSend(e->vi, d, e->descs.mem.mh);
        if (again != VIP_SUCCESS) {
            CHECK_RET(VIP_INVALID_PARAMETER, again);
            CHECK_OK(VipPostSend(e->vi, s, e->descs.mem.mh));
        }
        for (int i = 0; i < 2; i++) {
            VIP_DESCRIPTOR *got = vt_send_wait(e->vi);
            CHECK(got == (i == 0 || again == VIP_SUCCESS ? d : s));
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
        }
        VIP_DESCRIPTOR *none = NULL;
        CHECK_RET(VIP_NOT_DONE, VipSendDone(e->vi, &none));
        vt_put_u64(e->fd, 0);
    }
}

/* ------------------------------------------------------------------ */
/* Memory deregistered and unmapped under a posted receive              */
/* ------------------------------------------------------------------ */

static int connected(vt_end *e) { return vt_vi_state(e->vi) == VIP_STATE_CONNECTED; }

/* A receive completed with an error, and no byte of it. */
static void expect_failed(vt_end *e, VIP_DESCRIPTOR *d)
{
    VIP_DESCRIPTOR *got = vt_recv_wait(e->vi);
    CHECK_PTR(d, got);
    char sb[160];
    if (!(got->CS.Status & VIP_STATUS_DONE) ||
        !(got->CS.Status & (VIP_STATUS_PROTECTION_ERROR | VIP_STATUS_DESC_FLUSHED_ERROR)))
        VT_FAIL("status %s: expected DONE with PROTECTION_ERROR or DESC_FLUSHED_ERROR",
                vt_status_str(got->CS.Status, sb, sizeof sb));
    CHECK_EQ(0, got->CS.Length);
}

static void gone_server(vt_end *e)
{
    const size_t pg = page_size();
    VIP_MEM_ATTRIBUTES ma = {e->ptag, VIP_FALSE, VIP_FALSE};
    VIP_MEM_HANDLE dmh = e->descs.mem.mh;

    /* The descriptor's own region goes: the receive is handed back and
     * nothing is written to it; the connection goes on. */
    VIP_UINT8 *dmem = map_pages(1);
    VIP_MEM_HANDLE dgone;
    CHECK_OK(VipRegisterMem(e->nic, dmem, pg, &ma, &dgone));
    VIP_DESCRIPTOR *dd = (VIP_DESCRIPTOR *)(void *)dmem;
    post_recv(e, dd, dgone, e->buf.base, e->buf.mh, 64);
    CHECK_OK(VipDeregisterMem(e->nic, dmem, dgone));
    CHECK(munmap(dmem, pg) == 0);
    ask(e, 4);
    CHECK_PTR(dd, vt_recv_wait(e->vi));
    VIP_DESCRIPTOR *ok = vt_dpool_get(&e->descs, 0);
    post_recv(e, ok, dmh, e->buf.base, e->buf.mh, 64);
    ask(e, 8);
    expect_good(e, ok, e->buf.base, 8);

    /* A small message into a buffer whose region went. */
    VIP_UINT8 *r = map_pages(16);
    VIP_MEM_HANDLE rmh;
    CHECK_OK(VipRegisterMem(e->nic, r, 16 * pg, &ma, &rmh));
    VIP_DESCRIPTOR *d0 = vt_dpool_get(&e->descs, 1);
    post_recv(e, d0, dmh, r + 64, rmh, 64);
    CHECK_OK(VipDeregisterMem(e->nic, r, rmh));
    CHECK(munmap(r, 16 * pg) == 0);
    ask(e, 4);
    expect_failed(e, d0);
    expect_nothing_more(e);

    /* A large one (the sender writes it into the buffer itself). */
    if (connected(e)) {
        VIP_UINT8 *big = map_pages(64);
        VIP_MEM_HANDLE bmh;
        CHECK_OK(VipRegisterMem(e->nic, big, 64 * pg, &ma, &bmh));
        VIP_DESCRIPTOR *d1 = vt_dpool_get(&e->descs, 2);
        post_recv(e, d1, dmh, big, bmh, 64 * pg);
        CHECK_OK(VipDeregisterMem(e->nic, big, bmh));
        CHECK(munmap(big, 64 * pg) == 0);
        ask(e, 48 * pg);
        expect_failed(e, d1);
        expect_nothing_more(e);
    }
    vt_put_u64(e->fd, CMD_END);
}

/* ------------------------------------------------------------------ */
/* A posted descriptor's own region deregistered and unmapped           */
/* ------------------------------------------------------------------ */

#define CMD_HANGUP 1000001    /* own_client: a dead receive posted, VipDisconnect */
#define CMD_SEND_GONE 1000002 /* own_client: a send whose region goes at once */

/* A page of its own, registered: a descriptor there can lose its region. */
static VIP_DESCRIPTOR *own_page(vt_end *e, VIP_MEM_HANDLE *mh)
{
    VIP_MEM_ATTRIBUTES ma = {e->ptag, VIP_FALSE, VIP_FALSE};
    VIP_UINT8 *page = map_pages(1);
    CHECK_OK(VipRegisterMem(e->nic, page, page_size(), &ma, mh));
    return (VIP_DESCRIPTOR *)(void *)page;
}

/* Deregistered and unmapped: the descriptor must not be touched again. */
static void drop_page(vt_end *e, VIP_DESCRIPTOR *d, VIP_MEM_HANDLE mh)
{
    CHECK_OK(VipDeregisterMem(e->nic, d, mh));
    CHECK(munmap(d, page_size()) == 0);
}

static void own_client(vt_end *e)
{
    VIP_DESCRIPTOR *d = vt_dpool_get(&e->descs, 0);
    for (;;) {
        uint64_t cmd = vt_get_u64(e->fd);
        if (cmd == CMD_END)
            return;
        if (cmd == CMD_HANGUP) {
            /* Flushed by this side's VipDisconnect. */
            VIP_MEM_HANDLE mh;
            VIP_DESCRIPTOR *dd = own_page(e, &mh);
            post_recv(e, dd, mh, e->buf.base, e->buf.mh, 64);
            drop_page(e, dd, mh);
            CHECK_OK(VipDisconnect(e->vi));
            CHECK_STATE(VIP_STATE_IDLE, e->vi);
            CHECK_PTR(dd, vt_recv_done(e->vi));
            expect_nothing_more(e);
            vt_put_u64(e->fd, 0);
            continue;
        }
        if (cmd == CMD_SEND_GONE) {
            /* Carried out in VipPostSend, or by the send engine after the
             * region went (VIA_DOORBELL=d1/d2): then it is not read. */
            VIP_MEM_HANDLE mh;
            VIP_DESCRIPTOR *sd = own_page(e, &mh);
            vt_desc_send(sd, 0, 0, e->buf.base, e->buf.mh, 8, 1);
            CHECK_OK(VipPostSend(e->vi, sd, mh));
            drop_page(e, sd, mh);
            CHECK_PTR(sd, vt_send_wait(e->vi));
            VIP_DESCRIPTOR *none = NULL;
            CHECK_RET(VIP_NOT_DONE, VipSendDone(e->vi, &none));
            vt_put_u64(e->fd, 0);
            continue;
        }
        vt_fill(e->buf.base, (size_t)cmd, (uint32_t)cmd);
        vt_desc_send(d, 0, 0, e->buf.base, e->buf.mh, (size_t)cmd, 1);
        CHECK_OK(VipPostSend(e->vi, d, e->descs.mem.mh));
        CHECK_PTR(d, vt_send_wait(e->vi));
        vt_put_u64(e->fd, d->CS.Status);
    }
}

static void own_server(vt_end *e)
{
    VIP_MEM_HANDLE dmh = e->descs.mem.mh;
    VIP_MEM_HANDLE mh;

    if (e->conf->level == U) {
        /* A receive that fails its checks waits behind the one ahead of it
         * (an unreliable VI stays connected); its region goes meanwhile. */
        VIP_DESCRIPTOR *a = vt_dpool_get(&e->descs, 0);
        post_recv(e, a, dmh, e->buf.base, e->buf.mh, 64);
        VIP_DESCRIPTOR *bad = own_page(e, &mh);
        vt_desc_recv(bad, e->buf.base + 64, e->buf.mh, 64, 1);
        bad->CS.SegCount = VT_MAX_SEGS + 1; /* FORMAT_ERROR */
        CHECK_OK(VipPostRecv(e->vi, bad, mh));
        drop_page(e, bad, mh);
        ask(e, 8);
        expect_good(e, a, e->buf.base, 8);
        CHECK_PTR(bad, vt_recv_wait(e->vi));
        expect_nothing_more(e);
        CHECK_STATE(VIP_STATE_CONNECTED, e->vi);

        /* A send whose region goes right after the post; no receive here,
         * so the message, if it went, is dropped. */
        vt_put_u64(e->fd, CMD_SEND_GONE);
        CHECK_EQ(0, vt_get_u64(e->fd));
        expect_nothing_more(e);
    }

    /* Flushed on this side by the provider's thread when the peer
     * disconnects (with its own such receive, flushed by its VipDisconnect). */
    VIP_DESCRIPTOR *dd = own_page(e, &mh);
    post_recv(e, dd, mh, e->buf.base, e->buf.mh, 64);
    drop_page(e, dd, mh);
    vt_put_u64(e->fd, CMD_HANGUP);
    CHECK_EQ(0, vt_get_u64(e->fd));
    CHECK_STATE_SOON(VIP_STATE_ERROR, e->vi);
    CHECK_PTR(dd, vt_recv_wait(e->vi));
    expect_nothing_more(e);
    /* The VI still works: a receive posted now is flushed at once. */
    VIP_DESCRIPTOR *late = vt_dpool_get(&e->descs, 1);
    post_recv(e, late, dmh, e->buf.base, e->buf.mh, 64);
    CHECK_PTR(late, vt_recv_wait(e->vi));
    CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, late);
    vt_put_u64(e->fd, CMD_END);
}

static const vt_scenario scenarios[] = {
    {"twice-u", {U, 0, 0, 0, 0, 0, 0}, twice_client, twice_server},
    {"twice-rd", {RD, 0, 0, 0, 0, 0, 0}, twice_client, twice_server},
    {"gone-u", {U, 0, 0, 0, 0, 0, 0}, client_sends, gone_server},
    {"gone-rd", {RD, 0, 0, 0, 0, 0, 0}, client_sends, gone_server},
    {"gone-rr", {RR, 0, 0, 0, 0, 0, 0}, client_sends, gone_server},
    {"own-region-u", {U, 0, 0, 0, 0, 0, 0}, own_client, own_server},
    {"own-region-rd", {RD, 0, 0, 0, 0, 0, 0}, own_client, own_server},
    {"own-region-rr", {RR, 0, 0, 0, 0, 0, 0}, own_client, own_server},
};

int main(void)
{
    vt_init();
    vt_scenarios all = {scenarios, sizeof scenarios / sizeof scenarios[0]};
    vt_child srv = vt_scenarios_spawn(&all);
    registration();
    vt_scenarios_client(&all, &srv);
    printf("badinput: ok\n");
    return 0;
}
