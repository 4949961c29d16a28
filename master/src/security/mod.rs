//! Security: who a peer is, and what it may do and hold. The threat model, the identities and
//! the defaults are in docs/security.md ("Where each control lives" maps each control to its
//! place here).
//!
//! PURE: every module here answers questions about names, certificates' identities, tokens and
//! counts, given what it is asked with (and, for sessions, the time); none touches a socket
//! and none depends on the state machine. The core ([`crate::state`]) and the I/O shell
//! ([`crate::server`]) call it; it calls neither.
//!
//! Module map:
//! - [`identity`]: who a peer is: the principal a QUIC peer is served as (its certificate and
//!   its hello must agree), the caller of an operator API request (bearer token, `operator:`
//!   certificate, dashboard session), and whether that caller may read or perform a write
//!   action;
//! - [`acl`]: the access-control lists (`--acls`): which principals may subscribe with which
//!   roles, run tasks as which users, and perform which operator actions (deny by default once
//!   given; everything allowed in dev mode);
//! - [`tokens`]: operator bearer tokens (`--operator-tokens`): stored as SHA-256, compared in
//!   constant time, reloaded on SIGHUP ([`SharedTokens`]);
//! - [`sessions`]: dashboard sessions (random ids, CSRF tokens, lifetimes) standing for the
//!   operator whose token logged in;
//! - [`limits`]: per-principal limits ([`Limits`]: frameworks per principal, roles per
//!   framework, role name length and depth, connections per identity and per address), the
//!   operator port's numbers ([`HttpLimits`], [`AuthLimits`]) and name validation (roles,
//!   Unix users);
//! - [`run_as`]: the run-as policy: which user a task runs as (its own or the agent's default)
//!   and whether its principal may (`run_tasks` ACL).
//!
//! Enforced elsewhere, with the numbers or decisions from here: the connection counts
//! (`server::conn_limits`, from [`Limits`]); the operator port's connection slots, deadlines,
//! event-stream caps and failed-authentication limiter (`server::http_guard` and
//! `server::http`, from [`HttpLimits`] and [`AuthLimits`]); the bounds on what a registration
//! may carry (`gantry_proto::register_limits`, checked by the core); certificate checking and
//! the identity in a certificate (`gantry_transport::tls`).

pub mod acl;
pub mod identity;
pub mod limits;
pub mod run_as;
pub mod sessions;
pub mod tokens;

pub use acl::{AclError, Acls, OperatorAction};
pub use identity::{Caller, Denied, PeerPrincipal};
pub use limits::{valid_role, valid_user, AuthLimits, Exceeded, HttpLimits, Limits, RoleRejection};
pub use run_as::RunAsRejection;
pub use sessions::Sessions;
pub use tokens::{OperatorTokens, SharedTokens};
