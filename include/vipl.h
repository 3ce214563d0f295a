/*
 * vipl.h - the VI Provider Library interface of openvia.
 *
 * The Virtual Interface Architecture (VIA 1.0) user API, with the type,
 * field and constant names of the specification and the Linux (M-VIA)
 * layout, so that VIA programs written against the specification compile
 * unmodified.  Link with libvipl (pkg-config --cflags --libs vipl).
 *
 * Programs of both spellings of the header compile against it, with no
 * macro to define: M-VIA's (desc->CS.SegCount, desc->DS[0].Local.Length)
 * and the one of Giganet's cLAN and of the VI Developer's Guide
 * (desc->Control.SegCount, desc->Data[0].Length).  The two name the same
 * bytes: the descriptor holds each part once, under both names.  C89
 * (gnu89), C99, C11 and C++ programs compile against it without warnings.
 */
#ifndef OPENVIA_VIPL_H
#define OPENVIA_VIPL_H

#include <stdint.h>

/* The version of openvia whose libvipl this header declares (the version of
 * its Cargo.toml; the tests check that the two agree). */
#define VIPL_VERSION_MAJOR 0
#define VIPL_VERSION_MINOR 1
#define VIPL_VERSION_PATCH 0
#define VIPL_VERSION       "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef IN
#define IN
#endif
#ifndef OUT
#define OUT
#endif
/* The calling convention of the functions in Giganet's header: none here. */
#ifndef VI_CALL
#define VI_CALL
#endif

/* Unnamed unions are C11 and C++; GCC and Clang take them in every C mode,
 * and __extension__ on the declaration that has them keeps -pedantic quiet
 * before C11. */
#if defined(__GNUC__)
#define OPENVIA_UNNAMED_ __extension__
#else
#define OPENVIA_UNNAMED_
#endif

/* ------------------------------------------------------------------ */
/* Generic types                                                        */
/* ------------------------------------------------------------------ */

typedef void *VIP_PVOID;
typedef int VIP_BOOLEAN;
typedef char VIP_CHAR;
typedef unsigned char VIP_UCHAR;
typedef unsigned short VIP_USHORT;
typedef short VIP_SHORT;
typedef unsigned long VIP_ULONG;
typedef long VIP_LONG;
typedef uint64_t VIP_UINT64;
typedef uint32_t VIP_UINT32;
typedef uint16_t VIP_UINT16;
typedef uint8_t VIP_UINT8;

typedef VIP_PVOID VIP_QOS;
typedef VIP_PVOID VIP_EVENT_HANDLE;

#define VIP_TRUE  (1)
#define VIP_FALSE (0)

/* Timeouts are in milliseconds; VIP_INFINITE waits for ever. */
#define VIP_INFINITE ((VIP_ULONG)0xFFFFFFFFUL)

/* ------------------------------------------------------------------ */
/* Handles                                                              */
/* ------------------------------------------------------------------ */

typedef VIP_PVOID VIP_NIC_HANDLE;
typedef VIP_PVOID VIP_VI_HANDLE;
typedef VIP_PVOID VIP_CQ_HANDLE;
typedef VIP_PVOID VIP_PROTECTION_HANDLE;
typedef VIP_PVOID VIP_CONN_HANDLE;

/* Memory handles are 32-bit values understood by the NIC. */
typedef VIP_UINT32 VIP_MEM_HANDLE;

/* ------------------------------------------------------------------ */
/* Network addresses                                                    */
/* ------------------------------------------------------------------ */

/*
 * A VI network address: the host address (HostAddressLen bytes) followed
 * immediately by the endpoint discriminator (DiscriminatorLen bytes), both
 * stored from HostAddress[0] on.  Callers allocate
 * sizeof(VIP_NET_ADDRESS) + HostAddressLen + DiscriminatorLen bytes.
 */
typedef struct _VIP_NET_ADDRESS {
    VIP_UINT16 HostAddressLen;
    VIP_UINT16 DiscriminatorLen;
    VIP_UINT8 HostAddress[1];
} VIP_NET_ADDRESS;

