//! The C ABI: `include/memlend.h`, built as `libmemlend.so` (and
//! `libmemlend.a`). Python's `memlend` module is ctypes over the same library.
//!
//! The rules every exported function keeps:
//! - it never unwinds into C: a panic becomes an error return;
//! - it checks every pointer for NULL and every struct for its `struct_size`;
//! - a region handle is an id, not a pointer: the library looks it up in a
//!   table of live regions, so a handle that was never created, or was
//!   destroyed already, is an error (`-EBADF`, NULL or 0), never a wild read;
//! - it returns 0 or a negative errno; constructors return NULL and write a
//!   message into the caller's buffer.
//!
//! The `unsafe` code is the pointer edge, in this file and in `config.rs`
//! (reading the caller's config) and `text.rs` (C strings in and out).

#![allow(non_camel_case_types)]

mod config;
mod handles;
mod text;

use config::Settings;
use handles::Handle;
use memlend_fault::{DetailedStats, FaultError, Region, RegionConfig, RegionStats};
use memlend_remote::ClientError;
use memlend_store::PAGE_SIZE;
use memlend_wire::page::Status;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub use config::memlend_config;

/// The ABI version in `MEMLEND_API_VERSION`: bumped when a change breaks
/// callers built against an older header. Growing a struct (with its
/// `struct_size`) or adding a function does not bump it.
pub const API_VERSION: u32 = 1;

/// Opaque region handle for C: an id in the live table, never dereferenced.
pub struct memlend_region {
    _private: [u8; 0],
}

/// Region counters, as in `memlend_stats` in the header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct memlend_stats {
    /// In: `sizeof(memlend_stats)` as the caller knows it. Out: the bytes
    /// the library filled.
    pub struct_size: u32,
    pub reserved: u32,
    pub page_size: u64,
    pub region_pages: u64,
    pub budget_pages: u64,
    pub faults_zero_filled: u64,
    pub faults_from_store: u64,
    pub faults_already_mapped: u64,
    pub eviction_batches: u64,
    pub pages_written_back: u64,
    pub pages_zero_dropped: u64,
    pub pages_clean_dropped: u64,
    pub faults_write_protect: u64,
    pub pages_poisoned: u64,
    pub pages_resident: u64,
    pub remove_events: u64,
    pub unmap_events: u64,
    pub remap_events: u64,
    pub pages_discarded: u64,
    pub store_discard_failures: u64,
    pub faults_deferred: u64,
}

/// Run `f`, turning a panic into `on_panic`: nothing unwinds into C.
fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(on_panic)
}

fn errno(e: c_int) -> c_int {
    -e
}

/// Fill `*cfg` with the defaults and `struct_size`. Call it before setting
/// any field, so that fields added later start at their defaults.
///
/// # Safety
/// `cfg` is NULL (ignored) or points to writable memory of
/// `sizeof(memlend_config)` bytes.
#[no_mangle]
pub unsafe extern "C" fn memlend_config_init(cfg: *mut memlend_config) {
    guard((), || {
        if cfg.is_null() {
            return;
        }
        // SAFETY: non-NULL, and the caller promises room for a whole
        // memlend_config; `write` does not read the old contents.
        unsafe { cfg.write(memlend_config::default()) };
    })
}

/// Create a region as `cfg` says. NULL on failure, with the reason in
/// `err` (NUL-terminated, cut to `err_len`; `err` may be NULL).
///
/// # Safety
/// `cfg` is NULL or points to a `memlend_config` of at least its
/// `struct_size` bytes, whose strings are NULL or NUL-terminated; `err` is
/// NULL or writable for `err_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn memlend_region_create(
    cfg: *const memlend_config,
    err: *mut c_char,
    err_len: usize,
) -> *mut memlend_region {
    let made = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the caller's promise on `cfg`, passed through.
        let settings = unsafe { config::read(cfg) }?;
        create(settings)
    }));
    let msg = match made {
        Ok(Ok(id)) => {
            // SAFETY: the caller's promise on `err`/`err_len`.
            unsafe { text::write(err, err_len, "") };
            return id as *mut memlend_region;
        }
        Ok(Err(msg)) => msg,
        Err(_) => "internal error: memlend panicked while creating the region".to_string(),
    };
    // SAFETY: the caller's promise on `err`/`err_len`.
    unsafe { text::write(err, err_len, &msg) };
    std::ptr::null_mut()
}

