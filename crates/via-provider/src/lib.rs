//! The openvia provider: NICs, protection tags, VIs, completion queues and
//! connections, with the semantics of the VIA specification, over the
//! shared-memory transport of `via-shm` between processes of one host and
//! over UDP (`net`) between hosts.
//!
//! The C ABI (`vipl`) is a thin layer over this crate: every object the
//! application sees is a [`handles::Handle`] into one of the provider's
//! tables.

mod clock;
pub mod connect;
pub mod counters;
pub mod cq;
mod cq_wait;
mod doorbell;
pub mod endpoint;
pub mod handles;
pub mod lane;
pub mod names;
pub mod nic;
pub mod peer_channel;
pub mod progress;
mod queue_lock;
pub mod settings;
#[cfg(test)]
mod sim;
pub mod timeout;
pub mod transport;
pub mod tuning;
pub mod vi;
mod vi_attrs;

use handles::{Kind, Table};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

pub use cq::Cq;
pub use nic::{ErrorEvent, Nic, Ptag};
pub use vi::{Vi, ViAttrs, ViState};
pub use via_core::error::ViaResult;
pub use via_core::ViaError;

/// A provider instance: every live object of its NICs, in tables that
/// turn the application's handles into objects.  A process has one, which
/// the C ABI's handles name ([`provider`]); the whole-provider simulator
/// makes one per simulated host.
pub struct Provider {
    /// Open NICs.
    pub nics: Table<Nic>,
    /// Protection tags.
    pub ptags: Table<Ptag>,
    /// VIs.
    pub vis: Table<Vi>,
    /// Completion queues.
    pub cqs: Table<Cq>,
    /// Connection requests returned by `VipConnectWait` and not yet answered.
    pub conns: Table<connect::PendingConn>,
    /// The lanes connected peer processes gave this process to push into.
    pub peer_lanes: transport::shm::setup::PeerMappings<via_shm::Inbox>,
    /// The bells of connected peer processes.
    pub peer_bells: transport::shm::setup::PeerMappings<via_shm::Bell>,
    /// The registry tables of connected peer processes (read-only).
    pub peer_tables: transport::shm::setup::PeerMappings<via_shm::TableSegment>,
}

/// The process's provider, whose handles the C ABI hands out.
pub fn provider() -> &'static Arc<Provider> {
    static PROVIDER: OnceLock<Arc<Provider>> = OnceLock::new();
    PROVIDER.get_or_init(|| Arc::new(Provider::for_nics(64)))
}

/// `VipCloseNic` on the process's provider.
pub fn close_nic(handle: handles::Handle) -> ViaResult<()> {
    provider().close_nic(handle)
}

impl Provider {
    /// An instance with room for `nics` open NICs: each its protection
    /// tags; VIs and CQs up to four NICs' worth of each.
    pub fn for_nics(nics: u32) -> Provider {
        use via_core::consts::limits::{MAX_CQ, MAX_PTAGS, MAX_VI};
        let shared = nics.min(4);
        Provider {
            nics: Table::new(Kind::Nic, nics),
            ptags: Table::new(Kind::Ptag, nics * MAX_PTAGS as u32),
            vis: Table::new(Kind::Vi, shared * MAX_VI as u32),
            cqs: Table::new(Kind::Cq, shared * MAX_CQ as u32),
            conns: Table::new(Kind::Conn, 64 * nics),
            peer_lanes: Default::default(),
            peer_bells: Default::default(),
            peer_tables: Default::default(),
        }
    }

    /// `VipCloseNic`: closes the NIC, disconnects and destroys its VIs, and
    /// forgets its pending connection requests, CQs and protection tags.
    pub fn close_nic(&self, handle: handles::Handle) -> ViaResult<()> {
        let nic = self.nics.get(handle).ok_or(ViaError::InvalidParameter)?;
        nic.shut();
        for (h, vi) in self.vis.all() {
            if vi.nic.handle == handle {
                let _ = vi.disconnect();
                self.vis.remove(h);
                // A thread that kept it as its last VI must not use it.
                vi.destroyed.store(true, Ordering::Release);
            }
        }
        for (h, c) in self.conns.all() {
            if c.nic.handle == handle {
                self.conns.remove(h);
            }
        }
        for (h, cq) in self.cqs.all() {
            if cq.nic.handle == handle {
                self.cqs.remove(h);
                cq.destroyed.store(true, Ordering::Release);
            }
        }
        for (h, t) in self.ptags.all() {
            if t.nic == handle {
                self.ptags.remove(h);
            }
        }
        self.nics.remove(handle);
        nic.lanes.forget_here();
        Ok(())
    }
}