/* ------------------------------------------------------------------ */
/* Reliability levels                                                   */
/* ------------------------------------------------------------------ */

typedef VIP_USHORT VIP_RELIABILITY_LEVEL;

#define VIP_SERVICE_UNRELIABLE         0x01
#define VIP_SERVICE_RELIABLE_DELIVERY  0x02
#define VIP_SERVICE_RELIABLE_RECEPTION 0x04
/* Every level of the specification (Giganet's name). */
#define VIP_BASE_SERVICES \
    (VIP_SERVICE_UNRELIABLE | VIP_SERVICE_RELIABLE_DELIVERY | VIP_SERVICE_RELIABLE_RECEPTION)

/* ------------------------------------------------------------------ */
/* NIC attributes                                                       */
/* ------------------------------------------------------------------ */

typedef struct _VIP_NIC_ATTRIBUTES {
    VIP_CHAR Name[64];
    VIP_ULONG HardwareVersion;
    VIP_ULONG ProviderVersion;
    VIP_UINT16 NicAddressLen;
    const VIP_UINT8 *LocalNicAddress;
    VIP_BOOLEAN ThreadSafe;
    VIP_UINT16 MaxDiscriminatorLen;
    VIP_ULONG MaxRegisterBytes;
    VIP_ULONG MaxRegisterRegions;
    VIP_ULONG MaxRegisterBlockBytes;
    VIP_ULONG MaxVI;
    VIP_ULONG MaxDescriptorsPerQueue;
    VIP_ULONG MaxSegmentsPerDesc;
    VIP_ULONG MaxCQ;
    VIP_ULONG MaxCQEntries;
    VIP_ULONG MaxTransferSize;
    VIP_ULONG NativeMTU;
    VIP_ULONG MaxPtags;
    VIP_RELIABILITY_LEVEL ReliabilityLevelSupport;
    VIP_RELIABILITY_LEVEL RDMAReadSupport;
} VIP_NIC_ATTRIBUTES;

/* ------------------------------------------------------------------ */
/* Descriptors                                                          */
/* ------------------------------------------------------------------ */

/* Descriptors must start on this boundary. */
#define VIP_DESCRIPTOR_ALIGNMENT 64

struct _VIP_DESCRIPTOR;

/* A 64-bit address, whatever the width of a host pointer. */
typedef union {
    VIP_UINT64 AddressBits;
    VIP_PVOID Address;
    struct _VIP_DESCRIPTOR *Descriptor; /* e.g. the Next of a chain */
} VIP_PVOID64;

typedef struct {
    VIP_PVOID64 Next;
    VIP_MEM_HANDLE NextHandle;
    VIP_UINT16 SegCount;
    VIP_UINT16 Control;
    VIP_UINT32 Reserved;
    VIP_UINT32 ImmediateData;
    VIP_UINT32 Length;
    VIP_UINT32 Status;
} VIP_CONTROL_SEGMENT;

/* The remote buffer of an RDMA operation. */
typedef struct {
    VIP_PVOID64 Data;
    VIP_MEM_HANDLE Handle;
    VIP_UINT32 Reserved;
} VIP_ADDRESS_SEGMENT;

/* A local buffer. */
typedef struct {
    VIP_PVOID64 Data;
    VIP_MEM_HANDLE Handle;
    VIP_UINT32 Length;
} VIP_DATA_SEGMENT;

typedef union {
    VIP_ADDRESS_SEGMENT Remote;
    VIP_DATA_SEGMENT Local;
} VIP_DESCRIPTOR_SEGMENT;

