//! The NBD export: a server of the NBD protocol over page stores.
