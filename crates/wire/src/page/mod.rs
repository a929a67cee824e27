//! The page protocol; `docs/protocol.md` is its reference.
