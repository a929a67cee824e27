//! Every limit of the NBD server, named with its unit.

use std::io;

/// Server-wide limits. `Default` gives the values documented in `docs/nbd.md`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdConfig {
    /// Connections served at once; more are closed at accept.
    pub connections_max: usize,
    /// Largest READ or WRITE payload; advertised as the maximum block size.
    /// 64 MiB, as nbdkit allows: a client that never asks for block sizes
    /// (the kernel's nbd, older qemu) may send 32 MiB and more. One
    /// connection's input buffer grows to this for such a WRITE.
    pub request_bytes_max: u32,
    /// A WRITE larger than `request_bytes_max` but no larger than this has its
    /// payload read and thrown away, then fails with EINVAL; a larger one
    /// fails with EINVAL and closes the connection (it is not worth reading).
    pub skip_write_bytes_max: u64,
    /// Largest option payload kept in memory. Larger ones are read and thrown
    /// away in small pieces and answered with `NBD_REP_ERR_TOO_BIG`.
    pub option_bytes_max: u32,
    /// Options one client may send before it must pick an export.
    pub options_per_handshake_max: u32,
    /// A client that stalls for longer than this during the handshake is
    /// dropped. 0 means no limit.
    pub handshake_timeout_ms: u64,
    /// Advertised minimum block size (the smallest unit of offset and
    /// length). 1: any byte range works, sub-page ones by read-modify-write.
    pub block_bytes_min: u32,
    /// Advertised preferred block size: aligned I/O of this size avoids
    /// read-modify-write.
    pub preferred_block_bytes: u32,
    /// Initial size of a connection's input buffer. It grows to hold one
    /// whole WRITE (up to `request_bytes_max`) and shrinks back when idle.
    pub input_buffer_bytes: usize,
    /// Replies are gathered and sent with one write; a batch this large is
    /// sent before more requests are served, which bounds its memory.
    pub reply_batch_bytes_max: usize,
    /// Before sleeping in a blocking read, poll the socket this long for the
    /// next request, yielding the CPU between polls. Waking a sleeping
    /// thread from the other core costs ~10 µs on these machines, more than
    /// serving a 4 KiB request; a busy client's next request usually comes
    /// sooner. 0 disables spinning. Only fast (inline) stores spin.
    pub spin_before_sleep_us: u64,
    /// Worker threads per connection for stores that are not `Caps::fast`.
    pub workers_per_connection: usize,
    /// Requests queued for those workers; the connection stops reading the
    /// socket while the queue is full.
    pub inflight_requests_max: usize,
    /// Client addresses allowed to connect; empty: all. Others are closed
    /// at accept, before a byte is read.
    pub allow: Vec<super::allow::Cidr>,
    /// TLS, required of every client when set (NBD_OPT_STARTTLS).
    pub tls: Option<super::tls::Tls>,
}

impl Default for NbdConfig {
    fn default() -> Self {
        NbdConfig {
            connections_max: 64,
            request_bytes_max: 64 << 20,
            skip_write_bytes_max: 128 << 20,
            option_bytes_max: 64 << 10,
            options_per_handshake_max: 256,
            handshake_timeout_ms: 10_000,
            block_bytes_min: 1,
            preferred_block_bytes: 4096,
            input_buffer_bytes: 256 << 10,
            reply_batch_bytes_max: 1 << 20,
            spin_before_sleep_us: 50,
            workers_per_connection: 4,
            inflight_requests_max: 64,
            allow: Vec::new(),
            tls: None,
        }
    }
}

impl NbdConfig {
    /// Check the values against the protocol's rules for block sizes and
    /// against each other.
    pub fn validate(&self) -> io::Result<()> {
        let bad = |why: &str| Err(io::Error::new(io::ErrorKind::InvalidInput, why.to_string()));
        let (min, pref, max) =
            (self.block_bytes_min, self.preferred_block_bytes, self.request_bytes_max);
        if !min.is_power_of_two() || min > 65536 {
            return bad("block_bytes_min must be a power of two no larger than 65536");
        }
        if !pref.is_power_of_two() || pref < min.max(512) {
            return bad(
                "preferred_block_bytes must be a power of two, at least block_bytes_min and 512",
            );
        }
        if max < pref {
            return bad("request_bytes_max must be at least preferred_block_bytes");
        }
        if self.skip_write_bytes_max < max as u64 {
            return bad("skip_write_bytes_max must be at least request_bytes_max");
        }
        if self.connections_max == 0 || self.workers_per_connection == 0 {
            return bad("connections_max and workers_per_connection must be at least 1");
        }
        if self.inflight_requests_max == 0 || self.options_per_handshake_max == 0 {
            return bad("inflight_requests_max and options_per_handshake_max must be at least 1");
        }
        if self.spin_before_sleep_us > 10_000 {
            return bad("spin_before_sleep_us above 10 ms would burn a core for nothing");
        }
        if self.input_buffer_bytes < 4096 || self.reply_batch_bytes_max < 4096 {
            return bad("input_buffer_bytes and reply_batch_bytes_max must be at least 4096");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_block_sizes_are_refused() {
        NbdConfig::default().validate().unwrap();
        let c = NbdConfig { block_bytes_min: 3, ..Default::default() };
        assert!(c.validate().is_err());
        let c = NbdConfig { preferred_block_bytes: 256, ..Default::default() };
        assert!(c.validate().is_err());
        let c = NbdConfig { request_bytes_max: 1024, ..Default::default() };
        assert!(c.validate().is_err());
    }
}
