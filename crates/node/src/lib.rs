//! How users and the binaries talk about a memlend node: sizes and key files
//! as users write them, the live statistics files, logging, and both
//! binaries' man pages and completions. What the kernel says about the
//! machine itself is in `memlend-host`.

pub mod cli_docs;
pub mod keyfile;
pub mod live;
pub mod logging;
pub mod size;
