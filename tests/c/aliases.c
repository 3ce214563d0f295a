/*
 * aliases.c - device aliases: programs open the names they hard-code.
 *
 * ARMCI opens /dev/clanvi0 (Giganet cLAN).  Each phase runs in a process of
 * its own, forked before any Vip* call, with its own environment:
 *
 *   1. VIA_DEVICE_ALIASES=/dev/clanvi0=via_lo (the program's own aliases,
 *      resolved by the library): two processes open /dev/clanvi0, connect
 *      and exchange a message both ways; VipQueryNic names via_lo.
 *   2. The agent's aliases file: an agent of the phase's own (its own
 *      VIA_AGENT_SOCKET) started with VIA_DEVICES_FILE naming a file that
 *      maps /dev/clanvi0 to the interface lo; the same exchange.
 *   3. An unknown name fails with VIP_INVALID_PARAMETER, and the library
 *      says why on stderr (without VIA_LOG), with the valid names: the
 *      devices and the aliases.
 *   4. A bad VIA_DEVICE_ALIASES fails every open with VIP_INVALID_PARAMETER
 *      and a message that names the entry.
 *   5. A bad line in the aliases file: the alias fails with a message that
 *      names the file and the line, and /dev/via_lo still opens.
 */
#include "vt.h"

#include <fcntl.h>

#define MSG 3000

static char file_path[200];

static void exchange_client(vt_end *e)
{
    VIP_DESCRIPTOR *r = vt_dpool_get(&e->descs, 0), *s = vt_dpool_get(&e->descs, 1);
    vt_desc_recv(r, e->buf.base + 8192, e->buf.mh, MSG, 1);
    CHECK_OK(VipPostRecv(e->vi, r, e->descs.mem.mh));
    vt_sync(e->fd, 1);
    vt_fill(e->buf.base, MSG, 41);
    vt_desc_send(s, 0, 0, e->buf.base, e->buf.mh, MSG, 1);
    CHECK_OK(VipPostSend(e->vi, s, e->descs.mem.mh));
    VIP_DESCRIPTOR *got = vt_send_wait(e->vi);
    CHECK_PTR(s, got);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
    got = vt_recv_wait(e->vi);
    CHECK_PTR(r, got);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, got);
    CHECK_EQ(MSG, got->CS.Length);
    CHECK_PATTERN(e->buf.base + 8192, MSG, 42);
}

static void exchange_server(vt_end *e)
{
    VIP_DESCRIPTOR *r = vt_dpool_get(&e->descs, 0), *s = vt_dpool_get(&e->descs, 1);
    vt_desc_recv(r, e->buf.base, e->buf.mh, MSG, 1);
    CHECK_OK(VipPostRecv(e->vi, r, e->descs.mem.mh));
    vt_sync(e->fd, 1);
    VIP_DESCRIPTOR *got = vt_recv_wait(e->vi);
    CHECK_PTR(r, got);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE, got);
    CHECK_EQ(MSG, got->CS.Length);
    CHECK_PATTERN(e->buf.base, MSG, 41);
    vt_fill(e->buf.base + 8192, MSG, 42);
    vt_desc_send(s, 0, 0, e->buf.base + 8192, e->buf.mh, MSG, 1);
    CHECK_OK(VipPostSend(e->vi, s, e->descs.mem.mh));
    got = vt_send_wait(e->vi);
    CHECK_PTR(s, got);
    CHECK_STATUS(VIP_STATUS_DONE | VIP_STATUS_OP_SEND, got);
}

/* vt_end_open on /dev/clanvi0 instead of VT_DEV. */
static void open_clanvi0(vt_end *e, int fd, int server)
{
    static const vt_conf c = {.level = VIP_SERVICE_RELIABLE_DELIVERY, .buf_size = 16384, .ndesc = 4};
    memset(e, 0, sizeof *e);
    e->conf = &c;
    e->fd = fd;
    e->server = server;
    e->nic = vt_open_nic("/dev/clanvi0");
    vt_errlog_init(&e->errs);
    CHECK_OK(VipErrorCallback(e->nic, &e->errs, vt_errlog_handler));
    CHECK_OK(VipCreatePtag(e->nic, &e->ptag));
    vt_mem_reg(&e->buf, e->nic, e->ptag, c.buf_size, VIP_FALSE, VIP_FALSE);
    vt_dpool_init(&e->descs, e->nic, e->ptag, c.ndesc, 2);
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(c.level, e->ptag, VT_MAX_TRANSFER, VIP_FALSE, VIP_FALSE);
    CHECK_OK(VipCreateVi(e->nic, &va, NULL, NULL, &e->vi));
}

