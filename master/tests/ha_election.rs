//! Leader election against a real etcd server (Debian's `etcd-server`, started by the harness on
//! free loopback ports): one winner, failover on a crashed leader, clean resignation, etcd
//! restarts without two leaders, and a leader cut off from etcd stepping down before anyone else
//! is elected.

mod common;

use std::time::{Duration, Instant};

use common::*;
use gantry_master::election::{Fence, LeaderWatch, LeadershipEvent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_one_of_two_wins_and_the_other_takes_over_when_the_leader_dies() {
    let etcd = start_etcd();
    let log = new_log();
    let p = prefix("failover");
    let mut a = Node::start("a", config(&etcd.client_url(), "a:5050", &p), log.clone());
    let mut b = Node::start("b", config(&etcd.client_url(), "b:5050", &p), log.clone());

    assert!(
        wait_until(Duration::from_secs(10), || a.is_leader() || b.is_leader()).await,
        "nobody elected"
    );
    // Exactly one wins, and stays the only one.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        a.is_leader() ^ b.is_leader(),
        "a={:?} b={:?}",
        a.status(),
        b.status()
    );
    let (winner, loser) = if a.is_leader() {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    let winner_name = winner.name.clone();
    let loser_name = loser.name.clone();
    let winner_addr = format!("{winner_name}:5050");
    // The standby learns the leader's advertised address (to redirect peers).
    assert!(
        wait_until(Duration::from_secs(5), || loser.status().leader.as_deref()
            == Some(winner_addr.as_str()))
        .await,
        "standby does not know the leader: {:?}",
        loser.status()
    );
    let (first_epoch, first_fence, _) = elections(&log, &winner_name)[0].clone();
    assert!(
        matches!(first_fence, Fence::Etcd { create_revision, .. } if create_revision as u64 == first_epoch)
    );

    // Crash the leader: its lease is left to expire; the standby must win after the TTL.
    let killed_at = Instant::now();
    winner.kill().await;
    assert!(
        wait_until(Duration::from_secs(10), || loser.is_leader()).await,
        "standby never took over"
    );
    let took = killed_at.elapsed();
    assert!(
        took >= Duration::from_millis(1000),
        "took over before the old lease could expire: {took:?}"
    );
    let (second_epoch, _, _) = elections(&log, &loser_name)[0].clone();
    assert!(
        second_epoch > first_epoch,
        "epoch must grow: {first_epoch} -> {second_epoch}"
    );
    assert_eq!(loser.status().epoch, Some(second_epoch));
    assert_no_two_leaders(&log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_resign_hands_over_without_waiting_for_the_ttl() {
    let etcd = start_etcd();
    let log = new_log();
    let p = prefix("resign");
    let mut cfg_a = config(&etcd.client_url(), "a:5050", &p);
    cfg_a.lease_ttl = Duration::from_secs(10);
    let mut a = Node::start("a", cfg_a, log.clone());
    assert!(wait_until(Duration::from_secs(10), || a.is_leader()).await);
    let mut cfg_b = config(&etcd.client_url(), "b:5050", &p);
    cfg_b.lease_ttl = Duration::from_secs(10);
    let b = Node::start("b", cfg_b, log.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!b.is_leader());

    let t = Instant::now();
    a.resign().await;
    assert!(wait_until(Duration::from_secs(5), || b.is_leader()).await);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "resign must not wait for the 10 s TTL"
    );
    assert_eq!(losses(&log, "a").len(), 1);
    assert_eq!(losses(&log, "a")[0].0, "resigned");
    assert_no_two_leaders(&log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_etcd_restart_never_makes_two_leaders() {
    let mut etcd = start_etcd();
    let log = new_log();
    let p = prefix("etcd-restart");
    let a = Node::start("a", config(&etcd.client_url(), "a:5050", &p), log.clone());
    assert!(wait_until(Duration::from_secs(10), || a.is_leader()).await);
    let b = Node::start("b", config(&etcd.client_url(), "b:5050", &p), log.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A quick restart (shorter than the TTL): the leader keeps or re-acquires leadership, and the
    // keep-alive stream (dead after the restart with etcd 3.4) is recreated.
    tokio::task::block_in_place(|| etcd.restart()).expect("etcd restarts");
    one_leader_then_settled(&a, &b, &log, 15, "after a quick etcd restart").await;

    // A long outage (longer than the TTL): whoever leads must step down while etcd is away, and
    // exactly one leader must come back.
    tokio::task::block_in_place(|| etcd.kill());
    assert!(
        wait_until(Duration::from_secs(5), || !a.is_leader() && !b.is_leader()).await,
        "a leader kept leading with etcd down past its TTL"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::block_in_place(|| etcd.restart()).expect("etcd restarts");
    one_leader_then_settled(&a, &b, &log, 20, "after etcd came back").await;
    // The step-down during the outage was reported as a lost lease.
    let lost: Vec<_> = losses(&log, "a")
        .into_iter()
        .chain(losses(&log, "b"))
        .collect();
    assert!(
        lost.iter().any(|(r, _)| r.contains("lease")),
        "expected a lease-loss step-down, got {lost:?}"
    );
}

/// A leader partitioned from etcd (here: by a proxy the test controls) while everything else
/// still reaches etcd must stop acting as leader before the other master is elected.
async fn cut_off_leader_steps_down_first(stall: bool) {
    let etcd = start_etcd();
    let mut proxy =
        tokio::task::block_in_place(|| proxy::TcpProxy::start(etcd.client_addr())).unwrap();
    let log = new_log();
    let p = prefix(if stall { "stall" } else { "cut" });
    let a = Node::start("a", config(&proxy.url(), "a:5050", &p), log.clone());
    assert!(wait_until(Duration::from_secs(10), || a.is_leader()).await);
    let b = Node::start("b", config(&etcd.client_url(), "b:5050", &p), log.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!b.is_leader());

    if stall {
        proxy.stall();
    } else {
        proxy.cut();
    }
    assert!(
        wait_until(Duration::from_secs(15), || b.is_leader()).await,
        "the standby never took over"
    );
    let lost = losses(&log, "a");
    let won = elections(&log, "b");
    assert_eq!(lost.len(), 1, "a must have stepped down once: {lost:?}");
    assert_eq!(won.len(), 1);
    let (reason, lost_at) = &lost[0];
    let (_, _, won_at) = &won[0];
    assert!(
        lost_at < won_at,
        "a stepped down {:?} AFTER b was elected ({reason})",
        lost_at.duration_since(*won_at)
    );
    assert!(reason.contains("lease"), "{reason}");
    assert!(!a.is_leader());
    // Even a master whose election task were starved could not act past this deadline
    // (`LeadershipStatus::leads_at`), and it too lies before the new leader's election.
    let a_valid_until = a
        .status()
        .lease_valid_until
        .expect("etcd mode tracks the deadline");
    assert!(
        a_valid_until <= *won_at,
        "a's lease deadline is after b's election"
    );
    assert_no_two_leaders(&log);

    // Back online: a stays standby and learns who leads.
    proxy.restore().unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || a.status().leader.as_deref()
            == Some("b:5050"))
        .await,
        "a does not see b as leader: {:?}",
        a.status()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!a.is_leader() && b.is_leader());
    assert_no_two_leaders(&log);
    // The ordering margin, for the record.
    eprintln!(
        "stall={stall}: a stepped down {:?} before b was elected",
        won_at.duration_since(*lost_at)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_leader_cut_off_from_etcd_steps_down_before_the_standby_wins() {
    cut_off_leader_steps_down_first(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_leader_silently_partitioned_from_etcd_steps_down_before_the_standby_wins() {
    cut_off_leader_steps_down_first(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_leader_changed_events_follow_the_leader() {
    let etcd = start_etcd();
    let log = new_log();
    let p = prefix("observe");
    let mut a = Node::start("a", config(&etcd.client_url(), "a:5050", &p), log.clone());
    assert!(wait_until(Duration::from_secs(10), || a.is_leader()).await);
    let b = Node::start("b", config(&etcd.client_url(), "b:5050", &p), log.clone());
    assert!(
        wait_until(Duration::from_secs(5), || b.status().leader.as_deref()
            == Some("a:5050"))
        .await
    );
    // A non-campaigning watcher (what a tool, agent or framework would use) sees the same.
    let watcher = LeaderWatch::start(vec![etcd.client_url()], &p);
    assert!(
        wait_until(Duration::from_secs(5), || watcher.leader().as_deref()
            == Some("a:5050"))
        .await
    );
    a.resign().await;
    assert!(wait_until(Duration::from_secs(5), || b.is_leader()).await);
    assert!(
        wait_until(Duration::from_secs(5), || watcher.leader().as_deref()
            == Some("b:5050"))
        .await,
        "watcher still sees {:?}",
        watcher.leader()
    );
    let seen: Vec<Option<String>> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.node == "b")
        .filter_map(|l| match &l.event {
            LeadershipEvent::LeaderChanged { leader } => Some(leader.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(seen.first(), Some(&Some("a:5050".to_string())), "{seen:?}");
    assert_eq!(b.status().leader.as_deref(), Some("b:5050"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_deleting_the_leader_key_makes_the_leader_step_down_and_campaign_again() {
    let etcd = start_etcd();
    let log = new_log();
    let p = prefix("delete-key");
    let a = Node::start("a", config(&etcd.client_url(), "a:5050", &p), log.clone());
    assert!(wait_until(Duration::from_secs(10), || a.is_leader()).await);
    let (epoch1, fence, _) = elections(&log, "a")[0].clone();
    let Fence::Etcd { leader_key, .. } = fence else {
        panic!("etcd fence expected");
    };
    let mut client = etcd_client::Client::connect([etcd.client_url()], None)
        .await
        .unwrap();
    client.delete(leader_key, None).await.unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || !losses(&log, "a").is_empty()).await,
        "the leader did not notice its key was deleted"
    );
    assert!(
        losses(&log, "a")[0].0.contains("deleted"),
        "{:?}",
        losses(&log, "a")
    );
    // It campaigns again and wins a new, higher epoch.
    assert!(wait_until(Duration::from_secs(10), || elections(&log, "a").len() == 2).await);
    assert!(elections(&log, "a")[1].0 > epoch1);
    assert_no_two_leaders(&log);
}

/// Waits up to `secs` for `a` or `b` to lead, then 3 s more, and asserts that exactly one leads
/// and that the log never showed two leaders (`when` names the moment in failures).
async fn one_leader_then_settled(a: &Node, b: &Node, log: &Log, secs: u64, when: &str) {
    assert!(
        wait_until(Duration::from_secs(secs), || a.is_leader() || b.is_leader()).await,
        "no leader {when}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        a.is_leader() ^ b.is_leader(),
        "{when}: a={:?} b={:?}",
        a.status(),
        b.status()
    );
    assert_no_two_leaders(log);
}
