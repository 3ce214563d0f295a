//! viabench end to end on /dev/via_lo: the binary against its own child
//! peer, every mode, checked through its JSON report.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// One run at a time: each spins on both cores while it measures.
static SERIAL: Mutex<()> = Mutex::new(());

/// The `viad` of this build: `$VIA_VIAD`, or the one beside viabench,
/// brought up to date with the same profile (an agent older than the
/// library may not speak its protocol).
fn viad() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Some(p) = std::env::var_os("VIA_VIAD").filter(|p| !p.is_empty()) {
                return p.into();
            }
            let beside = Path::new(env!("CARGO_BIN_EXE_viabench")).with_file_name("viad");
            let mut cmd = Command::new(env!("CARGO"));
            cmd.args(["build", "-q", "-p", "viad", "--bin", "viad"]);
            if !cfg!(debug_assertions) {
                cmd.arg("--release");
            }
            let status = cmd.status().expect("cargo build -p viad");
            assert!(status.success(), "building viad failed");
            assert!(beside.is_file(), "no viad at {}", beside.display());
            beside
        })
        .clone()
}

struct Run {
    dir: PathBuf,
    socket: String,
}

impl Run {
    fn new(name: &str) -> Run {
        let dir = std::env::temp_dir().join(format!("viabench-test-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Run { dir, socket: format!("viabench-test-{}-{name}", std::process::id()) }
    }

    /// Runs viabench with `args`; returns the parsed JSON report.
    fn viabench(&self, args: &[&str]) -> serde_json::Value {
        let json = self.dir.join("report.json");
        let out = Command::new(env!("CARGO_BIN_EXE_viabench"))
            .args(args)
            .arg("--no-progress")
            .arg("--json")
            .arg(&json)
            .env("VIA_VIAD", viad())
            .env("VIA_AGENT_SOCKET", &self.socket)
            .env("VIA_VIAD_IDLE", "2")
            .env("VIA_CM_PORT", "0")
            .output()
            .expect("viabench runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "viabench {args:?} failed\n{stdout}\n{stderr}");
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = Command::new(viad()).args(["--stop", "--socket", &self.socket]).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Every test of the report has rows, each with nonzero throughput and
/// data checked on both sides.
fn check_rows(report: &serde_json::Value) -> Vec<String> {
    let tests = report["tests"].as_array().expect("tests");
    let mut labels = Vec::new();
    for t in tests {
        let label = t["label"].as_str().unwrap().to_string();
        assert!(t["error"].is_null(), "{label}: {}", t["error"]);
        let rows = t["rows"].as_array().unwrap();
        assert!(!rows.is_empty(), "{label}: no rows");
        for r in rows {
            assert!(r["mb_per_s"].as_f64().unwrap() > 0.0, "{label}: {r}");
            assert!(r["one_way_us"].as_f64().unwrap() > 0.0, "{label}: {r}");
            assert_eq!(r["verified"], true, "{label}: {r}");
        }
        labels.push(label);
    }
    labels
}

#[test]
fn quick_run_measures_every_mode() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let run = Run::new("quick");
    let np = run.dir.join("np.out");
    let svg = run.dir.join("plot.svg");
    let report = run.viabench(&[
        "--quick",
        "--mode",
        "via-send,via-rdma,tcp,raw-shm,raw-udp",
        "--np-out",
        np.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let labels = check_rows(&report);
    for mode in ["via-send", "via-rdma", "tcp", "raw-shm", "raw-udp"] {
        assert!(labels.iter().any(|l| l.starts_with(&format!("{mode}/"))), "{mode} missing from {labels:?}");
        let file = run.dir.join(format!("np.{mode}-pingpong-poll.out"));
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(text.lines().count(), 5, "{}", file.display());
    }
    assert!(std::fs::read_to_string(&svg).unwrap().contains("via-rdma/pingpong/poll"));
}

#[test]
fn large_blocks_split_over_a_small_ring() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let run = Run::new("split");
    let report = run.viabench(&[
        "--mode",
        "via-send,via-rdma",
        "--pattern",
        "pingpong,stream,burst:5",
        "--wait",
        "poll,block",
        "--sizes",
        "1,100003",
        "--desc-size",
        "4096",
        "--descriptors",
        "3",
        "--trials",
        "1",
        "--min-time",
        "0.001",
    ]);
    let labels = check_rows(&report);
    assert_eq!(labels.len(), 12);
    // 100003 bytes over 4 KiB descriptors and a ring of three: a sender
    // runs out of credits and waits for the receiver's continue messages.
    let test = |label: &str| report["tests"].as_array().unwrap().iter().find(|t| t["label"] == label).unwrap().clone();
    let stream = test("via-send/stream/poll");
    assert!(stream["stats"]["stalls"].as_u64().unwrap() > 0, "{}", stream["stats"]);
    // In a ping-pong the client receives large replies too, and sends continues.
    let pingpong = test("via-send/pingpong/block");
    assert!(pingpong["stats"]["continues"].as_u64().unwrap() > 0, "{}", pingpong["stats"]);
}

#[test]
fn several_vis_on_one_cq() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let run = Run::new("vis");
    let report = run.viabench(&[
        "--mode",
        "via-send,via-rdma,raw-shm",
        "--vis",
        "8",
        "--wait",
        "poll,block",
        "--sizes",
        "4,70000",
        "--desc-size",
        "16K",
        "--trials",
        "1",
        "--min-time",
        "0.001",
    ]);
    let labels = check_rows(&report);
    assert!(labels.contains(&"via-send/pingpong/poll/vis8".to_string()), "{labels:?}");
    // The shared-memory floor drives as many channel pairs in turn.
    assert!(labels.contains(&"raw-shm/pingpong/block/vis8".to_string()), "{labels:?}");
}

#[test]
fn bare_udp_blocks_in_offload_buffers_arrive_whole() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let run = Run::new("raw-udp-gso");
    // 1400-byte datagrams on loopback: blocks above one datagram leave as
    // segmentation-offload buffers and arrive coalesced; streams and
    // bursts let coalesced datagrams run on into the next block.
    let report = run.viabench(&[
        "--mode",
        "raw-udp",
        "--segment",
        "1400",
        "--pattern",
        "pingpong,stream,burst:5",
        "--sizes",
        "1,1400,1401,100003",
        "--trials",
        "1",
        "--min-time",
        "0.001",
    ]);
    let labels = check_rows(&report);
    assert_eq!(labels.len(), 3, "{labels:?}");
    for t in report["tests"].as_array().unwrap() {
        assert_eq!(t["rows"].as_array().unwrap().len(), 4, "{}", t["label"]);
    }
}

#[test]
fn raw_ether_refuses_the_loopback_with_a_clear_error() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let run = Run::new("ether-lo");
    let out = Command::new(env!("CARGO_BIN_EXE_viabench"))
        .args(["--device", "/dev/via_lo", "--mode", "raw-ether", "--sizes", "4", "--no-progress"])
        .env("VIA_VIAD", viad())
        .env("VIA_AGENT_SOCKET", &run.socket)
        .env("VIA_VIAD_IDLE", "2")
        .env("VIA_CM_PORT", "0")
        .output()
        .expect("viabench runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success() && text.contains("not the loopback"), "{text}");
}

#[test]
fn connect_sets_up_every_connection_asked_for() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let run = Run::new("connect");
    let report = run.viabench(&["--pattern", "connect", "--mode", "via-send,tcp", "--connections", "8"]);
    let tests = report["tests"].as_array().expect("tests");
    let labels: Vec<&str> = tests.iter().map(|t| t["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["via-send/connect/poll", "tcp/connect/poll"]);
    for t in tests {
        let label = t["label"].as_str().unwrap();
        assert!(t["error"].is_null(), "{label}: {}", t["error"]);
        assert!(t["rows"].as_array().unwrap().is_empty(), "{label}");
        let c = &t["connect"];
        assert_eq!(c["count"], 8, "{label}: {c}");
        let setup = c["setup_us"].as_array().unwrap();
        let reply = c["reply_us"].as_array().unwrap();
        assert_eq!((setup.len(), reply.len()), (8, 8), "{label}: {c}");
        for (s, r) in setup.iter().zip(reply) {
            let (s, r) = (s.as_f64().unwrap(), r.as_f64().unwrap());
            // Set-up is part of the first reply's time.
            assert!(s > 0.0 && r >= s, "{label}: set-up {s} µs, first reply {r} µs");
        }
        assert!(c["setup"]["median"].as_f64().unwrap() > 0.0, "{label}: {c}");
        assert!(c["per_second"].as_f64().unwrap() > 0.0, "{label}: {c}");
    }
}

#[test]
fn rendezvous_and_the_cma_floor_run_end_to_end() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let run = Run::new("rendezvous");
    // 100003 bytes over 4 KiB descriptors and a ring of three: the writes
    // go in many chunks, and requests, answers and completions wait for
    // credits beside them.
    let report = run.viabench(&[
        "--mode",
        "via-send,via-rdma,tcp,raw-cma",
        "--pattern",
        "rendezvous,rendezvous-stream",
        "--wait",
        "poll,block",
        "--sizes",
        "4,16384,100003",
        "--desc-size",
        "4096",
        "--descriptors",
        "3",
        "--trials",
        "1",
        "--min-time",
        "0.001",
    ]);
    let labels = check_rows(&report);
    // raw-cma polls only: 3 modes × 2 patterns × 2 waits, and raw-cma's 2.
    assert_eq!(labels.len(), 14, "{labels:?}");
    for l in ["via-rdma/rendezvous/block", "via-send/rendezvous-stream/poll", "raw-cma/rendezvous/poll"] {
        assert!(labels.iter().any(|x| x == l), "{l} missing from {labels:?}");
    }
    assert!(!labels.iter().any(|l| l.starts_with("raw-cma/") && l.ends_with("/block")), "{labels:?}");
    for t in report["tests"].as_array().unwrap() {
        assert_eq!(t["rows"].as_array().unwrap().len(), 3, "{}", t["label"]);
    }
}

#[test]
fn the_cma_floor_streams_past_its_slots() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let run = Run::new("raw-cma");
    let report = run.viabench(&[
        "--mode",
        "raw-cma",
        "--pattern",
        "pingpong,stream,burst:20",
        "--sizes",
        "1,4,41,4096,1M",
        "--trials",
        "1",
        "--min-time",
        "0.001",
    ]);
    let labels = check_rows(&report);
    // A stream or a burst longer than the eight slots goes on only with the
    // reader's acknowledgements (without them the writer would time out).
    assert_eq!(labels, ["raw-cma/pingpong/poll", "raw-cma/stream/poll", "raw-cma/burst20/poll"]);
}
