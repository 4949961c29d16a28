//! Team budgets: what a team may spend in a rolling period, in the currency units of the
//! agents' prices (`crate::usage`, "Cost"). PURE: the workers' costs and the time in, a
//! verdict out; the core keeps one [`Budgets`] and the API asks it at every submission.
//!
//! A team's **spending** is the cost of its workers that ended inside the period (counted by
//! the hour they ended in, so the window moves an hour at a time) plus what its running
//! workers have cost so far. Against its budget:
//!
//! - below [`BudgetConfig::warn_at`] of it (80% by default): nothing;
//! - from there to the budget: submissions are accepted with a warning (the API's `warning`,
//!   `gantry-queue submit` prints it);
//! - at or past it: **submissions are held**, refused with 403 and the reason
//!   `over-budget`, until the period's window moves past enough of the spending (or an
//!   administrator raises the budget and restarts the queue). Jobs already queued or running
//!   go on: a budget stops new work, it does not kill or starve work the team was promised.
//!
//! Teams without a budget are never limited. The spending is rebuilt from the store's usage
//! history when the queue starts ([`Budgets::record`] for each record in the period).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Serialize};

const HOUR_MS: u64 = 3_600_000;

/// Budgets per team, the period they cover and when to warn.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetConfig {
    /// A team's budget for one period (currency units of the agents' prices).
    pub budgets: BTreeMap<String, f64>,
    /// The rolling period a budget covers (30 days by default).
    pub period: Duration,
    /// The fraction of a budget from which submissions get a warning (0.8 by default).
    pub warn_at: f64,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            budgets: BTreeMap::new(),
            period: Duration::from_secs(30 * 86_400),
            warn_at: 0.8,
        }
    }
}

/// A `--team-budget` that is not `NAME=AMOUNT` with a finite amount ≥ 0.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "team budget {0:?}: expected NAME=AMOUNT (a finite number ≥ 0, in the agents' price units)"
)]
pub struct BadBudget(pub String);

impl BudgetConfig {
    /// Adds a budget written `NAME=AMOUNT` (`--team-budget nlp=5000`).
    pub fn add(&mut self, text: &str) -> Result<(), BadBudget> {
        let bad = || BadBudget(text.to_string());
        let (name, amount) = text.split_once('=').ok_or_else(bad)?;
        let amount: f64 = amount.trim().parse().map_err(|_| bad())?;
        if name.trim().is_empty() || !amount.is_finite() || amount < 0.0 {
            return Err(bad());
        }
        self.budgets.insert(name.trim().to_string(), amount);
        Ok(())
    }
}

/// Where a team stands against its budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetView {
    /// The team.
    pub team: String,
    /// Its budget for one period.
    pub budget: f64,
    /// Spent in the period so far (ended workers, plus running workers' cost so far).
    pub spent: f64,
    /// The period, seconds.
    pub period_secs: u64,
    /// `ok`, `warn` (past the warning fraction: submissions warned) or `over` (submissions
    /// held).
    pub state: BudgetState,
}

/// A team's standing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BudgetState {
    /// Below the warning fraction.
    Ok,
    /// Past the warning fraction, below the budget: submissions are accepted with a warning.
    Warn,
    /// At or past the budget: submissions are refused.
    Over,
}

impl BudgetView {
    /// What to tell a submitter (`None` when within the warning fraction).
    pub fn message(&self) -> Option<String> {
        let days = self.period_secs as f64 / 86_400.0;
        let text = |what: &str| {
            format!(
                "team {} {what}: spent {:.4} of its budget of {:.4} in the last {days:.3} days",
                self.team, self.spent, self.budget
            )
        };
        match self.state {
            BudgetState::Ok => None,
            BudgetState::Warn => Some(text("is close to its budget")),
            BudgetState::Over => Some(text("is over its budget; submissions are held")),
        }
    }
}

/// Budgets as a table (`gantry-queue usage`).
pub fn table(views: &[BudgetView]) -> String {
    let mut o = format!(
        "{:<20} {:>12} {:>12} {:>8} {:>6} {:<5}\n",
        "TEAM", "BUDGET", "SPENT", "USED", "DAYS", "STATE"
    );
    for v in views {
        let used = if v.budget > 0.0 {
            format!("{:.1}%", 100.0 * v.spent / v.budget)
        } else {
            "-".into()
        };
        let state = match v.state {
            BudgetState::Ok => "ok",
            BudgetState::Warn => "warn",
            BudgetState::Over => "over",
        };
        let _ = writeln!(
            o,
            "{:<20} {:>12.4} {:>12.4} {:>8} {:>6.1} {:<5}",
            v.team,
            v.budget,
            v.spent,
            used,
            v.period_secs as f64 / 86_400.0,
            state
        );
    }
    o
}

/// The teams' spending by the hour, for the teams with a budget.
#[derive(Debug, Clone, Default)]
pub struct Budgets {
    config: BudgetConfig,
    /// Per team with a budget: hour (Unix ms / 1 h) → cost of the workers that ended in it.
    spent: BTreeMap<String, BTreeMap<u64, f64>>,
}

impl Budgets {
    /// No spending yet.
    pub fn new(config: BudgetConfig) -> Self {
        Budgets {
            config,
            spent: BTreeMap::new(),
        }
    }

