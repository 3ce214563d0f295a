//! A page of named counters that a process publishes and the host agent
//! reads: the transport's counters, live, without any message passing.
//!
//! Layout: a header (magic, pid, count, label, rows, row width), `count`
//! entries of a NUL-padded name and a u64 value, then `rows` rows of
//! `row width` u64 values.  Column `i` of every row adds to counter `i`:
//! a row belongs to one writer at a time (a VI's work queue), which adds to
//! it with a plain load and store where the shared entry needs an atomic
//! read-modify-write.  The reader sums.  The owner only adds to values; the
//! reader treats everything as untrusted and validates it.

use crate::region::SharedRegion;
use rustix::fs::{self, SealFlags};
use rustix::mm::{self, MapFlags, ProtFlags};
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

const MAGIC: u64 = u64::from_le_bytes(*b"VIASTAT2");
const HEADER_BYTES: usize = 64;
const LABEL_BYTES: usize = 32;
/// Longest counter name.
pub const NAME_BYTES: usize = 24;
const ENTRY_BYTES: usize = NAME_BYTES + 8;
/// Most counters a page holds.
pub const MAX_COUNTERS: usize = 128;
/// Most rows a page holds.
pub const MAX_ROWS: usize = 4096;
/// Most counters a row holds: one cache line.
pub const ROW_WIDTH: usize = 8;
const ROW_BYTES: usize = ROW_WIDTH * 8;

/// Where the rows start: after the entries, on a cache line of their own.
fn rows_offset(count: usize) -> usize {
    (HEADER_BYTES + count * ENTRY_BYTES).next_multiple_of(64)
}

/// The owner's side: counters it adds to.
pub struct StatsPage {
    region: SharedRegion,
    count: usize,
    rows: usize,
}

impl StatsPage {
    /// A page labelled `label` (e.g. the device) with counters `names` and
    /// `rows` rows for the first `ROW_WIDTH` of them.
    pub fn create(label: &str, names: &[&str], rows: usize) -> io::Result<StatsPage> {
        if names.len() > MAX_COUNTERS
            || names.iter().any(|n| n.len() > NAME_BYTES)
            || label.len() > LABEL_BYTES
            || rows > MAX_ROWS
            || (rows > 0 && names.len() < ROW_WIDTH)
        {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many or too long counter names, or rows"));
        }
        let region = SharedRegion::create("openvia-stats", rows_offset(names.len()) + rows * ROW_BYTES)?;
        let base = region.as_ptr();
        // SAFETY: the region is at least this long and only ours so far.
        unsafe {
            std::ptr::copy_nonoverlapping(std::process::id().to_le_bytes().as_ptr(), base.add(8), 4);
            std::ptr::copy_nonoverlapping((names.len() as u32).to_le_bytes().as_ptr(), base.add(12), 4);
            std::ptr::copy_nonoverlapping(label.as_ptr(), base.add(16), label.len());
            for (i, name) in names.iter().enumerate() {
                std::ptr::copy_nonoverlapping(name.as_ptr(), base.add(HEADER_BYTES + i * ENTRY_BYTES), name.len());
            }
            std::ptr::copy_nonoverlapping((rows as u32).to_le_bytes().as_ptr(), base.add(48), 4);
            std::ptr::copy_nonoverlapping((ROW_WIDTH as u32).to_le_bytes().as_ptr(), base.add(52), 4);
            (*(base as *const AtomicU64)).store(MAGIC, Ordering::Release);
        }
        Ok(StatsPage { region, count: names.len(), rows })
    }

