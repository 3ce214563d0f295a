//! Device aliases: other names for VI devices, such as the `/dev/clanvi0`
//! that programs written for Giganet cLAN open, or a site's `nic0`.
//!
//! Aliases come from two places, resolved in two places:
//!
//! * **`VIA_DEVICE_ALIASES`**, the environment of the program: comma-separated
//!   `NAME=TARGET` entries, e.g. `/dev/clanvi0=via_eth0,nic0=lo`.  The
//!   library resolves them itself before it asks the agent, because one
//!   agent serves processes with different environments.
//! * **the aliases file** read by the agent, `/etc/openvia/devices` unless
//!   the agent's environment names another in `VIA_DEVICES_FILE`: one
//!   `NAME TARGET` pair a line, `#` starts a comment.  The agent reads it
//!   at each open of a name that is not a device, so an edit applies at
//!   the next `VipOpenNic`.  A client never tells the agent which file to
//!   read: an agent that runs as root would read any file for anyone.
//!
//! A name given to `VipOpenNic` is looked up in this order: the program's
//! `VIA_DEVICE_ALIASES`, then the devices (`/dev/via_IF`, `via_IF`), then
//! the file.  Names compare without a leading `/dev/`, as device names do:
//! an alias `/dev/clanvi0` also answers to `clanvi0`.  A `TARGET` is a
//! device (`via_eth0`, `/dev/via_eth0`) or an interface (`eth0`), never
//! another alias; an alias may not be a device name itself.  Whether the
//! target exists is checked when the alias is opened, not when it is read.
//! A bad entry or line is an error that names it: a bad
//! `VIA_DEVICE_ALIASES` fails every `VipOpenNic` of that program with
//! `VIP_INVALID_PARAMETER`, a bad file makes the agent use none of its
//! aliases (device names still open) and say why whenever a name is not
//! found.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::device;

/// The program's environment variable of aliases (`NAME=TARGET,...`).
pub const ENV: &str = "VIA_DEVICE_ALIASES";
/// The agent's environment variable that names its aliases file.
pub const FILE_ENV: &str = "VIA_DEVICES_FILE";
/// The aliases file unless `VIA_DEVICES_FILE` names another.
pub const DEFAULT_FILE: &str = "/etc/openvia/devices";
/// The largest aliases file read.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// The most aliases one source may define.
pub const MAX_ALIASES: usize = 4096;
/// The longest alias name: it travels to the agent as a device name.
pub const MAX_NAME: usize = 255;

/// Where an alias was defined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Entry `entry` (from 1) of `VIA_DEVICE_ALIASES`.
    Env {
        /// The entry's number, from 1.
        entry: usize,
    },
    /// Line `line` (from 1) of the aliases file at `path`.
    File {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
    },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Env { entry } => write!(f, "{ENV} entry {entry}"),
            Origin::File { path, line } => write!(f, "{}:{line}", path.display()),
        }
    }
}

/// One alias.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alias {
    /// The name as written, e.g. `/dev/clanvi0`.
    pub name: String,
    /// The device it stands for, always `via_IF`.
    pub device: String,
    /// Where it was defined.
    pub origin: Origin,
}

/// The aliases of one source, in the order they were written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Aliases {
    list: Vec<Alias>,
}

/// The form names compare in: without a leading `/dev/`.
fn key(name: &str) -> &str {
    name.strip_prefix("/dev/").unwrap_or(name)
}

/// Checks an alias name; the error says what is wrong with it.
fn check_name(name: &str) -> Result<(), String> {
    let k = key(name);
    if k.is_empty() {
        return Err(format!("empty alias name {name:?}"));
    }
    if name.len() > MAX_NAME {
        return Err(format!("alias name longer than {MAX_NAME} bytes"));
    }
    if let Some(c) = name.chars().find(|c| c.is_whitespace() || c.is_control() || matches!(c, '=' | ',' | '#')) {
        return Err(format!("alias name {name:?} holds {c:?}"));
    }
    if k.starts_with("via_") {
        return Err(format!("{name:?} is a device name: an alias may not stand for another device"));
    }
    Ok(())
}

