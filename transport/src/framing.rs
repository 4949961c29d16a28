//! Reading and writing [`gantry_proto::codec`] frames on async streams (tokio): the length
//! prefix is checked before any of a body is read, and untrusted peers are read under a body
//! deadline and a process-wide [`FrameBudget`] ([`read_frame_limited`]). Encoding itself stays in
//! `gantry_proto::codec`; this module only moves its frames.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gantry_proto::codec::{decode, encode_frame, frame_len, CodecError, MAX_FRAME};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A writer of queued messages (the master's per-peer writer, the agent's session) puts at most
/// this many frames in one stream write ...
pub const WRITE_BATCH: usize = 256;
/// ... or about this many bytes (a write may pass it by one frame).
pub const WRITE_BATCH_BYTES: usize = 256 * 1024;

/// Writes `msg` as one length-prefixed frame.
pub async fn write_frame<W, T>(w: &mut W, msg: &T) -> Result<(), CodecError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    let buf = encode_frame(msg)?;
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

/// [`read_frame`] with a smaller bound than [`MAX_FRAME`] (e.g. [`MAX_HELLO`](gantry_proto::codec::MAX_HELLO)): a length past
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
    let len = frame_len(len, max)?;
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

    /// A snapshot of the budget's counters.
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
    let len = frame_len(len, MAX_FRAME)?;
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
    use gantry_proto::codec::encode;
    use gantry_proto::{
        AgentId, FrameworkId, FrameworkToMaster, Hello, MasterToFramework, Offer, OfferId,
    };

    fn offer(i: u128, attr_bytes: usize) -> Offer {
        Offer {
            id: OfferId::from_u128(i),
            framework_id: FrameworkId::from_u128(1),
            agent_id: AgentId::from_u128(i),
            hostname: format!("host-{i}"),
            role: "r".into(),
            resources: "cpus:4;mem:1024".parse().unwrap(),
            reserved: Default::default(),
            attributes: std::sync::Arc::new([("blob".to_string(), "x".repeat(attr_bytes))].into()),
            gpus: Vec::new().into(),
            gpu_free: vec![],
            agent_name: format!("agent-{i}"),
        }
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
}