fn create(s: Settings) -> Result<usize, String> {
    logging();
    let pages = s.size_bytes / PAGE_SIZE;
    let opened = s.placement.open(Some(pages as u64)).map_err(|e| {
        format!("cannot place the region's pages: {}{}", chain(&e), hint(&e, &s.placement))
    })?;
    // Fields added to RegionConfig later keep their defaults.
    #[allow(clippy::needless_update)]
    let cfg = RegionConfig {
        size_bytes: s.size_bytes,
        budget_pages: s.budget_pages,
        evict_batch_pages: s.evict_batch_pages,
        ..RegionConfig::default()
    };
    let region = Region::new(cfg, opened.store).map_err(|e| {
        let why = match &e {
            FaultError::Os { source, .. }
                if matches!(source.raw_os_error(), Some(libc::EPERM | libc::EACCES)) =>
            {
                " (userfaultfd needs root or CAP_SYS_PTRACE, vm.unprivileged_userfaultfd=1, \
                 or read-write access to /dev/userfaultfd)"
            }
            _ => "",
        };
        format!("cannot create the region ({}): {e}{why}", opened.describe)
    })?;
    dont_fork(&region);
    tracing::debug!(
        "region of {} pages, budget {}, pages on {}",
        pages,
        s.budget_pages,
        opened.describe
    );
    Ok(handles::insert(Handle {
        region,
        budget_pages: s.budget_pages as u64,
        describe: opened.describe,
        pid: std::process::id(),
    }))
}

/// An error and its causes, "a: b: c", leaving out a cause that the
/// message before it already quotes (many errors print their source too).
fn chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}

/// What to do about an error whose own words are terse.
fn hint(e: &anyhow::Error, p: &memlend_borrow::Placement) -> String {
    let refused = e.chain().find_map(|c| c.downcast_ref::<ClientError>());
    match (refused, &p.key) {
        (Some(ClientError::Refused(Status::AuthFailed)), Some(key)) => format!(
            " (wrong key: the donor did not accept the key in {}; key_path must name the donor's cluster key)",
            key.display()
        ),
        (Some(ClientError::Refused(Status::AuthFailed)), None) => {
            " (the donor has a cluster key: set key_path to it)".to_string()
        }
        _ => String::new(),
    }
}

/// A forked child has no handler thread and no userfaultfd of its own: it
/// would read zeroes where pages are far. With MADV_DONTFORK the region is
/// not in the child at all, so a stray touch is a SIGSEGV, not wrong data.
fn dont_fork(region: &Region) {
    // SAFETY: the range is the region's own mapping, alive while `region`
    // is; MADV_DONTFORK changes only what fork copies.
    let rc = unsafe {
        libc::madvise(region.as_ptr().cast::<c_void>(), region.len(), libc::MADV_DONTFORK)
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!(
            "madvise(MADV_DONTFORK) on the region: {e}; a forked child must not touch it"
        );
    }
}

/// Log to stderr: `MEMLEND_LOG` (`tracing` filter syntax, e.g. `debug`, or
/// `off`), warnings by default, so a store failure says why.
fn logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_env("MEMLEND_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        // Another subscriber (a Rust host program's) wins: try_init only.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    });
}

/// Start of the region's memory; NULL for an unknown handle.
#[no_mangle]
pub extern "C" fn memlend_region_ptr(r: *const memlend_region) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        handles::get(r as usize).map_or(std::ptr::null_mut(), |h| h.region.as_ptr().cast())
    })
}

/// Length of the region in bytes (whole pages); 0 for an unknown handle.
#[no_mangle]
pub extern "C" fn memlend_region_len(r: *const memlend_region) -> usize {
    guard(0, || handles::get(r as usize).map_or(0, |h| h.region.len()))
}

/// Copy the region's counters into `*out`. 0, or -EINVAL (NULL `out`, or
/// `out->struct_size` below 8), -EBADF (unknown handle), -EIO (internal).
///
/// # Safety
/// `out` is NULL or points to writable memory of `out->struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memlend_region_stats(
    r: *const memlend_region,
    out: *mut memlend_stats,
) -> c_int {
    guard(errno(libc::EIO), || {
        if out.is_null() {
            return errno(libc::EINVAL);
        }
        // SAFETY: non-NULL; every version of the struct starts with the
        // u32 struct_size, which the caller set.
        let room = unsafe { std::ptr::addr_of!((*out).struct_size).read() } as usize;
        if room < 8 {
            return errno(libc::EINVAL);
        }
        let Some(h) = handles::get(r as usize) else { return errno(libc::EBADF) };
        let st = stats(&h);
        let ours = std::mem::size_of::<memlend_stats>();
        let n = room.min(ours);
        let filled = memlend_stats { struct_size: n as u32, ..st };
        // SAFETY: the caller promised `room` writable bytes at `out`; we
        // write `n <= room` bytes of a plain repr(C) struct of u32/u64
        // fields (no padding), then zero the caller's bytes we do not know.
        unsafe {
            let dst = out.cast::<u8>();
            std::ptr::copy_nonoverlapping((&raw const filled).cast::<u8>(), dst, n);
            if room > ours {
                std::ptr::write_bytes(dst.add(ours), 0, room - ours);
            }
        }
        0
    })
}

