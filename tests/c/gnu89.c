/*
 * gnu89.c - a VIA program as programs of the era were written: the M-VIA
 * spelling (desc->CS, desc->DS[i].Local), C89 with GNU extensions (built
 * with -std=gnu89, and checked with -std=c89 -pedantic): declarations at
 * the top of blocks, no line comments, no inline functions.
 *
 * Two processes on this host: the client sends a message with immediate
 * data in two segments; the server receives it in one, checks it and sends
 * it back with other immediate data; the client receives the echo in two
 * segments and checks it.  A pipe tells the server when the client is done.
 */
#define _GNU_SOURCE
#include <vipl.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define DEVICE     "/dev/via_lo"
#define MSG_LEN    777
#define SPLIT      300 /* bytes in the first of two segments */
#define IMM        0x5EEDF00DUL
#define ECHO_IMM   (IMM ^ 0xFFFFUL)
#define TIMEOUT_MS 20000UL
#define REGION     8192 /* two descriptors, then the send and receive buffers */

static const char *role = "client";

static void fail(int line, const char *what, unsigned long got)
{
    fprintf(stderr, "FAIL [%s] gnu89.c:%d: %s (got %lu, 0x%lx)\n", role, line, what, got, got);
    exit(1);
}

#define OK(call)                                                               \
    do {                                                                       \
        VIP_RETURN r_ = (call);                                                \
        if (r_ != VIP_SUCCESS)                                                 \
            fail(__LINE__, #call, (unsigned long)r_);                          \
    } while (0)

#define EXPECT_EQ(expected, actual)                                            \
    do {                                                                       \
        unsigned long a_ = (unsigned long)(actual);                            \
        if (a_ != (unsigned long)(expected))                                   \
            fail(__LINE__, #actual " == " #expected, a_);                      \
    } while (0)

struct side {
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag;
    VIP_VI_HANDLE vi;
    void *raw;
    char *mem; /* 64-byte aligned */
    VIP_MEM_HANDLE mh;
    VIP_DESCRIPTOR *sd, *rd;
    unsigned char *sbuf, *rbuf;
};

static void open_side(struct side *s)
{
    VIP_MEM_ATTRIBUTES ma;
    VIP_VI_ATTRIBUTES va;

    memset(s, 0, sizeof *s);
    OK(VipOpenNic(DEVICE, &s->nic));
    OK(VipCreatePtag(s->nic, &s->ptag));

    s->raw = calloc(1, REGION + VIP_DESCRIPTOR_ALIGNMENT);
    if (s->raw == NULL)
        fail(__LINE__, "calloc", 0);
    s->mem = (char *)(((unsigned long)s->raw + VIP_DESCRIPTOR_ALIGNMENT - 1) &
                      ~(unsigned long)(VIP_DESCRIPTOR_ALIGNMENT - 1));
    ma.Ptag = s->ptag;
    ma.EnableRdmaWrite = VIP_FALSE;
    ma.EnableRdmaRead = VIP_FALSE;
    OK(VipRegisterMem(s->nic, s->mem, REGION, &ma, &s->mh));
    s->sd = (VIP_DESCRIPTOR *)s->mem;
    s->rd = (VIP_DESCRIPTOR *)(s->mem + VIP_DESCRIPTOR_ALIGNMENT);
    s->sbuf = (unsigned char *)s->mem + 1024;
    s->rbuf = (unsigned char *)s->mem + 4096;

    memset(&va, 0, sizeof va);
    va.ReliabilityLevel = VIP_SERVICE_RELIABLE_DELIVERY;
    va.MaxTransferSize = 65536;
    va.QoS = NULL;
    va.Ptag = s->ptag;
    va.EnableRdmaWrite = VIP_FALSE;
    va.EnableRdmaRead = VIP_FALSE;
    OK(VipCreateVi(s->nic, &va, NULL, NULL, &s->vi));
}

static void close_side(struct side *s)
{
    OK(VipDisconnect(s->vi));
    OK(VipDestroyVi(s->vi));
    OK(VipDeregisterMem(s->nic, s->mem, s->mh));
    OK(VipDestroyPtag(s->nic, s->ptag));
    OK(VipCloseNic(s->nic));
    free(s->raw);
}

/* This host's address with the discriminator "gnu89.<pid of the client>". */
static VIP_NET_ADDRESS *address(struct side *s, const char *suffix, long pid)
{
    VIP_NIC_ATTRIBUTES at;
    VIP_NET_ADDRESS *a;
    char disc[64];
    size_t n;

    memset(&at, 0, sizeof at);
    OK(VipQueryNic(s->nic, &at));
    sprintf(disc, "gnu89.%ld%s", pid, suffix);
    n = strlen(disc);
    a = (VIP_NET_ADDRESS *)malloc(sizeof *a + at.NicAddressLen + n);
    if (a == NULL)
        fail(__LINE__, "malloc", 0);
    a->HostAddressLen = at.NicAddressLen;
    a->DiscriminatorLen = (VIP_UINT16)n;
    memcpy(a->HostAddress, at.LocalNicAddress, at.NicAddressLen);
    memcpy(a->HostAddress + at.NicAddressLen, disc, n);
    return a;
}

/* A descriptor of len bytes at buf in one or two segments. */
static void fill(struct side *s, VIP_DESCRIPTOR *d, unsigned char *buf, unsigned long len,
                 int two)
{
    memset(d, 0, sizeof *d);
    d->CS.Control = VIP_CONTROL_OP_SENDRECV;
    d->CS.Length = (VIP_UINT32)len;
    d->CS.SegCount = (VIP_UINT16)(two ? 2 : 1);
    d->DS[0].Local.Data.Address = buf;
    d->DS[0].Local.Handle = s->mh;
    d->DS[0].Local.Length = (VIP_UINT32)(two ? SPLIT : len);
    if (two) {
        d->DS[1].Local.Data.Address = buf + SPLIT;
        d->DS[1].Local.Handle = s->mh;
        d->DS[1].Local.Length = (VIP_UINT32)(len - SPLIT);
    }
}

static unsigned char pattern(unsigned long i)
{
    return (unsigned char)(i * 7 + 3);
}

static void check_received(struct side *s, VIP_DESCRIPTOR *want, unsigned long imm)
{
    VIP_DESCRIPTOR *d = NULL;
    unsigned long i;

    OK(VipRecvWait(s->vi, TIMEOUT_MS, &d));
    if (d != want)
        fail(__LINE__, "VipRecvWait returned another descriptor", (unsigned long)d);
    EXPECT_EQ(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE, d->CS.Status);
    EXPECT_EQ(MSG_LEN, d->CS.Length);
    EXPECT_EQ(imm, d->CS.ImmediateData);
    for (i = 0; i < MSG_LEN; i++)
        if (s->rbuf[i] != pattern(i))
            fail(__LINE__, "a received byte differs; at offset", i);
}

static void send_and_wait(struct side *s, unsigned long imm)
{
    VIP_DESCRIPTOR *d = NULL;

    s->sd->CS.Control |= VIP_CONTROL_IMMEDIATE;
    s->sd->CS.ImmediateData = (VIP_UINT32)imm;
    OK(VipPostSend(s->vi, s->sd, s->mh));
    OK(VipSendWait(s->vi, TIMEOUT_MS, &d));
    if (d != s->sd)
        fail(__LINE__, "VipSendWait returned another descriptor", (unsigned long)d);
    EXPECT_EQ(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, d->CS.Status);
    EXPECT_EQ(MSG_LEN, d->CS.Length);
}

static void server(long pid, int done_fd)
{
    struct side s;
    VIP_NET_ADDRESS *local, *remote;
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn;
    char c;

    open_side(&s);
    fill(&s, s.rd, s.rbuf, MSG_LEN, 0);
    OK(VipPostRecv(s.vi, s.rd, s.mh));

    local = address(&s, "", pid);
    remote = (VIP_NET_ADDRESS *)calloc(1, sizeof *remote + 256);
    if (remote == NULL)
        fail(__LINE__, "calloc", 0);
    OK(VipConnectWait(s.nic, local, TIMEOUT_MS, remote, &ra, &conn));
    OK(VipConnectAccept(conn, s.vi));

    check_received(&s, s.rd, IMM);
    /* The echo, from where the message arrived. */
    fill(&s, s.sd, s.rbuf, MSG_LEN, 0);
    send_and_wait(&s, ECHO_IMM);

    if (read(done_fd, &c, 1) != 1)
        fail(__LINE__, "the client went away", 0);
    close_side(&s);
    free(local);
    free(remote);
}

static void client(long pid, int done_fd)
{
    struct side s;
    VIP_NET_ADDRESS *local, *remote;
    VIP_VI_ATTRIBUTES ra;
    unsigned long i;

    open_side(&s);
    fill(&s, s.rd, s.rbuf, MSG_LEN, 1);
    OK(VipPostRecv(s.vi, s.rd, s.mh));

    local = address(&s, "/c", pid);
    remote = address(&s, "", pid);
    OK(VipConnectRequest(s.vi, local, remote, TIMEOUT_MS, &ra));

    for (i = 0; i < MSG_LEN; i++)
        s.sbuf[i] = pattern(i);
    fill(&s, s.sd, s.sbuf, MSG_LEN, 1);
    send_and_wait(&s, IMM);
    check_received(&s, s.rd, ECHO_IMM);

    if (write(done_fd, "x", 1) != 1)
        fail(__LINE__, "write to the server", 0);
    close_side(&s);
    free(local);
    free(remote);
}

int main(void)
{
    int done[2];
    int status;
    long pid;
    pid_t child;

    setvbuf(stdout, NULL, _IONBF, 0);
    pid = (long)getpid();
    if (pipe(done) != 0)
        fail(__LINE__, "pipe", 0);
    child = fork();
    if (child < 0)
        fail(__LINE__, "fork", 0);
    if (child == 0) {
        role = "server";
        close(done[1]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        server(pid, done[0]);
        exit(0);
    }
    close(done[0]);
    client(pid, done[1]);
    close(done[1]);
    if (waitpid(child, &status, 0) != child)
        fail(__LINE__, "waitpid", 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail(__LINE__, "the server failed; wait status", (unsigned long)status);
    printf("gnu89: openvia " VIPL_VERSION ": a message with immediate data and its echo\n");
    return 0;
}
