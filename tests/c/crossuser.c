/*
 * crossuser.c - sends between processes of two users, one of which may not
 * cross-memory attach to the other.
 *
 * As root, the program forks a child that drops to uid/gid 65534 before it
 * opens its NIC; the root parent opens its NIC first, so the host agent of
 * the run is root's, which both trust.  The child cannot attach to root's
 * process: its sends of more than a ring slot go through the connection's
 * ring in pieces; the parent (root) still copies into the child directly.
 * For each reliability level, messages of every size class up to 1 MiB go
 * from the child to the parent and are echoed back, scattered over a
 * varying number of segments, with every byte checked on both sides.
 *
 * Then RDMA writes, from the child into the parent's registered memory:
 * they go through the ring too, and the parent checks each against its own
 * registry before a byte lands.  Writes of several sizes with and without
 * immediate data, on an unreliable and a reliable VI, every byte checked
 * along with the bytes around it; then a write into a region registered
 * without RDMA write enable, on a reliable VI: nothing lands, and the
 * connection breaks with VIP_ERROR_RDMAW_PROT reported at the target and
 * VIP_ERROR_CONN_LOST at the initiator.
 *
 * Then RDMA reads, 4 B to 2 MiB: the child's reads of the parent's memory
 * go through the ring (the parent checks each request against its own
 * registry and answers through its ring as it polls its receive queue);
 * the parent's reads of the child's memory go by cross-memory attach.
 * Reads one way, on both reliable levels, then both ways at once; every
 * byte checked along with the bytes around it.  A read of memory
 * registered without RDMA read enable brings nothing, completes with
 * VIP_STATUS_RDMA_PROT_ERROR and breaks the connection with
 * VIP_ERROR_RDMAR_PROT at the target and VIP_ERROR_CONN_LOST at the
 * initiator.  Last, two processes of two other
 * users (65533 and 65534), neither of which may attach to the other, read
 * from each other at once, every read through the ring both ways.
 *
 * Then two processes of one user (65534), each dumpable when they connect,
 * so each may attach to the other; the target then makes itself
 * undumpable, refusing the initiator as a process refuses a peer once it
 * has given its one Yama ptracer to another: the initiator's next send,
 * RDMA write and RDMA read are refused by the kernel and go through the
 * ring instead, every byte intact.
 *
 * And messages larger than the ring (4 MiB and 3 MiB + 5 bytes) from the
 * child to a parent that waits only on a completion queue: the child's
 * send tells the parent's CQ each time the ring is full, and the CQ
 * drains the ring into the posted receive while the parent waits in it.
 *
 * Not root: prints a skip line and exits 0.
 */
#include "vt.h"

#include <grp.h>

#define AREA ((size_t)1 << 20)
#define NOBODY 65534

static const size_t sizes[] = {0,    1,    4,     63,    1023,   1024,   1025,   2047,    2048,
                               2049, 4096, 12345, 65536, 100003, 262144, 524289, 1048575, 1048576};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static const VIP_RELIABILITY_LEVEL levels[] = {VIP_SERVICE_UNRELIABLE, VIP_SERVICE_RELIABLE_DELIVERY,
                                               VIP_SERVICE_RELIABLE_RECEPTION};
#define NLEVELS (sizeof levels / sizeof levels[0])

static unsigned segs_for(size_t m) { return 1 + (unsigned)(m % 4); }
static uint32_t seed_for(size_t level, size_t m) { return (uint32_t)(level * 1000003u + m * 2654435761u + 7); }

static vt_conf conf_for(VIP_RELIABILITY_LEVEL level)
{
    vt_conf c = {.level = level, .buf_size = 2 * AREA, .ndesc = 4, .maxseg = 4};
    return c;
}

static void post_recv(vt_end *e, size_t len, unsigned segs)
{
    VIP_DESCRIPTOR *d = vt_dpool_get(&e->descs, 1);
    vt_desc_recv(d, e->buf.base + AREA, e->buf.mh, len, segs);
    CHECK_OK(VipPostRecv(e->vi, d, e->descs.mem.mh));
}

/* Every other message carries immediate data (`imm`, 0 for none), which a
 * message through the ring in pieces brings with its first piece. */
static uint32_t imm_for(size_t m, uint32_t seed) { return m % 2 ? seed | 1 : 0; }

