//! The one place that knows how messages become bytes.
//!
//! A frame is a 4-byte big-endian length followed by that many bytes of bincode (1.3, pinned;
//! varint integers, little endian). Frames are bounded by [`MAX_FRAME`]; decoding rejects
//! trailing bytes. Swapping the encoding means changing this module only.
//!
//! - Writing: [`encode`] / [`encode_frame`] / [`encode_frame_into`] (appending to a reused
//!   buffer) refuse a message over the bound; [`encoded_len`]
//!   tells a sender the size in advance and [`split_batches`] cuts a list-carrying message
//!   into as many messages as needed so that none exceeds it.
//! - Reading: [`frame_len`] checks a frame's length prefix before any of its body is read;
//!   [`decode`] turns the body into a message.
//!
//! No I/O here: `gantry_transport::framing` moves these frames over async streams (and reads
//! untrusted peers under a body deadline and a shared budget).

use std::time::Duration;

use bincode::Options;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The largest frame payload accepted or produced: 4 MiB.
pub const MAX_FRAME: usize = 4 * 1024 * 1024;

/// What can go wrong reading or writing a frame.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    /// A frame (or its announced length) past the bound.
    TooLarge(usize),
    #[error("malformed frame: {0}")]
    /// Bytes that do not decode to the expected message.
    Malformed(String),
    #[error("connection closed")]
    /// The stream ended cleanly before a frame started.
    Closed,
    #[error("the body of a {0}-byte frame did not arrive within {1:?}")]
    /// A frame body did not arrive within the reader's deadline.
    BodyTimeout(usize, Duration),
    #[error("i/o error: {0}")]
    /// Reading or writing the stream failed.
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
    /// The messages to send, in order, each within the bound.
    pub batches: Vec<M>,
    /// Items too large for a frame even alone (never sent).
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

/// The largest first frame (the [`Hello`](crate::Hello)) a master reads.
pub const MAX_HELLO: usize = 1024;

/// The 4-byte big-endian length prefix followed by `msg`'s payload: one whole frame, ready to
/// write. Refuses a message over [`MAX_FRAME`].
pub fn encode_frame<T: Serialize>(msg: &T) -> Result<Vec<u8>, CodecError> {
    let mut buf = Vec::new();
    encode_frame_into(&mut buf, msg)?;
    Ok(buf)
}

/// Appends `msg` as one whole frame (the bytes [`encode_frame`] makes) to `buf`, in one pass
/// over `msg` and without a buffer of its own: a sender batching many messages reuses `buf`.
/// A message over [`MAX_FRAME`] is refused once that many bytes are written, and `buf` is left
/// as it was.
pub fn encode_frame_into<T: Serialize>(buf: &mut Vec<u8>, msg: &T) -> Result<(), CodecError> {
    /// Appends to the frame's buffer up to `left` bytes, then refuses.
    struct Bounded<'a> {
        buf: &'a mut Vec<u8>,
        left: usize,
        over: bool,
    }
    impl std::io::Write for Bounded<'_> {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            if data.len() > self.left {
                self.over = true;
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            self.left -= data.len();
            self.buf.extend_from_slice(data);
            Ok(data.len())
        }
        // bincode writes every field with `write_all`: one check and one copy each.
        #[inline]
        fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
            if data.len() > self.left {
                self.over = true;
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            self.left -= data.len();
            self.buf.extend_from_slice(data);
            Ok(())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    let mut w = Bounded {
        buf,
        left: MAX_FRAME,
        over: false,
    };
    // The same encoding as `options()` (the limit and trailing-bytes settings change no byte);
    // the bound is the writer's, so the message is walked once, not measured first.
    let written = bincode::DefaultOptions::new()
        .with_little_endian()
        .with_varint_encoding()
        .serialize_into(&mut w, msg);
    let over = w.over;
    if let Err(e) = written {
        buf.truncate(start);
        return Err(if over {
            CodecError::TooLarge(MAX_FRAME + 1)
        } else {
            CodecError::Malformed(e.to_string())
        });
    }
    let len = buf.len() - start - 4;
    // At most MAX_FRAME, which fits a u32.
    buf[start..start + 4].copy_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    Ok(())
}

