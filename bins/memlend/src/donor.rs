//! Reaching a donor from the command line.

use anyhow::{Context, Result};
use clap::Args;
use memlend_node::size::human;
use memlend_remote::{ClientConfig, Conn};
use memlend_wire::page::{Opcode, ReqHeader, StatReply};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct DonorArgs {
    /// The donor's page-protocol address.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub donor: SocketAddr,
    /// The cluster key file.
    #[arg(long, conflicts_with = "insecure")]
    pub key: Option<PathBuf>,
    /// Talk to a donor that runs without a key.
    #[arg(long)]
    pub insecure: bool,
}

impl DonorArgs {
    pub fn client_config(&self) -> Result<ClientConfig> {
        let key = self.key.as_deref().map(memlend_node::keyfile::load).transpose()?;
        let mut cfg = ClientConfig::new(key);
        cfg.allow_insecure = self.insecure;
        Ok(cfg)
    }

    pub fn connect(&self, cfg: &ClientConfig) -> Result<Conn> {
        Conn::connect(self.donor, cfg).with_context(|| format!("cannot reach donor {}", self.donor))
    }
}

pub fn status(a: &DonorArgs) -> Result<()> {
    let mut conn = a.connect(&a.client_config()?)?;
    conn.call(ReqHeader::new(Opcode::Stat, 0), &[], None)?;
    let s = StatReply::decode(conn.scratch())?;
    let p = |pages: u64| human(pages * 4096);
    println!("donor {}: lends {}, {} free", a.donor, p(s.lend_pages), p(s.free_pages));
    println!("limits: {} pages per request, {} in flight", conn.batch_pages_max, conn.inflight_max);
    Ok(())
}