fn stats(h: &Handle) -> memlend_stats {
    let DetailedStats {
        basic,
        remove_events,
        unmap_events,
        remap_events,
        pages_discarded,
        store_discard_failures,
        faults_deferred,
    } = h.region.detailed_stats();
    let RegionStats {
        faults_zero_filled,
        faults_from_store,
        faults_already_mapped,
        eviction_batches,
        pages_written_back,
        pages_zero_dropped,
        pages_clean_dropped,
        faults_write_protect,
        pages_poisoned,
        pages_resident,
    } = basic;
    memlend_stats {
        struct_size: 0,
        reserved: 0,
        page_size: PAGE_SIZE as u64,
        region_pages: (h.region.len() / PAGE_SIZE) as u64,
        budget_pages: h.budget_pages,
        faults_zero_filled,
        faults_from_store,
        faults_already_mapped,
        eviction_batches,
        pages_written_back,
        pages_zero_dropped,
        pages_clean_dropped,
        faults_write_protect,
        pages_poisoned,
        pages_resident,
        remove_events,
        unmap_events,
        remap_events,
        pages_discarded,
        store_discard_failures,
        faults_deferred,
    }
}

/// Give back `len` bytes at `offset` (both whole pages, inside the
/// region): afterwards the range reads zero, holds no resident budget and
/// nothing in the store. 0; -EINVAL (not whole pages, or outside the
/// region), -EBADF (unknown handle), another -errno from madvise, -EIO.
#[no_mangle]
pub extern "C" fn memlend_region_discard(
    r: *const memlend_region,
    offset: usize,
    len: usize,
) -> c_int {
    guard(errno(libc::EIO), || {
        let Some(h) = handles::get(r as usize) else { return errno(libc::EBADF) };
        match h.region.discard(offset, len) {
            Ok(()) => 0,
            Err(FaultError::Os { source, .. }) => errno(source.raw_os_error().unwrap_or(libc::EIO)),
            Err(FaultError::Range(_) | FaultError::Config(_)) => errno(libc::EINVAL),
            #[allow(unreachable_patterns)]
            Err(_) => errno(libc::EIO),
        }
    })
}

/// Where the region's pages go, e.g. "donor 10.0.0.2:7070" or
/// "file /var/tmp/memlend-1-2.pages (unlinked)", written like snprintf:
/// returns the full length (without the NUL) even if `buf` was too small,
/// or -EBADF (unknown handle), -EIO (internal).
///
/// # Safety
/// `buf` is NULL or writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn memlend_region_placement(
    r: *const memlend_region,
    buf: *mut c_char,
    len: usize,
) -> c_int {
    guard(errno(libc::EIO), || {
        let Some(h) = handles::get(r as usize) else { return errno(libc::EBADF) };
        // SAFETY: the caller's promise on `buf`/`len`.
        unsafe { text::write(buf, len, &h.describe) };
        c_int::try_from(h.describe.len()).unwrap_or(c_int::MAX)
    })
}

/// Destroy a region: stop its handler, unmap its memory, free its pages
/// on the store. 0; NULL is a no-op (0); -EBADF for a handle that is not
/// live (destroyed twice, or never created). Nothing may touch the memory
/// afterwards.
#[no_mangle]
pub extern "C" fn memlend_region_destroy(r: *mut memlend_region) -> c_int {
    guard(errno(libc::EIO), || {
        if r.is_null() {
            return 0;
        }
        match handles::remove(r as usize) {
            // Dropped here, outside the table's lock: the join can take a
            // moment. A concurrent call holding a clone drops it last.
            Some(h) => {
                drop(h);
                0
            }
            None => errno(libc::EBADF),
        }
    })
}

/// The library's version, e.g. "0.1.0": a static string.
#[no_mangle]
pub extern "C" fn memlend_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// `MEMLEND_API_VERSION` of the library: compare with the header's.
#[no_mangle]
pub extern "C" fn memlend_api_version() -> u32 {
    API_VERSION
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_struct_has_no_padding() {
        assert_eq!(std::mem::size_of::<memlend_stats>(), 8 + 19 * 8);
    }

    #[test]
    fn auth_refusals_get_a_hint() {
        use anyhow::Context;
        let e = Err::<(), _>(ClientError::Refused(Status::AuthFailed))
            .context("cannot open")
            .unwrap_err();
        let keyed = memlend_borrow::Placement { key: Some("/k".into()), ..Default::default() };
        assert!(hint(&e, &keyed).contains("wrong key"), "{}", hint(&e, &keyed));
        assert!(hint(&e, &Default::default()).contains("set key_path"));
    }

    #[test]
    fn unknown_handles_are_refused() {
        assert!(memlend_region_ptr(12345 as *const memlend_region).is_null());
        assert_eq!(memlend_region_len(12345 as *const memlend_region), 0);
        assert_eq!(memlend_region_destroy(12345 as *mut memlend_region), -libc::EBADF);
        assert_eq!(memlend_region_destroy(std::ptr::null_mut()), 0);
    }
}
