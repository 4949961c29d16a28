//! Hostile and broken peers: garbage, oversized frames, out-of-place messages, double accepts,
//! over-asking accepts, and certificates from another CA. The master answers each with an
//! error or a closed connection and keeps serving everyone else.

use std::time::Duration;

use gantry_pki::CertAuthority;
use gantry_sdk::protocol::*;
use gantry_sdk::transport::quic;
use gantry_sdk::transport::tls::{self, PeerIdentity};
use gantry_tests::{run_batch, Cluster, TempDir};

const T: Duration = Duration::from_secs(20);

/// A QUIC connection to the master with `identity`'s certificate and one open stream, before
/// any hello.
async fn raw_stream(
    cluster: &Cluster,
    identity: PeerIdentity,
) -> (
    quinn::Endpoint,
    quinn::Connection,
    quinn::SendStream,
    quinn::RecvStream,
) {
    let material = gantry_pki::load_or_issue(&cluster.tls_dir, &identity, &[]).unwrap();
    let ep = quic::client_endpoint(&material, cluster.master.quic).unwrap();
    let conn = ep
        .connect(cluster.master.quic, tls::MASTER_SERVER_NAME)
        .unwrap()
        .await
        .unwrap();
    let (send, recv) = conn.open_bi().await.unwrap();
    (ep, conn, send, recv)
}

/// Waits until the master closes the connection; returns its reason. Panics if it stays open.
async fn expect_closed(conn: &quinn::Connection) -> String {
    match tokio::time::timeout(T, conn.closed()).await {
        Ok(e) => e.to_string(),
        Err(_) => panic!("connection stayed open"),
    }
}

async fn next_msg(
    rx: &mut quic::FrameReceiver,
    pred: impl Fn(&MasterToFramework) -> bool,
) -> MasterToFramework {
    // One deadline for the whole wait: the master's heartbeats must not keep a wait for a
    // message that never comes alive forever.
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let m = tokio::time::timeout_at(deadline, rx.recv::<MasterToFramework>())
            .await
            .expect("timed out")
            .expect("connection failed");
        if pred(&m) {
            return m;
        }
    }
}

/// The next offer with some cpus and mem; others are declined without a filter.
async fn usable_offer(tx: &mut quic::FrameSender, rx: &mut quic::FrameReceiver) -> Offer {
    loop {
        if let MasterToFramework::Offers(offers) =
            next_msg(rx, |m| matches!(m, MasterToFramework::Offers(_))).await
        {
            for o in offers {
                if o.total().milli("cpus") >= 100 && o.total().milli("mem") >= 8000 {
                    return o;
                }
                tx.send(&FrameworkToMaster::Decline {
                    offer_ids: vec![o.id],
                    refuse_seconds: Some(0.0),
                })
                .await
                .unwrap();
            }
        }
    }
}