static void send_wait(vt_end *e, void *data, size_t len, unsigned segs, uint32_t imm)
{
    VIP_DESCRIPTOR *d = vt_dpool_get(&e->descs, 0), *got = NULL;
    vt_desc_send(d, VIP_CONTROL_OP_SENDRECV | (imm ? VIP_CONTROL_IMMEDIATE : 0), imm, data, e->buf.mh, len, segs);
    CHECK_OK(VipPostSend(e->vi, d, e->descs.mem.mh));
    CHECK_OK(VipSendWait(e->vi, VIP_INFINITE, &got));
    CHECK_PTR(d, got);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
    CHECK_EQ(len, got->CS.Length);
}

static void recv_check(vt_end *e, size_t len, uint32_t seed, uint32_t imm)
{
    VIP_DESCRIPTOR *got = NULL;
    CHECK_OK(VipRecvWait(e->vi, VIP_INFINITE, &got));
    CHECK_PTR(vt_dpool_get(&e->descs, 1), got);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | (imm ? VIP_STATUS_IMMEDIATE : 0), got);
    if (imm)
        CHECK_EQ(imm, got->CS.ImmediateData);
    CHECK_EQ(len, got->CS.Length);
    CHECK_PATTERN(e->buf.base + AREA, len, seed);
}

/* The child (uid 65534): sends each message through the ring, checks the echo. */
static void child_level(vt_end *e, size_t l)
{
    for (size_t m = 0; m < NSIZES; m++) {
        post_recv(e, sizes[m], segs_for(m + 1));
        vt_fill(e->buf.base, sizes[m], seed_for(l, m));
        vt_sync(e->fd, 0x100 + m);
        send_wait(e, e->buf.base, sizes[m], segs_for(m), imm_for(m, seed_for(l, m)));
        recv_check(e, sizes[m], seed_for(l, m), imm_for(m, seed_for(l, m)));
    }
}

/* The parent (root): receives each message, checks it, echoes it. */
static void parent_level(vt_end *e, size_t l)
{
    for (size_t m = 0; m < NSIZES; m++) {
        post_recv(e, sizes[m], segs_for(m + 2));
        vt_sync(e->fd, 0x100 + m);
        recv_check(e, sizes[m], seed_for(l, m), imm_for(m, seed_for(l, m)));
        send_wait(e, e->buf.base + AREA, sizes[m], segs_for(m + 3), imm_for(m, seed_for(l, m)));
    }
}

static void run(int fd, int parent)
{
    for (size_t l = 0; l < NLEVELS; l++) {
        vt_conf c = conf_for(levels[l]);
        char disc[VT_MAX_DISC];
        vt_end e;
        vt_disc(disc, sizeof disc, "crossuser.%zu", l);
        vt_sync(fd, 0x5C00 + l);
        vt_end_open(&e, &c, fd, parent);
        vt_end_link(&e, disc);
        if (parent) {
            printf("  %-40s %s\n", "crossuser", vt_level_name(levels[l]));
            parent_level(&e, l);
        } else {
            child_level(&e, l);
        }
        vt_sync(fd, 0xE0D00 + l);
        vt_end_close(&e);
    }
}

static const size_t rdma_sizes[] = {0, 1, 63, 1024, 1025, 4096, 65536, 100003, 1048576};
#define NRDMA (sizeof rdma_sizes / sizeof rdma_sizes[0])

static size_t rdma_offset(size_t m) { return 8 + (m * 13) % 512; }

/* The child: writes each size into the parent's buffer, with immediate
 * data every other time, else followed by an empty send that says so. */
static void child_rdma(vt_end *e, size_t l, uint64_t raddr, VIP_MEM_HANDLE rmh)
{
    for (size_t m = 0; m < NRDMA; m++) {
        size_t len = rdma_sizes[m];
        int imm = m % 2;
        VIP_DESCRIPTOR *d = vt_dpool_get(&e->descs, 0), *got = NULL;
        vt_fill(e->buf.base, len, seed_for(l + 7, m));
        vt_sync(e->fd, 0x200 + m);
        vt_desc_rdma(d, VIP_CONTROL_OP_RDMAWRITE | (imm ? VIP_CONTROL_IMMEDIATE : 0), (VIP_UINT32)(0xC0DE0000u + m),
                     raddr + rdma_offset(m), rmh, e->buf.base, e->buf.mh, len, 1 + (unsigned)(m % 3));
        CHECK_OK(VipPostSend(e->vi, d, e->descs.mem.mh));
        CHECK_OK(VipSendWait(e->vi, VIP_INFINITE, &got));
        CHECK_PTR(d, got);
        CHECK_ERRBITS(VIP_STATUS_DONE, got);
        CHECK_EQ(len, got->CS.Length);
        if (!imm)
            send_wait(e, e->buf.base, 0, 1, 0);
        vt_sync(e->fd, 0x300 + m);
    }
}

