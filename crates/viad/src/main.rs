//! `viad`: the openvia host agent.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use viad::agent::{self, Config};
use viad::client::{self, Agent};

/// What `viad --help` prints after the options.
const AFTER_HELP: &str = "\
Environment: VIA_AGENT_SOCKET (the socket), VIA_CM_PORT (the CM port),
VIA_DEVICES_FILE (the aliases file, default /etc/openvia/devices), VIA_LOG
(logging to stderr, e.g. VIA_LOG=debug).  See viad(8).";

/// The command line of `viad`.
#[derive(Parser, Debug)]
#[command(
    name = "viad",
    version,
    about = "openvia host agent (the VI kernel agent): device names, connection rendezvous, counters",
    after_help = AFTER_HELP,
    args_override_self = true
)]
struct Args {
    /// Run in the background; return once the agent listens
    #[arg(long)]
    daemon: bool,
    /// Print the running agent's counters
    #[arg(long, conflicts_with = "stop")]
    stats: bool,
    /// Ask the running agent to exit
    #[arg(long)]
    stop: bool,
    /// Exit after this many seconds without clients (default 10, 0 = never)
    #[arg(long = "idle-timeout", value_name = "SECONDS")]
    idle: Option<u64>,
    /// Abstract socket name (default $VIA_AGENT_SOCKET or openvia-viad)
    #[arg(long, value_name = "NAME")]
    socket: Option<String>,
    /// UDP port of the connection managers of all hosts (default
    /// $VIA_CM_PORT or 60; 0 = this host only).  The default is privileged:
    /// only root binds it, and messages from it come from a host's agent; a
    /// port of 1024 or more gives that protection up
    #[arg(long, value_name = "PORT")]
    cm_port: Option<u16>,
    /// Most connections one uid may hold at the agent (default 1024; root
    /// and the agent's own uid are exempt)
    #[arg(long = "max-connections-per-uid", value_name = "N", value_parser = positive)]
    max_per_uid: Option<usize>,
}

/// A count of at least 1.
fn positive(v: &str) -> Result<usize, String> {
    v.parse().ok().filter(|&n| n > 0).ok_or_else(|| format!("expected a number of at least 1, not {v:?}"))
}

/// Environment variable with the CM port (overridden by `--cm-port`).
const CM_PORT_ENV: &str = "VIA_CM_PORT";

