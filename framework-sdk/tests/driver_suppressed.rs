//! The driver against a scripted master over real QUIC and mutual TLS: a framework that
//! suppressed its offers and lost its connection re-subscribes suppressed
//! (`FrameworkInfo::suppressed_roles`), so the master does not offer it everything again; once
//! it revives, a re-subscription carries no suppressed role.

use std::time::Duration;

use gantry_sdk::protocol::*;
use gantry_sdk::{Driver, DriverConfig, DriverHandle, Scheduler};

mod common;

/// Suppresses on its first subscription, revives on its second.
struct Toggle {
    subscriptions: usize,
}

impl Scheduler for Toggle {
    async fn registered(&mut self, driver: &DriverHandle, _id: FrameworkId) {
        self.subscriptions += 1;
        match self.subscriptions {
            1 => driver.suppress(vec!["b".into()]),
            2 => driver.revive(Vec::new()),
            _ => driver.stop(),
        }
    }
}

#[tokio::test]
async fn a_reconnecting_framework_resubscribes_with_the_roles_it_suppressed() {
    let (dir, ep, addr) = common::scripted_master("gantry-supp");
    let framework_id = FrameworkId::random();
    // The scripted master: three sessions; in each it reads the subscription, answers, reads
    // what the scheduler sends in `registered` (not in the last), and closes the connection.
    let script = tokio::spawn(async move {
        let mut infos = Vec::new();
        for session in 0..3 {
            let (conn, _tx, mut rx, info) = common::accept_subscription(&ep, framework_id).await;
            infos.push(info);
            if session < 2 {
                let next = rx.recv::<FrameworkToMaster>().await.expect("request");
                assert!(
                    matches!(
                        (session, &next),
                        (0, FrameworkToMaster::Suppress { .. })
                            | (1, FrameworkToMaster::Revive { .. })
                    ),
                    "session {session}: {next:?}"
                );
                conn.close(0u32.into(), b"gone");
            } else {
                let _ =
                    tokio::time::timeout(Duration::from_secs(5), rx.recv::<FrameworkToMaster>())
                        .await;
            }
        }
        infos
    });
    let config = DriverConfig::new(
        vec![addr.to_string()],
        dir.0.clone(),
        "fw",
        vec!["a".into(), "b".into()],
    );
    let run = tokio::spawn(Driver::new(config).run(Toggle { subscriptions: 0 }));
    let infos = tokio::time::timeout(Duration::from_secs(60), script)
        .await
        .expect("three subscriptions in time")
        .expect("script");
    let suppressed: Vec<Vec<String>> = infos.iter().map(|i| i.suppressed_roles.clone()).collect();
    assert_eq!(
        suppressed,
        vec![vec![], vec!["b".to_string()], vec![]],
        "first subscription as configured, then the roles last suppressed"
    );
    assert_eq!(infos[1].framework_id, Some(framework_id));
    let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
}
