//! The transports under the VIs: shared memory between processes of one
//! host (`via-shm`, driven from `vi`), and UDP with its Ethernet side
//! between hosts (`udp`).

pub mod udp;
