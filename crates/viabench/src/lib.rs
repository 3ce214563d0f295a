//! viabench: the benchmark of openvia.
//!
//! NetPIPE's method (Snell, Mikler and Gustafson; NetPIPE-VIA by Baker,
//! Farrell, Ong and Scott) applied to the VIPL C API: block sizes from one
//! byte upwards with perturbations, each repeated long enough and the best
//! of several trials kept, reported as one-way time and throughput.  The
//! same driver times VIA send/receive, VIA RDMA write, TCP, and bare
//! shared-memory, cross-memory (`process_vm_writev`) and UDP ping-pongs, so
//! the numbers compare; TTCP-VIA's bursts (McKenzie) are a pattern of their
//! own, and so are connection set-up, VIA's connection management beside
//! TCP's ([`connect`]), and the rendezvous by which message-passing
//! libraries of the VIA era moved mid-size messages (request, answer with a
//! registered buffer, RDMA write; [`link::via`]).
//!
//! Both sides are one binary: a TCP control connection carries the plan and
//! the results, the data moves over the transport under test.

pub mod cli;
pub mod connect;
pub mod driver;
pub mod error;
pub mod flow;
pub mod link;
pub mod pattern;
pub mod plot;
pub mod progress;
pub mod proto;
pub mod report;
pub mod schedule;
pub mod session;
pub mod sys;
pub mod vipl_api;
