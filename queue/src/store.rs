//! The queue's durable store: one [redb](https://docs.rs/redb) database file (`--store PATH`).
//!
//! redb is an embedded, ACID key-value store in pure Rust (copy-on-write B-trees; a commit is
//! durable when [`Store::commit`] returns, and a crash at any moment leaves the last committed
//! state). Tables:
//!
//! | table        | key              | value                                               |
//! |--------------|------------------|-----------------------------------------------------|
//! | `meta`       | name             | `schema_version`, `next_id` (u64)                   |
//! | `meta_text`  | name             | `framework_id` (the framework to fail over as)      |
//! | `jobs`       | job id           | [`JobRecord`] as JSON (spec, user, state, attempts, workers) |
//! | `usage`      | sequence number  | [`UsageRecord`] as JSON (one per worker that ended) |
//! | `team_usage` | team             | GPU-seconds so far (the sum of its usage records)   |
//!
//! The schema is versioned ([`SCHEMA_VERSION`]): a store written by a newer `gantry-queue` is
//! refused with both versions named, one from an older schema is migrated on open or refused
//! when no migration exists. Version 2 (fractions of a GPU) writes a job's `gpus` and a usage
//! record's `gpus` as a decimal when they are a fraction (`0.5`); version 1 wrote integers,
//! which version 2 reads as they are, so a version-1 store is migrated by stamping it 2 (an
//! older `gantry-queue` then refuses it rather than failing on a fraction).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gantry_sdk::protocol::FrameworkId;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::core::Changes;
use crate::model::{JobRecord, UsageRecord};

/// The schema this build writes.
pub const SCHEMA_VERSION: u64 = 2;

/// What [`Store::load`] reads of a job record first: whether it ended.
#[derive(serde::Deserialize)]
struct Head {
    state: crate::model::JobState,
    #[serde(default)]
    members: Vec<serde::de::IgnoredAny>,
}

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const META_TEXT: TableDefinition<&str, &str> = TableDefinition::new("meta_text");
const JOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("jobs");
const USAGE: TableDefinition<u64, &[u8]> = TableDefinition::new("usage");
const TEAM_USAGE: TableDefinition<&str, f64> = TableDefinition::new("team_usage");

/// Why the store cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another process has it open.
    #[error("store {0}: already open in another process (one gantry-queue per store)")]
    InUse(PathBuf),
    /// Written by a newer `gantry-queue`.
    #[error(
        "store {path}: schema version {found} is newer than this gantry-queue's ({supported}); \
         run a gantry-queue at least as new as the one that wrote it"
    )]
    Newer {
        /// The store.
        path: PathBuf,
        /// Its version.
        found: u64,
        /// This build's.
        supported: u64,
    },
    /// Written by an older `gantry-queue` with no migration to this one.
    #[error(
        "store {path}: schema version {found} is older than this gantry-queue's ({supported}) \
         and cannot be migrated; open it with the gantry-queue that wrote it"
    )]
    Older {
        /// The store.
        path: PathBuf,
        /// Its version.
        found: u64,
        /// This build's.
        supported: u64,
    },
    /// A record does not decode.
    #[error("store {path}: {what} does not decode: {error}")]
    Corrupt {
        /// The store.
        path: PathBuf,
        /// Which record.
        what: String,
        /// The decoder's error.
        error: String,
    },
    /// The database failed.
    #[error("store {path}: {error}")]
    Db {
        /// The store.
        path: PathBuf,
        /// redb's error.
        error: redb::Error,
    },
}

/// What the store holds, for [`crate::core::Core::restore`].
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// Every job not ended, and the latest ended ones.
    pub jobs: Vec<JobRecord>,
    /// GPU-seconds per team so far.
    pub gpu_secs: BTreeMap<String, f64>,
    /// The next job id.
    pub next_id: u64,
    /// The framework to fail over as, if one is registered.
    pub framework_id: Option<FrameworkId>,
}

