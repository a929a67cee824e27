//! The control plane of ACMS (see `DESIGN.md` beside this file): each node
//! watches its memory, classifies itself, and agrees with its peers who lends
//! how much to whom. Nothing in here does I/O except `monitor`, which reads
//! `/proc` and cgroup files; the protocol engine is a pure state machine
//! driven by the daemon, so it can be tested exhaustively.

pub mod api;
pub mod classify;
pub mod engine;
pub mod members;
pub mod monitor;
pub mod select;
