//! The environment through which `memlend run` configures its preload shim
//! in the program it starts (and in every program that one execs).

/// Local budget in bytes; the shim does nothing without it.
pub const LOCAL: &str = "MEMLEND_LOCAL";
/// Far region size in bytes; default: what the placement has room for.
pub const FAR: &str = "MEMLEND_FAR";
/// Comma-separated donor addresses.
pub const DONORS: &str = "MEMLEND_DONORS";
/// The local memlendd's API socket: borrow from the cluster.
pub const POOL: &str = "MEMLEND_POOL";
/// SSD path (file, directory or block device) when there are no donors.
pub const SSD: &str = "MEMLEND_SSD";
/// "mirror" or "ssd": a second home for every page.
pub const REDUNDANCY: &str = "MEMLEND_REDUNDANCY";
/// "1": pages go to donors in plain text.
pub const NO_ENCRYPT: &str = "MEMLEND_NO_ENCRYPT";
/// Cluster key file.
pub const KEY: &str = "MEMLEND_KEY";
/// "1": donors without a key are fine.
pub const INSECURE: &str = "MEMLEND_INSECURE";
/// Allocations from this many bytes up are far.
pub const THRESHOLD: &str = "MEMLEND_THRESHOLD";
/// With a pool: the first lease's size (`64M`); later ones double, up to
/// 2 GiB, each leased when the region first writes to it.
pub const LEASE_FIRST: &str = "MEMLEND_LEASE_FIRST";
/// Total memory of the process in bytes (`memlend run --mem`): the far
/// budget follows what the rest of the process uses, to stay within it.
pub const MEM: &str = "MEMLEND_MEM";
/// "lz4" or "off" (the default): keep evicted pages that compress in a
/// local pool carved from the budget.
pub const COMPRESS: &str = "MEMLEND_COMPRESS";
/// Directory for each process's `<pid>.json` counters at exit.
pub const STATS_DIR: &str = "MEMLEND_STATS_DIR";

/// Far allocations start at this size unless told otherwise.
pub const DEFAULT_THRESHOLD_BYTES: u64 = 1 << 20;
