//! The two sides of a session over the control connection: the client
//! walks the plan, calibrates repetitions and keeps the best trial; the
//! server sets up what each test asks for and answers runs.

use crate::connect::{self, ConnectServer, ConnectStats};
use crate::driver::{client_run, per_message, server_run};
use crate::error::{Error, Result};
use crate::link::{client_connect, server_setup, Link, LinkServer};
use crate::pattern::mix;
use crate::progress::Progress;
use crate::proto::*;
use crate::report::{Row, TestResult};
use crate::schedule::{estimate, reps_for, MIN_REPS};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::time::Duration;

/// What the client measures.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The tests, in order.
    pub tests: Vec<TestSpec>,
    /// Block sizes, ascending.
    pub sizes: Vec<usize>,
    /// Trials per size; the best counts.
    pub trials: u32,
    /// Each trial lasts at least this long.
    pub min_time: Duration,
    /// A test stops after the first size whose one-way time exceeds this.
    pub max_time: Duration,
    /// CPU the server pins itself to.
    pub server_cpu: Option<usize>,
    /// Connections measured per connect test (`--pattern connect`).
    pub connections: u64,
}

/// The client's end of a session.
pub struct ClientSession {
    ctrl: Control,
    server_ip: IpAddr,
    local_ip: IpAddr,
    /// The server's host name.
    pub server_host: String,
    runs: u64,
    seed: u64,
}

impl ClientSession {
    /// Greets the server on a connected control stream.
    pub fn start(stream: TcpStream, server_cpu: Option<usize>) -> Result<ClientSession> {
        let server_ip = stream.peer_addr()?.ip();
        let local_ip = stream.local_addr()?.ip();
        let mut ctrl = Control::new(stream)?;
        ctrl.send(&ClientMsg::Hello { version: PROTOCOL.into(), cpu: server_cpu })?;
        let server_host = match ctrl.expect::<ServerMsg>()? {
            ServerMsg::Welcome { version, host } if version == PROTOCOL => host,
            ServerMsg::Welcome { version, .. } => {
                return Err(Error::new(format!("the server speaks {version}, this client {PROTOCOL}")))
            }
            ServerMsg::Error(e) => return Err(Error::new(format!("server: {e}"))),
            other => return Err(Error::new(format!("unexpected answer to Hello: {other:?}"))),
        };
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        Ok(ClientSession { ctrl, server_ip, local_ip, server_host, runs: 0, seed: mix(seed as u64) })
    }

    /// Ends the session.
    pub fn bye(mut self) -> Result<()> {
        self.ctrl.send(&ClientMsg::Bye)
    }

    /// Tears the server's side of the current test down.
    fn end(&mut self) -> Result<()> {
        self.ctrl.send(&ClientMsg::End)?;
        loop {
            if let ServerMsg::Ended = self.ctrl.expect::<ServerMsg>()? {
                return Ok(());
            }
        }
    }

