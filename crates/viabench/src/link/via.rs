//! VIA through VIPL: send/receive over a ring of pre-posted descriptors, or
//! RDMA write with immediate data as the completion signal.
//!
//! Everything lives in one registered region per side: per VI a ring of
//! receive descriptors and a pool of send descriptors, the three send
//! buffers, and per VI a receive area (descriptor-sized slots, see
//! [`crate::flow::Cursor`]) or, for RDMA, the target area the peer writes
//! into.  Sends go straight from the send buffers (zero copy); blocks larger
//! than a descriptor are split; credits and continue messages
//! ([`crate::flow`]) keep the sender from overrunning the receiver's ring.
//! With `--vis N` all receive queues complete through one CQ and the driver
//! uses the VIs in turn.
//!
//! The rendezvous patterns move each block as message-passing libraries of
//! the VIA era move mid-size messages: the sender sends a request with the
//! block's size, the receiver answers with the address and memory handle
//! of its registered target buffer, the sender RDMA-writes the block there
//! and completes it with immediate data on the write's last chunk
//! (`via-rdma`) or a message after it (`via-send`).  Requests and answers
//! are 32-byte sends into small buffers of their own, under the same
//! credits as every other message.

use super::{round_up, Deadline, Link, LinkServer, LinkStats, Mapping, Pending, Side};
use crate::error::{Error, Result};
use crate::flow::{chunk_count, chunks, receive_slots, Credits, Cursor, Immediate};
use crate::pattern::{self, Which};
use crate::proto::{Mode, PeerInfo, ServerInfo, TestSpec, Wait};
use crate::vipl_api::*;
use std::collections::HashMap;
use std::ffi::CString;
use std::net::IpAddr;
use std::time::Duration;

/// Send descriptors per VI beyond the ring size.
const EXTRA_SEND_DESCRIPTORS: usize = 8;
/// Longest single `*Wait` call, so that the deadline is looked at.
const WAIT_SLICE_MS: u64 = 1000;
/// Bytes of a rendezvous message's buffer (one per receive and send
/// descriptor).
const CTRL_SLOT: usize = 64;
const _: () = assert!(Rendezvous::BYTES <= CTRL_SLOT);

/// What a rendezvous message says: its kind, the block's size and, in an
/// answer, where to write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rendezvous {
    /// [`Rendezvous::REQUEST`], [`Rendezvous::ANSWER`] or [`Rendezvous::DONE`].
    pub kind: u32,
    /// Bytes of the block.
    pub len: u64,
    /// Answer: the target buffer's address.
    pub addr: u64,
    /// Answer: its memory handle.
    pub handle: u32,
}

impl Rendezvous {
    /// The sender's request: a block of `len` bytes is ready.
    pub const REQUEST: u32 = 0x5254_5331;
    /// The receiver's answer: write it at `addr` with `handle`.
    pub const ANSWER: u32 = 0x4354_5332;
    /// The sender's completion after the write (`via-send`).
    pub const DONE: u32 = 0x4649_4e33;
    /// Bytes on the wire.
    pub const BYTES: usize = 32;

    /// The message's bytes.
    pub fn encode(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[0..4].copy_from_slice(&self.kind.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.addr.to_le_bytes());
        b[24..28].copy_from_slice(&self.handle.to_le_bytes());
        b
    }

    /// Reads a message; `None` if it is none of the three kinds.
    pub fn decode(b: &[u8]) -> Option<Rendezvous> {
        if b.len() != Self::BYTES {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let m = Rendezvous { kind: u32_at(0), len: u64_at(8), addr: u64_at(16), handle: u32_at(24) };
        matches!(m.kind, Self::REQUEST | Self::ANSWER | Self::DONE).then_some(m)
    }

    /// The message if it is a `kind` for a block of `len` bytes, else an error
    /// that says what came.
    fn expect(b: &[u8], kind: u32, len: usize) -> Result<Rendezvous> {
        match Rendezvous::decode(b) {
            Some(m) if m.kind == kind && m.len == len as u64 => Ok(m),
            Some(m) => Err(Error::new(format!(
                "rendezvous: expected {} of {len} bytes, got {} of {}",
                Self::name(kind),
                Self::name(m.kind),
                m.len
            ))),
            None => Err(Error::new(format!(
                "rendezvous: expected {} of {len} bytes, got a {}-byte message that is none",
                Self::name(kind),
                b.len()
            ))),
        }
    }

    fn name(kind: u32) -> &'static str {
        match kind {
            Self::REQUEST => "a request",
            Self::ANSWER => "an answer",
            Self::DONE => "a completion",
            _ => "something else",
        }
    }
}

/// A message that arrived: where its data lies, its length, and whether it
/// was an RDMA write with immediate data.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    addr: usize,
    len: usize,
    written: bool,
}

