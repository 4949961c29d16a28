//! The one place that knows how messages become bytes.
//!
//! A frame is a 4-byte big-endian length followed by that many bytes of bincode (1.3, pinned;
//! varint integers, little endian). Frames are bounded by [`MAX_FRAME`]; decoding rejects
//! trailing bytes. Swapping the encoding means changing this module only.

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
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    decode(&body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{FrameworkToMaster, Hello, PeerKind, PROTOCOL_VERSION};

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

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = decode::<FrameworkToMaster>(&bytes);
            let _ = decode::<crate::protocol::AgentToMaster>(&bytes);
        }
    }
}
