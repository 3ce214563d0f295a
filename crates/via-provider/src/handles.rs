//! Handle tables: the values the application holds for NICs, VIs, CQs,
//! protection tags and pending connections.
//!
//! A handle is `kind << 56 | generation << 32 | index` and is never
//! dereferenced: it is looked up, so NULL, stale or forged values are
//! refused rather than followed.  Each slot has its own lock, so lookups of
//! different objects never contend.

use parking_lot::RwLock;
use std::cell::Cell;
use std::sync::Arc;
use std::thread::LocalKey;

/// The kind byte of a handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// `VIP_NIC_HANDLE`.
    Nic = 0xA1,
    /// `VIP_VI_HANDLE`.
    Vi = 0xA2,
    /// `VIP_CQ_HANDLE`.
    Cq = 0xA3,
    /// `VIP_PROTECTION_HANDLE`.
    Ptag = 0xA4,
    /// `VIP_CONN_HANDLE`.
    Conn = 0xA5,
}

/// An opaque handle value.
pub type Handle = u64;

/// The object of one kind a thread used last.
pub(crate) type LastUsed<T> = Cell<Option<(Handle, Arc<T>)>>;

/// Runs `f` on the object of `handle`, from the thread's `last` if it is
/// that object and still `live`, else looked up with `get`.  A thread that
/// drives one VI or polls one CQ then looks nothing up and counts no
/// references on the data path.  Handles are never reused, so a cached
/// object is the handle's own.
pub(crate) fn with_last<T, R>(
    last: &'static LocalKey<LastUsed<T>>,
    handle: Handle,
    live: impl Fn(&T) -> bool,
    get: impl FnOnce(Handle) -> Option<Arc<T>>,
    f: impl FnOnce(&Arc<T>) -> R,
) -> Option<R> {
    last.with(|cell| {
        // Taken out while `f` runs: a nested call looks its object up.
        let object = match cell.take() {
            Some((h, o)) if h == handle && live(&o) => o,
            _ => get(handle)?,
        };
        let result = f(&object);
        cell.set(Some((handle, object)));
        Some(result)
    })
}

/// Forgets the thread's `last` object if it is `handle`.
pub(crate) fn forget_last<T>(last: &'static LocalKey<LastUsed<T>>, handle: Handle) {
    let _ = last.try_with(|cell| match cell.take() {
        Some((h, _)) if h == handle => {}
        other => cell.set(other),
    });
}

struct Slot<T> {
    generation: u32,
    object: Option<Arc<T>>,
}

/// A fixed-capacity table of objects of one kind.
pub struct Table<T> {
    kind: Kind,
    slots: Vec<RwLock<Slot<T>>>,
    free: parking_lot::Mutex<Vec<u32>>,
}

impl<T> Table<T> {
    /// A table of `capacity` slots.
    pub fn new(kind: Kind, capacity: u32) -> Table<T> {
        Table {
            kind,
            slots: (0..capacity).map(|_| RwLock::new(Slot { generation: 0, object: None })).collect(),
            free: parking_lot::Mutex::new((0..capacity).rev().collect()),
        }
    }

    /// Stores an object and returns its handle; `None` when full.
    pub fn insert(&self, make: impl FnOnce(Handle) -> Arc<T>) -> Option<(Handle, Arc<T>)> {
        let index = self.free.lock().pop()?;
        let mut slot = self.slots[index as usize].write();
        slot.generation = (slot.generation + 1) & 0xFF_FFFF;
        if slot.generation == 0 {
            slot.generation = 1;
        }
        let handle = ((self.kind as u64) << 56) | ((slot.generation as u64) << 32) | index as u64;
        let object = make(handle);
        slot.object = Some(object.clone());
        Some((handle, object))
    }

    fn locate(&self, handle: Handle) -> Option<(usize, u32)> {
        if (handle >> 56) as u8 != self.kind as u8 {
            return None;
        }
        let index = (handle & 0xFFFF_FFFF) as usize;
        let generation = ((handle >> 32) & 0xFF_FFFF) as u32;
        (index < self.slots.len() && generation != 0).then_some((index, generation))
    }

    /// The object of a handle, if the handle is live.
    pub fn get(&self, handle: Handle) -> Option<Arc<T>> {
        let (index, generation) = self.locate(handle)?;
        let slot = self.slots[index].read();
        if slot.generation == generation {
            slot.object.clone()
        } else {
            None
        }
    }

    /// Removes and returns the object of a live handle.
    pub fn remove(&self, handle: Handle) -> Option<Arc<T>> {
        let (index, generation) = self.locate(handle)?;
        let object = {
            let mut slot = self.slots[index].write();
            if slot.generation != generation {
                return None;
            }
            slot.object.take()
        };
        if object.is_some() {
            self.free.lock().push(index as u32);
        }
        object
    }

    /// Every live object.
    pub fn all(&self) -> Vec<(Handle, Arc<T>)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let s = s.read();
                let h = ((self.kind as u64) << 56) | ((s.generation as u64) << 32) | i as u64;
                s.object.clone().map(|o| (h, o))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_and_foreign_handles_are_refused() {
        let table: Table<u32> = Table::new(Kind::Vi, 4);
        let (h, _) = table.insert(|_| Arc::new(5)).unwrap();
        assert_eq!(*table.get(h).unwrap(), 5);
        assert!(table.get(h ^ (1 << 32)).is_none());
        assert!(table.get((h & !(0xFF << 56)) | ((Kind::Cq as u64) << 56)).is_none());
        assert!(table.get(0).is_none());
        assert!(table.get(0x7ffd_1234_5678).is_none());
        assert!(table.remove(h).is_some());
        assert!(table.get(h).is_none());
        let (h2, _) = table.insert(|_| Arc::new(6)).unwrap();
        assert_ne!(h, h2);
        assert!(table.get(h).is_none());
        for _ in 0..3 {
            table.insert(|_| Arc::new(0)).unwrap();
        }
        assert!(table.insert(|_| Arc::new(0)).is_none());
    }
}
