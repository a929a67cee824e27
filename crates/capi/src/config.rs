//! `memlend_config`: the caller's struct, read by its `struct_size`, checked
//! and turned into a placement and a region config.

use crate::text;
use memlend_borrow::Placement;
use memlend_store::PAGE_SIZE;
use std::ffi::{c_char, CStr, OsStr};
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// Pages evicted per batch when the config says 0.
const DEFAULT_EVICT_BATCH_PAGES: usize = 32;

/// A config larger than this is garbage, not a newer header.
const STRUCT_SIZE_MAX: usize = 4096;

/// Version 1 of the struct, on LP64: a caller built against that header
/// passes this many bytes, and the fields after them keep their defaults.
const V1_BYTES: usize = 56;

/// As in `include/memlend.h`. Version 2 (64 bytes on LP64) adds `layers`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct memlend_config {
    pub struct_size: u32,
    pub insecure: u32,
    pub size_bytes: u64,
    pub budget_bytes: u64,
    pub donors: *const c_char,
    pub ssd_path: *const c_char,
    pub key_path: *const c_char,
    pub evict_batch_pages: u32,
    pub flags: u32,
    pub layers: *const c_char,
}

impl Default for memlend_config {
    fn default() -> Self {
        memlend_config {
            struct_size: std::mem::size_of::<memlend_config>() as u32,
            insecure: 0,
            size_bytes: 0,
            budget_bytes: 0,
            donors: std::ptr::null(),
            ssd_path: std::ptr::null(),
            key_path: std::ptr::null(),
            evict_batch_pages: 0,
            flags: 0,
            layers: std::ptr::null(),
        }
    }
}

/// A checked config.
#[derive(Debug)]
pub struct Settings {
    pub size_bytes: usize,
    pub budget_pages: usize,
    pub evict_batch_pages: usize,
    pub placement: Placement,
}

/// Read and check the caller's config.
///
/// # Safety
/// `cfg` is NULL or points to at least `(*cfg).struct_size` readable bytes
/// laid out as `memlend_config`, whose strings are NULL or NUL-terminated.
pub unsafe fn read(cfg: *const memlend_config) -> Result<Settings, String> {
    if cfg.is_null() {
        return Err("config is NULL".into());
    }
    // SAFETY: non-NULL; every version starts with the u32 struct_size.
    let size = unsafe { std::ptr::addr_of!((*cfg).struct_size).read() } as usize;
    let ours = std::mem::size_of::<memlend_config>();
    if size < V1_BYTES {
        return Err(format!(
            "config struct_size is {size}, expected {ours}: call memlend_config_init() first"
        ));
    }
    if size > STRUCT_SIZE_MAX {
        return Err(format!(
            "config struct_size is {size}: not a memlend_config (call memlend_config_init() first)"
        ));
    }
    if size > ours {
        // A newer header: fine as long as the fields this library does not
        // know are left at zero (their defaults).
        // SAFETY: the caller promised `size` readable bytes at `cfg`.
        let tail = unsafe { std::slice::from_raw_parts(cfg.cast::<u8>().add(ours), size - ours) };
        if tail.iter().any(|&b| b != 0) {
            return Err(format!(
                "config sets fields this library (memlend {}) does not know; link a newer libmemlend",
                env!("CARGO_PKG_VERSION")
            ));
        }
    }
    // An older caller's struct is a prefix of ours: the rest keeps the
    // defaults.
    let mut c = memlend_config::default();
    // SAFETY: `min(size, ours)` bytes are readable at `cfg` (checked above)
    // and writable at `c`; the two do not overlap; every field is an integer
    // or a pointer, so any bytes the caller wrote are a valid value.
    unsafe {
        std::ptr::copy_nonoverlapping(cfg.cast::<u8>(), (&raw mut c).cast::<u8>(), size.min(ours))
    };
    c.struct_size = ours as u32;
    // SAFETY: the caller's promise: each string is NULL or NUL-terminated.
    let (donors, ssd, key, layers) = unsafe {
        (text::read(c.donors), text::read(c.ssd_path), text::read(c.key_path), text::read(c.layers))
    };
    let mut settings = check(&c, donors, ssd, key)?;
    settings.placement.layers = parse_layers(layers)?;
    Ok(settings)
}

