//! Explicit acknowledgements against a scripted master over real QUIC and mutual TLS: the
//! driver acknowledges nothing by itself, a redelivered update reaches the scheduler again,
//! and `acknowledge` sends exactly what the scheduler acknowledges.

use std::time::Duration;

use gantry_sdk::protocol::*;
use gantry_sdk::{Driver, DriverConfig, DriverHandle, Scheduler};
use tokio::sync::mpsc;

mod common;

/// Persists nothing the first time it sees an update (a crash, say); acknowledges the second
/// time, and `last` at once.
struct Careful {
    seen: mpsc::UnboundedSender<UpdateId>,
    first: Option<UpdateId>,
    last: UpdateId,
}

impl Scheduler for Careful {
    async fn status_update(&mut self, driver: &DriverHandle, update: &StatusUpdate) {
        let _ = self.seen.send(update.update_id);
        if update.update_id == self.last || self.first == Some(update.update_id) {
            driver.acknowledge(update);
        } else {
            self.first = Some(update.update_id);
        }
    }
}

#[tokio::test]
async fn explicit_acks_send_only_what_the_scheduler_acknowledges() {
    let (dir, ep, addr) = common::scripted_master("gantry-acks");
    let framework_id = FrameworkId::random();
    let u1 = StatusUpdate::new(TaskId::random(), framework_id, TaskState::Running);
    let u2 = StatusUpdate::new(TaskId::random(), framework_id, TaskState::Finished);
    let (first, last) = (u1.update_id, u2.update_id);
    let script = tokio::spawn(async move {
        let (_conn, mut tx, mut rx, _) = common::accept_subscription(&ep, framework_id).await;
        // u1, then u1 again (the master redelivers what was not acknowledged), then u2.
        let burst = [u1.clone(), u1, u2].map(MasterToFramework::Update);
        tx.send_all(&burst).await.expect("updates");
        let mut acked = Vec::new();
        while acked.len() < 2 {
            match rx.recv::<FrameworkToMaster>().await.expect("ack") {
                FrameworkToMaster::Acknowledge { update_id, .. } => acked.push(update_id),
                other => panic!("unexpected {other:?}"),
            }
        }
        acked
    });
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel();
    let mut config = DriverConfig::new(vec![addr.to_string()], dir.0.clone(), "fw", vec![]);
    config.explicit_acks = true;
    let driver = Driver::new(config);
    let handle = driver.handle();
    let run = tokio::spawn(driver.run(Careful {
        seen: seen_tx,
        first: None,
        last,
    }));
    let acked = tokio::time::timeout(Duration::from_secs(60), script)
        .await
        .expect("acknowledged in time")
        .expect("script");
    // Not three (the driver's own, one per delivery): the two the scheduler sent.
    assert_eq!(acked, vec![first, last]);
    handle.disconnect();
    let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
    let mut seen = Vec::new();
    while let Ok(id) = seen_rx.try_recv() {
        seen.push(id);
    }
    assert_eq!(
        seen,
        vec![first, first, last],
        "the redelivery reached the scheduler"
    );
}
