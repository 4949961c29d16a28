//! Per-principal limits and name validation (PURE): what one tenant may make the master hold,
//! and which role and user names are well formed. The core ([`crate::state`]) asks; the I/O
//! shell enforces the connection bounds (`server::conn_limits`) and the operator port's
//! ([`HttpLimits`], [`AuthLimits`]: `server::http_guard`) with the numbers kept here.

use std::time::Duration;

/// Bounds on what one tenant may make the master hold (docs/security.md lists the defaults and
/// the `gantry-master` flags). The connection limits are enforced by the I/O shell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Frameworks one principal may have registered at once (connected or failing over).
    pub frameworks_per_principal: usize,
    /// Distinct roles one framework may subscribe to (over its subscription and failovers).
    pub roles_per_framework: usize,
    /// Longest role name, in bytes (at most 128, the syntax limit).
    pub role_name_length: usize,
    /// Most `/`-separated levels in a role name.
    pub role_depth: usize,
    /// Open connections per certificate identity (`agent:NAME`, `framework:PRINCIPAL`).
    pub connections_per_principal: usize,
    /// Open connections per source IP address; 0 = unlimited.
    pub connections_per_address: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            frameworks_per_principal: 100,
            roles_per_framework: 64,
            role_name_length: 128,
            role_depth: 8,
            connections_per_principal: 128,
            connections_per_address: 1024,
        }
    }
}

/// The operator port's numbers (its `--http-*` flags): enforced by the I/O shell
/// (`server::http_guard` and `server::http`), which counts connections, times requests and
/// keeps the failed-authentication buckets.
///
/// Bounds on what one HTTP client may hold (docs/security.md, "Operator port limits").
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Time from accept to the end of the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time allowed to send a request's headers (slowloris); also how long an idle
    /// keep-alive connection stays open.
    pub header_timeout: Duration,
    /// Time allowed to send a request's body.
    pub body_timeout: Duration,
    /// A write the client accepts nothing of for this long closes the connection (a
    /// subscriber that stopped reading).
    pub write_timeout: Duration,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Connections served at once; past it a new connection takes the place of the oldest
    /// unauthenticated one (closed at once only when every slot is authenticated).
    pub max_connections: usize,
    /// Of `max_connections`, how many only authenticated connections may hold.
    pub reserved_connections: usize,
    /// Unauthenticated connections one address (an IPv6 /64) may hold; 0 = no bound.
    pub max_connections_per_address: usize,
    /// The kernel send buffer of each connection (`SO_SNDBUF`), bytes; 0 = the system's.
    pub send_buffer_bytes: usize,
    /// `/api/v1/events` subscribers one principal may hold at once; 0 = no bound.
    pub max_event_subscribers_per_principal: usize,
    /// Exec sessions (`POST /api/v1/tasks/{id}/exec`) one principal may run at once; 0 = no
    /// bound.
    pub max_exec_sessions_per_principal: usize,
    /// Failed authentications allowed per address (and for all together).
    pub auth: AuthLimits,
    /// Dashboard sessions kept at most (the oldest is ended past it).
    pub max_sessions: usize,
    /// How long a dashboard session lasts.
    pub session_lifetime: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(5),
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(30),
            max_body_bytes: 64 * 1024,
            max_connections: 256,
            reserved_connections: 64,
            max_connections_per_address: 16,
            send_buffer_bytes: 256 * 1024,
            max_event_subscribers_per_principal: 16,
            max_exec_sessions_per_principal: 4,
            auth: AuthLimits::default(),
            max_sessions: 1024,
            session_lifetime: Duration::from_secs(12 * 3600),
        }
    }
}

/// How many failed authentications are allowed: a token bucket per address and one for all
/// addresses together.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AuthLimits {
    /// Failures an address may make at once (the bucket's size); 0 turns the limiter off.
    pub burst: u32,
    /// Failures per minute an address regains.
    pub per_minute: u32,
    /// The same for all addresses together (distributed guessing); the global bucket holds
    /// back only addresses that already failed recently.
    pub global_burst: u32,
    pub global_per_minute: u32,
}

