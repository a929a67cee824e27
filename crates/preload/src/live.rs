//! Live counters for `memlend top`: every `INTERVAL` a thread writes the
//! region's counters (the exit report's JSON) to `<live dir>/<pid>.json`,
//! whole (written beside, then renamed), and the file goes at exit.
//!
//! The live directory is `/run/memlend-live` when this process may make it
//! (root; not under /run/memlend, which systemd empties when memlendd
//! stops), else `/tmp/memlend-live-<uid>` (mode 0700: no other user can put
//! a file there for `memlend top` to show). `memlend top` reads both; one
//! killed with SIGKILL leaves its file, which top skips (no such pid) and
//! removes.

use memlend_node::live::{RUN_DIR, TMP_PREFIX};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

const INTERVAL: Duration = Duration::from_secs(1);

static FILE: OnceLock<PathBuf> = OnceLock::new();

/// The directory this process writes to, made if need be; None if neither
/// can be made.
fn dir() -> Option<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    if std::fs::DirBuilder::new().recursive(true).mode(0o755).create(RUN_DIR).is_ok()
        && is_writable(Path::new(RUN_DIR))
    {
        return Some(PathBuf::from(RUN_DIR));
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let tmp = PathBuf::from(format!("/tmp/{TMP_PREFIX}{uid}"));
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&tmp);
    // Someone else's directory, or one others may write: not ours to use.
    let meta = std::fs::symlink_metadata(&tmp).ok()?;
    let private = meta.is_dir() && meta.uid() == uid && meta.permissions().mode() & 0o077 == 0;
    private.then_some(tmp)
}

fn is_writable(dir: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else { return false };
    // SAFETY: `c` is a NUL-terminated path that lives across the call.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// Start writing `json()` every `INTERVAL`, for as long as the process
/// lives. A failure to start is logged and costs nothing else.
pub fn start(json: fn() -> Option<String>) {
    let spawned = std::thread::Builder::new().name("memlend-live".into()).spawn(move || {
        let pid = std::process::id();
        loop {
            // Found again each time: someone may have removed it meanwhile.
            if let (Some(dir), Some(text)) = (dir(), json()) {
                let (path, next) =
                    (dir.join(format!("{pid}.json")), dir.join(format!(".{pid}.json.new")));
                let _ = FILE.set(path.clone());
                let _ = std::fs::write(&next, text).and_then(|_| std::fs::rename(&next, &path));
            }
            std::thread::sleep(INTERVAL);
        }
    });
    if let Err(e) = spawned {
        tracing::info!("memlend top will not see this process: {e}");
    }
}

/// At exit: the file goes with the process.
pub fn remove() {
    if let Some(path) = FILE.get() {
        let _ = std::fs::remove_file(path);
    }
}
