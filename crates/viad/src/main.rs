//! `viad`: the openvia host agent.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::ExitCode;
use std::time::Duration;

use viad::agent::{self, Config};
use viad::client::{self, Agent};

const USAGE: &str = "\
usage: viad [--daemon] [--idle-timeout SECONDS] [--socket NAME] [--cm-port PORT]
            [--max-connections-per-uid N]
       viad --stats [--socket NAME]
       viad --stop [--socket NAME]

  --daemon              run in the background; return once the agent listens
  --idle-timeout N      exit after N seconds without clients (default 10, 0 = never)
  --socket NAME         abstract socket name (default $VIA_AGENT_SOCKET or openvia-viad)
  --cm-port PORT        UDP port of the connection managers of all hosts
                        (default $VIA_CM_PORT or 60; 0 = this host only).
                        The default is privileged: only root binds it, and
                        messages from it come from a host's agent; a port of
                        1024 or more gives that protection up
  --max-connections-per-uid N
                        most connections one uid may hold at the agent
                        (default 1024; root and the agent's own uid are exempt)
  --stats               print the running agent's counters
  --stop                ask the running agent to exit
  -h, --help            show this text

Logging goes to stderr when VIA_LOG is set (e.g. VIA_LOG=debug).";

#[derive(Debug, Default)]
struct Args {
    daemon: bool,
    stats: bool,
    stop: bool,
    help: bool,
    idle: Option<u64>,
    socket: Option<String>,
    cm_port: Option<u16>,
    max_per_uid: Option<usize>,
}

/// Environment variable with the CM port (overridden by `--cm-port`).
const CM_PORT_ENV: &str = "VIA_CM_PORT";

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args::default();
    while let Some(arg) = argv.next() {
        let mut value = |what: &str| argv.next().ok_or(format!("{arg} needs {what}"));
        match arg.as_str() {
            "--daemon" => args.daemon = true,
            "--stats" => args.stats = true,
            "--stop" => args.stop = true,
            "-h" | "--help" => args.help = true,
            "--socket" => args.socket = Some(value("a name")?),
            "--idle-timeout" => {
                let v = value("a number of seconds")?;
                args.idle = Some(v.parse().map_err(|_| format!("bad --idle-timeout {v:?}"))?);
            }
            "--cm-port" => {
                let v = value("a port number")?;
                args.cm_port = Some(v.parse().map_err(|_| format!("bad --cm-port {v:?}"))?);
            }
            "--max-connections-per-uid" => {
                let v = value("a number of connections")?;
                let n = v.parse().ok().filter(|&n: &usize| n > 0);
                args.max_per_uid = Some(n.ok_or(format!("bad --max-connections-per-uid {v:?}"))?);
            }
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    if args.stats && args.stop {
        return Err("--stats and --stop exclude each other".into());
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("viad: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if args.help {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
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
                    eprintln!("viad: bad {CM_PORT_ENV} {v:?}\n{USAGE}");
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
        parse(s.split_whitespace().map(String::from))
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
