//! The transports under the VIs: shared memory between processes of one
//! host (`shm`), and UDP with its Ethernet side between hosts (`udp`).
//!
//! Each directory holds the whole transport: its I/O below the NIC, and
//! its side of the VI (`path`: what a post, a drain and an arriving
//! message mean on it).  There it implements `vi::Transport` (complete a
//! connection on a VI, carry out a posted send, end the connection),
//! which the VI reaches through its `vi::Link`; what moves receives on
//! is the transport's own (the ring the VI drains, the port's
//! `NetReceiver`).

pub mod shm;
pub mod udp;

/// How a VI's connection ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// `VipDisconnect`: the peer hears of a disconnect.
    Disconnect,
    /// An error: the peer hears this code, if there is one to tell.
    Break(Option<u32>),
}
