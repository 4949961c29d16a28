//! What bounds the operator port before and around a request (issue: operator hardening items 3,
//! 4 and 6): who may hold a connection ([`Admission`]), how long a peer may keep a write
//! waiting ([`WriteDeadline`]), and how many failed authentications an address may make
//! ([`AuthLimiter`]). Pure apart from the semaphores and the timer in [`WriteDeadline`]; the
//! limiter takes the time as an argument.
//!
//! ```text
//! accept ─ Admission::admit(address)
//!            per address (--http-max-connections-per-address, unauthenticated ones only):
//!              refused past it
//!            unauthenticated share (max - reserved) or all slots (--http-max-connections)
//!              taken: the OLDEST unauthenticated connection of the address holding the
//!              most is closed to make room
//!   TLS handshake with an operator certificate ─┐
//!   or a request that authenticated ───────────┴─ ConnGuard::promote(): leaves the
//!            unauthenticated share and its address's count; never closed for room, so
//!            `reserved` slots stay for authenticated operators
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub use crate::security::AuthLimits;

/// The address a limit is kept for: IPv4 as is, IPv6 by its /64 (one host usually holds a whole
/// /64), an IPv4-mapped IPv6 address as its IPv4 address.
pub(crate) fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// Why a new connection was closed at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("all {0} connections are held by authenticated operators (--http-max-connections)")]
    Full(usize),
    #[error(
        "{limit} unauthenticated connections from {address} (--http-max-connections-per-address)"
    )]
    PerAddress { address: IpAddr, limit: usize },
}

/// The connection slots of the operator port (see the module docs). When the unauthenticated
/// share (or every slot) is taken, a new connection takes the place of the OLDEST
/// unauthenticated one of the address holding the most, which is closed: a flood of connections that never authenticate can
/// delay a new operator by at most the time its handshake takes, never lock it out, and an
/// authenticated connection is never closed for room.
#[derive(Clone)]
pub(crate) struct Admission {
    max: usize,
    max_unauthenticated: usize,
    per_address: usize,
    inner: Arc<Mutex<Slots>>,
}

#[derive(Default)]
struct Slots {
    next: u64,
    /// Unauthenticated connections, oldest first: their address and how to close them.
    pending: std::collections::BTreeMap<u64, (IpAddr, Arc<tokio::sync::Notify>)>,
    /// Connections that authenticated.
    authenticated: std::collections::HashSet<u64>,
    /// Unauthenticated connections per address.
    addresses: HashMap<IpAddr, usize>,
    /// Unauthenticated connections closed to make room, since start.
    evicted: u64,
}

impl Slots {
    fn open(&self) -> usize {
        self.pending.len() + self.authenticated.len()
    }

    /// The unauthenticated connection to close for room: the oldest of the address holding the
    /// most of them (oldest overall between addresses holding as many). A flood from a few
    /// addresses then closes its own connections, not the one handshake of an operator
    /// connecting from elsewhere while it runs; a flood from as many addresses as there are
    /// slots is closed oldest first.
    fn victim(&self) -> Option<u64> {
        let most = self.addresses.values().copied().max()?;
        self.pending
            .iter()
            .find(|(_, (address, _))| self.addresses.get(address) == Some(&most))
            .map(|(seq, _)| *seq)
    }

    /// Forgets pending connection `seq` (its address's count too); true if it was pending.
    fn unpend(&mut self, seq: u64) -> bool {
        let Some((address, _)) = self.pending.remove(&seq) else {
            return false;
        };
        if let Some(n) = self.addresses.get_mut(&address) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                // Nothing kept for addresses with no connection left.
                self.addresses.remove(&address);
            }
        }
        true
    }
}