/* The parent: receives the immediate data or the send that follows each
 * write, then checks the bytes written and the bytes around them. */
static void parent_rdma(vt_end *e, size_t l)
{
    for (size_t m = 0; m < NRDMA; m++) {
        size_t len = rdma_sizes[m], off = rdma_offset(m);
        VIP_DESCRIPTOR *got = NULL;
        memset(e->buf.base, 0, off + len + 64);
        post_recv(e, 0, 1);
        vt_sync(e->fd, 0x200 + m);
        CHECK_OK(VipRecvWait(e->vi, VIP_INFINITE, &got));
        CHECK_PTR(vt_dpool_get(&e->descs, 1), got);
        if (m % 2) {
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_REMOTE_RDMA_WRITE | VIP_STATUS_IMMEDIATE, got);
            CHECK_EQ(len, got->CS.Length);
            CHECK_EQ(0xC0DE0000u + m, got->CS.ImmediateData);
        } else {
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, got);
            CHECK_EQ(0, got->CS.Length);
        }
        CHECK_PATTERN(e->buf.base + off, len, seed_for(l + 7, m));
        for (size_t i = 0; i < off; i++)
            CHECK_EQ(0, e->buf.base[i]);
        for (size_t i = off + len; i < off + len + 64; i++)
            CHECK_EQ(0, e->buf.base[i]);
        vt_sync(e->fd, 0x300 + m);
    }
}

/* A write into memory registered without RDMA write enable, on a reliable
 * VI: refused, nothing lands, the parent sees RDMAW_PROT and the child
 * CONN_LOST, with RDMA_PROT_ERROR in its descriptor. */
static void child_refused(vt_end *e, uint64_t raddr, VIP_MEM_HANDLE rmh)
{
    VIP_DESCRIPTOR *d = vt_dpool_get(&e->descs, 0), *got = NULL;
    vt_fill(e->buf.base, 3000, 99);
    vt_sync(e->fd, 0x400);
    vt_desc_rdma(d, VIP_CONTROL_OP_RDMAWRITE, 0, raddr, rmh, e->buf.base, e->buf.mh, 3000, 2);
    CHECK_OK(VipPostSend(e->vi, d, e->descs.mem.mh));
    CHECK_OK(VipSendWait(e->vi, VIP_INFINITE, &got));
    CHECK_PTR(d, got);
    /* Through the ring too, checked first against the parent's published
     * table: the initiator learns why, as on every path. */
    CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_RDMA_PROT_ERROR, got);
    CHECK_ERROR_REPORTED(&e->errs, VIP_ERROR_CONN_LOST, e->vi);
    CHECK_STATE_SOON(VIP_STATE_ERROR, e->vi);
}

static void parent_refused(vt_end *e, vt_mem *closed)
{
    VIP_DESCRIPTOR *got = NULL;
    post_recv(e, 16, 1);
    vt_sync(e->fd, 0x400);
    CHECK_OK(VipRecvWait(e->vi, VIP_INFINITE, &got));
    CHECK_PTR(vt_dpool_get(&e->descs, 1), got);
    CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, got);
    CHECK_ERROR_REPORTED(&e->errs, VIP_ERROR_RDMAW_PROT, e->vi);
    CHECK_STATE(VIP_STATE_ERROR, e->vi);
    for (size_t i = 0; i < closed->size; i++)
        CHECK_EQ(0, closed->base[i]);
}

static const VIP_RELIABILITY_LEVEL rdma_levels[] = {VIP_SERVICE_UNRELIABLE, VIP_SERVICE_RELIABLE_DELIVERY};
#define NRDMA_LEVELS (sizeof rdma_levels / sizeof rdma_levels[0])

