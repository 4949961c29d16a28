//! QUIC endpoints and the framed message stream every peer speaks.
//!
//! One connection per peer and master; the client opens one bidirectional stream and sends a
//! [`Hello`], the master answers with its
//! [`MasterRole`], then messages flow in both directions as codec
//! frames.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::QuicClientConfig;
#[cfg(feature = "server")]
use quinn::crypto::rustls::QuicServerConfig;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::tls::{self, PeerIdentity, TlsMaterial};
use crate::framing;
use gantry_proto::codec::{CodecError, MAX_HELLO};
use gantry_proto::{Hello, MasterRole, PeerKind, PROTOCOL_VERSION};

/// Errors opening or using a QUIC connection.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error(transparent)]
    /// The TLS material could not be loaded or configured.
    Tls(#[from] tls::TlsError),
    #[error("QUIC configuration: {0}")]
    /// A QUIC configuration was refused.
    Config(String),
    #[error("i/o: {0}")]
    /// Binding or using the UDP socket failed.
    Io(#[from] std::io::Error),
    #[error("connect: {0}")]
    /// The connection could not be started.
    Connect(#[from] quinn::ConnectError),
    #[error("connection: {0}")]
    /// The connection failed or was closed.
    Connection(#[from] quinn::ConnectionError),
    #[error(transparent)]
    /// A frame could not be encoded or decoded.
    Codec(#[from] CodecError),
    #[error("protocol violation: {0}")]
    /// The peer broke the protocol (e.g. a bad hello).
    Protocol(String),
    #[error("no handshake with {0} within {1:?}")]
    /// The peer did not answer in time.
    Timeout(SocketAddr, Duration),
}

/// How long [`connect`] waits for the handshake, the stream and the master's role: a master
/// that is gone never answers, and the link retries (with backoff) rather than hang.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How often a peer pings an otherwise quiet connection (agents and frameworks; the master
/// only answers). Leader changes are pushed by the newly elected master
/// ([`MasterRole::Leading`]), so failover does not wait for this.
pub const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// A connection silent for this long is dead: a crashed agent is noticed by the master, a
/// crashed master by its peers (when no election follows, e.g. a standalone master).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(15);

/// Streams the master may have open towards one agent at once (sandbox requests).
pub const SANDBOX_STREAMS: u32 = 40;

fn transport_config(keep_alive: Option<Duration>) -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.keep_alive_interval(keep_alive);
    t.max_idle_timeout(Some(quinn::IdleTimeout::from(quinn::VarInt::from_u32(
        IDLE_TIMEOUT.as_millis() as u32,
    ))));
    t.max_concurrent_bidi_streams(4u32.into());
    t.max_concurrent_uni_streams(0u32.into());
    t
}

#[cfg(feature = "server")]
/// A server endpoint (the master) bound to `addr`, requiring client certificates.
///
/// `reset_key` (at least 32 bytes, kept across restarts: see [`load_or_create_reset_key`])
/// keys QUIC stateless resets. A master restarted on the same address then answers packets of
/// its previous incarnation's connections with a reset the peers accept, so they notice the
/// restart at their next keep-alive instead of after the idle timeout.
pub fn server_endpoint(
    addr: SocketAddr,
    material: &TlsMaterial,
    reset_key: &[u8],
) -> Result<quinn::Endpoint, TransportError> {
    let crypto = QuicServerConfig::try_from(tls::server_config(material)?)
        .map_err(|e| TransportError::Config(e.to_string()))?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    // Peers send the keep-alives: one ping per connection per interval instead of two.
    let mut transport = transport_config(None);
    // What one connection can make the master buffer before it reads: a bounded window for
    // all its streams together, and no datagrams (the master never reads any).
    transport.receive_window(quinn::VarInt::from_u32(SERVER_CONNECTION_WINDOW));
    transport.datagram_receive_buffer_size(None);
    cfg.transport_config(Arc::new(transport));
    let socket = std::net::UdpSocket::bind(addr)?;
    // One socket carries every agent's and framework's packets (keep-alives, heartbeats): with
    // thousands of peers the default buffer (~200 KB) overflows in bursts, and the packets
    // dropped there turn into idle timeouts.
    grow_recv_buffer(&socket, SERVER_RECV_BUFFER);
    let runtime = quinn::default_runtime()
        .ok_or_else(|| TransportError::Config("no async runtime for QUIC".into()))?;
    if reset_key.len() < 32 {
        return Err(TransportError::Config(
            "the stateless reset key must have at least 32 bytes".into(),
        ));
    }
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, reset_key);
    // Connection ids carry a keyed hash the endpoint checks before answering a packet of an
    // unknown connection: the key must survive restarts too, or the new incarnation drops the
    // old connections' packets instead of resetting them.
    let cid_key = {
        let tag = ring::hmac::sign(&key, b"gantry connection id key");
        let mut k = [0u8; 8];
        k.copy_from_slice(&tag.as_ref()[..8]);
        u64::from_le_bytes(k)
    };
    let mut endpoint_config = quinn::EndpointConfig::new(Arc::new(key));
    endpoint_config.cid_generator(move || {
        Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
    });
    // Resets are smaller than the packet that caused them (no amplification); after a restart
    // every peer needs one, so do not rate-limit them to one per 20 ms (quinn's default).
    endpoint_config.min_reset_interval(Duration::from_micros(50));
    Ok(quinn::Endpoint::new(
        endpoint_config,
        Some(cfg),
        socket,
        runtime,
    )?)
}

#[cfg(feature = "server")]
/// Reads the stateless-reset key from `path`, creating it (32 random bytes, mode 0600) when
/// missing.
pub fn load_or_create_reset_key(path: &std::path::Path) -> Result<Vec<u8>, TransportError> {
    match std::fs::read(path) {
        Ok(key) if key.len() >= 32 => return Ok(key),
        Ok(_) => {
            return Err(TransportError::Config(format!(
                "{} is shorter than 32 bytes; delete it to create a new key",
                path.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let mut key = vec![0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key)
        .map_err(|_| TransportError::Config("no system randomness".into()))?;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&key)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(key)
}

#[cfg(feature = "server")]
/// Bytes one peer connection may send the master ahead of what it read (all streams together;
/// QUIC flow control holds the rest back). Partial frames beyond it wait in the peer.
pub const SERVER_CONNECTION_WINDOW: u32 = 512 * 1024;

#[cfg(feature = "server")]
/// Receive buffer requested for the master's UDP socket. A burst that outruns the master
/// (10,000 agents' status updates at once) waits here instead of being dropped: dropped
/// datagrams make QUIC back off exponentially, and a connection whose probes back off past the
/// idle timeout dies — agents lost because the master was busy. Only used while backlogged.
pub const SERVER_RECV_BUFFER: usize = 32 << 20;

#[cfg(feature = "server")]
/// Asks for a `want`-byte receive buffer on `socket`. The kernel caps `SO_RCVBUF` at
/// `net.core.rmem_max` (often 208 KiB-4 MiB); a process with `CAP_NET_ADMIN` may pass it
/// (`SO_RCVBUFFORCE`), otherwise a warning names the sysctl to raise. Returns what the kernel
/// granted (Linux reports twice the requested size: its bookkeeping overhead).
pub fn grow_recv_buffer(socket: &std::net::UdpSocket, want: usize) -> usize {
    let sock = socket2::SockRef::from(socket);
    let _ = sock.set_recv_buffer_size(want);
    let granted = || sock.recv_buffer_size().unwrap_or(0);
    #[cfg(target_os = "linux")]
    if granted() < want {
        use std::os::fd::AsRawFd;
        let size = libc::c_int::try_from(want).unwrap_or(libc::c_int::MAX);
        // SAFETY: a plain setsockopt on a socket we own, with a pointer to a c_int that lives
        // for the call and its exact size; failure (no CAP_NET_ADMIN) only returns -1.
        let _ = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    }
    let got = granted();
    if got < want {
        tracing::warn!(
            requested = want,
            granted = got,
            "the QUIC socket's receive buffer is smaller than requested: bursts from many peers \
             may be dropped; raise net.core.rmem_max (sysctl) to at least {want}"
        );
    }
    got
}

/// The QUIC client configuration of an agent or framework: mutual TLS with `material`,
/// keep-alives every [`KEEP_ALIVE`].
pub fn client_config(material: &TlsMaterial) -> Result<quinn::ClientConfig, TransportError> {
    let crypto = QuicClientConfig::try_from(tls::client_config(material)?)
        .map_err(|e| TransportError::Config(e.to_string()))?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
    let mut transport = transport_config(Some(KEEP_ALIVE));
    // The master opens a stream per sandbox request on an agent's connection (logs, files,
    // exec: protocol v9); the agent bounds them itself (`gantry_agent::sandbox_api`).
    transport.max_concurrent_bidi_streams(SANDBOX_STREAMS.into());
    cfg.transport_config(Arc::new(transport));
    Ok(cfg)
}

/// A client endpoint on an ephemeral port of `for_addr`'s address family (no default client
/// configuration: connect with [`connect_with`]).
pub fn bind_client(for_addr: SocketAddr) -> Result<quinn::Endpoint, TransportError> {
    let bind: SocketAddr = if for_addr.is_ipv6() {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    };
    Ok(quinn::Endpoint::client(bind)?)
}

/// A client endpoint (agent or framework) for `for_addr`'s address family whose default client
/// configuration is [`client_config`]`(material)`, for [`connect`].
pub fn client_endpoint(
    material: &TlsMaterial,
    for_addr: SocketAddr,
) -> Result<quinn::Endpoint, TransportError> {
    let mut ep = bind_client(for_addr)?;
    ep.set_default_client_config(client_config(material)?);
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

/// The receiving half of a framed stream, buffered: one stream read takes in as many frames as
/// have arrived (not two reads and an allocation per frame), and [`recv`](Self::recv) is
/// cancel-safe, so it can sit in a `select!` beside other work without a reader task and a
/// channel between the stream and its user: a frame read in part stays in the buffer for the
/// next call. Every frame is bounded by [`MAX_FRAME`](gantry_proto::codec::MAX_FRAME) before
/// its body is waited for.
pub struct FrameReader {
    stream: quinn::RecvStream,
    buf: Vec<u8>,
    /// Unread bytes are `buf[start..end]`.
    start: usize,
    end: usize,
}

/// What one stream read asks for at least (more when a frame needs it).
const READ_CHUNK: usize = 16 * 1024;

impl FrameReader {
    /// Reads frames from `stream`.
    pub fn new(stream: quinn::RecvStream) -> Self {
        Self {
            stream,
            buf: Vec::new(),
            start: 0,
            end: 0,
        }
    }

    /// The next frame: from the buffer when it holds one, else after reading the stream.
    /// Cancel-safe (the only wait is a cancel-safe [`quinn::RecvStream::read`], and what it
    /// read is kept).
    pub async fn recv<T: DeserializeOwned>(&mut self) -> Result<T, CodecError> {
        loop {
            if let Some(msg) = self.try_recv()? {
                return Ok(msg);
            }
            // Bytes still missing for the next whole frame.
            let need = self.next_frame()?.unwrap_or(4) - (self.end - self.start);
            // Room for the rest of the frame (and at least a chunk) after the unread bytes.
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            let want = self.end + need.max(READ_CHUNK);
            if self.buf.len() < want {
                self.buf.resize(want, 0);
            }
            match self.stream.read(&mut self.buf[self.end..]).await {
                Ok(Some(n)) => self.end += n,
                Ok(None) if self.start == self.end => return Err(CodecError::Closed),
                Ok(None) => {
                    return Err(CodecError::Io(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "stream ended inside a frame",
                    )))
                }
                Err(e) => return Err(CodecError::Io(e.into())),
            }
        }
    }

    /// A frame already buffered, without reading the stream (`None`: none whole yet).
    pub fn try_recv<T: DeserializeOwned>(&mut self) -> Result<Option<T>, CodecError> {
        let Some(n) = self.next_frame()? else {
            return Ok(None);
        };
        if self.end - self.start < n {
            return Ok(None);
        }
        let msg = gantry_proto::codec::decode(&self.buf[self.start + 4..self.start + n]);
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            // A large frame's room is not kept once it is read.
            if self.buf.len() > 4 * READ_CHUNK {
                self.buf = Vec::new();
            }
        }
        msg.map(Some)
    }

    /// The next frame's size with its prefix, once the prefix is buffered (checked against
    /// `MAX_FRAME` before any of the body is waited for).
    fn next_frame(&self) -> Result<Option<usize>, CodecError> {
        match self.buf[self.start..self.end].first_chunk::<4>() {
            Some(prefix) => Ok(Some(
                4 + gantry_proto::codec::frame_len(*prefix, gantry_proto::codec::MAX_FRAME)?,
            )),
            None => Ok(None),
        }
    }
}

impl From<FrameReceiver> for FrameReader {
    fn from(r: FrameReceiver) -> Self {
        Self::new(r.0)
    }
}

/// Sending half of a framed stream.
pub struct FrameSender(pub quinn::SendStream);
/// Receiving half of a framed stream.
pub struct FrameReceiver(pub quinn::RecvStream);

impl FrameSender {
    /// Sends `msg` as one frame.
    pub async fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), CodecError> {
        framing::write_frame(&mut self.0, msg).await
    }

    /// Sends `msgs` as consecutive frames in one stream write, so QUIC packs them into as few
    /// packets as fit (a write per message may leave as a packet per message: the connection
    /// task can run between two writes). Nothing is written if one of them can not be encoded
    /// (e.g. [`CodecError::TooLarge`]).
    pub async fn send_all<'a, T: Serialize + 'a>(
        &mut self,
        msgs: impl IntoIterator<Item = &'a T>,
    ) -> Result<(), CodecError> {
        let mut buf = Vec::new();
        for msg in msgs {
            gantry_proto::codec::encode_frame_into(&mut buf, msg)?;
        }
        if !buf.is_empty() {
            self.0
                .write_all(&buf)
                .await
                .map_err(|e| CodecError::Io(e.into()))?;
        }
        Ok(())
    }
}

impl FrameReceiver {
    /// Receives one frame (at most `MAX_FRAME`).
    pub async fn recv<T: DeserializeOwned>(&mut self) -> Result<T, CodecError> {
        framing::read_frame(&mut self.0).await
    }

    /// Receives from an untrusted peer under `limits` (body deadline and a shared budget for
    /// large frame bodies): see [`framing::read_frame_limited`].
    pub async fn recv_limited<T: DeserializeOwned>(
        &mut self,
        limits: &framing::ReadLimits,
    ) -> Result<T, CodecError> {
        framing::read_frame_limited(&mut self.0, limits).await
    }
}

/// Connects to the master at `addr` as `kind` with the endpoint's default client
/// configuration; see [`connect_with`].
pub async fn connect(
    endpoint: &quinn::Endpoint,
    addr: SocketAddr,
    kind: PeerKind,
) -> Result<(quinn::Connection, FrameSender, FrameReceiver, MasterRole), TransportError> {
    let connecting = endpoint.connect(addr, tls::MASTER_SERVER_NAME)?;
    finish_connect(connecting, addr, kind).await
}

/// Connects to the master at `addr` as `kind`: handshake (within [`CONNECT_TIMEOUT`]), open
/// the stream, send the hello and read the master's [`MasterRole`].
pub async fn connect_with(
    endpoint: &quinn::Endpoint,
    config: quinn::ClientConfig,
    addr: SocketAddr,
    kind: PeerKind,
) -> Result<(quinn::Connection, FrameSender, FrameReceiver, MasterRole), TransportError> {
    let connecting = endpoint.connect_with(config, addr, tls::MASTER_SERVER_NAME)?;
    finish_connect(connecting, addr, kind).await
}

async fn finish_connect(
    connecting: quinn::Connecting,
    addr: SocketAddr,
    kind: PeerKind,
) -> Result<(quinn::Connection, FrameSender, FrameReceiver, MasterRole), TransportError> {
    let setup = async {
        let conn = connecting.await?;
        let hello = async {
            let (send, recv) = conn.open_bi().await?;
            let (mut tx, mut rx) = (FrameSender(send), FrameReceiver(recv));
            tx.send(&Hello {
                protocol_version: PROTOCOL_VERSION,
                peer: kind,
            })
            .await?;
            let role: MasterRole = rx.recv().await?;
            Ok::<_, TransportError>((tx, rx, role))
        };
        match hello.await {
            Ok((tx, rx, role)) => Ok((conn, tx, rx, role)),
            // Closed by the master (e.g. past a connection limit): its reason says why.
            Err(e) => Err(conn.close_reason().map_or(e, TransportError::Connection)),
        }
    };
    tokio::time::timeout(CONNECT_TIMEOUT, setup)
        .await
        .map_err(|_| TransportError::Timeout(addr, CONNECT_TIMEOUT))?
}

/// Server side: accept the peer's stream and check its hello. Returns the peer kind.
pub async fn accept_stream(
    conn: &quinn::Connection,
) -> Result<(PeerKind, FrameSender, FrameReceiver), TransportError> {
    let (send, recv) = conn.accept_bi().await?;
    let mut rx = FrameReceiver(recv);
    // A hello is a few bytes: never hold a large claimed frame for it.
    let hello: Hello = framing::read_frame_max(&mut rx.0, MAX_HELLO).await?;
    if hello.protocol_version != PROTOCOL_VERSION {
        return Err(TransportError::Protocol(format!(
            "protocol version {} is not supported (this master speaks {PROTOCOL_VERSION})",
            hello.protocol_version
        )));
    }
    Ok((hello.peer, FrameSender(send), rx))
}
