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
use std::sync::OnceLock;

pub use cq::Cq;
pub use nic::{ErrorEvent, Nic, Ptag};
pub use vi::{Vi, ViAttrs, ViState};
pub use via_core::error::ViaResult;
pub use via_core::ViaError;

/// Every live object of this process.
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
    pub peer_lanes: connect::PeerMappings<via_shm::Inbox>,
    /// The bells of connected peer processes.
    pub peer_bells: connect::PeerMappings<via_shm::Bell>,
    /// The registry tables of connected peer processes (read-only).
    pub peer_tables: connect::PeerMappings<via_shm::TableSegment>,
}

/// The process-wide provider.
pub fn provider() -> &'static Provider {
    static PROVIDER: OnceLock<Provider> = OnceLock::new();
    PROVIDER.get_or_init(|| Provider {
        nics: Table::new(Kind::Nic, 64),
        ptags: Table::new(Kind::Ptag, 64 * via_core::consts::limits::MAX_PTAGS as u32),
        vis: Table::new(Kind::Vi, 4 * via_core::consts::limits::MAX_VI as u32),
        cqs: Table::new(Kind::Cq, 4 * via_core::consts::limits::MAX_CQ as u32),
        conns: Table::new(Kind::Conn, 4096),
        peer_lanes: Default::default(),
        peer_bells: Default::default(),
        peer_tables: Default::default(),
    })
}

/// `VipCloseNic`: closes the NIC, disconnects and destroys its VIs, and
/// forgets its pending connection requests, CQs and protection tags.
pub fn close_nic(handle: handles::Handle) -> ViaResult<()> {
    let nic = Nic::get(handle)?;
    nic.shut();
    let p = provider();
    for (h, vi) in p.vis.all() {
        if vi.nic.handle == handle {
            let _ = vi.disconnect();
            p.vis.remove(h);
            // A thread that kept it as its last VI must not use it.
            vi.destroyed.store(true, Ordering::Release);
        }
    }
    for (h, c) in p.conns.all() {
        if c.nic.handle == handle {
            p.conns.remove(h);
        }
    }
    for (h, cq) in p.cqs.all() {
        if cq.nic.handle == handle {
            p.cqs.remove(h);
            cq.destroyed.store(true, Ordering::Release);
        }
    }
    for (h, t) in p.ptags.all() {
        if t.nic == handle {
            p.ptags.remove(h);
        }
    }
    p.nics.remove(handle);
    Ok(())
}
