//! The client of the page protocol and the remote page store
