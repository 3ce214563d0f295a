//! The whole-provider simulator (tests only): several hosts in one
//! process, each a provider instance with one open NIC, its own settings
//! and network port,
//! joined by `via_reliable::netsim`'s simulated network and fault
//! injector, on a virtual clock, in one thread.  Two VIs of one host
//! connect over shared memory, some of them through the ring, from the
//! start or from a moment on.
//!
//! Everything above the datapath is the provider's own code: VIs, work
//! queues, descriptors, CQs, the ports' endpoints and sessions, the
//! connection's endpoints as they travel in a connection request.  What
//! is simulated is what lies outside the process: the wire (a port's
//! `SimWire` in place of its sockets), time (`clock::simulated`, in
//! which the waits' deadlines count too, and where a wait would sleep it
//! steps the simulation instead), the helper thread (`Sim::step` reads
//! the ports and the local connections' sockets and runs the timers as
//! it would) and the host agents' rendezvous and handshake
//! (`connect::link_directly` across hosts, `connect::link_locally` on one).
//! `workload` drives it through the VIPL operations with seeded random
//! workloads and checks the specification's semantics.

pub(crate) mod workload;

use crate::clock::simulated;
use crate::handles::Handle;
use crate::nic::Nic;
use crate::transport::shm::Conn;
use crate::transport::udp::sim_wire::SimWire;
use crate::transport::udp::{NetPort, NetReceiver};
use crate::tuning::{tuning, CqMode, Doorbell, Tuning};
use crate::vi::Vi;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;
use via_core::error::ViaResult;
use via_reliable::netsim::{FaultInjector, Faults, NetConfig, NetStats, SimNet, MAX_HOSTS};
use via_reliable::sim::SimRng;
use via_reliable::Time;
use via_shm::ring::INLINE_MAX;

/// How far virtual time moves when nothing at all is pending: the
/// application is waiting for something that will not come, and its
/// workload's time limit must still be reached.
const IDLE_TICK: Duration = Duration::from_millis(1);

/// Steps in a row at one instant after which virtual time counts as
/// stuck; far more than the packets and polls one instant can hold.
const STILL_STEPS: u32 = 1_000_000;

/// Each host's settings: the process's, but with its CQs' implementation
/// drawn (CQ1, entries, or CQ2, scanning the work queues), its inline
/// limit (which small sends and writes over shared memory go through the
/// ring rather than by cross-memory attach), and, where the process keeps
/// the payload CRC, one host in two seeds declining it (its peers insist,
/// so its connections keep the CRC), and its send doorbell (`direct`,
/// `d1` or `d2`; the simulator sweeps the doorbells where the helper
/// thread would).
fn host_settings(rng: &mut SimRng, hosts: usize) -> Vec<Tuning> {
    let declining = (tuning().payload_crc && rng.chance(0.5)).then(|| rng.below(hosts as u64) as usize);
    (0..hosts)
        .map(|h| Tuning {
            doorbell: [Doorbell::Direct, Doorbell::PerVi, Doorbell::Central][rng.below(3) as usize],
            cq: if rng.chance(0.5) { CqMode::Scan } else { CqMode::Entries },
            inline_max: [0, 1, 64, INLINE_MAX][rng.below(4) as usize],
            payload_crc: tuning().payload_crc && declining != Some(h),
            ..tuning().clone()
        })
        .collect()
}

/// One simulated host: its NIC, the NIC's port and the wire under it.
struct Host {
    nic: Arc<Nic>,
    handle: Handle,
    port: Arc<NetPort>,
    wire: Arc<SimWire>,
    dead: bool,
}

/// The simulated world: hosts, the network between them, virtual time.
pub(crate) struct Sim {
    hosts: Vec<Host>,
    net: SimNet,
    faults: FaultInjector,
    rng: SimRng,
    /// The earliest timer of the live hosts' sessions, as last run.
    next_timer: Option<Time>,
    /// The connected VIs and their hosts, in the order they connected.
    vis: Vec<(usize, Weak<Vi>)>,
    /// Steps in a row that left virtual time where it was.
    still: u32,
    /// The shared-memory connections between VIs of one host, their host
    /// and when the peer stops letting this side attach, in the order they
    /// connected.
    local: Vec<(usize, Weak<Conn>, Option<Time>)>,
    /// Connections made over shared memory, and of those through the ring
    /// (from the start, or one side from a moment on).
    pub(crate) local_links: u64,
    pub(crate) ring_links: u64,
}

