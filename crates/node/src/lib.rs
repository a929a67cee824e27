//! A memlend node: what the binaries share. Sizes and key files as users
//! write them, how much memory this node can really lend, logging, and the
//! services `memlendd` runs. The ACMS control plane joins here later.

pub mod keyfile;
pub mod logging;
pub mod meminfo;
pub mod process;
pub mod size;
