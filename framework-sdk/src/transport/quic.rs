//! QUIC endpoints and the framed message stream every peer speaks.
//!
//! One connection per peer; the client opens one bidirectional stream, sends a
//! [`Hello`](crate::protocol::Hello) and then messages flow in both directions as codec frames.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::tls::{self, PeerIdentity, TlsMaterial};
use crate::protocol::codec::{self, CodecError};
use crate::protocol::{Hello, PeerKind, PROTOCOL_VERSION};

/// Errors opening or using a QUIC connection.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("QUIC configuration: {0}")]
    Config(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("connect: {0}")]
    Connect(#[from] quinn::ConnectError),
    #[error("connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("protocol violation: {0}")]
    Protocol(String),
}

/// Keep-alives every second; a silent peer is dropped after 5 s (fast failover detection).
fn transport_config() -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.keep_alive_interval(Some(Duration::from_secs(1)));
    t.max_idle_timeout(Some(quinn::IdleTimeout::from(quinn::VarInt::from_u32(5_000))));
    t.max_concurrent_bidi_streams(4u32.into());
    t.max_concurrent_uni_streams(0u32.into());
    Arc::new(t)
}

/// A server endpoint (the master) bound to `addr`, requiring client certificates.
pub fn server_endpoint(
    addr: SocketAddr,
    material: &TlsMaterial,
) -> Result<quinn::Endpoint, TransportError> {
    let crypto = QuicServerConfig::try_from(tls::server_config(material)?)
        .map_err(|e| TransportError::Config(e.to_string()))?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    cfg.transport_config(transport_config());
    Ok(quinn::Endpoint::server(cfg, addr)?)
}

/// A client endpoint (agent or framework) on an ephemeral port of the right address family.
pub fn client_endpoint(
    material: &TlsMaterial,
    for_addr: SocketAddr,
) -> Result<quinn::Endpoint, TransportError> {
    let crypto = QuicClientConfig::try_from(tls::client_config(material)?)
        .map_err(|e| TransportError::Config(e.to_string()))?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
    cfg.transport_config(transport_config());
    let bind: SocketAddr = if for_addr.is_ipv6() {
        "[::]:0".parse().expect("literal")
    } else {
        "0.0.0.0:0".parse().expect("literal")
    };
    let mut ep = quinn::Endpoint::client(bind)?;
    ep.set_default_client_config(cfg);
    Ok(ep)
}

/// The identity in a connected peer's certificate (verified against the CA by rustls).
pub fn peer_identity(conn: &quinn::Connection) -> Option<PeerIdentity> {
    let any = conn.peer_identity()?;
    let certs = any
        .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
        .ok()?;
    tls::identity_from_cert(certs.first()?)
}

/// Sending half of a framed stream.
pub struct FrameSender(pub quinn::SendStream);
/// Receiving half of a framed stream.
pub struct FrameReceiver(pub quinn::RecvStream);

impl FrameSender {
    pub async fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), CodecError> {
        codec::write_frame(&mut self.0, msg).await
    }
}

impl FrameReceiver {
    pub async fn recv<T: DeserializeOwned>(&mut self) -> Result<T, CodecError> {
        codec::read_frame(&mut self.0).await
    }
}

/// Connects to the master at `addr` as `kind`: handshake, open the stream, send the hello.
pub async fn connect(
    endpoint: &quinn::Endpoint,
    addr: SocketAddr,
    kind: PeerKind,
) -> Result<(quinn::Connection, FrameSender, FrameReceiver), TransportError> {
    let conn = endpoint.connect(addr, tls::MASTER_SERVER_NAME)?.await?;
    let (send, recv) = conn.open_bi().await?;
    let mut tx = FrameSender(send);
    tx.send(&Hello {
        protocol_version: PROTOCOL_VERSION,
        peer: kind,
    })
    .await?;
    Ok((conn, tx, FrameReceiver(recv)))
}

/// Server side: accept the peer's stream and check its hello. Returns the peer kind.
pub async fn accept_stream(
    conn: &quinn::Connection,
) -> Result<(PeerKind, FrameSender, FrameReceiver), TransportError> {
    let (send, recv) = conn.accept_bi().await?;
    let mut rx = FrameReceiver(recv);
    let hello: Hello = rx.recv().await?;
    if hello.protocol_version != PROTOCOL_VERSION {
        return Err(TransportError::Protocol(format!(
            "protocol version {} is not supported (this master speaks {PROTOCOL_VERSION})",
            hello.protocol_version
        )));
    }
    Ok((hello.peer, FrameSender(send), rx))
}