impl Sim {
    /// `hosts` hosts (2 to 4), each with one open NIC, and a network that
    /// misbehaves as `faults` says, its delays, whether the ports take
    /// large packets and whether they have an Ethernet side drawn from `seed`.
    pub(crate) fn new(seed: u64, hosts: usize, faults: Faults) -> Sim {
        assert!((2..=MAX_HOSTS).contains(&hosts), "2 to {MAX_HOSTS} hosts");
        let mut rng = SimRng::new(seed ^ 0x005E_ED0F_5111);
        let config = random_net(&mut rng);
        let net = SimNet::new(config.clone());
        simulated::set(Some(crate::clock::instant_of(net.now)));
        // Half the seeds: ports with both offloads, whose sessions send
        // large packets where both ends take them.
        let large = rng.chance(0.5);
        // Half the seeds: an Ethernet side beside the UDP port, whose
        // frames take a faster path than datagrams and may overtake them.
        let frames = rng.chance(0.5);
        let settings = host_settings(&mut rng, hosts);
        // Corruption stands for what the link's and UDP's checksums miss,
        // which the payload CRC is for.  A connection goes without it only
        // where both ends decline it, and then rests on those checksums,
        // which the simulated wire does not model.
        let crc_on_every_pair = settings.iter().filter(|t| !t.payload_crc).count() <= 1;
        let faults = Faults { corrupt: if crc_on_every_pair { faults.corrupt } else { 0.0 }, ..faults };
        let hosts = settings
            .into_iter()
            .enumerate()
            .map(|(h, settings)| {
                let wire = Arc::new(SimWire::new(h, hosts, frames));
                // Each host a provider instance of its own, with its own
                // handle tables, as each host's process has.
                let provider = Arc::new(crate::Provider::for_nics(1));
                let (handle, nic) = Nic::simulated(wire.clone(), large, settings, provider).expect("a simulated NIC");
                let port = nic.port().expect("its port");
                Host { nic, handle, port, wire, dead: false }
            })
            .collect::<Vec<_>>();
        // Misdirected packets go to VI ids nobody has, or to another host.
        let faults = FaultInjector::new(faults, vec![Vec::new(); hosts.len()], &config);
        Sim {
            hosts,
            net,
            faults,
            rng,
            next_timer: None,
            vis: Vec::new(),
            still: 0,
            local: Vec::new(),
            local_links: 0,
            ring_links: 0,
        }
    }

    /// Host `h`'s NIC.
    pub(crate) fn nic(&self, h: usize) -> &Arc<Nic> {
        &self.hosts[h].nic
    }

    /// Connects `a` and `b` (idle VIs with attributes that match, as the
    /// connection manager would require): over the network if they are
    /// of two hosts, over shared memory if of one.  Both are connected
    /// when it returns.
    pub(crate) fn connect(&mut self, a: &Arc<Vi>, b: &Arc<Vi>) -> ViaResult<()> {
        simulated::set(Some(crate::clock::instant_of(self.net.now)));
        let host_of =
            |vi: &Vi| self.hosts.iter().position(|h| Arc::ptr_eq(&h.nic, &vi.nic)).expect("a VI of a simulated host");
        let (ha, hb) = (host_of(a), host_of(b));
        if ha == hb {
            let (ca, cb) = crate::connect::link_locally(a, b)?;
            // The simulator reads their sockets where the helper thread
            // would.  Some connections go through the ring, as between
            // processes that may not attach to each other; on some, one
            // side's peer stops letting it attach a while later, and its
            // copies go through the ring from then on.
            let ring = self.rng.chance(0.25);
            let later = (!ring && self.rng.chance(0.25)).then(|| {
                (self.rng.below(2), self.net.now + self.rng.duration(Duration::ZERO, Duration::from_millis(500)))
            });
            self.local_links += 1;
            self.ring_links += (ring || later.is_some()) as u64;
            for (side, conn) in [ca, cb].into_iter().enumerate() {
                conn.unwatch();
                if ring {
                    conn.attach.store(false, Ordering::Relaxed);
                }
                let refused_at = later.filter(|&(s, _)| s == side as u64).map(|(_, at)| at);
                self.local.push((ha, Arc::downgrade(&conn), refused_at));
            }
            return Ok(());
        }
        crate::connect::link_directly(a, b)?;
        for (vi, host) in [(a, ha), (b, hb)] {
            // A VI that connects again keeps its place in the order.
            if !self.vis.iter().any(|(_, known)| std::ptr::eq(known.as_ptr(), Arc::as_ptr(vi))) {
                self.vis.push((host, Arc::downgrade(vi)));
            }
        }
        Ok(())
    }

