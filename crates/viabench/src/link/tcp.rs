//! TCP sockets with TCP_NODELAY: the same exchange over the kernel's stack.
//! `--wait poll` spins on a non-blocking socket, `--wait block` sleeps in
//! `recv`.

use super::{set_socket_buffers, Deadline, Link, LinkServer, LinkStats, Pending, Side};
use crate::error::{Error, Result};
use crate::pattern::{self, Which};
use crate::proto::{PeerInfo, ServerInfo, TestSpec, Wait, ACK_BYTES};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::Duration;

/// The server's listening socket for the data connection.
pub struct TcpPending {
    listener: TcpListener,
    spec: TestSpec,
}

impl TcpPending {
    /// Listens on an ephemeral port of `ip`.
    pub fn listen(spec: &TestSpec, ip: IpAddr) -> Result<TcpPending> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))?;
        // Set on the listener, the sizes hold for the accepted connection
        // from its first segment (the window it advertises).
        if let Some(bytes) = spec.sockbuf {
            set_buffers(&listener, bytes)?;
        }
        Ok(TcpPending { listener, spec: spec.clone() })
    }
}

impl Pending for TcpPending {
    fn info(&self) -> ServerInfo {
        ServerInfo { port: self.listener.local_addr().map(|a| a.port()).unwrap_or(0), ..Default::default() }
    }

    fn accept(self: Box<Self>) -> Result<Box<dyn LinkServer>> {
        self.listener.set_nonblocking(true)?;
        let deadline = Deadline::after(Duration::from_millis(self.spec.timeout_ms));
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false)?;
                    return Ok(Box::new(TcpLink::new(stream, &self.spec, Side::Server)?));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    deadline.check("waiting for the TCP data connection")?;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// A TCP data connection.
pub struct TcpLink {
    stream: TcpStream,
    wait: Wait,
    timeout: Duration,
    bufs: [Vec<u8>; 3],
    rbuf: Vec<u8>,
    kept: usize,
    messages: u64,
    _side: Side,
}

impl TcpLink {
    /// Connects to the server's data port.
    pub fn connect(spec: &TestSpec, ip: IpAddr, port: u16) -> Result<TcpLink> {
        let stream = TcpStream::connect_timeout(&SocketAddr::new(ip, port), Duration::from_millis(spec.timeout_ms))?;
        TcpLink::new(stream, spec, Side::Client)
    }

    fn new(stream: TcpStream, spec: &TestSpec, side: Side) -> Result<TcpLink> {
        stream.set_nodelay(true)?;
        if let Some(bytes) = spec.sockbuf {
            set_buffers(&stream, bytes)?;
        }
        let timeout = Duration::from_millis(spec.timeout_ms);
        match spec.wait {
            Wait::Poll => stream.set_nonblocking(true)?,
            Wait::Block => stream.set_read_timeout(Some(timeout))?,
        }
        let cap = spec.max_block.max(ACK_BYTES);
        Ok(TcpLink {
            stream,
            wait: spec.wait,
            timeout,
            bufs: [vec![0; cap], vec![0; cap], vec![0; cap]],
            rbuf: vec![0; cap],
            kept: 0,
            messages: 0,
            _side: side,
        })
    }
}

impl Link for TcpLink {
    fn prepare(&mut self, len: usize, seeds: [u64; 3]) -> Result<()> {
        for (buf, seed) in self.bufs.iter_mut().zip(seeds) {
            pattern::fill(seed, &mut buf[..len]);
        }
        Ok(())
    }

    fn send(&mut self, which: Which, len: usize) -> Result<()> {
        let buf = &self.bufs[which as usize][..len];
        let mut off = 0;
        let deadline = Deadline::after(self.timeout);
        let mut spins = 0u32;
        while off < len {
            match self.stream.write(&buf[off..]) {
                Ok(0) => return Err(Error::new("the TCP peer closed the connection")),
                Ok(n) => off += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(65536) {
                        deadline.check("TCP send")?;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.messages += 1;
        Ok(())
    }

    fn recv(&mut self, len: usize, keep: bool) -> Result<()> {
        let mut got = 0;
        let deadline = Deadline::after(self.timeout);
        let mut spins = 0u32;
        while got < len {
            match self.stream.read(&mut self.rbuf[got..len]) {
                Ok(0) => return Err(Error::new("the TCP peer closed the connection")),
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                    spins = spins.wrapping_add(1);
                    if self.wait == Wait::Block || spins.is_multiple_of(65536) {
                        deadline.check("TCP receive")?;
                    }
                }
                Err(e) if e.kind() == ErrorKind::TimedOut => deadline.check("TCP receive")?,
                Err(e) => return Err(e.into()),
            }
        }
        if keep {
            self.kept = len;
        }
        Ok(())
    }

    fn verify(&self, seed: u64, len: usize) -> Result<()> {
        super::verify_kept(self.kept, &self.rbuf, seed, len, "TCP block is wrong")
    }

    fn finish(&mut self) -> Result<()> {
        Ok(())
    }

    fn stats(&self) -> LinkStats {
        LinkStats { messages: self.messages, ..Default::default() }
    }
}

/// [`set_socket_buffers`], with an error that says what failed.
fn set_buffers(socket: &impl AsFd, bytes: u32) -> Result<()> {
    set_socket_buffers(socket, bytes).map_err(|e| Error::new(format!("setting TCP socket buffers to {bytes}: {e}")))
}

impl LinkServer for TcpLink {
    fn complete(self: Box<Self>, _peer: &PeerInfo, _peer_ip: IpAddr) -> Result<Box<dyn Link>> {
        Ok(self)
    }
}
