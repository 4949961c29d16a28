//! A scripted master for the driver's tests: a dev TLS directory with a CA, the master's and a
//! framework's certificates, and a QUIC server endpoint on loopback.

use gantry_sdk::transport::quic;
use gantry_sdk::transport::tls::PeerIdentity;

/// A temporary directory, removed when dropped.
pub struct Dir(pub std::path::PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A scripted master's endpoint and the TLS directory the framework `fw` connects with.
pub fn scripted_master(prefix: &str) -> (Dir, quinn::Endpoint, std::net::SocketAddr) {
    let dir = Dir(std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4())));
    std::fs::create_dir_all(&dir.0).expect("dir");
    gantry_pki::ensure_ca(&dir.0).expect("ca");
    let master = gantry_pki::load_or_issue(&dir.0, &PeerIdentity::Master, &[]).expect("tls");
    gantry_pki::load_or_issue(&dir.0, &PeerIdentity::Framework("fw".into()), &[]).expect("tls");
    let ep = quic::server_endpoint("127.0.0.1:0".parse().expect("addr"), &master, &[7; 32])
        .expect("endpoint");
    let addr = ep.local_addr().expect("addr");
    (dir, ep, addr)
}

/// Accepts the driver's next connection as the leading master: reads its subscription and
/// answers `Subscribed` with `framework_id`.
pub async fn accept_subscription(
    ep: &quinn::Endpoint,
    framework_id: gantry_sdk::protocol::FrameworkId,
) -> (
    quinn::Connection,
    quic::FrameSender,
    quic::FrameReceiver,
    gantry_sdk::protocol::FrameworkInfo,
) {
    use gantry_sdk::protocol::*;
    let conn = ep.accept().await.expect("incoming").await.expect("conn");
    let (_, mut tx, mut rx) = quic::accept_stream(&conn).await.expect("hello");
    tx.send(&MasterRole::Leading { epoch: 1 })
        .await
        .expect("role");
    let FrameworkToMaster::Subscribe(info) = rx.recv().await.expect("subscribe") else {
        panic!("not a subscribe");
    };
    let subscribed = MasterToFramework::Subscribed {
        framework_id,
        epoch: 1,
        heartbeat_interval_ms: 60_000,
    };
    tx.send(&subscribed).await.expect("subscribed");
    (conn, tx, rx, info)
}
