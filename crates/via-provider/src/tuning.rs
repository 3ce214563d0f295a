//! The provider's design alternatives and tuning knobs, read once from the
//! environment (`docs/tuning.md`).  Each alternative is a real code path:
//! the doorbell of a send (`doorbell`), the completion queue's
//! implementation (`cq`), the small-message path (`vi::deliver`), the
//! network transport's segment size, receive batch and payload checksum
//! (`net`, `connect`), and the spin before sleeping (`timeout`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use via_shm::ring::INLINE_MAX;

/// How a posted send reaches whoever carries it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doorbell {
    /// The posting thread carries the send out inside `VipPostSend`.
    Direct,
    /// D1: one doorbell per VI; the NIC's send engine scans every VI's.
    PerVi,
    /// D2: one central send queue per NIC that every VI posts into.
    Central,
}

/// How `VipCQDone` finds a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqMode {
    /// CQ1: whoever completes a descriptor writes an entry into the CQ.
    Entries,
    /// CQ2: nobody writes entries; `VipCQDone` polls the CQ's work queues.
    Scan,
}

/// How long a waiter spins before sleeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spin {
    /// A fixed window.
    Fixed(Duration),
    /// A window that follows how long recent waits took.
    Adaptive,
}

/// Every setting, as read from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuning {
    /// `VIA_DOORBELL`: `direct` (default), `d1`, `d2`.
    pub doorbell: Doorbell,
    /// `VIA_CQ`: `cq1` (default), `cq2`.
    pub cq: CqMode,
    /// `VIA_INLINE_MAX`: sends up to this size are copied inline (0..=1024).
    pub inline_max: usize,
    /// `VIA_SEGMENT_SIZE`: payload bytes per UDP packet (default: from the
    /// MTU, or large packets); ports use [`segment_size`], which a program
    /// may change with [`set_segment_size`].
    pub segment_size: Option<usize>,
    /// `VIA_RECV_BATCH`: datagrams per `recvmmsg` (1..=64, default 32).
    pub recv_batch: usize,
    /// `VIA_SPIN_US`: microseconds, or `adaptive` (default 50).
    pub spin: Spin,
    /// `VIA_PAYLOAD_CRC`: `on` (default) or `off`.  Off declines the
    /// CRC-32C over payloads on the network; a connection goes without it
    /// only if both ends decline, and its payloads then rest on UDP's
    /// checksum, as TCP's do.
    pub payload_crc: bool,
    /// `VIA_ETHERNET`: `on` (default) or `off`.  On, a port also sends
    /// packets as Ethernet frames to peers on its link that take them
    /// (`ether`), where the process may open a packet socket.
    pub ethernet: bool,
    /// `VIA_GSO`: `1` (default) or `0`.  Whether ports use UDP segmentation
    /// offload and receive coalescing, and so large packets.
    pub gso: bool,
    /// `VIA_PIN_MEMORY`: `0` (default) or `1`.  `1` locks registered memory
    /// (`mlock`).
    pub pin_memory: bool,
    /// `VIA_PROFILE`: time the stages of the data path and append them to this file at `VipCloseNic`.
    pub profile: Option<PathBuf>,
}

/// The largest receive batch.
pub const MAX_RECV_BATCH: usize = 64;

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            doorbell: Doorbell::Direct,
            cq: CqMode::Entries,
            inline_max: INLINE_MAX,
            segment_size: None,
            recv_batch: 32,
            spin: Spin::Fixed(Duration::from_micros(50)),
            payload_crc: true,
            ethernet: true,
            gso: true,
            pin_memory: false,
            profile: None,
        }
    }
}

