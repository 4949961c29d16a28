//! Offer hoarding by a stalled framework, attacked over real QUIC against a real master and
//! agent (one agent, so whoever holds its offer holds the cluster), with a legitimate batch
//! framework that must finish its 20 tasks meanwhile:
//! - a framework that subscribes and then never reads (its stream fills: QUIC flow control
//!   blocks the master's writes) is closed as "not reading" after `--peer-write-timeout`, its
//!   offer rescinded at once;
//! - a framework that reads but never answers an offer loses it after `--offer-timeout`, and
//!   the agent is then filtered for it like a decline (not offered straight back to it).
//!
//! Short timeouts come from flags; `gantry-master`'s own unit tests pin that the defaults turn
//! both on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_sdk::protocol::*;
use gantry_sdk::transport::quic;
use gantry_sdk::transport::PeerIdentity;
use gantry_tests::{run_batch, Cluster};

/// Longer than the write timeout (with room for a slow machine): the framework that does not
/// read must lose its offer by being closed, not by the offer expiring.
const OFFER_TIMEOUT_S: &str = "8";
const WRITE_TIMEOUT_S: &str = "2";
/// The master's default refuse time (`AllocatorConfig::default_refuse_ms`): how long an expired
/// offer's agent is filtered for the framework that let it expire.
const REFUSE: Duration = Duration::from_secs(5);
/// How long the legitimate framework may take for its 20 tasks (a few seconds once it has the
/// agent; without the fixes it never gets it).
const HONEST_BOUND: Duration = Duration::from_secs(60);

fn subscribe(name: &str) -> FrameworkToMaster {
    FrameworkToMaster::Subscribe(FrameworkInfo {
        framework_id: None,
        name: name.into(),
        roles: vec!["hoard".into()],
        capabilities: vec![],
        failover_timeout_secs: 0.0,
        min_allocatable: Vec::new(),
        suppressed_roles: Vec::new(),
    })
}

async fn next_msg(
    rx: &mut quic::FrameReceiver,
    pred: impl Fn(&MasterToFramework) -> bool,
) -> MasterToFramework {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(30), rx.recv::<MasterToFramework>())
            .await
            .expect("timed out")
            .expect("connection failed");
        if pred(&m) {
            return m;
        }
    }
}

/// A raw framework connection whose stream receive window is only 4 KiB: once it stops
/// reading, the master's writes to it block after 4 KiB (a real peer's window is whatever it
/// asks for; this one fills within the test's time).
async fn small_window_framework(cluster: &Cluster, principal: &str) -> gantry_tests::RawPeer {
    let material = gantry_pki::load_or_issue(
        &cluster.tls_dir,
        &PeerIdentity::Framework(principal.into()),
        &[],
    )
    .unwrap();
    let mut cfg = quic::client_config(&material).unwrap();
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(quic::KEEP_ALIVE));
    transport.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(quic::IDLE_TIMEOUT).unwrap(),
    ));
    transport.stream_receive_window(quinn::VarInt::from_u32(4096));
    cfg.transport_config(Arc::new(transport));
    let ep = quic::bind_client(cluster.master.quic).unwrap();
    let (conn, tx, rx, role) =
        quic::connect_with(&ep, cfg, cluster.master.quic, PeerKind::Framework)
            .await
            .unwrap();
    assert!(matches!(role, MasterRole::Leading { .. }), "{role:?}");
    (ep, conn, tx, rx)
}

fn honest(
    cluster: &Cluster,
    name: &str,
) -> tokio::task::JoinHandle<anyhow::Result<gantry_examples::batch::BatchProgress>> {
    let (m, tls_dir, name) = (
        cluster.master.quic,
        cluster.tls_dir.clone(),
        name.to_string(),
    );
    tokio::spawn(async move {
        run_batch(
            m,
            &tls_dir,
            &name,
            "good",
            20,
            "cpus:0.5;mem:32",
            "sleep 0.1",
        )
        .await
    })
}

async fn finished_in_bound(
    cluster: &Cluster,
    what: &str,
    h: tokio::task::JoinHandle<anyhow::Result<gantry_examples::batch::BatchProgress>>,
) {
    let started = Instant::now();
    let Ok(p) = tokio::time::timeout(HONEST_BOUND, h).await else {
        cluster.dump_logs();
        panic!("{what}: the legitimate framework did not finish its 20 tasks within {HONEST_BOUND:?}: the hoarder kept the agent");
    };
    let p = p.unwrap().unwrap();
    assert_eq!((p.finished, p.failed), (20, 0), "{what}: {:?}", p.errors);
    eprintln!(
        "{what}: 20 tasks finished {:?} after the hoarder took the agent",
        started.elapsed()
    );
}