static void run_rdma(int fd, int parent)
{
    for (size_t l = 0; l <= NRDMA_LEVELS; l++) {
        /* The last round: the refused write, on a reliable VI. */
        int refuse = l == NRDMA_LEVELS;
        vt_conf c = conf_for(refuse ? VIP_SERVICE_RELIABLE_DELIVERY : rdma_levels[l]);
        char disc[VT_MAX_DISC];
        vt_end e;
        vt_mem closed;
        c.rdma_write = VIP_TRUE;
        vt_disc(disc, sizeof disc, "crossuser.rdma.%zu", l);
        vt_sync(fd, 0x6C00 + l);
        vt_end_open(&e, &c, fd, parent);
        vt_end_link(&e, disc);
        if (parent) {
            printf("  %-40s %s\n", refuse ? "crossuser rdma write refused" : "crossuser rdma write",
                   vt_level_name(c.level));
            if (refuse) {
                vt_mem_reg(&closed, e.nic, e.ptag, 4096, VIP_FALSE, VIP_FALSE);
                vt_put_u64(fd, (uint64_t)(uintptr_t)closed.base);
                vt_put_u64(fd, (uint64_t)(uintptr_t)closed.mh);
                parent_refused(&e, &closed);
                vt_mem_dereg(&closed);
            } else {
                vt_put_u64(fd, (uint64_t)(uintptr_t)e.buf.base);
                vt_put_u64(fd, (uint64_t)(uintptr_t)e.buf.mh);
                parent_rdma(&e, l);
            }
        } else {
            uint64_t raddr = vt_get_u64(fd);
            VIP_MEM_HANDLE rmh = (VIP_MEM_HANDLE)(uintptr_t)vt_get_u64(fd);
            if (refuse)
                child_refused(&e, raddr, rmh);
            else
                child_rdma(&e, l, raddr, rmh);
        }
        vt_sync(fd, 0xE1D00 + l);
        vt_end_close(&e);
    }
}

/* ---- RDMA reads ---------------------------------------------------- */

/* Each end's buffer: the memory the peer reads at [0, RAREA), the reads'
 * destination at [RAREA, 2 * RAREA). */
#define RAREA ((size_t)4 << 20)

static const size_t read_sizes[] = {4, 4096, 102400, 2097152};
#define NREAD (sizeof read_sizes / sizeof read_sizes[0])

static size_t read_offset(size_t m) { return 24 + (m * 37) % 1000; }
static uint32_t read_seed(int reader_is_parent, size_t round, size_t m)
{
    return (uint32_t)(0xEAD00000u + (unsigned)reader_is_parent * 100000u + round * 1000u + m);
}

static vt_conf read_conf(VIP_RELIABILITY_LEVEL level)
{
    vt_conf c = {.level = level, .rdma_read = VIP_TRUE, .buf_size = 2 * RAREA, .ndesc = 4, .maxseg = 4};
    return c;
}

/* Fills what the peer's read m of this round will find. */
static void read_source(vt_end *e, size_t m, uint32_t seed) { vt_fill(e->buf.base + read_offset(m), read_sizes[m], seed); }

/* Posts read m of the peer's memory into this end's destination. */
static VIP_DESCRIPTOR *read_post(vt_end *e, uint64_t raddr, VIP_MEM_HANDLE rmh, size_t m)
{
    size_t len = read_sizes[m], off = read_offset(m);
    VIP_DESCRIPTOR *d = vt_dpool_get(&e->descs, 0);
    memset(e->buf.base + RAREA, 0, off + len + 64);
    vt_desc_rdma(d, VIP_CONTROL_OP_RDMAREAD, 0, raddr + off, rmh, e->buf.base + RAREA + off, e->buf.mh, len,
                 1 + (unsigned)(m % 3));
    CHECK_OK(VipPostSend(e->vi, d, e->descs.mem.mh));
    return d;
}

/* Waits for read m (only VipSendWait: it must drain what the read needs)
 * and checks every byte it brought and the bytes around them. */
static void read_check(vt_end *e, VIP_DESCRIPTOR *d, size_t m, uint32_t seed)
{
    size_t len = read_sizes[m], off = read_offset(m);
    VIP_DESCRIPTOR *got = NULL;
    VIP_UINT8 *dst = e->buf.base + RAREA;
    CHECK_OK(VipSendWait(e->vi, VIP_INFINITE, &got));
    CHECK_PTR(d, got);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RDMA_READ, got);
    CHECK_EQ(len, got->CS.Length);
    CHECK_PATTERN(dst + off, len, seed);
    for (size_t i = 0; i < off; i++)
        CHECK_EQ(0, dst[i]);
    for (size_t i = off + len; i < off + len + 64; i++)
        CHECK_EQ(0, dst[i]);
}

/* Round 'round': the reader reads each size from the target, which polls
 * its receive queue (VipRecvWait) until the reader says it is done. */
static void read_one_way(vt_end *e, int reader, int parent, size_t round, uint64_t raddr, VIP_MEM_HANDLE rmh)
{
    for (size_t m = 0; m < NREAD; m++) {
        uint32_t seed = read_seed(reader ? parent : !parent, round, m);
        if (reader) {
            vt_sync(e->fd, 0x700 + m);
            read_check(e, read_post(e, raddr, rmh, m), m, seed);
            send_wait(e, e->buf.base, 0, 1, 0);
        } else {
            read_source(e, m, seed);
            post_recv(e, 0, 1);
            vt_sync(e->fd, 0x700 + m);
            recv_check(e, 0, 0, 0);
        }
        vt_sync(e->fd, 0x800 + m);
    }
}

