//! The start of every stream: the peer's [`Hello`] and the master's [`MasterRole`].

use super::*;

/// The first frame on every stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// The sender's [`PROTOCOL_VERSION`].
    pub protocol_version: u32,
    /// Whether an agent or a framework is connecting.
    pub peer: PeerKind,
}

/// The master's answer to a [`Hello`] and, on a standby's open stream, news of an election.
///
/// A peer keeps a stream open to every master: the leader's carries its session, the
/// standbys' wait. When a standby is elected it sends `Leading` on every waiting stream, so
/// peers re-register over connections that already exist (no handshake herd after a failover,
/// and no waiting for the dead leader's connection to time out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MasterRole {
    /// This master leads, in term `epoch`: register / subscribe on this stream now.
    Leading {
        /// The leader's term.
        epoch: u64,
    },
    /// A standby. `leader` is the leading master's advertised address, if known. The stream
    /// stays open; `Leading` follows if this master is elected, `Standby` again when the leader
    /// it knows changes.
    Standby {
        /// The leader's advertised address, if this standby knows it.
        leader: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
/// Who opens a stream to the master.
pub enum PeerKind {
    /// An agent (a host offering resources and running tasks).
    Agent,
    /// A framework (a scheduler accepting offers and launching tasks).
    Framework,
}
