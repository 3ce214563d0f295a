//! Results and their forms: the terminal table, NetPIPE's `np.out` files
//! and JSON.

use crate::connect::ConnectStats;
use crate::link::LinkStats;
use crate::proto::TestSpec;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One block size of one test.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Block size in bytes.
    pub bytes: usize,
    /// Timed repetitions of the best trial.
    pub reps: u64,
    /// Trials measured.
    pub trials: u32,
    /// One-way time of one message in seconds (half a round trip for
    /// ping-pong), best trial.
    pub seconds: f64,
    /// The same in microseconds.
    pub one_way_us: f64,
    /// Throughput in 10^6 bytes per second.
    pub mb_per_s: f64,
    /// Throughput in 10^6 bits per second.
    pub mbit_per_s: f64,
    /// Both sides checked the first and the last block of every trial.
    pub verified: bool,
    /// One-way time of every trial in microseconds, in the order measured:
    /// the spread across repetitions.
    pub trial_us: Vec<f64>,
}

impl Row {
    /// A row from the best one-way time of `bytes`.
    pub fn new(bytes: usize, seconds: f64, reps: u64, trials: u32, verified: bool) -> Row {
        let rate = if seconds > 0.0 { bytes as f64 / seconds } else { 0.0 };
        Row {
            bytes,
            reps,
            trials,
            seconds,
            one_way_us: seconds * 1e6,
            mb_per_s: rate / 1e6,
            mbit_per_s: rate * 8.0 / 1e6,
            verified,
            trial_us: Vec::new(),
        }
    }

    /// The same row with the one-way time of every trial.
    pub fn with_trials(mut self, trials: &[Duration]) -> Row {
        self.trial_us = trials.iter().map(|t| t.as_secs_f64() * 1e6).collect();
        self
    }

    /// NetPIPE's throughput: bits per second over 2^20.
    pub fn netpipe_mbps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 * 8.0 / self.seconds / 1_048_576.0
        } else {
            0.0
        }
    }
}

/// The results of one test.
#[derive(Debug, Clone, Serialize)]
pub struct TestResult {
    /// `mode/pattern/wait[/visN]`.
    pub label: String,
    /// What was measured.
    pub spec: TestSpec,
    /// One row per block size.
    pub rows: Vec<Row>,
    /// Why the test stopped early, if it did.
    pub error: Option<String>,
    /// The client link's counters.
    pub stats: LinkStats,
    /// What a connect test measured (`--pattern connect`; no rows then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect: Option<ConnectStats>,
}

impl TestResult {
    /// Whether the test stopped on an error or measured nothing.
    pub fn failed(&self) -> bool {
        self.error.is_some() || (self.rows.is_empty() && self.connect.as_ref().is_none_or(|c| c.count == 0))
    }
    /// The row of `bytes`, if measured.
    pub fn row(&self, bytes: usize) -> Option<&Row> {
        self.rows.iter().find(|r| r.bytes == bytes)
    }
    /// The row with the highest throughput.
    pub fn peak(&self) -> Option<&Row> {
        self.rows.iter().max_by(|a, b| a.mb_per_s.total_cmp(&b.mb_per_s))
    }
}

/// Everything a run of viabench measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `viabench`.
    pub tool: String,
    /// Its version.
    pub version: String,
    /// Seconds since the epoch when the run started.
    pub started: u64,
    /// The command line.
    pub command: Vec<String>,
    /// The client's host name.
    pub client_host: String,
    /// The server's host name.
    pub server_host: String,
    /// `uname -sr` of the client.
    pub kernel: String,
    /// CPUs online on the client.
    pub cpus: usize,
    /// CPU placement (`same`, `split`, `none`).
    pub cpu: String,
    /// Trials per size.
    pub trials: u32,
    /// Minimum time per trial, seconds.
    pub min_time: f64,
    /// The tests.
    pub tests: Vec<TestResult>,
}

/// NetPIPE's `np.out`: per size `bytes Mbps seconds` with NetPIPE's
/// formats (`%8d %lf %12.8lf`), Mbps in 2^20 bits per second.
pub fn np_out(rows: &[Row]) -> String {
    let mut s = String::new();
    for r in rows {
        let _ = writeln!(s, "{:8} {:.6} {:12.8}", r.bytes, r.netpipe_mbps(), r.seconds);
    }
    s
}

