//! Which master to try next (PURE), shared by agents and the SDK driver.
//!
//! Rules: masters are tried in the configured order; after a connection to one is lost (or
//! fails), the others come first and that one last, so a peer does not wait on a dead leader
//! while standbys are up; a `NotLeader` redirect puts the named leader first, once (no
//! duplicates); the queue refills when empty.

use std::collections::VecDeque;

/// The order in which to try master addresses. See the module docs.
#[derive(Debug, Clone)]
pub struct MasterCandidates {
    all: Vec<String>,
    queue: VecDeque<String>,
    redirects_in_a_row: u32,
}

impl MasterCandidates {
    /// Candidates from the configured list (must not be empty for [`next_target`](Self::next_target) to
    /// return anything).
    pub fn new(all: Vec<String>) -> Self {
        let queue = all.iter().cloned().collect();
        Self {
            all,
            queue,
            redirects_in_a_row: 0,
        }
    }

    /// The next address to try.
    pub fn next_target(&mut self) -> Option<String> {
        if self.queue.is_empty() {
            self.queue.extend(self.all.iter().cloned());
        }
        self.queue.pop_front()
    }

    /// The connection to `addr` failed or was lost: try every other master before it again.
    pub fn lost(&mut self, addr: &str) {
        self.redirects_in_a_row = 0;
        let pos = self.all.iter().position(|a| a == addr);
        let mut order: Vec<String> = match pos {
            Some(p) => self.all[p + 1..]
                .iter()
                .chain(self.all[..p].iter())
                .cloned()
                .collect(),
            None => self.all.clone(),
        };
        order.push(addr.to_string());
        self.queue = order.into();
    }

    /// `addr` said another master leads. Returns true when the leader should be tried at once
    /// (no backoff): a first redirect, not a ping-pong between confused masters.
    pub fn redirect(&mut self, leader: Option<&str>) -> bool {
        self.redirects_in_a_row += 1;
        match leader {
            Some(l) => {
                self.queue.retain(|a| a != l);
                self.queue.push_front(l.to_string());
                self.redirects_in_a_row <= 2
            }
            None => false,
        }
    }

    /// A session was established: forget redirect history.
    pub fn connected(&mut self) {
        self.redirects_in_a_row = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c() -> MasterCandidates {
        MasterCandidates::new(vec!["a".into(), "b".into(), "c".into()])
    }

    #[test]
    fn configured_order_then_refill() {
        let mut m = c();
        assert_eq!(
            [
                m.next_target(),
                m.next_target(),
                m.next_target(),
                m.next_target()
            ],
            [
                Some("a".into()),
                Some("b".into()),
                Some("c".into()),
                Some("a".into())
            ]
        );
        assert_eq!(MasterCandidates::new(vec![]).next_target(), None);
    }

    #[test]
    fn a_lost_master_goes_last() {
        let mut m = c();
        m.next_target();
        m.lost("a");
        assert_eq!(
            [m.next_target(), m.next_target(), m.next_target()],
            [Some("b".into()), Some("c".into()), Some("a".into())]
        );
        m.lost("b");
        assert_eq!(
            [m.next_target(), m.next_target(), m.next_target()],
            [Some("c".into()), Some("a".into()), Some("b".into())]
        );
    }

    #[test]
    fn redirects_go_first_once_and_stop_ping_pong() {
        let mut m = c();
        m.next_target();
        assert!(m.redirect(Some("c")));
        assert_eq!(
            [m.next_target(), m.next_target(), m.next_target()],
            [Some("c".into()), Some("b".into()), Some("a".into())]
        );
        assert!(m.redirect(Some("b")));
        assert!(!m.redirect(Some("c")), "third redirect in a row backs off");
        m.connected();
        assert!(m.redirect(Some("a")));
        assert!(!m.redirect(None));
    }
}
