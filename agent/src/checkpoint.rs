//! The agent's on-disk state, so a restarted agent re-adopts its running tasks.
//!
//! A snapshot, `WORK_DIR/checkpoint.json`, written atomically (temp file, fsync, rename) at
//! start and when the write-ahead log ([`crate::wal`]) is compacted; changes in between go to
//! the log. A corrupt checkpoint stops the agent with a clear error instead of silently
//! forgetting running tasks. The types it stores ([`TaskRecord`], [`Checkpoint`]) are the
//! core's ([`crate::core::types`]); this module reads and writes them.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub use crate::core::types::{Checkpoint, TaskRecord};

pub const FILE: &str = "checkpoint.json";

/// Errors reading or writing the checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is corrupt ({source}); move it away to start this agent fresh (its tasks will be reported LOST)")]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// A frame in the middle of a log fails its checksum (valid frames follow it): not a torn
    /// write. Replay stops there only when the operator says so (`--recover-truncate`).
    #[error("{path}: corrupt frame at byte {offset} of the agent's write-ahead log, followed by {frames_after} valid-looking frames ({dropped_bytes} bytes from the corrupt frame on); refusing to start. Restart with --recover-truncate to drop everything from that byte on (and any later log): the agent then starts from the state before it")]
    MidLogCorruption {
        path: PathBuf,
        offset: u64,
        dropped_bytes: u64,
        frames_after: usize,
    },
}

impl Checkpoint {
    /// Loads the checkpoint in `work_dir`; `None` when there is none yet.
    pub fn load(work_dir: &Path) -> Result<Option<Checkpoint>, CheckpointError> {
        let path = work_dir.join(FILE);
        let data = match std::fs::read(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(CheckpointError::Io { path, source }),
        };
        serde_json::from_slice(&data)
            .map(Some)
            .map_err(|source| CheckpointError::Corrupt { path, source })
    }

    /// Writes the checkpoint atomically.
    pub fn save(&self, work_dir: &Path) -> Result<(), CheckpointError> {
        let path = work_dir.join(FILE);
        let tmp = work_dir.join(format!("{FILE}.tmp"));
        let io = |source| CheckpointError::Io {
            path: path.clone(),
            source,
        };
        let data = serde_json::to_vec(self).map_err(|source| CheckpointError::Corrupt {
            path: path.clone(),
            source,
        })?;
        // 0600: the checkpoint names every task, its command and environment.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io)?;
        f.write_all(&data).map_err(io)?;
        f.sync_data().map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Launched;
    use gantry_proto::{AgentId, FrameworkId, TaskId, TaskInfo, TaskState};

    #[test]
    fn round_trip_and_corruption() {
        let dir = std::env::temp_dir().join(format!("gantry-ckpt-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(Checkpoint::load(&dir).unwrap().is_none());
        let mut c = Checkpoint {
            agent_id: Some(AgentId::random()),
            ..Default::default()
        };
        let tid = TaskId::random();
        c.tasks.insert(
            tid,
            TaskRecord {
                framework_id: FrameworkId::random(),
                info: TaskInfo {
                    task_id: tid,
                    name: "t".into(),
                    command: "true".into(),
                    resources: "cpus:1".parse().unwrap(),
                    env: Default::default(),
                    kill_grace_secs: None,
                    gpu_selector: None,
                    container: None,
                },
                state: TaskState::Running,
                sandbox: dir.join("s"),
                meta: dir.join("m"),
                launched: Some(Launched {
                    supervisor_pid: 10,
                    task_pgid: 11,
                    supervisor_start: 5,
                }),
                gpus: vec![],
                kill_requested_ms: None,
                cgroup: None,
                gpu_memory_kill: None,
                disk_kill: None,
                ports: Vec::new(),
                group: None,
            },
        );
        c.save(&dir).unwrap();
        let mode = std::fs::metadata(dir.join(FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "the checkpoint is private to the agent"
        );
        let back = Checkpoint::load(&dir).unwrap().unwrap();
        assert_eq!(back.agent_id, c.agent_id);
        // The supervisor's answer is the launch record's, never the checkpoint's...
        let text = std::fs::read_to_string(dir.join(FILE)).unwrap();
        assert!(!text.contains("supervisor_pid"), "{text}");
        assert_eq!(back.tasks[&tid].launched, None);
        assert_eq!(back.tasks[&tid].state, TaskState::Running);
        // ...but a checkpoint of an agent from before that, which held it, still reads it.
        let mut old = serde_json::to_value(&c).unwrap();
        old["tasks"][tid.to_string()]["launched"] =
            serde_json::json!({"supervisor_pid": 10, "task_pgid": 11, "supervisor_start": 5});
        std::fs::write(dir.join(FILE), serde_json::to_vec(&old).unwrap()).unwrap();
        let back = Checkpoint::load(&dir).unwrap().unwrap();
        assert_eq!(back.tasks[&tid].launched, c.tasks[&tid].launched);
        std::fs::write(dir.join(FILE), b"{not json").unwrap();
        assert!(matches!(
            Checkpoint::load(&dir),
            Err(CheckpointError::Corrupt { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