/// The device a target names: `via_IF` and `/dev/via_IF` are devices,
/// anything else is an interface name.
fn target_device(target: &str) -> Result<String, String> {
    let k = key(target);
    let interface = k.strip_prefix("via_").unwrap_or(k);
    let bad = interface.is_empty()
        || interface.len() >= libc::IFNAMSIZ
        || interface.chars().any(|c| c.is_whitespace() || c.is_control() || matches!(c, '/' | '=' | ',' | '#'));
    match bad {
        true => Err(format!("{target:?} is neither a device (via_IF) nor an interface name")),
        false => Ok(format!("via_{interface}")),
    }
}

impl Aliases {
    /// Parses the value of `VIA_DEVICE_ALIASES`: `NAME=TARGET` entries
    /// separated by commas (blanks around them and empty entries are
    /// ignored).  The error names the entry.
    pub fn parse_env(value: &str) -> Result<Aliases, String> {
        let mut out = Aliases::default();
        for (i, raw) in value.split(',').enumerate() {
            let entry = raw.trim();
            if entry.is_empty() {
                continue;
            }
            let at = i + 1;
            let fail = |why: String| format!("{ENV} entry {at} {entry:?}: {why}");
            let (name, target) = entry.split_once('=').ok_or_else(|| fail("expected NAME=TARGET".into()))?;
            let (name, target) = (name.trim(), target.trim());
            check_name(name).map_err(fail)?;
            let device = target_device(target).map_err(fail)?;
            out.add(Alias { name: name.to_string(), device, origin: Origin::Env { entry: at } }).map_err(fail)?;
        }
        Ok(out)
    }

    /// Parses an aliases file: one `NAME TARGET` pair a line, blanks
    /// between, `#` to the end of the line a comment.  The error names the
    /// file and the line.
    pub fn parse_file(path: &Path, bytes: &[u8]) -> Result<Aliases, String> {
        let mut out = Aliases::default();
        for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
            let line = i + 1;
            let fail = |why: String| format!("{}:{line}: {why}", path.display());
            let text = std::str::from_utf8(raw).map_err(|_| fail("not UTF-8 text".into()))?;
            let text = text.split('#').next().unwrap_or_default().trim();
            if text.is_empty() {
                continue;
            }
            let fields: Vec<&str> = text.split_whitespace().collect();
            let [name, target] = fields[..] else {
                return Err(fail(format!("expected \"NAME TARGET\", found {text:?}")));
            };
            check_name(name).map_err(fail)?;
            let device = target_device(target).map_err(fail)?;
            let origin = Origin::File { path: path.to_path_buf(), line };
            out.add(Alias { name: name.to_string(), device, origin }).map_err(fail)?;
        }
        Ok(out)
    }

    fn add(&mut self, alias: Alias) -> Result<(), String> {
        if let Some(first) = self.lookup(&alias.name) {
            return Err(format!("alias {:?} is already defined at {}", alias.name, first.origin));
        }
        if self.list.len() == MAX_ALIASES {
            return Err(format!("more than {MAX_ALIASES} aliases"));
        }
        self.list.push(alias);
        Ok(())
    }

    /// The aliases of this program's `VIA_DEVICE_ALIASES` (none if it is
    /// unset or empty).
    pub fn from_env() -> Result<Aliases, String> {
        match std::env::var(ENV) {
            Ok(v) => Aliases::parse_env(&v),
            Err(std::env::VarError::NotPresent) => Ok(Aliases::default()),
            Err(std::env::VarError::NotUnicode(_)) => Err(format!("{ENV} is not UTF-8 text")),
        }
    }

    /// The alias `name` stands for, if any (`/dev/` or not).
    pub fn lookup(&self, name: &str) -> Option<&Alias> {
        self.list.iter().find(|a| key(&a.name) == key(name))
    }

    /// Every alias, in the order written.
    pub fn iter(&self) -> impl Iterator<Item = &Alias> {
        self.list.iter()
    }

    /// How many aliases there are.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The aliases as `NAME → DEVICE (ORIGIN)`, comma-separated.
    pub fn describe(&self) -> String {
        let all: Vec<String> = self.list.iter().map(|a| format!("{} → {} ({})", a.name, a.device, a.origin)).collect();
        all.join(", ")
    }
}

