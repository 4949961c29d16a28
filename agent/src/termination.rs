//! Spot-instance termination notices: `gantry-agent notice-termination --in 120s` (run on the
//! host by the cloud's termination hook) writes [`NOTICE_FILE`] into the agent's work dir; the
//! running agent reads it within a second and tells the master
//! ([`AgentToMaster::TerminationNotice`](gantry_proto::AgentToMaster)), which drains the
//! agent with that deadline. The file holds the deadline as Unix milliseconds (the agent and the
//! command share the host's clock); the agent sends the time left, so the master's clock does
//! not matter. The notice is sent again after every re-registration (a new master may lead) and
//! the file is removed once the deadline has passed.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The notice file in the agent's work dir.
pub const NOTICE_FILE: &str = "termination-notice.json";
/// Longest reason kept, bytes.
pub const MAX_REASON: usize = 256;

/// A termination notice as written by `notice-termination`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// When the host goes away, Unix milliseconds.
    pub deadline_unix_ms: u64,
    /// Why (shown to operators and frameworks).
    pub reason: String,
}

/// Unix milliseconds now.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Writes a notice that the host goes away `after` from now (atomically: temp file + rename).
pub fn write(work_dir: &Path, after: Duration, reason: &str) -> std::io::Result<Notice> {
    let mut reason = reason.to_string();
    if reason.len() > MAX_REASON {
        let mut end = MAX_REASON;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
    }
    let notice = Notice {
        deadline_unix_ms: unix_ms().saturating_add(after.as_millis() as u64),
        reason,
    };
    std::fs::create_dir_all(work_dir)?;
    let tmp = work_dir.join(format!("{NOTICE_FILE}.tmp"));
    let body = serde_json::to_vec(&notice).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, body)?;
    std::fs::rename(&tmp, work_dir.join(NOTICE_FILE))?;
    Ok(notice)
}

/// The notice in `work_dir`, if there is a readable one (a malformed file is removed with a
/// warning, so it is reported once).
pub fn read(work_dir: &Path) -> Option<Notice> {
    let path = work_dir.join(NOTICE_FILE);
    let body = std::fs::read(&path).ok()?;
    match serde_json::from_slice::<Notice>(&body) {
        Ok(n) => Some(n),
        Err(e) => {
            tracing::warn!(
                "removing malformed termination notice {}: {e}",
                path.display()
            );
            let _ = std::fs::remove_file(&path);
            None
        }
    }
}

/// Removes the notice (after its deadline).
pub fn remove(work_dir: &Path) {
    let _ = std::fs::remove_file(work_dir.join(NOTICE_FILE));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_notice_reads_back() {
        let dir = std::env::temp_dir().join(format!("gantry-notice-{}", std::process::id()));
        let before = unix_ms();
        let n = write(&dir, Duration::from_secs(120), &"x".repeat(1000)).unwrap();
        assert!(n.deadline_unix_ms >= before + 120_000);
        assert_eq!(n.reason.len(), MAX_REASON);
        assert_eq!(read(&dir), Some(n));
        std::fs::write(dir.join(NOTICE_FILE), b"{not json").unwrap();
        assert_eq!(read(&dir), None);
        assert!(
            !dir.join(NOTICE_FILE).exists(),
            "a malformed notice is removed"
        );
        write(&dir, Duration::from_secs(1), "x").unwrap();
        remove(&dir);
        assert_eq!(read(&dir), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
