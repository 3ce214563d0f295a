//! The command line, and the plan it describes.

use crate::error::{Error, Result};
use crate::proto::{Mode, Pattern, Reliability, TestSpec, Wait, DEFAULT_PORT};
use crate::schedule::{netpipe_sizes, quick_sizes};
use crate::session::Plan;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

/// Where the two sides run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CpuPlacement {
    /// Both sides on CPU 0.
    Same,
    /// The client on CPU 0, the server on CPU 1.
    Split,
    /// Wherever the scheduler puts them.
    None,
}

impl CpuPlacement {
    /// The CPUs of client and server.
    pub fn cpus(self) -> (Option<usize>, Option<usize>) {
        match self {
            CpuPlacement::Same => (Some(0), Some(0)),
            CpuPlacement::Split => (Some(0), Some(1)),
            CpuPlacement::None => (None, None),
        }
    }
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            CpuPlacement::Same => "same",
            CpuPlacement::Split => "split",
            CpuPlacement::None => "none",
        }
    }
}

/// viabench: NetPIPE-style latency and throughput of openvia.
///
/// `viabench` alone starts its own peer on this host and compares VIA
/// send/receive, VIA RDMA write, TCP and a bare shared-memory floor over
/// /dev/via_lo.  `viabench --server` waits for clients; `viabench HOST`
/// measures against the server on HOST.
#[derive(Parser, Debug, Clone)]
#[command(name = "viabench", version)]
pub struct Options {
    /// The server to measure against (default: a peer started on this host).
    pub host: Option<String>,
    /// Run as the server side.
    #[arg(long)]
    pub server: bool,
    /// Control port (TCP) of the server.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Server: the address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: String,
    /// Server: exit after the first client.
    #[arg(long)]
    pub once: bool,
    /// Transports: via-send, via-rdma, tcp, raw-shm, raw-cma, raw-udp, raw-ether
    /// (comma-separated or repeated).  Default: via-send, via-rdma, tcp and the
    /// bare floor of the device (raw-shm on /dev/via_lo, raw-udp otherwise).
    /// raw-cma (one host, polling only): each block and a flag word written
    /// into the peer's memory with one process_vm_writev, the floor under
    /// openvia's RDMA write.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub mode: Vec<Mode>,
    /// Patterns: pingpong, stream, burst[:N], connect, rendezvous,
    /// rendezvous-stream (comma-separated or repeated).  connect: connection
    /// set-up, --connections times one after the other (VipConnectRequest
    /// against VipConnectWait and VipConnectAccept, or TCP connect against
    /// accept; one 8-byte message there and back each), via-send and tcp
    /// only.  rendezvous (a ping-pong) and rendezvous-stream: each VIA block
    /// goes as a request, an answer with the address and memory handle of a
    /// registered buffer, the payload by RDMA write and its completion (the
    /// write's immediate data with via-rdma, a message after it with
    /// via-send); raw-udp sends a request and an answer, one small datagram
    /// each way, before each block (the floor of that exchange); the other
    /// modes move the same blocks as plain messages.
    #[arg(long, value_delimiter = ',')]
    pub pattern: Vec<String>,
    /// connect: connections timed per test, one after the other (default
    /// 1000, 200 with --quick).
    #[arg(long)]
    pub connections: Option<u64>,
    /// Messages per burst when the pattern says only `burst`.
    #[arg(long, default_value_t = 16)]
    pub burst: u32,
    /// Completion: poll (VipRecvDone loop) or block (VipRecvWait); both may be given.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub wait: Vec<Wait>,
    /// VIA device (client; the server uses it too unless given its own).
    #[arg(long)]
    pub device: Option<String>,
    /// Reliability level of the VIs.
    #[arg(long, value_enum, default_value = "delivery")]
    pub reliability: Reliability,
    /// Payload bytes per packet of the UDP transport (VIA_SEGMENT_SIZE) and of raw-udp.
    #[arg(long, value_parser = parse_bytes)]
    pub segment: Option<usize>,
    /// tcp: SO_SNDBUF and SO_RCVBUF of both ends (default: the kernel's autotuning).
    #[arg(long, value_parser = parse_bytes)]
    pub sockbuf: Option<usize>,
    /// VIA modes: drive N VIs at once, all on one CQ, in turn (`--vis 1`: one VI on a CQ);
    /// raw-shm: N channel pairs in turn, the floor of N VIs.
    #[arg(long)]
    pub vis: Option<u32>,
    /// CPU placement of the two sides (sched_setaffinity).
    #[arg(long, value_enum, default_value = "none")]
    pub cpu: CpuPlacement,
    /// Trials per size; the best counts (default 3, 1 with --quick).
    #[arg(long)]
    pub trials: Option<u32>,
    /// Explicit block sizes (comma-separated; suffixes K and M).
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes)]
    pub sizes: Vec<usize>,
    /// Seconds each trial lasts at least (default 0.02, 0.002 with --quick).
    #[arg(long)]
    pub min_time: Option<f64>,
    /// Stop after the first size whose one-way time exceeds this many seconds.
    #[arg(long, default_value_t = 0.1)]
    pub max_time: f64,
    /// Largest block size (default 4M, the NIC's MaxTransferSize).
    #[arg(long, default_value = "4M", value_parser = parse_bytes)]
    pub max_size: usize,
    /// NetPIPE's perturbation: sizes c-p and c+p around each power of two.
    #[arg(long, default_value_t = 3)]
    pub perturbation: usize,
    /// Bytes per descriptor; larger blocks are split across descriptors.
    #[arg(long, default_value = "1M", value_parser = parse_bytes)]
    pub desc_size: usize,
    /// Receive descriptors kept posted per VI.
    #[arg(long, default_value_t = 16)]
    pub descriptors: u32,
    /// A few sizes and short trials, for smoke tests.
    #[arg(long)]
    pub quick: bool,
    /// Write NetPIPE np.out files, one per test (the test goes before the extension).
    #[arg(long)]
    pub np_out: Option<PathBuf>,
    /// Write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Plot latency and throughput against block size (.svg or .png).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Measure nothing: plot these NetPIPE np.out files (viabench's or
    /// NetPIPE's own; the file name is the label) into --plot.
    #[arg(long, value_delimiter = ',')]
    pub from_np: Vec<PathBuf>,
    /// Title of the plot.
    #[arg(long)]
    pub title: Option<String>,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Seconds any single wait may take before a run fails.
    #[arg(long, default_value_t = 30.0)]
    pub timeout: f64,
}