async fn state(cluster: &Cluster) -> serde_json::Value {
    let http = cluster.master.http;
    tokio::task::spawn_blocking(move || {
        serde_json::from_str(&gantry_tests::http_get(http, "/state").unwrap()).unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hoarding_frameworks_lose_their_offers_and_a_legitimate_one_finishes() {
    let cluster = Cluster::start_with(
        &[("hoarded", "cpus:2;mem:512")],
        &[
            "--offer-timeout",
            OFFER_TIMEOUT_S,
            "--peer-write-timeout",
            WRITE_TIMEOUT_S,
        ],
        &[],
    )
    .unwrap();

    // 1. Subscribes, takes the whole agent in an offer, then never reads again. A burst of
    //    requests (kills of unknown tasks, each answered) fills its small window at once; a
    //    real one fills with offers, updates and heartbeats over time.
    let (_ep, conn, mut tx, mut rx) = small_window_framework(&cluster, "silent").await;
    tx.send(&subscribe("silent")).await.unwrap();
    next_msg(&mut rx, |m| {
        matches!(m, MasterToFramework::Subscribed { .. })
    })
    .await;
    next_msg(&mut rx, |m| matches!(m, MasterToFramework::Offers(_))).await;
    let first = honest(&cluster, "honest-1");
    for _ in 0..300 {
        let kill = FrameworkToMaster::Kill {
            task_id: TaskId::random(),
        };
        if tx.send(&kill).await.is_err() {
            break;
        }
    }
    finished_in_bound(&cluster, "never reads", first).await;
    let reason = tokio::time::timeout(Duration::from_secs(30), conn.closed())
        .await
        .expect("the master kept a framework that does not read connected")
        .to_string();
    assert!(reason.contains("not reading"), "{reason}");
    let s = state(&cluster).await;
    assert!(
        s["peers"]["stalled_closed"].as_u64() >= Some(1),
        "{}",
        s["peers"]
    );
    assert_eq!(s["peers"]["write_timeout_ms"], 2000, "{}", s["peers"]);
    // Closed and failed over, its offer rescinded at once: no offer waited for the timeout.
    assert_eq!(s["allocator"]["offers_expired"], 0, "{}", s["allocator"]);
    let silent = s["frameworks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["principal"] == "silent");
    // Failover timeout 0: removed, or at least disconnected.
    assert!(silent.is_none_or(|f| f["connected"] == false), "{silent:?}");
    drop(rx);

    // 2. Reads everything and never answers: keeps each offer until the offer timeout, after
    //    which the agent is filtered for it for the refuse time.
    let (_ep2, conn2, mut tx2, mut rx2) = cluster.raw_framework("mute").await;
    tx2.send(&subscribe("mute")).await.unwrap();
    next_msg(&mut rx2, |m| {
        matches!(m, MasterToFramework::Subscribed { .. })
    })
    .await;
    next_msg(&mut rx2, |m| matches!(m, MasterToFramework::Offers(_))).await;
    let reader = tokio::spawn(async move {
        // (when, offer ids) for each offer message; rescind times.
        let mut offers: Vec<Instant> = Vec::new();
        let mut rescinds: Vec<Instant> = Vec::new();
        while let Ok(m) = rx2.recv::<MasterToFramework>().await {
            match m {
                MasterToFramework::Offers(_) => offers.push(Instant::now()),
                MasterToFramework::Rescind { .. } => rescinds.push(Instant::now()),
                _ => {}
            }
        }
        (offers, rescinds)
    });
    let second = honest(&cluster, "honest-2");
    finished_in_bound(&cluster, "never answers", second).await;
    assert!(
        conn2.close_reason().is_none(),
        "a framework that reads stays connected"
    );
    conn2.close(0u32.into(), b"done");
    drop(tx2);
    let (offers, rescinds) = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("reader ends with the connection")
        .unwrap();
    assert!(!rescinds.is_empty(), "its offer was never rescinded");
    let s = state(&cluster).await;
    assert!(
        s["allocator"]["offers_expired"].as_u64() >= Some(1),
        "{}",
        s["allocator"]
    );
    // The expired offer did not bounce straight back: no offer to it within the refuse time of
    // a rescind (a lower bound: a slow machine only makes the gap longer).
    for r in &rescinds {
        if let Some(next) = offers.iter().find(|o| *o > r) {
            assert!(
                next.duration_since(*r) >= REFUSE - Duration::from_millis(500),
                "offered again {:?} after its offer expired",
                next.duration_since(*r)
            );
        }
    }
}