    /// The number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Adds `n` to column `i` of row `row` with a plain load and store.
    ///
    /// # Safety
    /// No other thread adds to the same row and column at the same time.
    pub unsafe fn add_to_row(&self, row: usize, i: usize, n: u64) {
        if row < self.rows && i < ROW_WIDTH {
            let v = self.row_value(row, i);
            v.store(v.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        }
    }

    /// Where row `row` is (a line of its own), for its owner to
    /// prefetch; null for a row out of range.
    pub fn row_line(&self, row: usize) -> *const u8 {
        match row < self.rows {
            true => self.row_value(row, 0) as *const AtomicU64 as *const u8,
            false => std::ptr::null(),
        }
    }

    /// Column `i` of row `row`; both in range.
    fn row_value(&self, row: usize, i: usize) -> &AtomicU64 {
        debug_assert!(row < self.rows && i < ROW_WIDTH);
        // SAFETY: the value is inside the region and 8-byte aligned.
        unsafe { &*(self.region.as_ptr().add(rows_offset(self.count) + row * ROW_BYTES + i * 8) as *const AtomicU64) }
    }

    fn value(&self, i: usize) -> Option<&AtomicU64> {
        (i < self.count).then(|| {
            // SAFETY: entry i is inside the region and 8-byte aligned.
            unsafe { &*(self.region.as_ptr().add(HEADER_BYTES + i * ENTRY_BYTES + NAME_BYTES) as *const AtomicU64) }
        })
    }

    /// Adds `n` to counter `i`.
    pub fn add(&self, i: usize, n: u64) {
        if let Some(v) = self.value(i) {
            v.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The current value of counter `i`, its rows' columns included.
    pub fn get(&self, i: usize) -> u64 {
        let mut total = self.value(i).map_or(0, |v| v.load(Ordering::Relaxed));
        if i < ROW_WIDTH {
            for row in 0..self.rows {
                total = total.wrapping_add(self.row_value(row, i).load(Ordering::Relaxed));
            }
        }
        total
    }

    /// The page's descriptor, to hand to the reader.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.region.fd()
    }
}

/// What a reader found in a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The publishing process.
    pub pid: u32,
    /// The page's label.
    pub label: String,
    /// Counter names and values.
    pub counters: Vec<(String, u64)>,
}

/// The reader's side: a read-only mapping of another process's page.
pub struct StatsView {
    ptr: *const u8,
    len: usize,
    _fd: OwnedFd,
}

// The mapping is read-only and only read with plain loads.
unsafe impl Send for StatsView {}

impl StatsView {
    /// Maps a page received from another process.  The file must be sealed
    /// against shrinking (pages made by [`StatsPage::create`] are).
    pub fn map(fd: OwnedFd) -> io::Result<StatsView> {
        if !fs::fcntl_get_seals(&fd).is_ok_and(|s| s.contains(SealFlags::SHRINK)) {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "counter page not sealed"));
        }
        let len = fs::fstat(&fd)?.st_size as usize;
        if !(HEADER_BYTES..=rows_offset(MAX_COUNTERS) + MAX_ROWS * ROW_BYTES).contains(&len) {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "counter page of the wrong size"));
        }
        // SAFETY: a fresh read-only mapping (at an address the kernel picks)
        // of a file sealed against shrinking below `len`.
        let p = unsafe { mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ, MapFlags::SHARED, &fd, 0) }?;
        Ok(StatsView { ptr: p as *const u8, len, _fd: fd })
    }

    fn bytes(&self, at: usize, n: usize) -> &[u8] {
        // SAFETY: callers stay within len (checked in snapshot).
        unsafe { std::slice::from_raw_parts(self.ptr.add(at), n) }
    }

    /// Reads the page; `None` if it is not a valid page.
    pub fn snapshot(&self) -> Option<Snapshot> {
        let word = |at: usize| u64::from_le_bytes(self.bytes(at, 8).try_into().unwrap());
        if word(0) != MAGIC {
            return None;
        }
        let pid = u32::from_le_bytes(self.bytes(8, 4).try_into().unwrap());
        let count = u32::from_le_bytes(self.bytes(12, 4).try_into().unwrap()) as usize;
        let rows = u32::from_le_bytes(self.bytes(48, 4).try_into().unwrap()) as usize;
        let width = u32::from_le_bytes(self.bytes(52, 4).try_into().unwrap()) as usize;
        if count > MAX_COUNTERS
            || rows > MAX_ROWS
            || width > ROW_WIDTH
            || (rows > 0 && width > count)
            || rows_offset(count) + rows * width * 8 > self.len
        {
            return None;
        }
        let text = |b: &[u8]| String::from_utf8_lossy(b.split(|&c| c == 0).next().unwrap_or(&[])).into_owned();
        let label = text(self.bytes(16, LABEL_BYTES));
        let mut counters: Vec<(String, u64)> = (0..count)
            .map(|i| {
                let at = HEADER_BYTES + i * ENTRY_BYTES;
                (text(self.bytes(at, NAME_BYTES)), word(at + NAME_BYTES))
            })
            .collect();
        for r in 0..rows {
            for (i, c) in counters.iter_mut().enumerate().take(width) {
                c.1 = c.1.wrapping_add(word(rows_offset(count) + (r * width + i) * 8));
            }
        }
        Some(Snapshot { pid, label, counters })
    }
}