fn main() -> ExitCode {
    let args = Args::parse();
    if args.daemon {
        // Descriptors leaked by the starting process (the application) must not
        // live on in the agent.  SAFETY: nothing in this process uses them.
        unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    }
    if let Ok(filter) = std::env::var("VIA_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
    let socket = args.socket.clone().unwrap_or_else(client::socket_name);
    let agent = Agent::with_socket(&socket);
    if args.stats || args.stop {
        let result = match args.stats {
            true => agent.stats().map(|counters| {
                for (name, value) in counters {
                    println!("{name} {value}");
                }
            }),
            false => agent.stop(),
        };
        return match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e @ client::AgentError::Unavailable(_)) => {
                eprintln!("viad: no agent running on @{socket}: {e}");
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("viad: @{socket}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let cm_port = match args.cm_port {
        Some(port) => port,
        None => match std::env::var(CM_PORT_ENV) {
            Ok(v) if !v.is_empty() => match v.parse() {
                Ok(port) => port,
                Err(_) => {
                    eprintln!("viad: bad {CM_PORT_ENV} {v:?}: expected a port number (0 to 65535)");
                    return ExitCode::from(2);
                }
            },
            _ => via_wire::cm::CM_PORT,
        },
    };
    let config = Config {
        idle_timeout: Some(args.idle.unwrap_or(10)).filter(|&s| s > 0).map(Duration::from_secs),
        cm_port,
        max_connections_per_uid: args.max_per_uid.unwrap_or(agent::MAX_CONNECTIONS_PER_UID),
    };
    match args.daemon {
        true => daemon(&socket, &config),
        false => match agent::bind(&socket) {
            Ok(Some(listener)) => serve(listener, &config),
            Ok(None) => {
                tracing::info!("@{socket} is taken: another agent runs");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("viad: cannot bind @{socket}: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

fn serve(listener: OwnedFd, config: &Config) -> ExitCode {
    tracing::info!("listening");
    match agent::run(listener, config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("event loop failed: {e}");
            // Also where no log is kept: the agent refused to run.
            eprintln!("viad: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Forks the agent into its own session; the parent returns once the child
/// has bound the socket (or found it taken), as reported over a pipe.
fn daemon(socket: &str, config: &Config) -> ExitCode {
    let mut ends = [0; 2];
    // SAFETY: the process is single-threaded here, so fork is sound; every
    // descriptor created is owned exactly once.
    let (pid, read_end, write_end) = unsafe {
        if libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            eprintln!("viad: pipe: {}", std::io::Error::last_os_error());
            return ExitCode::FAILURE;
        }
        let (r, w) = (File::from_raw_fd(ends[0]), File::from_raw_fd(ends[1]));
        (libc::fork(), r, w)
    };
    match pid {
        -1 => {
            eprintln!("viad: fork: {}", std::io::Error::last_os_error());
            ExitCode::FAILURE
        }
        0 => {
            drop(read_end);
            detach();
            let (status, listener) = match agent::bind(socket) {
                Ok(Some(l)) => (b'B', Some(l)),
                Ok(None) => (b'T', None),
                Err(_) => (b'E', None),
            };
            let _ = (&write_end).write_all(&[status]);
            drop(write_end);
            match listener {
                Some(l) => serve(l, config),
                None if status == b'T' => ExitCode::SUCCESS,
                None => ExitCode::FAILURE,
            }
        }
        _ => {
            drop(write_end);
            let mut status = [0u8];
            match (&read_end).read_exact(&mut status) {
                Ok(()) if status[0] != b'E' => ExitCode::SUCCESS,
                _ => {
                    eprintln!("viad: the agent could not bind @{socket}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Starts a new session and points stdin/stdout/stderr at /dev/null.
fn detach() {
    // SAFETY: plain syscalls on descriptors 0-2, which dup2 replaces.
    unsafe {
        libc::setsid();
        if let Ok(null) = File::options().read(true).write(true).open("/dev/null") {
            for fd in 0..3 {
                libc::dup2(null.as_raw_fd(), fd);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Args, String> {
        Args::try_parse_from(std::iter::once("viad").chain(s.split_whitespace())).map_err(|e| e.to_string())
    }

    #[test]
    fn parses() {
        let a = args("--daemon --idle-timeout 0 --socket x --idle-timeout 5").unwrap();
        assert!(a.daemon && !a.stats);
        assert_eq!((a.idle, a.socket.as_deref()), (Some(5), Some("x")));
        assert_eq!(a.cm_port, None);
        assert_eq!(args("--cm-port 6000").unwrap().cm_port, Some(6000));
        assert_eq!(args("--cm-port 0").unwrap().cm_port, Some(0));
        assert_eq!(args("--max-connections-per-uid 7").unwrap().max_per_uid, Some(7));
        assert_eq!(args("").unwrap().max_per_uid, None);
        assert!(args("--stats").unwrap().stats);
        // --help and --version answer without running anything.
        use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
        for (flag, kind) in
            [("--help", DisplayHelp), ("-h", DisplayHelp), ("--version", DisplayVersion), ("-V", DisplayVersion)]
        {
            let e = Args::try_parse_from(["viad", flag]).unwrap_err();
            assert_eq!(e.kind(), kind, "{flag}");
        }
        let version = Args::try_parse_from(["viad", "--version"]).unwrap_err().to_string();
        assert_eq!(version.trim(), format!("viad {}", env!("CARGO_PKG_VERSION")));
        let help = Args::try_parse_from(["viad", "--help"]).unwrap_err().to_string();
        for option in
            ["--daemon", "--idle-timeout", "--socket", "--cm-port", "--max-connections-per-uid", "--stats", "--stop"]
        {
            assert!(help.contains(option), "{option} not in\n{help}");
        }
        for bad in [
            "--idle-timeout",
            "--idle-timeout x",
            "--socket",
            "--cm-port",
            "--cm-port 65536",
            "--cm-port -1",
            "--max-connections-per-uid",
            "--max-connections-per-uid 0",
            "--max-connections-per-uid x",
            "--bogus",
            "--stats --stop",
        ] {
            assert!(args(bad).is_err(), "{bad}");
        }
    }
}
