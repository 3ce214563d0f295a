/*
 * giganet.c - a program in the spelling of Giganet's cLAN vipl.h and of the
 * VI Developer's Guide: desc->Control, desc->Data[i], VIP_DATA_SEGMENT and
 * VIP_ADDRESS_SEGMENT, never CS or DS.  It does not build against a header
 * that only has M-VIA's names.
 *
 * At compile time: each Giganet name is at the offset of its M-VIA name,
 * and at the offsets libvipl reads (crates/via-core).
 *
 * At run time, two processes on this host, one VI each (reliable delivery,
 * RDMA write enabled): the client sends a message with immediate data in
 * two data segments, then RDMA-writes with immediate data into the server's
 * buffer (the address segment is Data[0] as a VIP_ADDRESS_SEGMENT); the
 * server checks both through Control.Status, Control.Length and
 * Control.ImmediateData and the bytes, and answers with a send of one
 * segment that the client checks the same way.  Descriptors come from a
 * free list linked through Control.Next, as programs of the era kept them.
 */
#include "vt.h"

#include <stddef.h>

/* ------------------------------------------------------------------ */
/* The two spellings name the same bytes                                */
/* ------------------------------------------------------------------ */

#define SAME(giganet, mvia)                                                    \
    _Static_assert(offsetof(VIP_DESCRIPTOR, giganet) == offsetof(VIP_DESCRIPTOR, mvia) && \
                       sizeof(((VIP_DESCRIPTOR *)0)->giganet) ==               \
                           sizeof(((VIP_DESCRIPTOR *)0)->mvia),                \
                   #giganet " is not " #mvia)

SAME(Control, CS);
SAME(Control.Next, CS.Next);
SAME(Control.Next.Descriptor, CS.Next.Address);
SAME(Control.NextHandle, CS.NextHandle);
SAME(Control.SegCount, CS.SegCount);
SAME(Control.Control, CS.Control);
SAME(Control.Reserved, CS.Reserved);
SAME(Control.ImmediateData, CS.ImmediateData);
SAME(Control.Length, CS.Length);
SAME(Control.Status, CS.Status);
SAME(Data, DS);
SAME(Data[0], DS[0].Local);
SAME(Data[0].Data, DS[0].Local.Data);
SAME(Data[0].Data.Address, DS[0].Local.Data.Address);
SAME(Data[0].Data.AddressBits, DS[0].Remote.Data.AddressBits);
SAME(Data[0].Handle, DS[0].Local.Handle);
SAME(Data[0].Handle, DS[0].Remote.Handle);
SAME(Data[0].Length, DS[0].Local.Length);
SAME(Data[0].Length, DS[0].Remote.Reserved);
SAME(Data[1], DS[1].Local);
SAME(Data[1].Data, DS[1].Local.Data);
SAME(Data[1].Handle, DS[1].Local.Handle);
SAME(Data[1].Length, DS[1].Local.Length);

/* The address segment laid over a data segment. */
_Static_assert(sizeof(VIP_ADDRESS_SEGMENT) == sizeof(VIP_DATA_SEGMENT), "segment sizes");
_Static_assert(offsetof(VIP_ADDRESS_SEGMENT, Data) == offsetof(VIP_DATA_SEGMENT, Data), "Data");
_Static_assert(offsetof(VIP_ADDRESS_SEGMENT, Handle) == offsetof(VIP_DATA_SEGMENT, Handle), "Handle");
_Static_assert(offsetof(VIP_ADDRESS_SEGMENT, Reserved) == offsetof(VIP_DATA_SEGMENT, Length),
               "Reserved");

/* The offsets libvipl reads (crates/via-core: descriptor.rs, consts.rs). */
_Static_assert(sizeof(VIP_CONTROL_SEGMENT) == 32, "control segment");
_Static_assert(sizeof(VIP_DATA_SEGMENT) == 16, "data segment");
_Static_assert(sizeof(VIP_DESCRIPTOR) == VIP_DESCRIPTOR_ALIGNMENT, "descriptor");
_Static_assert(offsetof(VIP_DESCRIPTOR, Control.Next) == 0, "Next");
_Static_assert(offsetof(VIP_DESCRIPTOR, Control.SegCount) == 12, "SegCount");
_Static_assert(offsetof(VIP_DESCRIPTOR, Control.Control) == 14, "Control");
_Static_assert(offsetof(VIP_DESCRIPTOR, Control.Reserved) == 16, "Reserved");
_Static_assert(offsetof(VIP_DESCRIPTOR, Control.ImmediateData) == 20, "ImmediateData");
_Static_assert(offsetof(VIP_DESCRIPTOR, Control.Length) == 24, "Length");
_Static_assert(offsetof(VIP_DESCRIPTOR, Control.Status) == 28, "Status");
_Static_assert(offsetof(VIP_DESCRIPTOR, Data[0]) == 32, "Data[0]");
_Static_assert(offsetof(VIP_DESCRIPTOR, Data[1].Handle) == 56, "Data[1].Handle");
_Static_assert(offsetof(VIP_DESCRIPTOR, Data[1].Length) == 60, "Data[1].Length");

/* ------------------------------------------------------------------ */
/* The exchange                                                         */
/* ------------------------------------------------------------------ */

#define NDESC     4
#define DESC_AREA 4096            /* descriptors first, then the buffers */
#define MSG_LEN   1000            /* the client's send, in two segments */
#define RDMA_LEN  70000           /* the RDMA write */
#define REPLY_LEN 333             /* the server's answer, one segment */
#define REGION    (DESC_AREA + 3 * 131072)

#define MSG_IMM   0x61C0FFEEu
#define RDMA_IMM  0x0B0E1999u

#define MSG_SEED   11u
#define RDMA_SEED  22u
#define REPLY_SEED 33u

/* One side: a VI and one registered region of descriptors and buffers. */
typedef struct {
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag;
    VIP_VI_HANDLE vi;
    vt_mem mem;
    VIP_DESCRIPTOR *free_list; /* linked through Control.Next.Descriptor */
} side;

/* Buffer i of the region (128 KiB each, after the descriptors). */
static VIP_UINT8 *buffer(side *s, unsigned i)
{
    return s->mem.base + DESC_AREA + (size_t)i * 131072;
}

static void side_open(side *s)
{
    VIP_VI_ATTRIBUTES va;
    unsigned i;
    memset(s, 0, sizeof *s);
    s->nic = vt_open_nic(VT_DEV);
    CHECK_OK(VipCreatePtag(s->nic, &s->ptag));
    vt_mem_reg(&s->mem, s->nic, s->ptag, REGION, VIP_TRUE, VIP_FALSE);
    /* The descriptors, 64-byte aligned, on a free list. */
    s->free_list = NULL;
    for (i = 0; i < NDESC; i++) {
        VIP_DESCRIPTOR *d = (VIP_DESCRIPTOR *)(void *)(s->mem.base + i * VIP_DESCRIPTOR_ALIGNMENT);
        d->Control.Next.Descriptor = s->free_list;
        s->free_list = d;
    }
    va = vt_vi_attrs(VIP_SERVICE_RELIABLE_DELIVERY, s->ptag, VT_MAX_TRANSFER, VIP_TRUE, VIP_FALSE);
    CHECK_OK(VipCreateVi(s->nic, &va, NULL, NULL, &s->vi));
}

static void side_close(side *s)
{
    if (vt_vi_state(s->vi) != VIP_STATE_IDLE)
        CHECK_OK(VipDisconnect(s->vi));
    CHECK_OK(VipDestroyVi(s->vi));
    vt_mem_dereg(&s->mem);
    CHECK_OK(VipDestroyPtag(s->nic, s->ptag));
    CHECK_OK(VipCloseNic(s->nic));
}

/* A descriptor off the free list, its control segment cleared. */
static VIP_DESCRIPTOR *get_desc(side *s)
{
    VIP_DESCRIPTOR *d = s->free_list;
    CHECK(d != NULL);
    s->free_list = d->Control.Next.Descriptor;
    memset(d, 0, sizeof *d);
    return d;
}

static void put_desc(side *s, VIP_DESCRIPTOR *d)
{
    d->Control.Next.Descriptor = s->free_list;
    s->free_list = d;
}

/* Data segment i covers len bytes at p. */
static void data_seg(side *s, VIP_DESCRIPTOR *d, unsigned i, void *p, VIP_UINT32 len)
{
    d->Data[i].Data.Address = p;
    d->Data[i].Handle = s->mem.mh;
    d->Data[i].Length = len;
}

/* The whole Status word, read through the Giganet name. */
#define CHECK_DONE(expected, d)                                                \
    do {                                                                       \
        VIP_UINT32 e_ = (expected);                                            \
        VIP_UINT32 a_ = (d)->Control.Status;                                   \
        if (a_ != e_) {                                                        \
            char eb_[160], ab_[160];                                           \
            VT_FAIL("%s->Control.Status: expected %s, got %s", #d,             \
                    vt_status_str(e_, eb_, sizeof eb_),                        \
                    vt_status_str(a_, ab_, sizeof ab_));                       \
        }                                                                      \
    } while (0)

static void server(int fd, void *arg)
{
    side s;
    char disc[VT_MAX_DISC];
    VIP_DESCRIPTOR *msg, *rdma, *reply, *got;
    (void)arg;
    side_open(&s);

    /* Two receives before the connection: the message, scattered over two
     * segments of its exact length, and the RDMA write's immediate data
     * (no segment: the bytes go where the write says). */
    msg = get_desc(&s);
    msg->Control.SegCount = 2;
    data_seg(&s, msg, 0, buffer(&s, 0), 600);
    data_seg(&s, msg, 1, buffer(&s, 0) + 600, MSG_LEN - 600);
    CHECK_OK(VipPostRecv(s.vi, msg, s.mem.mh));
    rdma = get_desc(&s);
    rdma->Control.SegCount = 0;
    CHECK_OK(VipPostRecv(s.vi, rdma, s.mem.mh));

    /* Where the client may write: buffer 1. */
    vt_put_u64(fd, (uint64_t)(uintptr_t)buffer(&s, 1));
    vt_put_u64(fd, s.mem.mh);
    vt_disc(disc, sizeof disc, "giganet");
    vt_accept(s.nic, s.vi, disc);

    got = vt_recv_wait(s.vi);
    CHECK_PTR(msg, got);
    CHECK_DONE(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, got);
    CHECK_EQ(MSG_LEN, got->Control.Length);
    CHECK_EQ(MSG_IMM, got->Control.ImmediateData);
    CHECK_EQ(2, got->Control.SegCount);
    CHECK_PATTERN(got->Data[0].Data.Address, MSG_LEN, MSG_SEED);
    put_desc(&s, got);

    got = vt_recv_wait(s.vi);
    CHECK_PTR(rdma, got);
    CHECK_DONE(VIP_STATUS_DONE | VIP_STATUS_OP_REMOTE_RDMA_WRITE | VIP_STATUS_IMMEDIATE, got);
    CHECK_EQ(RDMA_LEN, got->Control.Length);
    CHECK_EQ(RDMA_IMM, got->Control.ImmediateData);
    CHECK_PATTERN(buffer(&s, 1), RDMA_LEN, RDMA_SEED);
    put_desc(&s, got);

    /* The answer: one segment, no immediate data. */
    reply = get_desc(&s);
    vt_fill(buffer(&s, 2), REPLY_LEN, REPLY_SEED);
    reply->Control.Control = VIP_CONTROL_OP_SENDRECV;
    reply->Control.SegCount = 1;
    reply->Control.Length = REPLY_LEN;
    data_seg(&s, reply, 0, buffer(&s, 2), REPLY_LEN);
    CHECK_OK(VipPostSend(s.vi, reply, s.mem.mh));
    got = vt_send_wait(s.vi);
    CHECK_PTR(reply, got);
    CHECK_DONE(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
    CHECK_EQ(REPLY_LEN, got->Control.Length);
    put_desc(&s, got);

    vt_sync(fd, 1);
    side_close(&s);
}

static void client(int fd)
{
    side s;
    char disc[VT_MAX_DISC];
    VIP_DESCRIPTOR *reply, *msg, *rdma, *got;
    VIP_ADDRESS_SEGMENT *remote;
    VIP_UINT64 raddr;
    VIP_MEM_HANDLE rmh;
    side_open(&s);

    /* The receive for the answer, with room to spare. */
    reply = get_desc(&s);
    reply->Control.SegCount = 1;
    data_seg(&s, reply, 0, buffer(&s, 2), 4096);
    CHECK_OK(VipPostRecv(s.vi, reply, s.mem.mh));

    raddr = vt_get_u64(fd);
    rmh = (VIP_MEM_HANDLE)vt_get_u64(fd);
    vt_disc(disc, sizeof disc, "giganet");
    vt_connect(s.nic, s.vi, disc);

    /* A send with immediate data, in two segments. */
    msg = get_desc(&s);
    vt_fill(buffer(&s, 0), MSG_LEN, MSG_SEED);
    msg->Control.Control = VIP_CONTROL_OP_SENDRECV | VIP_CONTROL_IMMEDIATE;
    msg->Control.SegCount = 2;
    msg->Control.ImmediateData = MSG_IMM;
    msg->Control.Length = MSG_LEN;
    data_seg(&s, msg, 0, buffer(&s, 0), 100);
    data_seg(&s, msg, 1, buffer(&s, 0) + 100, MSG_LEN - 100);
    CHECK_OK(VipPostSend(s.vi, msg, s.mem.mh));
    got = vt_send_wait(s.vi);
    CHECK_PTR(msg, got);
    CHECK_DONE(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
    CHECK_EQ(MSG_LEN, got->Control.Length);
    put_desc(&s, got);

    /* An RDMA write with immediate data: the address segment, then one
     * data segment. */
    rdma = get_desc(&s);
    vt_fill(buffer(&s, 1), RDMA_LEN, RDMA_SEED);
    rdma->Control.Control = VIP_CONTROL_OP_RDMAWRITE | VIP_CONTROL_IMMEDIATE;
    rdma->Control.SegCount = 2;
    rdma->Control.ImmediateData = RDMA_IMM;
    rdma->Control.Length = RDMA_LEN;
    remote = (VIP_ADDRESS_SEGMENT *)&rdma->Data[0];
    remote->Data.AddressBits = raddr;
    remote->Handle = rmh;
    remote->Reserved = 0;
    data_seg(&s, rdma, 1, buffer(&s, 1), RDMA_LEN);
    CHECK_OK(VipPostSend(s.vi, rdma, s.mem.mh));
    got = vt_send_wait(s.vi);
    CHECK_PTR(rdma, got);
    CHECK_DONE(VIP_STATUS_DONE | VIP_STATUS_OP_RDMA_WRITE, got);
    CHECK_EQ(RDMA_LEN, got->Control.Length);
    put_desc(&s, got);

    /* The answer. */
    got = vt_recv_wait(s.vi);
    CHECK_PTR(reply, got);
    CHECK_DONE(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, got);
    CHECK_EQ(REPLY_LEN, got->Control.Length);
    CHECK_PATTERN(got->Data[0].Data.Address, REPLY_LEN, REPLY_SEED);
    put_desc(&s, got);

    vt_sync(fd, 1);
    side_close(&s);
}

int main(void)
{
    vt_child srv;
    vt_init();
    srv = vt_spawn("server", server, NULL);
    vt_role = "client";
    client(srv.fd);
    vt_join(&srv);
    printf("giganet: Control/Data[] descriptors: send with immediate data, RDMA write with "
           "immediate data, answer\n");
    return 0;
}
