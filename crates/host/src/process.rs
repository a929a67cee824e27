//! Process-wide settings for a donor that backs swap on its own host.

use anyhow::{bail, Result};

/// `PR_SET_IO_FLUSHER` from <linux/prctl.h> (Linux 5.6); the libc crate lacks it.
const PR_SET_IO_FLUSHER: libc::c_int = 57;

/// When the kernel swaps onto an NBD export served by this very process, a
/// swap-out waits for us; if we in turn need memory (a page fault, an
/// allocation) to make progress, reclaim waits on reclaim and the host
/// deadlocks. So: lock every page we have and will have (faulted in on
/// first touch, so sparse slabs stay sparse), and tell the kernel we are an
/// I/O flusher, so our own allocations do not recurse into reclaim.
pub fn make_swap_safe() -> Result<()> {
    let flags = libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT;
    // SAFETY: mlockall changes only this process's paging policy.
    if unsafe { libc::mlockall(flags) } != 0 {
        bail!(
            "mlockall failed: {} (needs CAP_IPC_LOCK or a large RLIMIT_MEMLOCK)",
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: PR_SET_IO_FLUSHER takes one integer argument and changes only
    // this process's reclaim flags.
    if unsafe { libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) } != 0 {
        bail!(
            "PR_SET_IO_FLUSHER failed: {} (needs CAP_SYS_RESOURCE)",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}
