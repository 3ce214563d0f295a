/*
 * names.c - the VIA name service on cluster host names.
 *
 *   names SELF NAME=ADDR [NAME=ADDR...]
 *
 * SELF is this host's name.  For every NAME=ADDR (an IPv4 address):
 *   - VipNSGetHostByName(NAME, index 0) gives HostAddressLen 4 and ADDR, and
 *     leaves DiscriminatorLen alone; index 1 is VIP_ERROR_NAMESERVICE;
 *   - VipNSGetHostByAddr(ADDR) gives NAME with NameLen = strlen + 1; a
 *     buffer one byte short is VIP_ERROR_RESOURCE and NameLen tells the size
 *     needed.
 * Also: an unknown name and an address nobody has are
 * VIP_ERROR_NAMESERVICE; SELF's address is this NIC's address
 * (VipQueryNic) and is among the addresses autodiscovery reports.
 */
#include "cl.h"

static void check_pair(VIP_NIC_HANDLE nic, const char *name, struct in_addr want)
{
    VIP_NET_ADDRESS *a = vt_addr_buf();
    a->DiscriminatorLen = 7;
    VIP_RETURN r = VipNSGetHostByName(nic, (VIP_CHAR *)name, a, 0);
    if (r != VIP_SUCCESS)
        VT_FAIL("VipNSGetHostByName(\"%s\"): expected VIP_SUCCESS, got %s", name, vt_ret_name(r));
    CHECK_EQ(4, a->HostAddressLen);
    CHECK_EQ(7, a->DiscriminatorLen);
    if (memcmp(a->HostAddress, &want, 4) != 0)
        VT_FAIL("VipNSGetHostByName(\"%s\"): %u.%u.%u.%u, expected %s", name, a->HostAddress[0],
                a->HostAddress[1], a->HostAddress[2], a->HostAddress[3], inet_ntoa(want));
    CHECK_RET(VIP_ERROR_NAMESERVICE, VipNSGetHostByName(nic, (VIP_CHAR *)name, a, 1));

    char buf[256];
    VIP_ULONG len = sizeof buf;
    a->DiscriminatorLen = 0;
    r = VipNSGetHostByAddr(nic, a, buf, &len);
    if (r != VIP_SUCCESS)
        VT_FAIL("VipNSGetHostByAddr(%s): expected VIP_SUCCESS, got %s", inet_ntoa(want), vt_ret_name(r));
    if (strcmp(buf, name) != 0)
        VT_FAIL("VipNSGetHostByAddr(%s): \"%s\", expected \"%s\"", inet_ntoa(want), buf, name);
    CHECK_EQ(strlen(name) + 1, len);
    len = strlen(name);
    CHECK_RET(VIP_ERROR_RESOURCE, VipNSGetHostByAddr(nic, a, buf, &len));
    CHECK_EQ(strlen(name) + 1, len);
    printf("%s <-> %s\n", name, inet_ntoa(want));
    free(a);
}

int main(int argc, char **argv)
{
    vt_init();
    if (argc < 3) {
        fprintf(stderr, "usage: names SELF NAME=ADDR [NAME=ADDR...]\n");
        return 2;
    }
    vt_role = argv[1];
    VIP_NIC_HANDLE nic = cl_open_nic(NULL);
    struct in_addr self = {0};
    int have_self = 0;

    for (int i = 2; i < argc; i++) {
        char name[64];
        struct in_addr ip;
        const char *eq = strchr(argv[i], '=');
        if (eq == NULL || (size_t)(eq - argv[i]) >= sizeof name || inet_aton(eq + 1, &ip) == 0) {
            fprintf(stderr, "names: bad NAME=ADDR '%s'\n", argv[i]);
            return 2;
        }
        snprintf(name, sizeof name, "%.*s", (int)(eq - argv[i]), argv[i]);
        check_pair(nic, name, ip);
        if (strcmp(name, argv[1]) == 0) {
            self = ip;
            have_self = 1;
        }
    }

    VIP_NET_ADDRESS *a = vt_addr_buf();
    CHECK_RET(VIP_ERROR_NAMESERVICE, VipNSGetHostByName(nic, "no-such-host.invalid", a, 0));
    char buf[256];
    VIP_ULONG len = sizeof buf;
    const VIP_UINT8 nobody[4] = {192, 0, 2, 77}; /* TEST-NET-1, in no hosts file */
    a->HostAddressLen = 4;
    a->DiscriminatorLen = 0;
    memcpy(a->HostAddress, nobody, 4);
    CHECK_RET(VIP_ERROR_NAMESERVICE, VipNSGetHostByAddr(nic, a, buf, &len));
    free(a);

    if (have_self) {
        VIP_NIC_ATTRIBUTES at;
        CHECK_OK(VipQueryNic(nic, &at));
        CHECK_EQ(4, at.NicAddressLen);
        if (memcmp(at.LocalNicAddress, &self, 4) != 0)
            VT_FAIL("VipQueryNic: LocalNicAddress %u.%u.%u.%u, but %s is %s", at.LocalNicAddress[0],
                    at.LocalNicAddress[1], at.LocalNicAddress[2], at.LocalNicAddress[3], argv[1],
                    inet_ntoa(self));
        VIP_NET_ADDRESS *slots[8];
        VIP_AUTODISCOVERY_LIST list;
        for (int i = 0; i < 8; i++)
            slots[i] = vt_addr_buf();
        list.NumberOfHops = 0;
        list.ADAddrArray = slots;
        list.NumAdAddrs = 8;
        CHECK_OK(VipQuerySystemManagementInfo(nic, VIP_SMI_AUTODISCOVERY, &list));
        int found = 0;
        for (VIP_ULONG i = 0; i < list.NumAdAddrs && i < 8; i++)
            if (slots[i]->HostAddressLen == 4 && memcmp(slots[i]->HostAddress, &self, 4) == 0)
                found = 1;
        if (!found)
            VT_FAIL("autodiscovery (%lu addresses) does not list this host's address %s",
                    (unsigned long)list.NumAdAddrs, inet_ntoa(self));
        for (int i = 0; i < 8; i++)
            free(slots[i]);
        printf("%s: NIC address and autodiscovery agree\n", argv[1]);
    }
    CHECK_OK(VipNSShutdown(nic));
    CHECK_OK(VipCloseNic(nic));
    printf("names %s: ok\n", argv[1]);
    return 0;
}