    /// Measures one test over every size of the plan (a connect test: its
    /// connections).
    pub fn run_test(&mut self, spec: &TestSpec, plan: &Plan, progress: &mut Progress) -> Result<TestResult> {
        let label = spec.label();
        let mut result = TestResult {
            label: label.clone(),
            spec: spec.clone(),
            rows: Vec::new(),
            error: None,
            stats: Default::default(),
            connect: None,
        };
        let steps = plan.sizes.len();
        if spec.pattern == Pattern::Connect {
            progress.at(&label, connect::MESSAGE_BYTES);
            self.connect_test(spec, plan, &mut result)?;
            progress.skip(steps);
            // One "size": the message each connection carries.
            progress.test_done(&label, usize::from(result.connect.is_some()), result.error.as_deref());
            return Ok(result);
        }
        self.ctrl.send(&ClientMsg::Start(spec.clone()))?;
        let info = match self.ctrl.expect::<ServerMsg>()? {
            ServerMsg::Ready(info) => info,
            ServerMsg::Error(e) => {
                result.error = Some(format!("server: {e}"));
                progress.skip(steps);
                return Ok(result);
            }
            other => return Err(Error::new(format!("unexpected answer to Start: {other:?}"))),
        };
        let mut link = match client_connect(spec, &info, self.server_ip, self.local_ip) {
            Ok((link, peer)) => {
                self.ctrl.send(&ClientMsg::Peer(peer))?;
                match self.ctrl.expect::<ServerMsg>()? {
                    ServerMsg::Connected => Some(link),
                    ServerMsg::Error(e) => {
                        result.error = Some(format!("server: {e}"));
                        None
                    }
                    other => return Err(Error::new(format!("unexpected answer to Peer: {other:?}"))),
                }
            }
            Err(e) => {
                result.error = Some(e.context("setting up").0);
                None
            }
        };
        let Some(link_ref) = link.as_mut() else {
            self.end()?;
            progress.skip(steps);
            return Ok(result);
        };

        let mut prev: Option<(usize, Duration)> = None;
        let mut measured = 0;
        for &size in &plan.sizes {
            progress.at(&label, size);
            match self.measure(link_ref.as_mut(), spec.pattern, plan, size, prev) {
                Ok((row, per_iteration)) => {
                    let slow = row.seconds > plan.max_time.as_secs_f64();
                    result.rows.push(row);
                    prev = Some((size, per_iteration));
                    progress.step();
                    measured += 1;
                    if slow {
                        break;
                    }
                }
                Err(e) => {
                    result.error = Some(e.context(format!("{size} bytes")).0);
                    break;
                }
            }
        }
        progress.skip(steps - measured);
        result.stats = link_ref.stats();
        if let Some(mut l) = link.take() {
            if let Err(e) = l.close() {
                result.error.get_or_insert(e.context("closing").0);
            }
        }
        self.end()?;
        progress.test_done(&label, result.rows.len(), result.error.as_deref());
        Ok(result)
    }

    /// A connect test: an untimed warm-up run, then the measured one.
    fn connect_test(&mut self, spec: &TestSpec, plan: &Plan, result: &mut TestResult) -> Result<()> {
        self.ctrl.send(&ClientMsg::Start(spec.clone()))?;
        let info = match self.ctrl.expect::<ServerMsg>()? {
            ServerMsg::Ready(info) => info,
            ServerMsg::Error(e) => {
                result.error = Some(format!("server: {e}"));
                return Ok(());
            }
            other => return Err(Error::new(format!("unexpected answer to Start: {other:?}"))),
        };
        let mut client = match connect::client_open(spec, &info, self.server_ip) {
            Ok(c) => c,
            Err(e) => {
                result.error = Some(e.context("setting up").0);
                return self.end();
            }
        };
        let warmup = connect::warmup(plan.connections);
        let measured = self
            .connect_run(client.as_mut(), warmup)
            .map_err(|e| e.context("warm-up"))
            .and_then(|_| self.connect_run(client.as_mut(), plan.connections.max(1)));
        match measured {
            Ok((samples, elapsed)) => result.connect = Some(ConnectStats::new(&samples, elapsed, warmup)),
            Err(e) => result.error = Some(e.0),
        }
        drop(client);
        self.end()
    }

    /// One run of `n` connections, both sides, checked on both.
    fn connect_run(
        &mut self,
        client: &mut dyn connect::ConnectClient,
        n: u64,
    ) -> Result<(Vec<connect::Sample>, Duration)> {
        self.runs += 1;
        let run = RunSpec { size: connect::MESSAGE_BYTES, reps: n, seed: mix(self.seed ^ self.runs) };
        self.ctrl.send(&ClientMsg::Run(run))?;
        let mine = connect::client_run(client, run);
        let theirs = match self.ctrl.expect::<ServerMsg>()? {
            ServerMsg::RunDone(o) => o,
            other => return Err(Error::new(format!("unexpected answer to Run: {other:?}"))),
        };
        match (mine, theirs) {
            (Ok(got), RunOutcome { verified: true, .. }) => Ok(got),
            (Err(e), RunOutcome { error: Some(s), .. }) => Err(e.context(format!("server: {s}; client"))),
            (Err(e), _) => Err(e),
            (Ok(_), RunOutcome { error, .. }) => {
                Err(Error::new(format!("server: {}", error.unwrap_or_else(|| "not verified".into()))))
            }
        }
    }

