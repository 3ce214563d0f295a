//! NICs and protection tags.

use crate::handles::Handle;
use crate::transport::shm::conn::FENCE_LIMIT;
use crate::tuning::{tuning, Tuning};
use crate::{provider, Provider};
use parking_lot::Mutex;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use via_core::consts::limits;
use via_core::error::{ViaError, ViaResult};
use via_core::registry::{Registry, TABLE_BYTES};
use via_shm::bell::Bell;
use via_shm::inbox::{Inbox, INBOXES};
use via_shm::table::{TableSegment, TABLE_SEGMENT_BYTES};

// The registry's table lives in the table segment that peers map read-only.
const _: () = assert!(TABLE_BYTES <= TABLE_SEGMENT_BYTES);

/// An asynchronous error, as `VIP_ERROR_DESCRIPTOR` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorEvent {
    /// The NIC.
    pub nic: Handle,
    /// The VI concerned, or 0.
    pub vi: Handle,
    /// The CQ concerned, or 0.
    pub cq: Handle,
    /// The descriptor concerned, or 0.
    pub descriptor: usize,
    /// `VIP_RESOURCE_CODE`.
    pub resource: u32,
    /// `VIP_ERROR_CODE`.
    pub code: u32,
}

pub use via_core::consts::{error_code, resource_code};

/// A network link checks its outgoing buffers against its NIC's registry.
impl crate::transport::udp::RegistryOwner for Nic {
    fn registry(&self) -> &Registry {
        &self.registry
    }
}

/// A handler installed by `VipErrorCallback`.
pub type ErrorHandler = Arc<dyn Fn(&ErrorEvent) + Send + Sync>;

/// An open NIC.
pub struct Nic {
    /// This NIC's handle, in `provider`'s table.
    pub handle: Handle,
    /// The provider instance whose tables hold this NIC and its objects.
    pub provider: Arc<Provider>,
    /// The device, as the host agent resolved it.
    pub device: viad_client::client::DeviceInfo,
    /// The host agent's session, held while the NIC is open (none in the
    /// whole-provider simulator).
    _session: Option<viad_client::client::Session>,
    /// Registered memory, its table published in `table`.
    pub registry: Registry,
    /// The completions this process's own threads make, one queue per CQ
    /// index; never shared.
    pub inbox: Inbox,
    /// The connected peer processes' lanes into the CQs ([`crate::lane`]).
    pub lanes: crate::lane::Lanes,
    /// What `VipCQWait` sleeps on, one word per CQ index: shared with every
    /// peer, which rings it after pushing into its lane.
    pub bell: Bell,
    /// The registry's table, shared read-only with peers.
    pub table: TableSegment,
    cq_slots: Mutex<Vec<bool>>,
    next_ptag: AtomicU32,
    /// Live protection tags.
    pub ptag_count: AtomicUsize,
    /// Live VIs.
    pub vi_count: AtomicUsize,
    /// Its settings: the process's when `VipOpenNic` opened it (each
    /// simulated host has its own).
    pub tuning: Tuning,
    /// Held for reading while a handler runs, so that replacing it (or
    /// closing the NIC) waits until no call of the old one is under way.
    handler: parking_lot::RwLock<Option<ErrorHandler>>,
    /// What this NIC sent, received and dropped.
    pub counters: crate::counters::Counters,
    /// The UDP port of the network transport, opened at the first remote connection.
    net_port: std::sync::OnceLock<Arc<crate::transport::udp::NetPort>>,
    /// Set by `VipCloseNic`.
    pub closed: AtomicBool,
    /// Readable once the NIC is closing: ends the waits of other threads
    /// for the host agent or a peer (`VipConnectWait`, `VipConnectRequest`).
    pub closing: Arc<OwnedFd>,
    /// The shared-memory connections of this NIC's VIs, for the fence of
    /// `VipDeregisterMem`: found without any work queue's lock, which a
    /// thread other than the one that posts would otherwise take from it.
    pub(crate) shm_conns: Mutex<Vec<(Handle, std::sync::Weak<crate::transport::shm::Conn>)>>,
    /// The send engine that doorbells wake (`VIA_DOORBELL=d1|d2`).
    pub(crate) send_engine: Option<Arc<crate::doorbell::SendEngine>>,
}

