//! The rules of the Virtual Interface Architecture, free of I/O.
//!
//! This crate knows what a descriptor looks like, which memory a VI may
//! touch and what the specification's status bits and return codes mean.
//! It moves no bytes between processes: transports do that.  (To register
//! memory it asks the kernel what is mapped: [`mapping`].)

pub mod consts;
pub mod descriptor;
pub mod error;
pub mod mapping;
pub mod registry;

pub use error::ViaError;