/// The aliases file this process would read, and whether `VIA_DEVICES_FILE`
/// chose it (else it is [`DEFAULT_FILE`]).
pub fn file_path() -> (PathBuf, bool) {
    match std::env::var_os(FILE_ENV).filter(|v| !v.is_empty()) {
        Some(p) => (PathBuf::from(p), true),
        None => (PathBuf::from(DEFAULT_FILE), false),
    }
}

/// Reads and checks the aliases file of [`file_path`].  A missing default
/// file holds no aliases; a missing file that `VIA_DEVICES_FILE` names is
/// an error, as is one that cannot be read, is larger than
/// [`MAX_FILE_BYTES`] or holds a bad line.
pub fn load_file() -> Result<Aliases, String> {
    let (path, chosen) = file_path();
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !chosen => return Ok(Aliases::default()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("{}: larger than {MAX_FILE_BYTES} bytes", path.display()));
    }
    Aliases::parse_file(&path, &bytes)
}

/// What the agent does with a name that a client opens: a device name
/// resolves as one; any other name through the aliases file.  The error
/// says why and lists the valid names (the devices and the file's aliases).
pub fn resolve(name: &str) -> Result<device::DeviceInfo, String> {
    if device::interface_name(name).is_some() {
        return device::resolve(name).map_err(|why| format!("{why}; {}", valid_names(&load_file())));
    }
    let file = load_file();
    if let Some(alias) = file.as_ref().ok().and_then(|a| a.lookup(name)) {
        return device::resolve(&alias.device).map_err(|why| {
            format!("{name:?} is an alias of {} ({}): {why}; {}", alias.device, alias.origin, valid_names(&file))
        });
    }
    Err(format!("{name:?} is neither a VI device (via_IF) nor an alias; {}", valid_names(&file)))
}

