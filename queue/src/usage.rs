//! GPU-hours per team (or per team and user) from the store's usage history: every worker
//! that ended is recorded with its GPUs and run time ([`UsageRecord`]). Pure: the records and
//! the window in, rows out; served by `GET /usage` and printed by `gantry-queue usage`.
//!
//! A worker's run is `[ended - secs, ended]`; only its part inside the window `[since, until]`
//! counts. Workers still running are not in the history until they end.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::model::UsageRecord;

/// How rows are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum By {
    /// One row per team.
    #[default]
    Team,
    /// One row per team and user.
    User,
}

impl std::str::FromStr for By {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "team" => Ok(By::Team),
            "user" => Ok(By::User),
            _ => Err(format!("unknown grouping {s:?} (team, user)")),
        }
    }
}

/// One row of the usage report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageRow {
    /// Team.
    pub team: String,
    /// User (grouping by user only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// GPU-hours inside the window.
    pub gpu_hours: f64,
    /// Jobs with a worker that ran inside the window.
    pub jobs: u64,
    /// Worker runs inside the window.
    pub workers: u64,
}

/// GPU-hours of the runs inside `[since_ms, until_ms]` (Unix milliseconds), grouped `by`,
/// most GPU-hours first.
pub fn summarize(records: &[UsageRecord], since_ms: u64, until_ms: u64, by: By) -> Vec<UsageRow> {
    // Per (team, user): GPU-hours, jobs, worker runs.
    type Acc = (f64, BTreeSet<u64>, u64);
    let mut rows: BTreeMap<(String, Option<String>), Acc> = BTreeMap::new();
    for r in records {
        let end = r.ended_unix_ms as f64;
        let start = end - r.secs.max(0.0) * 1000.0;
        let overlap = end.min(until_ms as f64) - start.max(since_ms as f64);
        if overlap <= 0.0 && !(r.secs == 0.0 && (since_ms..=until_ms).contains(&r.ended_unix_ms)) {
            continue;
        }
        let user = (by == By::User).then(|| r.user.clone());
        let row = rows.entry((r.team.clone(), user)).or_default();
        row.0 += f64::from(r.gpus) * overlap.max(0.0) / 3_600_000.0;
        row.1.insert(r.job);
        row.2 += 1;
    }
    let mut out: Vec<UsageRow> = rows
        .into_iter()
        .map(|((team, user), (gpu_hours, jobs, workers))| UsageRow {
            team,
            user,
            gpu_hours,
            jobs: jobs.len() as u64,
            workers,
        })
        .collect();
    out.sort_by(|a, b| b.gpu_hours.total_cmp(&a.gpu_hours));
    out
}

/// The rows as a table.
pub fn table(rows: &[UsageRow]) -> String {
    let mut o = format!(
        "{:<20} {:<20} {:>12} {:>8} {:>8}\n",
        "TEAM", "USER", "GPU-HOURS", "JOBS", "WORKERS"
    );
    for r in rows {
        let _ = writeln!(
            o,
            "{:<20} {:<20} {:>12.2} {:>8} {:>8}",
            r.team,
            r.user.as_deref().unwrap_or("*"),
            r.gpu_hours,
            r.jobs,
            r.workers
        );
    }
    o
}

/// The rows as CSV (`team,user,gpu_hours,jobs,workers`; user empty grouping by team).
pub fn csv(rows: &[UsageRow]) -> String {
    let mut o = "team,user,gpu_hours,jobs,workers\n".to_string();
    for r in rows {
        let _ = writeln!(
            o,
            "{},{},{},{},{}",
            r.team,
            r.user.as_deref().unwrap_or(""),
            r.gpu_hours,
            r.jobs,
            r.workers
        );
    }
    o
}

#[cfg(test)]
mod tests;