/// One VI and its descriptors.
struct ViSlot {
    vi: VIP_PVOID,
    credits: Credits,
    /// The receive ring.
    recv: *mut Descriptor,
    /// The send pool.
    send: *mut Descriptor,
    /// Free send descriptors (indices into the pool).
    free: Vec<u32>,
    /// Receive slots (send/receive) or the RDMA target area (RDMA write
    /// and the rendezvous).
    area: *mut u8,
    /// Rendezvous: a message buffer per receive descriptor, then one per
    /// send descriptor.
    ctrl: *mut u8,
    cursor: Cursor,
    connected: bool,
    /// Receive descriptors taken out and not yet posted again (`repost`).
    reposts: Vec<u32>,
    /// Whether half the send pool is out, so that `repost` takes back
    /// what has completed.
    reap_due: bool,
}

impl ViSlot {
    /// Receive descriptors of the ring.
    fn recv_ring(&self) -> usize {
        self.credits.ring as usize
    }
}

/// A VIA link: one or more connected VIs.
pub struct ViaLink {
    side: Side,
    rdma: bool,
    /// Blocks go by rendezvous (the rendezvous patterns).
    rendezvous: bool,
    wait: Wait,
    timeout: Duration,
    nic: VIP_PVOID,
    ptag: VIP_PVOID,
    cq: VIP_PVOID,
    mem: Mapping,
    mh: VIP_MEM_HANDLE,
    registered: bool,
    /// Bytes per descriptor.
    desc: usize,
    pool: usize,
    vis: Vec<ViSlot>,
    cur: usize,
    send_buf: [*mut u8; 3],
    /// The peer's RDMA target areas, per VI.
    remote: Vec<(u64, u32)>,
    /// The kept block: (address, length, offset in the block).
    kept: Vec<(usize, usize, usize)>,
    /// VI handle -> index, for CQ completions.
    index: HashMap<usize, usize>,
    /// VIs with receive descriptors to post again.
    dirty: Vec<usize>,
    /// VIs with half their send pool out (`ViSlot::reap_due`).
    low: Vec<usize>,
    nic_addr: Vec<u8>,
    tag: String,
    messages: u64,
}

impl ViaLink {
    /// Opens the NIC, registers the memory, creates the VIs (and the CQ) and
    /// posts every receive descriptor.
    pub fn open(spec: &TestSpec, device: &str, side: Side) -> Result<ViaLink> {
        vipl::set_segment_size(spec.segment.map(|s| s as usize));
        let rdma = spec.mode == Mode::ViaRdma;
        let rendezvous = spec.pattern.is_rendezvous();
        // The rendezvous writes blocks in both modes.
        let writes = rdma || rendezvous;
        let nvis = spec.vis.unwrap_or(1).max(1) as usize;
        let ring = spec.ring as usize;
        if !(crate::flow::MIN_RING as usize..=1024).contains(&ring) {
            return Err(Error::new(format!("--descriptors {ring}: the ring needs 3 to 1024 descriptors")));
        }
        let name = CString::new(device).map_err(|_| Error::new("bad device name"))?;
        let mut link = ViaLink {
            side,
            rdma,
            rendezvous,
            wait: spec.wait,
            timeout: Duration::from_millis(spec.timeout_ms),
            nic: std::ptr::null_mut(),
            ptag: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            mem: Mapping::new(4096)?,
            mh: 0,
            registered: false,
            desc: 0,
            pool: ring + EXTRA_SEND_DESCRIPTORS,
            vis: Vec::new(),
            cur: 0,
            send_buf: [std::ptr::null_mut(); 3],
            remote: Vec::new(),
            kept: Vec::new(),
            index: HashMap::new(),
            dirty: Vec::new(),
            low: Vec::new(),
            nic_addr: Vec::new(),
            tag: spec.tag.clone(),
            messages: 0,
        };
        // SAFETY: a NUL-terminated name and a valid out-pointer.
        check("VipOpenNic", unsafe { VipOpenNic(name.as_ptr(), &mut link.nic) })
            .map_err(|e| Error::from(e).context(device))?;
        link.nic_addr = nic_address(link.nic)?;
        let max_transfer = nic_max_transfer(link.nic)?;
        let max_block = spec.max_block.max(crate::proto::ACK_BYTES);
        link.desc = spec.desc_size.min(max_transfer).min(round_up(max_block, 64)).max(64);
        let desc = link.desc;
        // SAFETY: a valid out-pointer.
        check("VipCreatePtag", unsafe { VipCreatePtag(link.nic, &mut link.ptag) })?;
        if spec.vis.is_some() {
            let entries = (nvis * (ring + 1)).clamp(16, 4096) as libc::c_ulong;
            // SAFETY: a valid out-pointer.
            check("VipCreateCQ", unsafe { VipCreateCQ(link.nic, entries, &mut link.cq) })?;
        }

        // The region: descriptors, send buffers, receive areas.
        let desc_bytes = round_up(nvis * (ring + link.pool) * VIP_DESCRIPTOR_ALIGNMENT, 4096);
        let buf_bytes = round_up(max_block, 4096);
        let slots = receive_slots(ring, desc, max_block);
        let area_bytes = if writes { buf_bytes } else { round_up(slots * desc, 4096) };
        let ctrl_bytes = if rendezvous { round_up((ring + link.pool) * CTRL_SLOT, 4096) } else { 0 };
        let total = desc_bytes + 3 * buf_bytes + nvis * (area_bytes + ctrl_bytes);
        if total > 8 << 30 {
            return Err(Error::new(format!(
                "{total} bytes of registered memory per side: lower --max-size, --desc-size or --vis"
            )));
        }
        link.mem = Mapping::new(total)?;
        let base = link.mem.ptr();
        let attrs = VIP_MEM_ATTRIBUTES { Ptag: link.ptag, EnableRdmaWrite: writes as VIP_BOOLEAN, EnableRdmaRead: 0 };
        // SAFETY: the mapping is ours and stays mapped until deregistered.
        check("VipRegisterMem", unsafe {
            VipRegisterMem(link.nic, base as VIP_PVOID, link.mem.len() as libc::c_ulong, &attrs, &mut link.mh)
        })?;
        link.registered = true;
        for (i, b) in link.send_buf.iter_mut().enumerate() {
            // SAFETY: inside the mapping.
            *b = unsafe { base.add(desc_bytes + i * buf_bytes) };
        }

        let vi_attrs = VIP_VI_ATTRIBUTES {
            ReliabilityLevel: spec.reliability.level(),
            MaxTransferSize: desc as libc::c_ulong,
            QoS: std::ptr::null_mut(),
            Ptag: link.ptag,
            EnableRdmaWrite: writes as VIP_BOOLEAN,
            EnableRdmaRead: 0,
        };
        for v in 0..nvis {
            let mut vi: VIP_PVOID = std::ptr::null_mut();
            // SAFETY: valid attributes and out-pointer; the CQ may be NULL.
            check("VipCreateVi", unsafe { VipCreateVi(link.nic, &vi_attrs, std::ptr::null_mut(), link.cq, &mut vi) })?;
            let descs = (v * (ring + link.pool)) * VIP_DESCRIPTOR_ALIGNMENT;
            // SAFETY: all inside the mapping, laid out above.
            let (recv, send, area, ctrl) = unsafe {
                let recv = base.add(descs) as *mut Descriptor;
                let area = base.add(desc_bytes + 3 * buf_bytes + v * (area_bytes + ctrl_bytes));
                (recv, recv.add(ring), area, area.add(area_bytes))
            };
            link.index.insert(vi as usize, v);
            link.vis.push(ViSlot {
                vi,
                credits: Credits::new(ring as u32),
                recv,
                send,
                free: (0..link.pool as u32).rev().collect(),
                area,
                ctrl,
                cursor: Cursor::new(slots),
                connected: false,
                reposts: Vec::with_capacity(ring),
                reap_due: false,
            });
            for i in 0..ring {
                link.post_recv(v, i)?;
            }
        }
        link.kept.reserve(chunk_count(max_block, desc));
        Ok(link)
    }

