//! The agent's write-ahead log: persistence whose cost does not grow with the number of tasks.
//!
//! State lives in two kinds of files in the work directory:
//! - `checkpoint.json`: a snapshot ([`Checkpoint`]) of everything up to log generation
//!   `log_gen` (exclusive), written atomically (temp file, fsync, rename, directory fsync);
//! - `wal-GEN.log`: append-only logs of changes ([`Record`]s), one frame per committed batch:
//!   `[len: u32 LE][crc32 of payload: u32 LE][payload: JSON array of records]`.
//!
//! **Group commit**: the agent appends the records of every change it makes while handling a
//! burst of events ([`Wal::append`]) and commits them with one `write` and one `fdatasync` per
//! batch ([`Wal::commit`]), before any message or launch the batch produced leaves the agent.
//! A batch is one frame, so it is all or nothing on disk.
//!
//! **Commit pipeline**: the agent's loop does not wait for the `fdatasync`. It writes the frame
//! ([`Wal::write`]) and hands a [`SyncJob`] ([`Wal::sync_job`]) to a blocking thread; what the
//! batch produced is held until that sync is done ([`Wal::synced`]). While one sync runs the
//! loop goes on handling inputs and writing frames; their messages and launches wait for the
//! next sync, started when the running one ends, which covers every frame written meanwhile.
//!
//! **Compaction** runs in the background: the log rotates to a new generation
//! ([`Wal::rotate`]), a copy of the state is written as the snapshot of that generation on a
//! blocking thread ([`write_snapshot`]), and only then are the older logs deleted.
//!
//! **Recovery** ([`Wal::open`]) loads the snapshot and replays the logs of its generation and
//! later ones in order. A torn last frame (the agent died inside a `write`: a frame cut short
//! or failing its checksum with no valid frame after it) is dropped: nothing it protected had
//! been sent. A frame that fails its checksum with valid frames after it is corruption in the
//! middle of the log, not a torn write: recovery reports it with its offset
//! ([`CheckpointError::MidLogCorruption`]) and the agent refuses to start, unless the operator
//! passes `--recover-truncate` ([`Recovery::Truncate`]): then replay stops at that frame, what
//! is dropped (bytes, frames, later logs) is logged, and the agent starts from the state before
//! it. The recovered state is written as a fresh snapshot at once, so the agent always starts
//! from one snapshot and an empty log.
//!
//! The records ([`Record`]) are the core's ([`crate::core::types`]); this module frames, writes
//! and replays them.
//!
//! A checkpoint written before the log existed has no `log_gen` (0) and no logs: it loads as it
//! did.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::checkpoint::{Checkpoint, CheckpointError};
pub use crate::core::types::Record;

/// Log size past which the agent compacts it into a snapshot.
pub const COMPACT_BYTES: u64 = 8 << 20;

const HEADER: usize = 8;
const LOG_PREFIX: &str = "wal-";
const LOG_SUFFIX: &str = ".log";

fn log_path(dir: &Path, gen: u64) -> PathBuf {
    dir.join(format!("{LOG_PREFIX}{gen:020}{LOG_SUFFIX}"))
}

/// The generations of the logs in `dir`, oldest first.
fn log_gens(dir: &Path) -> Result<Vec<u64>, CheckpointError> {
    let io = |source| CheckpointError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut gens = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io)? {
        let name = e.map_err(io)?.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(g) = name
            .strip_prefix(LOG_PREFIX)
            .and_then(|n| n.strip_suffix(LOG_SUFFIX))
            .and_then(|n| n.parse::<u64>().ok())
        {
            gens.push(g);
        }
    }
    gens.sort_unstable();
    Ok(gens)
}

fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| CheckpointError::Io {
            path: dir.to_path_buf(),
            source,
        })
}

/// Encodes one batch as a frame.
pub fn encode_frame(records: &[Record], out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER]);
    // Records are plain data: serializing them to a Vec cannot fail.
    if serde_json::to_writer(&mut *out, records).is_err() {
        out.truncate(start);
        return;
    }
    let len = (out.len() - start - HEADER) as u32;
    let crc = crc32fast::hash(&out[start + HEADER..]);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
}

