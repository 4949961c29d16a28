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

/// A master endpoint on a loopback port with a fresh dev CA in a temporary directory.
fn master_endpoint(prefix: &str) -> (Dir, quinn::Endpoint, std::net::SocketAddr) {
    let dir = Dir(std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4())));
    std::fs::create_dir_all(&dir.0).expect("dir");
    gantry_pki::ensure_ca(&dir.0).expect("ca");
    let material =
        gantry_pki::load_or_issue(&dir.0, &PeerIdentity::Master, &[]).expect("master tls");
    let ep = quic::server_endpoint("127.0.0.1:0".parse().expect("addr"), &material, &[7; 32])
        .expect("endpoint");
    let addr = ep.local_addr().expect("addr");
    (dir, ep, addr)
}

/// Connects to it as agent `a1`: the connection, its sending half and the master's role.
async fn connect_agent(
    dir: &Dir,
    addr: std::net::SocketAddr,
) -> (quinn::Connection, quic::FrameSender, MasterRole) {
    let client_tls =
        gantry_pki::load_or_issue(&dir.0, &PeerIdentity::Agent("a1".into()), &[]).expect("tls");
    let client = quic::bind_client(addr).expect("client endpoint");
    let (conn, tx, _rx, role) = quic::connect_with(
        &client,
        quic::client_config(&client_tls).expect("client config"),
        addr,
        PeerKind::Agent,
    )
    .await
    .expect("connect");
    (conn, tx, role)
}

#[tokio::test]
async fn a_batch_arrives_as_its_frames_and_an_oversized_one_writes_nothing() {
    let (dir, ep, addr) = master_endpoint("gantry-frames");
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
    let (conn, mut tx, role) = connect_agent(&dir, addr).await;
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

/// `FrameReader` over real QUIC: frames written a few bytes at a time, a large one among them,
/// arrive whole and in order although every `recv` in between is cancelled by a timer (a
/// partly read frame is kept); a length prefix over `MAX_FRAME` is refused before its body.
#[tokio::test]
async fn a_frame_reader_keeps_partial_frames_across_cancelled_reads_and_refuses_oversized_ones() {
    let (dir, ep, addr) = master_endpoint("gantry-reader");
    let server = tokio::spawn(async move {
        let conn = ep.accept().await.expect("incoming").await.expect("conn");
        let (_, mut tx, rx) = quic::accept_stream(&conn).await.expect("hello");
        tx.send(&MasterRole::Leading { epoch: 1 })
            .await
            .expect("role");
        let mut rx = gantry_transport::FrameReader::from(rx);
        let mut got: Vec<String> = Vec::new();
        let mut cancelled = 0;
        let end = loop {
            tokio::select! {
                msg = rx.recv::<String>() => match msg {
                    Ok(s) => got.push(s),
                    Err(e) => break e,
                },
                _ = tokio::time::sleep(std::time::Duration::from_millis(1)) => cancelled += 1,
            }
        };
        (got, cancelled, end)
    });
    let (conn, mut tx, _) = connect_agent(&dir, addr).await;

    let want: Vec<String> = (0..20)
        .map(|i| format!("message {i}"))
        .chain(["y".repeat(300_000), "after the large one".into()])
        .collect();
    let mut bytes = Vec::new();
    for m in &want {
        gantry_proto::codec::encode_frame_into(&mut bytes, m).expect("encode");
    }
    // A few bytes, then a pause long enough for the reader's timer to cancel it mid-frame.
    for (i, piece) in bytes.chunks(7).enumerate() {
        tx.0.write_all(piece).await.expect("write");
        if i % 5 == 0 && i < 200 {
            tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        }
    }
    // Then a prefix announcing a frame over the limit.
    let over = u32::try_from(MAX_FRAME + 1).expect("fits");
    tx.0.write_all(&over.to_be_bytes()).await.expect("write");

    let (got, cancelled, end) = server.await.expect("server");
    assert_eq!(got, want);
    assert!(
        cancelled > 10,
        "reads were cancelled mid-frame ({cancelled})"
    );
    assert!(
        matches!(end, CodecError::TooLarge(n) if n == MAX_FRAME + 1),
        "{end:?}"
    );
    conn.close(0u32.into(), b"done");
}