    /// Bytes per descriptor in use.
    pub fn desc_size(&self) -> usize {
        self.desc
    }

    /// This side's RDMA target areas, per VI (none for the rendezvous,
    /// whose answers name them).
    pub fn rdma_targets(&self) -> Vec<(u64, u32)> {
        if !self.rdma || self.rendezvous {
            return Vec::new();
        }
        self.vis.iter().map(|s| (s.area as u64, self.mh)).collect()
    }

    fn discriminator(&self, v: usize) -> Vec<u8> {
        format!("viabench-{}-{v}", self.tag).into_bytes()
    }

    /// Client: connects every VI to the server's.
    pub fn connect(&mut self, info: &ServerInfo) -> Result<()> {
        self.remote = info.rdma.clone();
        for v in 0..self.vis.len() {
            let disc = self.discriminator(v);
            let local = NetAddress::new(&self.nic_addr, &disc);
            let remote = NetAddress::new(&info.nic_addr, &disc);
            // SAFETY: plain data filled by the provider.
            let mut attrs: VIP_VI_ATTRIBUTES = unsafe { std::mem::zeroed() };
            // SAFETY: addresses built above, valid out-pointer.
            check("VipConnectRequest", unsafe {
                VipConnectRequest(
                    self.vis[v].vi,
                    local.as_ptr(),
                    remote.as_ptr(),
                    self.timeout.as_millis() as libc::c_ulong,
                    &mut attrs,
                )
            })
            .map_err(|e| Error::from(e).context(format!("connecting VI {v}")))?;
            self.vis[v].connected = true;
        }
        self.check_remote()
    }

    fn check_remote(&self) -> Result<()> {
        if self.rdma && !self.rendezvous && self.remote.len() != self.vis.len() {
            return Err(Error::new("the peer sent no RDMA target for every VI"));
        }
        Ok(())
    }