/*
 * A descriptor: the control segment, then SegCount segments.  For RDMA the
 * first segment is the address segment and the data segments follow.
 * Descriptors with more than two segments are allocated larger.
 *
 * Each part has two names, one from each spelling of the header:
 *   M-VIA:   CS, and DS[i].Local (a data segment) or DS[i].Remote (the
 *            address segment);
 *   Giganet: Control, and Data[i] (a data segment; the address segment is
 *            Data[0] as a VIP_ADDRESS_SEGMENT).
 * Both names of a part are the same bytes: desc->CS.Length is
 * desc->Control.Length, desc->DS[1].Local.Handle is desc->Data[1].Handle.
 * Giganet's header declares Data[1] (a descriptor of 48 bytes) and makes
 * its segment types volatile.  Here a descriptor is 64 bytes under both
 * names, and no type is volatile (that would break M-VIA programs in C++):
 * a program that polls Status itself, rather than through VipSendDone or
 * VipRecvDone, reads it through a volatile pointer.
 */
OPENVIA_UNNAMED_ typedef struct _VIP_DESCRIPTOR {
    union {
        VIP_CONTROL_SEGMENT CS;
        VIP_CONTROL_SEGMENT Control;
    };
    union {
        VIP_DESCRIPTOR_SEGMENT DS[2];
        VIP_DATA_SEGMENT Data[2];
    };
} VIP_DESCRIPTOR;

/* Control field */
#define VIP_CONTROL_OP_SENDRECV  0x0000
#define VIP_CONTROL_OP_RDMAWRITE 0x0001
#define VIP_CONTROL_OP_RDMAREAD  0x0002
#define VIP_CONTROL_OP_RESERVED  0x0003
#define VIP_CONTROL_OP_MASK      0x0003
#define VIP_CONTROL_IMMEDIATE    0x0004
#define VIP_CONTROL_QFENCE       0x0008
#define VIP_CONTROL_RESERVED     0xFFF0

/* Status field */
#define VIP_STATUS_DONE               0x00000001
#define VIP_STATUS_FORMAT_ERROR       0x00000002
#define VIP_STATUS_PROTECTION_ERROR   0x00000004
#define VIP_STATUS_LENGTH_ERROR       0x00000008
#define VIP_STATUS_PARTIAL_ERROR      0x00000010
#define VIP_STATUS_DESC_FLUSHED_ERROR 0x00000020
#define VIP_STATUS_TRANSPORT_ERROR    0x00000040
#define VIP_STATUS_RDMA_PROT_ERROR    0x00000080
#define VIP_STATUS_REMOTE_DESC_ERROR  0x00000100
#define VIP_STATUS_ERROR_MASK         0x000001FE

#define VIP_STATUS_OP_SEND              0x00000000
#define VIP_STATUS_OP_RECEIVE           0x00010000
#define VIP_STATUS_OP_RDMA_WRITE        0x00020000
#define VIP_STATUS_OP_REMOTE_RDMA_WRITE 0x00030000
#define VIP_STATUS_OP_RDMA_READ         0x00040000
#define VIP_STATUS_OP_MASK              0x00070000
#define VIP_STATUS_IMMEDIATE            0x00080000
#define VIP_STATUS_RESERVED             0xFFF0FE00

/* ------------------------------------------------------------------ */
/* VIs and memory                                                       */
/* ------------------------------------------------------------------ */

/* Every enumerator below is also a macro that names itself, so that a
 * program can test for it with #ifdef: programs of the era guard their own
 * fallback definitions (e.g. of VIP_ERROR_NOT_SUPPORTED) that way. */
typedef enum {
    VIP_STATE_IDLE,
    VIP_STATE_CONNECTED,
    VIP_STATE_CONNECT_PENDING,
    VIP_STATE_ERROR
} VIP_VI_STATE;
#define VIP_STATE_IDLE VIP_STATE_IDLE
#define VIP_STATE_CONNECTED VIP_STATE_CONNECTED
#define VIP_STATE_CONNECT_PENDING VIP_STATE_CONNECT_PENDING
#define VIP_STATE_ERROR VIP_STATE_ERROR

