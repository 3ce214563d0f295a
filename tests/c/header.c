/*
 * header.c - vipl.h as programs of the era use it at compile time.
 *
 * Every enumerator of the API's enums is visible to #ifdef, so a program
 * that guards its own fallback definition (ARMCI's VIA port does so for
 * VIP_ERROR_NOT_SUPPORTED) keeps the header's; and each keeps the
 * specification's value.  A missing macro fails the build of this file.
 */
#include "vt.h"

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
    !defined(VIP_NOT_REACHABLE) || !defined(VIP_ERROR_NOT_SUPPORTED)
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
    printf("header: every enumerator visible to #ifdef, with the specification's values\n");
    return 0;
}