/// What decoding a log found.
#[derive(Debug, Default, PartialEq)]
pub struct Decoded {
    /// The batches of the whole frames before any torn write or corruption.
    pub batches: Vec<Vec<Record>>,
    /// Bytes after the last whole frame (a torn write), dropped.
    pub torn_bytes: usize,
    /// A corrupt frame in the middle of the log: the batches stop before it.
    pub corrupt: Option<Corruption>,
}

/// A frame failing its checksum with valid frames after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    /// Where the corrupt frame starts (bytes into the log).
    pub offset: u64,
    /// Bytes from it to the end of the log.
    pub dropped_bytes: u64,
    /// Valid frames found after it (from the first one on, back to back).
    pub frames_after: usize,
}

/// What [`Wal::open`] does with a corrupt frame in the middle of a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Recovery {
    /// Refuse ([`CheckpointError::MidLogCorruption`]): the operator decides.
    #[default]
    Refuse,
    /// Replay up to the corrupt frame and drop the rest (`--recover-truncate`).
    Truncate,
}

/// The payload of the frame at `data[at..]` when it is whole and its checksum holds.
fn frame_at(data: &[u8], at: usize) -> Option<&[u8]> {
    let rest = data.get(at..)?;
    if rest.len() < HEADER {
        return None;
    }
    let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
    let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
    let payload = rest.get(HEADER..HEADER.checked_add(len)?)?;
    (crc32fast::hash(payload) == crc).then_some(payload)
}

/// Whether a valid-looking frame starts at `at`: whole, non-empty (zeros a crash left past the
/// end of a file are not frames), its checksum holding and its records parsing.
fn plausible_frame_at(data: &[u8], at: usize) -> Option<usize> {
    let payload = frame_at(data, at).filter(|p| !p.is_empty())?;
    serde_json::from_slice::<Vec<Record>>(payload).ok()?;
    Some(at + HEADER + payload.len())
}

/// After a bad frame at `bad`: the first valid-looking frame past it, and how many follow
/// back to back from there (`None`: nothing valid after it, a torn write).
fn frames_after(data: &[u8], bad: usize) -> Option<usize> {
    let first = (bad + 1..data.len().saturating_sub(HEADER - 1))
        .find(|&at| plausible_frame_at(data, at).is_some())?;
    let mut n = 0;
    let mut at = first;
    while let Some(end) = plausible_frame_at(data, at) {
        n += 1;
        at = end;
    }
    Some(n)
}

/// Decodes the frames of one log. A frame that is cut short or fails its checksum with no valid
/// frame after it ends the log (a torn write: nothing after it was committed); one with valid
/// frames after it is corruption in the middle of the log ([`Decoded::corrupt`]); a frame whose
/// checksum holds but whose records do not parse is corruption too (an error).
pub fn decode_log(path: &Path, data: &[u8]) -> Result<Decoded, CheckpointError> {
    let mut out = Decoded::default();
    let mut at = 0;
    while at < data.len() {
        let rest = &data[at..];
        let Some(payload) = frame_at(data, at) else {
            match frames_after(data, at) {
                Some(n) => {
                    out.corrupt = Some(Corruption {
                        offset: at as u64,
                        dropped_bytes: rest.len() as u64,
                        frames_after: n,
                    })
                }
                None => out.torn_bytes = rest.len(),
            }
            break;
        };
        let batch: Vec<Record> =
            serde_json::from_slice(payload).map_err(|source| CheckpointError::Corrupt {
                path: path.to_path_buf(),
                source,
            })?;
        out.batches.push(batch);
        at += HEADER + payload.len();
    }
    Ok(out)
}

/// Writes `ckpt` as the snapshot of its generation `ckpt.log_gen` (atomically, durably), then
/// deletes the logs it covers (older generations). Blocking: compaction runs it off the event
/// loop.
pub fn write_snapshot(dir: &Path, ckpt: &Checkpoint) -> Result<(), CheckpointError> {
    ckpt.save(dir)?;
    sync_dir(dir)?;
    for g in log_gens(dir)? {
        if g < ckpt.log_gen {
            let path = log_path(dir, g);
            std::fs::remove_file(&path).map_err(|source| CheckpointError::Io { path, source })?;
        }
    }
    Ok(())
}

