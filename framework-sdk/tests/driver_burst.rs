//! The driver against a scripted master over real QUIC and mutual TLS: a burst of updates
//! written at once (many more than the driver handles before it writes acknowledgements)
//! reaches the scheduler whole and in order, and every update is acknowledged.

use std::time::Duration;

use gantry_sdk::protocol::*;
use gantry_sdk::transport::quic;
use gantry_sdk::transport::tls::PeerIdentity;
use gantry_sdk::{Driver, DriverConfig, DriverHandle, Scheduler};
use tokio::sync::mpsc;

const BURST: usize = 1_000;

struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

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
    let dir = Dir(std::env::temp_dir().join(format!("gantry-burst-{}", uuid::Uuid::new_v4())));
    std::fs::create_dir_all(&dir.0).expect("dir");
    gantry_pki::ensure_ca(&dir.0).expect("ca");
    let master = gantry_pki::load_or_issue(&dir.0, &PeerIdentity::Master, &[]).expect("tls");
    gantry_pki::load_or_issue(&dir.0, &PeerIdentity::Framework("fw".into()), &[]).expect("tls");
    let ep = quic::server_endpoint("127.0.0.1:0".parse().expect("addr"), &master, &[7; 32])
        .expect("endpoint");
    let addr = ep.local_addr().expect("addr");
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
        let conn = ep.accept().await.expect("incoming").await.expect("conn");
        let (_, mut tx, mut rx) = quic::accept_stream(&conn).await.expect("hello");
        tx.send(&MasterRole::Leading { epoch: 1 })
            .await
            .expect("role");
        let FrameworkToMaster::Subscribe(_) = rx.recv().await.expect("subscribe") else {
            panic!("not a subscribe");
        };
        let subscribed = MasterToFramework::Subscribed {
            framework_id,
            epoch: 1,
            heartbeat_interval_ms: 60_000,
        };
        tx.send(&subscribed).await.expect("subscribed");
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
