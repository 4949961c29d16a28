//! Open connections per certificate identity and per source address: a peer past either bound
//! is closed right after the handshake, before it costs the core anything. The bounds are
//! security's ([`Limits`]), the key a peer is counted under too
//! (`security::identity::connection_key`); this module only counts.

use std::net::IpAddr;
use std::sync::Arc;

use dashmap::DashMap;

use crate::security::Limits;

/// Live connection counts, shared by every connection task.
#[derive(Clone, Default)]
pub(crate) struct ConnLimits {
    per_principal: usize,
    per_address: usize,
    principals: Arc<DashMap<String, usize>>,
    addresses: Arc<DashMap<IpAddr, usize>>,
}

/// A connection past one of the bounds (the text is the close reason the peer sees).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ConnRejection {
    #[error("too many connections from {address} (limit {limit}, --max-connections-per-address)")]
    PerAddress { address: IpAddr, limit: usize },
    #[error(
        "too many connections for {principal} (limit {limit}, --max-connections-per-principal)"
    )]
    PerPrincipal { principal: String, limit: usize },
}

/// Holds one connection's place in the counts until dropped.
pub(crate) struct Slot {
    limits: ConnLimits,
    principal: String,
    address: IpAddr,
}

impl ConnLimits {
    pub(crate) fn new(limits: &Limits) -> Self {
        Self {
            per_principal: limits.connections_per_principal,
            per_address: limits.connections_per_address,
            ..Self::default()
        }
    }

    /// Takes a place for a connection of `principal` (e.g. `framework:analytics`) from
    /// `address`, or says which bound it would exceed. A bound of 0 is unlimited.
    pub(crate) fn admit(&self, principal: &str, address: IpAddr) -> Result<Slot, ConnRejection> {
        {
            let mut n = self.addresses.entry(address).or_insert(0);
            if self.per_address > 0 && *n >= self.per_address {
                return Err(ConnRejection::PerAddress {
                    address,
                    limit: self.per_address,
                });
            }
            *n += 1;
        }
        let mut n = self.principals.entry(principal.to_string()).or_insert(0);
        if self.per_principal > 0 && *n >= self.per_principal {
            drop(n);
            self.release(&self.addresses, &address);
            return Err(ConnRejection::PerPrincipal {
                principal: principal.to_string(),
                limit: self.per_principal,
            });
        }
        *n += 1;
        Ok(Slot {
            limits: self.clone(),
            principal: principal.to_string(),
            address,
        })
    }

    fn release<K: std::hash::Hash + Eq + Clone>(&self, map: &DashMap<K, usize>, key: &K) {
        // Removed at zero so a flood of one-off addresses or names leaves nothing behind.
        map.remove_if_mut(key, |_, n| {
            *n = n.saturating_sub(1);
            *n == 0
        });
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.limits
            .release(&self.limits.principals, &self.principal);
        self.limits.release(&self.limits.addresses, &self.address);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_per_principal_and_address_and_release_on_drop() {
        let limits = ConnLimits::new(&Limits {
            connections_per_principal: 2,
            connections_per_address: 3,
            ..Limits::default()
        });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let s1 = limits.admit("framework:x", a).unwrap();
        let s2 = limits.admit("framework:x", a).unwrap();
        let e = limits.admit("framework:x", b).err().unwrap().to_string();
        assert!(e.contains("framework:x"), "{e}");
        // The refused principal did not take a place at `b`.
        let s3 = limits.admit("framework:y", a).unwrap();
        let e = limits.admit("framework:z", a).err().unwrap().to_string();
        assert!(e.contains("10.0.0.1"), "{e}");
        drop(s1);
        let s4 = limits.admit("framework:x", b).unwrap();
        let s5 = limits.admit("framework:z", a).unwrap();
        // Nothing is kept for names and addresses with no connection left.
        drop((s2, s3, s4, s5));
        assert!(limits.principals.is_empty() && limits.addresses.is_empty());
        // 0 = unlimited.
        let open = ConnLimits::new(&Limits {
            connections_per_principal: 0,
            connections_per_address: 0,
            ..Limits::default()
        });
        let slots: Vec<Slot> = (0..100)
            .map(|_| open.admit("agent:a", a).unwrap())
            .collect();
        assert_eq!(slots.len(), 100);
    }
}
