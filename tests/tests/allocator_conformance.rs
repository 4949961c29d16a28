//! Allocator conformance rules (issue 11) on a live master: a zero amount in a quota limit is a
//! limit of zero (through `gantryctl` and the operator API), guarantees that do not nest are
//! refused with 400 and the reason, and one decline of all of a framework's offers on an agent
//! installs one filter over their union, and (rule 2 on the live master) declining ONE of them
//! does the same: the other is rescinded, nothing of the agent comes back while the filter lasts,
//! then all of it does; an accept naming an offer that was rescinded has its tasks DROPPED
//! (`invalid-offers`), and the batch framework still finishes all its tasks.
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
    Update(Box<StatusUpdate>),
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

    async fn status_update(&mut self, _driver: &DriverHandle, update: &StatusUpdate) {
        let _ = self.events.send(Event::Update(Box::new(update.clone())));
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
            other => panic!("unexpected {other:?}"),
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

/// A framework in two roles, one limited to half the agent, holds the agent as two offers made
/// in one cycle (one per role). Returns the framework and both offers.
async fn two_offers_on_one_agent(
    cluster: &Cluster,
    name: &str,
) -> (
    DriverHandle,
    mpsc::UnboundedReceiver<Event>,
    tokio::task::JoinHandle<()>,
    Offer,
    Offer,
) {
    let q = gantryctl(cluster, &["quota", "half", "--limit", "cpus:1;mem:256"]);
    assert!(q.status.success(), "{}", stderr(&q));
    let (h, mut rx, task) = start_framework(cluster, name, &["half", "rest"]);
    let mut held = Vec::new();
    while held.len() < 2 {
        match next_event(&mut rx, Duration::from_secs(30)).await {
            Event::Offer(o) => held.push(o),
            other => panic!("unexpected {other:?}"),
        }
    }
    let c = held.remove(1);
    let b = held.remove(0);
    assert_eq!(b.agent_id, c.agent_id);
    assert_eq!(b.resources.milli("cpus") + c.resources.milli("cpus"), 2000);
    (h, rx, task, b, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declining_one_of_two_offers_filters_the_whole_agent_then_gives_it_all_back() {
    let cluster = Cluster::start(&[("w2", "cpus:2;mem:512")]).unwrap();
    let (h, mut rx, task, b, c) = two_offers_on_one_agent(&cluster, "decline-one").await;

    // Decline B alone for 8 s: the decline acts on C too (rescinded) under one filter over
    // their union, the whole agent.
    let declined_at = std::time::Instant::now();
    h.decline(vec![b.id], Some(8.0));
    match next_event(&mut rx, Duration::from_secs(20)).await {
        Event::Rescinded(id) => assert_eq!(id, c.id, "the other offer on the agent"),
        other => panic!("expected C to be rescinded, got {other:?}"),
    }
    cluster
        .master
        .wait_state(Duration::from_secs(20), "offers to be gone", |s| {
            s["offers"].as_array().is_some_and(|o| o.is_empty())
        })
        .unwrap();
    // The filter started when the master handled the decline, after `declined_at`: nothing
    // of the agent may come for the first 6 s of it (old behaviour: C stays outstanding, and
    // B comes back at the next batch).
    let quiet = Duration::from_secs(6).saturating_sub(declined_at.elapsed());
    if let Ok(Some(e)) = tokio::time::timeout(quiet, rx.recv()).await {
        panic!("nothing may be offered while the filter lasts, got {e:?}");
    }
    // Then everything comes back.
    let mut cpus = 0;
    while cpus < 2000 {
        match next_event(&mut rx, Duration::from_secs(30)).await {
            Event::Offer(o) => {
                assert_eq!(o.agent_id, b.agent_id);
                cpus += o.resources.milli("cpus");
            }
            other => panic!("expected the agent back, got {other:?}"),
        }
    }
    assert_eq!(cpus, 2000, "all of the agent, once");
    assert!(declined_at.elapsed() >= Duration::from_secs(6));
    h.stop();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accept_naming_a_rescinded_offer_drops_its_tasks_and_batch_still_finishes() {
    let cluster = Cluster::start(&[("w3", "cpus:2;mem:512")]).unwrap();
    let (h, mut rx, task, b, c) = two_offers_on_one_agent(&cluster, "stale-accept").await;

    // Decline B without a filter: C goes with it (rescinded). An accept naming C, sent as a
    // framework whose rescind was still in flight would: its task is DROPPED with the reason,
    // not lost behind an error.
    h.decline(vec![b.id], Some(0.0));
    let late = TaskInfo {
        task_id: TaskId::random(),
        name: "late".into(),
        command: "true".into(),
        resources: "cpus:0.5;mem:32".parse().unwrap(),
        env: Default::default(),
        kill_grace_secs: None,
        gpu_selector: None,
        container: None,
    };
    h.accept(
        vec![c.id],
        vec![Operation::Launch {
            tasks: vec![late.clone()],
        }],
        Some(0.0),
    );
    let mut rescinded = false;
    let dropped = loop {
        match next_event(&mut rx, Duration::from_secs(30)).await {
            Event::Rescinded(id) => {
                assert_eq!(id, c.id);
                rescinded = true;
            }
            Event::Update(u) if u.task_id == late.task_id => break u,
            Event::Update(u) => panic!("update of an unknown task: {u:?}"),
            // Offers made after the decline: keep them (they hold no filter), ignore.
            Event::Offer(_) => {}
        }
    };
    assert!(rescinded, "C was rescinded before the accept's answer");
    assert_eq!(dropped.state, TaskState::Dropped, "{dropped:?}");
    assert_eq!(
        dropped.reason,
        Some(TaskReason::InvalidOffers),
        "{dropped:?}"
    );
    assert!(
        dropped.message.starts_with("invalid offers: ")
            && dropped.message.contains(&c.id.to_string()),
        "{dropped:?}"
    );
    // Nothing ran: the task is no active task; operators see it among the completed ones,
    // DROPPED with its reason (issue 30).
    let s = cluster.master.state().unwrap();
    let id = late.task_id.to_string();
    assert!(
        !s["tasks"].as_array().unwrap().iter().any(|t| t["id"] == id),
        "a dropped task is not active: {s:#}"
    );
    let kept: Vec<&serde_json::Value> = s["completed_tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["id"] == id)
        .collect();
    assert_eq!(kept.len(), 1, "{s:#}");
    assert_eq!(kept[0]["state"], "DROPPED");
    assert_eq!(kept[0]["reason"], "invalid-offers");
    h.stop();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;

    // The batch framework, which accepts all its offers on an agent at once and relaunches
    // dropped tasks, finishes every task exactly once on the same master.
    let p = tokio::time::timeout(
        Duration::from_secs(240),
        gantry_tests::run_batch(
            cluster.master.quic,
            &cluster.tls_dir,
            "batch-after-drop",
            "rest",
            40,
            "cpus:0.2;mem:16",
            "true",
        ),
    )
    .await
    .expect("batch finishes in time")
    .unwrap();
    gantry_tests::assert_finished_once("batch", &p, 40);
}