/// The open log the agent appends to.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    gen: u64,
    file: File,
    /// Records appended since the last commit.
    pending: Vec<Record>,
    buf: Vec<u8>,
    /// Bytes in the current log.
    size: u64,
    /// Bytes of the current log known durable (synced); `size` beyond it is not yet.
    synced_size: u64,
    /// Frames written and `fdatasync`s done by this agent run (all generations).
    stats: WalStats,
}

/// What a [`Wal`] did in this agent run: frames written and `fdatasync`s (the agent logs them at
/// shutdown; `scripts/bench-launch.sh` prints the syncs per task).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalStats {
    pub frames: u64,
    pub syncs: u64,
}

impl Wal {
    /// Recovers the state in `dir` (snapshot + logs), writes it as a fresh snapshot and opens
    /// a new, empty log after it.
    /// A corrupt frame in the middle of a log is refused or, with [`Recovery::Truncate`], ends
    /// the replay (later logs are dropped too).
    pub fn open(dir: &Path, recovery: Recovery) -> Result<(Checkpoint, Wal), CheckpointError> {
        let mut ckpt = Checkpoint::load(dir)?.unwrap_or_default();
        let gens = log_gens(dir)?;
        let mut replayed = 0usize;
        let first = ckpt.log_gen;
        let mut truncated_at: Option<u64> = None;
        for &g in gens.iter().filter(|&&g| g >= first) {
            if let Some(at) = truncated_at {
                tracing::warn!(
                    log = %log_path(dir, g).display(),
                    "--recover-truncate: dropping a whole log written after the corrupt frame in generation {at}"
                );
                continue;
            }
            let path = log_path(dir, g);
            let data = std::fs::read(&path).map_err(|source| CheckpointError::Io {
                path: path.clone(),
                source,
            })?;
            let decoded = decode_log(&path, &data)?;
            if decoded.torn_bytes > 0 {
                tracing::warn!(
                    log = %path.display(),
                    bytes = decoded.torn_bytes,
                    "dropping a torn write at the end of the agent's log (nothing it held had been sent)"
                );
            }
            if let Some(c) = &decoded.corrupt {
                if recovery == Recovery::Refuse {
                    return Err(CheckpointError::MidLogCorruption {
                        path,
                        offset: c.offset,
                        dropped_bytes: c.dropped_bytes,
                        frames_after: c.frames_after,
                    });
                }
                tracing::warn!(
                    log = %path.display(),
                    offset = c.offset,
                    dropped_bytes = c.dropped_bytes,
                    frames_after = c.frames_after,
                    kept_batches = decoded.batches.len(),
                    "--recover-truncate: corrupt frame in the middle of the agent's log; replaying up to it and dropping everything from it on"
                );
                truncated_at = Some(g);
            }
            for batch in decoded.batches {
                replayed += batch.len();
                for r in batch {
                    r.apply(&mut ckpt);
                }
            }
        }
        if replayed > 0 {
            tracing::info!(records = replayed, "replayed the agent's write-ahead log");
        }
        let gen = gens
            .last()
            .map_or(ckpt.log_gen, |g| g + 1)
            .max(ckpt.log_gen)
            + 1;
        ckpt.log_gen = gen;
        write_snapshot(dir, &ckpt)?;
        let wal = Wal::create(dir, gen)?;
        Ok((ckpt, wal))
    }