typedef struct _VIP_VI_ATTRIBUTES {
    VIP_RELIABILITY_LEVEL ReliabilityLevel;
    VIP_ULONG MaxTransferSize;
    VIP_QOS QoS;
    VIP_PROTECTION_HANDLE Ptag;
    VIP_BOOLEAN EnableRdmaWrite;
    VIP_BOOLEAN EnableRdmaRead;
} VIP_VI_ATTRIBUTES;

typedef struct _VIP_MEM_ATTRIBUTES {
    VIP_PROTECTION_HANDLE Ptag;
    VIP_BOOLEAN EnableRdmaWrite;
    VIP_BOOLEAN EnableRdmaRead;
} VIP_MEM_ATTRIBUTES;

/* ------------------------------------------------------------------ */
/* Asynchronous errors                                                  */
/* ------------------------------------------------------------------ */

typedef enum _VIP_ERROR_CODE {
    VIP_ERROR_POST_DESC,
    VIP_ERROR_CONN_LOST,
    VIP_ERROR_RECVQ_EMPTY,
    VIP_ERROR_VI_OVERRUN,
    VIP_ERROR_RDMAW_PROT,
    VIP_ERROR_RDMAW_DATA,
    VIP_ERROR_RDMAW_ABORT,
    VIP_ERROR_RDMAR_PROT,
    VIP_ERROR_COMP_PROT,
    VIP_ERROR_RDMA_TRANSPORT,
    VIP_ERROR_CATASTROPHIC
} VIP_ERROR_CODE;
#define VIP_ERROR_POST_DESC VIP_ERROR_POST_DESC
#define VIP_ERROR_CONN_LOST VIP_ERROR_CONN_LOST
#define VIP_ERROR_RECVQ_EMPTY VIP_ERROR_RECVQ_EMPTY
#define VIP_ERROR_VI_OVERRUN VIP_ERROR_VI_OVERRUN
#define VIP_ERROR_RDMAW_PROT VIP_ERROR_RDMAW_PROT
#define VIP_ERROR_RDMAW_DATA VIP_ERROR_RDMAW_DATA
#define VIP_ERROR_RDMAW_ABORT VIP_ERROR_RDMAW_ABORT
#define VIP_ERROR_RDMAR_PROT VIP_ERROR_RDMAR_PROT
#define VIP_ERROR_COMP_PROT VIP_ERROR_COMP_PROT
#define VIP_ERROR_RDMA_TRANSPORT VIP_ERROR_RDMA_TRANSPORT
#define VIP_ERROR_CATASTROPHIC VIP_ERROR_CATASTROPHIC

typedef enum _VIP_RESOURCE_CODE {
    VIP_RESOURCE_NIC,
    VIP_RESOURCE_VI,
    VIP_RESOURCE_CQ,
    VIP_RESOURCE_DESCRIPTOR
} VIP_RESOURCE_CODE;
#define VIP_RESOURCE_NIC VIP_RESOURCE_NIC
#define VIP_RESOURCE_VI VIP_RESOURCE_VI
#define VIP_RESOURCE_CQ VIP_RESOURCE_CQ
#define VIP_RESOURCE_DESCRIPTOR VIP_RESOURCE_DESCRIPTOR

typedef struct _VIP_ERROR_DESCRIPTOR {
    VIP_NIC_HANDLE NicHandle;
    VIP_VI_HANDLE ViHandle;
    VIP_CQ_HANDLE CQHandle;
    VIP_DESCRIPTOR *DescriptorPtr;
    VIP_ULONG OpCode;
    VIP_RESOURCE_CODE ResourceCode;
    VIP_ERROR_CODE ErrorCode;
} VIP_ERROR_DESCRIPTOR;

/* ------------------------------------------------------------------ */
/* Return codes, in the order of the specification                      */
/* ------------------------------------------------------------------ */

