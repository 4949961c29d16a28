//! The one place that knows how messages become bytes.
//!
//! A frame is a 4-byte big-endian length followed by that many bytes of bincode (1.3, pinned;
//! varint integers, little endian). Frames are bounded by [`MAX_FRAME`]; decoding rejects
//! trailing bytes. Swapping the encoding means changing this module only.
//!
//! - Writing: [`encode`] / [`write_frame`] refuse a message over the bound; [`encoded_len`]
//!   tells a sender the size in advance and [`split_batches`] cuts a list-carrying message
//!   into as many messages as needed so that none exceeds it.
//! - Reading from untrusted peers: [`read_frame_limited`] adds a deadline for a frame's body
//!   once its length has arrived and a [`FrameBudget`] shared by all connections that bounds
//!   the bytes of frame bodies being received at once (the master's side).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bincode::Options;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest frame payload accepted or produced: 4 MiB.
pub const MAX_FRAME: usize = 4 * 1024 * 1024;

/// What can go wrong reading or writing a frame.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("connection closed")]
    Closed,
    #[error("the body of a {0}-byte frame did not arrive within {1:?}")]
    BodyTimeout(usize, Duration),
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

fn options() -> impl Options {
    bincode::DefaultOptions::new()
        .with_limit(MAX_FRAME as u64)
        .with_little_endian()
        .with_varint_encoding()
        .reject_trailing_bytes()
}

/// Encodes `msg` as one frame payload (without the length prefix).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, CodecError> {
    let bytes = options().serialize(msg).map_err(|e| match *e {
        bincode::ErrorKind::SizeLimit => CodecError::TooLarge(MAX_FRAME + 1),
        other => CodecError::Malformed(other.to_string()),
    })?;
    if bytes.len() > MAX_FRAME {
        return Err(CodecError::TooLarge(bytes.len()));
    }
    Ok(bytes)
}

/// The size of the frame payload `msg` encodes to (without the 4-byte length prefix), or
/// [`CodecError::TooLarge`] past [`MAX_FRAME`]. Costs a walk over `msg`, no allocation.
pub fn encoded_len<T: Serialize + ?Sized>(msg: &T) -> Result<usize, CodecError> {
    match options().serialized_size(msg) {
        Ok(n) => Ok(n as usize),
        Err(e) => match *e {
            bincode::ErrorKind::SizeLimit => Err(CodecError::TooLarge(MAX_FRAME + 1)),
            other => Err(CodecError::Malformed(other.to_string())),
        },
    }
}

/// The batches [`split_batches`] made, and the items too large for a frame even alone.
#[derive(Debug)]
pub struct Split<M, T> {
    pub batches: Vec<M>,
    pub oversized: Vec<T>,
}

/// Bytes of a bincode varint length: one below 251, then a marker and 2, 4 or 8 bytes.
fn varint_len(n: usize) -> usize {
    match n as u64 {
        0..=250 => 1,
        251..=0xffff => 3,
        0x1_0000..=0xffff_ffff => 5,
        _ => 9,
    }
}

/// Cuts `items` into consecutive batches, in order, such that `wrap(batch)` encodes within
/// [`MAX_FRAME`]: one message when everything fits, more when not. `wrap` must put the batch
/// into the message as one sequence field (e.g. `MasterToFramework::Offers`). An item that
/// does not fit even alone is returned in [`Split::oversized`] (the caller warns and drops it:
/// it could never be sent).
pub fn split_batches<T, M>(items: Vec<T>, wrap: impl Fn(Vec<T>) -> M) -> Split<M, T>
where
    T: Serialize,
    M: Serialize,
{
    split_batches_within(items, MAX_FRAME, wrap)
}

/// [`split_batches`] under `limit` bytes (at most [`MAX_FRAME`]) instead of the frame bound.
pub fn split_batches_within<T, M>(
    items: Vec<T>,
    limit: usize,
    wrap: impl Fn(Vec<T>) -> M,
) -> Split<M, T>
where
    T: Serialize,
    M: Serialize,
{
    let limit = limit.min(MAX_FRAME);
    let mut split = Split {
        batches: Vec::new(),
        oversized: Vec::new(),
    };
    // What the message costs around its items, but for the sequence length (exact: a
    // sequence encodes as its varint length followed by its items).
    let around = encoded_len(&wrap(Vec::new())).map_or(limit, |n| n - varint_len(0));
    let mut batch: Vec<T> = Vec::new();
    let mut items_size = 0;
    for item in items {
        let n = match encoded_len(&item) {
            Ok(n) if around + varint_len(1) + n <= limit => n,
            _ => {
                split.oversized.push(item);
                continue;
            }
        };
        if around + varint_len(batch.len() + 1) + items_size + n > limit && !batch.is_empty() {
            split.batches.push(wrap(std::mem::take(&mut batch)));
            items_size = 0;
        }
        items_size += n;
        batch.push(item);
    }
    if !batch.is_empty() {
        split.batches.push(wrap(batch));
    }
    split
}

