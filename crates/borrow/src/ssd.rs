//! Pages in a local file. The file is unlinked as soon as it is open, so it
//! goes away with the process however that ends; a block device is used
//! whole and exclusively.
//!
//! A file's pages are placed by `append`: write-backs of scattered pages
//! reach the disk as whole 64 KiB chunks, so reads do not queue behind a
//! 4 KiB write per page. The file has `append::HEADROOM` slots per page
//! (sparse: the disk holds only slots written).

use crate::{Opened, DEFAULT_MAX_PAGES};
use anyhow::{bail, Context, Result};
use memlend_store::file::{FileOptions, FileStore};
use memlend_store::layer::append;
use memlend_store::{PageStore, StoreError, PAGE_SIZE};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::sync::Arc;

/// Of the free space on the file system, the share a default-sized store
/// may grow into: the rest is left for everyone else.
const FREE_SPACE_SHARE_PCT: u64 = 80;

pub fn open(path: &Path, pages: Option<u64>) -> Result<Opened> {
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_block_device() => open_device(path, pages),
        Ok(m) if m.is_dir() => {
            let file = path.join(format!("memlend-{}-{}.pages", std::process::id(), nonce()));
            create(&file, pages)
        }
        // Never truncate a file that is already there: it may be someone's.
        Ok(_) => bail!("{} exists; give a new path, a directory or a block device", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(path, pages),
        Err(e) => Err(e).with_context(|| format!("cannot use {}", path.display())),
    }
}

fn create(path: &Path, pages: Option<u64>) -> Result<Opened> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let room = free_pages(dir)? * FREE_SPACE_SHARE_PCT / 100;
    let pages = match pages {
        Some(p) if append::slots_for(p) > room => {
            tracing::warn!(
                "{}: {p} pages asked, which may take {} pages of disk; {room} fit in the free space; writes past that fail",
                path.display(),
                append::slots_for(p)
            );
            p
        }
        Some(p) => p,
        None => (room / append::HEADROOM).min(DEFAULT_MAX_PAGES),
    };
    if pages == 0 {
        bail!("{} has no free space for pages", dir.display());
    }
    let file = create_direct(path, append::slots_for(pages))?;
    // The open descriptor keeps the file; the name would only be left behind.
    std::fs::remove_file(path).with_context(|| format!("cannot unlink {}", path.display()))?;
    let store = append::Append::new(file, pages)?;
    let describe = format!("file {} (unlinked)", path.display());
    Ok(Opened::new(Arc::new(store), pages, describe, Default::default()))
}

/// O_DIRECT, so the pages sit on the disk and not in the page cache: a
/// buffered file would hand the memory we saved straight back to the
/// kernel's cache (measured: a 4 GiB region on 1 GiB local grew the cache by
/// 4 GiB). Where the file system refuses O_DIRECT (tmpfs), buffered, said.
fn create_direct(path: &Path, pages: u64) -> Result<FileStore> {
    let direct = FileOptions { direct: true };
    match FileStore::create(path, pages, direct) {
        Ok(store) => Ok(store),
        Err(StoreError::Unavailable(why)) => {
            tracing::warn!("{why}; using the page cache, which costs local memory");
            FileStore::create(path, pages, FileOptions::default())
                .with_context(|| format!("cannot create {}", path.display()))
        }
        Err(e) => Err(e).with_context(|| format!("cannot create {}", path.display())),
    }
}

