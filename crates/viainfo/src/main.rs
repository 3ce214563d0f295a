//! `viainfo`: what openvia sees on this host, as `ibv_devinfo`, `fi_info`
//! and `ucx_info` show it for their stacks: the VI devices (`via_IF`) with
//! their aliases, addresses, MTU and what their network transport could
//! use, the host agent (running or not, who, its CM port), every `VIA_*`
//! setting with its value and where it came from, and the version.  Text,
//! or JSON with `--json`.

mod report;

use clap::Parser;
use report::Report;
use std::process::ExitCode;

/// viainfo: the VI devices of this host, their aliases, the host agent and
/// openvia's effective configuration.
#[derive(Parser, Debug)]
#[command(name = "viainfo", version, after_help = "See viainfo(1) and vipl(7).")]
struct Args {
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
    /// Show only this device: a device name (via_lo, /dev/via_eth0) or an
    /// alias, resolved as VipOpenNic would
    #[arg(short, long, value_name = "NAME")]
    device: Option<String>,
    /// The agent's abstract socket (default $VIA_AGENT_SOCKET or openvia-viad)
    #[arg(long, value_name = "NAME")]
    socket: Option<String>,
    /// Also print every counter of the agent and what each setting does
    #[arg(short, long)]
    verbose: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut report = report::gather(args.socket.as_deref(), args.verbose);
    if let Some(name) = &args.device {
        match report::resolve(name) {
            Ok(device) => report.devices.retain(|d| d.name == device),
            Err(why) => {
                eprintln!("viainfo: {why}");
                return ExitCode::FAILURE;
            }
        }
    }
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("viainfo: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", text(&report, args.device.is_some(), args.verbose));
    }
    ExitCode::SUCCESS
}

/// Yes or no.
fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// The report as text; only the devices when `devices_only`, with each
/// setting's meaning when `verbose`.
fn text(r: &Report, devices_only: bool, verbose: bool) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let line = |o: &mut String, key: &str, value: &str| {
        let _ = writeln!(o, "\t{:<22}{value}", format!("{key}:"));
    };
    let _ = writeln!(o, "openvia {} ({}, {})", r.version, r.library.soname, r.library.api);
    if r.devices.is_empty() {
        let _ = writeln!(o, "\nno VI devices");
    }
    for d in &r.devices {
        let _ = writeln!(o, "\ndevice: {}", d.name);
        line(&mut o, "aliases", &if d.aliases.is_empty() { "-".into() } else { d.aliases.join(", ") });
        line(
            &mut o,
            "interface",
            &format!("{} (index {}, {})", d.interface, d.index, if d.up { "up" } else { "down" }),
        );
        line(&mut o, "host address", &d.host_address);
        if let Some(a6) = &d.host_address6 {
            line(&mut o, "host address (IPv6)", a6);
        }
        line(&mut o, "ipv4", &d.ipv4.join(", "));
        line(&mut o, "ipv6", &if d.ipv6.is_empty() { "-".into() } else { d.ipv6.join(", ") });
        line(&mut o, "mtu", &d.mtu.to_string());
        if let Some(mac) = &d.mac {
            line(&mut o, "ethernet address", mac);
        }
        let frames = match &d.ethernet_frames_why_not {
            None => "yes".to_string(),
            Some(why) => format!("no ({why})"),
        };
        line(&mut o, "ethernet frames", &frames);
        line(&mut o, "udp gso", yes(d.udp_gso));
        line(&mut o, "udp gro", yes(d.udp_gro));
        if let Some(e) = &d.probe_error {
            line(&mut o, "probe", e);
        }
    }
    if devices_only {
        return o;
    }
    let _ = writeln!(o, "\naliases:");
    if r.aliases.is_empty() {
        let _ = writeln!(o, "\t-");
    }
    for a in &r.aliases {
        let mut notes = vec![format!("{}: {}", a.source, a.origin)];
        if !a.device_present {
            notes.push("no such device now".into());
        }
        if a.hidden {
            notes.push("hidden by the environment's alias".into());
        }
        let _ = writeln!(o, "\t{} -> {} ({})", a.name, a.device, notes.join("; "));
    }
    let f = &r.aliases_file;
    let status = match &f.error {
        Some(e) => format!("invalid, none of its aliases is used: {e}"),
        None if f.status == "ok" => format!("{} aliases", f.aliases),
        None => f.status.to_string(),
    };
    let _ = writeln!(o, "aliases file: {} ({}): {status}", f.path, f.source);

    let a = &r.agent;
    let _ = writeln!(o, "\nagent: @{}", a.socket);
    line(&mut o, "running", yes(a.running));
    if let Some(e) = &a.error {
        line(&mut o, "error", e);
    }
    if a.running {
        line(&mut o, "pid", &a.pid.map_or("?".into(), |p| p.to_string()));
        let user = match (&a.user, a.uid) {
            (Some(u), Some(id)) => format!("{u} (uid {id})"),
            (None, Some(id)) => format!("uid {id}"),
            _ => "?".into(),
        };
        line(&mut o, "user", &user);
        let cm = match (a.cm_port, a.cm_bound, &a.cm_why_not) {
            (Some(p), Some(true), _) => format!(
                "{p}, bound{}",
                if a.cm_port_privileged == Some(true) {
                    " (privileged)"
                } else {
                    " (not privileged: any user may bind it)"
                }
            ),
            (Some(p), _, Some(why)) => format!("{p}, not bound: {why}"),
            _ => "?".into(),
        };
        line(&mut o, "cm port", &cm);
        if let Some(u) = a.uptime_seconds {
            line(&mut o, "uptime", &format!("{u} s"));
        }
        if let Some(s) = a.sessions {
            line(&mut o, "sessions", &s.to_string());
        }
        for (name, value) in a.counters.iter().flatten() {
            line(&mut o, name, &value.to_string());
        }
    }

    let _ = writeln!(o, "\nconfiguration:");
    let width = r.configuration.iter().map(|s| s.name.len()).max().unwrap_or(0);
    for s in &r.configuration {
        let value = if s.value.is_empty() { "-" } else { &s.value };
        let _ = write!(o, "\t{:<width$}  {:<11}  {value}", s.name, s.source);
        if let Some(p) = &s.problem {
            let _ = write!(o, "  INVALID: {p}");
        }
        if verbose {
            let _ = write!(o, "  ({}; read by {})", s.meaning, s.read_by);
        }
        o.push('\n');
    }
    o
}
