//! Descriptors: a typed view over the application's `VIP_DESCRIPTOR` memory
//! and its validation into a [`WorkRequest`].
//!
//! The application owns descriptor memory and may change it at any time, so
//! every field is read once, with a volatile load, and checked before use;
//! results are written back the same way, `Status` last.
//!
//! A descriptor posted again before it completed is refused
//! (`VIP_INVALID_PARAMETER`): else it would sit in a queue twice and
//! complete twice.  How a post knows, at no cost on the 4-byte path: the
//! provider writes a mark into the control segment's `Reserved` field when
//! it accepts a post ([`DescPtr::mark_posted`]) and clears it when it
//! completes the descriptor ([`DescPtr::complete`]).  The field shares the
//! cache line of `Control` and `Status`, which every post reads and writes
//! anyway, so the check is a load and a compare, and the mark a store.
//! The mark depends on the descriptor's address, on the queue it was posted
//! to and on where this library was loaded, so a copy of a posted
//! descriptor, or one posted to another VI that was destroyed with it, does
//! not carry a valid mark.  But the memory is the application's, so a mark
//! is only a hint: where one is found the queue is searched for the
//! descriptor, and only a descriptor still pending there is refused
//! ([`DescPtr::maybe_posted`]).  The other way, a set of the pending
//! descriptors per queue, costs a hash and an insert on every post and a
//! removal on every completion.  Not caught: one descriptor posted to two
//! queues at once (each queue knows only its own).

use crate::consts::*;
use crate::registry::{Region, Registry};
use std::sync::atomic::{fence, Ordering};

// Offsets in the control segment (vipl.h VIP_CONTROL_SEGMENT).
const CS_NEXT: usize = 0;
const CS_SEG_COUNT: usize = 12;
const CS_CONTROL: usize = 14;
const CS_RESERVED: usize = 16;
const CS_IMMEDIATE: usize = 20;
const CS_LENGTH: usize = 24;
const CS_STATUS: usize = 28;

/// A posted descriptor in application memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DescPtr(pub usize);

/// One segment, as written by the application.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawSegment {
    /// `Data` (64-bit address).
    pub addr: u64,
    /// `Handle`.
    pub handle: u32,
    /// `Length` for a data segment, `Reserved` for an address segment.
    pub len: u32,
}

impl DescPtr {
    fn read<T: Copy>(self, offset: usize) -> T {
        // SAFETY: callers validated that the descriptor lies in registered memory.
        unsafe { std::ptr::read_volatile((self.0 + offset) as *const T) }
    }

    fn write<T: Copy>(self, offset: usize, value: T) {
        // SAFETY: as for read.
        unsafe { std::ptr::write_volatile((self.0 + offset) as *mut T, value) }
    }