/// Reads an `np.out` file back: `bytes Mbps seconds` per line (further
/// columns, as NetPIPE writes with some options, are ignored).
pub fn parse_np_out(text: &str) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.is_empty() {
            continue;
        }
        let bad = || format!("line {}: {line:?} is not `bytes Mbps seconds`", n + 1);
        if cols.len() < 3 {
            return Err(bad());
        }
        let bytes: usize = cols[0].parse().map_err(|_| bad())?;
        let seconds: f64 = cols[2].parse().map_err(|_| bad())?;
        rows.push(Row::new(bytes, seconds, 0, 0, true));
    }
    Ok(rows)
}

/// The file of one test's `np.out`: the label goes before the extension,
/// `np.out` and `via-send/pingpong/poll` give `np.via-send-pingpong-poll.out`.
pub fn np_out_path(base: &Path, label: &str) -> PathBuf {
    let tag: String = label.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect();
    let stem = base.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let name = match base.extension() {
        Some(ext) => format!("{stem}.{tag}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{tag}"),
    };
    base.with_file_name(name)
}

/// The report as pretty JSON.
pub fn json(report: &Report) -> String {
    serde_json::to_string_pretty(report).expect("the report serialises")
}

fn center(s: &str, width: usize) -> String {
    let len = s.chars().count();
    if len >= width {
        return s.to_string();
    }
    let left = (width - len) / 2;
    format!("{}{}{}", " ".repeat(left), s, " ".repeat(width - len - left))
}

/// Tests side by side in one table.
const TESTS_PER_TABLE: usize = 4;

/// The terminal table: one row per size, one-way µs and MB/s per test, at
/// most four tests side by side; then the connect tests, one line each.
pub fn table(tests: &[TestResult]) -> String {
    let mut out = String::new();
    let (connects, sized): (Vec<&TestResult>, Vec<&TestResult>) =
        tests.iter().partition(|t| t.spec.pattern == crate::proto::Pattern::Connect);
    for (i, group) in sized.chunks(TESTS_PER_TABLE).enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&one_table(group));
    }
    if !connects.is_empty() {
        if !sized.is_empty() {
            out.push('\n');
        }
        out.push_str(&connect_table(&connects));
    }
    for t in tests {
        if let Some(e) = &t.error {
            let _ = writeln!(out, "{}: {e}", t.label);
        }
    }
    if tests.iter().any(|t| t.rows.iter().any(|r| !r.verified)) {
        out.push_str("! data not verified\n");
    }
    out
}

fn one_table(tests: &[&TestResult]) -> String {
    // 22 columns, or as many as the longest label and a space each side.
    let col = tests.iter().map(|t| t.label.chars().count() + 2).max().unwrap_or(0).max(22);
    let mut sizes: Vec<usize> = tests.iter().flat_map(|t| t.rows.iter().map(|r| r.bytes)).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut out = String::new();
    let _ = write!(out, "{:>9}", "");
    for t in tests {
        let _ = write!(out, " |{}", center(&t.label, col));
    }
    out.push('\n');
    let _ = write!(out, "{:>9}", "bytes");
    for _ in tests {
        let _ = write!(out, " |{:>w$}{:>11}", "µs 1-way", "MB/s", w = col - 11);
    }
    out.push('\n');
    let _ = writeln!(out, "{}", "-".repeat(9 + tests.len() * (col + 2)));
    for size in sizes {
        let _ = write!(out, "{size:>9}");
        for t in tests {
            match t.row(size) {
                Some(r) => {
                    let mark = if r.verified { ' ' } else { '!' };
                    let _ =
                        write!(out, " |{:>w$}{:>10}{mark}", fmt_num(r.one_way_us), fmt_num(r.mb_per_s), w = col - 11);
                }
                None => {
                    let _ = write!(out, " |{:>w$}{:>11}", "-", "-", w = col - 11);
                }
            }
        }
        out.push('\n');
    }
    out
}

