//! The transports under the VIs: shared memory between processes of one
//! host (`shm`), and UDP with its Ethernet side between hosts (`udp`).
//!
//! Each directory holds the whole transport: its I/O below the NIC, and
//! its side of the VI (`path`: what a post, a drain and an arriving
//! message mean on it), written as methods of `Vi` that use the VI's
//! queues and completions.  The VI reaches a transport through its
//! `Link` and the methods of its `path`: carrying out a posted send
//! (`post_shm`, `post_net`), moving receives on (`drain_ring`; the
//! port's `NetReceiver`), ending the connection (`Link::end`) and
//! sleeping where the transport wakes it.

pub mod shm;
pub mod udp;

use crate::endpoint::{Endpoint, PeerMessage};
use std::sync::Arc;

/// The transport a connected VI uses.  The VI records it in one place,
/// its send queue (`vi::SendQueue::link`), and dispatches on it with a
/// `match`: no dynamic call on the data path.
#[derive(Clone)]
pub(crate) enum Link {
    /// Shared memory, to a process of this host.
    Shm(Arc<shm::Conn>),
    /// UDP (and Ethernet frames), to another host.
    Net(Arc<udp::NetLink>),
}

/// How a VI's connection ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// `VipDisconnect`: the peer hears of a disconnect.
    Disconnect,
    /// An error: the peer hears this code, if there is one to tell.
    Break(Option<u32>),
}

impl Link {
    /// Ends this side of the connection: tells the peer, stops serving it,
    /// and on shared memory waits out the peer's copies under way, so that
    /// none lands in this process's buffers once this returns.
    pub(crate) fn end(&self, how: Ending) {
        match self {
            Link::Shm(conn) => {
                match how {
                    Ending::Disconnect => conn.tell(PeerMessage::Disconnect),
                    Ending::Break(Some(code)) => conn.tell(PeerMessage::Break(code)),
                    Ending::Break(None) => {}
                }
                conn.unwatch();
                conn.close_fenced();
            }
            Link::Net(link) => match how {
                Ending::Disconnect => link.disconnect(),
                Ending::Break(theirs) => link.close(theirs),
            },
        }
    }
}

/// A connection being completed: its transport, and the peer's endpoint.
pub(crate) struct Linked {
    pub link: Link,
    pub peer: Endpoint,
}
