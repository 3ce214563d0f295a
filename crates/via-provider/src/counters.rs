//! The provider's counters, published in a page that `viad --stats` reads
//! (see `via_shm::stats`): what was sent, received, retransmitted, and
//! dropped with the reason.

use crate::tuning::tuning;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;
use via_core::consts::limits;
use via_shm::stats::{StatsPage, ROW_WIDTH};

/// One counter of a NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    /// Messages sent (sends and RDMA writes with immediate data).
    MsgsSent,
    /// Messages received into receive descriptors.
    MsgsReceived,
    /// Payload bytes sent.
    BytesSent,
    /// Payload bytes received.
    BytesReceived,
    /// Sends copied inline through a shared-memory ring.
    InlineSends,
    /// Single copies by cross-memory attach.
    CmaCopies,
    /// RDMA writes carried out.
    RdmaWrites,
    /// RDMA reads carried out.
    RdmaReads,
    /// RDMA requests refused by a protection check.
    RdmaRefused,
    /// Messages dropped on unreliable VIs because no receive was posted.
    DroppedNoRecv,
    /// Connections established.
    Connects,
    /// Connections broken (errors, peer loss).
    Breaks,
    /// UDP packets sent.
    PacketsSent,
    /// UDP packets handed to a VI.
    PacketsReceived,
    /// Packets retransmitted.
    Retransmits,
    /// Duplicate packets dropped.
    Duplicates,
    /// Packets dropped for a wrong key or VI.
    BadKey,
    /// Datagrams dropped as malformed (checksum, length, version).
    Malformed,
    /// Packets dropped for an unknown VI.
    UnknownVi,
    /// Packets sent as Ethernet frames (`ether`), also counted in `PacketsSent`.
    FramesSent,
    /// Packets received as Ethernet frames, also counted in `PacketsReceived`.
    FramesReceived,
    /// Packets whose payload the kernel wrote straight into the posted
    /// receive buffer where it belongs (`NetPort::land`).
    PacketsInPlace,
    /// Shared-memory connections whose peer this process may not
    /// cross-memory attach to (another user, Yama): their large sends go
    /// through the connection's ring.
    RingConnections,
    /// Ring slots carrying pieces of messages too large for one slot, on
    /// such connections.
    RingPieces,
    /// Ended connections' last words said again to a peer that went on
    /// retransmitting (`NetPort::answer_ended`).
    LastWordsRepeated,
    // Stage timings of the data path, kept only with `VIA_PROFILE`.
    /// Nanoseconds inside `VipPostSend`.
    PostSendNs,
    /// `VipPostSend` calls timed.
    PostSendCalls,
    /// Nanoseconds validating send descriptors (address translation and checks).
    ValidateNs,
    /// Nanoseconds from ringing a doorbell to the send engine taking the descriptor.
    DoorbellNs,
    /// Doorbells rung (`VIA_DOORBELL=d1|d2`).
    DoorbellRings,
    /// Nanoseconds moving send data (ring, cross-memory copy, packets out).
    TransferNs,
    /// Sends moved.
    Transfers,
    /// Nanoseconds writing send completions (descriptor status, CQ entries).
    CompleteNs,
    /// Send completions written.
    Completions,
    /// Nanoseconds completing arrived messages into receive descriptors.
    ReceiveNs,
    /// Messages completed into receive descriptors.
    Receives,
    /// Nanoseconds inside `VipCQDone`.
    CqDoneNs,
    /// `VipCQDone` calls timed.
    CqDoneCalls,
}

/// Names, in the order of [`Counter`].
pub const NAMES: [&str; 38] = [
    "msgs_sent",
    "msgs_received",
    "bytes_sent",
    "bytes_received",
    "inline_sends",
    "cma_copies",
    "rdma_writes",
    "rdma_reads",
    "rdma_refused",
    "dropped_no_recv",
    "connects",
    "breaks",
    "packets_sent",
    "packets_received",
    "retransmits",
    "duplicates",
    "dropped_bad_key",
    "dropped_malformed",
    "dropped_unknown_vi",
    "frames_sent",
    "frames_received",
    "packets_in_place",
    "ring_connections",
    "ring_pieces",
    "last_words_repeated",
    "post_send_ns",
    "post_send_calls",
    "validate_ns",
    "doorbell_ns",
    "doorbell_rings",
    "transfer_ns",
    "transfers",
    "complete_ns",
    "completions",
    "receive_ns",
    "receives",
    "cq_done_ns",
    "cq_done_calls",
];

// The counters a work queue adds to on every message come first: they
// are the columns of the page's rows.
const _: () = assert!(Counter::RdmaReads as usize + 1 == ROW_WIDTH);

/// The counters of one NIC.
#[derive(Clone)]
pub struct Counters(Option<Arc<Page>>);

struct Page {
    stats: StatsPage,
    free_rows: Mutex<Vec<u32>>,
}

