/*
 * header.c - vipl.h as programs of the era use it at compile time.
 *
 * Every enumerator of the API's enums is visible to #ifdef, so a program
 * that guards its own fallback definition (ARMCI's VIA port does so for
 * VIP_ERROR_NOT_SUPPORTED) keeps the header's; and each keeps the
 * specification's value.  A missing macro fails the build of this file.
 *
 * The header's version macros are the library's version: VT_LIBRARY_VERSION
 * is the version of Cargo.toml, which the Makefile passes.
 */
#include "vt.h"

#ifndef VT_LIBRARY_VERSION
#error "build with -DVT_LIBRARY_VERSION='\"x.y.z\"' (the Makefile passes the version of Cargo.toml)"
#endif
#if !defined(VIPL_VERSION) || !defined(VIPL_VERSION_MAJOR) || !defined(VIPL_VERSION_MINOR) || \
    !defined(VIPL_VERSION_PATCH)
#error "vipl.h has no version macros"
#endif
/* The parts are numbers that #if can compare. */
#if VIPL_VERSION_MAJOR < 0 || VIPL_VERSION_MINOR < 0 || VIPL_VERSION_PATCH < 0
#error "a version part of vipl.h is negative"
#endif

#if !defined(VIP_STATE_IDLE) || !defined(VIP_STATE_CONNECTED) || !defined(VIP_STATE_CONNECT_PENDING) || \
    !defined(VIP_STATE_ERROR)
#error "a VIP_VI_STATE enumerator is not visible to #ifdef"
#endif
#if !defined(VIP_ERROR_POST_DESC) || !defined(VIP_ERROR_CONN_LOST) || !defined(VIP_ERROR_RECVQ_EMPTY) || \
    !defined(VIP_ERROR_VI_OVERRUN) || !defined(VIP_ERROR_RDMAW_PROT) || !defined(VIP_ERROR_RDMAW_DATA) || \
    !defined(VIP_ERROR_RDMAW_ABORT) || !defined(VIP_ERROR_RDMAR_PROT) || !defined(VIP_ERROR_COMP_PROT) ||  \
    !defined(VIP_ERROR_RDMA_TRANSPORT) || !defined(VIP_ERROR_CATASTROPHIC)
#error "a VIP_ERROR_CODE enumerator is not visible to #ifdef"
#endif
#if !defined(VIP_RESOURCE_NIC) || !defined(VIP_RESOURCE_VI) || !defined(VIP_RESOURCE_CQ) || \
    !defined(VIP_RESOURCE_DESCRIPTOR)
#error "a VIP_RESOURCE_CODE enumerator is not visible to #ifdef"
#endif
#if !defined(VIP_SUCCESS) || !defined(VIP_NOT_DONE) || !defined(VIP_INVALID_PARAMETER) ||                  \
    !defined(VIP_ERROR_RESOURCE) || !defined(VIP_TIMEOUT) || !defined(VIP_REJECT) ||                         \
    !defined(VIP_INVALID_RELIABILITY_LEVEL) || !defined(VIP_INVALID_MTU) || !defined(VIP_INVALID_QOS) ||     \
    !defined(VIP_INVALID_PTAG) || !defined(VIP_INVALID_RDMAREAD) || !defined(VIP_DESCRIPTOR_ERROR) ||       \
    !defined(VIP_INVALID_STATE) || !defined(VIP_ERROR_NAMESERVICE) || !defined(VIP_NO_MATCH) ||             \
    !defined(VIP_NOT_REACHABLE) || !defined(VIP_ERROR_NOT_SUPPORTED) || !defined(VIP_ERROR)
#error "a VIP_RETURN enumerator is not visible to #ifdef"
#endif

/* ARMCI's guard: with the header's macro, its own value never applies. */
#ifndef VIP_ERROR_NOT_SUPPORTED
#define VIP_ERROR_NOT_SUPPORTED 99
#endif
#ifndef VIP_NOT_REACHABLE
#define VIP_NOT_REACHABLE 98
#endif

int main(void)
{
    vt_init();
    /* The specification's numbering, through the macros. */
    CHECK_EQ(0, VIP_SUCCESS);
    CHECK_EQ(2, VIP_INVALID_PARAMETER);
    CHECK_EQ(4, VIP_TIMEOUT);
    CHECK_EQ(14, VIP_NO_MATCH);
    CHECK_EQ(15, VIP_NOT_REACHABLE);
    CHECK_EQ(16, VIP_ERROR_NOT_SUPPORTED);
    CHECK_EQ(3, VIP_STATE_ERROR);
    CHECK_EQ(10, VIP_ERROR_CATASTROPHIC);
    CHECK_EQ(3, VIP_RESOURCE_DESCRIPTOR);
    /* The macros still name the enumerators: values of the enum types. */
    VIP_RETURN r = VIP_ERROR_NOT_SUPPORTED;
    VIP_VI_STATE st = VIP_STATE_CONNECT_PENDING;
    VIP_ERROR_CODE ec = VIP_ERROR_RDMAR_PROT;
    VIP_RESOURCE_CODE rc = VIP_RESOURCE_CQ;
    CHECK_EQ(16, r);
    CHECK_EQ(2, st);
    CHECK_EQ(7, ec);
    CHECK_EQ(2, rc);
    /* Giganet's VIP_ERROR is a second name of VIP_DESCRIPTOR_ERROR. */
    CHECK_EQ(11, VIP_ERROR);
    r = VIP_ERROR;
    CHECK_EQ(VIP_DESCRIPTOR_ERROR, r);

    /* The version. */
    char parts[64];
    snprintf(parts, sizeof parts, "%d.%d.%d", VIPL_VERSION_MAJOR, VIPL_VERSION_MINOR,
             VIPL_VERSION_PATCH);
    if (strcmp(VIPL_VERSION, VT_LIBRARY_VERSION) != 0)
        VT_FAIL("VIPL_VERSION is \"%s\", the library's version \"%s\"", VIPL_VERSION,
                VT_LIBRARY_VERSION);
    if (strcmp(parts, VT_LIBRARY_VERSION) != 0)
        VT_FAIL("VIPL_VERSION_MAJOR.MINOR.PATCH is %s, the library's version \"%s\"", parts,
                VT_LIBRARY_VERSION);
    printf("header: every enumerator visible to #ifdef, with the specification's values; "
           "version %s\n", VIPL_VERSION);
    return 0;
}
