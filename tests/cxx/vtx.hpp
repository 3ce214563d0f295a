// vtx.hpp - the small kit of openvia's C++ programs (tests/cxx).
//
// Checks that print file:line and end the process with status 1; a server
// process forked before the first Vip* call, with a control channel (a
// socket pair) to the client; one side of a connection: NIC, protection
// tag, one registered region of descriptors and buffers, a reliable VI with
// RDMA write.  The kit never names a field of a descriptor: each program
// writes its descriptors in its own spelling of vipl.h.
//
// C++11: the programs are built with -std=c++17 and checked with -std=c++11.
#ifndef OPENVIA_VTX_HPP
#define OPENVIA_VTX_HPP

#include <vipl.h>

#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace vtx {

const char *const device = "/dev/via_lo";
const VIP_ULONG wait_ms = 20000;

// Descriptors first (64 bytes each), then buffers of 128 KiB.
const std::size_t desc_area = 4096;
const std::size_t buffer_size = 131072;
const unsigned buffers = 3;

struct Globals {
    const char *role;
    long root_pid;
};

inline Globals &globals()
{
    static Globals g = {"client", 0};
    return g;
}

[[noreturn]] inline void fail(const char *file, int line, const std::string &what)
{
    std::fprintf(stderr, "FAIL [%s pid %d] %s:%d: %s\n", globals().role, (int)getpid(), file, line,
                 what.c_str());
    std::fflush(nullptr);
    _exit(1);
}

inline std::string hex(unsigned long long v)
{
    char b[32];
    std::snprintf(b, sizeof b, "0x%llx", v);
    return b;
}