impl Counters {
    /// A page labelled with the device name, with a row for each of
    /// the most VIs a NIC has; without a page (no memfd) counting
    /// is off.
    pub fn new(device: &str) -> Counters {
        let page = StatsPage::create(device, &NAMES, limits::MAX_VI).ok().map(|stats| {
            let free_rows = Mutex::new((0..stats.rows() as u32).rev().collect());
            Arc::new(Page { stats, free_rows })
        });
        Counters(page)
    }

    /// Adds `n` to `c`.
    pub fn add(&self, c: Counter, n: u64) {
        // Adding nothing skips the atomic add: the data path reports
        // counters that mostly stay put (retransmits, duplicates).
        if let Some(p) = self.0.as_ref().filter(|_| n > 0) {
            p.stats.add(c as usize, n);
        }
    }

    /// The current value of `c`.
    pub fn get(&self, c: Counter) -> u64 {
        self.0.as_ref().map_or(0, |p| p.stats.get(c as usize))
    }

    /// The page, to hand to the host agent.
    pub fn page(&self) -> Option<&StatsPage> {
        self.0.as_ref().map(|p| &p.stats)
    }

    /// A row of the page for one VI, which its two work queues share
    /// ([`RowLease::view`]).
    pub(crate) fn row(&self) -> RowLease {
        let row = self.0.as_ref().and_then(|p| p.free_rows.lock().pop());
        RowLease { page: self.0.clone(), row }
    }
}

/// The columns of a row that one work queue adds to, a bit per counter.
#[derive(Clone, Copy, Default)]
pub(crate) struct Columns(u8);

impl Columns {
    const fn of(counters: &[Counter]) -> Columns {
        let mut bits = 0u8;
        let mut i = 0;
        while i < counters.len() {
            bits |= 1 << counters[i] as usize;
            i += 1;
        }
        Columns(bits)
    }

    fn has(self, c: Counter) -> bool {
        (c as usize) < ROW_WIDTH && self.0 & (1 << c as usize) != 0
    }
}

/// What the receive queue counts per message.
pub(crate) const RECV_COLUMNS: Columns = Columns::of(&[Counter::MsgsReceived, Counter::BytesReceived]);
/// What the send queue counts per message: the rest of the row.
pub(crate) const SEND_COLUMNS: Columns = Columns(!RECV_COLUMNS.0);

// A column has one writer, so its adds need no atomics.
const _: () = assert!(RECV_COLUMNS.0 & SEND_COLUMNS.0 == 0);

/// One VI's row of the NIC's page: one line, so that a message adds to a
/// line of counters rather than two.  Freed when the VI goes; a row
/// outlives its owner's counts, and the next owner adds to what is there.
#[derive(Default)]
pub(crate) struct RowLease {
    page: Option<Arc<Page>>,
    row: Option<u32>,
}

impl RowLease {
    /// The counters of one work queue: the row's `columns`, which only it
    /// adds to (under its lock, through `&mut`), so its per-message
    /// counters cost a load and a store instead of an atomic
    /// read-modify-write.  Other counters go to the page's shared values.
    pub fn view(&self, columns: Columns) -> CounterRow {
        CounterRow { page: self.page.clone(), values: self.line().cast(), columns }
    }

    /// Where the row is, for its owner to prefetch (null without one).
    pub fn line(&self) -> *const u8 {
        match (&self.page, self.row) {
            (Some(p), Some(row)) => p.stats.row_line(row as usize),
            _ => std::ptr::null(),
        }
    }
}

impl Drop for RowLease {
    fn drop(&mut self) {
        if let (Some(p), Some(row)) = (&self.page, self.row) {
            p.free_rows.lock().push(row);
        }
    }
}

/// A work queue's view of its VI's row ([`RowLease::view`]).
pub(crate) struct CounterRow {
    page: Option<Arc<Page>>,
    /// The row's first value, in `page`; null without a row.  Kept as an
    /// address so that a message's counts cost no look-up of the row.
    values: *const AtomicU64,
    columns: Columns,
}

// SAFETY: `values` points into the page that `page` keeps mapped; its
// columns are written only through `&mut self`.
unsafe impl Send for CounterRow {}
unsafe impl Sync for CounterRow {}

impl Default for CounterRow {
    fn default() -> CounterRow {
        CounterRow { page: None, values: std::ptr::null(), columns: Columns::default() }
    }
}

impl CounterRow {
    /// Adds `n` to `c`.
    pub fn add(&mut self, c: Counter, n: u64) {
        if self.columns.has(c) && !self.values.is_null() {
            // SAFETY: column `c` of the row lies in the page `page` holds,
            // and only this view adds to it.
            let v = unsafe { &*self.values.add(c as usize) };
            v.store(v.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        } else if let Some(p) = &self.page {
            p.stats.add(c as usize, n);
        }
    }
}

/// Times one stage of the data path into a pair of counters, when
/// `VIA_PROFILE` asks for it; otherwise reads no clock.
pub struct StageTimer(Option<Instant>);

impl StageTimer {
    /// Starts timing.  Inline: without `VIA_PROFILE` a stage costs a load
    /// and a branch, not a call (a small message passes a dozen stages).
    #[inline(always)]
    pub fn start() -> StageTimer {
        match profiling() {
            true => StageTimer(Some(Instant::now())),
            false => StageTimer(None),
        }
    }