impl Admission {
    /// `max` connections, `reserved` of them only for authenticated connections, at most
    /// `per_address` unauthenticated ones per address (0: no per-address bound).
    pub(crate) fn new(max: usize, reserved: usize, per_address: usize) -> Self {
        let max = max.max(1);
        Self {
            max,
            max_unauthenticated: max.saturating_sub(reserved).max(1),
            per_address,
            inner: Arc::default(),
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a new (unauthenticated) connection from `remote`, or why not.
    pub(crate) fn admit(&self, remote: IpAddr) -> Result<ConnGuard, Refusal> {
        let address = address_key(remote);
        let mut st = self.slots();
        let from_address = st.addresses.get(&address).copied().unwrap_or(0);
        if self.per_address > 0 && from_address >= self.per_address {
            return Err(Refusal::PerAddress {
                address,
                limit: self.per_address,
            });
        }
        if st.pending.len() >= self.max_unauthenticated || st.open() >= self.max {
            let Some(oldest) = st.victim() else {
                return Err(Refusal::Full(self.max));
            };
            if let Some((_, close)) = st.pending.get(&oldest) {
                close.notify_one();
            }
            st.unpend(oldest);
            st.evicted += 1;
        }
        let seq = st.next;
        st.next += 1;
        let close = Arc::new(tokio::sync::Notify::new());
        st.pending.insert(seq, (address, close.clone()));
        *st.addresses.entry(address).or_insert(0) += 1;
        Ok(ConnGuard {
            admission: self.clone(),
            seq,
            close,
        })
    }

    /// Connections open now, how many of them are not authenticated, and how many
    /// unauthenticated ones were closed to make room since start.
    pub(crate) fn counts(&self) -> (usize, usize, u64) {
        let st = self.slots();
        (st.open(), st.pending.len(), st.evicted)
    }
}

/// One connection's slot, held until the connection ends.
pub(crate) struct ConnGuard {
    admission: Admission,
    seq: u64,
    close: Arc<tokio::sync::Notify>,
}

impl ConnGuard {
    /// The connection authenticated (an operator certificate, or a request that presented a
    /// valid credential): it no longer counts as unauthenticated, for its address or at all,
    /// and is never closed to make room.
    pub(crate) fn promote(&self) {
        let mut st = self.admission.slots();
        if st.unpend(self.seq) {
            st.authenticated.insert(self.seq);
        }
    }

    /// True once [`Self::promote`] ran (and the connection was not closed for room before).
    #[cfg(test)]
    pub(crate) fn authenticated(&self) -> bool {
        self.admission.slots().authenticated.contains(&self.seq)
    }

    /// Completes when the connection was chosen to be closed for room (unauthenticated only).
    pub(crate) async fn evicted(&self) {
        self.close.notified().await
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let mut st = self.admission.slots();
        if !st.unpend(self.seq) {
            st.authenticated.remove(&self.seq);
        }
    }
}

impl std::fmt::Debug for ConnGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnGuard").field("seq", &self.seq).finish()
    }
}