impl Tuning {
    /// Parses the settings from `get` (a variable's value by name); an
    /// unknown value is an error that names the variable.
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Tuning, String> {
        let mut t = Tuning::default();
        let bad = |name: &str, value: &str, want: &str| format!("{name}={value:?}: expected {want}");
        if let Some(v) = get("VIA_DOORBELL") {
            t.doorbell = match v.as_str() {
                "direct" => Doorbell::Direct,
                "d1" => Doorbell::PerVi,
                "d2" => Doorbell::Central,
                _ => return Err(bad("VIA_DOORBELL", &v, "direct, d1 or d2")),
            };
        }
        if let Some(v) = get("VIA_CQ") {
            t.cq = match v.as_str() {
                "cq1" => CqMode::Entries,
                "cq2" => CqMode::Scan,
                _ => return Err(bad("VIA_CQ", &v, "cq1 or cq2")),
            };
        }
        if let Some(v) = get("VIA_INLINE_MAX") {
            t.inline_max = match v.parse() {
                Ok(n) if n <= INLINE_MAX => n,
                _ => return Err(bad("VIA_INLINE_MAX", &v, &format!("0..={INLINE_MAX} bytes"))),
            };
        }
        if let Some(v) = get("VIA_SEGMENT_SIZE") {
            t.segment_size = match v.parse() {
                Ok(n) if n > 0 => Some(n),
                _ => return Err(bad("VIA_SEGMENT_SIZE", &v, "a positive number of bytes")),
            };
        }
        if let Some(v) = get("VIA_RECV_BATCH") {
            t.recv_batch = match v.parse() {
                Ok(n) if (1..=MAX_RECV_BATCH).contains(&n) => n,
                _ => return Err(bad("VIA_RECV_BATCH", &v, &format!("1..={MAX_RECV_BATCH} datagrams"))),
            };
        }
        if let Some(v) = get("VIA_SPIN_US") {
            t.spin = match (v.as_str(), v.parse()) {
                ("adaptive", _) => Spin::Adaptive,
                (_, Ok(us)) => Spin::Fixed(Duration::from_micros(us)),
                _ => return Err(bad("VIA_SPIN_US", &v, "microseconds or adaptive")),
            };
        }
        if let Some(v) = get("VIA_PAYLOAD_CRC") {
            t.payload_crc = match v.as_str() {
                "on" => true,
                "off" => false,
                _ => return Err(bad("VIA_PAYLOAD_CRC", &v, "on or off")),
            };
        }
        if let Some(v) = get("VIA_ETHERNET") {
            t.ethernet = match v.as_str() {
                "on" => true,
                "off" => false,
                _ => return Err(bad("VIA_ETHERNET", &v, "on or off")),
            };
        }
        if let Some(v) = get("VIA_GSO") {
            t.gso = match v.as_str() {
                "1" | "on" | "yes" | "" => true,
                "0" | "off" | "no" => false,
                _ => return Err(bad("VIA_GSO", &v, "1 or 0")),
            };
        }
        if let Some(v) = get("VIA_PIN_MEMORY") {
            t.pin_memory = match v.as_str() {
                "1" => true,
                "0" | "" => false,
                _ => return Err(bad("VIA_PIN_MEMORY", &v, "0 or 1")),
            };
        }
        t.profile = get("VIA_PROFILE").filter(|v| !v.is_empty()).map(PathBuf::from);
        Ok(t)
    }

    /// The settings as short `name=value` pairs, for profiles and logs.
    pub fn describe(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "doorbell",
                match self.doorbell {
                    Doorbell::Direct => "direct",
                    Doorbell::PerVi => "d1",
                    Doorbell::Central => "d2",
                }
                .into(),
            ),
            ("cq", if self.cq == CqMode::Entries { "cq1" } else { "cq2" }.into()),
            ("inline_max", self.inline_max.to_string()),
            ("segment_size", self.segment_size.map_or("mtu".into(), |n| n.to_string())),
            ("recv_batch", self.recv_batch.to_string()),
            (
                "spin",
                match self.spin {
                    Spin::Fixed(d) => format!("{}us", d.as_micros()),
                    Spin::Adaptive => "adaptive".into(),
                },
            ),
            ("payload_crc", if self.payload_crc { "on" } else { "off" }.into()),
            ("ethernet", if self.ethernet { "on" } else { "off" }.into()),
            ("gso", if self.gso { "1" } else { "0" }.into()),
            ("pin_memory", if self.pin_memory { "1" } else { "0" }.into()),
        ]
    }
}