    fn create(dir: &Path, gen: u64) -> Result<Wal, CheckpointError> {
        let path = log_path(dir, gen);
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)
            .and_then(|f| {
                f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
                Ok(f)
            })
            .map_err(|source| CheckpointError::Io { path, source })?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        sync_dir(dir)?;
        Ok(Wal {
            dir: dir.to_path_buf(),
            gen,
            file,
            pending: Vec::new(),
            buf: Vec::new(),
            size,
            synced_size: size,
            stats: WalStats::default(),
        })
    }

    /// Queues a change for the next commit.
    pub fn append(&mut self, record: Record) {
        self.pending.push(record);
    }

    /// True if changes wait for a commit.
    pub fn is_dirty(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Writes the pending changes as one frame and syncs it (one `fdatasync` per batch; it
    /// also makes durable any frame [`Wal::write`] left unsynced).
    pub fn commit(&mut self) -> Result<usize, CheckpointError> {
        if self.pending.is_empty() {
            if self.size > self.synced_size {
                self.sync()?;
            }
            return Ok(0);
        }
        let n = self.write()?;
        self.sync()?;
        Ok(n)
    }

    /// Writes the pending changes as one frame without syncing it: for changes nothing sent or
    /// started depends on (acknowledgements). The frame survives the agent's own crash (it is
    /// in the kernel's page cache); the next [`Wal::commit`] makes it durable against the
    /// machine's. Losing it to a power cut loses nothing that was promised: an update whose
    /// acknowledgement was lost is sent again, and updates are delivered at least once.
    pub fn write(&mut self) -> Result<usize, CheckpointError> {
        if self.pending.is_empty() {
            return Ok(0);
        }
        self.buf.clear();
        encode_frame(&self.pending, &mut self.buf);
        let path = log_path(&self.dir, self.gen);
        let io = |source| CheckpointError::Io {
            path: path.clone(),
            source,
        };
        self.file.write_all(&self.buf).map_err(io)?;
        self.stats.frames += 1;
        self.size += self.buf.len() as u64;
        let n = self.pending.len();
        self.pending.clear();
        // A burst can grow the buffer a lot: do not keep megabytes for the quiet times.
        if self.buf.capacity() > 1 << 20 {
            self.buf = Vec::new();
        }
        Ok(n)
    }

    /// `fdatasync` of what was written.
    fn sync(&mut self) -> Result<(), CheckpointError> {
        self.file
            .sync_data()
            .map_err(|source| CheckpointError::Io {
                path: log_path(&self.dir, self.gen),
                source,
            })?;
        self.synced_size = self.size;
        self.stats.syncs += 1;
        Ok(())
    }

    /// A sync of everything written so far, to run off the agent's loop ([`SyncJob::run`],
    /// blocking); [`Wal::synced`] takes its result.
    pub fn sync_job(&self) -> Result<SyncJob, CheckpointError> {
        let path = log_path(&self.dir, self.gen);
        let file = self
            .file
            .try_clone()
            .map_err(|source| CheckpointError::Io {
                path: path.clone(),
                source,
            })?;
        Ok(SyncJob {
            file,
            path,
            gen: self.gen,
            size: self.size,
        })
    }

    /// A [`SyncJob`] finished: what it covered is durable. (A job of an earlier generation
    /// covers nothing of this log: [`Wal::rotate`] synced the old one before starting this.)
    pub fn synced(&mut self, done: Synced) {
        self.stats.syncs += 1;
        if done.gen == self.gen {
            self.synced_size = self.synced_size.max(done.size);
        }
    }

    /// Frames written and syncs done by this agent run.
    pub fn stats(&self) -> WalStats {
        self.stats
    }

    /// Bytes in the current log.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The current log's generation.
    pub fn generation(&self) -> u64 {
        self.gen
    }

    /// Starts a new log (after a commit: nothing may be pending). Returns its generation: the
    /// state as of now is the snapshot of that generation ([`write_snapshot`]).
    pub fn rotate(&mut self) -> Result<u64, CheckpointError> {
        debug_assert!(self.pending.is_empty());
        if self.size > self.synced_size {
            self.sync()?;
        }
        let stats = self.stats;
        let next = Wal::create(&self.dir, self.gen + 1)?;
        *self = next;
        self.stats = stats;
        Ok(self.gen)
    }
}

/// An `fdatasync` of the log up to where it was written when the job was made
/// ([`Wal::sync_job`]), run on a thread of its own.
#[derive(Debug)]
pub struct SyncJob {
    file: File,
    path: PathBuf,
    gen: u64,
    size: u64,
}

/// What a finished [`SyncJob`] made durable: the log `gen` up to `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Synced {
    gen: u64,
    size: u64,
}

impl SyncJob {
    /// Syncs (blocking). Everything written to the log before [`Wal::sync_job`] is durable
    /// once this returns `Ok`.
    pub fn run(self) -> Result<Synced, CheckpointError> {
        self.file
            .sync_data()
            .map_err(|source| CheckpointError::Io {
                path: self.path,
                source,
            })?;
        Ok(Synced {
            gen: self.gen,
            size: self.size,
        })
    }
}

#[cfg(test)]
mod tests;
