//! GPU-hours and cost per team (or per team and user) from the store's usage history: every
//! worker that ended is recorded with its GPUs, run time (from its launch: staging counts)
//! and cost ([`UsageRecord`]). Pure:
//! the records and the window in, rows out; served by `GET /usage` and printed by
//! `gantry-queue usage`.
//!
//! A worker's run is `[ended - secs, ended]`; only its part inside the window `[since, until]`
//! counts (and that part of its cost). Workers still running are not in the history until
//! they end.
//!
//! **Cost.** A worker costs its agent's `price_per_hour` attribute (an autoscaler pool's
//! price, or `gantry-agent --price-per-hour`) × its share of the agent × its run time: a GPU
//! worker's share is its GPUs over the agent's (GPU-dominant, as the master's usage reports
//! and the autoscaler's cost book attribute on GPU nodes, `gantry_placement::cost`), a
//! CPU-only worker's its dominant share of CPUs and memory (see `Core`'s `spend` module for
//! how the queue learns an agent's shape). A 1-GPU worker on a 2-GPU node pays half the
//! node's price while it runs. What no worker pays for (nodes idle, booting, draining) is the fleet's
//! idle cost, which the autoscaler and the master report per node. `cost` is absent from a
//! row none of whose workers ran on a priced agent.

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
    /// What those runs cost inside the window (currency units of the agents' prices);
    /// `None` when none of them ran on a priced agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
}

/// GPU-hours of the runs inside `[since_ms, until_ms]` (Unix milliseconds), grouped `by`,
/// most GPU-hours first.
pub fn summarize(records: &[UsageRecord], since_ms: u64, until_ms: u64, by: By) -> Vec<UsageRow> {
    // Per (team, user): GPU-hours, jobs, worker runs, cost.
    type Acc = (f64, BTreeSet<u64>, u64, Option<f64>);
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
        row.0 += r.gpus.as_f64() * overlap.max(0.0) / 3_600_000.0;
        row.1.insert(r.job);
        row.2 += 1;
        if let Some(c) = r.cost {
            // The part of the run inside the window pays that part of the cost.
            let part = if r.secs > 0.0 {
                (overlap.max(0.0) / (r.secs * 1000.0)).min(1.0)
            } else {
                1.0
            };
            *row.3.get_or_insert(0.0) += c * part;
        }
    }
    let mut out: Vec<UsageRow> = rows
        .into_iter()
        .map(
            |((team, user), (gpu_hours, jobs, workers, cost))| UsageRow {
                team,
                user,
                gpu_hours,
                jobs: jobs.len() as u64,
                workers,
                cost,
            },
        )
        .collect();
    out.sort_by(|a, b| b.gpu_hours.total_cmp(&a.gpu_hours));
    out
}

/// The rows as a table (`COST` is `-` for a row with no priced worker).
pub fn table(rows: &[UsageRow]) -> String {
    let mut o = format!(
        "{:<20} {:<20} {:>12} {:>12} {:>8} {:>8}\n",
        "TEAM", "USER", "GPU-HOURS", "COST", "JOBS", "WORKERS"
    );
    for r in rows {
        let cost = r.cost.map_or("-".to_string(), |c| format!("{c:.4}"));
        let _ = writeln!(
            o,
            "{:<20} {:<20} {:>12.2} {:>12} {:>8} {:>8}",
            r.team,
            r.user.as_deref().unwrap_or("*"),
            r.gpu_hours,
            cost,
            r.jobs,
            r.workers
        );
    }
    o
}

/// The rows as CSV (`team,user,gpu_hours,cost,jobs,workers`; user empty grouping by team,
/// cost empty with no priced worker).
pub fn csv(rows: &[UsageRow]) -> String {
    let mut o = "team,user,gpu_hours,cost,jobs,workers\n".to_string();
    for r in rows {
        let _ = writeln!(
            o,
            "{},{},{},{},{},{}",
            r.team,
            r.user.as_deref().unwrap_or(""),
            r.gpu_hours,
            r.cost.map(|c| c.to_string()).unwrap_or_default(),
            r.jobs,
            r.workers
        );
    }
    o
}

#[cfg(test)]
mod tests;
