//! The environment-driven client starts the agent on demand.
//!
//! This file holds a single test because it sets process-wide environment
//! variables.

use std::time::{Duration, Instant};

use viad::client::{self, AgentError, Session};

#[test]
fn client_starts_the_agent_on_demand() {
    let name = format!("openvia-test-{}-ondemand", std::process::id());
    std::env::set_var(client::SOCKET_ENV, &name);
    std::env::set_var("VIA_VIAD", env!("CARGO_BIN_EXE_viad"));
    std::env::set_var("VIA_VIAD_IDLE", "1");

    // Stats never starts an agent.
    assert!(matches!(client::stats(), Err(AgentError::Unavailable(_))));

    let (session, dev) = Session::open("via_lo").unwrap();
    assert_eq!(dev.host_addr, vec![127, 0, 0, 1]);
    let stats = client::stats().unwrap();
    assert!(stats.contains(&("sessions".to_string(), 1)), "{stats:?}");
    drop(session);

    // With VIA_VIAD_IDLE=1 the started agent leaves by itself.  Each look
    // is a client too, so look less often than the idle timeout.
    let deadline = Instant::now() + Duration::from_secs(6);
    loop {
        std::thread::sleep(Duration::from_millis(1500));
        if client::stats().is_err() {
            break;
        }
        assert!(Instant::now() < deadline, "the agent did not exit when idle");
    }

    // A second on-demand start, then an explicit stop.
    let (_session, _) = Session::open("/dev/via_lo").unwrap();
    client::stop().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while client::stats().is_ok() {
        assert!(Instant::now() < deadline, "the agent did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
}
