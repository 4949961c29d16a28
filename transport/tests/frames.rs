//! `FrameSender::send_all` over real QUIC on loopback: a batch arrives as its frames, in
//! order, and a batch with a message over the frame limit writes nothing.

use gantry_proto::codec::{CodecError, MAX_FRAME};
use gantry_proto::{MasterRole, PeerKind};
use gantry_transport::quic;
use gantry_transport::tls::PeerIdentity;

struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn a_batch_arrives_as_its_frames_and_an_oversized_one_writes_nothing() {
    let dir = Dir(std::env::temp_dir().join(format!("gantry-frames-{}", uuid::Uuid::new_v4())));
    std::fs::create_dir_all(&dir.0).expect("dir");
    gantry_pki::ensure_ca(&dir.0).expect("ca");
    let material =
        gantry_pki::load_or_issue(&dir.0, &PeerIdentity::Master, &[]).expect("master tls");
    let ep = quic::server_endpoint("127.0.0.1:0".parse().expect("addr"), &material, &[7; 32])
        .expect("endpoint");
    let addr = ep.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        let conn = ep.accept().await.expect("incoming").await.expect("conn");
        let (_, mut tx, mut rx) = quic::accept_stream(&conn).await.expect("hello");
        tx.send(&MasterRole::Leading { epoch: 1 })
            .await
            .expect("role");
        let mut got: Vec<String> = Vec::new();
        loop {
            match rx.recv::<String>().await {
                Ok(s) => got.push(s),
                Err(CodecError::Closed) => break,
                Err(e) => panic!("read: {e}"),
            }
        }
        got
    });
    let client_tls =
        gantry_pki::load_or_issue(&dir.0, &PeerIdentity::Agent("a1".into()), &[]).expect("tls");
    let client = quic::bind_client(addr).expect("client endpoint");
    let (conn, mut tx, _rx, role) = quic::connect_with(
        &client,
        quic::client_config(&client_tls).expect("client config"),
        addr,
        PeerKind::Agent,
    )
    .await
    .expect("connect");
    assert_eq!(role, MasterRole::Leading { epoch: 1 });

    let batch: Vec<String> = (0..500).map(|i| format!("message {i}")).collect();
    tx.send_all(&batch).await.expect("batch");
    let oversized = vec!["kept out".to_string(), "x".repeat(MAX_FRAME + 1)];
    assert!(matches!(
        tx.send_all(&oversized).await,
        Err(CodecError::TooLarge(_))
    ));
    tx.send_all(&["last".to_string()]).await.expect("after");
    tx.send_all(&Vec::<String>::new()).await.expect("empty");
    tx.0.finish().expect("finish");

    let got = server.await.expect("server");
    let mut want = batch;
    want.push("last".into());
    assert_eq!(got, want);
    conn.close(0u32.into(), b"done");
}
