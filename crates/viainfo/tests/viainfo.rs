//! `viainfo` end to end: the binary's text and JSON, with and without an
//! agent, with aliases from the environment and from the file.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

const VIAINFO: &str = env!("CARGO_BIN_EXE_viainfo");

/// The `viad` of this build: `$VIA_VIAD`, or the one beside viainfo,
/// brought up to date with the same profile.
fn viad() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Some(p) = std::env::var_os("VIA_VIAD").filter(|p| !p.is_empty()) {
                return p.into();
            }
            let beside = Path::new(VIAINFO).with_file_name("viad");
            let mut cmd = Command::new(env!("CARGO"));
            cmd.args(["build", "-q", "-p", "viad", "--bin", "viad"]);
            if !cfg!(debug_assertions) {
                cmd.arg("--release");
            }
            assert!(cmd.status().expect("cargo build -p viad").success(), "building viad failed");
            beside
        })
        .clone()
}

/// A run of viainfo with a socket and an aliases file of its own.
struct Env {
    socket: String,
    file: PathBuf,
}

impl Env {
    fn new(tag: &str, file_text: &str) -> Env {
        let file = std::env::temp_dir().join(format!("openvia-viainfo-{}-{tag}", std::process::id()));
        std::fs::write(&file, file_text).unwrap();
        Env { socket: format!("openvia-viainfo-{}-{tag}", std::process::id()), file }
    }

    fn run(&self, aliases: &str, args: &[&str]) -> Output {
        let out = Command::new(VIAINFO)
            .args(args)
            .env("VIA_AGENT_SOCKET", &self.socket)
            .env("VIA_DEVICES_FILE", &self.file)
            .env("VIA_DEVICE_ALIASES", aliases)
            .env_remove("VIA_DOORBELL")
            .output()
            .unwrap();
        out
    }