    /// Whether any team has a budget.
    pub fn is_empty(&self) -> bool {
        self.config.budgets.is_empty()
    }

    /// The first hour inside the period at `now_ms`.
    fn first_hour(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.config.period.as_millis() as u64) / HOUR_MS + 1
    }

    /// A worker of `team` that ended at `ended_unix_ms` cost `cost` (teams without a budget
    /// and costs outside the period are not kept). Hours that left the period are dropped.
    pub fn record(&mut self, team: &str, ended_unix_ms: u64, cost: f64, now_ms: u64) {
        if !self.config.budgets.contains_key(team) || !cost.is_finite() || cost <= 0.0 {
            return;
        }
        let first = self.first_hour(now_ms);
        let hours = self.spent.entry(team.to_string()).or_default();
        let hour = ended_unix_ms / HOUR_MS;
        if hour >= first {
            *hours.entry(hour).or_default() += cost;
        }
        // Bounded: at most the period's hours (plus the current one) per team.
        while hours.first_key_value().is_some_and(|(h, _)| *h < first) {
            hours.pop_first();
        }
    }

    /// Where `team` stands at `now_ms` with its running workers having cost `running` so
    /// far; `None` for a team without a budget.
    pub fn view(&self, team: &str, now_ms: u64, running: f64) -> Option<BudgetView> {
        let budget = *self.config.budgets.get(team)?;
        let first = self.first_hour(now_ms);
        let ended: f64 = self
            .spent
            .get(team)
            .map(|h| h.range(first..).map(|(_, c)| c).sum())
            .unwrap_or(0.0);
        let spent = ended + running.max(0.0);
        let state = if spent >= budget {
            BudgetState::Over
        } else if spent >= budget * self.config.warn_at {
            BudgetState::Warn
        } else {
            BudgetState::Ok
        };
        Some(BudgetView {
            team: team.to_string(),
            budget,
            spent,
            period_secs: self.config.period.as_secs(),
            state,
        })
    }

    /// The teams with a budget.
    pub fn teams(&self) -> impl Iterator<Item = &String> {
        self.config.budgets.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budgets(period_hours: u64) -> Budgets {
        let mut c = BudgetConfig {
            period: Duration::from_secs(period_hours * 3600),
            ..BudgetConfig::default()
        };
        c.add("nlp=100").unwrap();
        c.add("cv=0").unwrap();
        Budgets::new(c)
    }

    #[test]
    fn spending_warns_then_holds_and_the_window_moves() {
        let mut b = budgets(24);
        let t0 = 1_900_000_000_000 / HOUR_MS * HOUR_MS;
        assert_eq!(b.view("nlp", t0, 0.0).unwrap().state, BudgetState::Ok);
        b.record("nlp", t0, 70.0, t0);
        assert_eq!(b.view("nlp", t0, 0.0).unwrap().state, BudgetState::Ok);
        // Running workers count: 70 + 15 is past 80%.
        let v = b.view("nlp", t0, 15.0).unwrap();
        assert_eq!(v.state, BudgetState::Warn);
        assert!(
            v.message().unwrap().contains("close to its budget"),
            "{v:?}"
        );
        b.record("nlp", t0 + HOUR_MS, 30.0, t0 + HOUR_MS);
        let v = b.view("nlp", t0 + HOUR_MS, 0.0).unwrap();
        assert_eq!((v.state, v.spent), (BudgetState::Over, 100.0));
        assert!(v.message().unwrap().contains("submissions are held"));
        // A day later the first 70 left the window: 30 spent.
        let v = b.view("nlp", t0 + 24 * HOUR_MS, 0.0).unwrap();
        assert_eq!((v.state, v.spent), (BudgetState::Ok, 30.0));
        // A zero budget holds everything; a team without one is not limited.
        assert_eq!(b.view("cv", t0, 0.0).unwrap().state, BudgetState::Over);
        assert_eq!(b.view("other", t0, 1e9), None);
        b.record("other", t0, 5.0, t0);
        assert!(!b.spent.contains_key("other"));
    }

    #[test]
    fn old_hours_are_dropped_so_memory_stays_bounded() {
        let mut b = budgets(2);
        let t0 = 1_900_000_000_000 / HOUR_MS * HOUR_MS;
        for h in 0..1000 {
            let now = t0 + h * HOUR_MS;
            b.record("nlp", now, 1.0, now);
        }
        assert!(b.spent["nlp"].len() <= 3, "{:?}", b.spent["nlp"].len());
        assert_eq!(b.view("nlp", t0 + 999 * HOUR_MS, 0.0).unwrap().spent, 2.0);
        // A record from before the window is not kept; an hour later one hour is left.
        b.record("nlp", t0, 50.0, t0 + 1000 * HOUR_MS);
        assert_eq!(b.view("nlp", t0 + 1000 * HOUR_MS, 0.0).unwrap().spent, 1.0);
    }

    #[test]
    fn bad_budgets_are_refused_with_the_text() {
        let mut c = BudgetConfig::default();
        for bad in ["nlp", "nlp=", "=5", "nlp=-1", "nlp=NaN", "nlp=inf", "nlp=x"] {
            let e = c.add(bad).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
        assert!(c.budgets.is_empty());
    }
}
