//! libvipl: the VIA Provider Library C API of `vipl.h`.
//!
//! Each function checks its pointers, turns C structures and handles into
//! provider values, calls `via-provider`, and maps the result onto
//! `VIP_RETURN` in one place ([`code`]).  No panic crosses the C boundary.

// C's `unsigned long` is not 64 bits everywhere, so casts that are no-ops here stay.
#![allow(clippy::missing_safety_doc, clippy::unnecessary_cast, clippy::useless_conversion)]

mod api_conn;
mod api_cq;
mod api_nic;
mod api_vi;
pub mod types;

use types::*;
use via_core::ViaError;
/// For Rust programs that link the library (viabench): the UDP payload
/// bytes per packet of network ports opened from now on, in place of
/// `VIA_SEGMENT_SIZE`.  Not part of `vipl.h`.
pub use via_provider::tuning::set_segment_size;
use via_provider::ViaResult;

/// `VIP_SUCCESS`.
pub const VIP_SUCCESS: VIP_RETURN = 0;

/// Maps a provider error onto its `VIP_RETURN`.
pub fn code(e: ViaError) -> VIP_RETURN {
    match e {
        ViaError::NotDone => 1,
        ViaError::InvalidParameter => 2,
        ViaError::Resource => 3,
        ViaError::Timeout => 4,
        ViaError::Reject => 5,
        ViaError::InvalidReliabilityLevel => 6,
        ViaError::InvalidMtu => 7,
        ViaError::InvalidQos => 8,
        ViaError::InvalidPtag => 9,
        ViaError::InvalidRdmaRead => 10,
        ViaError::Descriptor => 11,
        ViaError::InvalidState => 12,
        ViaError::NameService => 13,
        ViaError::NoMatch => 14,
        ViaError::NotReachable => 15,
        ViaError::NotSupported => 16,
    }
}

/// Runs one API call: panics become `VIP_ERROR_RESOURCE`, errors their code.
pub(crate) fn call(f: impl FnOnce() -> ViaResult<()>) -> VIP_RETURN {
    init_logging();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => VIP_SUCCESS,
        Ok(Err(e)) => code(e),
        Err(_) => code(ViaError::Resource),
    }
}

/// Writes `value` through an out-pointer, refusing NULL.
pub(crate) unsafe fn put<T>(out: *mut T, value: T) -> ViaResult<()> {
    if out.is_null() {
        return Err(ViaError::InvalidParameter);
    }
    out.write(value);
    Ok(())
}

/// Refuses NULL out-pointers before any work is done.
pub(crate) fn need<T>(p: *const T) -> ViaResult<()> {
    if p.is_null() {
        Err(ViaError::InvalidParameter)
    } else {
        Ok(())
    }
}

/// Handles travel as pointers.
pub(crate) fn h(p: VIP_PVOID) -> u64 {
    p as u64
}

/// And back.
pub(crate) fn p(handle: u64) -> VIP_PVOID {
    handle as VIP_PVOID
}

/// Logging to stderr: `VIA_LOG` is the filter (e.g. `debug`, `off`);
/// unset, warnings and errors: why `VipOpenNic` refused a name, or why a
/// request cannot leave this host, belongs in the program's own output.
fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let level = std::env::var("VIA_LOG").unwrap_or_else(|_| "warn".to_string());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(level))
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init();
    });
}

#[cfg(test)]
mod tests {
    /// The header that is installed with this library.
    const HEADER: &str = include_str!("../../../include/vipl.h");

    /// The body of `#define name body` in the header.
    fn define(name: &str) -> &'static str {
        HEADER
            .lines()
            .find_map(|line| {
                let rest = line.trim_start().strip_prefix("#define")?.trim_start();
                let body = rest.strip_prefix(name)?;
                body.starts_with(char::is_whitespace).then(|| body.trim())
            })
            .unwrap_or_else(|| panic!("vipl.h does not define {name}"))
    }

    #[test]
    fn header_version_is_the_library_version() {
        assert_eq!(define("VIPL_VERSION"), format!("\"{}\"", env!("CARGO_PKG_VERSION")));
        assert_eq!(define("VIPL_VERSION_MAJOR"), env!("CARGO_PKG_VERSION_MAJOR"));
        assert_eq!(define("VIPL_VERSION_MINOR"), env!("CARGO_PKG_VERSION_MINOR"));
        assert_eq!(define("VIPL_VERSION_PATCH"), env!("CARGO_PKG_VERSION_PATCH"));
    }
}
