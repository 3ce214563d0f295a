/*
 * pingpong.c - a small VIA program: two processes bounce a message back and
 * forth over a VI connection and report the round-trip latency.
 *
 *   pingpong                 fork a server and run the client against it
 *   pingpong server          wait for one client
 *   pingpong client [host]   connect to the server on host (default: this host)
 *
 * Build:  cc pingpong.c $(pkg-config --cflags --libs vipl) -o pingpong
 *
 * The steps are the ones every VIA program takes:
 *   1. open the NIC and create a protection tag;
 *   2. register the memory that holds data buffers and descriptors;
 *   3. create a VI and post receive descriptors (before anything can arrive);
 *   4. connect: the server waits on a discriminator, the client asks for it;
 *   5. post send descriptors and wait for completions;
 *   6. disconnect and release everything in reverse order.
 */
#define _GNU_SOURCE
#include <vipl.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DEVICE        "/dev/via_lo" /* VIA_DEVICE in the environment overrides it */
#define DISCRIMINATOR "pingpong"
#define MSG_SIZE      64      /* bytes per message */
#define WARMUP        100     /* round trips not measured */
#define ROUNDS        10000   /* round trips measured */
#define TIMEOUT_MS    30000UL

/* Stop with a message when a VIPL call does not return VIP_SUCCESS. */
#define VIP_OK(call)                                                           \
    do {                                                                       \
        VIP_RETURN rc_ = (call);                                               \
        if (rc_ != VIP_SUCCESS) {                                              \
            fprintf(stderr, "%s:%d: %s failed with VIP_RETURN %d\n", __FILE__, \
                    __LINE__, #call, (int)rc_);                                \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

/* Everything one side of the connection needs. */
struct endpoint {
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE ptag;
    VIP_VI_HANDLE vi;
    /* One registered region holds both descriptors (64-byte aligned, as
     * VIA requires) followed by the send and receive buffers. */
    unsigned char *mem;
    VIP_MEM_HANDLE mh;
    VIP_DESCRIPTOR *send_desc, *recv_desc;
    unsigned char *send_buf, *recv_buf;
};

#define MEM_SIZE 4096

static void open_endpoint(struct endpoint *ep)
{
    /* 1. The NIC, and a protection tag: memory and VIs with the same tag
     *    may be used together. */
    const char *device = getenv("VIA_DEVICE");
    VIP_OK(VipOpenNic(device != NULL ? device : DEVICE, &ep->nic));
    VIP_OK(VipCreatePtag(ep->nic, &ep->ptag));

    /* 2. Register memory.  The provider reads descriptors and moves data
     *    only within registered regions. */
    ep->mem = aligned_alloc(4096, MEM_SIZE);
    if (ep->mem == NULL) {
        perror("aligned_alloc");
        exit(1);
    }
    memset(ep->mem, 0, MEM_SIZE);
    VIP_MEM_ATTRIBUTES ma = {.Ptag = ep->ptag, .EnableRdmaWrite = VIP_FALSE,
                             .EnableRdmaRead = VIP_FALSE};
    VIP_OK(VipRegisterMem(ep->nic, ep->mem, MEM_SIZE, &ma, &ep->mh));
    ep->send_desc = (VIP_DESCRIPTOR *)(void *)ep->mem;
    ep->recv_desc = (VIP_DESCRIPTOR *)(void *)(ep->mem + 64);
    ep->send_buf = ep->mem + 1024;
    ep->recv_buf = ep->mem + 2048;

    /* 3. A VI: reliable delivery, messages up to MSG_SIZE bytes, no
     *    completion queues (completions are taken from the VI itself). */
    VIP_VI_ATTRIBUTES va = {.ReliabilityLevel = VIP_SERVICE_RELIABLE_DELIVERY,
                            .MaxTransferSize = MSG_SIZE, .QoS = NULL, .Ptag = ep->ptag,
                            .EnableRdmaWrite = VIP_FALSE, .EnableRdmaRead = VIP_FALSE};
    VIP_OK(VipCreateVi(ep->nic, &va, NULL, NULL, &ep->vi));
}

/* A network address: the host address, then the discriminator. */
static VIP_NET_ADDRESS *make_address(const VIP_UINT8 *host, VIP_UINT16 hostlen)
{
    VIP_UINT16 dlen = (VIP_UINT16)strlen(DISCRIMINATOR);
    VIP_NET_ADDRESS *a = calloc(1, sizeof *a + hostlen + dlen);
    a->HostAddressLen = hostlen;
    a->DiscriminatorLen = dlen;
    memcpy(a->HostAddress, host, hostlen);
    memcpy(a->HostAddress + hostlen, DISCRIMINATOR, dlen);
    return a;
}

static VIP_NET_ADDRESS *local_address(struct endpoint *ep)
{
    VIP_NIC_ATTRIBUTES at;
    VIP_OK(VipQueryNic(ep->nic, &at));
    return make_address(at.LocalNicAddress, at.NicAddressLen);
}

/* Post the receive descriptor: one data segment, the whole receive buffer. */
static void post_receive(struct endpoint *ep)
{
    VIP_DESCRIPTOR *d = ep->recv_desc;
    memset(d, 0, sizeof *d);
    d->CS.SegCount = 1;
    d->DS[0].Local.Data.Address = ep->recv_buf;
    d->DS[0].Local.Handle = ep->mh;
    d->DS[0].Local.Length = MSG_SIZE;
    VIP_OK(VipPostRecv(ep->vi, d, ep->mh));
}

/* Send the send buffer and wait until the send descriptor completes. */
static void send_message(struct endpoint *ep)
{
    VIP_DESCRIPTOR *d = ep->send_desc, *done;
    memset(d, 0, sizeof *d);
    d->CS.SegCount = 1;
    d->CS.Length = MSG_SIZE;
    d->DS[0].Local.Data.Address = ep->send_buf;
    d->DS[0].Local.Handle = ep->mh;
    d->DS[0].Local.Length = MSG_SIZE;
    VIP_OK(VipPostSend(ep->vi, d, ep->mh));
    VIP_OK(VipSendWait(ep->vi, TIMEOUT_MS, &done));
    if (done->CS.Status != (VIP_STATUS_DONE | VIP_STATUS_OP_SEND)) {
        fprintf(stderr, "send failed, status 0x%x\n", (unsigned)done->CS.Status);
        exit(1);
    }
}

/* Wait for the posted receive to complete. */
static void receive_message(struct endpoint *ep)
{
    VIP_DESCRIPTOR *done;
    VIP_OK(VipRecvWait(ep->vi, TIMEOUT_MS, &done));
    if ((done->CS.Status & (VIP_STATUS_DONE | VIP_STATUS_ERROR_MASK)) != VIP_STATUS_DONE ||
        done->CS.Length != MSG_SIZE) {
        fprintf(stderr, "receive failed, status 0x%x, length %u\n",
                (unsigned)done->CS.Status, (unsigned)done->CS.Length);
        exit(1);
    }
}

/* 6. Release everything, in reverse order. */
static void close_endpoint(struct endpoint *ep)
{
    VIP_VI_STATE state;
    VIP_VI_ATTRIBUTES attrs;
    VIP_BOOLEAN send_empty, recv_empty;
    VIP_OK(VipQueryVi(ep->vi, &state, &attrs, &send_empty, &recv_empty));
    if (state != VIP_STATE_IDLE)
        VIP_OK(VipDisconnect(ep->vi));
    VIP_OK(VipDestroyVi(ep->vi));
    VIP_OK(VipDeregisterMem(ep->nic, ep->mem, ep->mh));
    VIP_OK(VipDestroyPtag(ep->nic, ep->ptag));
    VIP_OK(VipCloseNic(ep->nic));
    free(ep->mem);
}

static int run_server(void)
{
    struct endpoint ep;
    open_endpoint(&ep);
    post_receive(&ep);

    /* 4. Wait for a connection request for our discriminator, accept it. */
    VIP_NET_ADDRESS *local = local_address(&ep);
    VIP_NET_ADDRESS *remote = calloc(1, sizeof *remote + 256);
    VIP_VI_ATTRIBUTES remote_attrs;
    VIP_CONN_HANDLE conn;
    VIP_OK(VipConnectWait(ep.nic, local, VIP_INFINITE, remote, &remote_attrs, &conn));
    VIP_OK(VipConnectAccept(conn, ep.vi));

    /* 5. Echo: every message goes back as it came.  The next receive is
     *    posted before the reply goes out, so it is ready in time. */
    for (int i = 0; i < WARMUP + ROUNDS; i++) {
        receive_message(&ep);
        memcpy(ep.send_buf, ep.recv_buf, MSG_SIZE);
        post_receive(&ep);
        send_message(&ep);
    }

    /* The client disconnects when it is done; its last message was the
     * last one, so wait for the disconnect (the VI goes to the error state)
     * before closing. */
    VIP_DESCRIPTOR *done;
    VIP_RETURN rc = VipRecvWait(ep.vi, TIMEOUT_MS, &done); /* the flushed receive */
    if (rc != VIP_SUCCESS || !(done->CS.Status & VIP_STATUS_DESC_FLUSHED_ERROR)) {
        fprintf(stderr, "server: expected the client to disconnect\n");
        return 1;
    }
    close_endpoint(&ep);
    free(local);
    free(remote);
    return 0;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int run_client(const char *host)
{
    struct endpoint ep;
    open_endpoint(&ep);

    /* The server's address: this host's NIC address, or the address the
     * name service gives for host. */
    VIP_NET_ADDRESS *remote;
    if (host == NULL) {
        remote = local_address(&ep);
    } else {
        VIP_NET_ADDRESS *found = calloc(1, sizeof *found + 256);
        found->HostAddressLen = 16; /* room for an IPv6 address */
        VIP_OK(VipNSInit(ep.nic, NULL));
        VIP_OK(VipNSGetHostByName(ep.nic, (VIP_CHAR *)host, found, 0));
        VIP_OK(VipNSShutdown(ep.nic));
        remote = make_address(found->HostAddress, found->HostAddressLen);
        free(found);
    }
    VIP_NET_ADDRESS *local = local_address(&ep);

    /* 4. Ask for the connection; the request waits for the server. */
    VIP_VI_ATTRIBUTES remote_attrs;
    VIP_OK(VipConnectRequest(ep.vi, local, remote, TIMEOUT_MS, &remote_attrs));

    /* 5. Ping-pong.  Each round: post the receive for the reply, send,
     *    wait for the reply, check it. */
    double start = 0;
    for (int i = 0; i < WARMUP + ROUNDS; i++) {
        if (i == WARMUP)
            start = now_us();
        memset(ep.send_buf, (unsigned char)i, MSG_SIZE);
        post_receive(&ep);
        send_message(&ep);
        receive_message(&ep);
        if (memcmp(ep.recv_buf, ep.send_buf, MSG_SIZE) != 0) {
            fprintf(stderr, "round %d: the reply differs from the message\n", i);
            return 1;
        }
    }
    double elapsed = now_us() - start;
    printf("%d round trips of %d bytes: %.2f us per round trip, %.2f us one way\n",
           ROUNDS, MSG_SIZE, elapsed / ROUNDS, elapsed / ROUNDS / 2);

    close_endpoint(&ep);
    free(local);
    free(remote);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "server") == 0)
        return run_server();
    if (argc >= 2 && strcmp(argv[1], "client") == 0)
        return run_client(argc >= 3 ? argv[2] : NULL);
    if (argc >= 2) {
        fprintf(stderr, "usage: %s [server | client [host]]\n", argv[0]);
        return 2;
    }

    /* No arguments: fork the server (before any VIPL call, so that each
     * process opens its own NIC), then be the client. */
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        return run_server();
    }
    int rc = run_client(NULL);
    int status;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "the server failed\n");
        return 1;
    }
    return rc;
}
