//! The agent's aliases file, against the real `viad` binary: aliases open
//! as their devices, edits apply at the next open, a bad line is named and
//! leaves device names working, and an unknown name is told the valid ones.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::thread;
use std::time::{Duration, Instant};

use viad::client::{Agent, AgentError};

const VIAD: &str = env!("CARGO_BIN_EXE_viad");

/// An agent of its own whose environment names `file` as its aliases file.
struct Viad {
    child: Child,
    agent: Agent,
}

impl Viad {
    fn start(tag: &str, file: &Path) -> Viad {
        let name = format!("openvia-test-{}-{tag}", std::process::id());
        let child = Command::new(VIAD)
            .args(["--socket", &name, "--idle-timeout", "0", "--cm-port", "0"])
            .env("VIA_DEVICES_FILE", file)
            .spawn()
            .unwrap();
        let viad = Viad { child, agent: Agent::with_socket(&name) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while viad.agent.stats().is_err() {
            assert!(Instant::now() < deadline, "viad did not come up");
            thread::sleep(Duration::from_millis(10));
        }
        viad
    }

    /// The device `name` opens as, or the agent's reason.
    fn open(&self, name: &str) -> Result<String, String> {
        match self.agent.open_session(name, None) {
            Ok((_session, device)) => Ok(device.name),
            Err(AgentError::UnknownDevice(why)) => Err(why),
            Err(other) => panic!("opening {name:?}: {other}"),
        }
    }
}

impl Drop for Viad {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn temp_file(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("openvia-aliases-{}-{tag}", std::process::id()))
}

#[test]
fn aliases_from_the_file_open_as_their_devices_and_edits_apply_at_the_next_open() {
    let file = temp_file("edits");
    std::fs::write(&file, "# the cLAN name of ARMCI\n/dev/clanvi0  via_lo\nnic0 lo   # an interface\n").unwrap();
    let viad = Viad::start("edits", &file);
    assert_eq!(viad.open("/dev/clanvi0").unwrap(), "via_lo");
    assert_eq!(viad.open("clanvi0").unwrap(), "via_lo");
    assert_eq!(viad.open("nic0").unwrap(), "via_lo");
    assert_eq!(viad.open("/dev/via_lo").unwrap(), "via_lo");

    // An unknown name is told every valid one, the file's aliases included.
    let why = viad.open("/dev/nosuch7").unwrap_err();
    for part in ["\"/dev/nosuch7\"", "valid names: ", "via_lo", "/dev/clanvi0 → via_lo", "nic0 → via_lo"] {
        assert!(why.contains(part), "{part:?} not in {why:?}");
    }
    // An alias of a device that is not there says which.
    std::fs::write(&file, "nic0 via_nosuchif7\n").unwrap();
    let why = viad.open("nic0").unwrap_err();
    assert!(why.contains("alias of via_nosuchif7") && why.contains(&format!("{}:1", file.display())), "{why}");
    assert!(viad.open("/dev/clanvi0").is_err(), "a removed alias still opens");

    // A bad line: named, none of the file's aliases apply, devices still open.
    std::fs::write(&file, "/dev/clanvi0 via_lo\nnic0\n").unwrap();
    let why = viad.open("/dev/clanvi0").unwrap_err();
    assert!(why.contains(&format!("{}:2: expected \"NAME TARGET\"", file.display())), "{why}");
    assert_eq!(viad.open("via_lo").unwrap(), "via_lo");

    // A file that VIA_DEVICES_FILE names must be there.
    std::fs::remove_file(&file).unwrap();
    let why = viad.open("/dev/clanvi0").unwrap_err();
    assert!(why.contains(&file.display().to_string()) && why.contains("No such file"), "{why}");
    assert_eq!(viad.open("via_lo").unwrap(), "via_lo");
}

#[test]
fn a_huge_or_binary_file_is_refused_not_read_whole() {
    let file = temp_file("huge");
    std::fs::write(&file, vec![b'#'; (viad::aliases::MAX_FILE_BYTES + 1) as usize]).unwrap();
    let viad = Viad::start("huge", &file);
    let why = viad.open("nic0").unwrap_err();
    assert!(why.contains("larger than"), "{why}");
    std::fs::write(&file, b"nic0 lo\n\xff\xfe\x00\n").unwrap();
    let why = viad.open("nic0").unwrap_err();
    assert!(why.contains(":2: not UTF-8"), "{why}");
    let _ = std::fs::remove_file(&file);
}
