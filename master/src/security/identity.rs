//! Who a peer is (PURE): the decisions the QUIC accept path and the operator port make about a
//! certificate identity, a bearer token or a dashboard session, and what the principal they
//! yield may then do on the operator API.
//!
//! - QUIC peers (agents and frameworks): the identity is the client certificate's common name
//!   (`agent:NAME`, `framework:PRINCIPAL`; `gantry_transport::quic::peer_identity`), and the
//!   hello's peer kind must match it ([`peer_principal`]). Messages never name their sender.
//! - Operator API callers ([`operator_caller`]): a bearer token (verified against
//!   `--operator-tokens` by the shell, under its failed-authentication limit) wins; else an
//!   `operator:NAME` client certificate; else, on reads only, a dashboard session
//!   ([`super::Sessions`]). Anyone else is anonymous, with the reason kept for the 401.
//! - What a caller may do: [`may_read`] (any operator, anyone with `--public-reads`) and
//!   [`may_write`] (the `operator` ACL, [`Acls::may_operate`]).

use gantry_proto::PeerKind;
use gantry_transport::PeerIdentity;

use super::acl::{Acls, OperatorAction};

/// The principal a QUIC peer is served as, once its hello matched its certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerPrincipal {
    /// An agent, by the name in its certificate.
    Agent(String),
    /// A framework, by its principal.
    Framework(String),
}

/// A hello whose peer kind is not what the certificate says the peer is (the text is the close
/// reason the peer sees).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("peer kind does not match certificate")]
pub struct KindMismatch;

/// The principal a QUIC peer that said hello as `kind` with certificate `identity` is served
/// as: an agent certificate may only speak as an agent, a framework certificate only as a
/// framework; master and operator certificates are never served on the peer port.
pub fn peer_principal(
    kind: PeerKind,
    identity: &PeerIdentity,
) -> Result<PeerPrincipal, KindMismatch> {
    match (kind, identity) {
        (PeerKind::Agent, PeerIdentity::Agent(name)) => Ok(PeerPrincipal::Agent(name.clone())),
        (PeerKind::Framework, PeerIdentity::Framework(p)) => {
            Ok(PeerPrincipal::Framework(p.clone()))
        }
        _ => Err(KindMismatch),
    }
}

/// The key the shell counts a peer's open connections under
/// ([`super::Limits::connections_per_principal`]): its certificate's common name.
pub fn connection_key(identity: &PeerIdentity) -> String {
    identity.to_string()
}

/// The authenticated caller of one operator API request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// An operator, and how it authenticated (`token`, `certificate`, `session`).
    Operator { name: String, how: &'static str },
    /// Nobody known, and why (the text of a 401).
    Anonymous { why: String },
}

impl Caller {
    /// The caller of a request that carried no credential the middleware saw.
    pub fn nobody() -> Self {
        Caller::Anonymous {
            why: NO_CREDENTIAL.into(),
        }
    }
}

const NO_CREDENTIAL: &str = "no operator certificate or bearer token";

/// The text of an `Authorization` header that is not visible ASCII.
pub const MALFORMED_AUTHORIZATION: &str = "malformed Authorization header";

/// The token of an `Authorization: Bearer TOKEN` header (the scheme in any case, the token
/// trimmed), or why the header is refused.
pub fn bearer_token(header: &str) -> Result<&str, &'static str> {
    let (scheme, token) = header.split_once(' ').unwrap_or((header, ""));
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err("Authorization must be \"Bearer TOKEN\"");
    }
    Ok(token.trim())
}

/// Who calls, when the request carried no bearer token: the operator of an `operator:NAME`
/// certificate, else the operator of a live dashboard session (`session` looks the cookie up;
/// `None` when the request may not use one), else anonymous with the reason.
pub fn operator_caller(
    certificate: Option<PeerIdentity>,
    session: Option<impl FnOnce() -> Option<String>>,
) -> Caller {
    match (certificate, session) {
        (Some(PeerIdentity::Operator(name)), _) => Caller::Operator {
            name,
            how: "certificate",
        },
        // A session id is 256 random bits: an unknown one is not counted as a guess (a
        // browser keeps sending an expired one), it is simply not logged in.
        (_, Some(lookup)) => match lookup() {
            Some(name) => Caller::Operator {
                name,
                how: "session",
            },
            None => Caller::Anonymous {
                why: "the dashboard session ended (logged out or expired); log in again".into(),
            },
        },
        (Some(other), None) => Caller::Anonymous {
            why: format!("{other} is not an operator certificate (operator:NAME)"),
        },
        (None, None) => Caller::nobody(),
    }
}

/// Why a caller may not read or write (the shell answers 401 or 403 with the text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// No operator: 401.
    #[error("authentication required: {0}")]
    Unauthenticated(String),
    /// An operator the `operator` ACL does not grant the action: 403.
    #[error("operator {name} may not {action}")]
    Forbidden { name: String, action: &'static str },
}