/* Both ends read each size from the other at once, each waiting for its
 * own read first, then for the other's word that its read is done. */
static void read_both_ways(vt_end *e, int parent, size_t round, uint64_t raddr, VIP_MEM_HANDLE rmh)
{
    for (size_t m = 0; m < NREAD; m++) {
        read_source(e, m, read_seed(!parent, round, m));
        post_recv(e, 0, 1);
        vt_sync(e->fd, 0x900 + m);
        read_check(e, read_post(e, raddr, rmh, m), m, read_seed(parent, round, m));
        send_wait(e, e->buf.base, 0, 1, 0);
        recv_check(e, 0, 0, 0);
        vt_sync(e->fd, 0xA00 + m);
    }
}

/* Swaps the addresses and handles of the two ends' buffers. */
static void read_swap(vt_end *e, uint64_t *raddr, VIP_MEM_HANDLE *rmh)
{
    vt_put_u64(e->fd, (uint64_t)(uintptr_t)e->buf.base);
    vt_put_u64(e->fd, (uint64_t)(uintptr_t)e->buf.mh);
    *raddr = vt_get_u64(e->fd);
    *rmh = (VIP_MEM_HANDLE)(uintptr_t)vt_get_u64(e->fd);
}

/* A read of memory registered without RDMA read enable: the target
 * (the parent) refuses it, nothing comes, the parent sees RDMAR_PROT and
 * the child CONN_LOST. */
static void read_refused(vt_end *e, int parent)
{
    VIP_DESCRIPTOR *got = NULL;
    if (parent) {
        vt_mem closed;
        vt_mem_reg(&closed, e->nic, e->ptag, 4096, VIP_TRUE, VIP_FALSE);
        memset(closed.base, 0x11, closed.size);
        vt_put_u64(e->fd, (uint64_t)(uintptr_t)closed.base);
        vt_put_u64(e->fd, (uint64_t)(uintptr_t)closed.mh);
        post_recv(e, 16, 1);
        vt_sync(e->fd, 0xB00);
        CHECK_OK(VipRecvWait(e->vi, VIP_INFINITE, &got));
        CHECK_PTR(vt_dpool_get(&e->descs, 1), got);
        CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_DESC_FLUSHED_ERROR, got);
        CHECK_ERROR_REPORTED(&e->errs, VIP_ERROR_RDMAR_PROT, e->vi);
        CHECK_STATE(VIP_STATE_ERROR, e->vi);
        vt_mem_dereg(&closed);
    } else {
        uint64_t raddr = vt_get_u64(e->fd);
        VIP_MEM_HANDLE rmh = (VIP_MEM_HANDLE)(uintptr_t)vt_get_u64(e->fd);
        VIP_DESCRIPTOR *d = vt_dpool_get(&e->descs, 0);
        vt_fill(e->buf.base + RAREA, 3000, 99);
        vt_sync(e->fd, 0xB00);
        vt_desc_rdma(d, VIP_CONTROL_OP_RDMAREAD, 0, raddr, rmh, e->buf.base + RAREA, e->buf.mh, 3000, 2);
        CHECK_OK(VipPostSend(e->vi, d, e->descs.mem.mh));
        CHECK_OK(VipSendWait(e->vi, VIP_INFINITE, &got));
        CHECK_PTR(d, got);
        CHECK_ERRBITS(VIP_STATUS_DONE | VIP_STATUS_RDMA_PROT_ERROR, got);
        CHECK_EQ(0, got->CS.Length);
        /* Nothing came. */
        CHECK_PATTERN(e->buf.base + RAREA, 3000, 99);
        CHECK_ERROR_REPORTED(&e->errs, VIP_ERROR_CONN_LOST, e->vi);
        CHECK_STATE_SOON(VIP_STATE_ERROR, e->vi);
    }
}

static const VIP_RELIABILITY_LEVEL read_levels[] = {VIP_SERVICE_RELIABLE_DELIVERY, VIP_SERVICE_RELIABLE_RECEPTION};
#define NREAD_LEVELS (sizeof read_levels / sizeof read_levels[0])