    /// Posts receive descriptor `i` of VI `v` again, on the next slot.
    fn post_recv(&mut self, v: usize, i: usize) -> Result<()> {
        let s = &mut self.vis[v];
        // SAFETY: `i` < ring: a descriptor of the mapping, not posted now.
        let d = unsafe { s.recv.add(i) };
        let mut desc = Descriptor::default();
        if self.rendezvous {
            desc.cs.seg_count = 1;
            // SAFETY: i < ring: the descriptor's own message buffer.
            desc.ds[0] = DataSegment {
                data: unsafe { s.ctrl.add(i * CTRL_SLOT) } as u64,
                handle: self.mh,
                length: CTRL_SLOT as u32,
            };
        } else if !self.rdma {
            let slot = s.cursor.take();
            desc.cs.seg_count = 1;
            // SAFETY: slot < slots: inside the VI's area.
            desc.ds[0] = DataSegment {
                data: unsafe { s.area.add(slot * self.desc) } as u64,
                handle: self.mh,
                length: self.desc as u32,
            };
        }
        // SAFETY: as above.
        unsafe { std::ptr::write(d, desc) };
        // SAFETY: a descriptor in registered memory.
        check("VipPostRecv", unsafe { VipPostRecv(s.vi, d, self.mh) })?;
        Ok(())
    }

    /// Takes completed send descriptors of VI `v` back, waiting until at
    /// least `want` are free.
    fn reap(&mut self, v: usize, want: usize) -> Result<()> {
        let deadline = Deadline::after(self.timeout);
        let mut spins = 0u32;
        loop {
            let s = &mut self.vis[v];
            let mut d: *mut Descriptor = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            let mut rc = unsafe { VipSendDone(s.vi, &mut d) };
            if rc == VIP_NOT_DONE && s.free.len() < want && self.wait == Wait::Block {
                // SAFETY: valid out-pointer.
                rc = unsafe { VipSendWait(s.vi, WAIT_SLICE_MS as libc::c_ulong, &mut d) };
            }
            match rc {
                VIP_SUCCESS => {
                    // SAFETY: VipSendDone returned one of our send descriptors.
                    let status = unsafe { Descriptor::status(d) };
                    if status & VIP_STATUS_DONE == 0 || status & VIP_STATUS_ERROR_MASK != 0 {
                        return Err(Error::new(format!("a send on VI {v} completed with status {status:#x}")));
                    }
                    let i = (d as usize - s.send as usize) / VIP_DESCRIPTOR_ALIGNMENT;
                    s.free.push(i as u32);
                }
                VIP_NOT_DONE | VIP_TIMEOUT => {
                    if s.free.len() >= want {
                        return Ok(());
                    }
                    spins = spins.wrapping_add(1);
                    if rc == VIP_TIMEOUT || spins.is_multiple_of(4096) {
                        deadline.check("waiting for a send to complete")?;
                    }
                }
                rc => check("VipSendDone", rc)?,
            }
        }
    }

    /// Posts one send-queue descriptor of VI `v`.
    fn post_send(&mut self, v: usize, control: u16, imm: u32, segs: &[DataSegment]) -> Result<()> {
        let i = self.take_send(v)?;
        self.post_at(v, i, control, imm, segs)
    }

    /// Takes a free send descriptor of VI `v`, waiting for one if need be.
    #[inline]
    fn take_send(&mut self, v: usize) -> Result<usize> {
        if self.vis[v].free.is_empty() {
            self.reap(v, 1)?;
        }
        let s = &mut self.vis[v];
        let i = s.free.pop().expect("a free send descriptor") as usize;
        if s.free.len() <= self.pool / 2 && !s.reap_due {
            s.reap_due = true;
            self.low.push(v);
        }
        Ok(i)
    }

    /// Posts send descriptor `i` of VI `v`, taken with [`Self::take_send`].
    fn post_at(&mut self, v: usize, i: usize, control: u16, imm: u32, segs: &[DataSegment]) -> Result<()> {
        let s = &mut self.vis[v];
        let mut desc = Descriptor::default();
        desc.cs.control = control;
        desc.cs.immediate = imm;
        desc.cs.seg_count = segs.len() as u16;
        desc.cs.length = segs.iter().map(|x| x.length).sum();
        desc.ds[..segs.len()].copy_from_slice(segs);
        // SAFETY: i < pool; the descriptor is not posted.
        let d = unsafe { s.send.add(i) };
        // SAFETY: as above.
        unsafe { std::ptr::write(d, desc) };
        // SAFETY: a descriptor in registered memory.
        check("VipPostSend", unsafe { VipPostSend(s.vi, d, self.mh) })?;
        self.messages += 1;
        Ok(())
    }

    fn send_continue(&mut self, v: usize) -> Result<()> {
        let imm = self.vis[v].credits.on_send(true);
        self.post_send(v, VIP_CONTROL_IMMEDIATE, imm.encode(), &[])
    }

