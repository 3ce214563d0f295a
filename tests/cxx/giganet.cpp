// giganet.cpp - a C++ program in the spelling of Giganet's cLAN vipl.h and
// of the VI Developer's Guide: desc->Control, desc->Data[i],
// VIP_DATA_SEGMENT, VIP_ADDRESS_SEGMENT; never CS or DS.
//
// At compile time, each Giganet name is at the offset of its M-VIA name.
// At run time, two processes on this host: the client sends a message with
// immediate data in two segments, then RDMA-writes with immediate data into
// the server's buffer (the address segment is Data[0] as a
// VIP_ADDRESS_SEGMENT); the server checks both through Control.Status,
// Control.Length and Control.ImmediateData and the bytes, and answers with
// a send of one segment that the client checks the same way.
#include "vtx.hpp"

#define SAME(giganet, mvia)                                                    \
    static_assert(offsetof(VIP_DESCRIPTOR, giganet) == offsetof(VIP_DESCRIPTOR, mvia) && \
                      sizeof(((VIP_DESCRIPTOR *)nullptr)->giganet) ==          \
                          sizeof(((VIP_DESCRIPTOR *)nullptr)->mvia),           \
                  #giganet " is not " #mvia)

SAME(Control, CS);
SAME(Control.Next.Descriptor, CS.Next.Address);
SAME(Control.SegCount, CS.SegCount);
SAME(Control.Control, CS.Control);
SAME(Control.ImmediateData, CS.ImmediateData);
SAME(Control.Length, CS.Length);
SAME(Control.Status, CS.Status);
SAME(Data, DS);
SAME(Data[0].Data.Address, DS[0].Local.Data.Address);
SAME(Data[0].Data.AddressBits, DS[0].Remote.Data.AddressBits);
SAME(Data[0].Handle, DS[0].Remote.Handle);
SAME(Data[0].Length, DS[0].Local.Length);
SAME(Data[1].Data.Address, DS[1].Local.Data.Address);
SAME(Data[1].Handle, DS[1].Local.Handle);
SAME(Data[1].Length, DS[1].Local.Length);
static_assert(sizeof(VIP_DESCRIPTOR) == VIP_DESCRIPTOR_ALIGNMENT, "descriptor");
static_assert(sizeof(VIP_ADDRESS_SEGMENT) == sizeof(VIP_DATA_SEGMENT), "segments");

namespace {

const std::size_t msg_len = 1000, rdma_len = 70000, reply_len = 333;
const VIP_UINT32 msg_imm = 0x61C0FFEEu, rdma_imm = 0x0B0E1999u;
const std::uint32_t msg_seed = 11, rdma_seed = 22, reply_seed = 33;

void data_seg(vtx::Side &s, VIP_DESCRIPTOR *d, unsigned i, void *p, std::size_t len)
{
    d->Data[i].Data.Address = p;
    d->Data[i].Handle = s.mh;
    d->Data[i].Length = static_cast<VIP_UINT32>(len);
}

void server(int fd)
{
    vtx::Side s;
    VIP_DESCRIPTOR *msg = s.desc(0);
    msg->Control.SegCount = 2;
    data_seg(s, msg, 0, s.buffer(0), 600);
    data_seg(s, msg, 1, s.buffer(0) + 600, msg_len - 600);
    VTX_OK(VipPostRecv(s.vi, msg, s.mh));
    VIP_DESCRIPTOR *rdma = s.desc(1);
    VTX_OK(VipPostRecv(s.vi, rdma, s.mh));

    vtx::put(fd, reinterpret_cast<std::uintptr_t>(s.buffer(1)));
    vtx::put(fd, s.mh);
    s.accept(vtx::disc("giganet-cxx"));

    VIP_DESCRIPTOR *got = s.recv_wait();
    VTX_EQ(msg, got);
    VTX_EQ(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, got->Control.Status);
    VTX_EQ(msg_len, got->Control.Length);
    VTX_EQ(msg_imm, got->Control.ImmediateData);
    VTX_PATTERN(got->Data[0].Data.Address, msg_len, msg_seed);

    got = s.recv_wait();
    VTX_EQ(rdma, got);
    VTX_EQ(VIP_STATUS_DONE | VIP_STATUS_OP_REMOTE_RDMA_WRITE | VIP_STATUS_IMMEDIATE, got->Control.Status);
    VTX_EQ(rdma_len, got->Control.Length);
    VTX_EQ(rdma_imm, got->Control.ImmediateData);
    VTX_PATTERN(s.buffer(1), rdma_len, rdma_seed);

    VIP_DESCRIPTOR *reply = s.desc(2);
    vtx::fill(s.buffer(2), reply_len, reply_seed);
    reply->Control.Control = VIP_CONTROL_OP_SENDRECV;
    reply->Control.SegCount = 1;
    reply->Control.Length = reply_len;
    data_seg(s, reply, 0, s.buffer(2), reply_len);
    VTX_OK(VipPostSend(s.vi, reply, s.mh));
    got = s.send_wait();
    VTX_EQ(reply, got);
    VTX_EQ(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got->Control.Status);

    vtx::sync(fd, 1);
}

void client(int fd)
{
    vtx::Side s;
    VIP_DESCRIPTOR *reply = s.desc(0);
    reply->Control.SegCount = 1;
    data_seg(s, reply, 0, s.buffer(2), 4096);
    VTX_OK(VipPostRecv(s.vi, reply, s.mh));

    VIP_UINT64 raddr = vtx::get(fd);
    VIP_MEM_HANDLE rmh = static_cast<VIP_MEM_HANDLE>(vtx::get(fd));
    s.connect(vtx::disc("giganet-cxx"));

    VIP_DESCRIPTOR *msg = s.desc(1);
    vtx::fill(s.buffer(0), msg_len, msg_seed);
    msg->Control.Control = VIP_CONTROL_OP_SENDRECV | VIP_CONTROL_IMMEDIATE;
    msg->Control.SegCount = 2;
    msg->Control.ImmediateData = msg_imm;
    msg->Control.Length = msg_len;
    data_seg(s, msg, 0, s.buffer(0), 100);
    data_seg(s, msg, 1, s.buffer(0) + 100, msg_len - 100);
    VTX_OK(VipPostSend(s.vi, msg, s.mh));
    VIP_DESCRIPTOR *got = s.send_wait();
    VTX_EQ(msg, got);
    VTX_EQ(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got->Control.Status);
    VTX_EQ(msg_len, got->Control.Length);

    VIP_DESCRIPTOR *rdma = s.desc(2);
    vtx::fill(s.buffer(1), rdma_len, rdma_seed);
    rdma->Control.Control = VIP_CONTROL_OP_RDMAWRITE | VIP_CONTROL_IMMEDIATE;
    rdma->Control.SegCount = 2;
    rdma->Control.ImmediateData = rdma_imm;
    rdma->Control.Length = rdma_len;
    VIP_ADDRESS_SEGMENT *remote = reinterpret_cast<VIP_ADDRESS_SEGMENT *>(&rdma->Data[0]);
    remote->Data.AddressBits = raddr;
    remote->Handle = rmh;
    remote->Reserved = 0;
    data_seg(s, rdma, 1, s.buffer(1), rdma_len);
    VTX_OK(VipPostSend(s.vi, rdma, s.mh));
    got = s.send_wait();
    VTX_EQ(rdma, got);
    VTX_EQ(VIP_STATUS_DONE | VIP_STATUS_OP_RDMA_WRITE, got->Control.Status);
    VTX_EQ(rdma_len, got->Control.Length);

    got = s.recv_wait();
    VTX_EQ(reply, got);
    VTX_EQ(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, got->Control.Status);
    VTX_EQ(reply_len, got->Control.Length);
    VTX_PATTERN(got->Data[0].Data.Address, reply_len, reply_seed);

    vtx::sync(fd, 1);
}

} // namespace

int main()
{
    vtx::init();
    vtx::Child srv = vtx::spawn(server);
    client(srv.fd);
    vtx::join(srv);
    std::printf("giganet (C++): send with immediate data, RDMA write with immediate data, answer\n");
    return 0;
}
