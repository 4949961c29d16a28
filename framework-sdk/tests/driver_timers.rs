//! Timers and the framework's own events against a scripted master over real QUIC and mutual
//! TLS: `after`, `every` and `notify` reach `Scheduler::wake` in order with the master's
//! messages; a cancelled timer never fires; timers keep firing while no master is reachable.

use std::time::Duration;

use gantry_sdk::protocol::*;
use gantry_sdk::{Driver, DriverConfig, DriverHandle, Scheduler, TimerId};
use tokio::sync::mpsc;

mod common;

#[derive(Debug, PartialEq)]
enum Seen {
    Registered,
    Wake(u64),
    Update(TaskId),
}

/// Sets its timers on registration and reports every callback.
struct Clock {
    seen: mpsc::UnboundedSender<Seen>,
    ticks: u32,
    periodic: Option<TimerId>,
}

impl Scheduler for Clock {
    async fn registered(&mut self, driver: &DriverHandle, _: FrameworkId) {
        let _ = self.seen.send(Seen::Registered);
        driver.after(Duration::from_millis(300), 1);
        let cancelled = driver.after(Duration::from_millis(100), 99);
        driver.cancel_timer(cancelled);
        self.periodic = Some(driver.every(Duration::from_millis(50), 2));
    }

    async fn status_update(&mut self, _: &DriverHandle, update: &StatusUpdate) {
        let _ = self.seen.send(Seen::Update(update.task_id));
    }

    async fn wake(&mut self, driver: &DriverHandle, token: u64) {
        let _ = self.seen.send(Seen::Wake(token));
        if token == 2 {
            self.ticks += 1;
            if self.ticks == 3 {
                if let Some(id) = self.periodic.take() {
                    driver.cancel_timer(id);
                }
            }
        }
        if token == 3 {
            driver.disconnect();
        }
    }
}

#[tokio::test]
async fn timers_and_notifications_wake_the_scheduler_in_order() {
    let (dir, ep, addr) = common::scripted_master("gantry-timers");
    let framework_id = FrameworkId::random();
    let task = TaskId::random();
    let script = tokio::spawn(async move {
        let (conn, mut tx, _rx, _) = common::accept_subscription(&ep, framework_id).await;
        let update = StatusUpdate::new(task, framework_id, TaskState::Running);
        tx.send(&MasterToFramework::Update(update))
            .await
            .expect("update");
        // Keep the session up until the driver leaves.
        conn.closed().await;
    });
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let config = DriverConfig::new(vec![addr.to_string()], dir.0.clone(), "fw", vec![]);
    let driver = Driver::new(config);
    let handle = driver.handle();
    let run = tokio::spawn(driver.run(Clock {
        seen: seen_tx,
        ticks: 0,
        periodic: None,
    }));
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !got.contains(&Seen::Wake(1)) {
        let s = tokio::time::timeout_at(deadline, seen.recv())
            .await
            .expect("the one-shot timer fired in time")
            .expect("driver running");
        got.push(s);
    }
    // The framework's own event, from outside the scheduler, ends the run.
    handle.notify(3);
    while let Ok(Some(s)) = tokio::time::timeout_at(deadline, seen.recv()).await {
        got.push(s);
    }
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("driver ended")
        .expect("join")
        .expect("run");
    script.abort();
    assert_eq!(got[0], Seen::Registered, "{got:?}");
    assert!(got.contains(&Seen::Update(task)), "{got:?}");
    let ticks = got.iter().filter(|s| **s == Seen::Wake(2)).count();
    assert_eq!(ticks, 3, "the periodic timer, cancelled after 3: {got:?}");
    assert!(
        !got.contains(&Seen::Wake(99)),
        "a cancelled timer fired: {got:?}"
    );
    assert_eq!(got.last(), Some(&Seen::Wake(3)), "{got:?}");
}

/// Wakes on a timer while no master answers: the back-off of a framework that cannot reach
/// the cluster still runs.
struct Lonely {
    seen: mpsc::UnboundedSender<u64>,
}

impl Scheduler for Lonely {
    async fn wake(&mut self, driver: &DriverHandle, token: u64) {
        let _ = self.seen.send(token);
        if token == 7 {
            driver.disconnect();
        }
    }
}

#[tokio::test]
async fn timers_fire_while_no_master_is_reachable() {
    let (dir, ep, _) = common::scripted_master("gantry-timers-alone");
    // Nobody listens here.
    let nowhere = ep.local_addr().expect("addr");
    drop(ep);
    let config = DriverConfig::new(vec![nowhere.to_string()], dir.0.clone(), "fw", vec![]);
    let driver = Driver::new(config);
    let handle = driver.handle();
    handle.after(Duration::from_millis(50), 6);
    handle.after(Duration::from_millis(150), 7);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let run = tokio::spawn(driver.run(Lonely { seen: tx }));
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("driver ended on the timer")
        .expect("join")
        .expect("run");
    let mut got = Vec::new();
    while let Ok(t) = rx.try_recv() {
        got.push(t);
    }
    assert_eq!(got, vec![6, 7]);
}