/// Decodes one frame payload; every byte must belong to the message.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    if bytes.len() > MAX_FRAME {
        return Err(CodecError::TooLarge(bytes.len()));
    }
    options()
        .deserialize(bytes)
        .map_err(|e| CodecError::Malformed(e.to_string()))
}

/// Writes `msg` as one length-prefixed frame.
pub async fn write_frame<W, T>(w: &mut W, msg: &T) -> Result<(), CodecError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    let payload = encode(msg)?;
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    buf.extend_from_slice(&payload);
    w.write_all(&buf).await?;
    Ok(())
}

/// Reads one length-prefixed frame. A clean end of stream before a frame starts is
/// [`CodecError::Closed`]; an oversized length is refused before reading the body.
pub async fn read_frame<R, T>(r: &mut R) -> Result<T, CodecError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    read_frame_max(r, MAX_FRAME).await
}

/// The largest first frame (the [`Hello`](crate::protocol::Hello)) a master reads.
pub const MAX_HELLO: usize = 1024;

/// [`read_frame`] with a smaller bound than [`MAX_FRAME`] (e.g. [`MAX_HELLO`]): a length past
/// `max` is [`CodecError::TooLarge`] before any of the body is read.
pub async fn read_frame_max<R, T>(r: &mut R, max: usize) -> Result<T, CodecError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(CodecError::Closed),
        Err(e) => return Err(CodecError::Io(e)),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > max.min(MAX_FRAME) {
        return Err(CodecError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    decode(&body)
}

/// Frame bodies up to this size are read without charging the [`FrameBudget`]: every
/// connection may hold one such partial body (connections are bounded per principal), so
/// heartbeats and status updates never wait behind large frames.
pub const UNCHARGED_FRAME: usize = 64 * 1024;

/// How bodies are read from an untrusted peer: see [`read_frame_limited`].
#[derive(Debug, Clone)]
pub struct ReadLimits {
    /// Once a frame's length has arrived, its whole body must arrive within this long.
    pub body_timeout: Duration,
    /// Shared by every connection of the process.
    pub budget: Arc<FrameBudget>,
}

/// A process-wide budget for frame bodies being received: a body larger than
/// [`UNCHARGED_FRAME`] is read only once its full length is reserved here, so stalled partial
/// frames can not hold more than the budget (readers past it wait, in order, and their peers
/// are held back by QUIC flow control). Also counts what a reader holds, for `/state`.
#[derive(Debug)]
pub struct FrameBudget {
    capacity: usize,
    permits: tokio::sync::Semaphore,
    reserved: AtomicUsize,
    buffered: AtomicUsize,
    peak_buffered: AtomicUsize,
    waiting: AtomicUsize,
    body_timeouts: AtomicU64,
}

/// A snapshot of a [`FrameBudget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct FrameBudgetStats {
    /// The budget, bytes.
    pub budget_bytes: usize,
    /// Bytes reserved by large frame bodies being received now.
    pub reserved_bytes: usize,
    /// Bytes of partial frame bodies received and held now (all frames, charged or not).
    pub buffered_bytes: usize,
    /// The most `buffered_bytes` ever was.
    pub peak_buffered_bytes: usize,
    /// Readers waiting for budget now.
    pub waiting_readers: usize,
    /// Frames whose body did not arrive within the deadline (their connections were closed).
    pub body_timeouts: u64,
}

impl FrameBudget {
    /// A budget of `capacity` bytes (at least one [`MAX_FRAME`], so any frame can be read).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(MAX_FRAME);
        Self {
            capacity,
            permits: tokio::sync::Semaphore::new(capacity),
            reserved: AtomicUsize::new(0),
            buffered: AtomicUsize::new(0),
            peak_buffered: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            body_timeouts: AtomicU64::new(0),
        }
    }

    pub fn stats(&self) -> FrameBudgetStats {
        FrameBudgetStats {
            budget_bytes: self.capacity,
            reserved_bytes: self.reserved.load(Ordering::Relaxed),
            buffered_bytes: self.buffered.load(Ordering::Relaxed),
            peak_buffered_bytes: self.peak_buffered.load(Ordering::Relaxed),
            waiting_readers: self.waiting.load(Ordering::Relaxed),
            body_timeouts: self.body_timeouts.load(Ordering::Relaxed),
        }
    }
}

