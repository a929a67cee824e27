//! The cluster key file: 64 hex digits, readable by its owner only.

use anyhow::{bail, Context, Result};
use memlend_wire::page::{Key, KEY_LEN};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Load a key, refusing a file that group or others can read: a key anyone
/// on the host can read authenticates anyone on the host.
pub fn load(path: &Path) -> Result<Key> {
    let meta = fs::metadata(path).with_context(|| format!("cannot read key file {path:?}"))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!("key file {path:?} has mode {mode:o}; it must be readable by its owner only (chmod 600)");
    }
    let text =
        fs::read_to_string(path).with_context(|| format!("cannot read key file {path:?}"))?;
    Key::from_hex(&text).map_err(|e| anyhow::anyhow!("key file {path:?}: {e}"))
}

/// Write a fresh random key to `path` with mode 0600. Refuses to overwrite.
pub fn generate(path: &Path) -> Result<Key> {
    let mut bytes = [0u8; KEY_LEN];
    getrandom::getrandom(&mut bytes)
        .map_err(|e| anyhow::anyhow!("no randomness from the kernel: {e}"))?;
    let key = Key::from_bytes(bytes);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create key file {path:?} (it must not exist yet)"))?;
    writeln!(f, "{}", key.to_hex())?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_load_and_loose_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        let k = generate(&p).unwrap();
        assert_eq!(load(&p).unwrap(), k);
        assert!(generate(&p).is_err(), "never overwrites");
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        let err = load(&p).unwrap_err().to_string();
        assert!(err.contains("owner only"), "{err}");
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(&p, "not a key").unwrap();
        assert!(load(&p).is_err());
    }
}