    /// Moves the world on by one event: packets that are due arrive, every
    /// live host's port reads them and runs its timers, what the hosts sent
    /// enters the network; if nothing was due, virtual time jumps to the
    /// next arrival or timer.
    pub(crate) fn step(&mut self) {
        self.step_within(None);
    }

    /// As `step`, but virtual time moves by `most` at most: a sleeping
    /// wait wakes at its deadline.
    pub(crate) fn step_within(&mut self, most: Option<Duration>) {
        simulated::set(Some(crate::clock::instant_of(self.net.now)));
        // What the application sent since the last step leaves first.
        self.carry();
        let mut arrived = false;
        while let Some(packet) = self.net.pop_due() {
            arrived = true;
            let host = &self.hosts[packet.to];
            if host.dead {
                self.net.stats.vanished += 1;
            } else {
                self.net.stats.delivered += 1;
                host.wire.arrived.lock().arrive(packet);
            }
        }
        // The helper thread's part: read the local connections' sockets
        // and the ports, run the sessions' timers.
        let now = self.net.now;
        self.next_timer = None;
        self.local.retain(|(_, conn, _)| conn.strong_count() > 0);
        for (h, conn, refused_at) in &mut self.local {
            if let (false, Some(conn)) = (self.hosts[*h].dead, conn.upgrade()) {
                if refused_at.is_some_and(|at| at <= now) {
                    *refused_at = None;
                    conn.attach.store(false, Ordering::Relaxed);
                }
                crate::progress::Source::ready(&*conn);
            }
        }
        for host in self.hosts.iter().filter(|h| !h.dead) {
            if let Some(engine) = &host.nic.send_engine {
                engine.sweep();
            }
            host.port.poll(true);
        }
        // The timers in the order the VIs connected, not the port's (by
        // handle), so that a seed replays the same in any process.
        self.vis.retain(|(_, vi)| vi.strong_count() > 0);
        for (h, vi) in &self.vis {
            if let (false, Some(vi)) = (self.hosts[*h].dead, vi.upgrade()) {
                let Some(link) = vi.send.lock().net().cloned() else { continue };
                let next = vi.net_timers(&link, now);
                self.next_timer = self.next_timer.into_iter().chain(next).min();
            }
        }
        self.carry();
        if !arrived {
            let next = self.net.next_arrival().into_iter().chain(self.next_timer).min();
            let to = match next {
                Some(t) if t > now => t,
                Some(_) => now,
                None => now + IDLE_TICK,
            };
            self.net.now = most.map_or(to, |most| to.min(now + most));
            simulated::set(Some(crate::clock::instant_of(self.net.now)));
        }
        // A timer that falls due again and again at the same instant
        // would stop virtual time, and with it every time limit.
        self.still = if self.net.now == now { self.still + 1 } else { 0 };
        assert!(
            self.still < STILL_STEPS,
            "virtual time stands still at {:?}: a timer keeps falling due",
            self.elapsed()
        );
    }

    /// Hands what the live hosts sent to the network, through the faults.
    fn carry(&mut self) {
        for (h, host) in self.hosts.iter().enumerate() {
            let sent = host.wire.sent.lock().take();
            if host.dead {
                continue;
            }
            for out in sent {
                self.faults.send(&mut self.rng, &mut self.net, h, out);
            }
        }
    }

    /// Virtual time since the start.
    pub(crate) fn elapsed(&self) -> Duration {
        self.net.elapsed()
    }

    /// Host `h` dies: every packet from or to it is lost from now on, and
    /// its port is read no more.
    pub(crate) fn kill(&mut self, h: usize) {
        self.hosts[h].dead = true;
        self.net.drop_host(h);
    }

    /// What the network did to the packets.
    pub(crate) fn stats(&self) -> NetStats {
        self.net.stats
    }
}

impl Drop for Sim {
    /// Closes every host's NIC, which destroys its VIs, CQs and tags and
    /// lets its provider instance go.
    fn drop(&mut self) {
        for host in &self.hosts {
            let _ = host.nic.provider.close_nic(host.handle);
        }
        simulated::set(None);
    }
}

