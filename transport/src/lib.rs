//! # gantry-transport
//!
//! QUIC (quinn) with mutual TLS 1.3 (rustls, `ring` provider chosen explicitly), on top of
//! [`gantry_proto`]'s messages and codec. Agents, frameworks (through `gantry-sdk`) and the
//! master connect with it. The master's server side (the QUIC server endpoint, its stateless
//! reset key, the rustls server configurations) is behind the `server` feature, so framework
//! authors do not compile it; creating the CA and issuing certificates is `gantry-pki`'s.
//!
//! - [`tls`]: the TLS directory convention, loading identities, peer identities from
//!   certificates, rustls configurations.
//! - [`quic`]: endpoints, the hello, and framed message streams (`FrameReader`: buffered and
//!   cancel-safe, read in a `select!` without a reader task).
//! - [`framing`]: reading and writing codec frames on async streams, with the body deadline
//!   and shared budget for untrusted peers.
//! - [`masters`]: a link to every master; the session with the leader, switched when a standby
//!   announces it was elected.
//! - [`backoff`]: capped exponential backoff with jitter for reconnects and retries.

#![warn(missing_docs)]

pub mod backoff;
pub mod framing;
pub mod masters;
pub mod quic;
pub mod tls;

pub use quic::{FrameReader, FrameReceiver, FrameSender, TransportError};
pub use tls::{PeerIdentity, TlsMaterial};