    /// Posts again the receive descriptors taken out since the last call,
    /// and answers with a continue where one is due; takes back the
    /// completed sends of VIs with half their pool out.  Called after a
    /// send and before a wait, as ucx_perftest posts its next receive after
    /// its reply: the peer's next message needs one of the other
    /// descriptors of the ring, not this one, so neither `VipPostRecv` nor
    /// `VipSendDone` lies on the way from a message to its answer.  The
    /// grant announces only receives posted.
    fn repost(&mut self) -> Result<()> {
        // Drained in place: the lists keep their room, so a message costs
        // no allocation.
        while let Some(v) = self.dirty.pop() {
            for k in 0..self.vis[v].reposts.len() {
                let i = self.vis[v].reposts[k] as usize;
                self.post_recv(v, i)?;
                self.vis[v].credits.on_repost();
            }
            self.vis[v].reposts.clear();
            if self.vis[v].credits.wants_continue() {
                self.send_continue(v)?;
            }
        }
        // A VI whose sends have not completed yet (over the network, the
        // answer carries their acknowledgement) stays due.
        let mut k = 0;
        while k < self.low.len() {
            let v = self.low[k];
            self.reap(v, 0)?;
            if self.vis[v].free.len() > self.pool / 2 {
                self.vis[v].reap_due = false;
                self.low.swap_remove(k);
            } else {
                k += 1;
            }
        }
        Ok(())
    }

    /// Waits for the next receive completion: on the current VI, or on any
    /// VI through the CQ.
    fn next_recv(&mut self) -> Result<(usize, *mut Descriptor)> {
        self.repost()?;
        let deadline = Deadline::after(self.timeout);
        let mut spins = 0u32;
        let mut d: *mut Descriptor = std::ptr::null_mut();
        loop {
            if self.cq.is_null() {
                let vi = self.vis[self.cur].vi;
                let rc = match self.wait {
                    // SAFETY: valid out-pointer.
                    Wait::Poll => unsafe { VipRecvDone(vi, &mut d) },
                    // SAFETY: valid out-pointer.
                    Wait::Block => unsafe { VipRecvWait(vi, WAIT_SLICE_MS as libc::c_ulong, &mut d) },
                };
                match rc {
                    VIP_SUCCESS => return Ok((self.cur, d)),
                    VIP_NOT_DONE | VIP_TIMEOUT => {}
                    rc => check("VipRecvDone", rc)?,
                }
                spins = spins.wrapping_add(1);
                if rc == VIP_TIMEOUT || spins.is_multiple_of(65536) {
                    deadline.check("waiting for a message")?;
                }
            } else {
                let mut vi: VIP_PVOID = std::ptr::null_mut();
                let mut recv: VIP_BOOLEAN = 0;
                let rc = match self.wait {
                    // SAFETY: valid out-pointers.
                    Wait::Poll => unsafe { VipCQDone(self.cq, &mut vi, &mut recv) },
                    // SAFETY: valid out-pointers.
                    Wait::Block => unsafe { VipCQWait(self.cq, WAIT_SLICE_MS as libc::c_ulong, &mut vi, &mut recv) },
                };
                match rc {
                    VIP_SUCCESS => {
                        let v = *self
                            .index
                            .get(&(vi as usize))
                            .ok_or_else(|| Error::new("the CQ named a VI of nobody's"))?;
                        if recv == 0 {
                            return Err(Error::new("a send-queue completion on the receive CQ"));
                        }
                        // SAFETY: valid out-pointer.
                        check("VipRecvDone after VipCQDone", unsafe { VipRecvDone(vi, &mut d) })?;
                        return Ok((v, d));
                    }
                    VIP_NOT_DONE | VIP_TIMEOUT => {}
                    rc => check("VipCQDone", rc)?,
                }
                spins = spins.wrapping_add(1);
                if rc == VIP_TIMEOUT || spins.is_multiple_of(65536) {
                    deadline.check("waiting for a completion")?;
                }
            }
        }
    }

    /// Handles a completed receive of VI `v`: checks it, takes the grant and
    /// leaves its descriptor to `repost` (so its data stays until the next
    /// wait).  Returns what arrived, or `None` for a continue.
    fn handle(&mut self, v: usize, d: *mut Descriptor) -> Result<Option<Arrival>> {
        // SAFETY (here and below): VipRecvDone returned one of our receive descriptors.
        let status = unsafe { Descriptor::status(d) };
        if status & VIP_STATUS_DONE == 0 || status & VIP_STATUS_ERROR_MASK != 0 {
            return Err(Error::new(format!("a receive on VI {v} completed with status {status:#x}")));
        }
        if status & VIP_STATUS_IMMEDIATE == 0 {
            return Err(Error::new(format!("a message without immediate data on VI {v} (status {status:#x})")));
        }
        let imm = Immediate::decode(unsafe { Descriptor::immediate(d) });
        let len = unsafe { Descriptor::length(d) } as usize;
        // SAFETY: the provider is done with the descriptor.
        let addr = unsafe { (*d).ds[0].data } as usize;
        let s = &self.vis[v];
        let i = (d as usize - s.recv as usize) / VIP_DESCRIPTOR_ALIGNMENT;
        if s.reposts.is_empty() {
            self.dirty.push(v);
        }
        self.vis[v].reposts.push(i as u32);
        self.vis[v].credits.on_receive(imm);
        if imm.control {
            if len != 0 {
                return Err(Error::new("a continue message with data"));
            }
            return Ok(None);
        }
        let written = status & VIP_STATUS_OP_MASK == VIP_STATUS_OP_REMOTE_RDMA_WRITE;
        let addr = if written { self.vis[v].area as usize } else { addr };
        Ok(Some(Arrival { addr, len, written }))
    }