    /// Measures one size: calibrates, runs the trials, keeps the best.
    /// Returns the row and the time of one iteration.
    fn measure(
        &mut self,
        link: &mut dyn Link,
        pattern: Pattern,
        plan: &Plan,
        size: usize,
        prev: Option<(usize, Duration)>,
    ) -> Result<(Row, Duration)> {
        let guess = match prev {
            Some((prev_size, t)) => estimate(prev_size, t, size),
            None => self.probe(link, pattern, size, plan.min_time)?,
        };
        let mut reps = reps_for(plan.min_time, guess);
        let mut best: Option<(Duration, u64, Duration)> = None;
        let mut trials = Vec::with_capacity(plan.trials.max(1) as usize);
        for _ in 0..plan.trials.max(1) {
            let elapsed = self.run(link, pattern, size, reps)?;
            let per_iteration = elapsed / reps as u32;
            let per_msg = per_message(pattern, elapsed, reps);
            trials.push(per_msg);
            if best.is_none_or(|b| per_msg < b.0) {
                best = Some((per_msg, reps, per_iteration));
            }
            reps = reps_for(plan.min_time, per_iteration);
        }
        let (per_msg, reps, per_iteration) = best.expect("at least one trial");
        let row = Row::new(size, per_msg.as_secs_f64(), reps, plan.trials.max(1), true).with_trials(&trials);
        Ok((row, per_iteration))
    }

    /// Times one iteration of the first size: runs of growing length until
    /// one lasts a tenth of the minimum time, so that a stall of the first
    /// few iterations (a process still waking up) does not set the pace.
    fn probe(&mut self, link: &mut dyn Link, pattern: Pattern, size: usize, min_time: Duration) -> Result<Duration> {
        let mut reps = MIN_REPS;
        loop {
            let elapsed = self.run(link, pattern, size, reps)?;
            if elapsed * 10 >= min_time || reps >= 1 << 16 {
                return Ok(elapsed / reps as u32);
            }
            reps *= 4;
        }
    }

    /// One run: both sides, checked on both.
    fn run(&mut self, link: &mut dyn Link, pattern: Pattern, size: usize, reps: u64) -> Result<Duration> {
        self.runs += 1;
        let run = RunSpec { size, reps, seed: mix(self.seed ^ self.runs) };
        self.ctrl.send(&ClientMsg::Run(run))?;
        let mine = client_run(link, pattern, run);
        let theirs = match self.ctrl.expect::<ServerMsg>()? {
            ServerMsg::RunDone(o) => o,
            other => return Err(Error::new(format!("unexpected answer to Run: {other:?}"))),
        };
        let elapsed = mine?;
        match theirs {
            RunOutcome { verified: true, .. } => Ok(elapsed),
            RunOutcome { error, .. } => {
                Err(Error::new(format!("server: {}", error.unwrap_or_else(|| "data not verified".into()))))
            }
        }
    }
}

/// Serves clients on `listener`, one at a time; with `once`, only one.
/// `device` overrides the device clients ask for.
pub fn serve(listener: TcpListener, device: Option<String>, once: bool) -> Result<()> {
    loop {
        let (stream, from) = listener.accept()?;
        if let Err(e) = serve_client(stream, device.as_deref()) {
            eprintln!("viabench server: client {from}: {e}");
            if once {
                return Err(e);
            }
        }
        if once {
            return Ok(());
        }
    }
}

