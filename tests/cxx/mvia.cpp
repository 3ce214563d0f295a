// mvia.cpp - a C++ program in M-VIA's spelling of vipl.h: desc->CS,
// desc->DS[i].Local and desc->DS[0].Remote; never Control or Data.
//
// The exchange of giganet.cpp: two processes on this host; the client sends
// a message with immediate data in two segments, then RDMA-writes with
// immediate data into the server's buffer (the address segment is
// DS[0].Remote); the server checks both through CS.Status, CS.Length and
// CS.ImmediateData and the bytes, and answers with a send of one segment
// that the client checks the same way.
#include "vtx.hpp"

namespace {

const std::size_t msg_len = 1000, rdma_len = 70000, reply_len = 333;
const VIP_UINT32 msg_imm = 0x4D564941u, rdma_imm = 0x00C0FFEEu;
const std::uint32_t msg_seed = 44, rdma_seed = 55, reply_seed = 66;

void local_seg(vtx::Side &s, VIP_DESCRIPTOR *d, unsigned i, void *p, std::size_t len)
{
    d->DS[i].Local.Data.Address = p;
    d->DS[i].Local.Handle = s.mh;
    d->DS[i].Local.Length = static_cast<VIP_UINT32>(len);
}

void server(int fd)
{
    vtx::Side s;
    VIP_DESCRIPTOR *msg = s.desc(0);
    msg->CS.SegCount = 2;
    local_seg(s, msg, 0, s.buffer(0), 600);
    local_seg(s, msg, 1, s.buffer(0) + 600, msg_len - 600);
    VTX_OK(VipPostRecv(s.vi, msg, s.mh));
    VIP_DESCRIPTOR *rdma = s.desc(1);
    VTX_OK(VipPostRecv(s.vi, rdma, s.mh));

    vtx::put(fd, reinterpret_cast<std::uintptr_t>(s.buffer(1)));
    vtx::put(fd, s.mh);
    s.accept(vtx::disc("mvia-cxx"));

    VIP_DESCRIPTOR *got = s.recv_wait();
    VTX_EQ(msg, got);
    VTX_EQ(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, got->CS.Status);
    VTX_EQ(msg_len, got->CS.Length);
    VTX_EQ(msg_imm, got->CS.ImmediateData);
    VTX_PATTERN(got->DS[0].Local.Data.Address, msg_len, msg_seed);

    got = s.recv_wait();
    VTX_EQ(rdma, got);
    VTX_EQ(VIP_STATUS_DONE | VIP_STATUS_OP_REMOTE_RDMA_WRITE | VIP_STATUS_IMMEDIATE, got->CS.Status);
    VTX_EQ(rdma_len, got->CS.Length);
    VTX_EQ(rdma_imm, got->CS.ImmediateData);
    VTX_PATTERN(s.buffer(1), rdma_len, rdma_seed);

    VIP_DESCRIPTOR *reply = s.desc(2);
    vtx::fill(s.buffer(2), reply_len, reply_seed);
    reply->CS.Control = VIP_CONTROL_OP_SENDRECV;
    reply->CS.SegCount = 1;
    reply->CS.Length = reply_len;
    local_seg(s, reply, 0, s.buffer(2), reply_len);
    VTX_OK(VipPostSend(s.vi, reply, s.mh));
    got = s.send_wait();
    VTX_EQ(reply, got);
    VTX_EQ(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got->CS.Status);

    vtx::sync(fd, 1);
}

void client(int fd)
{
    vtx::Side s;
    VIP_DESCRIPTOR *reply = s.desc(0);
    reply->CS.SegCount = 1;
    local_seg(s, reply, 0, s.buffer(2), 4096);
    VTX_OK(VipPostRecv(s.vi, reply, s.mh));

    VIP_UINT64 raddr = vtx::get(fd);
    VIP_MEM_HANDLE rmh = static_cast<VIP_MEM_HANDLE>(vtx::get(fd));
    s.connect(vtx::disc("mvia-cxx"));

    VIP_DESCRIPTOR *msg = s.desc(1);
    vtx::fill(s.buffer(0), msg_len, msg_seed);
    msg->CS.Control = VIP_CONTROL_OP_SENDRECV | VIP_CONTROL_IMMEDIATE;
    msg->CS.SegCount = 2;
    msg->CS.ImmediateData = msg_imm;
    msg->CS.Length = msg_len;
    local_seg(s, msg, 0, s.buffer(0), 100);
    local_seg(s, msg, 1, s.buffer(0) + 100, msg_len - 100);
    VTX_OK(VipPostSend(s.vi, msg, s.mh));
    VIP_DESCRIPTOR *got = s.send_wait();
    VTX_EQ(msg, got);
    VTX_EQ(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got->CS.Status);
    VTX_EQ(msg_len, got->CS.Length);

    VIP_DESCRIPTOR *rdma = s.desc(2);
    vtx::fill(s.buffer(1), rdma_len, rdma_seed);
    rdma->CS.Control = VIP_CONTROL_OP_RDMAWRITE | VIP_CONTROL_IMMEDIATE;
    rdma->CS.SegCount = 2;
    rdma->CS.ImmediateData = rdma_imm;
    rdma->CS.Length = rdma_len;
    rdma->DS[0].Remote.Data.AddressBits = raddr;
    rdma->DS[0].Remote.Handle = rmh;
    rdma->DS[0].Remote.Reserved = 0;
    local_seg(s, rdma, 1, s.buffer(1), rdma_len);
    VTX_OK(VipPostSend(s.vi, rdma, s.mh));
    got = s.send_wait();
    VTX_EQ(rdma, got);
    VTX_EQ(VIP_STATUS_DONE | VIP_STATUS_OP_RDMA_WRITE, got->CS.Status);
    VTX_EQ(rdma_len, got->CS.Length);

    got = s.recv_wait();
    VTX_EQ(reply, got);
    VTX_EQ(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, got->CS.Status);
    VTX_EQ(reply_len, got->CS.Length);
    VTX_PATTERN(got->DS[0].Local.Data.Address, reply_len, reply_seed);

    vtx::sync(fd, 1);
}

} // namespace

int main()
{
    vtx::init();
    vtx::Child srv = vtx::spawn(server);
    client(srv.fd);
    vtx::join(srv);
    std::printf("mvia (C++): send with immediate data, RDMA write with immediate data, answer\n");
    return 0;
}
