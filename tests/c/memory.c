/*
 * memory.c - protection tags and memory registration: handles, attributes,
 * start addresses, stale and forged handles, ptags of another NIC, many
 * regions, and pinning with VIA_PIN_MEMORY=1.
 */
#include "vt.h"

static void ptags(void)
{
    printf("protection tags\n");
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    enum { N = 64 };
    VIP_PROTECTION_HANDLE p[N];
    for (int i = 0; i < N; i++) {
        p[i] = NULL;
        CHECK_OK(VipCreatePtag(nic, &p[i]));
        CHECK(p[i] != NULL);
        for (int j = 0; j < i; j++)
            CHECK(p[i] != p[j]);
    }
    for (int i = 0; i < N; i += 2)
        CHECK_OK(VipDestroyPtag(nic, p[i]));
    for (int i = 0; i < N; i += 2)
        CHECK_RET(VIP_INVALID_PARAMETER, VipDestroyPtag(nic, p[i]));
    /* A destroyed ptag no longer protects anything. */
    VIP_MEM_ATTRIBUTES ma = {p[0], VIP_FALSE, VIP_FALSE};
    VIP_MEM_HANDLE mh = 0;
    void *buf = vt_alloc(4096);
    CHECK_RET(VIP_INVALID_PTAG, VipRegisterMem(nic, buf, 4096, &ma, &mh));
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(VIP_SERVICE_UNRELIABLE, p[0], 4096, 0, 0);
    VIP_VI_HANDLE vi = NULL;
    CHECK_RET(VIP_INVALID_PTAG, VipCreateVi(nic, &va, NULL, NULL, &vi));
    for (int i = 1; i < N; i += 2)
        CHECK_OK(VipDestroyPtag(nic, p[i]));
    CHECK_OK(VipCloseNic(nic));
    free(buf);
}