/// A network of random delays: datagrams take 4 µs to 5 ms.
fn random_net(r: &mut SimRng) -> NetConfig {
    let delay_min = Duration::from_micros(r.range(4, 500));
    let delay_max = delay_min + Duration::from_micros(r.range(0, 5000));
    NetConfig { delay_min, delay_max, frame_min: delay_min / 2, frame_max: delay_min }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vi::{LinkKind, ViAttrs, ViState};
    use via_core::consts::*;
    use via_core::descriptor::DescPtr;
    use via_core::error::ViaError;
    use via_core::registry::{REGION_RDMA_READ, REGION_RDMA_WRITE};

    /// Registered memory of one host: descriptors, then data.
    struct Memory {
        base: usize,
        layout: std::alloc::Layout,
        mem: u32,
    }

    impl Drop for Memory {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout.
            unsafe { std::alloc::dealloc(self.base as *mut u8, self.layout) }
        }
    }

    impl Memory {
        fn new(nic: &Nic, ptag: u32, len: usize) -> Memory {
            let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
            // SAFETY: a layout of nonzero size.
            let base = unsafe { std::alloc::alloc_zeroed(layout) } as usize;
            let mem = nic
                .registry
                .register(base as u64, len as u64, ptag, REGION_RDMA_WRITE | REGION_RDMA_READ, false)
                .unwrap();
            Memory { base, layout, mem }
        }
        fn at(&self, offset: usize) -> usize {
            self.base + offset
        }
        /// A one-segment send or receive descriptor at `offset` for
        /// `len` bytes at `data`.
        fn descriptor(&self, offset: usize, data: usize, len: u32) -> DescPtr {
            let d = self.at(offset);
            // SAFETY: both lie in `bytes`.
            unsafe {
                std::ptr::write_bytes(d as *mut u8, 0, 48);
                *((d + 12) as *mut u16) = 1;
                *((d + 24) as *mut u32) = len;
                *((d + 32) as *mut u64) = self.at(data) as u64;
                *((d + 40) as *mut u32) = self.mem;
                *((d + 44) as *mut u32) = len;
            }
            DescPtr(d)
        }
    }

    fn vi(nic: &Arc<Nic>, ptag: Handle, reliability: u16) -> Arc<Vi> {
        let attrs = ViAttrs { reliability, max_transfer: 65536, ptag, rdma_write: true, rdma_read: true };
        Vi::get_in(&nic.provider, Vi::create(nic, attrs, None, None).unwrap()).unwrap()
    }

    const LOSSY: Faults =
        Faults { loss: 0.1, duplicate: 0.05, reorder: 0.1, corrupt: 0.02, misdirect: 0.02, partition: None };
    const NONE: Faults =
        Faults { loss: 0.0, duplicate: 0.0, reorder: 0.0, corrupt: 0.0, misdirect: 0.0, partition: None };

    /// Two hosts, a connected reliable VI on each and 64 KiB of memory
    /// registered under each VI's tag.
    struct Pair {
        sim: Sim,
        na: Arc<Nic>,
        a: Arc<Vi>,
        b: Arc<Vi>,
        ma: Memory,
        mb: Memory,
    }

    fn pair(seed: u64, faults: Faults) -> Pair {
        let mut sim = Sim::new(seed, 2, faults);
        let (na, nb) = (sim.nic(0).clone(), sim.nic(1).clone());
        let (ta, tb) = (na.create_ptag().unwrap(), nb.create_ptag().unwrap());
        let (a, b) = (vi(&na, ta, SERVICE_RELIABLE_DELIVERY), vi(&nb, tb, SERVICE_RELIABLE_DELIVERY));
        sim.connect(&a, &b).unwrap();
        let ma = Memory::new(&na, na.ptag(ta).unwrap().id, 1 << 16);
        let mb = Memory::new(&nb, nb.ptag(tb).unwrap().id, 1 << 16);
        Pair { sim, na, a, b, ma, mb }
    }

    /// A 20,000-byte message from host 0 to host 1 on a reliable VI
    /// pair: checks its completions and bytes, returns the simulated
    /// network's account, the virtual time it took and the packets that
    /// host 0 sent again.
    fn one_message(seed: u64) -> (NetStats, Duration, u64) {
        let Pair { mut sim, na, a, b, ma, mb } = pair(seed, LOSSY);
        assert_eq!((a.link_kind(), b.link_kind()), (LinkKind::Net, LinkKind::Net));
        let sent: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + seed as u32) as u8).collect();
        // SAFETY: within `ma`.
        unsafe { std::ptr::copy_nonoverlapping(sent.as_ptr(), ma.at(4096) as *mut u8, sent.len()) };
        b.post_recv(mb.descriptor(0, 4096, 30_000), mb.mem).unwrap();
        a.post_send(ma.descriptor(0, 4096, sent.len() as u32), ma.mem).unwrap();
        let (mut send_done, mut recv_done) = (None, None);
        while send_done.is_none() || recv_done.is_none() {
            assert!(sim.elapsed() < Duration::from_secs(30), "seed {seed}: no completion");
            send_done = send_done.or(a.send_done().ok());
            recv_done = recv_done.or(b.recv_done().ok());
            sim.step();
        }
        assert_eq!(send_done.unwrap().status() & (STATUS_DONE | STATUS_ERROR_MASK), STATUS_DONE, "seed {seed}");
        let r = recv_done.unwrap();
        assert_eq!(r.status() & (STATUS_DONE | STATUS_ERROR_MASK), STATUS_DONE, "seed {seed}");
        // SAFETY: within `mb`.
        let got = unsafe { std::slice::from_raw_parts(mb.at(4096) as *const u8, sent.len()) };
        assert!(got == &sent[..], "seed {seed}: the bytes differ");
        (sim.stats(), sim.elapsed(), na.counters.get(crate::counters::Counter::Retransmits))
    }

    #[test]
    fn a_message_crosses_a_lossy_simulated_network() {
        let (mut lost, mut retransmits, mut frames) = (0, 0, 0);
        for seed in 0..20 {
            let (stats, _, again) = one_message(seed);
            assert!(stats.delivered >= 2, "seed {seed}: {stats:?}");
            lost += stats.lost;
            retransmits += again;
            frames += stats.frames;
        }
        // The network lost packets, and the sessions sent them again; some
        // packets went as frames.
        assert!(lost > 0 && retransmits >= lost, "{lost} lost, {retransmits} sent again");
        assert!(frames > 0);
    }

    /// Runs the world until `done` holds or `limit` of virtual time has passed.
    fn run_until(sim: &mut Sim, limit: Duration, mut done: impl FnMut() -> bool) -> bool {
        let until = sim.elapsed() + limit;
        while sim.elapsed() < until {
            if done() {
                return true;
            }
            sim.step();
        }
        done()
    }

    #[test]
    fn a_wait_moves_the_simulation_on_and_counts_virtual_time() {
        let Pair { mut sim, a, b, ma, mb, .. } = pair(7, NONE);
        b.post_recv(mb.descriptor(0, 4096, 1000), mb.mem).unwrap();

        // Nothing comes: the wait ends at its timeout, in virtual time.
        let began = sim.elapsed();
        let got = simulated::stepping(&mut |nap| sim.step_within(Some(nap)), || b.recv_wait(50));
        let waited = sim.elapsed() - began;
        assert_eq!(got.err(), Some(ViaError::Timeout));
        assert!(waited >= Duration::from_millis(50) && waited < Duration::from_millis(60), "waited {waited:?}");

        // A message comes while the receiver waits: the wait returns it.
        a.post_send(ma.descriptor(0, 4096, 100), ma.mem).unwrap();
        let began = sim.elapsed();
        let got = simulated::stepping(&mut |nap| sim.step_within(Some(nap)), || b.recv_wait(10_000)).unwrap();
        assert_eq!(got.status() & (STATUS_DONE | STATUS_ERROR_MASK), STATUS_DONE);
        // SAFETY: the descriptor lies in `mb`; its control segment's length.
        assert_eq!(unsafe { *((got.0 + 24) as *const u32) }, 100, "the length received");
        assert!(sim.elapsed() - began < Duration::from_secs(1));
        let sent = simulated::stepping(&mut |nap| sim.step_within(Some(nap)), || a.send_wait(10_000)).unwrap();
        assert_eq!(sent.status() & (STATUS_DONE | STATUS_ERROR_MASK), STATUS_DONE);
    }

    #[test]
    fn a_vi_that_connects_again_still_says_its_last_word_to_the_old_peer() {
        for seed in 0..4 {
            let mut sim = Sim::new(seed, 3, NONE);
            let nics: Vec<Arc<Nic>> = (0..3).map(|h| sim.nic(h).clone()).collect();
            let tags: Vec<Handle> = nics.iter().map(|n| n.create_ptag().unwrap()).collect();
            let vis: Vec<Arc<Vi>> = nics.iter().zip(&tags).map(|(n, &t)| vi(n, t, SERVICE_RELIABLE_DELIVERY)).collect();
            let (a, b, c) = (&vis[0], &vis[1], &vis[2]);
            sim.connect(a, b).unwrap();
            // a disconnects, and its DISCONNECT is lost on the way to b.
            a.disconnect().unwrap();
            assert!(!sim.hosts[0].wire.sent.lock().take().is_empty(), "seed {seed}: a said nothing");
            // a's VI, the same id, connects to c with a new key.
            sim.connect(a, c).unwrap();
            // b, which never heard, sends to a: a's port answers b's
            // packets with the old word, long before b's own timeouts.
            let mb = Memory::new(&nics[1], nics[1].ptag(tags[1]).unwrap().id, 1 << 16);
            b.post_send(mb.descriptor(0, 4096, 100), mb.mem).unwrap();
            let heard = run_until(&mut sim, Duration::from_secs(3), || b.state() == ViState::Error);
            assert!(heard, "seed {seed}: b is {:?} after {:?}", b.state(), sim.elapsed());
            assert!(nics[0].counters.get(crate::counters::Counter::LastWordsRepeated) > 0, "seed {seed}");
            // a's new connection is not touched.
            assert_eq!(a.state(), ViState::Connected, "seed {seed}");
        }
    }

    #[test]
    fn two_vis_of_one_host_connect_over_shared_memory() {
        for seed in 0..8 {
            let mut sim = Sim::new(seed, 2, NONE);
            let nic = sim.nic(0).clone();
            let tag = nic.create_ptag().unwrap();
            let (a, b) = (vi(&nic, tag, SERVICE_RELIABLE_DELIVERY), vi(&nic, tag, SERVICE_RELIABLE_DELIVERY));
            let m = Memory::new(&nic, nic.ptag(tag).unwrap().id, 1 << 16);
            // A receive posted before the connection is published with it.
            b.post_recv(m.descriptor(0, 32768, 30_000), m.mem).unwrap();
            assert_eq!(a.link_kind(), LinkKind::Unlinked);
            sim.connect(&a, &b).unwrap();
            assert!(matches!(a.send.lock().link, Some(crate::vi::Link::Shm(_))), "seed {seed}");
            assert_eq!((a.link_kind(), b.link_kind()), (LinkKind::Shm, LinkKind::Shm));
            let sent: Vec<u8> = (0..20_000u32).map(|i| (i * 13 + seed as u32) as u8).collect();
            // SAFETY: within `m`.
            unsafe { std::ptr::copy_nonoverlapping(sent.as_ptr(), m.at(4096) as *mut u8, sent.len()) };
            a.post_send(m.descriptor(64, 4096, sent.len() as u32), m.mem).unwrap();
            let got = run_until(&mut sim, Duration::from_secs(1), || b.recv_done().is_ok());
            assert!(got, "seed {seed}: nothing received");
            // SAFETY: within `m`.
            let placed = unsafe { std::slice::from_raw_parts(m.at(32768) as *const u8, sent.len()) };
            assert!(placed == &sent[..], "seed {seed}: the bytes differ");
            assert_eq!(a.send_done().unwrap().status() & (STATUS_DONE | STATUS_ERROR_MASK), STATUS_DONE);
            // a disconnects: b hears it through the socket the simulator reads.
            a.disconnect().unwrap();
            let heard = run_until(&mut sim, Duration::from_secs(1), || b.state() == ViState::Error);
            assert!(heard, "seed {seed}: b is {:?}", b.state());
            // Ended on both sides, the polls and waits have no transport to ask.
            assert_eq!((a.link_kind(), b.link_kind()), (LinkKind::Unlinked, LinkKind::Unlinked));
        }
    }

    #[test]
    fn a_shared_memory_vi_knows_where_its_next_message_goes() {
        use crate::vi::hot::Fixed;
        let mut sim = Sim::new(1, 2, NONE);
        let nic = sim.nic(0).clone();
        let tag = nic.create_ptag().unwrap();
        let (a, b) = (vi(&nic, tag, SERVICE_RELIABLE_DELIVERY), vi(&nic, tag, SERVICE_RELIABLE_DELIVERY));
        let m = Memory::new(&nic, nic.ptag(tag).unwrap().id, 1 << 16);
        for i in 0..2 {
            b.post_recv(m.descriptor(i * 64, 4096 + i * 4096, 4096), m.mem).unwrap();
        }
        sim.connect(&a, &b).unwrap();
        let first_pending = |vi: &Vi| {
            let q = vi.recv.lock();
            q.items.get(q.done).map_or(0, |i| i as *const _ as usize)
        };
        assert_eq!(b.hot.recv_front.load(Ordering::Relaxed), first_pending(&b));
        assert_ne!(first_pending(&b), 0);
        // With its descriptor and first buffer.
        let first_lines = |vi: &Vi| {
            let q = vi.recv.lock();
            q.items.get(q.done).map_or((0, 0), |i| (i.desc.0, i.segs[0].addr as usize))
        };
        let hinted = |vi: &Vi| (vi.hot.recv_desc.load(Ordering::Relaxed), vi.hot.recv_buffer.load(Ordering::Relaxed));
        assert_eq!(hinted(&b), first_lines(&b));
        assert_eq!(hinted(&b), (m.at(0), m.at(4096)));
        // The segment and its control lines, inside its mapping.
        let seg = b.recv.lock().seg.clone().unwrap();
        assert_eq!(b.hot.get(Fixed::Segment), Arc::as_ptr(&seg) as usize);
        let region = seg.region().as_ptr() as usize..seg.region().as_ptr() as usize + seg.region().len();
        for line in [Fixed::Control0, Fixed::Control1, Fixed::Control2] {
            assert!(region.contains(&b.hot.get(line)));
        }
        assert!(region.contains(&b.hot.rx_slot.load(Ordering::Relaxed)));
        assert!(a.hot.get(Fixed::Conn) != 0 && a.hot.get(Fixed::Row) != 0);
        // Sends posted and taken back in turn (a ping-pong): each item
        // lands where the hint said, also after a burst of three.
        let last_item = |vi: &Vi| vi.send.lock().items.back().map_or(0, |i| i as *const _ as usize);
        let offset = |vi: &Vi, addr: usize| {
            let seg = vi.recv.lock().seg.clone().unwrap();
            let base = seg.region().as_ptr() as usize;
            assert!((base..base + seg.region().len()).contains(&addr));
            addr - base
        };
        for round in 0..12 {
            let burst = if round % 4 == 3 { 3 } else { 1 };
            for sent in 0..burst {
                // The ring slot the send writes is the one the receiver looks at next.
                assert_eq!(
                    offset(&a, a.hot.tx_slot.load(Ordering::Relaxed)),
                    offset(&b, b.hot.rx_slot.load(Ordering::Relaxed)),
                    "round {round}"
                );
                let hint = a.hot.send_back.load(Ordering::Relaxed);
                a.post_send(m.descriptor(256, 32768, 8), m.mem).unwrap();
                if round > 0 && sent == 0 {
                    assert_eq!(hint, last_item(&a), "round {round}");
                }
                assert!(run_until(&mut sim, Duration::from_secs(1), || b.recv_done().is_ok()));
                b.post_recv(m.descriptor(0, 4096, 4096), m.mem).unwrap();
            }
            for _ in 0..burst {
                a.send_done().unwrap();
            }
            assert_ne!(a.hot.send_back.load(Ordering::Relaxed), 0);
        }
        // Received: the next pending receive is the one to fetch.
        assert_eq!(b.hot.recv_front.load(Ordering::Relaxed), first_pending(&b));
        assert_eq!(hinted(&b), first_lines(&b));
        // Disconnected: the connection's lines are forgotten.
        a.disconnect().unwrap();
        assert!(run_until(&mut sim, Duration::from_secs(1), || b.state() == ViState::Error));
        for vi in [&a, &b] {
            assert_eq!([Fixed::Conn, Fixed::Segment, Fixed::Control0].map(|l| vi.hot.get(l)), [0, 0, 0]);
            assert_eq!([vi.hot.rx_slot.load(Ordering::Relaxed), vi.hot.tx_slot.load(Ordering::Relaxed)], [0, 0]);
        }
    }

    #[test]
    fn a_seed_replays_the_same() {
        for seed in 0..5 {
            assert_eq!(one_message(seed), one_message(seed), "seed {seed}");
        }
    }
}