/// NULL or "" is no layer; else a spec such as "checksum,stats".
fn parse_layers(spec: Option<&CStr>) -> Result<memlend_store::layer::Stack, String> {
    let Some(spec) = spec else { return Ok(Default::default()) };
    let spec = spec.to_str().map_err(|_| "layers is not UTF-8".to_string())?;
    spec.parse().map_err(|e| format!("layers: {e}"))
}

fn check(
    c: &memlend_config,
    donors: Option<&CStr>,
    ssd: Option<&CStr>,
    key: Option<&CStr>,
) -> Result<Settings, String> {
    if c.flags != 0 {
        return Err(format!("config flags {:#x}: no flags are defined, pass 0", c.flags));
    }
    if c.size_bytes == 0 {
        return Err("size_bytes is 0: a region needs at least one page (4096 bytes)".into());
    }
    let page = PAGE_SIZE as u64;
    let pages = c.size_bytes.div_ceil(page);
    if pages > u64::from(u32::MAX) {
        return Err(format!("size_bytes {} is over 2^32 pages (16 TiB)", c.size_bytes));
    }
    let budget_pages = c.budget_bytes / page;
    if budget_pages == 0 {
        return Err(format!(
            "budget_bytes is {}: the budget (memory kept resident) must be at least one page ({PAGE_SIZE} bytes)",
            c.budget_bytes
        ));
    }
    // A budget above the size is allowed (everything stays local).
    let budget_pages = budget_pages.min(pages) as usize;
    let evict_batch_pages = match c.evict_batch_pages as usize {
        0 => DEFAULT_EVICT_BATCH_PAGES.min(budget_pages),
        n if n > budget_pages => {
            return Err(format!(
                "evict_batch_pages {n} is more than the budget ({budget_pages} pages)"
            ))
        }
        n => n,
    };
    let donors = match donors {
        Some(list) => parse_donors(list)?,
        None => Vec::new(),
    };
    let path = |s: &CStr| PathBuf::from(OsStr::from_bytes(s.to_bytes()));
    if !donors.is_empty() && ssd.is_some() {
        return Err("give donors or ssd_path, not both".into());
    }
    if donors.is_empty() && (key.is_some() || c.insecure != 0) {
        // Not an error in itself, but a sign of a config mix-up: say so.
        tracing::warn!("key_path/insecure are for donors; no donor is named, pages go to SSD");
    }
    // Fields added to Placement later keep their defaults.
    #[allow(clippy::needless_update)]
    let placement = Placement {
        donors,
        ssd: ssd.map(path),
        key: key.map(path),
        insecure: c.insecure != 0,
        ..Placement::default()
    };
    Ok(Settings { size_bytes: (pages * page) as usize, budget_pages, evict_batch_pages, placement })
}

