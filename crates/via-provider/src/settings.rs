//! Every `VIA_*` environment variable openvia reads, in one table, with its
//! default and a check of its value: `viainfo` prints the effective
//! configuration from it, and a test keeps it complete.

use crate::tuning::Tuning;
use std::net::{IpAddr, Ipv4Addr, UdpSocket};

/// One setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The variable, e.g. `VIA_DOORBELL`.
    pub name: &'static str,
    /// Who reads it: `libvipl`, `viad`, or both.
    pub read_by: &'static str,
    /// What applies when it is unset.
    pub default: String,
    /// What it does, in a few words.
    pub meaning: &'static str,
}

/// Where a setting's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// This process's environment.
    Environment,
    /// Not set: the default applies.
    Default,
}

impl Source {
    /// `environment` or `default`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Environment => "environment",
            Source::Default => "default",
        }
    }
}

/// A setting as this process's environment makes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effective {
    /// The setting.
    pub setting: Setting,
    /// Its value: the environment's, or the default.
    pub value: String,
    /// Where the value came from.
    pub source: Source,
    /// What is wrong with the value, if anything (what openvia then does).
    pub problem: Option<String>,
}

/// Every setting openvia reads, in the order of `docs/tuning.md`'s table.
pub fn settings() -> Vec<Setting> {
    let t = Tuning::default();
    let d = |key: &str| t.describe().into_iter().find(|(k, _)| *k == key).map(|(_, v)| v).unwrap_or_default();
    let s = |name, read_by, default: String, meaning| Setting { name, read_by, default, meaning };
    vec![
        s(
            "VIA_LOG",
            "libvipl, viad",
            "warn (libvipl), nothing (viad)".into(),
            "log filter for stderr, e.g. debug or via_provider=info",
        ),
        s(
            "VIA_AGENT_SOCKET",
            "libvipl, viad",
            viad_client::client::DEFAULT_SOCKET.into(),
            "abstract socket name of the host agent",
        ),
        s(
            "VIA_VIAD",
            "libvipl",
            "viad beside libvipl, in its bindir, else on PATH".into(),
            "the agent binary started on demand",
        ),
        s("VIA_VIAD_IDLE", "libvipl", "10".into(), "--idle-timeout (seconds) of an agent started on demand"),
        s(
            "VIA_CM_PORT",
            "viad",
            via_wire::cm::CM_PORT.to_string(),
            "UDP port of the connection managers (0: this host only)",
        ),
        s("VIA_DEVICE_ALIASES", "libvipl", String::new(), "device aliases NAME=TARGET,... resolved by the library"),
        s("VIA_DEVICES_FILE", "viad", viad_client::aliases::DEFAULT_FILE.into(), "the aliases file the agent reads"),
        s("VIA_DOORBELL", "libvipl", d("doorbell"), "how a send reaches its executor: direct, d1, d2"),
        s("VIA_CQ", "libvipl", d("cq"), "completion queue implementation: cq1, cq2"),
        s("VIA_INLINE_MAX", "libvipl", d("inline_max"), "largest send copied inline into the ring (bytes)"),
        s("VIA_SEGMENT_SIZE", "libvipl", "from the MTU".into(), "payload bytes per UDP packet"),
        s("VIA_RECV_BATCH", "libvipl", d("recv_batch"), "datagrams per recvmmsg"),
        s(
            "VIA_SPIN_US",
            "libvipl",
            d("spin").trim_end_matches("us").into(),
            "spin before sleeping (microseconds or adaptive)",
        ),
        s("VIA_PAYLOAD_CRC", "libvipl", d("payload_crc"), "CRC-32C over network payloads: on, off"),
        s("VIA_ETHERNET", "libvipl", d("ethernet"), "Ethernet frames to peers on the link: on, off"),
        s("VIA_GSO", "libvipl", d("gso"), "UDP segmentation offload and receive coalescing: 1, 0"),
        s("VIA_PIN_MEMORY", "libvipl", d("pin_memory"), "1: lock registered memory (mlock)"),
        s("VIA_PROFILE", "libvipl", String::new(), "file the data path's stage timings are appended to"),
    ]
}

/// What is wrong with `value` for setting `name`, if anything.
pub fn check(name: &str, value: &str) -> Option<String> {
    match name {
        "VIA_DOORBELL" | "VIA_CQ" | "VIA_INLINE_MAX" | "VIA_SEGMENT_SIZE" | "VIA_RECV_BATCH" | "VIA_SPIN_US"
        | "VIA_PAYLOAD_CRC" | "VIA_ETHERNET" | "VIA_GSO" | "VIA_PIN_MEMORY" => {
            Tuning::parse(|n| (n == name).then(|| value.to_string()))
                .err()
                .map(|why| format!("{why} (VipOpenNic fails)"))
        }
        "VIA_CM_PORT" => value.parse::<u16>().err().map(|_| "expected a port number (viad refuses to start)".into()),
        "VIA_VIAD_IDLE" => value.parse::<u64>().err().map(|_| "expected seconds (ignored)".into()),
        "VIA_DEVICE_ALIASES" => {
            viad_client::aliases::Aliases::parse_env(value).err().map(|why| format!("{why} (VipOpenNic fails)"))
        }
        _ => None,
    }
}

