//! Standalone registry persistence in the master's work dir.
//!
//! Layout (all in the work dir):
//! - `registry.json`: a snapshot `{"format":1,"registry":{...}}`, always replaced atomically
//!   (written to a temp file, fsync'd, renamed over the old one, then the directory fsync'd).
//! - `registry.journal`: one JSON line per `apply_all` batch, appended and fsync'd before the
//!   call returns, so each write costs one small append instead of a full rewrite. On open, and
//!   whenever the journal grows past [`COMPACT_AFTER`] lines, the journal is folded into a new
//!   snapshot and truncated. Mutations are idempotent, so a crash between the snapshot rename and
//!   the truncation only replays batches already in the snapshot.
//! - `registry.lock`: an exclusive `flock` so two masters never share one work dir.
//!
//! A snapshot or journal line that does not decode is reported as [`RegistryError::Corrupt`] and
//! left untouched for the operator. The one exception is an unterminated final journal line that
//! does not decode: that is a write torn by a crash, never acknowledged, and is cut off.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use super::{Fence, Mutation, Registry, RegistryError};

/// Snapshot file name inside the work dir.
pub const SNAPSHOT_FILE: &str = "registry.json";
/// Journal file name inside the work dir.
pub const JOURNAL_FILE: &str = "registry.journal";
/// Lock file name inside the work dir.
pub const LOCK_FILE: &str = "registry.lock";
/// Journal lines after which the journal is folded into the snapshot.
pub const COMPACT_AFTER: usize = 4096;

const FORMAT: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Snapshot {
    format: u32,
    registry: Registry,
}

struct Inner {
    dir: PathBuf,
    registry: Registry,
    journal: File,
    journal_lines: usize,
    fence: Option<Fence>,
    /// Held for the store's lifetime: the `flock` is released when it closes.
    _lock: File,
}

/// The work-dir registry of a standalone master. Cheap to clone (shared state).
#[derive(Clone)]
pub struct FileStore {
    inner: Arc<Mutex<Inner>>,
}

fn io_err(path: &Path, source: std::io::Error) -> RegistryError {
    RegistryError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn fsync_dir(dir: &Path) -> Result<(), RegistryError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err(dir, e))
}

