//! A shared-memory connection: the segment with the two rings and receive
//! caches, the socket pair that carries control messages and tells of the
//! peer's death, the completion lanes and bells, and the peer's registry
//! table.  The VI drives it (`vi`); connection set-up makes it (`connect`).

use crate::endpoint::{Endpoint, PeerMessage, NO_CQ};
use crate::handles::Handle;
use crate::lane::{CqEntry, LaneHold};
use crate::peer_channel;
use crate::progress;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use via_core::consts::error_code;
use via_core::descriptor::LocalSeg;
use via_core::error::{ViaError, ViaResult};
use via_shm::bell::Bell;
use via_shm::conn::ConnSegment;
use via_shm::inbox::Inbox;
use via_shm::recv::RecvSeg;
use via_shm::table::TableSegment;

/// How long a fence waits for a peer's copy under way: an honest one takes
/// a millisecond for the largest message.
pub(crate) const FENCE_LIMIT: Duration = Duration::from_secs(1);

/// What a connection does when its peer went or broke it with a code.
pub type LostFn = Box<dyn Fn(&Conn, u32) + Send + Sync>;

/// An established (or being established) connection.
pub struct Conn {
    /// The shared segment: rings and receive caches.
    pub seg: Arc<ConnSegment>,
    /// The socket pair end: control messages and peer-death detection.
    pub socket: OwnedFd,
    /// The lane the peer gave us for the completions we make for it
    /// (mapped once for all connections to that peer).
    pub lane_out: Arc<Inbox>,
    /// The peer's bell, rung after pushing into `lane_out` (mapped once per peer).
    pub peer_bell: Arc<Bell>,
    /// Our lane for this peer's completions: entries in it count only for
    /// VIs connected through it.
    pub lane_in: LaneHold,
    /// The peer's registry table, mapped read-only, once per peer.
    pub peer_table: Arc<TableSegment>,
    /// The peer process as the kernel names it: the only process that
    /// cross-memory copies of this connection target.
    pub peer_pid: i32,
    /// Whether the kernel lets this process cross-memory attach to the
    /// peer (probed when the connection is made, and cleared when the
    /// kernel refuses a copy later): where not, large sends, RDMA writes
    /// and RDMA reads go through the ring (`vi::deliver`, `ring_read`).
    pub(crate) attach: AtomicBool,
    /// The peer's endpoint.
    pub peer: Endpoint,
    /// The VI it connects.
    pub vi: Handle,
    /// Breaks the VI's connection with an error code, whoever notices
    /// that the peer went (the helper thread, a fence that waits in vain).
    pub lost: LostFn,
    /// Its token in the progress engine (0: not watched).
    pub token: std::sync::atomic::AtomicU64,
    /// The NIC's counters.
    pub counters: crate::counters::Counters,
    /// The NIC's `VIA_INLINE_MAX`: sends up to this size are copied inline.
    pub inline_max: usize,
}

impl Conn {
    /// Has the helper thread watch the socket pair: the peer's disconnect,
    /// break or death comes on it.
    pub(crate) fn watch(self: &Arc<Self>) {
        let token = progress::register(Arc::downgrade(self) as Weak<dyn progress::Source>, false);
        self.token.store(token, Ordering::Release);
        progress::watch_fd(self.socket.as_fd(), token);
    }

    /// Stops watching it (before the socket is closed).
    pub(crate) fn unwatch(&self) {
        let token = self.token.swap(0, Ordering::AcqRel);
        if token != 0 && progress::unregister(token) {
            // The fd is still open (the Conn is alive).
            progress::unwatch_fd(self.socket.as_fd());
        }
    }

    /// Sends a control message to the peer; a dead peer is not an error here.
    pub fn tell(&self, msg: PeerMessage) {
        let _ = peer_channel::send(self.socket.as_fd(), &msg, None);
    }

    /// Whether cross-memory copies to and from the peer are still allowed.
    pub fn attach(&self) -> bool {
        self.attach.load(Ordering::Relaxed)
    }

    /// A cross-memory copy to or from the peer failed with `e`.  True when
    /// the kernel refused it (`EPERM`): the peer no longer lets us in (it
    /// gave its one Yama ptracer to another peer, or made itself
    /// undumpable), and the connection goes through the ring from now on,
    /// this operation included.
    pub fn attach_refused(&self, e: &std::io::Error) -> bool {
        if e.raw_os_error() != Some(libc::EPERM) {
            return false;
        }
        if self.attach.swap(false, Ordering::Relaxed) {
            tracing::debug!(pid = self.peer_pid, "the peer refuses cross-memory attach now: through the ring");
            self.counters.add(crate::counters::Counter::RingConnections, 1);
        }
        true
    }

    /// Tells the peer's CQ that its receive queue has a completion we made.
    pub fn complete_peer_receive(&self) {
        self.push_peer_completion();
        self.ring_peer_if_asleep();
    }

    /// [`Conn::complete_peer_receive`] in two steps around a message put
    /// in the ring: the entry is pushed right behind the message's stamp,
    /// so that the two travel to the peer together rather than one after
    /// the other, and the peer's bell is rung if need be
    /// ([`Conn::ring_peer_if_asleep`]) once the ring's fence has passed.
    pub fn push_peer_completion(&self) {
        if self.peer.recv_cq != NO_CQ {
            let entry = CqEntry { vi: self.peer.vi, recv: true };
            self.lane_out.push(self.peer.recv_cq as usize, entry.encode());
        }
    }

    /// Rings the peer's bell after [`Conn::push_peer_completion`], if its CQ's owner may sleep.
    pub fn ring_peer_if_asleep(&self) {
        self.lane_out.ring_if_asleep(&self.peer_bell, self.peer.recv_cq as usize);
    }

    /// Asks the peer's CQ to drain our ring: it is full, and a peer that
    /// waits on its CQ only would otherwise never make room.
    pub fn ask_peer_to_drain(&self) {
        if self.peer.recv_cq != crate::endpoint::NO_CQ {
            let entry = CqEntry { vi: self.peer.vi, recv: true };
            self.lane_out.push_and_ring(&self.peer_bell, self.peer.recv_cq as usize, entry.encode_progress());
        }
    }
}

/// The socket pair of a watched connection has something to say.
impl progress::Source for Conn {
    fn ready(&self) {
        let code = match peer_channel::read(self.socket.as_fd()).map(|m| m.map(|m| m.msg)) {
            Ok(Some(PeerMessage::Break(code))) => Some(code),
            Ok(Some(PeerMessage::Disconnect)) => Some(error_code::CONN_LOST),
            Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => Some(error_code::CONN_LOST),
            _ => None,
        };
        if let Some(code) = code {
            self.unwatch();
            (self.lost)(self, code);
        }
    }
}

impl Conn {
    /// Closes this side and waits for the peer's copies under way: once a
    /// disconnect or a break returns, none of them lands in this process's
    /// buffers (which the flush hands back).
    pub(crate) fn close_fenced(&self) {
        self.seg.mark_closed();
        if !self.seg.wait_for_peer_copies(FENCE_LIMIT) {
            tracing::warn!("the peer held a copy past {FENCE_LIMIT:?} while the connection closed");
        }
    }
}

/// Publishes a receive's buffers in the connection segment's receive
/// cache, where the peer takes them; returns its sequence number.
pub(crate) fn publish(seg: &ConnSegment, segs: &[LocalSeg]) -> ViaResult<u64> {
    let segs = segs.iter().map(|s| RecvSeg { addr: s.addr, len: s.len, handle: s.handle });
    seg.my_recvs().publish(segs).map_err(|_| ViaError::Resource)
}