/// Every setting as this process's environment makes it.
pub fn effective() -> Vec<Effective> {
    settings()
        .into_iter()
        .map(|setting| match std::env::var(setting.name) {
            Ok(value) => {
                Effective { problem: check(setting.name, &value), setting, value, source: Source::Environment }
            }
            Err(e) => Effective {
                problem: matches!(e, std::env::VarError::NotUnicode(_)).then(|| "not UTF-8 text".into()),
                value: setting.default.clone(),
                setting,
                source: Source::Default,
            },
        })
        .collect()
}

/// What the network transport of a port on a device could use, probed the
/// way a port probes when it opens (`net`, `ether`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offloads {
    /// The kernel takes UDP GSO buffers (`UDP_SEGMENT`).
    pub gso: bool,
    /// The socket takes coalesced datagrams (`UDP_GRO`).
    pub gro: bool,
    /// Ethernet frames to peers on the link: `Ok` if possible, else why not.
    pub ethernet: Result<(), String>,
}

/// Probes a UDP socket on `ip` (the device's IPv4 address) as a port would,
/// without `VIA_GSO` or `VIA_ETHERNET`: what the kernel and the interface
/// allow.  Fails when no socket can be bound there.
pub fn probe(ip: Ipv4Addr) -> Result<Offloads, String> {
    let socket = UdpSocket::bind((IpAddr::V4(ip), 0)).map_err(|e| format!("cannot bind a UDP socket on {ip}: {e}"))?;
    let gso = crate::transport::udp::kernel_has_gso(&socket);
    let gro = gso && crate::transport::udp::peer_socket::set_option(&socket, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
    let ethernet = match ip.is_loopback() {
        true => Err("loopback".into()),
        false => crate::transport::udp::ether::frames_possible(ip),
    };
    Ok(Offloads { gso, gro, ethernet })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Every `"VIA_..."` literal in the sources of the workspace's crates.
    fn names_in_sources() -> Vec<(String, String)> {
        fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut files = Vec::new();
        for c in std::fs::read_dir(crates).unwrap().flatten() {
            if c.path().join("src").is_dir() {
                walk(&c.path().join("src"), &mut files);
            }
        }
        let mut out = Vec::new();
        for f in files.iter().filter(|f| !f.ends_with("settings.rs")) {
            let text = std::fs::read_to_string(f).unwrap();
            for (i, _) in text.match_indices("\"VIA_") {
                let name: String = text[i + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                out.push((name, f.display().to_string()));
            }
        }
        out
    }

    #[test]
    fn the_table_names_every_setting_the_code_reads() {
        let table: Vec<&str> = settings().iter().map(|s| s.name).collect();
        let found = names_in_sources();
        assert!(found.len() > 10, "{found:?}");
        for (name, file) in found {
            // Read by tests only: set by the test of queue_lock for a child
            // it runs; the seeds of the whole-provider simulator.
            if ["VIA_TEST_PREPARE_CHILD", "VIA_PROVIDER_SIM_SEED", "VIA_PROVIDER_SIM_SEEDS"].contains(&name.as_str()) {
                continue;
            }
            assert!(table.contains(&name.as_str()), "{name} ({file}) is not in settings()");
        }
        let mut sorted = table.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), table.len(), "a setting twice");
    }

    #[test]
    fn checks() {
        assert_eq!(check("VIA_DOORBELL", "d2"), None);
        assert!(check("VIA_DOORBELL", "d3").unwrap().contains("VIA_DOORBELL=\"d3\""));
        assert!(check("VIA_RECV_BATCH", "0").is_some() && check("VIA_RECV_BATCH", "64").is_none());
        assert!(check("VIA_CM_PORT", "65536").is_some() && check("VIA_CM_PORT", "6000").is_none());
        assert!(check("VIA_GSO", "2").is_some() && check("VIA_GSO", "off").is_none());
        assert!(check("VIA_DEVICE_ALIASES", "nic0").unwrap().contains("entry 1"));
        assert!(check("VIA_DEVICE_ALIASES", "nic0=lo").is_none());
        let all = settings();
        let default = |n: &str| all.iter().find(|s| s.name == n).unwrap().default.clone();
        assert_eq!(default("VIA_DOORBELL"), "direct");
        assert_eq!(default("VIA_SPIN_US"), "50");
        assert_eq!(default("VIA_CM_PORT"), "60");
    }

    #[test]
    fn loopback_probe() {
        let p = probe(Ipv4Addr::LOCALHOST).unwrap();
        assert_eq!(p.ethernet, Err("loopback".to_string()));
        assert!(p.gso || !p.gro, "{p:?}");
    }
}