    /// Waits for the next message that is not a continue; it must come on
    /// VI `v`.
    fn next_message(&mut self, v: usize) -> Result<Arrival> {
        loop {
            let (w, d) = self.next_recv()?;
            let Some(a) = self.handle(w, d)? else { continue };
            if w != v {
                return Err(Error::new(format!("a message arrived on VI {w} while VI {v} was expected")));
            }
            return Ok(a);
        }
    }

    /// The rendezvous message that arrived in `a`'s buffer, which must be
    /// a `kind` for a block of `len` bytes.
    fn rendezvous_message(a: Arrival, kind: u32, len: usize) -> Result<Rendezvous> {
        if a.written {
            return Err(Error::new(format!("rendezvous: an RDMA write where {} was expected", Rendezvous::name(kind))));
        }
        // SAFETY: the receive buffer of the descriptor just completed, not
        // posted again before the next wait.
        let bytes = unsafe { std::slice::from_raw_parts(a.addr as *const u8, a.len.min(CTRL_SLOT)) };
        Rendezvous::expect(bytes, kind, len)
    }

    /// Sends rendezvous message `m` on VI `v` from the send descriptor's
    /// own buffer.
    fn send_rendezvous_message(&mut self, v: usize, m: Rendezvous) -> Result<()> {
        self.wait_for_credit(v)?;
        let i = self.take_send(v)?;
        let ring = self.vis[v].recv_ring();
        // SAFETY: the message buffer of send descriptor i, which is not posted.
        let buf = unsafe { self.vis[v].ctrl.add((ring + i) * CTRL_SLOT) };
        // SAFETY: as above; CTRL_SLOT >= Rendezvous::BYTES.
        unsafe { std::ptr::copy_nonoverlapping(m.encode().as_ptr(), buf, Rendezvous::BYTES) };
        let imm = self.vis[v].credits.on_send(false).encode();
        let seg = DataSegment { data: buf as u64, handle: self.mh, length: Rendezvous::BYTES as u32 };
        self.post_at(v, i, VIP_CONTROL_OP_SENDRECV | VIP_CONTROL_IMMEDIATE, imm, &[seg])
    }

    /// Sends a block by rendezvous: the request, the answer, the write and
    /// its completion.
    fn send_by_rendezvous(&mut self, which: Which, len: usize) -> Result<()> {
        let v = self.cur;
        self.send_rendezvous_message(v, Rendezvous { kind: Rendezvous::REQUEST, len: len as u64, addr: 0, handle: 0 })?;
        let a = self.next_message(v)?;
        let answer = Self::rendezvous_message(a, Rendezvous::ANSWER, len)?;
        let base = self.send_buf[which as usize] as u64;
        let n = chunk_count(len, self.desc);
        for (i, (off, l)) in chunks(len, self.desc).enumerate() {
            let local = DataSegment { data: base + off as u64, handle: self.mh, length: l as u32 };
            let remote = DataSegment { data: answer.addr + off as u64, handle: answer.handle, length: 0 };
            if i + 1 == n && self.rdma {
                self.wait_for_credit(v)?;
                let imm = self.vis[v].credits.on_send(false).encode();
                self.post_send(v, VIP_CONTROL_OP_RDMAWRITE | VIP_CONTROL_IMMEDIATE, imm, &[remote, local])?;
            } else {
                self.post_send(v, VIP_CONTROL_OP_RDMAWRITE, 0, &[remote, local])?;
            }
        }
        if !self.rdma {
            self.send_rendezvous_message(
                v,
                Rendezvous { kind: Rendezvous::DONE, len: len as u64, addr: 0, handle: 0 },
            )?;
        }
        Ok(())
    }

    /// Receives a block by rendezvous into the VI's target area.
    fn recv_by_rendezvous(&mut self, len: usize, keep: bool) -> Result<()> {
        let v = self.cur;
        let a = self.next_message(v)?;
        Self::rendezvous_message(a, Rendezvous::REQUEST, len)?;
        let target = self.vis[v].area;
        let answer = Rendezvous { kind: Rendezvous::ANSWER, len: len as u64, addr: target as u64, handle: self.mh };
        self.send_rendezvous_message(v, answer)?;
        let a = self.next_message(v)?;
        if self.rdma {
            let last = chunks(len, self.desc).last().expect("one chunk").1;
            if !a.written || a.len != last {
                return Err(Error::new(format!(
                    "rendezvous: expected the write's last chunk of {last} bytes with immediate data, got {} {} bytes",
                    if a.written { "a write of" } else { "a message of" },
                    a.len
                )));
            }
        } else {
            Self::rendezvous_message(a, Rendezvous::DONE, len)?;
        }
        if keep {
            self.kept.clear();
            self.kept.push((target as usize, len, 0));
        }
        Ok(())
    }

    /// Handles completions until VI `v` may send data.  In line: a
    /// message on its way to the peer passes here.
    #[inline]
    fn wait_for_credit(&mut self, v: usize) -> Result<()> {
        match self.vis[v].credits.can_send_data() {
            true => Ok(()),
            false => self.stall_for_credit(v),
        }
    }

