//! Starting the agent on demand.

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::client::AgentError;

/// Environment variable with the path of the `viad` binary to start.
pub const VIAD_ENV: &str = "VIA_VIAD";
/// Environment variable passed to a started agent as `--idle-timeout`.
pub const IDLE_ENV: &str = "VIA_VIAD_IDLE";

/// Runs `viad --daemon --socket NAME` and waits until that parent process has
/// exited, i.e. until the agent is bound or another one won the name.
pub fn start(socket: &str) -> Result<(), AgentError> {
    let mut cmd = Command::new(binary());
    cmd.args(["--daemon", "--socket", socket]).stdin(Stdio::null()).stdout(Stdio::null());
    if let Some(idle) = std::env::var(IDLE_ENV).ok().filter(|v| v.parse::<u64>().is_ok()) {
        cmd.args(["--idle-timeout", &idle]);
    }
    let mut child =
        cmd.spawn().map_err(|e| AgentError::Unavailable(format!("cannot start {:?}: {e}", cmd.get_program())))?;
    // A caller that reaps children itself may take the status first: the
    // connect retries decide whether the start worked.
    let _ = child.wait();
    Ok(())
}

/// The `viad` to run: `$VIA_VIAD`, one beside this library or executable, one
/// in the configured bindir, else `viad` from `PATH`.
fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os(VIAD_ENV).filter(|p| !p.is_empty()) {
        return path.into();
    }
    let mut candidates = Vec::new();
    if let Some(dir) = own_path().as_deref().and_then(Path::parent) {
        // The last one is cargo's layout, where tests live in target/*/deps.
        for rel in ["viad", "../bin/viad", "../viad"] {
            candidates.push(dir.join(rel));
        }
    }
    if let Some(bindir) = option_env!("OPENVIA_BINDIR") {
        candidates.push(Path::new(bindir).join("viad"));
    }
    candidates.into_iter().find(|p| p.is_file()).unwrap_or_else(|| "viad".into())
}

/// Path of the shared object or executable that contains this code.
fn own_path() -> Option<PathBuf> {
    // SAFETY: dladdr only reads the loader's tables; dli_fname, when set,
    // points at a NUL-terminated string owned by the loader.
    let name = unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        let addr = own_path as fn() -> Option<PathBuf> as *const libc::c_void;
        if libc::dladdr(addr, &mut info) == 0 || info.dli_fname.is_null() {
            None
        } else {
            Some(CStr::from_ptr(info.dli_fname).to_string_lossy().into_owned())
        }
    };
    // The main executable may be reported by a relative name or none.
    match name {
        Some(n) if n.starts_with('/') => Some(n.into()),
        _ => std::env::current_exe().ok(),
    }
}
