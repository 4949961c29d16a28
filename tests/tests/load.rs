//! The load harness in small (docs/benchmarks.md, "Launch throughput"): a real master, 200
//! emulated agents (8 GPUs each) and 20 emulated SDK frameworks over real QUIC and TLS for a
//! few seconds. Asserts that every task is accounted for — launched == FINISHED, none
//! lost, failed or still in flight, every framework got offers — and which offers frameworks
//! had to decline; never a timing.

use std::time::Duration;

use gantry_tests::load::{self, LoadConfig};

/// `agents` emulated agents with 8 GPUs each and `frameworks` frameworks launching one-GPU
/// tasks of 300 ms for 4 s.
fn small(agents: usize, frameworks: usize) -> LoadConfig {
    LoadConfig {
        agents,
        frameworks,
        gpus_per_agent: 8,
        task: "cpus:1;mem:1024;gpus:1".into(),
        task_time: Duration::from_millis(300),
        launch_window: Duration::from_secs(4),
        client_endpoints: 8,
        drain_timeout: Duration::from_secs(120),
        // The floor's second echo server runs in a process of its own.
        echo_exe: Some(env!("CARGO_BIN_EXE_gantry-load").into()),
        ..LoadConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_task_of_a_small_load_is_accounted_for() {
    let cfg = small(200, 20);
    let report = load::run(cfg).await.expect("load run");
    println!("{}", report.table());
    report.accounted().expect("every task accounted for");
    assert_eq!(
        report.agent_run_tasks, report.launched,
        "each launched task reached its agent exactly once"
    );
    assert_eq!(report.agent_reconnects, 0, "no agent lost its connection");
    assert_eq!(
        report.floor_xproc_idle.count, 500,
        "the ping to the echo process answered"
    );
    assert_eq!(report.framework_errors, 0, "no accept was refused");
    // Each framework lists its task shape as `min_allocatable`: it is never offered what is
    // left of an agent whose GPUs are taken (the next test shows there is such a remnant).
    assert_eq!(report.declined_unfit, 0, "an offer no task fits in");
}

/// The same with a master whose per-peer outbox holds only 256 messages, frameworks starting
/// as each subscribes: the first framework to subscribe is offered every agent and launches 800 tasks at once, so its STAGING and
/// status updates (3,200) overflow three quarters of its outbox many times over. It must be
/// paced (updates held in the master, no offers while it is behind), never closed, and
/// nothing may be lost (docs/protocol.md, "Not reading"). Its frameworks list no minimum
/// allocatable quantity, so they are offered the remnants of agents whose GPUs are taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_framework_behind_a_small_outbox_is_paced_not_closed() {
    let cfg = LoadConfig {
        master_args: vec!["--peer-outbox".into(), "256".into()],
        offer_remnants: true,
        open_together: false,
        ..small(100, 10)
    };
    let report = load::run(cfg).await.expect("load run");
    println!("{}", report.table());
    report.accounted().expect("every task accounted for");
    assert_eq!(report.framework_reconnects, 0, "no framework was closed");
    assert_eq!(report.agent_reconnects, 0, "no agent lost its connection");
    assert_eq!(report.framework_errors, 0, "no accept was refused");
    assert!(
        report.declined_unfit > 0,
        "remnants were offered and declined"
    );
}

/// Tasks arriving at 400 a second into the frameworks' queues, declared as demand: each is
/// launched once or still waits when the run stops (none lost, none launched twice), every
/// launched task is accounted for, and no framework is offered what no task of its fits in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_arriving_into_demand_declaring_queues_are_each_launched_once() {
    let cfg = LoadConfig {
        rate: Some(400.0),
        ..small(200, 20)
    };
    let report = load::run(cfg).await.expect("load run");
    println!("{}", report.table());
    report.accounted().expect("every task accounted for");
    assert!(report.arrived > 0);
    assert_eq!(
        report.launched + report.waiting_at_end,
        report.arrived,
        "every arrived task launched once or still waiting"
    );
    assert_eq!(report.framework_errors, 0, "no accept was refused");
    assert_eq!(report.declined_unfit, 0, "an offer no task fits in");
    assert_eq!(report.agent_run_tasks, report.launched);
}