impl Nic {
    /// Opens a device by its VIA name (`/dev/via_lo`, `via_eth0`, ...).
    pub fn open(device: &str) -> ViaResult<(Handle, Arc<Nic>)> {
        if let Err(why) = crate::tuning::loaded() {
            // The application sees only VIP_INVALID_PARAMETER: say which setting is wrong.
            eprintln!("openvia: {why}");
            return Err(ViaError::InvalidParameter);
        }
        crate::timeout::check_cpus();
        // The program's own aliases (VIA_DEVICE_ALIASES) are resolved here,
        // the agent's aliases file by the agent (viad_client::aliases).
        let aliases = viad_client::aliases::Aliases::from_env().map_err(|why| {
            tracing::error!("VipOpenNic({device:?}): {why}");
            ViaError::InvalidParameter
        })?;
        let alias = aliases.lookup(device);
        let asked = alias.map_or(device, |a| a.device.as_str());
        if asked.len() > viad_client::aliases::MAX_NAME {
            tracing::error!("VipOpenNic: a device name of {} bytes: no device has one", asked.len());
            return Err(ViaError::InvalidParameter);
        }
        let counters = crate::counters::Counters::new(asked.trim_start_matches("/dev/"));
        let opened = match counters.page() {
            Some(page) => viad_client::client::Session::open_with_stats(asked, page.fd()),
            None => viad_client::client::Session::open(asked),
        };
        let (session, info) = opened.map_err(|e| match e {
            viad_client::client::AgentError::UnknownDevice(why) => {
                // The application sees only VIP_INVALID_PARAMETER: say why,
                // and which names would do, at the default log level.
                let via = alias.map(|a| format!("alias of {} ({}): ", a.device, a.origin)).unwrap_or_default();
                let own = match aliases.is_empty() {
                    true => String::new(),
                    false => format!("; this program's aliases: {}", aliases.describe()),
                };
                tracing::error!("VipOpenNic({device:?}): {via}{why}{own}");
                ViaError::InvalidParameter
            }
            other => {
                tracing::warn!("cannot open {device}: {other}");
                ViaError::Resource
            }
        })?;
        Nic::build(provider().clone(), info, Some(session), counters, None, tuning().clone())
    }

    /// A NIC on the device `info` with the agent's `session`; `port`, if
    /// given, is its network port from the start.
    fn build(
        provider: Arc<Provider>,
        info: viad_client::client::DeviceInfo,
        session: Option<viad_client::client::Session>,
        counters: crate::counters::Counters,
        port: Option<Arc<crate::transport::udp::NetPort>>,
        tuning: Tuning,
    ) -> ViaResult<(Handle, Arc<Nic>)> {
        let inbox = Inbox::create().map_err(|_| ViaError::Resource)?;
        let bell = Bell::create().map_err(|_| ViaError::Resource)?;
        let table = TableSegment::create().map_err(|_| ViaError::Resource)?;
        // SAFETY: the table segment is zeroed, page aligned, large enough
        // (the assertion at the top of this file), writable here, written
        // only through this registry, and outlives it: `registry` is
        // declared, so dropped, before `table`.
        let registry = unsafe { Registry::in_table(table.as_ptr()) };
        let closing = Arc::new(closing_fd().map_err(|_| ViaError::Resource)?);
        let send_engine = crate::doorbell::SendEngine::start(tuning.doorbell).map_err(|e| {
            tracing::warn!("cannot start the send engine: {e}");
            ViaError::Resource
        })?;
        provider
            .clone()
            .nics
            .insert(|handle| {
                Arc::new(Nic {
                    handle,
                    provider,
                    device: info,
                    _session: session,
                    registry,
                    inbox,
                    lanes: Default::default(),
                    bell,
                    table,
                    cq_slots: Mutex::new(vec![false; INBOXES]),
                    next_ptag: AtomicU32::new(1),
                    ptag_count: AtomicUsize::new(0),
                    vi_count: AtomicUsize::new(0),
                    tuning,
                    handler: parking_lot::RwLock::new(None),
                    net_port: port.map_or_else(std::sync::OnceLock::new, std::sync::OnceLock::from),
                    counters,
                    closed: AtomicBool::new(false),
                    closing: closing.clone(),
                    send_engine: send_engine.clone(),
                    shm_conns: Mutex::new(Vec::new()),
                })
            })
            .ok_or_else(|| {
                if let Some(engine) = &send_engine {
                    engine.shut_down();
                }
                ViaError::Resource
            })
    }

