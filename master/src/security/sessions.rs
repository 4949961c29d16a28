//! Dashboard sessions (PURE apart from the random ids): the browser holds a random session id
//! (256 bits from the system CSPRNG) in the `gantry_session` cookie; the master maps its SHA-256
//! to the operator, the digest of the token that logged in, a CSRF token for the page's forms,
//! and when it ends. A session ends at logout, after its lifetime, when its token leaves
//! `--operator-tokens` (SIGHUP), or when `max` newer sessions push it out.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

use super::tokens::{self, SharedTokens};

#[derive(Debug, Clone)]
struct Session {
    token: [u8; 32],
    csrf: String,
    created: Instant,
    expires: Instant,
}

/// The live dashboard sessions.
#[derive(Debug)]
pub struct Sessions {
    max: usize,
    lifetime: Duration,
    by_id: Mutex<HashMap<[u8; 32], Session>>,
}

impl Sessions {
    pub fn new(max: usize, lifetime: Duration) -> Self {
        Self {
            max: max.max(1),
            lifetime,
            by_id: Mutex::default(),
        }
    }

    /// How long a session lasts.
    pub fn lifetime(&self) -> Duration {
        self.lifetime
    }

    /// Starts a session for the holder of `token` (already verified); its id (the cookie).
    pub fn create(&self, token: &str, now: Instant) -> Result<String, String> {
        let id = tokens::generate().map_err(|e| e.to_string())?;
        let csrf = tokens::generate().map_err(|e| e.to_string())?;
        let mut map = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, s| s.expires > now);
        while map.len() >= self.max {
            let oldest = map.iter().min_by_key(|(_, s)| s.created).map(|(k, _)| *k);
            match oldest {
                Some(k) => map.remove(&k),
                None => break,
            };
        }
        map.insert(
            tokens::digest(&id),
            Session {
                token: tokens::digest(token),
                csrf,
                created: now,
                expires: now + self.lifetime,
            },
        );
        Ok(id)
    }

    fn live(&self, id: &str, now: Instant) -> Option<Session> {
        if id.len() > tokens::MAX_TOKEN_LEN {
            return None;
        }
        let mut map = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        let key = tokens::digest(id);
        match map.get(&key) {
            Some(s) if s.expires > now => Some(s.clone()),
            Some(_) => {
                map.remove(&key);
                None
            }
            None => None,
        }
    }

    /// The operator of a live session whose token is still configured.
    pub fn operator(&self, id: &str, tokens: &SharedTokens, now: Instant) -> Option<String> {
        let s = self.live(id, now)?;
        let name = tokens.verify_digest(&s.token);
        if name.is_none() {
            // Its token was revoked: the session goes with it.
            self.end(id);
        }
        name
    }

    /// The CSRF token of a live session.
    pub fn csrf(&self, id: &str, now: Instant) -> Option<String> {
        self.live(id, now).map(|s| s.csrf)
    }

    /// Ends session `id` when `csrf` is its CSRF token; true if it ended.
    pub fn end_with_csrf(&self, id: &str, csrf: &str, now: Instant) -> bool {
        match self.live(id, now) {
            Some(s) if bool::from(s.csrf.as_bytes().ct_eq(csrf.as_bytes())) => {
                self.end(id);
                true
            }
            _ => false,
        }
    }

    fn end(&self, id: &str) {
        let mut map = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(&tokens::digest(id));
    }

    /// Sessions held now (ended ones may be counted until the next login sweeps them).
    pub fn len(&self) -> usize {
        self.by_id.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// True when no session is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::tokens::{file_entry, generate, OperatorTokens};

    fn shared(entries: &[(&str, &str)]) -> SharedTokens {
        let text: String = entries.iter().map(|(n, t)| file_entry(n, t)).collect();
        SharedTokens::new(OperatorTokens::from_toml(&text, "t").unwrap())
    }

    #[test]
    fn sessions_are_random_bounded_expire_and_end_with_their_token() {
        let (ta, tb) = (generate().unwrap(), generate().unwrap());
        let tokens = shared(&[("alice", &ta), ("bob", &tb)]);
        let s = Sessions::new(2, Duration::from_secs(60));
        let t0 = Instant::now();
        let a = s.create(&ta, t0).unwrap();
        assert_ne!(a, ta, "the cookie is not the token");
        assert_eq!(a.len(), 64);
        assert_eq!(s.operator(&a, &tokens, t0).as_deref(), Some("alice"));
        assert_eq!(s.operator("guess", &tokens, t0), None);
        // Expiry.
        assert_eq!(s.operator(&a, &tokens, t0 + Duration::from_secs(61)), None);
        // Bounded: the oldest goes.
        let b1 = s.create(&tb, t0).unwrap();
        let b2 = s.create(&tb, t0 + Duration::from_secs(1)).unwrap();
        let b3 = s.create(&tb, t0 + Duration::from_secs(2)).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s.operator(&b1, &tokens, t0), None);
        assert!(s.operator(&b3, &tokens, t0).is_some());
        // Logout needs the session's CSRF token.
        let (c2, c3) = (s.csrf(&b2, t0).unwrap(), s.csrf(&b3, t0).unwrap());
        assert_ne!(c2, c3);
        assert!(!s.end_with_csrf(&b2, &c3, t0));
        assert!(s.end_with_csrf(&b2, &c2, t0));
        assert_eq!(s.operator(&b2, &tokens, t0), None);
        // Revoking the token ends its sessions.
        tokens.replace(OperatorTokens::from_toml(&file_entry("alice", &ta), "t").unwrap());
        assert_eq!(s.operator(&b3, &tokens, t0), None);
        assert_eq!(s.len(), 0);
    }
}
