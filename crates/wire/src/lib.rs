//! Byte formats: the page protocol and NBD, with no I/O
