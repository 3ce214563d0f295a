//! `viabench`: see the crate documentation and `viabench --help`.

use clap::Parser;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};
use viabench::cli::Options;
use viabench::error::{Error, Result};
use viabench::progress::Progress;
use viabench::report::{self, Report};
use viabench::session::{serve, ClientSession};
use viabench::{plot, sys};

fn main() -> ExitCode {
    let opts = Options::parse();
    let result = if opts.server {
        run_server(&opts)
    } else if !opts.from_np.is_empty() {
        replot(&opts)
    } else {
        run_client(&opts)
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("viabench: {e}");
            ExitCode::from(2)
        }
    }
}

fn run_server(opts: &Options) -> Result<ExitCode> {
    let listener = TcpListener::bind((opts.bind.as_str(), opts.port))
        .map_err(|e| Error::new(format!("listening on {}:{}: {e}", opts.bind, opts.port)))?;
    let addr = listener.local_addr()?;
    // The first line on stdout tells a parent which port to use; stdout is
    // not written again.
    let mut out = std::io::stdout();
    let _ = writeln!(out, "viabench server listening on {addr}");
    let _ = out.flush();
    serve(listener, opts.device.clone(), opts.once)?;
    Ok(ExitCode::SUCCESS)
}

/// `--from-np`: plots np.out files without measuring.
fn replot(opts: &Options) -> Result<ExitCode> {
    let Some(out) = &opts.plot else { return Err(Error::new("--from-np needs --plot FILE")) };
    let mut tests = Vec::new();
    let plan = opts.plan()?;
    for path in &opts.from_np {
        let text = std::fs::read_to_string(path).map_err(|e| Error::new(format!("{}: {e}", path.display())))?;
        let rows = report::parse_np_out(&text).map_err(|e| Error::new(format!("{}: {e}", path.display())))?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let label = name.trim_start_matches("np.").trim_end_matches(".out").to_string();
        tests.push(report::TestResult {
            label,
            spec: plan.tests[0].clone(),
            rows,
            error: None,
            stats: Default::default(),
            connect: None,
        });
    }
    let title = opts.title.clone().unwrap_or_else(|| "viabench".into());
    plot::plot(out, &title, &tests)?;
    Ok(ExitCode::SUCCESS)
}

/// Starts `viabench --server --once` on this host and returns it with its port.
fn spawn_peer(opts: &Options) -> Result<(Child, u16)> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args(["--server", "--once", "--bind", "127.0.0.1", "--port", "0"]);
    if let Some(d) = &opts.device {
        cmd.args(["--device", d]);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    // SAFETY: prctl is async-signal-safe; the child dies with this process.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| Error::new(format!("starting the local peer: {e}")))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let port = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| Error::new(format!("the local peer did not start ({:?})", line.trim())))?;
    Ok((child, port))
}

fn connect(host: &str, port: u16) -> Result<TcpStream> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect((host, port)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < deadline && e.kind() == std::io::ErrorKind::ConnectionRefused => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(Error::new(format!("connecting to {host}:{port}: {e}"))),
        }
    }
}

fn run_client(opts: &Options) -> Result<ExitCode> {
    let plan = opts.plan()?;
    let (stream, mut child) = match &opts.host {
        Some(host) => (connect(host, opts.port)?, None),
        None => {
            let (child, port) = spawn_peer(opts)?;
            (connect("127.0.0.1", port)?, Some(child))
        }
    };
    // Pinned after the peer started, so that it does not inherit the mask.
    if let Some(cpu) = opts.cpu.cpus().0 {
        sys::pin_process(cpu)?;
    }
    let mut session = ClientSession::start(stream, plan.server_cpu)?;
    let server_host = session.server_host.clone();
    let mut progress = Progress::new(plan.tests.len() * plan.sizes.len(), !opts.no_progress);
    let mut tests = Vec::new();
    for spec in &plan.tests {
        tests.push(session.run_test(spec, &plan, &mut progress)?);
    }
    let _ = session.bye();
    progress.finish();
    if let Some(c) = child.as_mut() {
        wait_child(c);
    }

    let report = Report {
        tool: "viabench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        started: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs(),
        command: std::env::args().collect(),
        client_host: sys::hostname(),
        server_host,
        kernel: sys::kernel(),
        cpus: sys::cpus(),
        cpu: opts.cpu.name().into(),
        trials: plan.trials,
        min_time: plan.min_time.as_secs_f64(),
        tests,
    };
    let title = opts.title.clone().unwrap_or_else(|| {
        format!(
            "viabench {}: {} ({:?}), cpu {}, best of {} trials",
            report.version,
            opts.device(),
            opts.reliability,
            report.cpu,
            report.trials
        )
    });
    println!("{title}; client {}, server {}", report.client_host, report.server_host);
    print!("{}", report::table(&report.tests));

    if let Some(base) = &opts.np_out {
        for t in &report.tests {
            let path = report::np_out_path(base, &t.label);
            std::fs::write(&path, report::np_out(&t.rows))
                .map_err(|e| Error::new(format!("{}: {e}", path.display())))?;
        }
    }
    if let Some(path) = &opts.json {
        std::fs::write(path, report::json(&report)).map_err(|e| Error::new(format!("{}: {e}", path.display())))?;
    }
    if let Some(path) = &opts.plot {
        plot::plot(path, &title, &report.tests)?;
    }
    let failed = report.tests.iter().any(|t| t.failed());
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// Waits a little for the local peer to leave, then makes it.
fn wait_child(child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}