static void exchange_end(int fd, int server)
{
    char disc[VT_MAX_DISC];
    vt_end e;
    vt_disc(disc, sizeof disc, "clanvi0");
    vt_sync(fd, 0x5C00);
    open_clanvi0(&e, fd, server);
    vt_end_link(&e, disc);
    (server ? exchange_server : exchange_client)(&e);
    vt_sync(fd, 0xE0D00);
    vt_end_close(&e);
}

static void exchange_server_process(int fd, void *arg)
{
    (void)arg;
    exchange_end(fd, 1);
}

/* Both processes of an exchange on /dev/clanvi0 (the server forked before
 * this process makes any Vip* call); the client also checks that the NIC
 * it opened is via_lo. */
static void exchange_on_clanvi0(const char *what)
{
    printf("%s\n", what);
    vt_child server = vt_spawn("server", exchange_server_process, NULL);
    exchange_end(server.fd, 0);
    vt_join(&server);

    VIP_NIC_HANDLE nic = vt_open_nic("/dev/clanvi0");
    VIP_NIC_ATTRIBUTES at;
    memset(&at, 0, sizeof at);
    CHECK_OK(VipQueryNic(nic, &at));
    CHECK(strcmp(at.Name, "via_lo") == 0);
    CHECK_OK(VipCloseNic(nic));
}

/* A host agent of this phase's own, started with this phase's environment. */
static void own_agent(const char *tag)
{
    const char *base = getenv("VIA_AGENT_SOCKET");
    char name[200];
    snprintf(name, sizeof name, "%s.%s.%d", base ? base : "openvia-aliases", tag, (int)getpid());
    CHECK(setenv("VIA_AGENT_SOCKET", name, 1) == 0);
    CHECK(setenv("VIA_VIAD_IDLE", "2", 1) == 0);
}

static void write_file(const char *text)
{
    FILE *f = fopen(file_path, "w");
    CHECK(f != NULL);
    CHECK(fputs(text, f) >= 0);
    CHECK(fclose(f) == 0);
}

/* VipOpenNic(name) with stderr going to a file; returns the code and what
 * the library wrote in buf. */
static VIP_RETURN open_capturing(const char *name, char *buf, size_t n)
{
    char path[240];
    snprintf(path, sizeof path, "%s.stderr", file_path);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    int saved = dup(2);
    CHECK(saved >= 0);
    CHECK(dup2(fd, 2) == 2);
    VIP_NIC_HANDLE nic = NULL;
    VIP_RETURN r = VipOpenNic(name, &nic);
    CHECK(dup2(saved, 2) == 2);
    close(saved);
    ssize_t k = pread(fd, buf, n - 1, 0);
    CHECK(k >= 0);
    buf[k] = '\0';
    close(fd);
    unlink(path);
    if (r == VIP_SUCCESS)
        CHECK_OK(VipCloseNic(nic));
    printf("  VipOpenNic(%s): %s\n    %s", name, vt_ret_name(r), buf);
    return r;
}

#define CHECK_SAYS(buf, part)                                                  \
    do {                                                                       \
        if (strstr((buf), (part)) == NULL)                                     \
            VT_FAIL("the library's message does not say \"%s\": %s", (part), (buf)); \
    } while (0)

static void phase_env(int fd, void *arg)
{
    (void)fd;
    (void)arg;
    CHECK(setenv("VIA_DEVICE_ALIASES", "nic9=lo, /dev/clanvi0=via_lo", 1) == 0);
    exchange_on_clanvi0("VIA_DEVICE_ALIASES=nic9=lo, /dev/clanvi0=via_lo");
}