    /// Adds the time since `start` to `ns`, and one to `calls` if given.
    #[inline(always)]
    pub fn stop(self, counters: &Counters, ns: Counter, calls: Option<Counter>) {
        if let Some(t) = self.0 {
            stop_timing(t, counters, ns, calls);
        }
    }
}

#[cold]
#[inline(never)]
fn stop_timing(t: Instant, counters: &Counters, ns: Counter, calls: Option<Counter>) {
    counters.add(ns, t.elapsed().as_nanos() as u64);
    if let Some(c) = calls {
        counters.add(c, 1);
    }
}

/// Whether `VIA_PROFILE` is set: asked at every stage of the data path,
/// so the answer is kept in one word (0 until first asked, then 1 for no
/// and 2 for yes; the settings never change once read).  In line, the
/// usual answer is one comparison; the others are out of line.
#[inline(always)]
pub(crate) fn profiling() -> bool {
    match PROFILING.load(Ordering::Relaxed) {
        PROFILE_OFF => false,
        known => profiling_on_or_unknown(known),
    }
}

static PROFILING: AtomicU8 = AtomicU8::new(0);
const PROFILE_OFF: u8 = 1;
const PROFILE_ON: u8 = 2;

#[cold]
#[inline(never)]
fn profiling_on_or_unknown(known: u8) -> bool {
    if known == PROFILE_ON {
        return true;
    }
    let on = tuning().profile.is_some();
    PROFILING.store(if on { PROFILE_ON } else { PROFILE_OFF }, Ordering::Relaxed);
    on
}

/// Appends one JSON line with the NIC's settings and counters to the
/// `VIA_PROFILE` file, if set (at `VipCloseNic`).
pub fn write_profile(device: &str, counters: &Counters) {
    let Some(path) = &tuning().profile else { return };
    let settings: Vec<String> =
        tuning().describe().iter().map(|(k, v)| format!("\"{k}\":\"{}\"", json_escape(v))).collect();
    let values: Vec<String> = NAMES
        .iter()
        .enumerate()
        .map(|(i, name)| format!("\"{name}\":{}", counters.0.as_ref().map_or(0, |p| p.stats.get(i))))
        .collect();
    let line = format!(
        "{{\"pid\":{},\"device\":\"{}\",\"settings\":{{{}}},\"counters\":{{{}}}}}\n",
        std::process::id(),
        json_escape(device),
        settings.join(","),
        values.join(",")
    );
    // One write of a line opened for appending: lines of processes sharing the file do not interleave.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
    if let Err(e) = written {
        eprintln!("openvia: VIA_PROFILE={}: {e}", path.display());
    }
}

fn json_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            '"' | '\\' => vec!['\\', c],
            c if (c as u32) < 0x20 => format!("\\u{:04x}", c as u32).chars().collect(),
            c => vec![c],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads column `c` of the row at `line`.
    fn column(line: *const u8, c: Counter) -> u64 {
        // SAFETY: `line` is a row of a live page, ROW_WIDTH values long.
        unsafe {
            (*(line as *const std::sync::atomic::AtomicU64).add(c as usize)).load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    #[test]
    fn a_vis_two_queues_count_into_its_one_row() {
        let counters = Counters::new("rows");
        assert!(counters.page().is_some(), "memfd pages work here");
        let lease = counters.row();
        let line = lease.line();
        let (mut recv, mut send) = (lease.view(RECV_COLUMNS), lease.view(SEND_COLUMNS));
        recv.add(Counter::MsgsReceived, 1);
        recv.add(Counter::BytesReceived, 10);
        send.add(Counter::MsgsSent, 2);
        send.add(Counter::BytesSent, 20);
        send.add(Counter::InlineSends, 2);
        // Not the receive queue's column: the page's shared value.
        recv.add(Counter::MsgsSent, 5);
        let row = [Counter::MsgsReceived, Counter::BytesReceived, Counter::MsgsSent, Counter::BytesSent];
        assert_eq!(row.map(|c| column(line, c)), [1, 10, 2, 20]);
        assert_eq!(column(line, Counter::InlineSends), 2);
        assert_eq!(counters.get(Counter::MsgsSent), 7);
        assert_eq!(counters.get(Counter::BytesReceived), 10);

        // The row goes back with the VI; its next owner adds to it.
        drop((recv, send, lease));
        let next = counters.row();
        assert_eq!(next.line(), line);
        next.view(RECV_COLUMNS).add(Counter::MsgsReceived, 1);
        assert_eq!(column(line, Counter::MsgsReceived), 2);
    }
}