    /// A NIC of the whole-provider simulator: host `wire.host`'s, on its
    /// simulated wire, without a host agent.
    /// With `large`, its port sends and takes large packets.
    #[cfg(test)]
    pub(crate) fn simulated(
        wire: Arc<crate::transport::udp::sim_wire::SimWire>,
        large: bool,
        tuning: Tuning,
        provider: Arc<Provider>,
    ) -> ViaResult<(Handle, Arc<Nic>)> {
        let addr = match crate::transport::udp::sim_wire::addr_of(wire.host).ip() {
            std::net::IpAddr::V4(ip) => ip.octets().to_vec(),
            std::net::IpAddr::V6(ip) => ip.octets().to_vec(),
        };
        let info = viad_client::client::DeviceInfo {
            name: format!("via_sim{}", wire.host),
            interface: format!("sim{}", wire.host),
            host_addr: addr,
            host_addr6: None,
            mtu: 1500,
        };
        let counters = crate::counters::Counters::new(&format!("sim{}", wire.host));
        let port = crate::transport::udp::NetPort::simulated(wire, info.mtu as usize, large, &counters);
        let (handle, nic) = Nic::build(provider, info, None, counters, Some(port), tuning)?;
        // The simulator sweeps the doorbells where the helper thread would.
        if let Some(engine) = &nic.send_engine {
            engine.leave_progress();
        }
        Ok((handle, nic))
    }

    /// `VipDeregisterMem`, a fence: once it returns, no peer's copy lands
    /// in the region or reads from it (each shared-memory peer's copies
    /// under way have finished, and later ones find the region gone).
    pub fn deregister(&self, mem: u32, addr: u64) -> ViaResult<()> {
        self.registry.deregister(mem, addr)?;
        let conns: Vec<_> = {
            let mut list = self.shm_conns.lock();
            list.retain(|(_, c)| c.strong_count() > 0);
            list.iter().filter_map(|(vi, c)| Some((*vi, c.upgrade()?))).collect()
        };
        for (vi, conn) in conns {
            if !conn.seg.wait_for_peer_copies(FENCE_LIMIT) {
                tracing::warn!(vi, "the peer held a copy past {FENCE_LIMIT:?}: connection broken");
                (conn.lost)(&conn, error_code::CONN_LOST);
            }
        }
        Ok(())
    }

    /// Looks up a NIC handle.
    pub fn get(handle: Handle) -> ViaResult<Arc<Nic>> {
        provider().nics.get(handle).ok_or(ViaError::InvalidParameter)
    }

    /// Closes it to the application: calls blocked on it end, its
    /// counters go to the profile, its send engine stops, and no error
    /// callback runs after this returns.  The provider then forgets its
    /// objects ([`crate::close_nic`]).
    pub(crate) fn shut(&self) {
        self.closed.store(true, Ordering::Release);
        signal_closing(&self.closing);
        crate::counters::write_profile(&self.device.name, &self.counters);
        if let Some(engine) = &self.send_engine {
            engine.shut_down();
        }
        // Wait for a handler call under way; none starts after this.
        self.set_error_handler(None);
    }

    /// The network port, opened on first use.
    pub fn port(&self) -> ViaResult<Arc<crate::transport::udp::NetPort>> {
        if let Some(p) = self.net_port.get() {
            return Ok(p.clone());
        }
        let port = crate::transport::udp::NetPort::open(&self.device, &self.tuning, &self.counters)?;
        Ok(self.net_port.get_or_init(|| port).clone())
    }

    /// The application polls: drains the network port, if one is open.
    /// Whether that may have completed something (`NetPort::poll_for_app`),
    /// so that the poll looks at its queues again.
    pub fn poll_net(&self) -> bool {
        match self.net_port.get() {
            Some(p) => p.poll_for_app(),
            None => false,
        }
    }

    /// An application thread is about to sleep: the helper thread reads the
    /// network port, if one is open, until the returned guard is dropped.
    pub(crate) fn sleep_on_port(&self) -> Option<crate::transport::udp::PortSleep> {
        self.net_port.get().map(|p| p.sleep())
    }

