//! The page server: memlend's own protocol, for borrowers.
