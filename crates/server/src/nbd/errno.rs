//! Store errors as NBD error values. The protocol allows only eight values;
//! anything else a store reports becomes EIO.

use memlend_store::StoreError;
use memlend_wire::nbd::Errno;

/// The NBD error value for a failed store operation.
pub(crate) fn nbd_errno(e: &StoreError) -> Errno {
    from_os_errno(e.errno())
}

/// The NBD error value for a host errno, as the protocol document maps them
/// (EDQUOT and EFBIG are out-of-space too).
pub(crate) fn from_os_errno(errno: i32) -> Errno {
    match errno {
        libc::EPERM | libc::EACCES | libc::EROFS => Errno::Perm,
        libc::ENOMEM => Errno::NoMem,
        libc::EINVAL => Errno::Inval,
        libc::ENOSPC | libc::EDQUOT | libc::EFBIG => Errno::NoSpc,
        libc::EOVERFLOW => Errno::Overflow,
        libc::EOPNOTSUPP => Errno::NotSup,
        libc::ESHUTDOWN => Errno::Shutdown,
        _ => Errno::Io,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_store_error_maps_to_an_allowed_value() {
        let io = |n| StoreError::Io(std::io::Error::from_raw_os_error(n));
        assert_eq!(
            nbd_errno(&StoreError::OutOfRange { page: 1, count: 1, pages: 1 }),
            Errno::Inval
        );
        assert_eq!(nbd_errno(&StoreError::Corrupt { page: 0, expected: 0, actual: 1 }), Errno::Io);
        assert_eq!(nbd_errno(&StoreError::NoSpace("x".into())), Errno::NoSpc);
        assert_eq!(nbd_errno(&StoreError::Unavailable("x".into())), Errno::Io);
        assert_eq!(nbd_errno(&io(libc::EDQUOT)), Errno::NoSpc);
        assert_eq!(nbd_errno(&io(libc::EROFS)), Errno::Perm);
        assert_eq!(nbd_errno(&io(libc::ECONNRESET)), Errno::Io);
        assert_eq!(nbd_errno(&io(libc::ESHUTDOWN)), Errno::Shutdown);
    }
}