#define VTX_CHECK(cond)                                                        \
    do {                                                                       \
        if (!(cond))                                                           \
            ::vtx::fail(__FILE__, __LINE__, "check failed: " #cond);           \
    } while (0)

#define VTX_EQ(expected, actual)                                               \
    do {                                                                       \
        unsigned long long e_ = (unsigned long long)(expected);                \
        unsigned long long a_ = (unsigned long long)(actual);                  \
        if (e_ != a_)                                                          \
            ::vtx::fail(__FILE__, __LINE__,                                    \
                        std::string(#actual " == " #expected ": expected ") +  \
                            ::vtx::hex(e_) + ", got " + ::vtx::hex(a_));       \
    } while (0)

#define VTX_OK(call)                                                           \
    do {                                                                       \
        VIP_RETURN r_ = (call);                                                \
        if (r_ != VIP_SUCCESS)                                                 \
            ::vtx::fail(__FILE__, __LINE__,                                    \
                        std::string(#call " returned VIP_RETURN ") + std::to_string((int)r_)); \
    } while (0)

// Call first in main().
inline void init()
{
    std::setvbuf(stdout, nullptr, _IONBF, 0);
    std::signal(SIGPIPE, SIG_IGN);
    globals().root_pid = (long)getpid();
}

// A discriminator unique to this run: "<name>.<pid>".
inline std::string disc(const std::string &name)
{
    return name + "." + std::to_string(globals().root_pid);
}

// ------------------------------------------------------------------
// The server process and the control channel

struct Child {
    pid_t pid;
    int fd; // the client's end of the control channel
};

template <class Fn>
Child spawn(Fn fn)
{
    int sv[2];
    pid_t parent = getpid();
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        fail(__FILE__, __LINE__, std::string("socketpair: ") + std::strerror(errno));
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid < 0)
        fail(__FILE__, __LINE__, std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
        close(sv[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        globals().role = "server";
        fn(sv[1]);
        close(sv[1]);
        std::exit(0);
    }
    close(sv[1]);
    Child c = {pid, sv[0]};
    return c;
}

inline void join(Child &c)
{
    int st = 0;
    close(c.fd);
    c.fd = -1;
    while (waitpid(c.pid, &st, 0) < 0)
        if (errno != EINTR)
            fail(__FILE__, __LINE__, std::string("waitpid: ") + std::strerror(errno));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail(__FILE__, __LINE__, "the server ended with wait status " + hex((unsigned)st));
}

inline void put(int fd, std::uint64_t v)
{
    if (write(fd, &v, sizeof v) != (ssize_t)sizeof v)
        fail(__FILE__, __LINE__, "control channel write");
}

inline std::uint64_t get(int fd)
{
    std::uint64_t v = 0;
    if (read(fd, &v, sizeof v) != (ssize_t)sizeof v)
        fail(__FILE__, __LINE__, "control channel read: the other process went away");
    return v;
}

// Both processes reach the same point.
inline void sync(int fd, std::uint64_t tag)
{
    put(fd, tag);
    VTX_EQ(tag, get(fd));
}

// ------------------------------------------------------------------
// Data

inline unsigned char pat(std::uint32_t seed, std::size_t i)
{
    return (unsigned char)(seed * 131u + (std::uint32_t)i * 7u + (std::uint32_t)(i >> 8) * 13u);
}

inline void fill(void *p, std::size_t n, std::uint32_t seed)
{
    unsigned char *b = static_cast<unsigned char *>(p);
    for (std::size_t i = 0; i < n; i++)
        b[i] = pat(seed, i);
}

#define VTX_PATTERN(buf, len, seed)                                            \
    do {                                                                       \
        const unsigned char *b_ = (const unsigned char *)(buf);                \
        for (std::size_t i_ = 0; i_ < (std::size_t)(len); i_++)                \
            if (b_[i_] != ::vtx::pat((seed), i_))                              \
                ::vtx::fail(__FILE__, __LINE__, std::string("data of " #buf " differs at offset ") + \
                                                    std::to_string(i_));       \
    } while (0)

// ------------------------------------------------------------------
// One side of a connection

class Address {
  public:
    Address(VIP_NIC_HANDLE nic, const std::string &disc)
    {
        VIP_NIC_ATTRIBUTES at;
        std::memset(&at, 0, sizeof at);
        VTX_OK(VipQueryNic(nic, &at));
        VTX_CHECK(at.NicAddressLen > 0 && at.LocalNicAddress != nullptr);
        bytes_.assign(sizeof(VIP_NET_ADDRESS) + at.NicAddressLen + disc.size(), 0);
        VIP_NET_ADDRESS *a = get();
        a->HostAddressLen = at.NicAddressLen;
        a->DiscriminatorLen = (VIP_UINT16)disc.size();
        std::memcpy(a->HostAddress, at.LocalNicAddress, at.NicAddressLen);
        std::memcpy(a->HostAddress + at.NicAddressLen, disc.data(), disc.size());
    }
    // Room for any address the provider returns.
    Address() : bytes_(sizeof(VIP_NET_ADDRESS) + 512, 0) {}
    VIP_NET_ADDRESS *get() { return reinterpret_cast<VIP_NET_ADDRESS *>(bytes_.data()); }

  private:
    std::vector<unsigned char> bytes_;
};

class Side {
  public:
    Side()
    {
        VTX_OK(VipOpenNic(device, &nic));
        VTX_OK(VipCreatePtag(nic, &ptag));
        size_ = desc_area + buffers * buffer_size;
        void *p = nullptr;
        VTX_EQ(0, posix_memalign(&p, 4096, size_));
        base_ = static_cast<unsigned char *>(p);
        std::memset(base_, 0, size_);
        VIP_MEM_ATTRIBUTES ma;
        ma.Ptag = ptag;
        ma.EnableRdmaWrite = VIP_TRUE;
        ma.EnableRdmaRead = VIP_FALSE;
        VTX_OK(VipRegisterMem(nic, base_, size_, &ma, &mh));
        VIP_VI_ATTRIBUTES va;
        std::memset(&va, 0, sizeof va);
        va.ReliabilityLevel = VIP_SERVICE_RELIABLE_DELIVERY;
        va.MaxTransferSize = 1 << 20;
        va.QoS = nullptr;
        va.Ptag = ptag;
        va.EnableRdmaWrite = VIP_TRUE;
        va.EnableRdmaRead = VIP_FALSE;
        VTX_OK(VipCreateVi(nic, &va, nullptr, nullptr, &vi));
    }

    ~Side()
    {
        VIP_VI_STATE st;
        VIP_VI_ATTRIBUTES at;
        VIP_BOOLEAN se, re;
        VTX_OK(VipQueryVi(vi, &st, &at, &se, &re));
        if (st != VIP_STATE_IDLE)
            VTX_OK(VipDisconnect(vi));
        VTX_OK(VipDestroyVi(vi));
        VTX_OK(VipDeregisterMem(nic, base_, mh));
        std::free(base_);
        VTX_OK(VipDestroyPtag(nic, ptag));
        VTX_OK(VipCloseNic(nic));
    }

    Side(const Side &) = delete;
    Side &operator=(const Side &) = delete;

    // Server: wait for the request on disc and accept it.
    void accept(const std::string &disc)
    {
        Address local(nic, disc), remote;
        VIP_VI_ATTRIBUTES ra;
        VIP_CONN_HANDLE conn = nullptr;
        VTX_OK(VipConnectWait(nic, local.get(), wait_ms, remote.get(), &ra, &conn));
        VTX_OK(VipConnectAccept(conn, vi));
    }

    // Client: connect to disc on this host.
    void connect(const std::string &disc)
    {
        Address local(nic, disc + "/c"), remote(nic, disc);
        VIP_VI_ATTRIBUTES ra;
        VTX_OK(VipConnectRequest(vi, local.get(), remote.get(), wait_ms, &ra));
    }

    // Descriptor i (64-byte aligned, room for two segments), zeroed.
    VIP_DESCRIPTOR *desc(unsigned i)
    {
        VTX_CHECK((i + 1) * VIP_DESCRIPTOR_ALIGNMENT <= desc_area);
        VIP_DESCRIPTOR *d = reinterpret_cast<VIP_DESCRIPTOR *>(base_ + i * VIP_DESCRIPTOR_ALIGNMENT);
        std::memset(d, 0, sizeof *d);
        return d;
    }

    unsigned char *buffer(unsigned i)
    {
        VTX_CHECK(i < buffers);
        return base_ + desc_area + i * buffer_size;
    }

    VIP_DESCRIPTOR *send_wait()
    {
        VIP_DESCRIPTOR *d = nullptr;
        VTX_OK(VipSendWait(vi, wait_ms, &d));
        VTX_CHECK(d != nullptr);
        return d;
    }

    VIP_DESCRIPTOR *recv_wait()
    {
        VIP_DESCRIPTOR *d = nullptr;
        VTX_OK(VipRecvWait(vi, wait_ms, &d));
        VTX_CHECK(d != nullptr);
        return d;
    }

    VIP_NIC_HANDLE nic = nullptr;
    VIP_PROTECTION_HANDLE ptag = nullptr;
    VIP_VI_HANDLE vi = nullptr;
    VIP_MEM_HANDLE mh = 0;

  private:
    unsigned char *base_ = nullptr;
    std::size_t size_ = 0;
};

} // namespace vtx

#endif // OPENVIA_VTX_HPP