    /// Claims a CQ inbox index.
    pub fn claim_cq_slot(&self) -> ViaResult<usize> {
        let mut slots = self.cq_slots.lock();
        let index = slots.iter().position(|used| !used).ok_or(ViaError::Resource)?;
        slots[index] = true;
        self.inbox.reset(index);
        self.lanes.reset(index);
        Ok(index)
    }

    /// Wakes every thread asleep in `VipCQWait` on this NIC, so that it
    /// looks at a lane added since it fell asleep.
    pub(crate) fn wake_cq_sleepers(&self) {
        let slots = self.cq_slots.lock();
        for (index, _) in slots.iter().enumerate().filter(|(_, used)| **used) {
            self.bell.ring(index);
        }
    }

    /// Returns a CQ inbox index.
    pub fn release_cq_slot(&self, index: usize) {
        self.cq_slots.lock()[index] = false;
    }

    /// Creates a protection tag.
    pub fn create_ptag(self: &Arc<Self>) -> ViaResult<Handle> {
        if self.ptag_count.fetch_add(1, Ordering::AcqRel) >= limits::MAX_PTAGS {
            self.ptag_count.fetch_sub(1, Ordering::AcqRel);
            return Err(ViaError::Resource);
        }
        let id = self.next_ptag.fetch_add(1, Ordering::Relaxed);
        let nic = self.handle;
        match self.provider.ptags.insert(|handle| Arc::new(Ptag { handle, nic, id, vi_users: AtomicUsize::new(0) })) {
            Some((h, _)) => Ok(h),
            None => {
                self.ptag_count.fetch_sub(1, Ordering::AcqRel);
                Err(ViaError::Resource)
            }
        }
    }

    /// Destroys a protection tag that no VI or region uses.
    pub fn destroy_ptag(&self, handle: Handle) -> ViaResult<()> {
        let tag = self.ptag(handle).map_err(|_| ViaError::InvalidParameter)?;
        if tag.vi_users.load(Ordering::Acquire) > 0 || self.registry.ptag_users(tag.id) > 0 {
            return Err(ViaError::InvalidState);
        }
        self.provider.ptags.remove(handle);
        self.ptag_count.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    }

    /// A protection tag of this NIC (`VIP_INVALID_PTAG` otherwise).
    pub fn ptag(&self, handle: Handle) -> ViaResult<Arc<Ptag>> {
        match self.provider.ptags.get(handle) {
            Some(t) if t.nic == self.handle => Ok(t),
            _ => Err(ViaError::InvalidPtag),
        }
    }

    /// The tag id behind a handle of this NIC's tags.
    pub fn ptag_of_id(&self, id: u32) -> Option<Handle> {
        self.provider.ptags.all().into_iter().find(|(_, t)| t.nic == self.handle && t.id == id).map(|(h, _)| h)
    }

    /// Installs (or with `None` removes) the asynchronous error handler.
    /// Returns once no call of the previous handler is running, so that the
    /// application may free what it gave the old one (unless called from
    /// inside a handler, which would wait for itself).
    pub fn set_error_handler(&self, handler: Option<ErrorHandler>) {
        if crate::progress::on_helper_thread() {
            if let Some(mut h) = self.handler.try_write() {
                *h = handler;
            }
            return;
        }
        *self.handler.write() = handler;
    }

    /// Reports an asynchronous error to the handler, or logs it.  Nothing
    /// is reported once the NIC is closed.
    pub fn report(&self, event: ErrorEvent) {
        let handler = self.handler.read();
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        match &*handler {
            Some(h) => h(&event),
            // A peer's disconnect is how connections end: not worth a
            // warning where nobody asked to hear of it.
            None if event.code == error_code::CONN_LOST => tracing::info!(?event, "asynchronous VIA error"),
            None => tracing::warn!(?event, "asynchronous VIA error"),
        }
    }
}

/// A protection tag.
pub struct Ptag {
    /// This tag's handle.
    pub handle: Handle,
    /// The NIC it belongs to.
    pub nic: Handle,
    /// The id stored in regions and compared on access.
    pub id: u32,
    /// VIs created with this tag.
    pub vi_users: AtomicUsize,
}

/// An eventfd that becomes readable when the NIC closes.
fn closing_fd() -> std::io::Result<OwnedFd> {
    use rustix::event::{eventfd, EventfdFlags};
    Ok(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?)
}

fn signal_closing(fd: &OwnedFd) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}
