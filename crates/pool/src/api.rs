//! The local API: how `memlend run` processes (and `memlend status`) talk to
//! their node's daemon over a unix socket. One JSON object per line, each
//! way. A process's leases live as long as its connection: when it closes,
//! the daemon releases them, so a crashed process strands nothing.

use memlend_wire::ctrl::{Credential, LeaseId, NodeId};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Longest line either side accepts; a longer one is an error and closes
/// the connection.
pub const LINE_BYTES_MAX: usize = 64 * 1024;
/// Most API connections a daemon serves at once.
pub const CLIENTS_MAX: usize = 256;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ask {
    /// Memory for this process: answered by `Lease` lines (maybe several)
    /// and/or one `Unmet`. Never from the `avoid` nodes (at most
    /// `AVOID_NODES_MAX`), and outside their failure domains when another
    /// donor can lend: they hold the other copy of the pages.
    Want {
        bytes: u64,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        avoid: Vec<NodeId>,
    },
    /// The process is done with a lease (pages moved away or freed).
    Release { donor: NodeId, lease: LeaseId },
    /// Pages per second the process sees on a lease (reclaim picks the least
    /// active).
    Activity { donor: NodeId, lease: LeaseId, pages_per_s: u32 },
    /// The cluster as this daemon sees it: answered by one `Status` line.
    Status,
    /// Bytes of this process's far memory that sit at home (the SSD or its
    /// own RAM) and would go to a lease: demand, like an unmet `Want`, for
    /// as long as it lasts. Each report replaces the last; no answer.
    Home { bytes: u64 },
}

/// A lease as a process uses it: where to connect and as whom.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    pub donor: NodeId,
    pub donor_name: String,
    /// The donor's failure domain; empty when it names none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub donor_domain: String,
    pub lease: LeaseId,
    pub bytes: u64,
    pub data_addr: SocketAddr,
    /// The page protocol's borrower id for this lease (hex).
    pub credential: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tell {
    Lease(LeaseGrant),
    Unmet {
        bytes: u64,
    },
    /// Move this lease's pages elsewhere and `Release` it within `deadline_ms`.
    Reclaim {
        donor: NodeId,
        lease: LeaseId,
        deadline_ms: u64,
    },
    /// The lease is gone (its donor died or revoked it).
    Lost {
        donor: NodeId,
        lease: LeaseId,
        why: String,
    },
    Status(Box<ClusterStatus>),
    Error {
        message: String,
    },
}

/// What `memlend status` prints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub node: NodeView,
    pub peers: Vec<NodeView>,
    pub lent: Vec<LeaseView>,
    pub borrowed: Vec<LeaseView>,
    pub unmet_bytes: u64,
    pub handshakes: u64,
    pub handshake_us_p50: Option<u64>,
    pub handshake_us_p99: Option<u64>,
    /// Messages sent and received, by type (offer, request, ...).
    pub sent: Vec<(String, u64)>,
    pub received: Vec<(String, u64)>,
    /// Datagrams on the wire: sent, received, and dropped by why.
    pub datagrams: Vec<(String, u64)>,
    /// Protocol events: grants expired, reclaims, migrations, ...
    pub counters: Vec<(String, u64)>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    pub id: NodeId,
    pub name: String,
    pub class: String,
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub lent_bytes: u64,
    pub borrowed_bytes: u64,
    /// What it could grant now (this node only; 0 for peers).
    pub available_bytes: u64,
    pub alive: bool,
    pub addr: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseView {
    pub lease: LeaseId,
    /// The other side: the borrower for a lent lease, the donor for one
    /// borrowed.
    pub peer: NodeId,
    pub bytes: u64,
    pub state: String,
    pub pages_per_s: u32,
}

pub fn credential_hex(c: &Credential) -> String {
    c.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn credential_from_hex(text: &str) -> Result<Credential, String> {
    if text.len() != 32 || !text.is_ascii() {
        return Err(format!("a credential is 32 hex digits, got {:?}", text));
    }
    let mut c = [0u8; 16];
    for (i, b) in c.iter_mut().enumerate() {
        *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("bad hex in credential {text:?}"))?;
    }
    Ok(c)
}

/// Read one line of at most [`LINE_BYTES_MAX`]; `Ok(None)` at end of stream.
pub fn read_line<R: BufRead>(r: &mut R) -> std::io::Result<Option<String>> {
    let mut line = String::new();
    let n = std::io::Read::take(&mut *r, LINE_BYTES_MAX as u64 + 1).read_line(&mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if n > LINE_BYTES_MAX || !line.ends_with('\n') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "API line too long or cut short",
        ));
    }
    Ok(Some(line))
}

pub fn write_json(w: &mut impl Write, v: &impl Serialize) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line)
}

/// A process's connection to its daemon.
pub struct Client {
    stream: UnixStream,
    /// Bytes read but not yet a whole line: a read that times out mid-line
    /// keeps them for the next call.
    partial: Vec<u8>,
}

impl Client {
    pub fn connect(path: &Path) -> std::io::Result<Client> {
        let stream = UnixStream::connect(path).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot reach memlendd at {}: {e}", path.display()),
            )
        })?;
        Ok(Client { stream, partial: Vec::new() })
    }

    /// A second handle on the same connection: one thread can wait for
    /// lines on one while another asks on the other. Only one of them may
    /// read (each keeps its own partial line).
    pub fn try_clone(&self) -> std::io::Result<Client> {
        Ok(Client { stream: self.stream.try_clone()?, partial: Vec::new() })
    }

    pub fn ask(&mut self, a: &Ask) -> std::io::Result<()> {
        write_json(&mut self.stream, a)
    }

    /// The next line from the daemon; `timeout` None blocks. A timeout is
    /// an error of kind `WouldBlock` or `TimedOut`, and loses nothing.
    pub fn next(&mut self, timeout: Option<Duration>) -> std::io::Result<Option<Tell>> {
        use std::io::Read;
        self.stream.set_read_timeout(timeout)?;
        loop {
            if let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.partial.drain(..=end).collect();
                return serde_json::from_slice(&line).map(Some).map_err(|e| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("bad line from memlendd: {e}"),
                    )
                });
            }
            if self.partial.len() > LINE_BYTES_MAX {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "memlendd line too long",
                ));
            }
            let mut buf = [0u8; 4096];
            let n = self.stream.read(&mut buf)?;
            if n == 0 {
                return Ok(None);
            }
            self.partial.extend_from_slice(&buf[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_limits_hold() {
        let a = Ask::Activity { donor: 1, lease: 2, pages_per_s: 3 };
        let mut buf = Vec::new();
        write_json(&mut buf, &a).unwrap();
        let line = read_line(&mut &buf[..]).unwrap().unwrap();
        assert_eq!(serde_json::from_str::<Ask>(&line).unwrap(), a);
        let long = vec![b'x'; LINE_BYTES_MAX + 10];
        assert!(read_line(&mut &long[..]).is_err());
        assert!(read_line(&mut &b"{\"status\":null}"[..]).is_err(), "no newline: cut short");
        assert_eq!(read_line(&mut &b""[..]).unwrap(), None);
    }

    #[test]
    fn credentials_round_trip_in_hex() {
        let c = [0xab; 16];
        assert_eq!(credential_from_hex(&credential_hex(&c)).unwrap(), c);
        assert!(credential_from_hex("xyz").is_err());
        assert!(credential_from_hex(&"g".repeat(32)).is_err());
    }
}
