//! Bounded messages and peers (issue 10, findings 5 and 6), attacked over real QUIC against a
//! real master, each with a legitimate framework whose tasks must all finish meanwhile:
//! - 200 emulated agents with 22 KB of attributes each: the offers to one framework exceed a
//!   frame and must be split;
//! - a framework that stops reading is closed for real and its offers go to another one;
//! - a 240,000-id reconcile is refused, long ones are answered in slices;
//! - stalled partial frames hold no more than the master's frame budget, and time out.

use std::time::Duration;

use gantry_sdk::protocol::*;
use gantry_sdk::transport::quic;
use gantry_sdk::transport::tls::PeerIdentity;
use gantry_tests::{run_batch, Cluster};

const T: Duration = Duration::from_secs(30);

async fn subscribed(tx: &mut quic::FrameSender, rx: &mut quic::FrameReceiver, name: &str) {
    tx.send(&FrameworkToMaster::Subscribe(FrameworkInfo {
        framework_id: None,
        name: name.into(),
        roles: vec!["attack".into()],
        capabilities: vec![],
        failover_timeout_secs: 0.0,
        min_allocatable: Vec::new(),
        suppressed_roles: Vec::new(),
    }))
    .await
    .unwrap();
    next_msg(rx, |m| matches!(m, MasterToFramework::Subscribed { .. })).await;
}

async fn next_msg(
    rx: &mut quic::FrameReceiver,
    pred: impl Fn(&MasterToFramework) -> bool,
) -> MasterToFramework {
    loop {
        let m = tokio::time::timeout(T, rx.recv::<MasterToFramework>())
            .await
            .expect("timed out")
            .expect("connection failed");
        if pred(&m) {
            return m;
        }
    }
}

/// The next message that is not an offer; offers are declined (for the honest framework).
async fn next_declining(
    tx: &mut quic::FrameSender,
    rx: &mut quic::FrameReceiver,
) -> MasterToFramework {
    loop {
        match next_msg(rx, |_| true).await {
            MasterToFramework::Offers(offers) => {
                tx.send(&FrameworkToMaster::Decline {
                    offer_ids: offers.iter().map(|o| o.id).collect(),
                    refuse_seconds: Some(3600.0),
                })
                .await
                .unwrap();
            }
            m => return m,
        }
    }
}

fn assert_all_finished(p: &gantry_examples::batch::BatchProgress, n: u32) {
    assert_eq!((p.finished, p.failed), (n, 0), "{:?}", p.errors);
}

/// `/state` in a blocking task (the harness's HTTP client blocks).
async fn state(cluster: &Cluster) -> serde_json::Value {
    let http = cluster.master.http;
    tokio::task::spawn_blocking(move || {
        serde_json::from_str(&gantry_tests::http_get(http, "/state").unwrap()).unwrap()
    })
    .await
    .unwrap()
}

/// One emulated agent: registers with `attributes` and tiny resources (no batch task fits),
/// then heartbeats and reads until the test ends.
async fn emulated_agent(
    ep: quinn::Endpoint,
    cfg: quinn::ClientConfig,
    master: std::net::SocketAddr,
    idx: usize,
    attributes: Attributes,
) -> tokio::task::JoinHandle<()> {
    let (_conn, mut tx, mut rx, role) = quic::connect_with(&ep, cfg, master, PeerKind::Agent)
        .await
        .unwrap();
    assert!(matches!(role, MasterRole::Leading { .. }), "{role:?}");
    tx.send(&AgentToMaster::Register {
        agent_id: None,
        hostname: format!("emulated-{idx}.example"),
        resources: "cpus:0.1;mem:8".parse().unwrap(),
        reserved: Default::default(),
        attributes,
        gpus: vec![],
        running_tasks: vec![],
        pending_updates: vec![],
        task_user: "nobody".into(),
    })
    .await
    .unwrap();
    tokio::spawn(async move {
        let _conn = _conn;
        let mut beat = tokio::time::interval(Duration::from_secs(2));
        loop {
            tokio::select! {
                m = rx.recv::<MasterToAgent>() => match m {
                    Ok(MasterToAgent::Error { message }) => panic!("agent {idx} refused: {message}"),
                    Ok(_) => {}
                    Err(_) => return,
                },
                _ = beat.tick() => {
                    if tx.send(&AgentToMaster::Heartbeat).await.is_err() {
                        return;
                    }
                }
            }
        }
    })
}