    fn json(&self, aliases: &str) -> Value {
        let out = self.run(aliases, &["--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("viainfo --json prints JSON")
    }

    fn agent(&self) -> Child {
        let child = Command::new(viad())
            .args(["--socket", &self.socket, "--idle-timeout", "0", "--cm-port", "0"])
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.json("")["agent"]["running"].as_bool().unwrap() {
            assert!(Instant::now() < deadline, "viad did not come up");
            thread::sleep(Duration::from_millis(20));
        }
        child
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

fn setting<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["configuration"].as_array().unwrap().iter().find(|s| s["name"] == name).unwrap()
}

#[test]
fn json_lists_via_lo_its_aliases_and_the_configuration() {
    let env = Env::new("json", "nic7 lo\n");
    let report = env.json("/dev/clanvi0=via_lo");
    assert_eq!(report["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(report["library"]["soname"], "libvipl.so.1");

    let devices = report["devices"].as_array().unwrap();
    let lo = devices.iter().find(|d| d["name"] == "via_lo").expect("via_lo listed");
    assert_eq!(lo["interface"], "lo");
    assert!(lo["mtu"].as_u64().unwrap() > 0, "{lo}");
    assert_eq!(lo["host_address"], "127.0.0.1");
    assert_eq!(lo["ethernet_frames"], false);
    let lo_aliases: Vec<&str> = lo["aliases"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(lo_aliases, ["/dev/clanvi0", "nic7"]);
    for d in devices {
        assert!(d["name"].as_str().unwrap().starts_with("via_") && d["mtu"].as_u64().unwrap() > 0, "{d}");
    }

    let aliases = report["aliases"].as_array().unwrap();
    assert_eq!(aliases.len(), 2, "{aliases:?}");
    assert_eq!(aliases[0]["name"], "/dev/clanvi0");
    assert_eq!(aliases[0]["source"], "environment");
    assert_eq!(aliases[0]["origin"], "VIA_DEVICE_ALIASES entry 1");
    assert_eq!(aliases[1]["name"], "nic7");
    assert_eq!(aliases[1]["source"], "file");
    assert_eq!(aliases[1]["origin"], format!("{}:1", env.file.display()));
    assert_eq!(aliases[1]["device_present"], true);
    assert_eq!(report["aliases_file"]["status"], "ok");
    assert_eq!(report["aliases_file"]["source"], "environment");

    let a = setting(&report, "VIA_DEVICE_ALIASES");
    assert_eq!(
        (&a["source"], &a["value"], &a["problem"]),
        (&"environment".into(), &"/dev/clanvi0=via_lo".into(), &Value::Null)
    );
    let d = setting(&report, "VIA_DOORBELL");
    assert_eq!((&d["source"], &d["value"]), (&"default".into(), &"direct".into()));

    // No agent runs on this socket.
    assert_eq!(report["agent"]["running"], false);
    assert!(report["agent"]["error"].as_str().unwrap().contains("not running"), "{}", report["agent"]);
}

#[test]
fn text_names_the_devices_the_aliases_and_the_agent() {
    let env = Env::new("text", "");
    let out = env.run("/dev/clanvi0=via_lo", &[]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for part in [
        &format!("openvia {}", env!("CARGO_PKG_VERSION")),
        "device: via_lo",
        "/dev/clanvi0 -> via_lo (environment: VIA_DEVICE_ALIASES entry 1)",
        &format!("agent: @{}", env.socket),
        "VIA_DEVICE_ALIASES  environment  /dev/clanvi0=via_lo",
    ] {
        assert!(text.contains(part), "{part:?} not in\n{text}");
    }
    let version = env.run("", &["--version"]);
    assert_eq!(String::from_utf8(version.stdout).unwrap().trim(), format!("viainfo {}", env!("CARGO_PKG_VERSION")));
}

#[test]
fn bad_settings_are_reported_not_fatal() {
    let env = Env::new("bad", "nic7 lo\nbroken\n");
    let report = env.json("nic0");
    let a = setting(&report, "VIA_DEVICE_ALIASES");
    assert!(a["problem"].as_str().unwrap().contains("entry 1 \"nic0\": expected NAME=TARGET"), "{a}");
    assert_eq!(report["aliases_file"]["status"], "invalid");
    let why = report["aliases_file"]["error"].as_str().unwrap();
    assert!(why.contains(&format!("{}:2", env.file.display())), "{why}");
    assert!(report["aliases"].as_array().unwrap().is_empty());
}

#[test]
fn one_device_by_alias_and_unknown_names() {
    let env = Env::new("device", "nic7 lo\n");
    let out = env.run("/dev/clanvi0=lo", &["--json", "--device", "/dev/clanvi0"]);
    assert!(out.status.success());
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = report["devices"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["via_lo"]);
    let out = env.run("", &["-d", "nic7"]);
    assert!(out.status.success());
    assert!(String::from_utf8(out.stdout).unwrap().contains("device: via_lo"));

    let out = env.run("/dev/clanvi0=lo", &["--device", "/dev/nosuch7"]);
    assert_eq!(out.status.code(), Some(1));
    let why = String::from_utf8(out.stderr).unwrap();
    for part in ["\"/dev/nosuch7\"", "valid names: via_lo", "nic7 → via_lo", "/dev/clanvi0 → via_lo"] {
        assert!(why.contains(part), "{part:?} not in {why}");
    }
    let out = env.run("", &["--bogus"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_running_agent_is_described() {
    let env = Env::new("agent", "");
    let mut child = env.agent();
    let out = env.run("", &["--json", "--verbose"]);
    let _ = child.kill();
    let _ = child.wait();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let agent = &report["agent"];
    assert_eq!(agent["running"], true);
    assert_eq!(agent["pid"], child.id());
    // SAFETY: geteuid has no preconditions.
    assert_eq!(agent["uid"], unsafe { libc::geteuid() });
    assert!(agent["user"].is_string(), "{agent}");
    assert_eq!((&agent["cm_port"], &agent["cm_bound"]), (&0.into(), &false.into()));
    assert!(agent["cm_why_not"].as_str().unwrap().contains("this host only"), "{agent}");
    assert!(agent["counters"]["sessions"].is_u64(), "{agent}");
}