typedef enum {
    VIP_SUCCESS,
    VIP_NOT_DONE,
    VIP_INVALID_PARAMETER,
    VIP_ERROR_RESOURCE,
    VIP_TIMEOUT,
    VIP_REJECT,
    VIP_INVALID_RELIABILITY_LEVEL,
    VIP_INVALID_MTU,
    VIP_INVALID_QOS,
    VIP_INVALID_PTAG,
    VIP_INVALID_RDMAREAD,
    VIP_DESCRIPTOR_ERROR,
    VIP_INVALID_STATE,
    VIP_ERROR_NAMESERVICE,
    VIP_NO_MATCH,
    VIP_NOT_REACHABLE,
    VIP_ERROR_NOT_SUPPORTED,
    /* Giganet's header also calls VIP_DESCRIPTOR_ERROR VIP_ERROR: a second
     * name, not a value of its own, so a switch on VIP_RETURN has no new
     * case to handle. */
    VIP_ERROR = VIP_DESCRIPTOR_ERROR
} VIP_RETURN;
#define VIP_SUCCESS VIP_SUCCESS
#define VIP_NOT_DONE VIP_NOT_DONE
#define VIP_INVALID_PARAMETER VIP_INVALID_PARAMETER
#define VIP_ERROR_RESOURCE VIP_ERROR_RESOURCE
#define VIP_TIMEOUT VIP_TIMEOUT
#define VIP_REJECT VIP_REJECT
#define VIP_INVALID_RELIABILITY_LEVEL VIP_INVALID_RELIABILITY_LEVEL
#define VIP_INVALID_MTU VIP_INVALID_MTU
#define VIP_INVALID_QOS VIP_INVALID_QOS
#define VIP_INVALID_PTAG VIP_INVALID_PTAG
#define VIP_INVALID_RDMAREAD VIP_INVALID_RDMAREAD
#define VIP_DESCRIPTOR_ERROR VIP_DESCRIPTOR_ERROR
#define VIP_INVALID_STATE VIP_INVALID_STATE
#define VIP_ERROR_NAMESERVICE VIP_ERROR_NAMESERVICE
#define VIP_NO_MATCH VIP_NO_MATCH
#define VIP_NOT_REACHABLE VIP_NOT_REACHABLE
#define VIP_ERROR_NOT_SUPPORTED VIP_ERROR_NOT_SUPPORTED
#define VIP_ERROR VIP_ERROR

/* ------------------------------------------------------------------ */
/* System management                                                    */
/* ------------------------------------------------------------------ */

#define VIP_SMI_AUTODISCOVERY ((VIP_ULONG)1)

typedef struct {
    VIP_ULONG NumberOfHops;
    VIP_NET_ADDRESS **ADAddrArray;
    VIP_ULONG NumAdAddrs;
} VIP_AUTODISCOVERY_LIST;

/* ------------------------------------------------------------------ */
/* Callbacks                                                            */
/* ------------------------------------------------------------------ */

typedef void (*VIP_ERROR_HANDLER)(VIP_PVOID Context, VIP_ERROR_DESCRIPTOR *ErrorDesc);

typedef void (*VIP_VI_CALLBACK)(VIP_PVOID Context, VIP_NIC_HANDLE NicHandle,
                                VIP_VI_HANDLE ViHandle, VIP_DESCRIPTOR *Descriptor);

typedef void (*VIP_CQ_CALLBACK)(VIP_PVOID Context, VIP_NIC_HANDLE NicHandle,
                                VIP_VI_HANDLE ViHandle, VIP_BOOLEAN RecvQueue);

/* ------------------------------------------------------------------ */
/* Functions                                                            */
/* ------------------------------------------------------------------ */

/* NIC */
VIP_RETURN VipOpenNic(IN const VIP_CHAR *DeviceName, OUT VIP_NIC_HANDLE *NicHandle);
VIP_RETURN VipCloseNic(IN VIP_NIC_HANDLE NicHandle);
VIP_RETURN VipQueryNic(IN VIP_NIC_HANDLE NicHandle, OUT VIP_NIC_ATTRIBUTES *Attributes);

/* Protection tags */
VIP_RETURN VipCreatePtag(IN VIP_NIC_HANDLE NicHandle, OUT VIP_PROTECTION_HANDLE *ProtectionTag);
VIP_RETURN VipDestroyPtag(IN VIP_NIC_HANDLE NicHandle, IN VIP_PROTECTION_HANDLE ProtectionTag);