/// A device is laid out by `append` as a file is, when it has room for
/// the headroom: by default it serves half its capacity; a size that
/// leaves no room gets the plain layout (page `p` at `p * 4096`), said.
fn open_device(path: &Path, pages: Option<u64>) -> Result<Opened> {
    let whole = FileStore::open(path, None, FileOptions { direct: true })
        .with_context(|| format!("cannot open {}", path.display()))?;
    let capacity = whole.info().pages;
    let pages = pages.unwrap_or(capacity / append::HEADROOM);
    let describe = format!("device {}", path.display());
    if pages == 0 || append::slots_for(pages) > capacity {
        tracing::warn!(
            "{}: {pages} pages leave no room for append's headroom ({} slots, {capacity} there): writes go down page by page",
            path.display(),
            append::slots_for(pages)
        );
        drop(whole);
        let len_bytes = Some(pages * PAGE_SIZE as u64);
        let store = FileStore::open(path, len_bytes, FileOptions { direct: true })
            .with_context(|| format!("cannot open {}", path.display()))?;
        let pages = store.info().pages;
        return Ok(Opened::new(Arc::new(store), pages, describe, Default::default()));
    }
    let store = append::Append::new(whole, pages)?;
    Ok(Opened::new(Arc::new(store), pages, describe, Default::default()))
}

fn free_pages(dir: &Path) -> Result<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    // SAFETY: `c` is a NUL-terminated path; statvfs writes only into `st`.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(e).with_context(|| format!("cannot stat {}", dir.display()));
    }
    Ok(st.f_bavail * st.f_frsize / PAGE_SIZE as u64)
}

fn nonce() -> u32 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    t.map(|d| d.subsec_nanos()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_gets_a_fresh_file_that_leaves_no_name_behind() {
        let dir = tempfile::tempdir().unwrap();
        let opened = open(dir.path(), Some(256)).unwrap();
        assert_eq!(opened.pages, 256);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let data = vec![7u8; PAGE_SIZE];
        opened.store.write(&[memlend_store::WriteOp { page: 255, data: &data }]).unwrap();
        let mut back = vec![0u8; PAGE_SIZE];
        opened.store.read(&mut [memlend_store::ReadOp { page: 255, buf: &mut back }]).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn an_existing_file_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("someones");
        std::fs::write(&path, b"keep me").unwrap();
        let err = open(&path, Some(1)).err().unwrap().to_string();
        assert!(err.contains("exists"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
    }

    #[test]
    fn the_default_size_fits_the_free_space() {
        let dir = tempfile::tempdir().unwrap();
        let opened = open(&dir.path().join("new"), None).unwrap();
        assert!(opened.pages > 0 && opened.pages <= DEFAULT_MAX_PAGES);
        assert!(opened.pages <= free_pages(dir.path()).unwrap());
    }

    fn round_trip(opened: &Opened) {
        let last = opened.pages - 1;
        let data: Vec<u8> = (0..PAGE_SIZE).map(|i| (i % 251) as u8).collect();
        opened.store.write(&[memlend_store::WriteOp { page: last, data: &data }]).unwrap();
        let mut back = vec![0u8; PAGE_SIZE];
        opened.store.read(&mut [memlend_store::ReadOp { page: last, buf: &mut back }]).unwrap();
        assert_eq!(back, data);
    }

    /// A device serves half its capacity through `append` by default, and a
    /// size that leaves no room for the headroom gets the plain layout.
    #[test]
    fn a_device_is_laid_out_by_append_where_it_has_the_room() {
        let dir = tempfile::tempdir().unwrap();
        let backing = dir.path().join("backing");
        std::fs::File::create(&backing).unwrap().set_len(64 * PAGE_SIZE as u64).unwrap();
        let out =
            std::process::Command::new("losetup").args(["--find", "--show"]).arg(&backing).output();
        let dev = match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
            _ => {
                memlend_testskip::skip("cannot attach a loop device here");
                return;
            }
        };
        let detach = || drop(std::process::Command::new("losetup").args(["-d", &dev]).status());
        let result = std::panic::catch_unwind(|| {
            let half = open(Path::new(&dev), None).unwrap();
            assert_eq!(half.pages, 32);
            assert!(half.store.info().name.starts_with("append("), "{}", half.store.info().name);
            round_trip(&half);
            drop(half);
            let most = open(Path::new(&dev), Some(40)).unwrap();
            assert_eq!(most.pages, 40);
            assert!(!most.store.info().name.starts_with("append("));
            round_trip(&most);
        });
        detach();
        result.unwrap();
    }
}