/// Parses a byte count: `4096`, `64K`, `4M`, `1KiB`.
pub fn parse_bytes(s: &str) -> std::result::Result<usize, String> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(digits);
    let n: usize = num.parse().map_err(|_| format!("bad byte count {s:?}"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" | "kb" => 1 << 10,
        "m" | "mi" | "mib" | "mb" => 1 << 20,
        "g" | "gi" | "gib" | "gb" => 1 << 30,
        _ => return Err(format!("bad unit in {s:?} (K, M or G)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("{s:?} is too large"))
}

impl Options {
    /// The device the client opens.
    pub fn device(&self) -> String {
        self.device.clone().unwrap_or_else(|| "/dev/via_lo".into())
    }

    /// Trials per size.
    pub fn trials(&self) -> u32 {
        self.trials.unwrap_or(if self.quick { 1 } else { 3 }).max(1)
    }

    /// Minimum time per trial.
    pub fn min_time(&self) -> Duration {
        Duration::from_secs_f64(self.min_time.unwrap_or(if self.quick { 0.002 } else { 0.02 }).max(0.0))
    }

    /// The modes to measure.
    pub fn modes(&self) -> Vec<Mode> {
        if !self.mode.is_empty() {
            let mut m = self.mode.clone();
            m.dedup();
            return m;
        }
        let floor = if crate::link::interface_of(&self.device()) == "lo" { Mode::RawShm } else { Mode::RawUdp };
        vec![Mode::ViaSend, Mode::ViaRdma, Mode::Tcp, floor]
    }

    /// The block sizes.
    pub fn sizes(&self) -> Result<Vec<usize>> {
        let mut sizes = if !self.sizes.is_empty() {
            self.sizes.clone()
        } else if self.quick {
            quick_sizes(self.max_size)
        } else {
            netpipe_sizes(self.max_size, self.perturbation)
        };
        sizes.sort_unstable();
        sizes.dedup();
        if sizes.is_empty() || sizes[0] == 0 {
            return Err(Error::new("block sizes must be at least 1 byte"));
        }
        Ok(sizes)
    }

    /// The plan: every mode × pattern × wait.
    pub fn plan(&self) -> Result<Plan> {
        let sizes = self.sizes()?;
        let max_block = *sizes.last().expect("sizes are not empty");
        let patterns: Vec<Pattern> = if self.pattern.is_empty() {
            vec![Pattern::PingPong]
        } else {
            self.pattern.iter().map(|p| Pattern::parse(p, self.burst)).collect::<Result<_>>()?
        };
        let waits = if self.wait.is_empty() { vec![Wait::Poll] } else { self.wait.clone() };
        if self.descriptors < crate::flow::MIN_RING || self.descriptors > 1024 {
            return Err(Error::new("--descriptors must be in 3..1024"));
        }
        if self.vis == Some(0) || self.vis.is_some_and(|n| n > 1024) {
            return Err(Error::new("--vis must be in 1..1024"));
        }
        let base = format!("{:x}{:x}", std::process::id(), now_ns() & 0xFFFFFF);
        let mut tests = Vec::new();
        for &mode in &self.modes() {
            for &pattern in &patterns {
                // Connection set-up exists for VIA send/receive and TCP only.
                if pattern == Pattern::Connect && !crate::connect::supports(mode) {
                    continue;
                }
                for &wait in &waits {
                    // raw-cma has nothing to sleep on: the flag word lies in
                    // memory of the reader's own that no other process maps.
                    if mode == Mode::RawCma && wait == Wait::Block {
                        continue;
                    }
                    tests.push(TestSpec {
                        mode,
                        pattern,
                        wait,
                        vis: if mode.is_via() || mode == Mode::RawShm { self.vis } else { None },
                        device: self.device(),
                        reliability: self.reliability,
                        segment: self.segment.map(|s| s as u32),
                        sockbuf: self.sockbuf.map(|s| s.min(u32::MAX as usize) as u32),
                        max_block,
                        desc_size: self.desc_size.max(64),
                        ring: self.descriptors,
                        tag: format!("{base}-{}", tests.len()),
                        timeout_ms: (self.timeout * 1000.0) as u64,
                    });
                }
            }
        }
        if tests.is_empty() {
            return Err(Error::new(
                "nothing to measure: the connect pattern measures the modes via-send and tcp only, \
                 raw-cma polls only",
            ));
        }
        let connections = self.connections.unwrap_or(if self.quick {
            crate::connect::QUICK_CONNECTIONS
        } else {
            crate::connect::DEFAULT_CONNECTIONS
        });
        if connections == 0 {
            return Err(Error::new("--connections must be at least 1"));
        }
        Ok(Plan {
            tests,
            sizes,
            trials: self.trials(),
            min_time: self.min_time(),
            max_time: Duration::from_secs_f64(self.max_time.max(0.0)),
            server_cpu: self.cpu.cpus().1,
            connections,
        })
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(args: &[&str]) -> Options {
        Options::try_parse_from(std::iter::once("viabench").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn byte_counts_take_suffixes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64K"), Ok(65536));
        assert_eq!(parse_bytes("4M"), Ok(4 << 20));
        assert_eq!(parse_bytes("1KiB"), Ok(1024));
        assert!(parse_bytes("4X").is_err());
        assert!(parse_bytes("").is_err());
    }

    #[test]
    fn defaults_compare_via_tcp_and_the_floor() {
        let o = opts(&[]);
        assert_eq!(o.modes(), vec![Mode::ViaSend, Mode::ViaRdma, Mode::Tcp, Mode::RawShm]);
        let p = o.plan().unwrap();
        assert_eq!(p.tests.len(), 4);
        assert_eq!(p.trials, 3);
        assert_eq!(p.min_time, Duration::from_millis(20));
        assert_eq!(*p.sizes.last().unwrap(), 4 << 20);
        assert!(p.tests.iter().all(|t| t.pattern == Pattern::PingPong && t.wait == Wait::Poll));
        let o = opts(&["--device", "/dev/via_eth0"]);
        assert_eq!(*o.modes().last().unwrap(), Mode::RawUdp);
    }

    #[test]
    fn modes_patterns_and_waits_multiply() {
        let o = opts(&[
            "--mode",
            "via-send,tcp",
            "--pattern",
            "pingpong",
            "--pattern",
            "burst:4",
            "--wait",
            "poll,block",
            "--vis",
            "8",
            "--quick",
        ]);
        let p = o.plan().unwrap();
        assert_eq!(p.tests.len(), 8);
        assert_eq!(p.trials, 1);
        assert_eq!(p.sizes, vec![1, 4, 1024, 65536, 1 << 20]);
        let labels: Vec<String> = p.tests.iter().map(|t| t.label()).collect();
        assert!(labels.contains(&"via-send/burst4/block/vis8".to_string()));
        assert!(labels.contains(&"tcp/pingpong/poll".to_string()));
        let tags: std::collections::HashSet<&str> = p.tests.iter().map(|t| t.tag.as_str()).collect();
        assert_eq!(tags.len(), 8);
    }

    #[test]
    fn explicit_sizes_win() {
        let p = opts(&["--sizes", "4,1M,4", "--cpu", "split"]).plan().unwrap();
        assert_eq!(p.sizes, vec![4, 1 << 20]);
        assert_eq!(p.tests[0].max_block, 1 << 20);
        assert_eq!(p.server_cpu, Some(1));
        assert!(opts(&["--sizes", "0"]).plan().is_err());
        assert!(opts(&["--descriptors", "1"]).plan().is_err());
    }

    #[test]
    fn connect_plans_via_send_and_tcp_only() {
        let p = opts(&["--pattern", "connect,pingpong", "--connections", "50"]).plan().unwrap();
        let labels: Vec<String> = p.tests.iter().map(|t| t.label()).collect();
        assert_eq!(
            labels,
            [
                "via-send/connect/poll",
                "via-send/pingpong/poll",
                "via-rdma/pingpong/poll",
                "tcp/connect/poll",
                "tcp/pingpong/poll",
                "raw-shm/pingpong/poll"
            ]
        );
        assert_eq!(p.connections, 50);
        assert_eq!(opts(&["--pattern", "connect", "--quick"]).plan().unwrap().connections, 200);
        assert_eq!(opts(&["--pattern", "connect"]).plan().unwrap().connections, 1000);
        assert!(opts(&["--pattern", "connect", "--mode", "raw-shm"]).plan().is_err());
        assert!(opts(&["--pattern", "connect", "--connections", "0"]).plan().is_err());
    }

    #[test]
    fn raw_cma_polls_only() {
        let p = opts(&["--mode", "raw-cma,raw-shm", "--wait", "poll,block"]).plan().unwrap();
        let labels: Vec<String> = p.tests.iter().map(|t| t.label()).collect();
        assert_eq!(labels, ["raw-cma/pingpong/poll", "raw-shm/pingpong/poll", "raw-shm/pingpong/block"]);
        let e = opts(&["--mode", "raw-cma", "--wait", "block"]).plan().unwrap_err();
        assert!(e.to_string().contains("raw-cma polls only"), "{e}");
        assert!(opts(&["--mode", "raw-cma", "--pattern", "connect"]).plan().is_err());
        // Its blocks and patterns are those of any other mode.
        let p = opts(&["--mode", "raw-cma", "--pattern", "stream,burst:4,rendezvous"]).plan().unwrap();
        assert_eq!(p.tests.len(), 3);
        assert_eq!(p.tests[0].mode, Mode::RawCma);
    }

    #[test]
    fn rendezvous_plans_every_mode_and_wait() {
        let p = opts(&[
            "--mode",
            "via-send,via-rdma,tcp",
            "--pattern",
            "rendezvous,rndv-stream",
            "--wait",
            "poll,block",
            "--sizes",
            "16K,64K,1M",
        ])
        .plan()
        .unwrap();
        let labels: Vec<String> = p.tests.iter().map(|t| t.label()).collect();
        assert_eq!(labels.len(), 12);
        for l in [
            "via-send/rendezvous/poll",
            "via-rdma/rendezvous/block",
            "via-rdma/rendezvous-stream/poll",
            "tcp/rendezvous/block",
            "tcp/rendezvous-stream/poll",
        ] {
            assert!(labels.iter().any(|x| x == l), "{l} missing from {labels:?}");
        }
        assert_eq!(p.sizes, vec![16384, 65536, 1 << 20]);
        assert!(p.tests.iter().all(|t| t.pattern.is_rendezvous() && t.max_block == 1 << 20));
        assert!(opts(&["--pattern", "rendezvous:2"]).plan().is_err());
    }

    #[test]
    fn a_thousand_vis_on_one_cq_are_planned() {
        let p = opts(&["--mode", "via-send", "--vis", "1024", "--sizes", "4"]).plan().unwrap();
        assert_eq!(p.tests[0].vis, Some(1024));
        assert_eq!(p.tests[0].label(), "via-send/pingpong/poll/vis1024");
        assert!(opts(&["--vis", "1025"]).plan().is_err());
        // --vis concerns VIA and its shared-memory floor only.
        let p = opts(&["--mode", "tcp,raw-cma", "--vis", "1024"]).plan().unwrap();
        assert!(p.tests.iter().all(|t| t.vis.is_none()));
        let p = opts(&["--mode", "raw-shm", "--vis", "1024", "--sizes", "4"]).plan().unwrap();
        assert_eq!(p.tests[0].label(), "raw-shm/pingpong/poll/vis1024");
    }
}
