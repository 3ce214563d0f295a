//! The transport a connected VI uses (`Link`) and what the VI asks of it
//! (`Transport`).
//!
//! Each transport implements `Transport` in its own directory, in its
//! `path.rs`.  `transports!` below is the one list of them: it makes the
//! `Link` enum, one variant a transport, its `LinkKind`, and the `match`
//! that dispatches each operation, so the data path makes no dynamic call.
//! Adding a transport adds one line to that list.

use crate::endpoint::Endpoint;
use crate::queue_lock::QueueGuard;
use crate::transport::{shm, udp, Ending};
use crate::vi::{SendQueue, Vi, ViAttrs};
use std::sync::Arc;
use std::time::Duration;
use via_core::descriptor::{DescPtr, Rules};
use via_core::registry::Region;

/// What a VI asks of the transport its connection uses.
pub(crate) trait Transport: Sized {
    /// Completes the connection on `vi`: the VI records the transport
    /// (`Vi::attach_link`) and becomes Connected.
    fn complete(self: Arc<Self>, vi: &Arc<Vi>);

    /// Carries out a send whose descriptor's place, the VI's state and
    /// the queue's room were checked, on the connection `link` (which
    /// `q` holds), then unlocks `q`.  `own` is the region of `mem` as
    /// looked up for the post.  The descriptor's segments are not checked
    /// yet: the transport validates them (`validate`) as it reads them.
    /// A function rather than a method: `link` is borrowed from `q`, and
    /// no reference is counted per post.
    fn post(
        vi: &Vi,
        q: QueueGuard<'_, SendQueue>,
        desc: DescPtr,
        mem: u32,
        own: &Region,
        rules: &Rules,
        attrs: &ViAttrs,
    );

    /// Ends this side of the connection: tells the peer how (a
    /// disconnect, or a break with its code if there is one to tell) and
    /// stops serving it.  Once this returns, nothing of the connection
    /// lands in this process's buffers.
    fn end(&self, how: Ending);

    /// Moves `vi`'s work on without its queues' locks, where a poll found
    /// nothing complete: true if that may have completed something, so
    /// that the poll looks again.  (What is moved under the receive
    /// queue's lock, the poll moves as it looks: `Vi::drain`.)
    fn progress(vi: &Vi) -> bool;

    /// Sleeps until this transport may have moved `vi`'s `queue` on, or
    /// `nap` passes.  `word` is the VI's wake word as read before the poll
    /// that found nothing (`Vi::sleep_on_word`).
    fn sleep(vi: &Vi, queue: WorkQueue, word: u32, nap: Duration);
}

/// A VI's two work queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WorkQueue {
    Send,
    Recv,
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

        /// Which transport a VI's link is, readable without the send
        /// queue's lock: the VI keeps it beside the link (`Vi::attach_link`)
        /// for its polls and waits, which dispatch on it.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u8)]
        pub(crate) enum LinkKind {
            /// Not connected (or not yet): nothing to move on.
            Unlinked = 0,
            $($variant,)+
        }

        impl LinkKind {
            /// The kind stored as `kind as u8`.
            pub(crate) fn from_u8(v: u8) -> LinkKind {
                $(if v == LinkKind::$variant as u8 {
                    return LinkKind::$variant;
                })+
                LinkKind::Unlinked
            }

            /// `Transport::progress`; nothing without a link.
            pub(crate) fn progress(self, vi: &Vi) -> bool {
                match self {
                    $(LinkKind::$variant => <$transport>::progress(vi),)+
                    LinkKind::Unlinked => false,
                }
            }

            /// `Transport::sleep`; without a link, until the VI is woken.
            pub(crate) fn sleep(self, vi: &Vi, queue: WorkQueue, word: u32, nap: Duration) {
                match self {
                    $(LinkKind::$variant => <$transport>::sleep(vi, queue, word, nap),)+
                    LinkKind::Unlinked => vi.sleep_on_word(word, nap),
                }
            }
        }

        impl Link {
            /// Its kind.
            pub(crate) fn kind(&self) -> LinkKind {
                match self {
                    $(Link::$variant(_) => LinkKind::$variant,)+
                }
            }

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
                own: &Region,
                rules: &Rules,
                attrs: &ViAttrs,
            ) {
                match q.link {
                    $(Some(Link::$variant(_)) => <$transport>::post(vi, q, desc, mem, own, rules, attrs),)+
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

#[cfg(test)]
mod tests {
    use super::LinkKind;

    #[test]
    fn every_link_kind_reads_back_as_itself() {
        for kind in [LinkKind::Unlinked, LinkKind::Shm, LinkKind::Net] {
            assert_eq!(LinkKind::from_u8(kind as u8), kind);
        }
        assert_eq!(LinkKind::from_u8(u8::MAX), LinkKind::Unlinked);
    }
}