static void run_read(int fd, int parent)
{
    for (size_t l = 0; l <= NREAD_LEVELS; l++) {
        /* The last round: the refused read. */
        int refuse = l == NREAD_LEVELS;
        vt_conf c = read_conf(refuse ? VIP_SERVICE_RELIABLE_DELIVERY : read_levels[l]);
        char disc[VT_MAX_DISC];
        vt_end e;
        vt_disc(disc, sizeof disc, "crossuser.read.%zu", l);
        vt_sync(fd, 0x7C00 + l);
        vt_end_open(&e, &c, fd, parent);
        vt_end_link(&e, disc);
        if (parent)
            printf("  %-40s %s\n", refuse ? "crossuser rdma read refused" : "crossuser rdma read", vt_level_name(c.level));
        if (refuse) {
            read_refused(&e, parent);
        } else {
            uint64_t raddr;
            VIP_MEM_HANDLE rmh;
            read_swap(&e, &raddr, &rmh);
            /* The child reads through the ring, then the parent by attach. */
            read_one_way(&e, !parent, parent, 3 * l, raddr, rmh);
            read_one_way(&e, parent, parent, 3 * l + 1, raddr, rmh);
            read_both_ways(&e, parent, 3 * l + 2, raddr, rmh);
        }
        vt_sync(fd, 0xE2D00 + l);
        vt_end_close(&e);
    }
}

static void drop_to(uid_t uid);

/* The target refuses cross-memory attach once connected (see the top). */
#define LATER_LEN ((size_t)300000)

/* The initiator's operation `op` (0: send, 1: RDMA write, 2: RDMA read)
 * of round `round`; the target's buffer holds what the read finds at 0,
 * takes the write at RAREA and the send at RAREA + AREA. */
static void later_op(vt_end *e, int op, uint32_t round, uint64_t raddr, VIP_MEM_HANDLE rmh)
{
    VIP_DESCRIPTOR *d = vt_dpool_get(&e->descs, 0), *got = NULL;
    if (op == 0) {
        vt_fill(e->buf.base, LATER_LEN, 0x1A7E0 + round);
        send_wait(e, e->buf.base, LATER_LEN, 3, 0);
        return;
    }
    if (op == 1) {
        vt_fill(e->buf.base + AREA, LATER_LEN, 0x2A7E0 + round);
        vt_desc_rdma(d, VIP_CONTROL_OP_RDMAWRITE, 0, raddr + RAREA, rmh, e->buf.base + AREA, e->buf.mh, LATER_LEN, 2);
    } else {
        memset(e->buf.base + RAREA, 0, LATER_LEN);
        vt_desc_rdma(d, VIP_CONTROL_OP_RDMAREAD, 0, raddr, rmh, e->buf.base + RAREA, e->buf.mh, LATER_LEN, 2);
    }
    CHECK_OK(VipPostSend(e->vi, d, e->descs.mem.mh));
    CHECK_OK(VipSendWait(e->vi, VIP_INFINITE, &got));
    CHECK_PTR(d, got);
    CHECK_STATUS(VIP_STATUS_DONE | (op == 1 ? VIP_STATUS_OP_RDMA_WRITE : VIP_STATUS_OP_RDMA_READ), got);
    CHECK_EQ(LATER_LEN, got->CS.Length);
    if (op == 2)
        CHECK_PATTERN(e->buf.base + RAREA, LATER_LEN, 0x3A7E0 + round);
}

/* One connection: a round in which the target lets the initiator attach,
 * then one in which it does not, whose first operation is `first`. */
