//! What `viainfo` reports, gathered into one serialisable value: the VI
//! devices of this host with their aliases, the host agent, the effective
//! configuration and the version.

use serde::Serialize;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use viad_client::aliases::{self, Aliases, Origin};
use viad_client::client::{Agent, AgentError};
use viad_client::{device, netif};

/// The shared library's name for the dynamic linker (`crates/vipl/build.rs`).
pub const SONAME: &str = "libvipl.so.1";

/// Everything `viainfo` prints.
#[derive(Debug, Serialize)]
pub struct Report {
    /// openvia's version.
    pub version: &'static str,
    /// The library that programs link.
    pub library: Library,
    /// The VI devices, in the kernel's order of interfaces.
    pub devices: Vec<Device>,
    /// Every alias this program would see: its own environment's, then the
    /// aliases file's.
    pub aliases: Vec<AliasInfo>,
    /// The aliases file, as the agent would read it with this program's
    /// environment.
    pub aliases_file: AliasesFile,
    /// The host agent.
    pub agent: AgentInfo,
    /// Every `VIA_*` setting, its value and where the value came from.
    pub configuration: Vec<SettingInfo>,
}

/// The library.
#[derive(Debug, Serialize)]
pub struct Library {
    /// `libvipl.so.1`.
    pub soname: &'static str,
    /// The API it implements.
    pub api: &'static str,
}

/// One VI device.
#[derive(Debug, Serialize)]
pub struct Device {
    /// `via_IF`.
    pub name: String,
    /// The names of the aliases that stand for it.
    pub aliases: Vec<String>,
    /// The interface.
    pub interface: String,
    /// The interface's index.
    pub index: u32,
    /// Whether the interface is up.
    pub up: bool,
    /// The device's host address (what `VipQueryNic` reports).
    pub host_address: String,
    /// The device's IPv6 host address, if it has a global one.
    pub host_address6: Option<String>,
    /// Every IPv4 address of the interface.
    pub ipv4: Vec<String>,
    /// Every IPv6 address of the interface.
    pub ipv6: Vec<String>,
    /// The interface's MTU.
    pub mtu: u32,
    /// The interface's Ethernet address.
    pub mac: Option<String>,
    /// Whether a port could send Ethernet frames to peers on the link.
    pub ethernet_frames: bool,
    /// Why not, if not.
    pub ethernet_frames_why_not: Option<String>,
    /// Whether the kernel takes UDP GSO buffers on a socket of the device.
    pub udp_gso: bool,
    /// Whether a socket of the device takes coalesced datagrams (GRO).
    pub udp_gro: bool,
    /// Why the offloads could not be probed, if they could not.
    pub probe_error: Option<String>,
}

/// One alias.
#[derive(Debug, Serialize)]
pub struct AliasInfo {
    /// The name, as written.
    pub name: String,
    /// The device it stands for.
    pub device: String,
    /// `environment` (`VIA_DEVICE_ALIASES`) or `file`.
    pub source: &'static str,
    /// The entry or the file and line.
    pub origin: String,
    /// Whether that device exists on this host now.
    pub device_present: bool,
    /// Whether an alias of the same name in the environment hides this one.
    pub hidden: bool,
}

/// The aliases file.
#[derive(Debug, Serialize)]
pub struct AliasesFile {
    /// Its path.
    pub path: String,
    /// `environment` (`VIA_DEVICES_FILE`) or `default`.
    pub source: &'static str,
    /// `ok`, `absent` or `invalid`.
    pub status: &'static str,
    /// How many aliases it defines.
    pub aliases: usize,
    /// Why it is not used, if it is invalid.
    pub error: Option<String>,
}

/// The host agent.
#[derive(Debug, Default, Serialize)]
pub struct AgentInfo {
    /// The abstract socket name asked.
    pub socket: String,
    /// Whether an agent answered.
    pub running: bool,
    /// Why no agent answered, or why its answer is not used.
    pub error: Option<String>,
    /// The agent's process id.
    pub pid: Option<u64>,
    /// The agent's uid.
    pub uid: Option<u64>,
    /// The name of that uid.
    pub user: Option<String>,
    /// The CM port the agent was asked to bind (0: none).
    pub cm_port: Option<u64>,
    /// Whether it holds it.
    pub cm_bound: Option<bool>,
    /// Why not, if not.
    pub cm_why_not: Option<String>,
    /// Whether the port is privileged here (only root binds it).
    pub cm_port_privileged: Option<bool>,
    /// Seconds the agent has run.
    pub uptime_seconds: Option<u64>,
    /// Open devices (sessions) of processes.
    pub sessions: Option<u64>,
    /// Every counter of the agent (`--verbose`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counters: Option<BTreeMap<String, u64>>,
}