static void attributes(void)
{
    printf("register, query, set attributes, deregister\n");
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    VIP_PROTECTION_HANDLE p1, p2;
    CHECK_OK(VipCreatePtag(nic, &p1));
    CHECK_OK(VipCreatePtag(nic, &p2));
    size_t size = 3 * 4096 + 100;
    VIP_UINT8 *buf = vt_alloc(size);

    VIP_MEM_ATTRIBUTES ma = {p1, VIP_TRUE, VIP_FALSE};
    VIP_MEM_HANDLE mh = 0;
    CHECK_RET(VIP_INVALID_PARAMETER, VipRegisterMem(nic, NULL, 4096, &ma, &mh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipRegisterMem(nic, buf, 0, &ma, &mh));
    CHECK_OK(VipRegisterMem(nic, buf, size, &ma, &mh));
    CHECK(mh != 0);

    VIP_MEM_ATTRIBUTES got;
    memset(&got, 0xA5, sizeof got);
    CHECK_OK(VipQueryMem(nic, buf, mh, &got));
    CHECK_PTR(p1, got.Ptag);
    CHECK_EQ(VIP_TRUE, got.EnableRdmaWrite);
    CHECK_EQ(VIP_FALSE, got.EnableRdmaRead);

    /* The registered start address and nothing else names the region. */
    VIP_UINT8 *wrong[] = {buf + 1, buf + 64, buf + 4096, buf - 4096, buf + size};
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        CHECK_RET(VIP_INVALID_PARAMETER, VipQueryMem(nic, wrong[i], mh, &got));
        CHECK_RET(VIP_INVALID_PARAMETER, VipSetMemAttributes(nic, wrong[i], mh, &ma));
        CHECK_RET(VIP_INVALID_PARAMETER, VipDeregisterMem(nic, wrong[i], mh));
    }

    /* Change the attributes: other ptag, other enables. */
    VIP_MEM_ATTRIBUTES na = {p2, VIP_FALSE, VIP_TRUE};
    CHECK_OK(VipSetMemAttributes(nic, buf, mh, &na));
    CHECK_OK(VipQueryMem(nic, buf, mh, &got));
    CHECK_PTR(p2, got.Ptag);
    CHECK_EQ(VIP_FALSE, got.EnableRdmaWrite);
    CHECK_EQ(VIP_TRUE, got.EnableRdmaRead);
    /* p2 protects the region now, p1 nothing. */
    CHECK_RET(VIP_INVALID_STATE, VipDestroyPtag(nic, p2));
    CHECK_OK(VipDestroyPtag(nic, p1));
    VIP_MEM_ATTRIBUTES stale = {p1, VIP_FALSE, VIP_FALSE};
    CHECK_RET(VIP_INVALID_PTAG, VipSetMemAttributes(nic, buf, mh, &stale));
    CHECK_OK(VipQueryMem(nic, buf, mh, &got));
    CHECK_PTR(p2, got.Ptag);

    /* The same memory may be registered twice: two regions, two handles. */
    VIP_MEM_HANDLE mh2 = 0;
    CHECK_OK(VipRegisterMem(nic, buf, 4096, &na, &mh2));
    CHECK(mh2 != 0 && mh2 != mh);
    CHECK_OK(VipDeregisterMem(nic, buf, mh2));
    CHECK_RET(VIP_INVALID_PARAMETER, VipQueryMem(nic, buf, mh2, &got));

    /* Forged memory handles. */
    static const VIP_MEM_HANDLE forged[] = {0, 0xFFFFFFFF, 0xDEADBEEF, 1, 0x00010001};
    for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
        if (forged[i] == mh)
            continue;
        CHECK_RET(VIP_INVALID_PARAMETER, VipQueryMem(nic, buf, forged[i], &got));
        CHECK_RET(VIP_INVALID_PARAMETER, VipSetMemAttributes(nic, buf, forged[i], &na));
        CHECK_RET(VIP_INVALID_PARAMETER, VipDeregisterMem(nic, buf, forged[i]));
    }
    /* The handle with another generation. */
    CHECK_RET(VIP_INVALID_PARAMETER, VipQueryMem(nic, buf, mh ^ 0x00010000, &got));

    /* Deregistered: the handle is stale, and the ptag is free. */
    CHECK_OK(VipDeregisterMem(nic, buf, mh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipDeregisterMem(nic, buf, mh));
    CHECK_RET(VIP_INVALID_PARAMETER, VipQueryMem(nic, buf, mh, &got));
    CHECK_RET(VIP_INVALID_PARAMETER, VipSetMemAttributes(nic, buf, mh, &na));
    /* A new registration of the same memory gets a handle that differs from
     * the stale one, which stays stale. */
    VIP_MEM_HANDLE mh3 = 0;
    CHECK_OK(VipRegisterMem(nic, buf, size, &na, &mh3));
    CHECK(mh3 != 0 && mh3 != mh);
    CHECK_RET(VIP_INVALID_PARAMETER, VipQueryMem(nic, buf, mh, &got));
    CHECK_OK(VipDeregisterMem(nic, buf, mh3));
    CHECK_OK(VipDestroyPtag(nic, p2));
    CHECK_OK(VipCloseNic(nic));
    free(buf);
}

