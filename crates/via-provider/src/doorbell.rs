//! Doorbells (`VIA_DOORBELL`): how a posted send reaches whoever carries it
//! out, Banikazemi et al.'s design alternatives made real.
//!
//! - `direct` (default): `VipPostSend` carries the send out itself; there is
//!   no doorbell.
//! - `d1`: every VI has its own doorbell, a queue of posted descriptors and
//!   a flag.  The NIC's send engine scans the flags of every VI of the NIC
//!   in turn, so a sweep costs more the more VIs there are.
//! - `d2`: every VI of the NIC posts into one central send queue, which the
//!   engine pops in order whatever the number of VIs.
//!
//! The engine runs in whichever thread calls into the NIC, as a polling NIC
//! processor picks a doorbell up: `VipPostSend` rings and then sweeps, and
//! `VipSendDone`, `VipRecvDone`, `VipCQDone` and the waits built on them
//! sweep before they look for completions.  One sweeper at a time: a thread
//! that finds the engine busy leaves its doorbell to the progress engine's
//! helper thread (the send engine is one of its sources), which the
//! doorbell wakes and which then waits its turn, so no rung send is ever
//! left behind.

use crate::progress::{self, Source, Token};
use crate::tuning::Doorbell;
use parking_lot::Mutex;
use rustix::event::{eventfd, EventfdFlags};
use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use via_core::descriptor::DescPtr;

/// A posted send waiting for the engine.
pub(crate) struct Rung {
    pub desc: DescPtr,
    pub mem: u32,
    /// When it was rung, if the stages are being timed.
    pub at: Option<Instant>,
}

/// A VI as its NIC's send engine sees it.  (`Vi` implements it; the
/// engine names no VI type.)
pub(crate) trait Ringer: Send + Sync {
    /// Its own doorbell (D1).
    fn doorbell(&self) -> &ViDoorbell;
    /// Carries out a send taken from a doorbell.
    fn take(&self, r: Rung);
}

/// A VI's own doorbell (D1).
#[derive(Default)]
pub(crate) struct ViDoorbell {
    rung: AtomicBool,
    queue: Mutex<VecDeque<Rung>>,
}

/// The send engine of a NIC.
pub(crate) struct SendEngine {
    mode: Doorbell,
    /// D1: the NIC's VIs, scanned in turn; `generation` changes with the set.
    vis: Mutex<Vec<Weak<dyn Ringer>>>,
    generation: AtomicU64,
    /// D2: the central send queue.
    central: Mutex<VecDeque<(Arc<dyn Ringer>, Rung)>>,
    /// Held while sweeping, so that one sweeper at a time takes rung sends
    /// and each VI's sends are carried out in posting order.
    sweeper: Mutex<Sweeper>,
    /// Written when a doorbell finds the sweeper busy: the helper thread
    /// then sweeps.
    wakeup: OwnedFd,
    /// Whether `wakeup` was written and not yet read (one write is enough).
    woken: AtomicBool,
    /// Its token in the progress engine.
    token: AtomicU64,
}

/// How often the helper thread sweeps the doorbells anyway, in case a wake
/// was missed.
const SWEEP_ANYWAY: Duration = Duration::from_millis(50);

impl SendEngine {
    /// Starts the send engine of a NIC whose doorbells are of `mode` (none
    /// for `Direct`).
    pub fn start(mode: Doorbell) -> std::io::Result<Option<Arc<SendEngine>>> {
        if mode == Doorbell::Direct {
            return Ok(None);
        }
        let wakeup = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let engine = Arc::new(SendEngine {
            mode,
            vis: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
            central: Mutex::new(VecDeque::new()),
            sweeper: Mutex::new(Sweeper { scanned: Vec::new(), seen: u64::MAX }),
            wakeup,
            woken: AtomicBool::new(false),
            token: AtomicU64::new(0),
        });
        let token = progress::register(Arc::downgrade(&engine) as Weak<dyn Source>, true);
        engine.token.store(token, Ordering::Release);
        progress::watch_fd(engine.wakeup.as_fd(), token);
        Ok(Some(engine))
    }

    /// Adds a VI to the set the engine scans (D1).
    pub fn attach(&self, vi: Weak<dyn Ringer>) {
        if self.mode == Doorbell::PerVi {
            self.vis.lock().push(vi);
            self.generation.fetch_add(1, Ordering::Release);
        }
    }

    /// Removes a destroyed VI from the set (D1).
    pub fn detach(&self, vi: &dyn Ringer) {
        if self.mode == Doorbell::PerVi {
            let gone = vi as *const dyn Ringer;
            self.vis.lock().retain(|w| w.strong_count() > 0 && !std::ptr::addr_eq(w.as_ptr(), gone));
            self.generation.fetch_add(1, Ordering::Release);
        }
    }

    /// Leaves the progress engine (`VipCloseNic`), after one last sweep.
    pub fn shut_down(&self) {
        self.leave_progress();
        self.sweep_locked(&mut self.sweeper.lock());
    }

    /// Stops the helper thread's sweeps: from now on only the threads that
    /// call into the NIC sweep (the whole-provider simulator, in one
    /// thread, sweeps where the helper thread would).
    pub fn leave_progress(&self) {
        let token: Token = self.token.swap(0, Ordering::AcqRel);
        if token != 0 && progress::unregister(token) {
            progress::unwatch_fd(self.wakeup.as_fd());
        }
    }

    fn wake(&self) {
        if !self.woken.swap(true, Ordering::AcqRel) {
            let _ = rustix::io::write(&self.wakeup, &1u64.to_ne_bytes());
        }
    }