/* Memory */
VIP_RETURN VipRegisterMem(IN VIP_NIC_HANDLE NicHandle, IN VIP_PVOID VirtualAddress,
                          IN VIP_ULONG Length, IN VIP_MEM_ATTRIBUTES *MemAttributes,
                          OUT VIP_MEM_HANDLE *MemHandle);
VIP_RETURN VipDeregisterMem(IN VIP_NIC_HANDLE NicHandle, IN VIP_PVOID VirtualAddress,
                            IN VIP_MEM_HANDLE MemHandle);
VIP_RETURN VipQueryMem(IN VIP_NIC_HANDLE NicHandle, IN VIP_PVOID VirtualAddress,
                       IN VIP_MEM_HANDLE MemHandle, OUT VIP_MEM_ATTRIBUTES *MemAttributes);
VIP_RETURN VipSetMemAttributes(IN VIP_NIC_HANDLE NicHandle, IN VIP_PVOID VirtualAddress,
                               IN VIP_MEM_HANDLE MemHandle, IN VIP_MEM_ATTRIBUTES *MemAttributes);

/* Errors and management */
VIP_RETURN VipErrorCallback(IN VIP_NIC_HANDLE NicHandle, IN VIP_PVOID Context,
                            IN VIP_ERROR_HANDLER ErrorHandler);
VIP_RETURN VipQuerySystemManagementInfo(IN VIP_NIC_HANDLE NicHandle, IN VIP_ULONG InfoType,
                                        OUT VIP_PVOID SysManInfo);

/* VIs */
VIP_RETURN VipCreateVi(IN VIP_NIC_HANDLE NicHandle, IN VIP_VI_ATTRIBUTES *ViAttributes,
                       IN VIP_CQ_HANDLE SendCQHandle, IN VIP_CQ_HANDLE RecvCQHandle,
                       OUT VIP_VI_HANDLE *ViHandle);
VIP_RETURN VipDestroyVi(IN VIP_VI_HANDLE ViHandle);
VIP_RETURN VipQueryVi(IN VIP_VI_HANDLE ViHandle, OUT VIP_VI_STATE *State,
                      OUT VIP_VI_ATTRIBUTES *Attributes, OUT VIP_BOOLEAN *SendQueueEmpty,
                      OUT VIP_BOOLEAN *RecvQueueEmpty);
VIP_RETURN VipSetViAttributes(IN VIP_VI_HANDLE ViHandle, IN VIP_VI_ATTRIBUTES *Attributes);

/* Data transfer */
VIP_RETURN VipPostSend(IN VIP_VI_HANDLE ViHandle, IN VIP_DESCRIPTOR *DescriptorPtr,
                       IN VIP_MEM_HANDLE MemoryHandle);
VIP_RETURN VipSendDone(IN VIP_VI_HANDLE ViHandle, OUT VIP_DESCRIPTOR **DescriptorPtr);
VIP_RETURN VipSendWait(IN VIP_VI_HANDLE ViHandle, IN VIP_ULONG Timeout,
                       OUT VIP_DESCRIPTOR **DescriptorPtr);
VIP_RETURN VipSendNotify(IN VIP_VI_HANDLE ViHandle, IN VIP_PVOID Context,
                         IN VIP_VI_CALLBACK Callback);
VIP_RETURN VipPostRecv(IN VIP_VI_HANDLE ViHandle, IN VIP_DESCRIPTOR *DescriptorPtr,
                       IN VIP_MEM_HANDLE MemoryHandle);
VIP_RETURN VipRecvDone(IN VIP_VI_HANDLE ViHandle, OUT VIP_DESCRIPTOR **DescriptorPtr);
VIP_RETURN VipRecvWait(IN VIP_VI_HANDLE ViHandle, IN VIP_ULONG Timeout,
                       OUT VIP_DESCRIPTOR **DescriptorPtr);