impl FileStore {
    /// Opens (creating if needed) the registry in `dir`, replays the journal, and compacts it.
    /// Fails with `Corrupt` (touching nothing) if the snapshot or a journal line is damaged.
    pub fn open(dir: impl AsRef<Path>) -> Result<FileStore, RegistryError> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        let lock = lock_dir(&dir)?;
        let mut registry = read_snapshot(&dir)?;
        let journal_path = dir.join(JOURNAL_FILE);
        let (batches, valid_len) = read_journal(&journal_path)?;
        for batch in &batches {
            for m in batch {
                registry.apply(m);
            }
        }
        let journal = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode(0o600)
            .open(&journal_path)
            .map_err(|e| io_err(&journal_path, e))?;
        // A journal written by an older master may be readable by others: it holds every
        // framework's principal and role.
        journal
            .set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| io_err(&journal_path, e))?;
        if let Some(len) = valid_len {
            // Cut off a torn final line left by a crash.
            journal.set_len(len).map_err(|e| io_err(&journal_path, e))?;
            journal.sync_all().map_err(|e| io_err(&journal_path, e))?;
        }
        let mut inner = Inner {
            dir,
            registry,
            journal,
            journal_lines: batches.len(),
            fence: None,
            _lock: lock,
        };
        if inner.journal_lines > 0 {
            inner.compact()?;
        }
        Ok(FileStore {
            inner: Arc::new(Mutex::new(inner)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The registry as persisted.
    pub async fn load(&self) -> Result<Registry, RegistryError> {
        Ok(self.lock().registry.clone())
    }

    /// Allows writes (standalone leadership).
    pub fn set_fence(&self, fence: Fence) {
        self.lock().fence = Some(fence);
    }

    /// Refuses writes from now on.
    pub fn clear_fence(&self) {
        self.lock().fence = None;
    }

    /// Appends the batch to the journal and fsyncs it before returning.
    pub async fn apply_all(&self, mutations: &[Mutation]) -> Result<(), RegistryError> {
        let store = self.clone();
        let batch = mutations.to_vec();
        tokio::task::spawn_blocking(move || store.apply_blocking(&batch))
            .await
            .map_err(|e| RegistryError::Io {
                path: "registry".into(),
                source: std::io::Error::other(e.to_string()),
            })?
    }

    /// The synchronous body of [`FileStore::apply_all`].
    pub fn apply_blocking(&self, mutations: &[Mutation]) -> Result<(), RegistryError> {
        let mut inner = self.lock();
        if inner.fence.is_none() {
            return Err(RegistryError::Fenced(
                "no leadership fence installed".into(),
            ));
        }
        let mut line =
            serde_json::to_vec(mutations).map_err(|e| RegistryError::Invalid(e.to_string()))?;
        line.push(b'\n');
        let path = inner.dir.join(JOURNAL_FILE);
        inner
            .journal
            .write_all(&line)
            .and_then(|_| inner.journal.sync_data())
            .map_err(|e| io_err(&path, e))?;
        for m in mutations {
            inner.registry.apply(m);
        }
        inner.journal_lines += 1;
        if inner.journal_lines >= COMPACT_AFTER {
            inner.compact()?;
        }
        Ok(())
    }
}

impl Inner {
    /// Writes a fresh snapshot atomically and empties the journal.
    fn compact(&mut self) -> Result<(), RegistryError> {
        write_snapshot(&self.dir, &self.registry)?;
        let path = self.dir.join(JOURNAL_FILE);
        self.journal
            .set_len(0)
            .and_then(|_| self.journal.sync_all())
            .map_err(|e| io_err(&path, e))?;
        self.journal_lines = 0;
        Ok(())
    }
}

fn lock_dir(dir: &Path) -> Result<File, RegistryError> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| io_err(&path, e))?;
    // SAFETY: flock on a file descriptor we own; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(io_err(
            &path,
            std::io::Error::new(
                e.kind(),
                format!("work dir is already used by another running master ({e})"),
            ),
        ));
    }
    Ok(file)
}

fn read_snapshot(dir: &Path) -> Result<Registry, RegistryError> {
    let path = dir.join(SNAPSHOT_FILE);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Registry::default()),
        Err(e) => return Err(io_err(&path, e)),
    };
    let snap: Snapshot = serde_json::from_slice(&text).map_err(|e| RegistryError::Corrupt {
        location: path.display().to_string(),
        reason: e.to_string(),
    })?;
    if snap.format != FORMAT {
        return Err(RegistryError::Corrupt {
            location: path.display().to_string(),
            reason: format!(
                "unknown snapshot format {} (expected {FORMAT})",
                snap.format
            ),
        });
    }
    Ok(snap.registry)
}

/// The journal's batches, and `Some(len)` when a torn final line must be cut at `len`.
fn read_journal(path: &Path) -> Result<(Vec<Vec<Mutation>>, Option<u64>), RegistryError> {
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut f) => {
            f.read_to_end(&mut bytes).map_err(|e| io_err(path, e))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), None)),
        Err(e) => return Err(io_err(path, e)),
    }
    let mut batches = Vec::new();
    let mut offset = 0usize;
    let mut line_no = 0usize;
    while offset < bytes.len() {
        line_no += 1;
        let rest = &bytes[offset..];
        let (line, terminated) = match rest.iter().position(|b| *b == b'\n') {
            Some(i) => (&rest[..i], true),
            None => (rest, false),
        };
        match serde_json::from_slice::<Vec<Mutation>>(line) {
            Ok(batch) => batches.push(batch),
            Err(_) if !terminated => return Ok((batches, Some(offset as u64))),
            Err(e) => {
                return Err(RegistryError::Corrupt {
                    location: format!("{} line {line_no}", path.display()),
                    reason: e.to_string(),
                })
            }
        }
        offset += line.len() + usize::from(terminated);
    }
    Ok((batches, None))
}

