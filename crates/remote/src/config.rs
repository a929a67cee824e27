use memlend_wire::page::Key;
use std::time::Duration;

/// How a borrower connects. Every wait is bounded.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The cluster key; `None` only works against an `--insecure` donor.
    pub key: Option<Key>,
    /// Accept a donor that says it runs without a key. Off unless asked for,
    /// so a misconfigured donor cannot silently downgrade a borrower.
    pub allow_insecure: bool,
    /// Slabs belong to this id; reconnecting with it finds them again.
    pub borrower_id: [u8; 16],
    pub connect_timeout: Duration,
    /// A reply must arrive within this, or the connection counts as broken.
    pub io_timeout: Duration,
    /// Connections a `RemoteStore` opens at most (one per concurrent caller).
    pub connections_max: usize,
    /// Attempts on fresh connections after a transport failure.
    pub retries_max: u32,
    /// Poll for a reply this long before sleeping in `read` (0: never). A
    /// reply usually comes within ~15 µs on loopback, and waking a sleeping
    /// thread costs ~10 µs more: this is most of a remote fault's budget.
    pub spin_before_sleep: Duration,
}

impl ClientConfig {
    /// A config with a fresh random borrower id.
    pub fn new(key: Option<Key>) -> Self {
        let mut borrower_id = [0u8; 16];
        getrandom::getrandom(&mut borrower_id).expect("the kernel's random source is available");
        ClientConfig {
            allow_insecure: key.is_none(),
            key,
            borrower_id,
            connect_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(30),
            connections_max: 8,
            retries_max: 3,
            spin_before_sleep: Duration::from_micros(50),
        }
    }
}
