//! The transport a connected VI uses (`Link`) and what the VI asks of it
//! (`Transport`).
//!
//! Each transport implements `Transport` in its own directory, in its
//! `path.rs`.  `transports!` below is the one list of them: it makes the
//! `Link` enum, one variant a transport, and the `match` that dispatches
//! each operation, so the data path makes no dynamic call.  Adding a
//! transport adds one line to that list.

use crate::endpoint::Endpoint;
use crate::queue_lock::QueueGuard;
use crate::transport::{shm, udp, Ending};
use crate::vi::{SendQueue, Vi, ViAttrs};
use std::sync::Arc;
use via_core::descriptor::{DescPtr, Rules};

/// What a VI asks of the transport its connection uses.
pub(crate) trait Transport: Sized {
    /// Completes the connection on `vi`: the VI records the transport
    /// (`Vi::attach_link`) and becomes Connected.
    fn complete(self: Arc<Self>, vi: &Arc<Vi>);

    /// Carries out a send whose descriptor's place, the VI's state and
    /// the queue's room were checked, on the connection `link` (which
    /// `q` holds), then unlocks `q`.  The descriptor's segments are not
    /// checked yet: the transport validates them (`validate`) as it
    /// reads them.  A function rather than a method: `link` is borrowed
    /// from `q`, and no reference is counted per post.
    fn post(vi: &Vi, q: QueueGuard<'_, SendQueue>, desc: DescPtr, mem: u32, rules: &Rules, attrs: &ViAttrs);

    /// Ends this side of the connection: tells the peer how (a
    /// disconnect, or a break with its code if there is one to tell) and
    /// stops serving it.  Once this returns, nothing of the connection
    /// lands in this process's buffers.
    fn end(&self, how: Ending);
}

/// Makes `Link` from the list of transports: a variant for each, and its
/// operations dispatched with a `match`.
macro_rules! transports {
    ($($(#[$doc:meta])* $variant:ident($transport:ty),)+) => {
        /// The transport a connected VI uses.  The VI records it in one
        /// place, its send queue (`SendQueue::link`).
        #[derive(Clone)]
        pub(crate) enum Link {
            $($(#[$doc])* $variant(Arc<$transport>),)+
        }

        impl Link {
            /// `Transport::complete`.
            pub(crate) fn complete(self, vi: &Arc<Vi>) {
                match self {
                    $(Link::$variant(t) => t.complete(vi),)+
                }
            }

            /// `Transport::post` on the link `q` holds.
            pub(crate) fn post(
                vi: &Vi,
                q: QueueGuard<'_, SendQueue>,
                desc: DescPtr,
                mem: u32,
                rules: &Rules,
                attrs: &ViAttrs,
            ) {
                match q.link {
                    $(Some(Link::$variant(_)) => <$transport>::post(vi, q, desc, mem, rules, attrs),)+
                    None => vi.flush_posted(q, desc, mem),
                }
            }

            /// `Transport::end`.
            pub(crate) fn end(&self, how: Ending) {
                match self {
                    $(Link::$variant(t) => t.end(how),)+
                }
            }
        }
    };
}

transports! {
    /// Shared memory, to a process of this host.
    Shm(shm::Conn),
    /// UDP (and Ethernet frames), to another host.
    Net(udp::NetLink),
}

/// A connection being completed: its transport, and the peer's endpoint.
pub(crate) struct Linked {
    pub link: Link,
    pub peer: Endpoint,
}