fn write_snapshot(dir: &Path, registry: &Registry) -> Result<(), RegistryError> {
    let path = dir.join(SNAPSHOT_FILE);
    let tmp = dir.join(format!("{SNAPSHOT_FILE}.tmp"));
    let snap = Snapshot {
        format: FORMAT,
        registry: registry.clone(),
    };
    let text =
        serde_json::to_vec_pretty(&snap).map_err(|e| RegistryError::Invalid(e.to_string()))?;
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| io_err(&tmp, e))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| io_err(&tmp, e))?;
    f.write_all(&text)
        .and_then(|_| f.sync_all())
        .map_err(|e| io_err(&tmp, e))?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(|e| io_err(&path, e))?;
    fsync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::tests::sample;

    #[tokio::test]
    async fn writes_survive_reopen_via_journal_and_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let want = sample();
        {
            let store = FileStore::open(dir.path()).unwrap();
            store.set_fence(Fence::Standalone);
            for m in want.to_mutations() {
                store.apply_all(&[m]).await.unwrap();
            }
            assert_eq!(store.load().await.unwrap(), want);
            let journal = std::fs::read_to_string(dir.path().join(JOURNAL_FILE)).unwrap();
            assert_eq!(journal.lines().count(), want.to_mutations().len());
        }
        let store = FileStore::open(dir.path()).unwrap();
        assert_eq!(store.load().await.unwrap(), want);
        // Opening compacted the journal into the snapshot.
        assert_eq!(
            std::fs::metadata(dir.path().join(JOURNAL_FILE))
                .unwrap()
                .len(),
            0
        );
        let snap = std::fs::read_to_string(dir.path().join(SNAPSHOT_FILE)).unwrap();
        assert!(snap.contains("batch-principal"));
        for f in [SNAPSHOT_FILE, JOURNAL_FILE] {
            let mode = std::fs::metadata(dir.path().join(f))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{f} is private to the master");
        }
    }

    #[tokio::test]
    async fn unfenced_writes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path()).unwrap();
        let m = sample().to_mutations();
        assert!(matches!(
            store.apply_all(&m).await,
            Err(RegistryError::Fenced(_))
        ));
        store.set_fence(Fence::Standalone);
        store.apply_all(&m).await.unwrap();
        store.clear_fence();
        assert!(matches!(
            store.apply_all(&m).await,
            Err(RegistryError::Fenced(_))
        ));
    }

    #[test]
    fn torn_final_line_is_cut_but_a_bad_middle_line_is_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let good = serde_json::to_string(&sample().to_mutations()).unwrap();
        let journal = dir.path().join(JOURNAL_FILE);
        std::fs::write(&journal, format!("{good}\n{{\"PutAg")).unwrap();
        let store = FileStore::open(dir.path()).unwrap();
        drop(store);
        assert_eq!(std::fs::metadata(&journal).unwrap().len(), 0, "compacted");

        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join(JOURNAL_FILE);
        let bad = format!("{good}\nnot json\n{good}\n");
        std::fs::write(&journal, &bad).unwrap();
        let err = FileStore::open(dir.path()).err().expect("corrupt");
        assert!(matches!(err, RegistryError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("line 2"), "{err}");
        assert_eq!(std::fs::read_to_string(&journal).unwrap(), bad, "untouched");
    }

    #[test]
    fn second_open_of_the_same_dir_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _first = FileStore::open(dir.path()).unwrap();
        let err = FileStore::open(dir.path()).err().expect("locked");
        assert!(err.to_string().contains("another running master"), "{err}");
    }
}
