//! The kernel's answers that `evict/mod.rs` relies on, checked against the
//! running kernel rather than assumed.

use super::*;
use crate::kernel::mem::Mapping;
use memlend_store::PAGE_SIZE;

/// Pages 0, 1 and 3 of a 4-page source hold their index + 1; page 2 is a hole.
pub(crate) fn source_with_hole() -> Mapping {
    let src = Mapping::new(4).unwrap();
    for page in [0usize, 1, 3] {
        // SAFETY: the page lies inside `src`, a live private mapping of ours
        // that no one else uses, and it is writable.
        unsafe { *((src.addr() + page * PAGE_SIZE) as *mut u8) = page as u8 + 1 };
    }
    src
}

#[test]
fn a_run_move_stops_at_a_hole_and_says_how_far_it_got() {
    let src = source_with_hole();
    let dst = Mapping::new(4).unwrap();
    let uffd = Uffd::open_staging().unwrap();
    uffd.register(dst.addr(), dst.len_bytes(), false).unwrap();

    let (moved, result) = uffd.move_run(dst.addr(), src.addr(), 4 * PAGE_SIZE);
    assert_eq!(moved, 2 * PAGE_SIZE, "the two pages before the hole moved");
    assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::EAGAIN));
    assert_eq!(dst.present_pages(0, 2)[PAGE_SIZE], 2, "page 1 arrived whole");

    // Restarted at the hole, the run fails at once with the hole's own error.
    let at_hole = 2 * PAGE_SIZE;
    let (moved, result) = uffd.move_run(dst.addr() + at_hole, src.addr() + at_hole, 2 * PAGE_SIZE);
    assert_eq!(moved, 0);
    assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::ENOENT));

    let tail = 3 * PAGE_SIZE;
    let (moved, result) = uffd.move_run(dst.addr() + tail, src.addr() + tail, PAGE_SIZE);
    assert_eq!((moved, result.is_ok()), (PAGE_SIZE, true));
    assert_eq!(dst.present_pages(3, 1)[0], 4);
    uffd.unregister(dst.addr(), dst.len_bytes()).unwrap();
}
