//! Allocator conformance rules (issue 11) on a live master: a zero amount in a quota limit is a
//! limit of zero (through `gantryctl` and the operator API), guarantees that do not nest are
//! refused with 400 and the reason, and one decline of all of a framework's offers on an agent
//! installs one filter over their union.
//! The other rules live in the allocator core the master shares with `gantry-master simulate`;
//! the conformance scenarios in `master/tests/conformance/` pin them.

use std::time::Duration;

use gantry_sdk::protocol::*;
use gantry_sdk::{Driver, DriverHandle, Scheduler};
use gantry_tests::Cluster;
use tokio::sync::mpsc;

fn gantryctl(cluster: &Cluster, args: &[&str]) -> std::process::Output {
    cluster.master.gantryctl(args).unwrap()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[derive(Debug)]
enum Event {
    Offer(Offer),
    Rescinded(OfferId),
}

/// Reports offers (keeping them) and rescinds.
struct Recorder {
    events: mpsc::UnboundedSender<Event>,
}

impl Scheduler for Recorder {
    async fn offers(&mut self, _driver: &DriverHandle, offers: Vec<Offer>) {
        for o in offers {
            let _ = self.events.send(Event::Offer(o));
        }
    }

    async fn offer_rescinded(&mut self, _driver: &DriverHandle, offer_id: OfferId) {
        let _ = self.events.send(Event::Rescinded(offer_id));
    }
}

fn start_framework(
    cluster: &Cluster,
    name: &str,
    roles: &[&str],
) -> (
    DriverHandle,
    mpsc::UnboundedReceiver<Event>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let cfg = gantry_tests::driver_config(
        vec![cluster.master.quic.to_string()],
        cluster.tls_dir.clone(),
        name,
        roles.iter().map(|r| r.to_string()).collect(),
    );
    let driver = Driver::new(cfg);
    let handle = driver.handle();
    let task = tokio::spawn(async move {
        let _ = driver.run(Recorder { events: tx }).await;
    });
    (handle, rx, task)
}

async fn next_event(rx: &mut mpsc::UnboundedReceiver<Event>, within: Duration) -> Event {
    tokio::time::timeout(within, rx.recv())
        .await
        .expect("an event in time")
        .expect("the framework is running")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_quota_limits_and_nested_guarantees_on_the_operator_api() {
    let cluster = Cluster::start(&[("w1", "cpus:4;mem:1024")]).unwrap();

    // A limit of zero cpus: the role is offered memory only.
    let q = gantryctl(&cluster, &["quota", "capped", "--limit", "cpus:0;mem:256"]);
    assert!(q.status.success(), "{}", stderr(&q));
    let s = cluster.master.state().unwrap();
    let limit = &s["allocator"]["roles"]["capped"]["quota_limit"];
    assert_eq!(limit["cpus"], 0.0, "the zero is kept: {limit}");
    assert_eq!(limit["mem"], 256.0);
    let (h, mut rx, task) = start_framework(&cluster, "capped-fw", &["capped"]);
    match next_event(&mut rx, Duration::from_secs(30)).await {
        Event::Offer(o) => {
            assert_eq!(o.resources.milli("cpus"), 0, "no cpus at all: {o:?}");
            assert_eq!(o.resources.milli("mem"), 256_000, "{o:?}");
        }
        other => panic!("expected an offer, got {other:?}"),
    }
    h.stop();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;

    // Nested guarantees: a subrole may not push the subroles' sum above its parent's
    // guarantee, and a parent may not go below it. Refused with the reason; nothing changes.
    let ok = gantryctl(&cluster, &["quota", "eng", "--guarantee", "cpus:1"]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    let ok = gantryctl(&cluster, &["quota", "eng/ml", "--guarantee", "cpus:1"]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    let bad = gantryctl(&cluster, &["quota", "eng/web", "--guarantee", "cpus:0.5"]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("400") && stderr(&bad).contains("subroles of \"eng\""),
        "{}",
        stderr(&bad)
    );
    let bad = gantryctl(&cluster, &["quota", "eng", "--guarantee", "cpus:0.5"]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("below"), "{}", stderr(&bad));
    let s = cluster.master.state().unwrap();
    let roles = &s["allocator"]["roles"];
    assert_eq!(roles["eng"]["quota_guarantee"]["cpus"], 1.0, "{roles:#}");
    assert!(
        roles["eng/web"]["quota_guarantee"].is_null(),
        "refused quota not applied: {roles:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_decline_of_all_offers_on_the_agent_installs_one_filter() {
    let cluster = Cluster::start(&[("w1", "cpus:2;mem:512")]).unwrap();
    // A framework in two roles, one limited to half the agent: it is offered the agent as two
    // offers in one cycle (one per role), B and C.
    let q = gantryctl(&cluster, &["quota", "half", "--limit", "cpus:1;mem:256"]);
    assert!(q.status.success(), "{}", stderr(&q));
    let (h, mut rx, task) = start_framework(&cluster, "decliner", &["half", "rest"]);
    let mut held = Vec::new();
    while held.len() < 2 {
        match next_event(&mut rx, Duration::from_secs(30)).await {
            Event::Offer(o) => held.push(o),
            Event::Rescinded(id) => panic!("unexpected rescind of {id}"),
        }
    }
    let (b, c) = (&held[0], &held[1]);
    assert_eq!(b.agent_id, c.agent_id);
    assert_ne!(b.role, c.role);
    assert_eq!(b.resources.milli("cpus") + c.resources.milli("cpus"), 2000);

    // One decline of both: one filter over their union, the whole agent, for a minute.
    h.decline(vec![b.id, c.id], Some(60.0));
    cluster
        .master
        .wait_state(Duration::from_secs(20), "offers to be gone", |s| {
            s["offers"].as_array().is_some_and(|o| o.is_empty())
        })
        .unwrap();
    // With one filter per offer (the old behaviour), the two halves together are covered by
    // neither filter and come back at the next batch (every second). One filter over their
    // union keeps the agent away for the minute.
    if let Ok(Some(e)) = tokio::time::timeout(Duration::from_secs(4), rx.recv()).await {
        panic!("nothing may be offered while the filter lasts, got {e:?}");
    }
    let s = cluster.master.state().unwrap();
    assert_eq!(s["allocator"]["active_filters"], 1, "{:#}", s["allocator"]);
    h.stop();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
}
