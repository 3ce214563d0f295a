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
//! that finds the engine busy leaves its doorbell to the engine's own thread
//! (`openvia-send`), which sleeps until such a doorbell wakes it and then
//! waits its turn, so no rung send is ever left behind.

use crate::tuning::{tuning, Doorbell};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use via_core::descriptor::DescPtr;
use via_shm::futex;

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
    /// Futex word: changes with every doorbell.
    word: AtomicU32,
    sleeping: AtomicBool,
    stop: AtomicBool,
}

impl SendEngine {
    /// Starts the send engine of a NIC, if the doorbell setting asks for one.
    pub fn start() -> std::io::Result<Option<Arc<SendEngine>>> {
        if tuning().doorbell == Doorbell::Direct {
            return Ok(None);
        }
        let engine = Arc::new(SendEngine {
            mode: tuning().doorbell,
            vis: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
            central: Mutex::new(VecDeque::new()),
            sweeper: Mutex::new(Sweeper { scanned: Vec::new(), seen: u64::MAX }),
            word: AtomicU32::new(0),
            sleeping: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let e = engine.clone();
        std::thread::Builder::new().name("openvia-send".into()).spawn(move || e.run())?;
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

    /// Ends the engine's thread (`VipCloseNic`).
    pub fn shut_down(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake();
    }

    fn wake(&self) {
        self.word.fetch_add(1, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            futex::futex_wake(&self.word, 1);
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

    fn run(self: Arc<Self>) {
        while !self.stop.load(Ordering::Acquire) {
            self.sleeping.store(true, Ordering::SeqCst);
            let word = self.word.load(Ordering::SeqCst);
            // Sweeps once more after announcing the sleep: a doorbell rung
            // before `word` was read is found here, one rung after wakes us.
            // Waits for a sweeper under way: it may have passed the doorbell.
            let mut sweeper = self.sweeper.lock();
            let found = self.sweep_locked(&mut sweeper);
            drop(sweeper);
            if !found && !self.stop.load(Ordering::Acquire) {
                futex::futex_wait(&self.word, word, Some(Duration::from_millis(50)));
            }
            self.sleeping.store(false, Ordering::SeqCst);
        }
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
    let at = tuning().profile.is_some().then(Instant::now);
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