/// The body length a frame's 4-byte prefix announces, or [`CodecError::TooLarge`] when it is
/// past `max` (and always past [`MAX_FRAME`]): readers check it before reading any of the body.
pub fn frame_len(prefix: [u8; 4], max: usize) -> Result<usize, CodecError> {
    let len = u32::from_be_bytes(prefix) as usize;
    if len > max.min(MAX_FRAME) {
        return Err(CodecError::TooLarge(len));
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
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
            agent_name: "a".into(),
        }
    }

    #[test]
    fn shared_offer_parts_travel_as_plain_map_and_list() {
        // The wire form of `Arc<Attributes>` / `Arc<[GpuInfo]>` is that of the plain types.
        use crate::messages::GpuInfo;
        #[derive(serde::Serialize)]
        struct Plain {
            attributes: crate::messages::Attributes,
            gpus: Vec<GpuInfo>,
        }
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct Shared {
            #[serde(with = "crate::messages::shared_map")]
            attributes: std::sync::Arc<crate::messages::Attributes>,
            #[serde(with = "crate::messages::shared_list")]
            gpus: std::sync::Arc<[GpuInfo]>,
        }
        let gpu = GpuInfo {
            uuid: "GPU-1".into(),
            name: "A100".into(),
            memory_mib: 80,
            compute_capability: (8, 0),
            minor: 0,
            pci_bus_id: "0".into(),
            numa_node: None,
            pci_root: None,
            healthy: true,
            mig_profile: None,
            parent_uuid: None,
        };
        let attributes: crate::messages::Attributes =
            [("rack".to_string(), "r1".to_string())].into();
        let plain = encode(&Plain {
            attributes: attributes.clone(),
            gpus: vec![gpu.clone(), gpu.clone()],
        })
        .unwrap();
        let shared = Shared {
            attributes: std::sync::Arc::new(attributes),
            gpus: vec![gpu.clone(), gpu].into(),
        };
        assert_eq!(encode(&shared).unwrap(), plain);
        assert_eq!(decode::<Shared>(&plain).unwrap(), shared);
    }

    #[test]
    fn encoded_len_is_the_payload_size() {
        let msg = MasterToFramework::Offers(vec![offer(1, 100), offer(2, 3000)]);
        assert_eq!(encoded_len(&msg).unwrap(), encode(&msg).unwrap().len());
    }

    #[test]
    fn frames_appended_to_a_buffer_are_the_prefix_and_payload() {
        let a = MasterToFramework::Offers(vec![offer(1, 100), offer(2, 3000)]);
        let b = MasterToFramework::Heartbeat;
        let mut buf = vec![7u8];
        encode_frame_into(&mut buf, &a).unwrap();
        encode_frame_into(&mut buf, &b).unwrap();
        let mut expected = vec![7u8];
        for payload in [encode(&a).unwrap(), encode(&b).unwrap()] {
            expected.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            expected.extend_from_slice(&payload);
        }
        assert_eq!(buf, expected);
        assert_eq!(
            encode_frame(&a).unwrap(),
            expected[1..][..expected.len() - 6]
        );
        // Over the bound: refused, and the buffer is as it was.
        let big = MasterToFramework::Offers((0..200).map(|i| offer(i, 22_000)).collect());
        let before = buf.clone();
        assert!(matches!(
            encode_frame_into(&mut buf, &big),
            Err(CodecError::TooLarge(_))
        ));
        assert_eq!(buf, before);
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

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = decode::<FrameworkToMaster>(&bytes);
            let _ = decode::<crate::AgentToMaster>(&bytes);
        }
    }
}
