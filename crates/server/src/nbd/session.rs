//! A negotiated connection's view of its export, and the checks every
//! request passes before it may touch the store.

use super::config::NbdConfig;
use super::export::ExportState;
use super::peer::Peer;
use memlend_wire::nbd::{cmd_flags, Command, Errno, Request};
use std::sync::Arc;

/// What the handshake settled for one connection.
pub(crate) struct Session {
    pub export: Arc<ExportState>,
    pub structured: bool,
    /// `base:allocation` was selected for this export: BLOCK_STATUS works.
    pub block_status: bool,
    pub peer: Peer,
    pub request_bytes_max: u32,
    pub block_bytes_min: u32,
}

/// A request that passed every check, ready to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Read { offset: u64, len: u32, df: bool },
    Write { offset: u64, fua: bool },
    Trim { offset: u64, len: u32, fua: bool },
    Zero { offset: u64, len: u32, may_trim: bool, fua: bool },
    BlockStatus { offset: u64, len: u32, req_one: bool },
    Flush,
    Cache,
    Disc,
}

/// Why a request is refused, for the error reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reject {
    pub errno: Errno,
    pub why: &'static str,
}

fn reject(errno: Errno, why: &'static str) -> Reject {
    Reject { errno, why }
}

impl Session {
    pub fn new(
        export: Arc<ExportState>,
        structured: bool,
        block_status: bool,
        peer: Peer,
        cfg: &NbdConfig,
    ) -> Self {
        let (request_bytes_max, block_bytes_min) = (cfg.request_bytes_max, cfg.block_bytes_min);
        Session { export, structured, block_status, peer, request_bytes_max, block_bytes_min }
    }

    /// Flags each command accepts. FUA is accepted everywhere, as the
    /// protocol requires once SEND_FUA is advertised.
    fn allowed_flags(&self, cmd: Command) -> u16 {
        cmd_flags::FUA
            | match cmd {
                Command::Read if self.structured => cmd_flags::DF,
                Command::BlockStatus if self.block_status => cmd_flags::REQ_ONE,
                Command::WriteZeroes => cmd_flags::NO_HOLE | cmd_flags::FAST_ZERO,
                _ => 0,
            }
    }

    /// Check a request against the protocol and the export. Nothing is
    /// touched for a refused request.
    pub fn validate(&self, req: &Request) -> Result<Op, Reject> {
        let cmd = req.command().ok_or(reject(Errno::Inval, "unknown command"))?;
        if req.flags & !self.allowed_flags(cmd) != 0 {
            return Err(reject(Errno::Inval, "command flag not valid for this command"));
        }
        match cmd {
            Command::Disc => return Ok(Op::Disc),
            Command::Flush => return Ok(Op::Flush),
            Command::BlockStatus if !self.block_status => {
                return Err(reject(
                    Errno::Inval,
                    "block status needs a metadata context; none was set",
                ))
            }
            _ => {}
        }
        let writes = matches!(cmd, Command::Write | Command::Trim | Command::WriteZeroes);
        if writes && self.export.read_only {
            return Err(reject(Errno::Perm, "export is read-only"));
        }
        self.check_range(cmd, req)?;
        self.to_op(cmd, req)
    }

    fn check_range(&self, cmd: Command, req: &Request) -> Result<(), Reject> {
        let end = req.offset.checked_add(req.len as u64);
        if end.is_none_or(|end| end > self.export.size_bytes) {
            let grows = matches!(cmd, Command::Write | Command::WriteZeroes);
            let errno = if grows { Errno::NoSpc } else { Errno::Inval };
            return Err(reject(errno, "request reaches past the end of the export"));
        }
        let align = self.block_bytes_min as u64;
        if !req.offset.is_multiple_of(align) || !(req.len as u64).is_multiple_of(align) {
            return Err(reject(Errno::Inval, "request is not aligned to the minimum block size"));
        }
        Ok(())
    }

    fn to_op(&self, cmd: Command, req: &Request) -> Result<Op, Reject> {
        let (offset, len) = (req.offset, req.len);
        let fua = req.flags & cmd_flags::FUA != 0;
        Ok(match cmd {
            Command::Read => {
                let df = req.flags & cmd_flags::DF != 0;
                if len > self.request_bytes_max {
                    let errno = if df { Errno::Overflow } else { Errno::Inval };
                    return Err(reject(errno, "read larger than the maximum block size"));
                }
                Op::Read { offset, len, df }
            }
            Command::Write => Op::Write { offset, fua },
            Command::Trim => Op::Trim { offset, len, fua },
            Command::Cache => Op::Cache,
            Command::BlockStatus => {
                // A descriptor may not be empty, so there is nothing to say.
                if len == 0 {
                    return Err(reject(Errno::Inval, "block status of zero bytes"));
                }
                Op::BlockStatus { offset, len, req_one: req.flags & cmd_flags::REQ_ONE != 0 }
            }
            Command::WriteZeroes => {
                let no_hole = req.flags & cmd_flags::NO_HOLE != 0;
                let fast = req.flags & cmd_flags::FAST_ZERO != 0;
                if fast && (no_hole || !self.export.caps.discard_frees) {
                    return Err(reject(Errno::NotSup, "zeroing here is no faster than writing"));
                }
                Op::Zero { offset, len, may_trim: !no_hole, fua }
            }
            Command::Disc | Command::Flush => unreachable!("handled by validate"),
        })
    }
}
