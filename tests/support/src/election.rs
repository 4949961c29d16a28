//! An election driver for the HA tests and benchmarks of `gantry-master` (feature `election`):
//! campaigning nodes that log their leadership events with their emission instants, and the
//! checks the tests make on that log (no two leaders at once, elections, losses).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_master::election::{
    Election, EtcdElectionConfig, Fence, LeadershipEvent, LeadershipStatus,
};
use tokio::sync::{oneshot, watch};

/// One logged leadership event.
#[derive(Debug, Clone)]
pub struct Logged {
    pub node: String,
    pub event: LeadershipEvent,
    /// Emission instant for Elected/Lost, receipt instant for LeaderChanged.
    pub at: Instant,
}

/// The shared event log of all nodes in a test.
pub type Log = Arc<Mutex<Vec<Logged>>>;

pub fn new_log() -> Log {
    Arc::new(Mutex::new(Vec::new()))
}

/// A campaigning master (just its election), driven by a task that logs its events.
pub struct Node {
    pub name: String,
    status: watch::Receiver<LeadershipStatus>,
    log: Log,
    stop: Option<oneshot::Sender<Stop>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

enum Stop {
    /// Drop the election (its lease is left to expire, like a crash).
    Kill,
    /// Resign cleanly.
    Resign,
}

/// A fast configuration for tests: 2 s TTL, 500 ms margin.
pub fn config(endpoint: &str, advertise: &str, prefix: &str) -> EtcdElectionConfig {
    let mut cfg = EtcdElectionConfig::new(vec![endpoint.to_string()], advertise);
    cfg.prefix = prefix.to_string();
    cfg.lease_ttl = Duration::from_secs(2);
    cfg.request_timeout = Duration::from_millis(500);
    cfg.connect_timeout = Duration::from_secs(1);
    cfg
}

/// Logs to the test output when `RUST_LOG` is set (e.g. `RUST_LOG=gantry_master=debug`).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

impl Node {
    pub fn start(name: &str, cfg: EtcdElectionConfig, log: Log) -> Node {
        init_tracing();
        let mut election = Election::etcd(cfg).expect("valid config");
        let status = election.watch_status();
        let (stop_tx, mut stop_rx) = oneshot::channel::<Stop>();
        let node = name.to_string();
        let node_log = log.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    ev = election.next_event() => {
                        let Some(event) = ev else { return };
                        let at = match &event {
                            LeadershipEvent::Elected { at, .. } | LeadershipEvent::Lost { at, .. } => *at,
                            LeadershipEvent::LeaderChanged { .. } => Instant::now(),
                        };
                        log.lock().unwrap().push(Logged { node: node.clone(), event, at });
                    }
                    stop = &mut stop_rx => {
                        match stop {
                            Ok(Stop::Resign) => {
                                election.resign(Duration::from_secs(5)).await.expect("resign");
                                // Log what the resignation emitted (the final Lost).
                                while let Some(event) = election.next_event().await {
                                    let at = match &event {
                                        LeadershipEvent::Elected { at, .. } | LeadershipEvent::Lost { at, .. } => *at,
                                        LeadershipEvent::LeaderChanged { .. } => Instant::now(),
                                    };
                                    log.lock().unwrap().push(Logged { node: node.clone(), event, at });
                                }
                            }
                            Ok(Stop::Kill) | Err(_) => {
                                drop(election);
                                // A crashed master stops acting at once: close its interval.
                                let at = Instant::now();
                                let event = LeadershipEvent::Lost { reason: "killed by the test".into(), at };
                                log.lock().unwrap().push(Logged { node: node.clone(), event, at });
                            }
                        }
                        return;
                    }
                }
            }
        });
        Node {
            name: name.to_string(),
            status,
            log: node_log,
            stop: Some(stop_tx),
            task: Some(task),
        }
    }

    pub fn status(&self) -> LeadershipStatus {
        self.status.borrow().clone()
    }

    /// Leader by its status, and its `Elected` event for this term already in the log (the
    /// status flips a moment before the driver task logs the event; tests read both).
    pub fn is_leader(&self) -> bool {
        let st = self.status.borrow().clone();
        st.is_leader
            && self.log.lock().unwrap().iter().any(|l| {
                l.node == self.name
                    && matches!(&l.event, LeadershipEvent::Elected { epoch, .. } if Some(*epoch) == st.epoch)
            })
    }

    /// Drops the election without resigning, as a crash would.
    pub async fn kill(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(Stop::Kill);
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }

    /// Resigns cleanly.
    pub async fn resign(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(Stop::Resign);
        }
        if let Some(t) = self.task.take() {
            t.await.expect("driver task");
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// Polls `cond` every 20 ms until it holds or `limit` passes.
pub async fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}

/// The Elected events of `node`, in order: (epoch, fence, at).
pub fn elections(log: &Log, node: &str) -> Vec<(u64, Fence, Instant)> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|l| l.node == node)
        .filter_map(|l| match &l.event {
            LeadershipEvent::Elected { epoch, fence, at } => Some((*epoch, fence.clone(), *at)),
            _ => None,
        })
        .collect()
}

/// The Lost events of `node`: (reason, at).
pub fn losses(log: &Log, node: &str) -> Vec<(String, Instant)> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|l| l.node == node)
        .filter_map(|l| match &l.event {
            LeadershipEvent::Lost { reason, at } => Some((reason.clone(), *at)),
            _ => None,
        })
        .collect()
}

/// Leadership intervals per node from the log ([elected, lost) with `now` for an open one).
pub fn intervals(log: &Log, now: Instant) -> Vec<(String, Instant, Instant)> {
    let log = log.lock().unwrap();
    let mut open: std::collections::HashMap<String, Instant> = Default::default();
    let mut out = Vec::new();
    let mut sorted: Vec<&Logged> = log.iter().collect();
    sorted.sort_by_key(|l| l.at);
    for l in sorted {
        match &l.event {
            LeadershipEvent::Elected { at, .. } => {
                assert!(
                    open.insert(l.node.clone(), *at).is_none(),
                    "{} elected twice without a Lost in between",
                    l.node
                );
            }
            LeadershipEvent::Lost { at, .. } => {
                if let Some(start) = open.remove(&l.node) {
                    out.push((l.node.clone(), start, *at));
                }
            }
            LeadershipEvent::LeaderChanged { .. } => {}
        }
    }
    for (node, start) in open {
        out.push((node, start, now));
    }
    out
}

/// Panics if two different nodes' leadership intervals overlap.
pub fn assert_no_two_leaders(log: &Log) {
    let iv = intervals(log, Instant::now());
    for (i, a) in iv.iter().enumerate() {
        for b in iv.iter().skip(i + 1) {
            if a.0 != b.0 {
                let overlap = a.1 < b.2 && b.1 < a.2;
                assert!(
                    !overlap,
                    "two leaders at once: {a:?} and {b:?}\nlog: {:#?}",
                    log.lock().unwrap()
                );
            }
        }
    }
}

/// A unique etcd key prefix per test (tests may share nothing, but this keeps logs readable).
pub fn prefix(test: &str) -> String {
    format!("/gantry-test/{test}")
}

/// Starts etcd from inside a multi-threaded tokio test.
pub fn start_etcd() -> crate::etcd::EtcdServer {
    tokio::task::block_in_place(|| {
        crate::etcd::EtcdServer::start().expect("etcd starts (is etcd-server installed?)")
    })
}
