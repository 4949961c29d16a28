//! Scripted masters over real QUIC on loopback: each answers the hello with a sequence of
//! roles, so the links' rules can be checked without a cluster.

use std::net::SocketAddr;
use std::time::Duration;

use gantry_proto::{Hello, MasterRole, PeerKind};
use gantry_transport::masters::{Masters, MastersConfig};
use gantry_transport::tls::PeerIdentity;
use gantry_transport::{quic, FrameReceiver, FrameSender};

mod tls {
    pub use gantry_pki::{ensure_ca, load_or_issue};
}

struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A master that answers every connection with `first`, then (after `delay`) with `then`.
fn scripted(
    dir: &std::path::Path,
    first: MasterRole,
    then: Option<(Duration, MasterRole)>,
) -> SocketAddr {
    let material = tls::load_or_issue(dir, &PeerIdentity::Master, &[]).expect("master tls");
    let ep = quic::server_endpoint("127.0.0.1:0".parse().expect("addr"), &material, &[7; 32])
        .expect("endpoint");
    let addr = ep.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Some(incoming) = ep.accept().await {
            let (first, then) = (first.clone(), then.clone());
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                let Ok((mut tx, mut rx)) = conn
                    .accept_bi()
                    .await
                    .map(|(s, r)| (FrameSender(s), FrameReceiver(r)))
                else {
                    return;
                };
                let _hello: Hello = rx.recv().await.expect("hello");
                tx.send(&first).await.expect("role");
                if let Some((delay, role)) = then {
                    tokio::time::sleep(delay).await;
                    tx.send(&role).await.expect("role");
                }
                conn.closed().await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn follows_the_leader_switches_on_election_and_ignores_deposed_masters() {
    let dir = Dir(std::env::temp_dir().join(format!("gantry-masters-{}", uuid::Uuid::new_v4())));
    std::fs::create_dir_all(&dir.0).expect("dir");
    tls::ensure_ca(&dir.0).expect("ca");
    let leader = scripted(&dir.0, MasterRole::Leading { epoch: 3 }, None);
    let deposed = scripted(
        &dir.0,
        MasterRole::Standby { leader: None },
        Some((Duration::from_millis(300), MasterRole::Leading { epoch: 2 })),
    );
    let elected = scripted(
        &dir.0,
        MasterRole::Standby {
            leader: Some(leader.to_string()),
        },
        Some((Duration::from_millis(800), MasterRole::Leading { epoch: 4 })),
    );
    let material =
        tls::load_or_issue(&dir.0, &PeerIdentity::Agent("a1".into()), &[]).expect("agent tls");
    let config = MastersConfig::new(
        vec![deposed.to_string(), elected.to_string(), leader.to_string()],
        PeerKind::Agent,
        quic::client_config(&material).expect("client"),
    );
    let mut masters = Masters::start(config).expect("start");
    let t = Duration::from_secs(10);
    let first = tokio::time::timeout(t, masters.next_session())
        .await
        .expect("a leader");
    assert_eq!((first.addr, first.epoch), (leader, 3));
    // The deposed master's Leading { epoch: 2 } is ignored; the standby's election is not.
    tokio::time::timeout(t, masters.newer_leader())
        .await
        .expect("the newly elected master");
    let next = masters.next_session().await;
    assert_eq!((next.addr, next.epoch), (elected, 4));
    // Losing that session does not take the peer back to an older leader, even when the
    // old one answers again.
    first.conn.close(0u32.into(), b"superseded");
    next.conn.close(0u32.into(), b"lost");
    let again = tokio::time::timeout(t, masters.next_session())
        .await
        .expect("the elected master again");
    assert_eq!((again.addr, again.epoch), (elected, 4));
    masters.shutdown().await;
}

#[test]
fn no_masters_is_an_error() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        let material = {
            let dir = std::env::temp_dir().join(format!("gantry-masters-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&dir).expect("dir");
            tls::ensure_ca(&dir).expect("ca");
            let m = tls::load_or_issue(&dir, &PeerIdentity::Agent("a".into()), &[]).expect("tls");
            let _ = std::fs::remove_dir_all(&dir);
            m
        };
        let config = MastersConfig::new(
            vec![],
            PeerKind::Agent,
            quic::client_config(&material).expect("client"),
        );
        assert!(Masters::start(config).is_err());
    });
}