impl Drop for StatsView {
    fn drop(&mut self) {
        // SAFETY: the mapping made in map(), unused once the view is dropped.
        let _ = unsafe { mm::munmap(self.ptr as *mut std::ffi::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_sees_the_owners_counters() {
        let page = StatsPage::create("via_lo", &["sent", "received"], 0).unwrap();
        page.add(0, 5);
        page.add(1, 7);
        page.add(1, 1);
        page.add(9, 1); // out of range: ignored
        let fd = page.fd().try_clone_to_owned().unwrap();
        let view = StatsView::map(fd).unwrap();
        let snap = view.snapshot().unwrap();
        assert_eq!(snap.pid, std::process::id());
        assert_eq!(snap.label, "via_lo");
        assert_eq!(snap.counters, vec![("sent".to_string(), 5), ("received".to_string(), 8)]);
        page.add(0, 1);
        assert_eq!(view.snapshot().unwrap().counters[0].1, 6);
    }

    #[test]
    fn the_reader_adds_every_rows_column_to_its_counter() {
        let names: Vec<String> = (0..ROW_WIDTH + 2).map(|i| format!("c{i}")).collect();
        let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        let page = StatsPage::create("via_lo", &names, 3).unwrap();
        page.add(0, 1);
        page.add(ROW_WIDTH + 1, 4);
        // SAFETY: this thread is the only writer.
        unsafe {
            page.add_to_row(0, 0, 10);
            page.add_to_row(2, 0, 100);
            page.add_to_row(1, ROW_WIDTH - 1, 7);
            page.add_to_row(1, ROW_WIDTH - 1, 1);
            page.add_to_row(3, 0, 1000); // no such row: ignored
            page.add_to_row(0, ROW_WIDTH, 1000); // no such column: ignored
        }
        let view = StatsView::map(page.fd().try_clone_to_owned().unwrap()).unwrap();
        let snap = view.snapshot().unwrap();
        let value = |n: &str| snap.counters.iter().find(|c| c.0 == n).unwrap().1;
        assert_eq!(value("c0"), 111);
        assert_eq!(value(&format!("c{}", ROW_WIDTH - 1)), 8);
        assert_eq!(value(&format!("c{}", ROW_WIDTH)), 0);
        assert_eq!(value(&format!("c{}", ROW_WIDTH + 1)), 4);
    }

    #[test]
    fn bad_pages_are_refused() {
        assert!(StatsPage::create("x", &["a-name-that-is-far-too-long-for-a-counter"], 0).is_err());
        assert!(StatsPage::create("x", &["a", "b"], 1).is_err(), "rows wider than the counters");
        assert!(StatsPage::create("x", &["a"; ROW_WIDTH], MAX_ROWS + 1).is_err());
        // An unsealed memfd is refused.
        let fd = fs::memfd_create("x", fs::MemfdFlags::CLOEXEC).unwrap();
        assert!(StatsView::map(fd).is_err());
    }
}