static void two_nics(void)
{
    printf("handles of another NIC\n");
    VIP_NIC_HANDLE a = vt_open_nic(VT_DEV);
    VIP_NIC_HANDLE b = vt_open_nic("via_lo");
    CHECK(a != b);
    VIP_PROTECTION_HANDLE pa, pb;
    CHECK_OK(VipCreatePtag(a, &pa));
    CHECK_OK(VipCreatePtag(b, &pb));
    void *buf = vt_alloc(8192);

    VIP_MEM_ATTRIBUTES ma = {pb, VIP_FALSE, VIP_FALSE};
    VIP_MEM_HANDLE mh = 0;
    CHECK_RET(VIP_INVALID_PTAG, VipRegisterMem(a, buf, 8192, &ma, &mh));
    VIP_VI_ATTRIBUTES va = vt_vi_attrs(VIP_SERVICE_UNRELIABLE, pb, 4096, 0, 0);
    VIP_VI_HANDLE vi = NULL;
    CHECK_RET(VIP_INVALID_PTAG, VipCreateVi(a, &va, NULL, NULL, &vi));
    CHECK_RET(VIP_INVALID_PARAMETER, VipDestroyPtag(a, pb));

    ma.Ptag = pa;
    CHECK_OK(VipRegisterMem(a, buf, 8192, &ma, &mh));
    VIP_MEM_ATTRIBUTES got;
    /* The region belongs to NIC a. */
    CHECK_RET(VIP_INVALID_PARAMETER, VipQueryMem(b, buf, mh, &got));
    CHECK_RET(VIP_INVALID_PARAMETER, VipDeregisterMem(b, buf, mh));
    CHECK_OK(VipQueryMem(a, buf, mh, &got));
    CHECK_PTR(pa, got.Ptag);
    /* A ptag of b cannot protect a region of a. */
    VIP_MEM_ATTRIBUTES other = {pb, VIP_FALSE, VIP_FALSE};
    CHECK_RET(VIP_INVALID_PTAG, VipSetMemAttributes(a, buf, mh, &other));

    /* Closing b leaves a untouched. */
    CHECK_OK(VipDestroyPtag(b, pb));
    CHECK_OK(VipCloseNic(b));
    CHECK_OK(VipQueryMem(a, buf, mh, &got));
    CHECK_OK(VipDeregisterMem(a, buf, mh));
    CHECK_OK(VipDestroyPtag(a, pa));
    CHECK_OK(VipCloseNic(a));
    free(buf);
}

static void many_regions(void)
{
    enum { N = 2000, PAGE = 4096 };
    printf("%d regions\n", N);
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    VIP_PROTECTION_HANDLE p;
    CHECK_OK(VipCreatePtag(nic, &p));
    VIP_UINT8 *mem = vt_alloc((size_t)N * PAGE);
    VIP_MEM_HANDLE *mh = calloc(N, sizeof *mh);
    CHECK(mh != NULL);
    for (int i = 0; i < N; i++) {
        VIP_MEM_ATTRIBUTES ma = {p, (VIP_BOOLEAN)(i & 1), (VIP_BOOLEAN)((i >> 1) & 1)};
        CHECK_OK(VipRegisterMem(nic, mem + (size_t)i * PAGE, PAGE, &ma, &mh[i]));
        CHECK(mh[i] != 0);
    }
    /* All distinct. */
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++)
            if (mh[i] == mh[j])
                VT_FAIL("regions %d and %d share handle 0x%x", i, j, (unsigned)mh[i]);
    for (int i = 0; i < N; i++) {
        VIP_MEM_ATTRIBUTES got;
        CHECK_OK(VipQueryMem(nic, mem + (size_t)i * PAGE, mh[i], &got));
        CHECK_PTR(p, got.Ptag);
        CHECK_EQ(i & 1, got.EnableRdmaWrite);
        CHECK_EQ((i >> 1) & 1, got.EnableRdmaRead);
        /* Another region's address with this handle. */
        int j = (i + 1) % N;
        CHECK_RET(VIP_INVALID_PARAMETER, VipQueryMem(nic, mem + (size_t)j * PAGE, mh[i], &got));
    }
    /* Deregister every other one, check, register again. */
    for (int i = 0; i < N; i += 2)
        CHECK_OK(VipDeregisterMem(nic, mem + (size_t)i * PAGE, mh[i]));
    for (int i = 0; i < N; i += 2) {
        VIP_MEM_ATTRIBUTES got;
        CHECK_RET(VIP_INVALID_PARAMETER, VipQueryMem(nic, mem + (size_t)i * PAGE, mh[i], &got));
        CHECK_OK(VipQueryMem(nic, mem + (size_t)(i + 1) * PAGE, mh[i + 1], &got));
    }
    for (int i = 0; i < N; i += 2) {
        VIP_MEM_ATTRIBUTES ma = {p, VIP_FALSE, VIP_FALSE};
        VIP_MEM_HANDLE old = mh[i];
        CHECK_OK(VipRegisterMem(nic, mem + (size_t)i * PAGE, PAGE, &ma, &mh[i]));
        CHECK(mh[i] != 0 && mh[i] != old);
    }
    CHECK_RET(VIP_INVALID_STATE, VipDestroyPtag(nic, p));
    for (int i = 0; i < N; i++)
        CHECK_OK(VipDeregisterMem(nic, mem + (size_t)i * PAGE, mh[i]));
    CHECK_OK(VipDestroyPtag(nic, p));

    /* Regions still registered when the NIC closes are released with it. */
    VIP_NIC_HANDLE nic2 = vt_open_nic(VT_DEV);
    CHECK_OK(VipCreatePtag(nic2, &p));
    for (int i = 0; i < 100; i++) {
        VIP_MEM_ATTRIBUTES ma = {p, VIP_FALSE, VIP_FALSE};
        CHECK_OK(VipRegisterMem(nic2, mem + (size_t)i * PAGE, PAGE, &ma, &mh[i]));
    }
    CHECK_OK(VipCloseNic(nic2));
    CHECK_OK(VipCloseNic(nic));
    free(mh);
    free(mem);
}

