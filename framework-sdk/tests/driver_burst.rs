//! The driver against a scripted master over real QUIC and mutual TLS: a burst of updates
//! written at once (many more than the driver handles before it writes acknowledgements)
//! reaches the scheduler whole and in order, and every update is acknowledged.

use std::time::Duration;

use gantry_sdk::protocol::*;
use gantry_sdk::{Driver, DriverConfig, DriverHandle, Scheduler};
use tokio::sync::mpsc;

const BURST: usize = 1_000;

mod common;

/// Passes every update's task id on, then stops the driver after the last.
struct Collect {
    seen: mpsc::UnboundedSender<TaskId>,
    n: usize,
}

impl Scheduler for Collect {
    async fn status_update(&mut self, driver: &DriverHandle, update: &StatusUpdate) {
        if self.n == 0 {
            // A slow first callback: the rest of the burst queues up behind it.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let _ = self.seen.send(update.task_id);
        self.n += 1;
        if self.n == BURST {
            driver.stop();
        }
    }
}

#[tokio::test]
async fn a_burst_of_updates_is_delivered_whole_and_acknowledged() {
    let (dir, ep, addr) = common::scripted_master("gantry-burst");
    let framework_id = FrameworkId::random();
    let updates: Vec<MasterToFramework> = (0..BURST)
        .map(|_| {
            MasterToFramework::Update(StatusUpdate::new(
                TaskId::random(),
                framework_id,
                TaskState::Running,
            ))
        })
        .collect();
    let sent: Vec<TaskId> = updates
        .iter()
        .map(|m| match m {
            MasterToFramework::Update(u) => u.task_id,
            _ => unreachable!(),
        })
        .collect();
    // The scripted master: role, Subscribed, then every update in one write; it answers with
    // the acknowledgements it read.
    let script = tokio::spawn(async move {
        let (_conn, mut tx, mut rx, _) = common::accept_subscription(&ep, framework_id).await;
        tx.send_all(&updates).await.expect("burst");
        let mut acked = Vec::new();
        while acked.len() < BURST {
            match rx.recv::<FrameworkToMaster>().await.expect("ack") {
                FrameworkToMaster::Acknowledge { task_id, .. } => acked.push(task_id),
                other => panic!("unexpected {other:?}"),
            }
        }
        acked
    });
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel();
    let config = DriverConfig::new(vec![addr.to_string()], dir.0.clone(), "fw", vec![]);
    let driver = Driver::new(config);
    let run = tokio::spawn(driver.run(Collect {
        seen: seen_tx,
        n: 0,
    }));
    let acked = tokio::time::timeout(Duration::from_secs(60), script)
        .await
        .expect("every update acknowledged in time")
        .expect("script");
    assert_eq!(acked, sent);
    let mut seen = Vec::new();
    while let Ok(id) = seen_rx.try_recv() {
        seen.push(id);
    }
    assert_eq!(seen, sent);
    let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
}