/// An I/O stream whose writes fail with `TimedOut` when the peer accepts nothing for `limit`
/// (nginx `send_timeout`): a client that stops reading (an event-stream subscriber, a slow
/// reader of a large `/state`) is closed instead of holding its connection forever.
pub(crate) struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    pub(crate) fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            timer: None,
        }
    }

    /// After a write that made no progress: arms the deadline, or fails once it passed.
    fn stalled(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let limit = self.limit;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client accepted no data for {limit:?}"),
            )),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Pending => match self.stalled(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
            done => {
                self.timer = None;
                done
            }
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Pending => match self.stalled(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
            done => {
                self.timer = None;
                done
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => match self.stalled(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
            done => {
                self.timer = None;
                done
            }
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_shutdown(cx) {
            Poll::Pending => match self.stalled(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
            done => done,
        }
    }
}

/// Addresses tracked at most; past it, addresses with full buckets are forgotten first, then
/// new failing addresses count against the global bucket only.
const MAX_TRACKED: usize = 16_384;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(size: u32, now: Instant) -> Self {
        Self {
            tokens: f64::from(size),
            at: now,
        }
    }

    fn refill(&mut self, size: u32, per_minute: u32, now: Instant) {
        let secs = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + secs * f64::from(per_minute) / 60.0).min(f64::from(size));
        self.at = now;
    }

    /// Time until one failure is allowed again (zero when one is).
    fn wait(&self, per_minute: u32) -> Duration {
        if self.tokens >= 1.0 {
            return Duration::ZERO;
        }
        if per_minute == 0 {
            return Duration::from_secs(3600);
        }
        Duration::from_secs_f64((1.0 - self.tokens) * 60.0 / f64::from(per_minute))
    }
}

/// Failed authentications counted per address (see [`AuthLimits`]). An address whose bucket is
/// empty is answered 429 with `Retry-After` BEFORE its credential is checked, so a guess made
/// while limited tells nothing.
#[derive(Debug)]
pub(crate) struct AuthLimiter {
    limits: AuthLimits,
    state: Mutex<LimiterState>,
}

#[derive(Debug)]
struct LimiterState {
    addresses: HashMap<IpAddr, Bucket>,
    global: Option<Bucket>,
    /// Failed authentications, and attempts answered 429, since start.
    failures: u64,
    refused: u64,
}

impl AuthLimiter {
    pub(crate) fn new(limits: AuthLimits) -> Self {
        Self {
            limits,
            state: Mutex::new(LimiterState {
                addresses: HashMap::new(),
                global: None,
                failures: 0,
                refused: 0,
            }),
        }
    }

    /// `Err(retry_after)` when `remote` may not try a credential now.
    pub(crate) fn check(&self, remote: IpAddr, now: Instant) -> Result<(), Duration> {
        let l = self.limits;
        if l.burst == 0 {
            return Ok(());
        }
        let address = address_key(remote);
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(b) = st.addresses.get_mut(&address) else {
            // No recent failure: never held back (not even by the global bucket).
            return Ok(());
        };
        b.refill(l.burst, l.per_minute, now);
        let own = b.wait(l.per_minute);
        let global = match st.global.as_mut() {
            Some(g) if l.global_burst > 0 => {
                g.refill(l.global_burst, l.global_per_minute, now);
                g.wait(l.global_per_minute)
            }
            _ => Duration::ZERO,
        };
        match own.max(global) {
            Duration::ZERO => Ok(()),
            wait => {
                st.refused += 1;
                Err(wait)
            }
        }
    }

    /// Counts a failed authentication from `remote`.
    pub(crate) fn failed(&self, remote: IpAddr, now: Instant) {
        let l = self.limits;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.failures += 1;
        if l.burst == 0 {
            return;
        }
        let address = address_key(remote);
        if l.global_burst > 0 {
            let g = st
                .global
                .get_or_insert_with(|| Bucket::full(l.global_burst, now));
            g.refill(l.global_burst, l.global_per_minute, now);
            g.tokens = (g.tokens - 1.0).max(0.0);
        }
        if !st.addresses.contains_key(&address) && st.addresses.len() >= MAX_TRACKED {
            st.addresses.retain(|_, b| {
                b.refill(l.burst, l.per_minute, now);
                b.tokens < f64::from(l.burst)
            });
        }
        if st.addresses.len() >= MAX_TRACKED && !st.addresses.contains_key(&address) {
            return;
        }
        let b = st
            .addresses
            .entry(address)
            .or_insert_with(|| Bucket::full(l.burst, now));
        b.refill(l.burst, l.per_minute, now);
        b.tokens = (b.tokens - 1.0).max(0.0);
    }

    /// Addresses with recent failures, failed authentications and attempts answered 429
    /// since start (`/state`, `/metrics`).
    pub(crate) fn figures(&self) -> (usize, u64, u64) {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (st.addresses.len(), st.failures, st.refused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv6_addresses_count_by_their_64() {
        assert_eq!(address_key(ip("10.1.2.3")), ip("10.1.2.3"));
        assert_eq!(
            address_key(ip("2001:db8:1:2:3:4:5:6")),
            ip("2001:db8:1:2::")
        );
        assert_eq!(address_key(ip("::ffff:10.1.2.3")), ip("10.1.2.3"));
    }

    fn closed_for_room(g: &ConnGuard) -> bool {
        use std::future::Future;
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let fut = std::pin::pin!(g.evicted());
        fut.poll(&mut cx).is_ready()
    }

    #[test]
    fn a_flood_closes_its_own_connections_not_an_operators_handshake() {
        // 6 unauthenticated slots; an operator connects first (oldest), then a flood from two
        // addresses keeps coming: oldest-first would close the operator's handshake.
        let adm = Admission::new(10, 4, 0);
        let operator = adm.admit(ip("10.0.0.5")).unwrap();
        let flood: Vec<_> = (0..40)
            .map(|i| adm.admit(ip(&format!("10.0.1.{}", i % 2))).unwrap())
            .collect();
        assert_eq!(adm.counts(), (6, 6, 35));
        assert!(
            !closed_for_room(&operator),
            "the operator's handshake survives"
        );
        assert!(closed_for_room(&flood[0]) && !closed_for_room(&flood[39]));
        // Every address at one connection: the oldest goes.
        drop(flood);
        let one: Vec<_> = (0..6)
            .map(|i| adm.admit(ip(&format!("10.0.2.{i}"))).unwrap())
            .collect();
        assert!(closed_for_room(&operator), "oldest of equals");
        drop(one);
    }

    #[test]
    fn unauthenticated_connections_cannot_take_the_reserved_share() {
        let adm = Admission::new(10, 4, 3);
        // One address: stopped at 3.
        let a: Vec<_> = (0..3).map(|_| adm.admit(ip("10.0.0.1")).unwrap()).collect();
        assert!(matches!(
            adm.admit(ip("10.0.0.1")),
            Err(Refusal::PerAddress { limit: 3, .. })
        ));
        // Many addresses: at most 10 - 4 = 6 unauthenticated; the 7th takes the oldest's place.
        let b: Vec<_> = (2..5)
            .map(|i| adm.admit(ip(&format!("10.0.0.{i}"))).unwrap())
            .collect();
        assert_eq!(adm.counts(), (6, 6, 0));
        let c = adm.admit(ip("10.0.0.9")).unwrap();
        assert_eq!(adm.counts(), (6, 6, 1));
        assert!(
            closed_for_room(&a[0]),
            "the oldest unauthenticated one goes"
        );
        assert!(!closed_for_room(&a[1]) && !closed_for_room(&c));
        // Its address may connect again (it no longer counts there).
        let a4 = adm.admit(ip("10.0.0.1")).unwrap();
        assert!(closed_for_room(&a[1]));
        // Authenticated connections leave the unauthenticated share and their address's
        // count, and are never closed for room: the reserved share holds them.
        a[2].promote();
        a4.promote();
        c.promote();
        assert!(a4.authenticated() && !b[0].authenticated());
        assert_eq!(adm.counts(), (6, 3, 2));
        let more: Vec<_> = (0..4)
            .map(|i| adm.admit(ip(&format!("10.0.1.{i}"))).unwrap())
            .collect();
        // 3 authenticated + 6 unauthenticated (one of b closed) + ... = at most 10 open.
        assert_eq!(adm.counts(), (9, 6, 3));
        assert!(!closed_for_room(&a[2]) && !closed_for_room(&a4) && !closed_for_room(&c));
        // Every slot authenticated: a new connection is refused.
        for m in &more {
            m.promote();
        }
        let d = adm.admit(ip("10.0.2.1")).unwrap();
        d.promote();
        assert_eq!(adm.counts(), (10, 2, 3));
        let e1 = adm.admit(ip("10.0.2.2")).unwrap();
        assert_eq!(adm.counts(), (10, 2, 4), "an unauthenticated one made room");
        drop(e1);
        drop((a, b));
        assert_eq!(adm.counts(), (7, 0, 4));
        drop((c, a4, more, d));
        let st = adm.slots();
        assert!(
            st.addresses.is_empty() && st.pending.is_empty() && st.authenticated.is_empty(),
            "nothing kept"
        );
        drop(st);
        // Every slot held by authenticated connections: a new one is refused.
        let full = Admission::new(2, 1, 0);
        let held: Vec<_> = (0..2)
            .map(|_| {
                let g = full.admit(ip("10.0.0.1")).unwrap();
                g.promote();
                g
            })
            .collect();
        assert!(matches!(full.admit(ip("10.0.0.2")), Err(Refusal::Full(2))));
        drop(held);
        assert!(full.admit(ip("10.0.0.2")).is_ok());
    }

    #[tokio::test]
    async fn a_peer_that_stops_reading_fails_the_write_at_the_deadline() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // A peer that reads: everything goes through (the deadline never passes).
        let (a, mut b) = tokio::io::duplex(1024);
        let mut w = WriteDeadline::new(a, Duration::from_secs(30));
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut n = 0;
            while n < 64 * 1024 {
                n += b.read(&mut buf).await.unwrap();
            }
        });
        for _ in 0..64 {
            w.write_all(&[7u8; 1024]).await.unwrap();
        }
        reader.await.unwrap();
        // A peer that never reads: once its buffer is full, the write fails (no wait forever).
        let (a, _b) = tokio::io::duplex(1024);
        let mut w = WriteDeadline::new(a, Duration::from_millis(50));
        let stalled = async {
            loop {
                if let Err(e) = w.write_all(&[7u8; 1024]).await {
                    break e;
                }
            }
        };
        let err = tokio::time::timeout(Duration::from_secs(60), stalled)
            .await
            .expect("the write waited for a peer that never reads");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn failures_are_limited_per_address_with_retry_after() {
        let lim = AuthLimiter::new(AuthLimits {
            burst: 3,
            per_minute: 6,
            global_burst: 100,
            global_per_minute: 100,
        });
        let t0 = Instant::now();
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        for _ in 0..3 {
            assert_eq!(lim.check(a, t0), Ok(()));
            lim.failed(a, t0);
        }
        let wait = lim.check(a, t0).unwrap_err();
        assert_eq!(wait, Duration::from_secs(10), "6 per minute: one per 10 s");
        // Another address is not held back.
        assert_eq!(lim.check(b, t0), Ok(()));
        // Time gives one failure back.
        assert!(lim.check(a, t0 + Duration::from_secs(9)).is_err());
        assert_eq!(lim.check(a, t0 + Duration::from_secs(10)), Ok(()));
        lim.failed(a, t0 + Duration::from_secs(10));
        assert!(lim.check(a, t0 + Duration::from_secs(11)).is_err());
    }

    #[test]
    fn the_global_bucket_holds_back_only_addresses_that_failed() {
        let lim = AuthLimiter::new(AuthLimits {
            burst: 5,
            per_minute: 5,
            global_burst: 4,
            global_per_minute: 1,
        });
        let t0 = Instant::now();
        for i in 1..=4 {
            lim.failed(ip(&format!("10.0.1.{i}")), t0);
        }
        // Each of those has failures to spare, but all addresses together have none.
        assert!(lim.check(ip("10.0.1.1"), t0).is_err());
        // An address with no failure is never held back.
        assert_eq!(lim.check(ip("10.0.2.1"), t0), Ok(()));
        assert_eq!(lim.figures(), (4, 4, 1));
        // Off: nothing counted.
        let off = AuthLimiter::new(AuthLimits {
            burst: 0,
            ..AuthLimits::default()
        });
        for _ in 0..100 {
            off.failed(ip("10.0.0.1"), t0);
        }
        assert_eq!(off.check(ip("10.0.0.1"), t0), Ok(()));
    }
}