    /// Carries out every send rung so far; false if another thread is at
    /// it (it may have passed a doorbell rung since).
    pub fn sweep(&self) -> bool {
        match self.sweeper.try_lock() {
            Some(mut sweeper) => {
                self.sweep_locked(&mut sweeper);
                true
            }
            None => false,
        }
    }

    fn sweep_locked(&self, sweeper: &mut Sweeper) -> bool {
        match self.mode {
            Doorbell::PerVi => {
                let generation = self.generation.load(Ordering::Acquire);
                if generation != sweeper.seen {
                    sweeper.scanned = self.vis.lock().iter().filter_map(Weak::upgrade).collect();
                    sweeper.seen = generation;
                }
                let mut any = false;
                for vi in sweeper.scanned.iter() {
                    if vi.doorbell().rung.swap(false, Ordering::AcqRel) {
                        let taken = std::mem::take(&mut *vi.doorbell().queue.lock());
                        for r in taken {
                            vi.take(r);
                        }
                        any = true;
                    }
                }
                any
            }
            Doorbell::Central => {
                let mut any = false;
                loop {
                    let next = self.central.lock().pop_front();
                    let Some((vi, r)) = next else { return any };
                    vi.take(r);
                    any = true;
                }
            }
            Doorbell::Direct => false,
        }
    }
}

/// The helper thread sweeps for a doorbell that found the sweeper busy:
/// it waits for the sweeper under way, which may have passed that doorbell.
impl Source for SendEngine {
    fn ready(&self) {
        let _ = rustix::io::read(&self.wakeup, &mut [0u8; 8]);
        self.woken.store(false, Ordering::Release);
        self.sweep_locked(&mut self.sweeper.lock());
    }

    fn service(&self, now: Instant) -> Option<Instant> {
        // A sweeper under way will do: the helper thread never waits here.
        self.sweep();
        Some(now + SWEEP_ANYWAY)
    }
}

/// What a sweeper keeps between sweeps (D1): the VIs it scans.
struct Sweeper {
    scanned: Vec<Arc<dyn Ringer>>,
    seen: u64,
}

/// Rings the doorbell of a send that `VipPostSend` has accepted; with no
/// engine (a NIC opened without one), the send is carried out at once.
pub(crate) fn ring(engine: Option<&SendEngine>, vi: &Arc<dyn Ringer>, desc: DescPtr, mem: u32) {
    let Some(engine) = engine else {
        return vi.take(Rung { desc, mem, at: None });
    };
    let at = crate::counters::profiling().then(Instant::now);
    let r = Rung { desc, mem, at };
    match engine.mode {
        Doorbell::PerVi => {
            vi.doorbell().queue.lock().push_back(r);
            vi.doorbell().rung.store(true, Ordering::Release);
        }
        _ => engine.central.lock().push_back((vi.clone(), r)),
    }
    if !engine.sweep() {
        engine.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::eventually;

    /// A VI that records the sends the engine carries out, in order.
    #[derive(Default)]
    struct Recorder {
        doorbell: ViDoorbell,
        taken: Mutex<Vec<usize>>,
    }

    impl Ringer for Recorder {
        fn doorbell(&self) -> &ViDoorbell {
            &self.doorbell
        }
        fn take(&self, r: Rung) {
            self.taken.lock().push(r.desc.0);
        }
    }

    #[test]
    fn without_an_engine_a_send_is_carried_out_at_once() {
        assert!(SendEngine::start(Doorbell::Direct).unwrap().is_none());
        let vi = Arc::new(Recorder::default());
        let ringer: Arc<dyn Ringer> = vi.clone();
        ring(None, &ringer, DescPtr(64), 0);
        assert_eq!(*vi.taken.lock(), vec![64]);
    }

    #[test]
    fn every_rung_send_is_carried_out_in_order_even_while_another_sweeps() {
        for mode in [Doorbell::PerVi, Doorbell::Central] {
            let engine = SendEngine::start(mode).unwrap().unwrap();
            let (a, b) = (Arc::new(Recorder::default()), Arc::new(Recorder::default()));
            let (ra, rb): (Arc<dyn Ringer>, Arc<dyn Ringer>) = (a.clone(), b.clone());
            engine.attach(Arc::downgrade(&ra));
            engine.attach(Arc::downgrade(&rb));
            // The ringing thread sweeps at once.
            ring(Some(&engine), &ra, DescPtr(1), 0);
            ring(Some(&engine), &rb, DescPtr(2), 0);
            assert_eq!((a.taken.lock().clone(), b.taken.lock().clone()), (vec![1], vec![2]), "{mode:?}");
            // A sweeper is busy: the doorbells wake the helper thread, which
            // waits its turn and then carries them out, in posting order.
            let busy = engine.sweeper.lock();
            for d in 3..6 {
                ring(Some(&engine), &ra, DescPtr(d), 0);
            }
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(a.taken.lock().len(), 1, "{mode:?}: nothing is taken while the sweeper is busy");
            drop(busy);
            eventually("the helper thread sweeps", || a.taken.lock().len() == 4);
            assert_eq!(*a.taken.lock(), vec![1, 3, 4, 5], "{mode:?}");
            // A detached VI is no longer scanned; the engine leaves the
            // progress engine when its NIC closes.
            engine.detach(&*ra);
            engine.shut_down();
            assert_eq!(engine.token.load(Ordering::Acquire), 0);
        }
    }
}