static void refused_later(int fd, int initiator, int first)
{
    vt_conf c = {.level = VIP_SERVICE_RELIABLE_DELIVERY, .rdma_write = VIP_TRUE, .rdma_read = VIP_TRUE,
                 .buf_size = 2 * RAREA, .ndesc = 4, .maxseg = 4};
    char disc[VT_MAX_DISC];
    vt_end e;
    uint64_t raddr;
    VIP_MEM_HANDLE rmh;
    vt_disc(disc, sizeof disc, "crossuser.refused-later.%d", first);
    vt_sync(fd, 0x9C00 + (unsigned)first);
    /* Dumpable (a change of uid, or the last connection, made it not): the
     * initiator may attach. */
    CHECK(prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) == 0);
    vt_end_open(&e, &c, fd, !initiator);
    vt_end_link(&e, disc);
    read_swap(&e, &raddr, &rmh);
    for (uint32_t round = 0; round < 2; round++) {
        if (initiator) {
            vt_sync(fd, 0x9C10 + round);
            for (int k = 0; k < 3; k++)
                later_op(&e, (first + k) % 3, round, raddr, rmh);
            /* The end of the round: the target checks the write. */
            send_wait(&e, e.buf.base, 0, 1, 0);
        } else {
            VIP_DESCRIPTOR *d = vt_dpool_get(&e.descs, 1), *end = vt_dpool_get(&e.descs, 2), *got = NULL;
            if (round == 1)
                CHECK(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0);
            vt_fill(e.buf.base, LATER_LEN, 0x3A7E0 + round);
            memset(e.buf.base + RAREA, 0, LATER_LEN);
            /* The message, then the end of the round (waiting for them answers the read). */
            vt_desc_recv(d, e.buf.base + RAREA + AREA, e.buf.mh, LATER_LEN, 2);
            CHECK_OK(VipPostRecv(e.vi, d, e.descs.mem.mh));
            vt_desc_recv(end, e.buf.base + RAREA + AREA + LATER_LEN, e.buf.mh, 0, 1);
            CHECK_OK(VipPostRecv(e.vi, end, e.descs.mem.mh));
            vt_sync(fd, 0x9C10 + round);
            CHECK_OK(VipRecvWait(e.vi, VIP_INFINITE, &got));
            CHECK_PTR(d, got);
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, got);
            CHECK_EQ(LATER_LEN, got->CS.Length);
            CHECK_PATTERN(e.buf.base + RAREA + AREA, LATER_LEN, 0x1A7E0 + round);
            CHECK_OK(VipRecvWait(e.vi, VIP_INFINITE, &got));
            CHECK_PTR(end, got);
            CHECK_PATTERN(e.buf.base + RAREA, LATER_LEN, 0x2A7E0 + round);
        }
    }
    vt_sync(fd, 0x9CE0);
    vt_end_close(&e);
}

static void refused_later_target(int fd, void *arg)
{
    (void)arg;
    drop_to(NOBODY);
    for (int first = 0; first < 3; first++)
        refused_later(fd, 0, first);
}

/* Forks the target, then becomes uid 65534 as well. */
static void refused_later_initiator(int fd, void *arg)
{
    (void)arg;
    vt_child target = vt_spawn("nobody-target", refused_later_target, NULL);
    CHECK_EQ(1, vt_get_u64(fd));
    drop_to(NOBODY);
    for (int first = 0; first < 3; first++)
        refused_later(target.fd, 1, first);
    vt_join(&target);
}

/* Messages larger than the ring, to a receiver that waits on a CQ only. */
static const size_t cq_sizes[] = {4u << 20, (3u << 20) + 5};
#define CQ_AREA ((size_t)4 << 20)

static void run_cq_large(int fd, int parent)
{
    char disc[VT_MAX_DISC];
    vt_disc(disc, sizeof disc, "crossuser.cq-large");
    vt_sync(fd, 0x7C00);
    vt_conf c = {.level = VIP_SERVICE_RELIABLE_DELIVERY, .buf_size = CQ_AREA, .ndesc = 4, .maxseg = 4};
    vt_end e;
    vt_end_open(&e, &c, fd, parent);
    if (!parent) {
        vt_end_link(&e, disc);
        for (size_t m = 0; m < sizeof cq_sizes / sizeof cq_sizes[0]; m++) {
            vt_fill(e.buf.base, cq_sizes[m], 0xC0 + (uint32_t)m);
            vt_sync(fd, 0x7C10 + m);
            send_wait(&e, e.buf.base, cq_sizes[m], 3, 0);
        }
    } else {
        /* The parent's VI of vt_end_open has no CQ: one that has. */
        VIP_CQ_HANDLE cq;
        VIP_VI_HANDLE vi;
        CHECK_OK(VipCreateCQ(e.nic, 16, &cq));
        VIP_VI_ATTRIBUTES va = vt_vi_attrs(c.level, e.ptag, VT_MAX_TRANSFER, VIP_FALSE, VIP_FALSE);
        CHECK_OK(VipCreateVi(e.nic, &va, NULL, cq, &vi));
        vt_accept(e.nic, vi, disc);
        printf("  %-40s %s\n", "crossuser, larger than the ring, to a CQ", vt_level_name(c.level));
        for (size_t m = 0; m < sizeof cq_sizes / sizeof cq_sizes[0]; m++) {
            VIP_DESCRIPTOR *d = vt_dpool_get(&e.descs, 1), *got = NULL;
            vt_desc_recv(d, e.buf.base, e.buf.mh, CQ_AREA, 4);
            CHECK_OK(VipPostRecv(vi, d, e.descs.mem.mh));
            vt_sync(fd, 0x7C10 + m);
            VIP_VI_HANDLE which = NULL;
            VIP_BOOLEAN recv = VIP_FALSE;
            CHECK_OK(VipCQWait(cq, VT_WAIT_MS, &which, &recv));
            CHECK_PTR(vi, which);
            CHECK(recv == VIP_TRUE);
            CHECK_OK(VipRecvDone(vi, &got));
            CHECK_PTR(d, got);
            CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, got);
            CHECK_EQ(cq_sizes[m], got->CS.Length);
            CHECK_PATTERN(e.buf.base, cq_sizes[m], 0xC0 + (uint32_t)m);
        }
        vt_sync(fd, 0x7CE0);
        CHECK_OK(VipDisconnect(vi));
        CHECK_OK(VipDestroyVi(vi));
        CHECK_OK(VipDestroyCQ(cq));
    }
    if (!parent)
        vt_sync(fd, 0x7CE0);
    vt_end_close(&e);
}

