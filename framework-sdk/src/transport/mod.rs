//! Transport: QUIC (quinn) with mutual TLS 1.3 (rustls, `ring` provider chosen explicitly).
//!
//! - [`tls`]: the cluster CA, certificate issuing, the TLS directory convention, identities.
//! - [`quic`]: endpoints, the hello, and framed message streams.
//! - [`masters`]: a link to every master; the session with the leader, switched when a standby
//!   announces it was elected.
//! - [`backoff`]: capped exponential backoff with jitter for reconnects and retries.

pub mod backoff;
pub mod masters;
pub mod quic;
pub mod tls;

pub use quic::{FrameReceiver, FrameSender, TransportError};
pub use tls::{PeerIdentity, TlsMaterial};