    #[cold]
    fn stall_for_credit(&mut self, v: usize) -> Result<()> {
        self.vis[v].credits.stalls += 1;
        while !self.vis[v].credits.can_send_data() {
            let (w, d) = self.next_recv()?;
            if self.handle(w, d)?.is_some() {
                return Err(Error::new("a message arrived while waiting for credits"));
            }
        }
        Ok(())
    }

    fn teardown(&mut self) -> Result<()> {
        let mut first: Option<Error> = None;
        let mut note = |r: std::result::Result<(), VipError>| {
            if let Err(e) = r {
                first.get_or_insert(e.into());
            }
        };
        let cq = self.cq;
        for s in self.vis.drain(..) {
            if s.connected {
                // SAFETY: a VI handle of ours.
                note(check("VipDisconnect", unsafe { VipDisconnect(s.vi) }));
            }
            // The disconnect completed the VI's posted receives, in error,
            // through the CQ: taken off at once, so that a CQ of fewer
            // entries than all the VIs' receives (1024 VIs of 16) does not
            // overflow while the others go.
            while !cq.is_null() {
                let (mut vi, mut recv): (VIP_PVOID, VIP_BOOLEAN) = (std::ptr::null_mut(), 0);
                let mut d: *mut Descriptor = std::ptr::null_mut();
                // SAFETY: our CQ and valid out-pointers.
                if unsafe { VipCQDone(cq, &mut vi, &mut recv) } != VIP_SUCCESS {
                    break;
                }
                // SAFETY: the VI the CQ named, valid out-pointer.
                unsafe {
                    if recv != 0 {
                        VipRecvDone(vi, &mut d);
                    } else {
                        VipSendDone(vi, &mut d);
                    }
                }
            }
            // SAFETY: as above.
            note(check("VipDestroyVi", unsafe { VipDestroyVi(s.vi) }));
        }
        if !self.cq.is_null() {
            // SAFETY: our CQ, no VI attached any more.
            note(check("VipDestroyCQ", unsafe { VipDestroyCQ(self.cq) }));
            self.cq = std::ptr::null_mut();
        }
        if self.registered {
            // SAFETY: the region registered in `open`.
            note(check("VipDeregisterMem", unsafe {
                VipDeregisterMem(self.nic, self.mem.ptr() as VIP_PVOID, self.mh)
            }));
            self.registered = false;
        }
        if !self.ptag.is_null() {
            // SAFETY: our protection tag, no longer used.
            note(check("VipDestroyPtag", unsafe { VipDestroyPtag(self.nic, self.ptag) }));
            self.ptag = std::ptr::null_mut();
        }
        if !self.nic.is_null() {
            // SAFETY: our NIC.
            note(check("VipCloseNic", unsafe { VipCloseNic(self.nic) }));
            self.nic = std::ptr::null_mut();
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for ViaLink {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

impl Link for ViaLink {
    fn prepare(&mut self, len: usize, seeds: [u64; 3]) -> Result<()> {
        for (buf, seed) in self.send_buf.iter().zip(seeds) {
            // SAFETY: each send buffer holds max_block >= len bytes; no send is outstanding.
            pattern::fill(seed, unsafe { std::slice::from_raw_parts_mut(*buf, len) });
        }
        Ok(())
    }

    fn send(&mut self, which: Which, len: usize) -> Result<()> {
        if self.rendezvous {
            return self.send_by_rendezvous(which, len);
        }
        let v = self.cur;
        let base = self.send_buf[which as usize] as u64;
        let n = chunk_count(len, self.desc);
        for (i, (off, l)) in chunks(len, self.desc).enumerate() {
            let local = DataSegment { data: base + off as u64, handle: self.mh, length: l as u32 };
            if self.rdma {
                let (raddr, rh) = self.remote[v];
                let remote = DataSegment { data: raddr + off as u64, handle: rh, length: 0 };
                if i + 1 == n {
                    self.wait_for_credit(v)?;
                    let imm = self.vis[v].credits.on_send(false).encode();
                    self.post_send(v, VIP_CONTROL_OP_RDMAWRITE | VIP_CONTROL_IMMEDIATE, imm, &[remote, local])?;
                } else {
                    self.post_send(v, VIP_CONTROL_OP_RDMAWRITE, 0, &[remote, local])?;
                }
            } else {
                self.wait_for_credit(v)?;
                let imm = self.vis[v].credits.on_send(false).encode();
                let segs: &[DataSegment] = if l == 0 { &[] } else { std::slice::from_ref(&local) };
                self.post_send(v, VIP_CONTROL_OP_SENDRECV | VIP_CONTROL_IMMEDIATE, imm, segs)?;
            }
        }
        Ok(())
    }

    fn recv(&mut self, len: usize, keep: bool) -> Result<()> {
        if self.rendezvous {
            return self.recv_by_rendezvous(len, keep);
        }
        let v = self.cur;
        if keep {
            self.kept.clear();
        }
        let n = chunk_count(len, self.desc);
        // An RDMA block's write with immediate data is its last chunk.
        let written_chunk = self.rdma.then(|| chunks(len, self.desc).last().expect("one chunk"));
        let messages = if self.rdma { 1 } else { n };
        let mut got = 0;
        while got < messages {
            let (w, d) = self.next_recv()?;
            let Some(Arrival { addr, len: l, written }) = self.handle(w, d)? else { continue };
            if w != v {
                return Err(Error::new(format!("data arrived on VI {w} while VI {v} was expected")));
            }
            if self.rdma != written {
                return Err(Error::new(if self.rdma {
                    "expected an RDMA write with immediate data, got a send"
                } else {
                    "expected a send, got an RDMA write"
                }));
            }
            let (off, want) = match written_chunk {
                Some(chunk) => chunk,
                None => {
                    let off = got * self.desc;
                    (off, (len - off).min(self.desc))
                }
            };
            if l != want {
                return Err(Error::new(format!("chunk at offset {off} of a {len}-byte block: {l} bytes, not {want}")));
            }
            if keep {
                if self.rdma {
                    self.kept.push((addr, len, 0));
                } else {
                    self.kept.push((addr, l, off));
                }
            }
            got += 1;
        }
        Ok(())
    }

    fn verify(&self, seed: u64, len: usize) -> Result<()> {
        let total: usize = self.kept.iter().map(|k| k.1).sum();
        if total != len {
            return Err(Error::new(format!("kept {total} bytes of a {len}-byte block")));
        }
        for &(addr, l, off) in &self.kept {
            // SAFETY: the chunk lies in this side's receive or target area.
            let data = unsafe { std::slice::from_raw_parts(addr as *const u8, l) };
            pattern::check(seed, off, data)
                .map_err(|k| Error::new(format!("byte {k} of a {len}-byte block is wrong ({:?})", self.side)))?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        for v in 0..self.vis.len() {
            self.reap(v, self.pool)?;
        }
        Ok(())
    }

    fn select(&mut self, vi: usize) {
        self.cur = vi % self.vis.len();
    }

    fn vis(&self) -> usize {
        self.vis.len()
    }

    fn stats(&self) -> LinkStats {
        LinkStats {
            messages: self.messages,
            continues: self.vis.iter().map(|s| s.credits.continues_sent).sum(),
            stalls: self.vis.iter().map(|s| s.credits.stalls).sum(),
        }
    }

    fn close(&mut self) -> Result<()> {
        self.teardown()
    }
}

impl Pending for ViaLink {
    fn info(&self) -> ServerInfo {
        ServerInfo { nic_addr: self.nic_addr.clone(), rdma: self.rdma_targets(), ..Default::default() }
    }

    fn accept(mut self: Box<Self>) -> Result<Box<dyn LinkServer>> {
        for v in 0..self.vis.len() {
            let local = NetAddress::new(&self.nic_addr, &self.discriminator(v));
            let mut remote = NetAddress::empty();
            // SAFETY: plain data filled by the provider.
            let mut attrs: VIP_VI_ATTRIBUTES = unsafe { std::mem::zeroed() };
            let mut conn: VIP_PVOID = std::ptr::null_mut();
            // SAFETY: valid addresses and out-pointers.
            check("VipConnectWait", unsafe {
                VipConnectWait(
                    self.nic,
                    local.as_ptr(),
                    self.timeout.as_millis() as libc::c_ulong,
                    remote.as_mut_ptr(),
                    &mut attrs,
                    &mut conn,
                )
            })
            .map_err(|e| Error::from(e).context(format!("waiting for VI {v}")))?;
            // SAFETY: the connection handle just returned and our VI.
            check("VipConnectAccept", unsafe { VipConnectAccept(conn, self.vis[v].vi) })?;
            self.vis[v].connected = true;
        }
        Ok(self)
    }
}

impl LinkServer for ViaLink {
    fn complete(mut self: Box<Self>, peer: &PeerInfo, _peer_ip: IpAddr) -> Result<Box<dyn Link>> {
        self.remote = peer.rdma.clone();
        self.check_remote()?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendezvous_messages_round_trip() {
        let answer = Rendezvous { kind: Rendezvous::ANSWER, len: 1 << 20, addr: 0x7f00_1234_5000, handle: 7 };
        let bytes = answer.encode();
        assert_eq!(Rendezvous::decode(&bytes), Some(answer));
        assert_eq!(Rendezvous::expect(&bytes, Rendezvous::ANSWER, 1 << 20).unwrap(), answer);
        let e = Rendezvous::expect(&bytes, Rendezvous::REQUEST, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("expected a request of 1048576 bytes, got an answer"), "{e}");
        let e = Rendezvous::expect(&bytes, Rendezvous::ANSWER, 4096).unwrap_err();
        assert!(e.to_string().contains("got an answer of 1048576"), "{e}");
        // Something that is no rendezvous message, or cut short.
        assert_eq!(Rendezvous::decode(&[0u8; Rendezvous::BYTES]), None);
        assert_eq!(Rendezvous::decode(&bytes[..16]), None);
        assert!(Rendezvous::expect(&bytes[..16], Rendezvous::ANSWER, 1 << 20).is_err());
    }
}