static void drop_to(uid_t uid)
{
    if (setgroups(0, NULL) != 0 || setgid(uid) != 0 || setuid(uid) != 0)
        VT_FAIL("dropping to uid %d: %s", (int)uid, strerror(errno));
    CHECK_EQ(uid, getuid());
    prctl(PR_SET_PDEATHSIG, SIGKILL);
}

/* Two users neither of which may attach to the other: reads both ways at
 * once, all through the ring. */
static void ring_pair(int fd, int server)
{
    vt_conf c = read_conf(VIP_SERVICE_RELIABLE_DELIVERY);
    char disc[VT_MAX_DISC];
    vt_end e;
    uint64_t raddr;
    VIP_MEM_HANDLE rmh;
    vt_disc(disc, sizeof disc, "crossuser.ring-pair");
    vt_sync(fd, 0x8C00);
    vt_end_open(&e, &c, fd, server);
    vt_end_link(&e, disc);
    read_swap(&e, &raddr, &rmh);
    for (size_t round = 0; round < 3; round++)
        read_both_ways(&e, server, 10 + round, raddr, rmh);
    vt_sync(fd, 0xE3D00);
    vt_end_close(&e);
}

static void ring_pair_low(int fd, void *arg)
{
    (void)arg;
    drop_to(NOBODY);
    ring_pair(fd, 0);
}

/* Forks its peer (which becomes uid 65534), then becomes uid 65533. */
static void ring_pair_high(int fd, void *arg)
{
    (void)arg;
    vt_child low = vt_spawn("nobody-b", ring_pair_low, NULL);
    CHECK_EQ(1, vt_get_u64(fd));
    drop_to(NOBODY - 1);
    ring_pair(low.fd, 1);
    vt_join(&low);
}

static void child(int fd, void *arg)
{
    (void)arg;
    /* Wait until the parent has opened its NIC: the agent is root's. */
    CHECK_EQ(1, vt_get_u64(fd));
    if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
        VT_FAIL("dropping to uid %d: %s", NOBODY, strerror(errno));
    CHECK_EQ(NOBODY, getuid());
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    run(fd, 0);
    run_rdma(fd, 0);
    run_read(fd, 0);
    run_cq_large(fd, 0);
}

int main(void)
{
    vt_init();
    if (geteuid() != 0) {
        printf("  crossuser: skipped (needs root to run the two ends as different users)\n");
        return 0;
    }
    /* Every process forked before this one has threads of openvia's (a
     * child forked later would inherit their memory, not the threads); each
     * waits for its turn. */
    vt_child c = vt_spawn("nobody", child, NULL);
    vt_child pair = vt_spawn("user-65533", ring_pair_high, NULL);
    vt_child later = vt_spawn("nobody-initiator", refused_later_initiator, NULL);
    /* The first VipOpenNic starts the agent: as root, before the children open. */
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    vt_put_u64(c.fd, 1);
    run(c.fd, 1);
    run_rdma(c.fd, 1);
    run_read(c.fd, 1);
    run_cq_large(c.fd, 1);
    vt_join(&c);
    printf("  %-40s %s\n", "crossuser rdma read, two other users", vt_level_name(VIP_SERVICE_RELIABLE_DELIVERY));
    vt_put_u64(pair.fd, 1);
    vt_join(&pair);
    printf("  %-40s %s\n", "crossuser, attach refused once connected", vt_level_name(VIP_SERVICE_RELIABLE_DELIVERY));
    vt_put_u64(later.fd, 1);
    vt_join(&later);
    CHECK_OK(VipCloseNic(nic));
    return 0;
}