fn subscribe(name: &str) -> FrameworkToMaster {
    FrameworkToMaster::Subscribe(FrameworkInfo {
        framework_id: None,
        name: name.into(),
        roles: vec!["hostile".into()],
        capabilities: vec![],
        failover_timeout_secs: 0.0,
        min_allocatable: vec![],
        suppressed_roles: Vec::new(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_peers_do_not_disturb_the_cluster() {
    let cluster = Cluster::start(&[("h1", "cpus:8;mem:8192")]).unwrap();
    let m = cluster.master.quic;
    let tls_dir = cluster.tls_dir.clone();
    // An honest framework runs tasks throughout.
    let honest = tokio::spawn(async move {
        run_batch(
            m,
            &tls_dir,
            "honest",
            "good",
            30,
            "cpus:0.5;mem:32",
            "sleep 0.1",
        )
        .await
    });

    // 1. Garbage instead of a hello.
    {
        let (_ep, conn, mut send, recv) =
            raw_stream(&cluster, PeerIdentity::Framework("garbage".into())).await;
        send.write_all(&[0, 0, 0, 5, 0xde, 0xad, 0xbe, 0xef, 0xff])
            .await
            .unwrap();
        drop(recv);
        let reason = expect_closed(&conn).await;
        assert!(
            reason.contains("protocol version")
                || reason.contains("malformed")
                || reason.contains("exceeds"),
            "{reason}"
        );
    }
    // 2. Garbage after a valid hello and subscription.
    {
        let (_ep, conn, mut tx, mut rx) = cluster.raw_framework("garbage2").await;
        tx.send(&subscribe("garbage2")).await.unwrap();
        next_msg(&mut rx, |m| {
            matches!(m, MasterToFramework::Subscribed { .. })
        })
        .await;
        let _ = tx.0.write_all(&[0, 0, 0, 3, 0xff, 0xff, 0xff]).await;
        let reason = expect_closed(&conn).await;
        assert!(reason.contains("malformed"), "{reason}");
    }
    // 3. An oversized frame is refused from its length alone.
    {
        let (_ep, conn, mut tx, _rx) = cluster.raw_framework("huge").await;
        let _ = tx.0.write_all(&u32::MAX.to_be_bytes()).await;
        let reason = expect_closed(&conn).await;
        assert!(reason.contains("exceeds"), "{reason}");
    }
    // 4. Messages out of place: accept before subscribing.
    {
        let (_ep, conn, mut tx, mut rx) = cluster.raw_framework("eager").await;
        tx.send(&FrameworkToMaster::Decline {
            offer_ids: vec![OfferId::random()],
            refuse_seconds: None,
        })
        .await
        .unwrap();
        let m = next_msg(&mut rx, |_| true).await;
        assert!(
            matches!(
                m,
                MasterToFramework::Error {
                    kind: ErrorKind::NotSubscribed,
                    ..
                }
            ),
            "{m:?}"
        );
        let reason = expect_closed(&conn).await;
        assert!(reason.contains("before subscribing"), "{reason}");
    }
    // 5. A framework certificate speaking as an agent is refused.
    {
        let (_ep, conn, send, _recv) =
            raw_stream(&cluster, PeerIdentity::Framework("impostor".into())).await;
        let mut tx = quic::FrameSender(send);
        tx.send(&Hello {
            protocol_version: PROTOCOL_VERSION,
            peer: PeerKind::Agent,
        })
        .await
        .unwrap();
        let reason = expect_closed(&conn).await;
        assert!(reason.contains("does not match certificate"), "{reason}");
    }
    // 6. Double accept of one offer, and an accept asking for more than offered.
    {
        let (_ep, _conn, mut tx, mut rx) = cluster.raw_framework("greedy").await;
        tx.send(&subscribe("greedy")).await.unwrap();
        next_msg(&mut rx, |m| {
            matches!(m, MasterToFramework::Subscribed { .. })
        })
        .await;
        let offer = usable_offer(&mut tx, &mut rx).await;
        let small = TaskInfo {
            task_id: TaskId::random(),
            name: "small".into(),
            command: "true".into(),
            resources: "cpus:0.1;mem:8".parse().unwrap(),
            env: Default::default(),
            kill_grace_secs: None,
            gpu_selector: None,
            container: None,
        };
        tx.send(&FrameworkToMaster::Accept {
            offer_ids: vec![offer.id],
            operations: vec![Operation::Launch {
                tasks: vec![small.clone()],
            }],
            refuse_seconds: Some(0.0),
        })
        .await
        .unwrap();
        let mut again = small.clone();
        again.task_id = TaskId::random();
        tx.send(&FrameworkToMaster::Accept {
            offer_ids: vec![offer.id],
            operations: vec![Operation::Launch { tasks: vec![again] }],
            refuse_seconds: None,
        })
        .await
        .unwrap();
        let e = next_msg(&mut rx, |m| matches!(m, MasterToFramework::Error { .. })).await;
        assert!(
            matches!(
                e,
                MasterToFramework::Error {
                    kind: ErrorKind::UnknownOffer,
                    ..
                }
            ),
            "{e:?}"
        );
        // Ask for more than the agent has (an accept pools every offer the framework holds
        // on the agent — docs/allocator.md, rule 2 — so "more than this offer" could fit).
        tx.send(&FrameworkToMaster::Revive { roles: vec![] })
            .await
            .unwrap();
        let offer = usable_offer(&mut tx, &mut rx).await;
        let mut big = small.clone();
        big.task_id = TaskId::random();
        big.resources = offer.total().plus(&"cpus:8".parse().unwrap());
        tx.send(&FrameworkToMaster::Accept {
            offer_ids: vec![offer.id],
            operations: vec![Operation::Launch {
                tasks: vec![big.clone()],
            }],
            refuse_seconds: Some(0.0),
        })
        .await
        .unwrap();
        let e = next_msg(&mut rx, |m| matches!(m, MasterToFramework::Error { .. })).await;
        assert!(
            matches!(
                e,
                MasterToFramework::Error {
                    kind: ErrorKind::InsufficientResources,
                    ..
                }
            ),
            "{e:?}"
        );
        let u = next_msg(
            &mut rx,
            |m| matches!(m, MasterToFramework::Update(u) if u.task_id == big.task_id),
        )
        .await;
        assert!(
            matches!(u, MasterToFramework::Update(ref u) if u.state == TaskState::Error),
            "{u:?}"
        );
        // Invalid resource values in an accept: a task with no resources is an ERROR too.
        tx.send(&FrameworkToMaster::Teardown).await.unwrap();
    }
    // The honest framework finished everything.
    let progress = tokio::time::timeout(Duration::from_secs(120), honest)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        (progress.finished, progress.failed),
        (30, 0),
        "{:?}",
        progress.errors
    );
    // The master is still healthy.
    assert!(cluster.master.state().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_from_another_ca_is_refused_in_the_handshake() {
    let cluster = Cluster::start(&[]).unwrap();
    let other = TempDir::new("gantry-other-ca").unwrap();
    CertAuthority::generate()
        .unwrap()
        .save(other.path())
        .unwrap();
    // The stranger trusts our master's CA (so only the client side can fail).
    std::fs::copy(
        cluster.tls_dir.join("ca.pem"),
        other.path().join("trusted-ca.pem"),
    )
    .unwrap();
    let stranger = gantry_pki::load_or_issue(
        other.path(),
        &PeerIdentity::Framework("stranger".into()),
        &[],
    )
    .unwrap();
    let cluster_ca = gantry_pki::load_or_issue(
        &cluster.tls_dir,
        &PeerIdentity::Framework("probe".into()),
        &[],
    )
    .unwrap();
    let material = tls::TlsMaterial {
        roots: cluster_ca.roots.clone(),
        identity: stranger.identity,
    };
    let ep = quic::client_endpoint(&material, cluster.master.quic).unwrap();
    // With TLS 1.3 the client may finish its side before the server checks the client
    // certificate: the refusal then arrives as the connection's close reason.
    let err = match ep
        .connect(cluster.master.quic, tls::MASTER_SERVER_NAME)
        .unwrap()
        .await
    {
        Err(e) => e.to_string(),
        Ok(conn) => {
            if let Ok((mut s, _r)) = conn.open_bi().await {
                let _ = s.write_all(&[0, 0, 0, 1, 0]).await;
            }
            tokio::time::timeout(T, conn.closed())
                .await
                .expect("the master must refuse the stranger")
                .to_string()
        }
    };
    assert!(
        err.contains("certificate") || err.contains("crypto") || err.contains("handshake"),
        "{err}"
    );
    // The master still serves clients with proper certificates.
    let (_ep, _conn, mut tx, mut rx) = cluster.raw_framework("proper").await;
    tx.send(&subscribe("proper")).await.unwrap();
    next_msg(&mut rx, |m| {
        matches!(m, MasterToFramework::Subscribed { .. })
    })
    .await;
}
