//! Helpers for laying out structures inside a shared mapping.

use std::ops::Deref;

/// A value alone on its own 64-byte cache line, so that words written by
/// different processes never share a line.
#[repr(C, align(64))]
pub(crate) struct CacheLine<T>(pub(crate) T);

impl<T> Deref for CacheLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Rounds `n` up to a multiple of `align`.
pub(crate) const fn align_up(n: usize, align: usize) -> usize {
    n.div_ceil(align) * align
}

/// A reference to the `T` at `base + offset`.
///
/// # Safety
/// The bytes must lie inside a live mapping that outlives `'a`, be aligned
/// for `T`, and `T` must be valid for any bit pattern and only mutated
/// through interior mutability (atomics).
pub(crate) unsafe fn at<'a, T>(base: *mut u8, offset: usize) -> &'a T {
    &*base.add(offset).cast::<T>()
}
