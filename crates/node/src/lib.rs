//! A memlend node: what the binaries share. Sizes and key files as users
//! write them, how much memory this node can really lend (meminfo, cgroups),
//! process checks, logging, and both binaries' man pages and completions.

pub mod cgroup;
pub mod cli_docs;
pub mod keyfile;
pub mod live;
pub mod logging;
pub mod meminfo;
pub mod process;
pub mod size;