static void phase_file(int fd, void *arg)
{
    (void)fd;
    (void)arg;
    CHECK(unsetenv("VIA_DEVICE_ALIASES") == 0);
    own_agent("file");
    write_file("# the cLAN name of ARMCI\n/dev/clanvi0   lo   # the loopback interface\n");
    CHECK(setenv("VIA_DEVICES_FILE", file_path, 1) == 0);
    exchange_on_clanvi0("the agent's aliases file: /dev/clanvi0 lo");
}

static void phase_unknown(int fd, void *arg)
{
    (void)fd;
    (void)arg;
    char buf[4096];
    CHECK(unsetenv("VIA_LOG") == 0);
    CHECK(setenv("VIA_DEVICE_ALIASES", "/dev/clanvi0=via_lo", 1) == 0);
    printf("unknown names\n");
    CHECK_RET(VIP_INVALID_PARAMETER, open_capturing("/dev/nosuchvi0", buf, sizeof buf));
    CHECK_SAYS(buf, "\"/dev/nosuchvi0\"");
    CHECK_SAYS(buf, "valid names: ");
    CHECK_SAYS(buf, "via_lo");
    CHECK_SAYS(buf, "/dev/clanvi0 → via_lo (VIA_DEVICE_ALIASES entry 1)");
    CHECK_RET(VIP_INVALID_PARAMETER, open_capturing("via_nosuchif9", buf, sizeof buf));
    CHECK_SAYS(buf, "via_nosuchif9");
    CHECK_SAYS(buf, "valid names: ");
    CHECK_RET(VIP_INVALID_PARAMETER, open_capturing("", buf, sizeof buf));
    CHECK_OK(open_capturing("/dev/clanvi0", buf, sizeof buf));
    CHECK(buf[0] == '\0');
}

static void phase_bad_env(int fd, void *arg)
{
    (void)fd;
    (void)arg;
    char buf[4096];
    CHECK(setenv("VIA_DEVICE_ALIASES", "/dev/clanvi0=via_lo,garbage", 1) == 0);
    printf("a bad VIA_DEVICE_ALIASES\n");
    CHECK_RET(VIP_INVALID_PARAMETER, open_capturing("/dev/clanvi0", buf, sizeof buf));
    CHECK_SAYS(buf, "VIA_DEVICE_ALIASES entry 2 \"garbage\": expected NAME=TARGET");
    CHECK_RET(VIP_INVALID_PARAMETER, open_capturing("/dev/via_lo", buf, sizeof buf));
    CHECK_SAYS(buf, "entry 2");
}

static void phase_bad_file(int fd, void *arg)
{
    (void)fd;
    (void)arg;
    char buf[4096], line[300];
    CHECK(unsetenv("VIA_DEVICE_ALIASES") == 0);
    own_agent("badfile");
    write_file("/dev/clanvi0 lo\nnic0\n");
    CHECK(setenv("VIA_DEVICES_FILE", file_path, 1) == 0);
    printf("a bad line in the aliases file\n");
    CHECK_RET(VIP_INVALID_PARAMETER, open_capturing("/dev/clanvi0", buf, sizeof buf));
    snprintf(line, sizeof line, "%s:2: expected \"NAME TARGET\"", file_path);
    CHECK_SAYS(buf, line);
    CHECK_OK(open_capturing("/dev/via_lo", buf, sizeof buf));
}

int main(void)
{
    vt_init();
    snprintf(file_path, sizeof file_path, "/tmp/openvia-aliases-%d", (int)getpid());
    static const struct {
        const char *role;
        vt_child_fn fn;
    } phases[] = {
        {"env", phase_env},
        {"file", phase_file},
        {"unknown", phase_unknown},
        {"bad-env", phase_bad_env},
        {"bad-file", phase_bad_file},
    };
    for (size_t i = 0; i < sizeof phases / sizeof phases[0]; i++) {
        vt_child c = vt_spawn(phases[i].role, phases[i].fn, NULL);
        vt_join(&c);
    }
    unlink(file_path);
    printf("aliases: ok\n");
    return 0;
}