/// The segment size set by [`set_segment_size`]: 0 for none, `usize::MAX`
/// until a program sets one (then `VIA_SEGMENT_SIZE` applies).
static SEGMENT_SIZE: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The payload bytes per UDP packet of network ports opened from now on
/// (`None`: from the MTU, or large packets): the settings' (a NIC's
/// `VIA_SEGMENT_SIZE`), unless the program set another with
/// [`set_segment_size`].
pub fn segment_size(settings: &Tuning) -> Option<usize> {
    match SEGMENT_SIZE.load(Ordering::Acquire) {
        usize::MAX => settings.segment_size,
        0 => None,
        n => Some(n),
    }
}

/// Sets the segment size of the network ports opened from now on (a NIC
/// opens its port at its first connection to another host), in place of
/// `VIA_SEGMENT_SIZE`: how a program that studies packet sizes, such as
/// viabench's `--segment`, changes it between NICs.  `Some(0)` counts as
/// `None`.
pub fn set_segment_size(bytes: Option<usize>) {
    SEGMENT_SIZE.store(bytes.unwrap_or(0), Ordering::Release);
}

/// The process's settings, or why the environment is wrong.
pub fn loaded() -> &'static Result<Tuning, String> {
    static TUNING: OnceLock<Result<Tuning, String>> = OnceLock::new();
    TUNING.get_or_init(|| Tuning::parse(|name| std::env::var(name).ok()))
}

/// The process's settings; defaults where the environment is wrong
/// (`VipOpenNic` refuses to open a NIC then, so no data path runs on them).
pub fn tuning() -> &'static Tuning {
    static DEFAULT: OnceLock<Tuning> = OnceLock::new();
    match loaded() {
        Ok(t) => t,
        Err(_) => DEFAULT.get_or_init(Tuning::default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<Tuning, String> {
        Tuning::parse(|name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn defaults_without_environment() {
        assert_eq!(parse(&[]).unwrap(), Tuning::default());
    }

    #[test]
    fn every_alternative_parses() {
        let t = parse(&[
            ("VIA_DOORBELL", "d2"),
            ("VIA_CQ", "cq2"),
            ("VIA_INLINE_MAX", "0"),
            ("VIA_SEGMENT_SIZE", "4096"),
            ("VIA_RECV_BATCH", "1"),
            ("VIA_SPIN_US", "adaptive"),
            ("VIA_PAYLOAD_CRC", "off"),
            ("VIA_ETHERNET", "off"),
            ("VIA_GSO", "no"),
            ("VIA_PIN_MEMORY", "1"),
            ("VIA_PROFILE", "/tmp/p.json"),
        ])
        .unwrap();
        assert_eq!(t.doorbell, Doorbell::Central);
        assert_eq!(t.cq, CqMode::Scan);
        assert_eq!(t.inline_max, 0);
        assert_eq!(t.segment_size, Some(4096));
        assert_eq!(t.recv_batch, 1);
        assert_eq!(t.spin, Spin::Adaptive);
        assert!(!t.payload_crc);
        assert!(!t.ethernet);
        assert!(!t.gso && t.pin_memory);
        assert_eq!(t.profile, Some(PathBuf::from("/tmp/p.json")));
        assert_eq!(parse(&[("VIA_DOORBELL", "d1")]).unwrap().doorbell, Doorbell::PerVi);
        assert_eq!(parse(&[("VIA_SPIN_US", "7")]).unwrap().spin, Spin::Fixed(Duration::from_micros(7)));
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (name, value) in [
            ("VIA_DOORBELL", "d3"),
            ("VIA_CQ", "scan"),
            ("VIA_INLINE_MAX", "4096"),
            ("VIA_SEGMENT_SIZE", "0"),
            ("VIA_RECV_BATCH", "65"),
            ("VIA_RECV_BATCH", "0"),
            ("VIA_SPIN_US", "fast"),
            ("VIA_PAYLOAD_CRC", "1"),
            ("VIA_ETHERNET", "yes"),
            ("VIA_GSO", "2"),
            ("VIA_PIN_MEMORY", "yes"),
        ] {
            let err = parse(&[(name, value)]).unwrap_err();
            assert!(err.contains(name), "{err}");
        }
    }
}