/// Bytes a reader holds in the budget's counters; released when the read ends either way.
struct Held<'a> {
    budget: &'a FrameBudget,
    buffered: usize,
    reserved: usize,
}

impl Held<'_> {
    fn add(&mut self, n: usize) {
        self.buffered += n;
        let now = self.budget.buffered.fetch_add(n, Ordering::Relaxed) + n;
        self.budget.peak_buffered.fetch_max(now, Ordering::Relaxed);
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.budget
            .buffered
            .fetch_sub(self.buffered, Ordering::Relaxed);
        self.budget
            .reserved
            .fetch_sub(self.reserved, Ordering::Relaxed);
    }
}

/// Reads one length-prefixed frame from an untrusted peer: like [`read_frame`], but a body
/// over [`UNCHARGED_FRAME`] first reserves its length in `limits.budget` (waiting while the
/// budget is spent), the body must then arrive within `limits.body_timeout`
/// ([`CodecError::BodyTimeout`] otherwise), and memory grows with the bytes that arrived, not
/// with the length the peer claimed.
pub async fn read_frame_limited<R, T>(r: &mut R, limits: &ReadLimits) -> Result<T, CodecError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(CodecError::Closed),
        Err(e) => return Err(CodecError::Io(e)),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(CodecError::TooLarge(len));
    }
    let budget = &*limits.budget;
    let _permit = if len > UNCHARGED_FRAME {
        // Counted while waiting, also if the read is abandoned meanwhile.
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        budget.waiting.fetch_add(1, Ordering::Relaxed);
        let waiting = Waiting(&budget.waiting);
        // `len` <= MAX_FRAME fits a u32; the semaphore is never closed.
        let permit = budget.permits.acquire_many(len as u32).await;
        drop(waiting);
        let permit = permit.map_err(|_| CodecError::Closed)?;
        budget.reserved.fetch_add(len, Ordering::Relaxed);
        Some(permit)
    } else {
        None
    };
    let mut held = Held {
        budget,
        buffered: 0,
        reserved: if len > UNCHARGED_FRAME { len } else { 0 },
    };
    let read = async {
        let mut body: Vec<u8> = Vec::with_capacity(len.min(UNCHARGED_FRAME));
        while body.len() < len {
            let want = (len - body.len()).min(UNCHARGED_FRAME);
            body.reserve(want);
            let n = AsyncReadExt::take(&mut *r, want as u64)
                .read_buf(&mut body)
                .await?;
            if n == 0 {
                return Err(CodecError::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
            held.add(n);
        }
        Ok(body)
    };
    let body = match tokio::time::timeout(limits.body_timeout, read).await {
        Ok(body) => body?,
        Err(_) => {
            budget.body_timeouts.fetch_add(1, Ordering::Relaxed);
            return Err(CodecError::BodyTimeout(len, limits.body_timeout));
        }
    };
    drop(held);
    decode(&body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{
        AgentId, FrameworkId, FrameworkToMaster, Hello, MasterToFramework, Offer, OfferId,
        PeerKind, PROTOCOL_VERSION,
    };

    #[test]
    fn round_trip() {
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            peer: PeerKind::Framework,
        };
        let bytes = encode(&hello).unwrap();
        assert_eq!(decode::<Hello>(&bytes).unwrap(), hello);
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut bytes = encode(&FrameworkToMaster::Teardown).unwrap();
        bytes.push(0);
        assert!(matches!(
            decode::<FrameworkToMaster>(&bytes),
            Err(CodecError::Malformed(_))
        ));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for seed in 0u8..=255 {
            let bytes: Vec<u8> = (0..64)
                .map(|i| seed.wrapping_mul(31).wrapping_add(i))
                .collect();
            let _ = decode::<FrameworkToMaster>(&bytes);
        }
        // A huge claimed vector length must not allocate.
        let bytes = [1u8, 0xfc, 0xff, 0xff, 0xff, 0x7f];
        assert!(decode::<FrameworkToMaster>(&bytes).is_err());
    }

    #[tokio::test]
    async fn oversized_frame_is_refused_before_reading() {
        let mut data = Vec::new();
        data.extend_from_slice(&((MAX_FRAME as u32) + 1).to_be_bytes());
        let mut r = &data[..];
        let res: Result<Hello, _> = read_frame(&mut r).await;
        assert!(matches!(res, Err(CodecError::TooLarge(_))));
    }

    #[tokio::test]
    async fn framed_round_trip_and_clean_close() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &FrameworkToMaster::Teardown)
            .await
            .unwrap();
        let mut r = &buf[..];
        let msg: FrameworkToMaster = read_frame(&mut r).await.unwrap();
        assert_eq!(msg, FrameworkToMaster::Teardown);
        let end: Result<FrameworkToMaster, _> = read_frame(&mut r).await;
        assert!(matches!(end, Err(CodecError::Closed)));
    }

    fn offer(i: u128, attr_bytes: usize) -> Offer {
        Offer {
            id: OfferId::from_u128(i),
            framework_id: FrameworkId::from_u128(1),
            agent_id: AgentId::from_u128(i),
            hostname: format!("host-{i}"),
            role: "r".into(),
            resources: "cpus:4;mem:1024".parse().unwrap(),
            reserved: Default::default(),
            attributes: [("blob".to_string(), "x".repeat(attr_bytes))].into(),
            gpus: vec![],
        }
    }

    #[test]
    fn encoded_len_is_the_payload_size() {
        let msg = MasterToFramework::Offers(vec![offer(1, 100), offer(2, 3000)]);
        assert_eq!(encoded_len(&msg).unwrap(), encode(&msg).unwrap().len());
    }

    #[test]
    fn a_batch_that_fits_is_one_message() {
        let offers: Vec<Offer> = (0..10).map(|i| offer(i, 100)).collect();
        let split = split_batches(offers.clone(), MasterToFramework::Offers);
        assert!(split.oversized.is_empty());
        assert_eq!(split.batches, vec![MasterToFramework::Offers(offers)]);
    }

    #[test]
    fn offers_past_the_frame_limit_are_split_in_order_and_every_part_encodes() {
        // 200 agents with 22 KB of attributes: ~4.4 MB in one message.
        let offers: Vec<Offer> = (0..200).map(|i| offer(i, 22_000)).collect();
        assert!(matches!(
            encode(&MasterToFramework::Offers(offers.clone())),
            Err(CodecError::TooLarge(_))
        ));
        let split = split_batches(offers.clone(), MasterToFramework::Offers);
        assert!(split.oversized.is_empty());
        assert_eq!(split.batches.len(), 2);
        let mut again = Vec::new();
        for b in &split.batches {
            let bytes = encode(b).unwrap();
            assert!(bytes.len() <= MAX_FRAME);
            match decode::<MasterToFramework>(&bytes).unwrap() {
                MasterToFramework::Offers(o) => again.extend(o),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(again, offers);
    }

    #[test]
    fn an_item_larger_than_a_frame_is_reported_not_sent() {
        let items = vec![offer(1, 10), offer(2, MAX_FRAME), offer(3, 10)];
        let split = split_batches(items, MasterToFramework::Offers);
        assert_eq!(split.oversized.len(), 1);
        assert_eq!(split.oversized[0].id, OfferId::from_u128(2));
        assert_eq!(split.batches.len(), 1);
    }

    proptest::proptest! {
        #[test]
        fn split_respects_any_limit(sizes in proptest::collection::vec(0usize..2000, 0..60), limit in 200usize..8000) {
            let items: Vec<String> = sizes.iter().map(|n| "y".repeat(*n)).collect();
            let split = split_batches_within(items.clone(), limit, |v| FrameworkToMaster::Suppress { roles: v });
            let mut kept = Vec::new();
            for b in &split.batches {
                proptest::prop_assert!(encode(b).unwrap().len() <= limit);
                if let FrameworkToMaster::Suppress { roles } = b {
                    proptest::prop_assert!(!roles.is_empty());
                    kept.extend(roles.iter().cloned());
                }
            }
            let expected: Vec<String> = items.iter().filter(|i| !split.oversized.contains(i)).cloned().collect();
            proptest::prop_assert_eq!(kept, expected);
            for o in &split.oversized {
                let one = FrameworkToMaster::Suppress { roles: vec![o.clone()] };
                let alone = encode(&one).unwrap().len();
                proptest::prop_assert!(alone > limit);
            }
            // No batch could have taken the next one's first item.
            for w in split.batches.windows(2) {
                if let (FrameworkToMaster::Suppress { roles: a }, FrameworkToMaster::Suppress { roles: b }) = (&w[0], &w[1]) {
                    let mut more = a.clone();
                    more.push(b[0].clone());
                    let joined = encode(&FrameworkToMaster::Suppress { roles: more }).unwrap().len();
                    proptest::prop_assert!(joined > limit);
                }
            }
        }
    }

    fn limits(budget: usize, timeout_ms: u64) -> ReadLimits {
        ReadLimits {
            body_timeout: Duration::from_millis(timeout_ms),
            budget: Arc::new(FrameBudget::new(budget)),
        }
    }

    #[tokio::test]
    async fn limited_read_round_trips() {
        let mut buf = Vec::new();
        let msg = MasterToFramework::Offers((0..20).map(|i| offer(i, 10_000)).collect());
        write_frame(&mut buf, &msg).await.unwrap();
        let l = limits(MAX_FRAME, 60_000);
        let mut r = &buf[..];
        let got: MasterToFramework = read_frame_limited(&mut r, &l).await.unwrap();
        assert_eq!(got, msg);
        let s = l.budget.stats();
        assert_eq!((s.reserved_bytes, s.buffered_bytes), (0, 0));
        assert!(s.peak_buffered_bytes >= 200_000);
    }

    #[tokio::test]
    async fn a_stalled_body_times_out_and_releases_what_it_held() {
        let (mut client, mut server) = tokio::io::duplex(1 << 20);
        // Claims 1 MiB, sends 100 KB, then stalls (the writer stays open).
        client.write_all(&(1u32 << 20).to_be_bytes()).await.unwrap();
        client.write_all(&vec![7u8; 100_000]).await.unwrap();
        let l = limits(MAX_FRAME, 200);
        let res: Result<Hello, _> = read_frame_limited(&mut server, &l).await;
        assert!(
            matches!(res, Err(CodecError::BodyTimeout(n, _)) if n == 1 << 20),
            "{res:?}"
        );
        let s = l.budget.stats();
        assert_eq!(s.body_timeouts, 1);
        assert_eq!((s.reserved_bytes, s.buffered_bytes), (0, 0));
        assert!(s.peak_buffered_bytes >= 100_000 && s.peak_buffered_bytes < 1 << 20);
        drop(client);
    }

    #[tokio::test]
    async fn large_bodies_past_the_budget_wait_for_it() {
        // A budget of one frame: a second large frame waits until the first is done.
        let l = limits(MAX_FRAME, 60_000);
        let (mut c1, mut s1) = tokio::io::duplex(1 << 16);
        let (mut c2, mut s2) = tokio::io::duplex(1 << 16);
        c1.write_all(&(MAX_FRAME as u32).to_be_bytes())
            .await
            .unwrap();
        c2.write_all(&(200_000u32).to_be_bytes()).await.unwrap();
        let l1 = l.clone();
        let first =
            tokio::spawn(async move { read_frame_limited::<_, Vec<u8>>(&mut s1, &l1).await });
        while l.budget.stats().reserved_bytes != MAX_FRAME {
            tokio::task::yield_now().await;
        }
        let l2 = l.clone();
        let second =
            tokio::spawn(async move { read_frame_limited::<_, Vec<u8>>(&mut s2, &l2).await });
        while l.budget.stats().waiting_readers != 1 {
            tokio::task::yield_now().await;
        }
        assert_eq!(l.budget.stats().reserved_bytes, MAX_FRAME);
        // The first peer gives up: its reservation returns and the second reader proceeds.
        drop(c1);
        assert!(first.await.unwrap().is_err());
        // 200_000-byte frame carrying a Vec<u8> of 199_995 bytes (5-byte varint length).
        let mut payload = encode(&vec![1u8; 199_995]).unwrap();
        assert_eq!(payload.len(), 200_000);
        c2.write_all(&payload).await.unwrap();
        payload.clear();
        let got = second.await.unwrap().unwrap();
        assert_eq!(got.len(), 199_995);
        let s = l.budget.stats();
        assert_eq!((s.reserved_bytes, s.waiting_readers), (0, 0));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = decode::<FrameworkToMaster>(&bytes);
            let _ = decode::<crate::protocol::AgentToMaster>(&bytes);
        }
    }
}