impl Default for AuthLimits {
    fn default() -> Self {
        Self {
            burst: 10,
            per_minute: 10,
            global_burst: 100,
            global_per_minute: 100,
        }
    }
}

/// A role name that may not be used ([`Limits::check_role`]). Names are kept cut to 64
/// bytes: they come from peers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoleRejection {
    #[error(
        "invalid role name {0:?}: use segments of [A-Za-z0-9_.-] separated by '/', at most 128 bytes"
    )]
    Syntax(String),
    #[error("role name {role:?} is {len} bytes long; the limit is {limit}")]
    TooLong {
        role: String,
        len: usize,
        limit: usize,
    },
    #[error("role {role:?} is {depth} levels deep; the limit is {limit}")]
    TooDeep {
        role: String,
        depth: usize,
        limit: usize,
    },
}

/// A count past one of the [`Limits`]: how many there would be, and the bound. The caller
/// names what was counted (its rejection's text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exceeded {
    /// How many there are (or would be).
    pub count: usize,
    /// The bound.
    pub limit: usize,
}

impl Limits {
    /// Why `role` may not be used (syntax, length or depth), if it may not.
    pub fn check_role(&self, role: &str) -> Result<(), RoleRejection> {
        let shown = || truncated(role, 64).to_string();
        if !valid_role(role) {
            return Err(RoleRejection::Syntax(shown()));
        }
        if role.len() > self.role_name_length {
            return Err(RoleRejection::TooLong {
                role: shown(),
                len: role.len(),
                limit: self.role_name_length,
            });
        }
        let depth = role.split('/').count();
        if depth > self.role_depth {
            return Err(RoleRejection::TooDeep {
                role: shown(),
                depth,
                limit: self.role_depth,
            });
        }
        Ok(())
    }

    /// Whether one framework may hold `count` distinct roles.
    pub fn check_roles_per_framework(&self, count: usize) -> Result<(), Exceeded> {
        if count > self.roles_per_framework {
            return Err(Exceeded {
                count,
                limit: self.roles_per_framework,
            });
        }
        Ok(())
    }

    /// Whether a principal that already has `held` frameworks registered may add one more.
    pub fn check_new_framework(&self, held: usize) -> Result<(), Exceeded> {
        if held >= self.frameworks_per_principal {
            return Err(Exceeded {
                count: held,
                limit: self.frameworks_per_principal,
            });
        }
        Ok(())
    }
}

/// At most `max` bytes of `s` (on a char boundary), for error messages about peer input.
fn truncated(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Role names: `eng` or hierarchical `eng/ml`; segments of `[A-Za-z0-9_.-]`, not `.`/`..`.
pub fn valid_role(role: &str) -> bool {
    !role.is_empty()
        && role.len() <= 128
        && role.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        })
}

/// A plausible Unix user name: 1-32 characters of `[a-z0-9_.-]` (and upper case), not starting
/// with `-` or `.`.
pub fn valid_user(user: &str) -> bool {
    !user.is_empty()
        && user.len() <= 32
        && !user.starts_with(['-', '.'])
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_past_a_limit_are_refused() {
        let l = Limits {
            roles_per_framework: 2,
            frameworks_per_principal: 1,
            ..Limits::default()
        };
        assert_eq!(l.check_roles_per_framework(2), Ok(()));
        assert_eq!(
            l.check_roles_per_framework(3),
            Err(Exceeded { count: 3, limit: 2 })
        );
        assert_eq!(l.check_new_framework(0), Ok(()));
        assert_eq!(
            l.check_new_framework(1),
            Err(Exceeded { count: 1, limit: 1 })
        );
    }

    #[test]
    fn user_names() {
        assert!(valid_user("nobody"));
        assert!(valid_user("gantry-task.1"));
        for bad in ["", "-x", ".x", "a b", "x/y", &"u".repeat(33)] {
            assert!(!valid_user(bad), "{bad:?}");
        }
    }
}