/// `valid names: ...`: the devices of this host and the aliases of `file`,
/// or why the file's aliases are not used.
pub fn valid_names(file: &Result<Aliases, String>) -> String {
    let devices: Vec<String> = device::devices().into_iter().map(|d| d.name).collect();
    let mut out = format!("valid names: {}", devices.join(", "));
    match file {
        Ok(a) if !a.is_empty() => out += &format!(", {}", a.describe()),
        Ok(_) => {}
        Err(why) => out += &format!(" (no aliases from the file: {why})"),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_entries() {
        let a = Aliases::parse_env(" /dev/clanvi0=via_eth0 , nic0=lo,,x=/dev/via_lo,").unwrap();
        assert_eq!(a.len(), 3);
        let clan = a.lookup("/dev/clanvi0").unwrap();
        assert_eq!((clan.device.as_str(), &clan.origin), ("via_eth0", &Origin::Env { entry: 1 }));
        // With or without /dev/, as device names.
        assert_eq!(a.lookup("clanvi0"), Some(clan));
        assert_eq!(a.lookup("/dev/nic0").unwrap().device, "via_lo");
        assert_eq!(a.lookup("x").unwrap().origin, Origin::Env { entry: 4 });
        assert_eq!(a.lookup("via_lo"), None);
        assert_eq!(a.lookup("nic"), None);
        assert!(Aliases::parse_env("").unwrap().is_empty());
        assert!(a.describe().contains("/dev/clanvi0 → via_eth0 (VIA_DEVICE_ALIASES entry 1)"), "{}", a.describe());
    }

    #[test]
    fn bad_env_entries_are_named() {
        for (value, want) in [
            ("nic0", "entry 1 \"nic0\": expected NAME=TARGET"),
            ("a=lo,b", "entry 2 \"b\": expected NAME=TARGET"),
            ("=lo", "empty alias name"),
            ("/dev/=lo", "empty alias name"),
            ("a b=lo", "holds ' '"),
            ("via_x=lo", "is a device name"),
            ("/dev/via_x=lo", "is a device name"),
            ("a=", "neither a device"),
            ("a=via_", "neither a device"),
            ("a=eth/0", "neither a device"),
            ("a=0123456789abcdef", "neither a device"),
            (
                "a=lo,/dev/a=eth0",
                "entry 2 \"/dev/a=eth0\": alias \"/dev/a\" is already defined at VIA_DEVICE_ALIASES entry 1",
            ),
        ] {
            let err = Aliases::parse_env(value).unwrap_err();
            assert!(err.contains(want), "{value:?}: {err}");
            assert!(err.starts_with("VIA_DEVICE_ALIASES entry "), "{err}");
        }
        let long = format!("{}=lo", "n".repeat(MAX_NAME + 1));
        assert!(Aliases::parse_env(&long).unwrap_err().contains("longer than"));
    }

    #[test]
    fn file_lines() {
        let path = Path::new("/etc/openvia/devices");
        let text = b"# openvia aliases\n\n/dev/clanvi0   eth0\n  nic0\tvia_lo   # the loopback\n#x y\n";
        let a = Aliases::parse_file(path, text).unwrap();
        assert_eq!(a.len(), 2);
        let clan = a.lookup("clanvi0").unwrap();
        assert_eq!(clan.device, "via_eth0");
        assert_eq!(clan.origin, Origin::File { path: path.into(), line: 3 });
        assert_eq!(clan.origin.to_string(), "/etc/openvia/devices:3");
        assert_eq!(a.lookup("nic0").unwrap().origin, Origin::File { path: path.into(), line: 4 });
        assert!(Aliases::parse_file(path, b"").unwrap().is_empty());
    }

    #[test]
    fn bad_file_lines_are_named() {
        let path = Path::new("/tmp/devices");
        for (text, want) in [
            (&b"a lo\nb\n"[..], "/tmp/devices:2: expected \"NAME TARGET\", found \"b\""),
            (b"a lo extra\n", "/tmp/devices:1: expected"),
            (b"\n\nvia_lo lo\n", "/tmp/devices:3: \"via_lo\" is a device name"),
            (b"a lo\n/dev/a eth0\n", "/tmp/devices:2: alias \"/dev/a\" is already defined at /tmp/devices:1"),
            (b"a lo\nb \xff\n", "/tmp/devices:2: not UTF-8 text"),
            (b"a=lo\n", "/tmp/devices:1: expected"),
            (b"a a/b\n", "/tmp/devices:1: \"a/b\" is neither"),
        ] {
            let err = Aliases::parse_file(path, text).unwrap_err();
            assert!(err.contains(want), "{text:?}: {err}");
        }
        let many: String = (0..=MAX_ALIASES).map(|i| format!("n{i} lo\n")).collect();
        assert!(Aliases::parse_file(path, many.as_bytes()).unwrap_err().contains("more than"));
    }

    #[test]
    fn unknown_names_list_the_valid_ones() {
        let err = resolve("/dev/nosuchname0").unwrap_err();
        assert!(err.contains("\"/dev/nosuchname0\" is neither"), "{err}");
        assert!(err.contains("valid names: ") && err.contains("via_lo"), "{err}");
        let err = resolve("via_nosuchif9").unwrap_err();
        assert!(err.contains("via_nosuchif9") && err.contains("via_lo"), "{err}");
        assert_eq!(resolve("/dev/via_lo").unwrap().name, "via_lo");
    }
}
