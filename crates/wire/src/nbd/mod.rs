//! The NBD protocol (fixed newstyle handshake and transmission phase).