/// The connect tests: per test the connections measured, the set-up time
/// (median, 90th and 99th percentile), the first reply's median and the
/// rate.
fn connect_table(tests: &[&TestResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} |{:>7} |{:>10}{:>10}{:>10} |{:>13} |{:>9}",
        "connection set-up", "conns", "µs median", "p90", "p99", "1st reply µs", "conn/s"
    );
    let _ = writeln!(out, "{}", "-".repeat(24 + 9 + 32 + 15 + 11));
    for t in tests {
        match &t.connect {
            Some(c) => {
                let _ = writeln!(
                    out,
                    "{:<24} |{:>7} |{:>10}{:>10}{:>10} |{:>13} |{:>9}",
                    t.label,
                    c.count,
                    fmt_num(c.setup.median),
                    fmt_num(c.setup.p90),
                    fmt_num(c.setup.p99),
                    fmt_num(c.reply.median),
                    fmt_num(c.per_second)
                );
            }
            None => {
                let _ = writeln!(out, "{:<24} |{:>7} |{:>30} |{:>13} |{:>9}", t.label, "-", "-", "-", "-");
            }
        }
    }
    out
}

/// Three significant digits, at least two decimals below 10.
fn fmt_num(x: f64) -> String {
    if x >= 1000.0 {
        format!("{x:.0}")
    } else if x >= 100.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Mode, Pattern, Reliability, Wait};

    fn spec(mode: Mode) -> TestSpec {
        TestSpec {
            mode,
            pattern: Pattern::PingPong,
            wait: Wait::Poll,
            vis: None,
            device: "/dev/via_lo".into(),
            reliability: Reliability::Delivery,
            segment: None,
            sockbuf: None,
            max_block: 1 << 20,
            desc_size: 1 << 20,
            ring: 16,
            tag: "t".into(),
            timeout_ms: 1000,
        }
    }

    #[test]
    fn rows_derive_rates_from_the_one_way_time() {
        let r = Row::new(1_000_000, 0.001, 10, 3, true);
        assert!((r.mb_per_s - 1000.0).abs() < 1e-9);
        assert!((r.mbit_per_s - 8000.0).abs() < 1e-9);
        assert!((r.one_way_us - 1000.0).abs() < 1e-9);
        assert!((r.netpipe_mbps() - 8e9 / 1_048_576.0).abs() < 1e-9);
        assert_eq!(Row::new(4, 0.0, 1, 1, true).mb_per_s, 0.0);
    }

    #[test]
    fn np_out_has_netpipe_columns() {
        let rows = vec![Row::new(1, 6.55e-6, 100, 3, true), Row::new(4194304, 0.001234, 10, 3, true)];
        let text = np_out(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "       1 1.164793   0.00000655");
        assert_eq!(lines[1], " 4194304 25931.928687   0.00123400");
        for l in lines {
            let cols: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(cols.len(), 3);
            cols[0].parse::<usize>().unwrap();
            cols[1].parse::<f64>().unwrap();
            cols[2].parse::<f64>().unwrap();
        }
    }

    #[test]
    fn np_out_reads_back() {
        let rows = vec![Row::new(1, 6.55e-6, 100, 3, true), Row::new(4194304, 0.001234, 10, 3, true)];
        let back = parse_np_out(&np_out(&rows)).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[1].bytes, 4194304);
        assert!((back[1].seconds - 0.001234).abs() < 1e-12);
        // NetPIPE's own files may carry more columns.
        assert_eq!(parse_np_out("       4 6.59   0.00000463 7 8\n").unwrap()[0].bytes, 4);
        assert!(parse_np_out("4 x\n").is_err());
    }

    #[test]
    fn np_out_files_get_the_label() {
        assert_eq!(
            np_out_path(Path::new("out/np.out"), "via-send/pingpong/poll"),
            PathBuf::from("out/np.via-send-pingpong-poll.out")
        );
        assert_eq!(np_out_path(Path::new("np"), "tcp/stream/block/vis4"), PathBuf::from("np.tcp-stream-block-vis4"));
    }

    #[test]
    fn json_holds_every_row() {
        let t = TestResult {
            label: "via-send/pingpong/poll".into(),
            spec: spec(Mode::ViaSend),
            rows: vec![Row::new(4, 1e-6, 100, 3, true)],
            error: None,
            stats: LinkStats { messages: 5, continues: 1, stalls: 0 },
            connect: None,
        };
        let report = Report {
            tool: "viabench".into(),
            version: "0".into(),
            started: 1,
            command: vec!["viabench".into()],
            client_host: "a".into(),
            server_host: "b".into(),
            kernel: "Linux".into(),
            cpus: 2,
            cpu: "none".into(),
            trials: 3,
            min_time: 0.02,
            tests: vec![t],
        };
        let v: serde_json::Value = serde_json::from_str(&json(&report)).unwrap();
        let row = &v["tests"][0]["rows"][0];
        assert_eq!(row["bytes"], 4);
        assert_eq!(row["verified"], true);
        assert!((row["mb_per_s"].as_f64().unwrap() - 4.0).abs() < 1e-9);
        assert_eq!(v["tests"][0]["spec"]["mode"], "via-send");
        assert_eq!(v["tests"][0]["stats"]["continues"], 1);
    }

    #[test]
    fn table_lines_up_tests_by_size() {
        let mut a = TestResult {
            label: "via-send/pingpong/poll".into(),
            spec: spec(Mode::ViaSend),
            rows: vec![Row::new(1, 1e-6, 1, 1, true), Row::new(4, 2e-6, 1, 1, true)],
            error: None,
            stats: LinkStats::default(),
            connect: None,
        };
        let mut b = a.clone();
        b.label = "tcp/pingpong/poll".into();
        b.rows = vec![Row::new(4, 10e-6, 1, 1, false)];
        b.error = Some("stopped".into());
        a.rows.push(Row::new(8, 2e-6, 1, 1, true));
        let t = table(&[a.clone(), b]);
        assert!(t.contains("via-send/pingpong/poll") && t.contains("tcp/pingpong/poll"));
        let four = t.lines().find(|l| l.trim_start().starts_with("4 ")).unwrap();
        assert!(four.contains("2.00") && four.contains("10.00") && four.contains('!'));
        assert!(t.contains("tcp/pingpong/poll: stopped"));
        assert!(t.contains("! data not verified"));
        let many: Vec<TestResult> = (0..6).map(|_| a.clone()).collect();
        assert_eq!(table(&many).matches("bytes").count(), 2);
    }

    #[test]
    fn long_labels_widen_their_columns() {
        let a = TestResult {
            label: "via-rdma/rendezvous-stream/block".into(),
            spec: spec(Mode::ViaRdma),
            rows: vec![Row::new(16384, 3e-6, 1, 1, true), Row::new(1 << 20, 80e-6, 1, 1, true)],
            error: None,
            stats: LinkStats::default(),
            connect: None,
        };
        let mut b = a.clone();
        b.label = "tcp/pingpong/poll".into();
        let t = table(&[a, b]);
        let bars = |l: &str| {
            l.char_indices().filter(|&(_, c)| c == '|').map(|(i, _)| l[..i].chars().count()).collect::<Vec<_>>()
        };
        let lines: Vec<&str> = t.lines().filter(|l| l.contains('|')).collect();
        assert_eq!(lines.len(), 4, "{t}");
        for l in &lines {
            assert_eq!(bars(l), bars(lines[0]), "{t}");
        }
        assert!(lines[0].contains(" via-rdma/rendezvous-stream/block "), "{t}");
    }

    #[test]
    fn connect_tests_get_a_table_of_their_own() {
        let samples: Vec<crate::connect::Sample> = [100u64, 200, 300]
            .iter()
            .map(|&us| crate::connect::Sample {
                setup: Duration::from_micros(us),
                reply: Duration::from_micros(us + 10),
            })
            .collect();
        let mut s = spec(Mode::ViaSend);
        s.pattern = Pattern::Connect;
        let c = TestResult {
            label: "via-send/connect/poll".into(),
            spec: s,
            rows: Vec::new(),
            error: None,
            stats: LinkStats::default(),
            connect: Some(ConnectStats::new(&samples, Duration::from_millis(1), 1)),
        };
        assert!(!c.failed());
        let t = table(std::slice::from_ref(&c));
        assert!(!t.contains("bytes"), "{t}");
        let line = t.lines().find(|l| l.starts_with("via-send/connect/poll")).unwrap();
        assert!(line.contains("200.0") && line.contains("210.0") && line.contains("3000"), "{line}");
        let mut none = c.clone();
        none.connect = None;
        assert!(none.failed());
        let v: serde_json::Value = serde_json::to_value(&c).unwrap();
        assert_eq!(v["connect"]["count"], 3);
        assert_eq!(v["connect"]["setup"]["median"], 200.0);
        assert!(serde_json::to_value(&none).unwrap().get("connect").is_none());
    }
}