/// Whether `caller` may read the operator API (`public_reads`: `--public-reads`).
pub fn may_read(caller: &Caller, public_reads: bool) -> Result<(), Denied> {
    match caller {
        Caller::Operator { .. } => Ok(()),
        Caller::Anonymous { .. } if public_reads => Ok(()),
        Caller::Anonymous { why } => Err(Denied::Unauthenticated(why.clone())),
    }
}

/// The operator that may perform `action`, or why not.
pub fn may_write(acls: &Acls, caller: &Caller, action: OperatorAction) -> Result<String, Denied> {
    match caller {
        Caller::Anonymous { why } => Err(Denied::Unauthenticated(why.clone())),
        Caller::Operator { name, .. } if acls.may_operate(name, action) => Ok(name.clone()),
        Caller::Operator { name, .. } => Err(Denied::Forbidden {
            name: name.clone(),
            action: action.name(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_speaks_only_as_what_its_certificate_says() {
        let agent = PeerIdentity::Agent("a1".into());
        let fw = PeerIdentity::Framework("analytics".into());
        assert_eq!(
            peer_principal(PeerKind::Agent, &agent),
            Ok(PeerPrincipal::Agent("a1".into()))
        );
        assert_eq!(
            peer_principal(PeerKind::Framework, &fw),
            Ok(PeerPrincipal::Framework("analytics".into()))
        );
        assert_eq!(
            peer_principal(PeerKind::Framework, &agent),
            Err(KindMismatch)
        );
        assert_eq!(peer_principal(PeerKind::Agent, &fw), Err(KindMismatch));
        for other in [
            PeerIdentity::Master,
            PeerIdentity::Operator("o".into()),
            PeerIdentity::User("u".into()),
            PeerIdentity::Service("s".into()),
        ] {
            assert_eq!(peer_principal(PeerKind::Agent, &other), Err(KindMismatch));
            assert_eq!(
                peer_principal(PeerKind::Framework, &other),
                Err(KindMismatch)
            );
        }
        assert_eq!(connection_key(&fw), "framework:analytics");
    }

    #[test]
    fn a_certificate_wins_over_a_session_and_others_are_anonymous() {
        let no_session: Option<fn() -> Option<String>> = None;
        let cert = Some(PeerIdentity::Operator("ops".into()));
        let caller = operator_caller(cert.clone(), Some(|| -> Option<String> { panic!() }));
        assert_eq!(
            caller,
            Caller::Operator {
                name: "ops".into(),
                how: "certificate"
            }
        );
        assert_eq!(
            operator_caller(None, Some(|| Some("dash".to_string()))),
            Caller::Operator {
                name: "dash".into(),
                how: "session"
            }
        );
        assert!(matches!(
            operator_caller(None, Some(|| None)),
            Caller::Anonymous { why } if why.contains("session ended")
        ));
        // A user certificate (for services like the queue) gives no rights on the master.
        for other in [
            PeerIdentity::Framework("f".into()),
            PeerIdentity::User("ops".into()),
        ] {
            assert!(matches!(
                operator_caller(Some(other), no_session),
                Caller::Anonymous { why } if why.contains("not an operator certificate")
            ));
        }
        assert_eq!(operator_caller(None, no_session), Caller::nobody());
    }

    #[test]
    fn reads_and_writes() {
        let ops = Caller::Operator {
            name: "ops".into(),
            how: "token",
        };
        let acls = Acls::from_toml(
            r#"
[[operator]]
principals = ["ops"]
actions = ["drain"]
"#,
        )
        .unwrap();
        assert_eq!(may_read(&ops, false), Ok(()));
        assert_eq!(may_read(&Caller::nobody(), true), Ok(()));
        assert_eq!(
            may_read(&Caller::nobody(), false).unwrap_err().to_string(),
            "authentication required: no operator certificate or bearer token"
        );
        assert_eq!(
            may_write(&acls, &ops, OperatorAction::Drain),
            Ok("ops".into())
        );
        assert_eq!(
            may_write(&acls, &ops, OperatorAction::SetWeight)
                .unwrap_err()
                .to_string(),
            format!("operator ops may not {}", OperatorAction::SetWeight.name())
        );
        assert!(matches!(
            may_write(&acls, &Caller::nobody(), OperatorAction::Drain),
            Err(Denied::Unauthenticated(_))
        ));
    }

    #[test]
    fn bearer_headers_are_read_strictly() {
        assert_eq!(bearer_token("Bearer abc"), Ok("abc"));
        assert_eq!(bearer_token("bearer  abc "), Ok("abc"));
        assert!(bearer_token("Basic abc").is_err());
        assert!(bearer_token("Bearer ").is_err());
        assert!(bearer_token("Bearer").is_err());
    }
}
