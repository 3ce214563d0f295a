//! Handle tables: the values the application holds for NICs, VIs, CQs,
//! protection tags and pending connections.
//!
//! A handle is `kind << 56 | generation << 32 | index` and is never
//! dereferenced: it is looked up, so NULL, stale or forged values are
//! refused rather than followed.  Each slot has its own lock, so lookups of
//! different objects never contend.

use parking_lot::RwLock;
use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicU64, Ordering};
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

/// A cached object and its handle.
type Cached<T> = (Handle, Arc<T>);

/// The objects of one table a thread used recently ([`Table::with`]), by
/// the index of their handle: a thread driving a thousand VIs finds every
/// one of them here.  It grows to the next power of two above the highest
/// index used, so at most to the table's capacity.
pub(crate) struct ThreadCache<T> {
    /// The table it holds objects of: another table's use empties it
    /// (each provider instance has tables of its own).
    table: Cell<u64>,
    /// The table's removal count when the cache was last emptied.
    epoch: Cell<u64>,
    /// Calls of [`Table::with`] under way on this thread.  Each lends an
    /// entry's object to its closure, so while any runs no entry is
    /// replaced or dropped: the cache is only filled and emptied at zero.
    lent: Cell<u32>,
    /// Indexed by the handle's table index.  Only this thread touches it,
    /// and no reference into it outlives the method that made it (`find`
    /// hands out a pointer to an entry, valid while nothing fills or
    /// empties the cache: see `lent`).
    slots: UnsafeCell<Vec<Option<Cached<T>>>>,
}

impl<T> ThreadCache<T> {
    /// An empty cache, for a `thread_local!`.
    pub(crate) const fn new() -> ThreadCache<T> {
        ThreadCache { table: Cell::new(0), epoch: Cell::new(0), lent: Cell::new(0), slots: UnsafeCell::new(Vec::new()) }
    }

    /// Drops every entry (after taking them out: an object's drop may use a cache).
    fn empty(&self) {
        // SAFETY: no reference into the entries is alive (see `slots`).
        let old = std::mem::take(unsafe { &mut *self.slots.get() });
        drop(old);
    }

    /// The cached object of `handle` at `index`.  The pointer stays valid
    /// while the cache is neither filled nor emptied.
    fn find(&self, index: usize, handle: Handle) -> Option<*const Arc<T>> {
        // SAFETY: no mutable reference into the entries is alive (see `slots`).
        match unsafe { &*self.slots.get() }.get(index) {
            Some(Some((h, object))) if *h == handle => Some(object as *const Arc<T>),
            _ => None,
        }
    }

    fn put(&self, index: usize, entry: Cached<T>) {
        let old = {
            // SAFETY: no reference into the entries is alive (see `slots`).
            let slots = unsafe { &mut *self.slots.get() };
            if slots.len() <= index {
                slots.resize_with((index + 1).next_power_of_two(), || None);
            }
            slots[index].replace(entry)
        };
        drop(old);
    }

    /// Runs `f` on the cached object `object` (from [`Self::find`]).
    ///
    /// # Safety
    /// `object` came from `find` on this cache and nothing filled or
    /// emptied the cache since.
    unsafe fn lend<R>(&self, object: *const Arc<T>, f: impl FnOnce(&Arc<T>) -> R) -> R {
        /// Ends the loan when `f` returns or unwinds.
        struct Loan<'a>(&'a Cell<u32>);
        impl Drop for Loan<'_> {
            fn drop(&mut self) {
                self.0.set(self.0.get() - 1);
            }
        }
        self.lent.set(self.lent.get() + 1);
        let _loan = Loan(&self.lent);
        // SAFETY: while the loan lasts no entry is replaced or dropped
        // (`put` and `empty` run only with no loan), so the entry's `Arc`
        // outlives `f`.
        f(unsafe { &*object })
    }
}

struct Slot<T> {
    generation: u32,
    object: Option<Arc<T>>,
}

/// A fixed-capacity table of objects of one kind.
pub struct Table<T> {
    kind: Kind,
    /// This table among all of the process (never 0, never reused).
    id: u64,
    slots: Vec<RwLock<Slot<T>>>,
    free: parking_lot::Mutex<Vec<u32>>,
    /// Objects removed so far: a thread cache older than this is emptied.
    removed: AtomicU64,
}

