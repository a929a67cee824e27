//! `--nbd-unix PATH`: the socket file of the NBD Unix listener. Its mode is
//! the access control there (no address to check against --nbd-allow), so
//! it is set before any client can see the file: bound under a temporary
//! name, made 0660, then renamed into place.

use anyhow::{bail, Context, Result};
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// connect() needs write permission on the file: owner and group may
/// connect, others not. 0600 would make every client (qemu runs as its own
/// user) run as the daemon's user; a group can be granted instead.
pub const SOCKET_MODE: u32 = 0o660;
/// sun_path holds 107 bytes and a NUL; the temporary name adds `.new`.
const PATH_BYTES_MAX: usize = 107 - TMP_SUFFIX.len();
const TMP_SUFFIX: &str = ".new";

/// The socket file this daemon made; removed when dropped (a clean stop)
/// if it is still the same file.
pub struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

/// Listen at `path`, replacing a stale socket left by a crashed run.
pub fn bind(path: &Path) -> Result<(UnixListener, SocketFile)> {
    if path.as_os_str().len() > PATH_BYTES_MAX {
        bail!("--nbd-unix {}: longer than {PATH_BYTES_MAX} bytes", path.display());
    }
    clear_stale(path)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(TMP_SUFFIX);
    let tmp = PathBuf::from(tmp);
    clear_stale(&tmp)?;
    let listener = UnixListener::bind(&tmp)
        .with_context(|| format!("--nbd-unix: cannot listen on {}", tmp.display()))?;
    let placed = fs::set_permissions(&tmp, fs::Permissions::from_mode(SOCKET_MODE))
        .and_then(|()| fs::rename(&tmp, path))
        .and_then(|()| fs::symlink_metadata(path));
    let meta = match placed {
        Ok(m) => m,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            bail!("--nbd-unix {}: cannot put the socket in place: {e}", path.display());
        }
    };
    Ok((listener, SocketFile { path: path.to_path_buf(), dev: meta.dev(), ino: meta.ino() }))
}

/// Nothing at `path`, or a socket nobody listens on (removed): fine. A
/// live socket, or a file of another kind, is an error naming it.
fn clear_stale(path: &Path) -> Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => bail!("--nbd-unix {}: {e}", path.display()),
        Ok(m) => m,
    };
    if !meta.file_type().is_socket() {
        bail!("--nbd-unix {}: exists and is not a socket; not replacing it", path.display());
    }
    match UnixStream::connect(path) {
        Ok(_) => bail!("--nbd-unix {}: a server already listens there", path.display()),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::warn!(path = %path.display(), "replacing a stale NBD socket");
            fs::remove_file(path)
                .with_context(|| format!("--nbd-unix: cannot remove stale {}", path.display()))
        }
        Err(e) => bail!("--nbd-unix {}: cannot tell whether it is in use: {e}", path.display()),
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        // Not a file some other daemon has put there since.
        let ours = fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.dev() == self.dev && m.ino() == self.ino);
        if ours {
            if let Err(e) = fs::remove_file(&self.path) {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot remove NBD socket");
            }
        }
    }
}
