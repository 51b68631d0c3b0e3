//! The global allocator of the `tollgate` binary and of `examples/bare_pingora` (feature
//! `mimalloc`, on by default): mimalloc, called as C's `malloc` is for the layouts `malloc`
//! already serves.
//!
//! The `mimalloc` crate's `GlobalAlloc` hands every layout to `mi_malloc_aligned`. mimalloc v3
//! takes its plain path there only when the first free block of the size class happens to be
//! aligned, and otherwise a generic path that over-allocates. Yet every block `mi_malloc`
//! returns is aligned as C requires of `malloc` (`max_align_t`, `MI_MAX_ALIGN_SIZE`: 16 bytes
//! on 64-bit targets; 8 for the 8-byte size class, which only layouts of at most 8 bytes use).
//! So a layout whose alignment is at most 16 and at most its size goes to `mi_malloc`,
//! `mi_zalloc` and `mi_realloc`, the rule Rust's `System` allocator applies to glibc's
//! `malloc`; any other layout keeps the aligned calls. An open pull request to the `mimalloc`
//! crate proposes the same. A proxied request makes about 76 allocations; callgrind counted
//! 2.2k fewer instructions per request with this, in bare Pingora and in tollgate alike
//! (`loadtest/log/2026-11-26-four-framework-cuts.md`).
//!
//! Not a module of the library, which forbids `unsafe`: `main.rs` declares it, and the example
//! includes the same file.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment of every block `mi_malloc` returns for more than 8 bytes (mimalloc's
/// `MI_MAX_ALIGN_SIZE` on 64-bit targets).
const MALLOC_ALIGN: usize = 16;

const _: () = assert!(
    usize::BITS == 64,
    "MALLOC_ALIGN is mimalloc's on 64-bit targets"
);

/// mimalloc through its plain calls where their alignment suffices.
pub struct MiMalloc;

/// Whether `mi_malloc` (or `mi_zalloc`, `mi_realloc`) of `size` bytes is aligned to `align`.
#[inline]
fn malloc_suffices(align: usize, size: usize) -> bool {
    align <= MALLOC_ALIGN && align <= size
}

/// `plain(size)` where its alignment suffices for `layout`, else `aligned(size, align)`: a pair
/// of mimalloc's allocation calls (`mi_malloc` and `mi_malloc_aligned`, or the `zalloc` ones).
#[inline(always)]
unsafe fn allocate(
    layout: Layout,
    plain: unsafe extern "C" fn(usize) -> *mut c_void,
    aligned: unsafe extern "C" fn(usize, usize) -> *mut c_void,
) -> *mut u8 {
    let (size, align) = (layout.size(), layout.align());
    let p = if malloc_suffices(align, size) {
        unsafe { plain(size) }
    } else {
        unsafe { aligned(size, align) }
    };
    p.cast()
}

// SAFETY: every call is mimalloc's, which returns null on failure and blocks aligned as
// `malloc_suffices` says (above); `dealloc` and `realloc` receive only pointers from it.
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe { allocate(layout, mi::mi_malloc, mi::mi_malloc_aligned) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        unsafe { allocate(layout, mi::mi_zalloc, mi::mi_zalloc_aligned) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let (ptr, align) = (ptr.cast::<c_void>(), layout.align());
        let p = if malloc_suffices(align, new_size) {
            unsafe { mi::mi_realloc(ptr, new_size) }
        } else {
            unsafe { mi::mi_realloc_aligned(ptr, new_size, align) }
        };
        p.cast()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes around mimalloc's size classes (8-byte, 16-byte grained, then four per power of
    /// two), its small-object limit and beyond.
    fn sizes() -> Vec<usize> {
        let mut s: Vec<usize> = (1..=300).collect();
        s.extend([
            500,
            512,
            640,
            1000,
            1024,
            1100,
            4096,
            5000,
            8704,
            65_536,
            70_000,
            1 << 20,
        ]);
        s
    }

    #[test]
    fn every_layout_gets_a_block_aligned_as_asked_and_usable_whole() {
        let a = MiMalloc;
        for align in [1, 2, 4, 8, 16, 32, 64, 128, 4096] {
            // Many live blocks per layout, so that they come from several places in a page.
            let mut live = Vec::new();
            for &size in &sizes() {
                let layout = Layout::from_size_align(size, align).expect("layout");
                for round in 0..8u8 {
                    let zeroed = round % 2 == 0;
                    let p = unsafe {
                        if zeroed {
                            a.alloc_zeroed(layout)
                        } else {
                            a.alloc(layout)
                        }
                    };
                    assert!(!p.is_null(), "{size} bytes, align {align}");
                    assert_eq!(p as usize % align, 0, "{size} bytes, align {align}");
                    let block = unsafe { std::slice::from_raw_parts_mut(p, size) };
                    if zeroed {
                        assert!(block.iter().all(|&b| b == 0), "{size}, {align}");
                    }
                    block.fill(round);
                    live.push((p, layout, round));
                }
            }
            for (p, layout, round) in live {
                let block = unsafe { std::slice::from_raw_parts(p, layout.size()) };
                assert!(block.iter().all(|&b| b == round), "{layout:?} overwritten");
                unsafe { a.dealloc(p, layout) };
            }
        }
    }

    #[test]
    fn a_reallocated_block_keeps_its_bytes_and_its_alignment() {
        let a = MiMalloc;
        for align in [1, 8, 16, 64] {
            for (from, to) in [
                (8, 24),
                (24, 48),
                (48, 16),
                (100, 5000),
                (5000, 40),
                (16, 1 << 20),
            ] {
                let layout = Layout::from_size_align(from, align).expect("layout");
                let p = unsafe { a.alloc(layout) };
                let fill: Vec<u8> = (0..from).map(|i| i as u8).collect();
                unsafe { std::ptr::copy_nonoverlapping(fill.as_ptr(), p, from) };
                let q = unsafe { a.realloc(p, layout, to) };
                assert!(!q.is_null());
                assert_eq!(q as usize % align, 0, "{from} → {to}, align {align}");
                let kept = from.min(to);
                let block = unsafe { std::slice::from_raw_parts(q, kept) };
                assert_eq!(block, &fill[..kept], "{from} → {to}, align {align}");
                let new_layout = Layout::from_size_align(to, align).expect("layout");
                unsafe { a.dealloc(q, new_layout) };
            }
        }
    }
}