    /// The `Control` field.
    pub fn control(self) -> u16 {
        self.read(CS_CONTROL)
    }
    /// The `SegCount` field.
    pub fn seg_count(self) -> u16 {
        self.read(CS_SEG_COUNT)
    }
    /// The `ImmediateData` field.
    pub fn immediate(self) -> u32 {
        self.read(CS_IMMEDIATE)
    }
    /// The `Status` field.
    pub fn status(self) -> u32 {
        self.read(CS_STATUS)
    }
    /// The `Next` field (ignored by the provider, kept for completeness).
    pub fn next(self) -> u64 {
        self.read(CS_NEXT)
    }
    /// Segment `i` (0-based, after the control segment).
    pub fn segment(self, i: usize) -> RawSegment {
        let base = CONTROL_SEGMENT_BYTES + i * DATA_SEGMENT_BYTES;
        RawSegment { addr: self.read(base), handle: self.read(base + 8), len: self.read(base + 12) }
    }
    /// The `VIP_STATUS_OP_*` bits of the operation `Control` names, for a
    /// send-queue descriptor that completes without having been validated.
    pub fn op_status_bits(self) -> u32 {
        match self.control() & CONTROL_OP_MASK {
            CONTROL_OP_RDMAWRITE => STATUS_OP_RDMA_WRITE,
            CONTROL_OP_RDMAREAD => STATUS_OP_RDMA_READ,
            _ => STATUS_OP_SEND,
        }
    }
    /// Clears `Status` at post time, as the specification requires of the provider.
    pub fn clear_status(self) {
        self.write(CS_STATUS, 0u32);
    }
    /// The mark [`DescPtr::mark_posted`] leaves in the control segment's
    /// `Reserved` field of a descriptor at this address posted to `queue`
    /// (any value that names one work queue): never 0, and a function of
    /// the address, the queue and where this library was loaded, so that a
    /// copy of a posted descriptor elsewhere, one posted to another queue,
    /// or one from another run, does not carry a valid mark.
    #[inline(always)]
    fn post_mark(self, queue: u64) -> u32 {
        static KEY: u8 = 0;
        let key = &KEY as *const u8 as u64;
        let x = (self.0 as u64 ^ queue.rotate_left(32) ^ key.rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (x >> 32) as u32 | 1
    }
    /// Marks the descriptor as posted to `queue`: written when a post is
    /// accepted and cleared by [`DescPtr::complete`].  The application owns
    /// the memory, so the mark is a hint and never the truth: see
    /// [`DescPtr::maybe_posted`].
    #[inline(always)]
    pub fn mark_posted(self, queue: u64) {
        self.write(CS_RESERVED, self.post_mark(queue));
    }
    /// Whether the descriptor carries the mark of a post to `queue` and no
    /// `DONE`: it may be posted there and not yet complete.  `false` is
    /// certain for a descriptor posted through this library (completion
    /// clears the mark before it sets `DONE`); `true` is a hint that the
    /// queue must confirm, since garbage, an application that wrote the
    /// field, or a post that never completed (its VI's NIC closed under
    /// it) may leave a mark behind.
    #[inline(always)]
    pub fn maybe_posted(self, queue: u64) -> bool {
        self.read::<u32>(CS_RESERVED) == self.post_mark(queue) && self.status() & STATUS_DONE == 0
    }
    /// Writes the result of the operation; `Status` goes last so a consumer
    /// polling it sees `Length` and `ImmediateData` already in place, and
    /// the posted mark cleared (so the descriptor may be posted again).
    pub fn complete(self, status: u32, length: u32, immediate: Option<u32>) {
        self.write(CS_RESERVED, 0u32);
        self.write(CS_LENGTH, length);
        if let Some(imm) = immediate {
            self.write(CS_IMMEDIATE, imm);
        }
        fence(Ordering::Release);
        self.write(CS_STATUS, status | STATUS_DONE);
    }
}

/// What a descriptor asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Send on the send queue, or a receive buffer on the receive queue.
    SendRecv,
    /// RDMA write to the remote address.
    RdmaWrite,
    /// RDMA read from the remote address.
    RdmaRead,
}

impl Op {
    /// The `VIP_STATUS_OP_*` bits of a completed descriptor of this operation.
    pub fn status_bits(self, receive_queue: bool) -> u32 {
        match (self, receive_queue) {
            (Op::SendRecv, false) => STATUS_OP_SEND,
            (Op::SendRecv, true) => STATUS_OP_RECEIVE,
            (Op::RdmaWrite, _) => STATUS_OP_RDMA_WRITE,
            (Op::RdmaRead, _) => STATUS_OP_RDMA_READ,
        }
    }
}

/// The local buffers of a descriptor: inline up to two, the common case,
/// so posting allocates nothing.
pub type Segs = smallvec::SmallVec<[LocalSeg; 2]>;

/// A local buffer of a validated descriptor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LocalSeg {
    /// Address in this process.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// The memory handle it was checked against.
    pub handle: u32,
}