/// The open store.
pub struct Store {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

impl Store {
    /// Opens (or creates) the store at `path`, checking its schema version.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let db = match Database::create(path) {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                return Err(StoreError::InUse(path.to_path_buf()))
            }
            Err(e) => {
                return Err(StoreError::Db {
                    path: path.to_path_buf(),
                    error: e.into(),
                })
            }
        };
        let store = Store {
            db,
            path: path.to_path_buf(),
        };
        store.check_schema()?;
        Ok(store)
    }

    fn db<E: Into<redb::Error>>(&self, e: E) -> StoreError {
        StoreError::Db {
            path: self.path.clone(),
            error: e.into(),
        }
    }

    fn corrupt(&self, what: String, error: impl ToString) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            what,
            error: error.to_string(),
        }
    }

    /// Creates the tables of a new store; checks (and would migrate) an existing one's version.
    fn check_schema(&self) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(|e| self.db(e))?;
        {
            let mut meta = tx.open_table(META).map_err(|e| self.db(e))?;
            let found = meta
                .get("schema_version")
                .map_err(|e| self.db(e))?
                .map(|v| v.value());
            match found {
                None => {
                    meta.insert("schema_version", SCHEMA_VERSION)
                        .map_err(|e| self.db(e))?;
                }
                Some(v) if v == SCHEMA_VERSION => {}
                Some(v) if v > SCHEMA_VERSION => {
                    return Err(StoreError::Newer {
                        path: self.path.clone(),
                        found: v,
                        supported: SCHEMA_VERSION,
                    })
                }
                // Migrations from older versions go here, one step at a time.
                // 1 -> 2: whole GPUs as integers are read unchanged; only the stamp moves.
                Some(1) => {
                    meta.insert("schema_version", SCHEMA_VERSION)
                        .map_err(|e| self.db(e))?;
                }
                Some(v) => {
                    return Err(StoreError::Older {
                        path: self.path.clone(),
                        found: v,
                        supported: SCHEMA_VERSION,
                    })
                }
            }
            tx.open_table(META_TEXT).map_err(|e| self.db(e))?;
            tx.open_table(JOBS).map_err(|e| self.db(e))?;
            tx.open_table(USAGE).map_err(|e| self.db(e))?;
            tx.open_table(TEAM_USAGE).map_err(|e| self.db(e))?;
        }
        tx.commit().map_err(|e| self.db(e))
    }

    /// Reads what the queue needs to start: every job not ended, the `keep_ended` latest ended
    /// ones, usage per team, the next id and the framework id.
    pub fn load(&self, keep_ended: usize) -> Result<Loaded, StoreError> {
        let tx = self.db.begin_read().map_err(|e| self.db(e))?;
        let mut loaded = Loaded::default();
        let meta = tx.open_table(META).map_err(|e| self.db(e))?;
        loaded.next_id = meta
            .get("next_id")
            .map_err(|e| self.db(e))?
            .map_or(1, |v| v.value());
        let text = tx.open_table(META_TEXT).map_err(|e| self.db(e))?;
        if let Some(v) = text.get("framework_id").map_err(|e| self.db(e))? {
            let id = v
                .value()
                .parse()
                .map_err(|e| self.corrupt("the framework id".into(), e))?;
            loaded.framework_id = Some(id);
        }
        let jobs = tx.open_table(JOBS).map_err(|e| self.db(e))?;
        // Newest first: every job not ended is loaded, and the newest `keep_ended` ended ones.
        // Each record's state is read first without building the record (`Head`): a store of a
        // million finished jobs parses only the ones it keeps in full.
        let mut ended = 0;
        for row in jobs.iter().map_err(|e| self.db(e))?.rev() {
            let (k, v) = row.map_err(|e| self.db(e))?;
            let id = k.value();
            let head: Head = serde_json::from_slice(v.value())
                .map_err(|e| self.corrupt(format!("job {id}"), e))?;
            let is_ended = head.state.is_terminal() && head.members.is_empty();
            if is_ended {
                if ended >= keep_ended {
                    continue;
                }
                ended += 1;
            }
            let r: JobRecord = serde_json::from_slice(v.value())
                .map_err(|e| self.corrupt(format!("job {id}"), e))?;
            loaded.next_id = loaded.next_id.max(r.id + 1);
            loaded.jobs.push(r);
        }
        if let Some(last) = jobs.last().map_err(|e| self.db(e))? {
            loaded.next_id = loaded.next_id.max(last.0.value() + 1);
        }
        loaded.jobs.sort_by_key(|j| j.id);
        let teams = tx.open_table(TEAM_USAGE).map_err(|e| self.db(e))?;
        for row in teams.iter().map_err(|e| self.db(e))? {
            let (k, v) = row.map_err(|e| self.db(e))?;
            loaded.gpu_secs.insert(k.value().to_string(), v.value());
        }
        Ok(loaded)
    }

    /// Commits `changes` in one transaction (durable when this returns).
    pub fn commit(&self, changes: &Changes) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(|e| self.db(e))?;
        {
            let mut meta = tx.open_table(META).map_err(|e| self.db(e))?;
            meta.insert("next_id", changes.next_id)
                .map_err(|e| self.db(e))?;
            let mut jobs = tx.open_table(JOBS).map_err(|e| self.db(e))?;
            for j in &changes.jobs {
                let bytes =
                    serde_json::to_vec(j).map_err(|e| self.corrupt(format!("job {}", j.id), e))?;
                jobs.insert(j.id, bytes.as_slice())
                    .map_err(|e| self.db(e))?;
            }
            let mut usage = tx.open_table(USAGE).map_err(|e| self.db(e))?;
            let mut teams = tx.open_table(TEAM_USAGE).map_err(|e| self.db(e))?;
            let next = usage
                .last()
                .map_err(|e| self.db(e))?
                .map_or(0, |(k, _)| k.value() + 1);
            for (key, u) in (next..).zip(&changes.usage) {
                let bytes = serde_json::to_vec(u)
                    .map_err(|e| self.corrupt(format!("usage of job {}", u.job), e))?;
                usage
                    .insert(key, bytes.as_slice())
                    .map_err(|e| self.db(e))?;
                let before = teams
                    .get(u.team.as_str())
                    .map_err(|e| self.db(e))?
                    .map_or(0.0, |v| v.value());
                teams
                    .insert(u.team.as_str(), before + u.gpus.as_f64() * u.secs)
                    .map_err(|e| self.db(e))?;
            }
        }
        tx.commit().map_err(|e| self.db(e))
    }

    /// Records the framework id to fail over as (`None`: forget it, after a teardown).
    pub fn set_framework_id(&self, id: Option<FrameworkId>) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(|e| self.db(e))?;
        {
            let mut text = tx.open_table(META_TEXT).map_err(|e| self.db(e))?;
            match id {
                Some(id) => {
                    text.insert("framework_id", id.to_string().as_str())
                        .map_err(|e| self.db(e))?;
                }
                None => {
                    text.remove("framework_id").map_err(|e| self.db(e))?;
                }
            }
        }
        tx.commit().map_err(|e| self.db(e))
    }

    /// One job's record as stored.
    pub fn job(&self, id: u64) -> Result<Option<JobRecord>, StoreError> {
        let tx = self.db.begin_read().map_err(|e| self.db(e))?;
        let jobs = tx.open_table(JOBS).map_err(|e| self.db(e))?;
        let Some(v) = jobs.get(id).map_err(|e| self.db(e))? else {
            return Ok(None);
        };
        serde_json::from_slice(v.value())
            .map(Some)
            .map_err(|e| self.corrupt(format!("job {id}"), e))
    }

    /// The usage history (every worker that ended), oldest first.
    pub fn usage(&self) -> Result<Vec<UsageRecord>, StoreError> {
        let tx = self.db.begin_read().map_err(|e| self.db(e))?;
        let usage = tx.open_table(USAGE).map_err(|e| self.db(e))?;
        let mut out = Vec::new();
        for row in usage.iter().map_err(|e| self.db(e))? {
            let (k, v) = row.map_err(|e| self.db(e))?;
            out.push(
                serde_json::from_slice(v.value())
                    .map_err(|e| self.corrupt(format!("usage record {}", k.value()), e))?,
            );
        }
        Ok(out)
    }

    /// Sets the schema version (tests of the version check).
    #[cfg(test)]
    fn force_version(&self, v: u64) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(|e| self.db(e))?;
        {
            let mut meta = tx.open_table(META).map_err(|e| self.db(e))?;
            meta.insert("schema_version", v).map_err(|e| self.db(e))?;
        }
        tx.commit().map_err(|e| self.db(e))
    }
}

#[cfg(test)]
mod tests;