impl<T> Table<T> {
    /// A table of `capacity` slots.
    pub fn new(kind: Kind, capacity: u32) -> Table<T> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Table {
            kind,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            slots: (0..capacity).map(|_| RwLock::new(Slot { generation: 0, object: None })).collect(),
            free: parking_lot::Mutex::new((0..capacity).rev().collect()),
            removed: AtomicU64::new(0),
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
            self.removed.fetch_add(1, Ordering::Release);
        }
        object
    }

    /// Runs `f` on the object of a live handle, kept in the thread's `cache`
    /// so that a thread driving many VIs, or polling a CQ, looks nothing up
    /// and counts no references on the data path.  Removing any object of
    /// the table empties every thread's cache at its next call, so a
    /// removed object is never used; handles are never reused, so a cached
    /// object is the handle's own.
    pub(crate) fn with<R>(
        &self,
        cache: &'static LocalKey<ThreadCache<T>>,
        handle: Handle,
        f: impl FnOnce(&Arc<T>) -> R,
    ) -> Option<R> {
        cache.with(|cache| {
            let (index, _) = self.locate(handle)?;
            let removed = self.removed.load(Ordering::Acquire);
            let fresh = cache.epoch.get() == removed && cache.table.get() == self.id;
            if fresh {
                if let Some(object) = cache.find(index, handle) {
                    // SAFETY: found just now.
                    return Some(unsafe { cache.lend(object, f) });
                }
            }
            if cache.lent.get() > 0 {
                // Inside another call's `f`: the cache is left as it is.
                return self.get(handle).map(|object| f(&object));
            }
            if !fresh {
                cache.empty();
                cache.epoch.set(removed);
                cache.table.set(self.id);
            }
            let object = match cache.find(index, handle) {
                Some(object) => object,
                None => {
                    let object = self.get(handle)?;
                    cache.put(index, (handle, object.clone()));
                    // The replaced entry's drop may have used the cache.
                    match cache.find(index, handle) {
                        Some(cached) => cached,
                        None => return Some(f(&object)),
                    }
                }
            };
            // SAFETY: found just now, and nothing filled or emptied the cache since.
            Some(unsafe { cache.lend(object, f) })
        })
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

    thread_local! {
        static CACHE: ThreadCache<u32> = const { ThreadCache::new() };
    }

    #[test]
    fn thread_cache_keeps_a_thousand_objects_at_once() {
        let table: Table<u32> = Table::new(Kind::Vi, 4096);
        let objects: Vec<_> = (0..1024).map(|i| table.insert(|_| Arc::new(i)).unwrap()).collect();
        for _ in 0..2 {
            for (h, o) in &objects {
                assert_eq!(table.with(&CACHE, *h, |x| **x), Some(**o));
            }
        }
        // Each is held by the table, the cache and `objects`: no one
        // pushed another out.
        assert!(objects.iter().all(|(_, o)| Arc::strong_count(o) == 3));
        // A forged generation of a cached index is refused.
        let (h, _) = objects[7];
        assert_eq!(table.with(&CACHE, h ^ (1 << 40), |x| **x), None);
    }

    #[test]
    fn thread_cache_serves_each_table_its_own_objects() {
        // Two tables (two provider instances) hand out the same handle.
        let (one, two): (Table<u32>, Table<u32>) = (Table::new(Kind::Vi, 4), Table::new(Kind::Vi, 4));
        let (h, _) = one.insert(|_| Arc::new(1)).unwrap();
        let (h2, _) = two.insert(|_| Arc::new(2)).unwrap();
        assert_eq!(h, h2);
        for _ in 0..2 {
            assert_eq!(one.with(&CACHE, h, |o| **o), Some(1));
            assert_eq!(two.with(&CACHE, h, |o| **o), Some(2));
        }
    }

    #[test]
    fn thread_cache_never_serves_a_removed_object() {
        let table: Table<u32> = Table::new(Kind::Vi, 8);
        let (a, first) = table.insert(|_| Arc::new(1)).unwrap();
        let (b, _) = table.insert(|_| Arc::new(2)).unwrap();
        assert_eq!(table.with(&CACHE, a, |o| **o), Some(1));
        assert_eq!(table.with(&CACHE, b, |o| **o), Some(2));
        // Cached: the table, the cache and `first`.
        assert_eq!(Arc::strong_count(&first), 3);
        table.remove(a);
        assert_eq!(table.with(&CACHE, a, |o| **o), None);
        assert_eq!(Arc::strong_count(&first), 1, "the cache let the removed object go");
        assert_eq!(table.with(&CACHE, b, |o| **o), Some(2));
        // Another thread's cache is emptied at its next call too.
        let table = Arc::new(table);
        let (c, third) = table.insert(|_| Arc::new(3)).unwrap();
        let (used, removed) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|s| {
            s.spawn(|| {
                assert_eq!(table.with(&CACHE, c, |o| **o), Some(3));
                used.wait();
                removed.wait();
                assert_eq!(table.with(&CACHE, c, |o| **o), None);
                assert_eq!(table.with(&CACHE, b, |o| **o), Some(2));
            });
            used.wait();
            assert_eq!(Arc::strong_count(&third), 3);
            table.remove(c);
            removed.wait();
        });
        assert_eq!(Arc::strong_count(&third), 1);
    }

    #[test]
    fn an_object_lent_to_a_call_outlives_what_the_call_does() {
        let table: Table<u32> = Table::new(Kind::Vi, 8);
        let (a, first) = table.insert(|_| Arc::new(1)).unwrap();
        let (b, _) = table.insert(|_| Arc::new(2)).unwrap();
        let (c, _) = table.insert(|_| Arc::new(3)).unwrap();
        assert_eq!(table.with(&CACHE, a, |o| **o), Some(1));
        let seen = table.with(&CACHE, a, |o| {
            // Nested calls: the same handle and one the cache has not met.
            assert_eq!(table.with(&CACHE, a, |inner| **inner), Some(1));
            assert_eq!(table.with(&CACHE, c, |inner| **inner), Some(3));
            // The object at hand is removed from the table meanwhile: the
            // nested calls no longer find it, and the loan still holds it.
            table.remove(a);
            assert_eq!(table.with(&CACHE, a, |inner| **inner), None);
            assert_eq!(table.with(&CACHE, b, |inner| **inner), Some(2));
            **o
        });
        assert_eq!(seen, Some(1));
        // The next call empties the cache: only `first` holds the object now.
        assert_eq!(table.with(&CACHE, b, |o| **o), Some(2));
        assert_eq!(Arc::strong_count(&first), 1);
        // A call that panics ends its loan: the cache is emptied again later.
        let (d, fourth) = table.insert(|_| Arc::new(4)).unwrap();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            table.with(&CACHE, d, |_| panic!("inside a call"));
        }));
        assert!(caught.is_err());
        table.remove(d);
        assert_eq!(table.with(&CACHE, d, |o| **o), None);
        assert_eq!(Arc::strong_count(&fourth), 1);
    }
}