/// One setting.
#[derive(Debug, Serialize)]
pub struct SettingInfo {
    /// The variable.
    pub name: &'static str,
    /// Its value: the environment's, or the default.
    pub value: String,
    /// `environment` or `default`.
    pub source: &'static str,
    /// The default.
    pub default: String,
    /// Who reads it.
    pub read_by: &'static str,
    /// What it does.
    pub meaning: &'static str,
    /// What is wrong with the value, if anything.
    pub problem: Option<String>,
}

/// Gathers the report; `agent_socket` is the socket to ask (default: the
/// one the library would use), `counters` whether to keep every counter.
pub fn gather(agent_socket: Option<&str>, counters: bool) -> Report {
    let env = Aliases::from_env();
    let file = aliases::load_file();
    let devices = devices(env.as_ref().ok(), file.as_ref().ok());
    Report {
        version: env!("CARGO_PKG_VERSION"),
        library: Library { soname: SONAME, api: "VIA 1.0 (VIPL)" },
        aliases: alias_list(env.as_ref().ok(), file.as_ref().ok(), &devices),
        aliases_file: aliases_file(&file),
        devices,
        agent: agent(agent_socket, counters),
        configuration: configuration(),
    }
}

fn devices(env: Option<&Aliases>, file: Option<&Aliases>) -> Vec<Device> {
    let interfaces = netif::interfaces().unwrap_or_default();
    let all: Vec<&aliases::Alias> = env.into_iter().chain(file).flat_map(|a| a.iter()).collect();
    device::devices()
        .into_iter()
        .map(|d| {
            let i = interfaces.iter().find(|i| i.name == d.interface);
            let ip = Ipv4Addr::from(<[u8; 4]>::try_from(&d.host_addr[..]).unwrap_or([0; 4]));
            let probe = via_provider::settings::probe(ip);
            let (ethernet_frames, why_not) = match probe.as_ref().map(|p| p.ethernet.clone()) {
                Ok(Ok(())) => (true, None),
                Ok(Err(why)) => (false, Some(why)),
                Err(why) => (false, Some(why.clone())),
            };
            Device {
                aliases: all.iter().filter(|a| a.device == d.name).map(|a| a.name.clone()).collect(),
                index: i.map_or(0, |i| i.index),
                up: i.is_some_and(|i| i.is_up()),
                host_address: ip.to_string(),
                host_address6: d.host_addr6.as_deref().and_then(|a| <[u8; 16]>::try_from(a).ok()).map(|a| {
                    let v6 = std::net::Ipv6Addr::from(a);
                    v6.to_string()
                }),
                ipv4: i.map(|i| i.ipv4().map(|a| a.to_string()).collect()).unwrap_or_default(),
                ipv6: i.map(|i| i.ipv6().map(|a| a.to_string()).collect()).unwrap_or_default(),
                mac: i.and_then(|i| i.mac).map(|m| m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")),
                ethernet_frames,
                ethernet_frames_why_not: why_not,
                udp_gso: probe.as_ref().is_ok_and(|p| p.gso),
                udp_gro: probe.as_ref().is_ok_and(|p| p.gro),
                probe_error: probe.err(),
                mtu: d.mtu,
                interface: d.interface,
                name: d.name,
            }
        })
        .collect()
}

fn alias_list(env: Option<&Aliases>, file: Option<&Aliases>, devices: &[Device]) -> Vec<AliasInfo> {
    let present = |name: &str| devices.iter().any(|d| d.name == name);
    let mut out = Vec::new();
    for a in env.into_iter().flat_map(|a| a.iter()) {
        out.push(AliasInfo {
            name: a.name.clone(),
            device: a.device.clone(),
            source: "environment",
            origin: a.origin.to_string(),
            device_present: present(&a.device),
            hidden: false,
        });
    }
    for a in file.into_iter().flat_map(|a| a.iter()) {
        out.push(AliasInfo {
            name: a.name.clone(),
            device: a.device.clone(),
            source: "file",
            origin: match &a.origin {
                Origin::File { path, line } => format!("{}:{line}", path.display()),
                other => other.to_string(),
            },
            device_present: present(&a.device),
            hidden: env.is_some_and(|e| e.lookup(&a.name).is_some()),
        });
    }
    out
}

fn aliases_file(file: &Result<Aliases, String>) -> AliasesFile {
    let (path, chosen) = aliases::file_path();
    let (status, aliases, error) = match file {
        Ok(a) if a.is_empty() && !path.exists() => ("absent", 0, None),
        Ok(a) => ("ok", a.len(), None),
        Err(why) => ("invalid", 0, Some(why.clone())),
    };
    AliasesFile {
        path: path.display().to_string(),
        source: if chosen { "environment" } else { "default" },
        status,
        aliases,
        error,
    }
}

fn agent(socket: Option<&str>, keep_counters: bool) -> AgentInfo {
    let socket = socket.map_or_else(viad_client::client::socket_name, str::to_string);
    let mut info = AgentInfo { socket: socket.clone(), ..AgentInfo::default() };
    let counters = match Agent::with_socket(&socket).stats() {
        Ok(c) => c.into_iter().collect::<BTreeMap<_, _>>(),
        Err(e @ AgentError::Unavailable(_)) => {
            info.error = Some(format!("not running: {e}"));
            return info;
        }
        Err(e) => {
            info.error = Some(e.to_string());
            return info;
        }
    };
    let get = |n: &str| counters.get(n).copied();
    info.running = true;
    info.pid = get("pid");
    info.uid = get("uid");
    info.user = info.uid.and_then(|u| user_name(u as libc::uid_t));
    info.uptime_seconds = get("uptime_seconds");
    info.sessions = get("sessions");
    let bound = get("cm_port").unwrap_or(0);
    let errno = get("cm_bind_errno").unwrap_or(0) as i32;
    info.cm_port = get("cm_port_configured").or(Some(bound));
    info.cm_bound = Some(bound != 0);
    info.cm_port_privileged = get("cm_port_privileged").map(|p| p != 0);
    info.cm_why_not = match (bound, errno, info.cm_port) {
        (0, 0, Some(0)) => Some("no CM port (--cm-port 0 or VIA_CM_PORT=0): this host only".into()),
        (0, 0, _) => Some("not bound".into()),
        (0, e, _) => Some(format!("{}: {}", std::io::Error::from_raw_os_error(e), bind_hint(e))),
        _ => None,
    };
    if keep_counters {
        info.counters = Some(counters);
    }
    info
}

/// What to do about a failed bind of the CM port.
fn bind_hint(errno: i32) -> &'static str {
    match errno {
        libc::EACCES => "the port is privileged: run viad as root, or set one unprivileged VIA_CM_PORT on every host",
        libc::EADDRINUSE => "another process holds it (another agent, or a squatter)",
        _ => "see the agent's log (VIA_LOG)",
    }
}