/* AddressSanitizer intercepts mlock and makes it do nothing, so locked
 * memory cannot be observed in a sanitizer build. */
#if defined(__SANITIZE_ADDRESS__)
#define MLOCK_OBSERVABLE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MLOCK_OBSERVABLE 0
#endif
#endif
#ifndef MLOCK_OBSERVABLE
#define MLOCK_OBSERVABLE 1
#endif

/* The locked memory of this process, from /proc/self/status, in kB. */
static long vm_locked_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    CHECK(f != NULL);
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmLck: %ld kB", &kb) == 1)
            break;
    fclose(f);
    CHECK(kb >= 0);
    return kb;
}

/* In a child of its own, so that the variable is set before the library
 * first looks at it. */
static void pinned(int fd, void *arg)
{
    (void)fd;
    (void)arg;
    setenv("VIA_PIN_MEMORY", "1", 1);
    VIP_NIC_HANDLE nic = vt_open_nic(VT_DEV);
    VIP_PROTECTION_HANDLE p;
    CHECK_OK(VipCreatePtag(nic, &p));
    size_t size = 4u << 20;
    VIP_UINT8 *buf = vt_alloc(size);
    long before = vm_locked_kb();
    VIP_MEM_ATTRIBUTES ma = {p, VIP_TRUE, VIP_TRUE};
    VIP_MEM_HANDLE mh;
    CHECK_OK(VipRegisterMem(nic, buf, size, &ma, &mh));
    long during = vm_locked_kb();
    printf("  VmLck %ld kB -> %ld kB while a 4 MiB region is registered\n", before, during);
    if (MLOCK_OBSERVABLE)
        CHECK(during - before >= (long)(size / 1024));
    else
        printf("  (sanitizer build: mlock is not observable, VmLck not checked)\n");
    /* Pinned memory stays usable. */
    vt_fill(buf, size, 7);
    CHECK_PATTERN(buf, size, 7);
    CHECK_OK(VipDeregisterMem(nic, buf, mh));
    long after = vm_locked_kb();
    printf("  VmLck %ld kB after deregistering\n", after);
    CHECK(after - before < (long)(size / 1024));
    CHECK_OK(VipDestroyPtag(nic, p));
    CHECK_OK(VipCloseNic(nic));
    free(buf);
}

int main(void)
{
    vt_init();
    unsetenv("VIA_PIN_MEMORY");
    /* Forked before this process makes any Vip* call. */
    vt_child pin = vt_spawn("pinned", pinned, NULL);
    printf("VIA_PIN_MEMORY=1\n");
    vt_join(&pin);

    ptags();
    attributes();
    two_nics();
    many_regions();
    printf("memory: ok\n");
    return 0;
}