/// A descriptor after validation: everything the transport needs, copied
/// out of application memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkRequest {
    /// The operation.
    pub op: Op,
    /// Immediate data, when the descriptor carries it.
    pub immediate: Option<u32>,
    /// Queue fence.
    pub fence: bool,
    /// Remote address and memory handle of an RDMA operation.
    pub remote: Option<(u64, u32)>,
    /// Local data segments, in order (zero-length segments dropped).
    pub segs: Segs,
    /// Total bytes of the local segments.
    pub total: u64,
}

/// The rules a descriptor is checked against.
#[derive(Clone, Copy)]
pub struct Rules<'a> {
    /// The registry of the VI's NIC.
    pub registry: &'a Registry,
    /// The VI's protection tag.
    pub ptag: u32,
    /// The VI's maximum transfer size.
    pub max_transfer: u64,
    /// RDMA read is allowed (reliable VIs only).
    pub rdma_read: bool,
}

/// Checks that the descriptor itself lies in the region of `handle` with the
/// VI's tag and is aligned; reads nothing else.  Returns that region, which
/// [`validate`] checks the whole descriptor against (one look-up for a
/// post); `None` means `VIP_DESCRIPTOR_ERROR`.
pub fn descriptor_region(desc: DescPtr, handle: u32, rules: &Rules) -> Option<Region> {
    let region = rules.registry.lookup(handle)?;
    (desc.0.is_multiple_of(DESCRIPTOR_ALIGNMENT)
        && region.ptag == rules.ptag
        && region.contains(desc.0 as u64, CONTROL_SEGMENT_BYTES as u64))
    .then_some(region)
}

/// Validates a posted descriptor; `own` is the region of `handle` as looked
/// up for the post (`descriptor_region`, or the registry).  `Err` holds the
/// status error bits the descriptor completes with.
#[inline(always)]
pub fn validate(
    desc: DescPtr,
    handle: u32,
    own: &Region,
    receive_queue: bool,
    rules: &Rules,
) -> Result<WorkRequest, u32> {
    let control = desc.control();
    let count = desc.seg_count() as usize;
    if control & CONTROL_RESERVED != 0 || count > limits::MAX_SEGMENTS_PER_DESC {
        return Err(STATUS_FORMAT_ERROR);
    }
    // The whole descriptor, segments included, must be registered memory.
    // Buffers in its region (the usual case) are checked against it
    // without another look-up.
    let extent = (CONTROL_SEGMENT_BYTES + count * DATA_SEGMENT_BYTES) as u64;
    if own.ptag != rules.ptag || !own.contains(desc.0 as u64, extent) {
        return Err(STATUS_PROTECTION_ERROR);
    }
    let holds = |seg: &RawSegment| match seg.handle == handle {
        true => own.contains(seg.addr, seg.len as u64),
        false => rules.registry.check_local(seg.handle, seg.addr, seg.len as u64, rules.ptag),
    };
    let op = match control & CONTROL_OP_MASK {
        CONTROL_OP_SENDRECV => Op::SendRecv,
        CONTROL_OP_RDMAWRITE if !receive_queue => Op::RdmaWrite,
        CONTROL_OP_RDMAREAD if !receive_queue && rules.rdma_read => Op::RdmaRead,
        _ => return Err(STATUS_FORMAT_ERROR),
    };
    let mut first_data = 0;
    let mut remote = None;
    if op != Op::SendRecv {
        if count == 0 {
            return Err(STATUS_FORMAT_ERROR);
        }
        let seg = desc.segment(0);
        remote = Some((seg.addr, seg.handle));
        first_data = 1;
    }
    let mut segs = Segs::new();
    let mut total = 0u64;
    for i in first_data..count {
        let seg = desc.segment(i);
        if !holds(&seg) {
            return Err(STATUS_PROTECTION_ERROR);
        }
        total += seg.len as u64;
        if seg.len > 0 {
            segs.push(LocalSeg { addr: seg.addr, len: seg.len, handle: seg.handle });
        }
    }
    if total > rules.max_transfer {
        return Err(STATUS_LENGTH_ERROR);
    }
    let immediate = (control & CONTROL_IMMEDIATE != 0 && !receive_queue).then(|| desc.immediate());
    Ok(WorkRequest { op, immediate, fence: control & CONTROL_QFENCE != 0, remote, segs, total })
}