/// 22 KB of attributes in 11 values of 2,000 bytes.
fn large_attributes(tag: &str) -> Attributes {
    (0..11)
        .map(|i| (format!("blob{i}"), format!("{tag}{}", "x".repeat(2_000))))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offers_of_200_agents_with_large_attributes_reach_the_framework() {
    // One real agent runs the tasks; it carries 22 KB of attributes too.
    let attrs: String = (0..11)
        .map(|i| format!("blob{i}:{}", "r".repeat(2_000)))
        .collect::<Vec<_>>()
        .join(";");
    let cluster = Cluster::start_with(
        &[("real", "cpus:4;mem:1024")],
        &[],
        &["--attributes", &attrs],
    )
    .unwrap();
    let m = cluster.master.quic;
    let ep = quic::bind_client(m).unwrap();
    let mut agents = Vec::new();
    for i in 0..200 {
        let material = gantry_pki::load_or_issue(
            &cluster.tls_dir,
            &PeerIdentity::Agent(format!("emulated-{i}")),
            &[],
        )
        .unwrap();
        let cfg = quic::client_config(&material).unwrap();
        agents
            .push(emulated_agent(ep.clone(), cfg, m, i, large_attributes(&format!("{i}-"))).await);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let s = state(&cluster).await;
        let connected = s["agents"]
            .as_array()
            .map_or(0, |a| a.iter().filter(|a| a["connected"] == true).count());
        if connected == 201 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{connected} of 201 agents registered"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // ~4.4 MB of offers in the framework's first allocation: more than one frame.
    let progress = tokio::time::timeout(
        Duration::from_secs(120),
        run_batch(
            m,
            &cluster.tls_dir,
            "many-offers",
            "batch",
            20,
            "cpus:0.5;mem:32",
            "true",
        ),
    )
    .await
    .expect("the framework got no usable offers in time")
    .unwrap();
    assert_all_finished(&progress, 20);
    let s = state(&cluster).await;
    assert_eq!(s["peers"]["dropped_messages"], 0, "{}", s["peers"]);
    for a in agents {
        a.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_framework_that_stops_reading_is_closed_and_its_offers_go_to_another() {
    let cluster = Cluster::start(&[("bp-stall", "cpus:2;mem:512")]).unwrap();
    // The stalled framework takes the whole agent in an offer and never answers it.
    let (_ep, conn, mut tx, mut rx) = cluster.raw_framework("stalled").await;
    subscribed(&mut tx, &mut rx, "stalled").await;
    next_msg(&mut rx, |m| matches!(m, MasterToFramework::Offers(_))).await;
    let (m, tls_dir) = (cluster.master.quic, cluster.tls_dir.clone());
    let honest = tokio::spawn(async move {
        run_batch(
            m,
            &tls_dir,
            "honest",
            "good",
            10,
            "cpus:0.5;mem:32",
            "sleep 0.1",
        )
        .await
    });
    // Then it stops reading while asking for ever more answers: kills of unknown tasks, each
    // answered with an error, until the master gives up on it.
    let flood = async {
        for _ in 0..200_000 {
            let msg = FrameworkToMaster::Kill {
                task_id: TaskId::random(),
            };
            if tx.send(&msg).await.is_err() || conn.close_reason().is_some() {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), flood)
        .await
        .expect("flood blocked");
    let reason = tokio::time::timeout(T, conn.closed())
        .await
        .expect("the master kept the stalled framework connected")
        .to_string();
    assert!(reason.contains("not reading"), "{reason}");
    // Its offer went to the honest framework, whose tasks all finish.
    let progress = tokio::time::timeout(Duration::from_secs(120), honest)
        .await
        .expect("the honest framework never got the stalled one's offers")
        .unwrap()
        .unwrap();
    assert_all_finished(&progress, 10);
    let s = state(&cluster).await;
    assert!(
        s["peers"]["stalled_closed"].as_u64() >= Some(1),
        "{}",
        s["peers"]
    );
    let stalled = s["frameworks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["principal"] == "stalled");
    // Failover timeout 0: removed, or at least disconnected.
    assert!(
        stalled.is_none_or(|f| f["connected"] == false),
        "{stalled:?}"
    );
    drop(rx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_reconcile_is_refused_and_long_ones_do_not_stall_others() {
    let cluster = Cluster::start(&[("bp-reconcile", "cpus:4;mem:1024")]).unwrap();
    let (m, tls_dir) = (cluster.master.quic, cluster.tls_dir.clone());
    let honest = tokio::spawn(async move {
        run_batch(
            m,
            &tls_dir,
            "honest",
            "good",
            40,
            "cpus:0.5;mem:32",
            "sleep 0.1",
        )
        .await
    });
    let (_ep, _conn, mut tx, mut rx) = cluster.raw_framework("reconciler").await;
    subscribed(&mut tx, &mut rx, "reconciler").await;
    // It wants no offers (those already on their way are declined below).
    tx.send(&FrameworkToMaster::Suppress { roles: vec![] })
        .await
        .unwrap();
    // 240,000 ids (a 4 MB frame, just under the limit): refused with a clear error.
    let huge: Vec<TaskId> = (0..240_000).map(|_| TaskId::random()).collect();
    tx.send(&FrameworkToMaster::Reconcile { task_ids: huge })
        .await
        .unwrap();
    let e = next_declining(&mut tx, &mut rx).await;
    assert!(
        matches!(&e, MasterToFramework::Error { kind: ErrorKind::InvalidRequest, message }
            if message.contains("240000") && message.contains(&MAX_RECONCILE_IDS.to_string())),
        "{e:?}"
    );
    // Five requests at the limit are answered in full, in slices, while reading.
    let ids: Vec<TaskId> = (0..MAX_RECONCILE_IDS).map(|_| TaskId::random()).collect();
    for _ in 0..5 {
        tx.send(&FrameworkToMaster::Reconcile {
            task_ids: ids.clone(),
        })
        .await
        .unwrap();
    }
    let mut answers = 0;
    while answers < 5 * MAX_RECONCILE_IDS {
        match next_declining(&mut tx, &mut rx).await {
            MasterToFramework::Update(u) if u.reconciliation => {
                assert_eq!(u.state, TaskState::Lost);
                answers += 1;
            }
            MasterToFramework::Error { message, .. } => panic!("refused: {message}"),
            _ => {}
        }
    }
    let progress = tokio::time::timeout(Duration::from_secs(120), honest)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_all_finished(&progress, 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_partial_frames_hold_at_most_the_budget_and_time_out() {
    // A small budget (16 MiB) and deadline (2 s) for the test.
    let cluster = Cluster::start_with(
        &[("bp-frames", "cpus:4;mem:1024")],
        &["--frame-budget-mib", "16", "--frame-body-timeout", "2"],
        &[],
    )
    .unwrap();
    let (m, tls_dir) = (cluster.master.quic, cluster.tls_dir.clone());
    let honest = tokio::spawn(async move {
        run_batch(
            m,
            &tls_dir,
            "honest",
            "good",
            20,
            "cpus:0.5;mem:32",
            "sleep 0.2",
        )
        .await
    });
    // 20 peers each announce a 4 MiB frame, send 1 MiB of it and stall: 80 MiB claimed.
    let mut stalled = Vec::new();
    for i in 0..20 {
        let (ep, conn, mut tx, rx) = cluster.raw_framework(&format!("stall-{i}")).await;
        tokio::spawn(async move {
            let _ = tx.0.write_all(&(MAX_FRAME_LEN as u32).to_be_bytes()).await;
            let _ = tx.0.write_all(&vec![0u8; 1 << 20]).await;
            // Stall with the stream open.
            tokio::time::sleep(Duration::from_secs(600)).await;
            drop(tx);
        });
        stalled.push((ep, conn, rx));
    }
    // While they stall, the master holds at most its budget of partial frames, and the rest
    // wait their turn.
    let mut saw_waiting = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (peak, budget) = loop {
        let s = state(&cluster).await;
        let f = &s["peers"]["frames"];
        let budget = f["budget_bytes"].as_u64().unwrap();
        assert_eq!(budget, 16 << 20);
        assert!(f["reserved_bytes"].as_u64().unwrap() <= budget, "{f}");
        assert!(f["buffered_bytes"].as_u64().unwrap() <= budget, "{f}");
        saw_waiting |= f["waiting_readers"].as_u64().unwrap() > 0;
        let peak = f["peak_buffered_bytes"].as_u64().unwrap();
        if f["body_timeouts"].as_u64().unwrap() >= 20 {
            break (peak, budget);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "stalled frames did not time out: {f}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(saw_waiting, "no reader ever waited for the budget");
    assert!(peak > 0 && peak <= budget, "peak {peak} of {budget}");
    // Every stalled peer was closed, with the reason.
    for (_ep, conn, _rx) in &stalled {
        let reason = tokio::time::timeout(T, conn.closed())
            .await
            .expect("a stalled peer stayed connected")
            .to_string();
        assert!(reason.contains("did not arrive"), "{reason}");
    }
    let progress = tokio::time::timeout(Duration::from_secs(120), honest)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_all_finished(&progress, 20);
}

const MAX_FRAME_LEN: usize = gantry_sdk::protocol::codec::MAX_FRAME;
