//! C strings: reading the caller's, writing messages into the caller's
//! buffer.

use std::ffi::{c_char, CStr};

/// Copy `msg` into `buf` (room for `len` bytes), cut at a UTF-8 boundary
/// to fit, always NUL-terminated; interior NULs become spaces.
///
/// # Safety
/// `buf` is NULL (nothing written) or writable for `len` bytes.
pub unsafe fn write(buf: *mut c_char, len: usize, msg: &str) {
    if buf.is_null() || len == 0 {
        return;
    }
    let mut n = msg.len().min(len - 1);
    while !msg.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: the caller promised `len` writable bytes; we write `n + 1`
    // of them, `n <= len - 1`.
    let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), n + 1) };
    for (o, &b) in out.iter_mut().zip(&msg.as_bytes()[..n]) {
        *o = if b == 0 { b' ' } else { b };
    }
    out[n] = 0;
}

/// The caller's string, or `None` for NULL or empty.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that outlives the call.
pub unsafe fn read<'a>(p: *const c_char) -> Option<&'a CStr> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL and NUL-terminated, as the caller promised.
    let s = unsafe { CStr::from_ptr(p) };
    (!s.is_empty()).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(len: usize, msg: &str) -> Vec<u8> {
        let mut buf = vec![0x55u8; len + 4];
        // SAFETY: `buf` has `len + 4` bytes.
        unsafe { write(buf.as_mut_ptr().cast(), len, msg) };
        buf
    }

    #[test]
    fn messages_are_cut_to_fit_and_terminated() {
        assert_eq!(&written(8, "hello world")[..9], b"hello w\0\x55");
        assert_eq!(&written(32, "hi")[..4], b"hi\0\x55");
        assert_eq!(written(1, "hi")[0], 0);
        assert_eq!(written(0, "hi")[0], 0x55);
        // "é" is two bytes: never half of it.
        assert_eq!(&written(3, "aé")[..3], b"a\0\x55");
        assert_eq!(&written(4, "a\0b")[..4], b"a b\0");
    }
}