/// Whether the buffers `segs` of a posted receive are still registered
/// memory of the VI's tag, asked again when a region was deregistered
/// after the post ([`Registry::deregistrations`]): the application may have
/// deregistered one of them and unmapped it.  The descriptor's own region
/// must be known to be registered still (its handle [`Registry::is_live`]).
/// Its segments are read again for their handles and must name exactly
/// the buffers that were validated; the handles are untrusted, and each is
/// checked against the registry for the validated buffer itself.
pub fn buffers_registered(desc: DescPtr, segs: &[LocalSeg], rules: &Rules) -> bool {
    let count = desc.seg_count() as usize;
    if count > limits::MAX_SEGMENTS_PER_DESC {
        return false;
    }
    let mut posted = segs.iter();
    for i in 0..count {
        let seg = desc.segment(i);
        if seg.len == 0 {
            continue;
        }
        match posted.next() {
            Some(s) if s.addr == seg.addr && s.len == seg.len => {
                if !rules.registry.check_local(seg.handle, s.addr, s.len as u64, rules.ptag) {
                    return false;
                }
            }
            _ => return false,
        }
    }
    posted.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[repr(C, align(64))]
    struct Mem([u8; 4096]);

    fn put_seg(mem: &mut Mem, i: usize, addr: u64, handle: u32, len: u32) {
        let base = 32 + 16 * i;
        mem.0[base..base + 8].copy_from_slice(&addr.to_ne_bytes());
        mem.0[base + 8..base + 12].copy_from_slice(&handle.to_ne_bytes());
        mem.0[base + 12..base + 16].copy_from_slice(&len.to_ne_bytes());
    }

    fn set_cs(mem: &mut Mem, control: u16, count: u16, imm: u32) {
        mem.0[12..14].copy_from_slice(&count.to_ne_bytes());
        mem.0[14..16].copy_from_slice(&control.to_ne_bytes());
        mem.0[20..24].copy_from_slice(&imm.to_ne_bytes());
    }

    #[test]
    fn validates_send_and_rdma() {
        let reg = Registry::new().unwrap();
        let mut mem = Mem([0; 4096]);
        let base = mem.0.as_ptr() as u64;
        let h = reg.register(base, 4096, 5, 0, false).unwrap();
        let rules = Rules { registry: &reg, ptag: 5, max_transfer: 1 << 20, rdma_read: true };
        let desc = DescPtr(base as usize);
        let own = descriptor_region(desc, h, &rules).expect("placed");
        assert_eq!(own, reg.lookup(h).unwrap());
        assert!(descriptor_region(DescPtr(base as usize + 8), h, &rules).is_none());
        // Aligned, with the control segment running past its region's end.
        let short = reg.register(base, 4040, 5, 0, false).unwrap();
        assert!(descriptor_region(DescPtr(base as usize + 4032), short, &rules).is_none());
        assert!(descriptor_region(DescPtr(base as usize + 4032), h, &rules).is_some());
        assert!(descriptor_region(desc, h, &Rules { ptag: 6, ..rules }).is_none());

        set_cs(&mut mem, CONTROL_OP_SENDRECV | CONTROL_IMMEDIATE, 2, 0xabcd);
        put_seg(&mut mem, 0, base + 1024, h, 100);
        put_seg(&mut mem, 1, base + 2048, h, 50);
        let wr = validate(desc, h, &own, false, &rules).unwrap();
        assert_eq!(wr.op, Op::SendRecv);
        assert_eq!(wr.immediate, Some(0xabcd));
        assert_eq!(wr.total, 150);
        assert_eq!(wr.segs.len(), 2);

        // A segment straying out of the region is a protection error.
        put_seg(&mut mem, 1, base + 4090, h, 50);
        assert_eq!(validate(desc, h, &own, false, &rules), Err(STATUS_PROTECTION_ERROR));
        // Another tag is a protection error too.
        let other = Rules { ptag: 6, ..rules };
        assert_eq!(validate(desc, h, &own, false, &other), Err(STATUS_PROTECTION_ERROR));
        // A buffer in another region is checked against that region: its
        // own range and tag.
        let buf = Mem([0; 4096]);
        let at = buf.0.as_ptr() as u64;
        let mine = reg.register(at, 4096, 5, 0, false).unwrap();
        let foreign = reg.register(at, 4096, 6, 0, false).unwrap();
        put_seg(&mut mem, 1, at + 4000, mine, 96);
        assert_eq!(validate(desc, h, &own, false, &rules).map(|wr| wr.total), Ok(196));
        put_seg(&mut mem, 1, at + 4000, mine, 97);
        assert_eq!(validate(desc, h, &own, false, &rules), Err(STATUS_PROTECTION_ERROR));
        put_seg(&mut mem, 1, at, foreign, 8);
        assert_eq!(validate(desc, h, &own, false, &rules), Err(STATUS_PROTECTION_ERROR));
        // Nor does the descriptor's region stretch over it.
        put_seg(&mut mem, 1, at, h, 8);
        assert_eq!(validate(desc, h, &own, false, &rules), Err(STATUS_PROTECTION_ERROR));

        set_cs(&mut mem, CONTROL_OP_RDMAWRITE, 2, 0);
        put_seg(&mut mem, 0, 0x1000, 77, 0);
        put_seg(&mut mem, 1, base + 1024, h, 8);
        let wr = validate(desc, h, &own, false, &rules).unwrap();
        assert_eq!((wr.op, wr.remote, wr.total), (Op::RdmaWrite, Some((0x1000, 77)), 8));
        assert_eq!(validate(desc, h, &own, true, &rules), Err(STATUS_FORMAT_ERROR));

        set_cs(&mut mem, CONTROL_OP_RDMAREAD, 2, 0);
        let no_read = Rules { rdma_read: false, ..rules };
        assert_eq!(validate(desc, h, &own, false, &no_read), Err(STATUS_FORMAT_ERROR));
    }

    #[test]
    fn format_and_length_errors() {
        let reg = Registry::new().unwrap();
        let mut mem = Mem([0; 4096]);
        let base = mem.0.as_ptr() as u64;
        let h = reg.register(base, 4096, 1, 0, false).unwrap();
        let rules = Rules { registry: &reg, ptag: 1, max_transfer: 100, rdma_read: false };
        let desc = DescPtr(base as usize);
        let own = descriptor_region(desc, h, &rules).expect("placed");
        set_cs(&mut mem, 0x10, 0, 0);
        assert_eq!(validate(desc, h, &own, false, &rules), Err(STATUS_FORMAT_ERROR));
        set_cs(&mut mem, CONTROL_OP_RESERVED, 0, 0);
        assert_eq!(validate(desc, h, &own, false, &rules), Err(STATUS_FORMAT_ERROR));
        set_cs(&mut mem, 0, 33, 0);
        assert_eq!(validate(desc, h, &own, false, &rules), Err(STATUS_FORMAT_ERROR));
        set_cs(&mut mem, CONTROL_OP_RDMAWRITE, 0, 0);
        assert_eq!(validate(desc, h, &own, false, &rules), Err(STATUS_FORMAT_ERROR));
        set_cs(&mut mem, 0, 1, 0);
        put_seg(&mut mem, 0, base + 1024, h, 101);
        assert_eq!(validate(desc, h, &own, false, &rules), Err(STATUS_LENGTH_ERROR));
        set_cs(&mut mem, 0, 0, 0);
        assert_eq!(validate(desc, h, &own, true, &rules).unwrap().total, 0);
    }

    #[test]
    fn buffers_are_asked_again_after_a_deregistration() {
        let reg = Registry::new().unwrap();
        let mut mem = Mem([0; 4096]);
        let base = mem.0.as_ptr() as u64;
        let h = reg.register(base, 2048, 1, 0, false).unwrap();
        let h2 = reg.register(base + 2048, 2048, 1, 0, false).unwrap();
        let rules = Rules { registry: &reg, ptag: 1, max_transfer: 1 << 20, rdma_read: false };
        let desc = DescPtr(base as usize);
        set_cs(&mut mem, 0, 3, 0);
        put_seg(&mut mem, 0, base + 1024, h, 10);
        put_seg(&mut mem, 1, base + 3000, h2, 0); // empty: nothing lands there
        put_seg(&mut mem, 2, base + 3000, h2, 10);
        let epoch = reg.deregistrations();
        let own = descriptor_region(desc, h, &rules).expect("placed");
        let wr = validate(desc, h, &own, true, &rules).unwrap();
        assert!(buffers_registered(desc, &wr.segs, &rules));
        // Another region goes: the epoch moves, the buffers are still there.
        let other = [0u8; 64];
        let h3 = reg.register(other.as_ptr() as u64, 64, 1, 0, false).unwrap();
        reg.deregister(h3, other.as_ptr() as u64).unwrap();
        assert_ne!(reg.deregistrations(), epoch);
        assert!(buffers_registered(desc, &wr.segs, &rules));
        // Another tag, or a descriptor that no longer says what was posted, is not.
        assert!(!buffers_registered(desc, &wr.segs, &Rules { ptag: 2, ..rules }));
        put_seg(&mut mem, 2, base + 3001, h2, 10);
        assert!(!buffers_registered(desc, &wr.segs, &rules));
        put_seg(&mut mem, 2, base + 3000, h2, 10);
        set_cs(&mut mem, 0, 2, 0);
        assert!(!buffers_registered(desc, &wr.segs, &rules));
        set_cs(&mut mem, 0, 3, 0);
        assert!(buffers_registered(desc, &wr.segs, &rules));
        // The second buffer's region goes.
        reg.deregister(h2, base + 2048).unwrap();
        assert!(!buffers_registered(desc, &wr.segs, &rules));
        // A receive of no buffers has nothing to lose.
        set_cs(&mut mem, 0, 0, 0);
        assert!(buffers_registered(desc, &Segs::new(), &rules));
    }

    #[test]
    fn the_posted_mark_is_cleared_by_completion() {
        let mut mem = Mem([0; 4096]);
        let desc = DescPtr(mem.0.as_mut_ptr() as usize);
        let other = DescPtr(desc.0 + 64);
        let (queue, another) = (0x1_0002 << 1, 0x1_0003 << 1);
        assert!(!desc.maybe_posted(queue));
        desc.clear_status();
        desc.mark_posted(queue);
        assert!(desc.maybe_posted(queue));
        assert!(!desc.maybe_posted(another) && !desc.maybe_posted(queue | 1));
        assert_ne!(u32::from_ne_bytes(mem.0[16..20].try_into().unwrap()), 0);
        // A copy elsewhere carries no valid mark.
        mem.0.copy_within(0..32, 64);
        assert!(!other.maybe_posted(queue));
        desc.complete(STATUS_OP_RECEIVE, 0, None);
        assert!(!desc.maybe_posted(queue));
        assert_eq!(u32::from_ne_bytes(mem.0[16..20].try_into().unwrap()), 0);
        // A mark with DONE set (written by the application) is not "posted" either.
        desc.mark_posted(queue);
        assert!(!desc.maybe_posted(queue));
    }

    #[test]
    fn completion_writes_status_last() {
        let mut mem = Mem([0; 4096]);
        let desc = DescPtr(mem.0.as_mut_ptr() as usize);
        desc.complete(STATUS_OP_RECEIVE | STATUS_IMMEDIATE, 42, Some(7));
        assert_eq!(desc.status(), STATUS_DONE | STATUS_OP_RECEIVE | STATUS_IMMEDIATE);
        assert_eq!(desc.immediate(), 7);
        assert_eq!(u32::from_ne_bytes(mem.0[24..28].try_into().unwrap()), 42);
    }
}