/// "host:port,host:port" (spaces around entries are fine); each host is
/// resolved now, and its first address used.
fn parse_donors(list: &CStr) -> Result<Vec<SocketAddr>, String> {
    let list = list.to_str().map_err(|_| "donors is not UTF-8".to_string())?;
    let mut out = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let addr = entry
            .to_socket_addrs()
            .map_err(|e| format!("donor \"{entry}\": not a reachable host:port ({e})"))?
            .next()
            .ok_or_else(|| format!("donor \"{entry}\": the name has no address"))?;
        out.push(addr);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(size: u64, budget: u64) -> memlend_config {
        memlend_config { size_bytes: size, budget_bytes: budget, ..memlend_config::default() }
    }

    fn err(c: &memlend_config, donors: Option<&CStr>) -> String {
        check(c, donors, None, None).unwrap_err()
    }

    #[test]
    fn v2_is_64_bytes_and_v1_its_prefix() {
        assert_eq!(std::mem::size_of::<memlend_config>(), 64);
        assert_eq!(std::mem::offset_of!(memlend_config, layers), V1_BYTES);
    }

    #[test]
    fn a_version_1_caller_gets_no_layers_and_a_v2_caller_the_ones_it_names() {
        let mut c = cfg(1 << 20, 8192);
        c.layers = c"checksum,stats".as_ptr();
        // SAFETY: `c` is a whole memlend_config whose strings are NUL-terminated.
        let s = unsafe { read(&c) }.unwrap();
        assert_eq!(s.placement.layers.to_string(), "checksum,stats");
        c.struct_size = V1_BYTES as u32;
        // SAFETY: as above; only the first 56 bytes are read.
        let s = unsafe { read(&c) }.unwrap();
        assert!(s.placement.layers.is_empty(), "a v1 struct has no layers field");
        c.struct_size = (V1_BYTES - 8) as u32;
        // SAFETY: as above.
        assert!(unsafe { read(&c) }.unwrap_err().contains("memlend_config_init"));
        c.struct_size = std::mem::size_of::<memlend_config>() as u32;
        c.layers = c"checksum,gzip".as_ptr();
        // SAFETY: as above.
        let e = unsafe { read(&c) }.unwrap_err();
        assert!(e.contains("layers:") && e.contains("\"gzip\" is not a layer"), "{e}");
    }

    #[test]
    fn sizes_round_to_pages_and_zero_budgets_are_refused() {
        let s = check(&cfg(10_000, 8192), None, None, None).unwrap();
        assert_eq!((s.size_bytes, s.budget_pages, s.evict_batch_pages), (12288, 2, 2));
        let s = check(&cfg(1 << 20, 1 << 30), None, None, None).unwrap();
        assert_eq!((s.budget_pages, s.evict_batch_pages), (256, 32));
        assert!(err(&cfg(1 << 20, 0), None).contains("budget_bytes is 0"));
        assert!(err(&cfg(1 << 20, 4095), None).contains("at least one page"));
        assert!(err(&cfg(0, 4096), None).contains("size_bytes is 0"));
        let big = memlend_config { evict_batch_pages: 3, ..cfg(1 << 20, 8192) };
        assert!(err(&big, None).contains("evict_batch_pages 3"));
        let flags = memlend_config { flags: 1, ..cfg(1 << 20, 8192) };
        assert!(err(&flags, None).contains("flags"));
    }

    #[test]
    fn donor_lists_parse_and_bad_entries_are_named() {
        let s = check(&cfg(1 << 20, 8192), Some(c" 127.0.0.1:7070, localhost:7071,"), None, None)
            .unwrap();
        assert_eq!(s.placement.donors.len(), 2);
        assert_eq!(s.placement.donors[0].to_string(), "127.0.0.1:7070");
        assert!(err(&cfg(1 << 20, 8192), Some(c"nonsense")).contains("\"nonsense\""));
        let both = check(&cfg(1 << 20, 8192), Some(c"127.0.0.1:1"), Some(c"/tmp"), None);
        assert!(both.unwrap_err().contains("not both"));
    }

    #[test]
    fn struct_size_is_checked() {
        let mut c = cfg(1 << 20, 8192);
        c.struct_size = 0;
        // SAFETY: `c` is a whole memlend_config.
        let e = unsafe { read(&c) }.unwrap_err();
        assert!(e.contains("memlend_config_init"), "{e}");
        // SAFETY: NULL is allowed.
        assert!(unsafe { read(std::ptr::null()) }.unwrap_err().contains("NULL"));
        #[repr(C)]
        struct Newer {
            c: memlend_config,
            extra: u64,
        }
        let mut n = Newer { c: cfg(1 << 20, 8192), extra: 0 };
        n.c.struct_size = std::mem::size_of::<Newer>() as u32;
        // SAFETY: `n` has `struct_size` bytes.
        assert!(unsafe { read((&raw const n).cast()) }.is_ok());
        n.extra = 1;
        // SAFETY: as above.
        assert!(unsafe { read((&raw const n).cast()) }.unwrap_err().contains("does not know"));
    }
}
