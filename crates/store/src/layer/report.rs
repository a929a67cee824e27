//! What a layer in a named stack has to say at the end of a run. Its own
//! file, so that the layers and the registry that lists them both depend
//! on it and not on each other.

/// One layer's line for the exit report, made when it is asked for.
pub type Report = Box<dyn Fn() -> String + Send + Sync>;