VIP_RETURN VipRecvNotify(IN VIP_VI_HANDLE ViHandle, IN VIP_PVOID Context,
                         IN VIP_VI_CALLBACK Callback);

/* Client-server connection */
VIP_RETURN VipConnectWait(IN VIP_NIC_HANDLE NicHandle, IN VIP_NET_ADDRESS *LocalAddr,
                          IN VIP_ULONG Timeout, OUT VIP_NET_ADDRESS *RemoteAddr,
                          OUT VIP_VI_ATTRIBUTES *RemoteViAttributes,
                          OUT VIP_CONN_HANDLE *ConnHandle);
VIP_RETURN VipConnectAccept(IN VIP_CONN_HANDLE ConnHandle, IN VIP_VI_HANDLE ViHandle);
VIP_RETURN VipConnectReject(IN VIP_CONN_HANDLE ConnHandle);
VIP_RETURN VipConnectRequest(IN VIP_VI_HANDLE ViHandle, IN VIP_NET_ADDRESS *LocalAddr,
                             IN VIP_NET_ADDRESS *RemoteAddr, IN VIP_ULONG Timeout,
                             OUT VIP_VI_ATTRIBUTES *RemoteViAttributes);
VIP_RETURN VipDisconnect(IN VIP_VI_HANDLE ViHandle);

/* Peer-to-peer connection */
VIP_RETURN VipConnectPeerRequest(IN VIP_VI_HANDLE ViHandle, IN VIP_NET_ADDRESS *LocalAddr,
                                 IN VIP_NET_ADDRESS *RemoteAddr, IN VIP_ULONG Timeout);
VIP_RETURN VipConnectPeerDone(IN VIP_VI_HANDLE ViHandle,
                              OUT VIP_VI_ATTRIBUTES *RemoteViAttributes);
VIP_RETURN VipConnectPeerWait(IN VIP_VI_HANDLE ViHandle,
                              OUT VIP_VI_ATTRIBUTES *RemoteViAttributes);

/* Completion queues */
VIP_RETURN VipCreateCQ(IN VIP_NIC_HANDLE NicHandle, IN VIP_ULONG EntryCount,
                       OUT VIP_CQ_HANDLE *CQHandle);
VIP_RETURN VipDestroyCQ(IN VIP_CQ_HANDLE CQHandle);
VIP_RETURN VipResizeCQ(IN VIP_CQ_HANDLE CQHandle, IN VIP_ULONG EntryCount);
VIP_RETURN VipCQDone(IN VIP_CQ_HANDLE CQHandle, OUT VIP_VI_HANDLE *ViHandle,
                     OUT VIP_BOOLEAN *RecvQueue);
VIP_RETURN VipCQWait(IN VIP_CQ_HANDLE CQHandle, IN VIP_ULONG Timeout,
                     OUT VIP_VI_HANDLE *ViHandle, OUT VIP_BOOLEAN *RecvQueue);
VIP_RETURN VipCQNotify(IN VIP_CQ_HANDLE CQHandle, IN VIP_PVOID Context,
                       IN VIP_CQ_CALLBACK Callback);

/* Name service */
VIP_RETURN VipNSInit(IN VIP_NIC_HANDLE NicHandle, IN VIP_PVOID NSInitInfo);
VIP_RETURN VipNSGetHostByName(IN VIP_NIC_HANDLE NicHandle, IN VIP_CHAR *Name,
                              OUT VIP_NET_ADDRESS *Address, IN VIP_ULONG NameIndex);
VIP_RETURN VipNSGetHostByAddr(IN VIP_NIC_HANDLE NicHandle, IN VIP_NET_ADDRESS *Address,
                              OUT VIP_CHAR *Name, IN OUT VIP_ULONG *NameLen);
VIP_RETURN VipNSShutdown(IN VIP_NIC_HANDLE NicHandle);

#ifdef __cplusplus
}
#endif

#undef OPENVIA_UNNAMED_

#endif /* OPENVIA_VIPL_H */