/// The name of user `uid`, if the user database has one.
fn user_name(uid: libc::uid_t) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: a zeroed passwd is valid; getpwuid_r writes into it and into
    // `buf`, whose length it is told, and sets `out` to it or to NULL.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        if libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) != 0 || out.is_null() {
            return None;
        }
        Some(std::ffi::CStr::from_ptr(pw.pw_name).to_string_lossy().into_owned())
    }
}

fn configuration() -> Vec<SettingInfo> {
    via_provider::settings::effective()
        .into_iter()
        .map(|e| {
            let mut problem = e.problem;
            if e.setting.name == "VIA_LOG" && e.source == via_provider::settings::Source::Environment {
                if let Err(why) = tracing_subscriber::EnvFilter::try_new(&e.value) {
                    problem = Some(format!("not a log filter: {why}"));
                }
            }
            SettingInfo {
                name: e.setting.name,
                value: e.value,
                source: e.source.as_str(),
                default: e.setting.default,
                read_by: e.setting.read_by,
                meaning: e.setting.meaning,
                problem,
            }
        })
        .collect()
}

/// The device `name` stands for, resolved as `VipOpenNic` would: this
/// program's aliases, the devices, the aliases file.  The error says why
/// not and lists the valid names.
pub fn resolve(name: &str) -> Result<String, String> {
    let env = Aliases::from_env()?;
    if let Some(a) = env.lookup(name) {
        return Ok(a.device.clone());
    }
    if device::interface_name(name).is_some() {
        return device::resolve(name)
            .map(|d| d.name)
            .map_err(|why| format!("{why}; {}", aliases::valid_names(&aliases::load_file())));
    }
    aliases::resolve(name).map(|d| d.name).map_err(|why| match env.is_empty() {
        true => why,
        false => format!("{why}, {}", env.describe()),
    })
}