fn serve_client(stream: TcpStream, device: Option<&str>) -> Result<()> {
    let local_ip = stream.local_addr()?.ip();
    let peer_ip = stream.peer_addr()?.ip();
    let mut ctrl = Control::new(stream)?;
    let mut half: Option<Box<dyn LinkServer>> = None;
    let mut link: Option<Box<dyn Link>> = None;
    let mut listener: Option<Box<dyn ConnectServer>> = None;
    let mut spec: Option<TestSpec> = None;
    loop {
        let Some(msg) = ctrl.recv::<ClientMsg>()? else { return Ok(()) };
        match msg {
            ClientMsg::Hello { version, cpu } => {
                if version != PROTOCOL {
                    ctrl.send(&ServerMsg::Error(format!("this server speaks {PROTOCOL}, the client {version}")))?;
                    return Ok(());
                }
                if let Some(cpu) = cpu {
                    if let Err(e) = crate::sys::pin_process(cpu) {
                        eprintln!("viabench server: {e}");
                    }
                }
                ctrl.send(&ServerMsg::Welcome { version: PROTOCOL.into(), host: crate::sys::hostname() })?;
            }
            ClientMsg::Start(s) if s.pattern == Pattern::Connect => {
                half = None;
                if let Some(mut l) = link.take() {
                    let _ = l.close();
                }
                listener = None;
                let dev = device.unwrap_or(&s.device).to_string();
                match connect::server_open(&s, &dev, local_ip) {
                    Err(e) => ctrl.send(&ServerMsg::Error(e.0))?,
                    Ok(l) => {
                        ctrl.send(&ServerMsg::Ready(l.info()))?;
                        listener = Some(l);
                        spec = Some(s);
                    }
                }
            }
            ClientMsg::Start(s) => {
                half = None;
                listener = None;
                if let Some(mut l) = link.take() {
                    let _ = l.close();
                }
                let dev = device.unwrap_or(&s.device).to_string();
                match server_setup(&s, &dev, local_ip) {
                    Err(e) => ctrl.send(&ServerMsg::Error(e.0))?,
                    Ok(pending) => {
                        ctrl.send(&ServerMsg::Ready(pending.info()))?;
                        match pending.accept() {
                            Ok(h) => {
                                half = Some(h);
                                spec = Some(s);
                            }
                            Err(e) => ctrl.send(&ServerMsg::Error(e.0))?,
                        }
                    }
                }
            }
            ClientMsg::Peer(info) => match half.take() {
                Some(h) => match h.complete(&info, peer_ip) {
                    Ok(l) => {
                        link = Some(l);
                        ctrl.send(&ServerMsg::Connected)?;
                    }
                    Err(e) => ctrl.send(&ServerMsg::Error(e.0))?,
                },
                None => ctrl.send(&ServerMsg::Error("no test is set up".into()))?,
            },
            ClientMsg::Run(run) if listener.is_some() => {
                let l = listener.as_mut().expect("a connect test is set up");
                let outcome = match l.serve(run) {
                    Ok(()) => RunOutcome { verified: true, error: None },
                    Err(e) => RunOutcome { verified: false, error: Some(e.0) },
                };
                ctrl.send(&ServerMsg::RunDone(outcome))?;
            }
            ClientMsg::Run(run) => {
                let outcome = match (link.as_mut(), spec.as_ref()) {
                    (Some(l), Some(s)) => match server_run(l.as_mut(), s.pattern, run) {
                        Ok(()) => RunOutcome { verified: true, error: None },
                        Err(e) => RunOutcome { verified: false, error: Some(e.0) },
                    },
                    _ => RunOutcome { verified: false, error: Some("no test is connected".into()) },
                };
                ctrl.send(&ServerMsg::RunDone(outcome))?;
            }
            ClientMsg::End => {
                half = None;
                spec = None;
                listener = None;
                if let Some(mut l) = link.take() {
                    if let Err(e) = l.close() {
                        eprintln!("viabench server: closing: {e}");
                    }
                }
                ctrl.send(&ServerMsg::Ended)?;
            }
            ClientMsg::Bye => return Ok(()),
        }
    }
}
