//! Transport: QUIC (quinn) with mutual TLS 1.3 (rustls, `ring` provider chosen explicitly).
//!
//! - [`tls`]: the cluster CA, certificate issuing, the TLS directory convention, identities.
//! - [`quic`]: endpoints, the hello, and framed message streams.
//! - [`candidates`]: which master to try next (lost masters last, redirects first).
//! - [`backoff`]: capped exponential backoff with jitter for reconnects and retries.

pub mod backoff;
pub mod candidates;
pub mod quic;
pub mod tls;

pub use quic::{FrameReceiver, FrameSender, TransportError};
pub use tls::{PeerIdentity, TlsMaterial};
