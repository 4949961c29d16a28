//! Teams' settings: weights and quotas (`--team`), borrowing and lending limits
//! (`--team-borrow-limit`, `--team-lend-limit`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A team's share settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeamConfig {
    /// Weight in the weighted DRF between teams.
    pub weight: f64,
    /// GPUs the team is guaranteed to be ordered first for; above it the team borrows idle
    /// GPUs (ordered after teams within their quota). `None`: no quota. When some team has a
    /// per-model quota, this one covers only GPUs of the models no team names.
    pub gpu_quota: Option<u64>,
    /// Per GPU model (matched as a job's `gpu_model` is, case-insensitively within the GPU's
    /// name): the team's nominal quota of GPUs of that model (`--team nlp=1:8,A100:4`).
    #[serde(default)]
    pub model_quotas: BTreeMap<String, u64>,
}

impl Default for TeamConfig {
    fn default() -> Self {
        TeamConfig {
            weight: 1.0,
            gpu_quota: None,
            model_quotas: BTreeMap::new(),
        }
    }
}

impl TeamConfig {
    /// Parses `NAME=WEIGHT[:GPU_QUOTA][,MODEL:GPUS]...` (`--team`): `nlp=1` (weight 1, no
    /// quota), `nlp=1:8` (8 GPUs), `nlp=2:8,A100:4,H100:2` (8 GPUs of models no team names,
    /// 4 A100s and 2 H100s), `nlp=1,A100:4` (only A100s).
    pub fn parse(s: &str) -> Result<(String, TeamConfig), String> {
        let usage = "expected NAME=WEIGHT[:GPU_QUOTA][,MODEL:GPUS]...";
        let (name, rest) = s
            .split_once('=')
            .ok_or_else(|| format!("--team {s:?}: {usage}"))?;
        if name.is_empty() {
            return Err(format!("--team {s:?}: no team name"));
        }
        let mut items = rest.split(',');
        let first = items.next().unwrap_or_default();
        let (w, q) = match first.split_once(':') {
            Some((w, q)) => (
                w,
                Some(
                    q.parse::<u64>()
                        .map_err(|e| format!("--team {s:?}: GPU quota {q:?}: {e}"))?,
                ),
            ),
            None => (first, None),
        };
        let weight: f64 = w
            .parse()
            .map_err(|e| format!("--team {s:?}: weight {w:?}: {e}"))?;
        if !(weight.is_finite() && weight > 0.0) {
            return Err(format!("--team {s:?}: the weight must be positive"));
        }
        let mut model_quotas = BTreeMap::new();
        for item in items {
            let (model, n) = item
                .split_once(':')
                .ok_or_else(|| format!("--team {s:?}: {item:?}: expected MODEL:GPUS"))?;
            let n: u64 = n
                .parse()
                .map_err(|e| format!("--team {s:?}: {item:?}: GPUS: {e}"))?;
            if model.is_empty() {
                return Err(format!("--team {s:?}: {item:?}: no model"));
            }
            if model_quotas.insert(model.to_string(), n).is_some() {
                return Err(format!("--team {s:?}: model {model} named twice"));
            }
        }
        Ok((
            name.to_string(),
            TeamConfig {
                weight,
                gpu_quota: q,
                model_quotas,
            },
        ))
    }

    /// Whether the team has any quota (overall or per model).
    pub fn has_quota(&self) -> bool {
        self.gpu_quota.is_some() || !self.model_quotas.is_empty()
    }

    /// Its nominal GPUs in all: the overall quota plus the per-model quotas.
    pub fn nominal_gpus(&self) -> u64 {
        self.gpu_quota.unwrap_or(0) + self.model_quotas.values().sum::<u64>()
    }
}

/// A team's borrowing or lending limit (`--team-borrow-limit`, `--team-lend-limit`), in GPUs:
/// overall and per GPU model, as Kueue sets `borrowingLimit` and `lendingLimit` per flavor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TeamLimit {
    /// Borrowing: over all the team's GPUs beyond its nominal ones. Lending: in each of its
    /// quotas that has no limit of its own.
    pub all: Option<u64>,
    /// Per GPU model some team's quota names (the model's bucket).
    pub models: BTreeMap<String, u64>,
}

impl TeamLimit {
    /// A limit over all GPUs only.
    pub fn all(gpus: u64) -> TeamLimit {
        TeamLimit {
            all: Some(gpus),
            models: BTreeMap::new(),
        }
    }

    /// Parses `NAME=[GPUS][,MODEL:GPUS]...` for `flag`: `nlp=4` (4 GPUs overall),
    /// `nlp=4,A100:2` (and 2 A100s), `nlp=A100:2` (only A100s).
    pub fn parse(flag: &str, s: &str) -> Result<(String, TeamLimit), String> {
        let usage = "expected NAME=GPUS[,MODEL:GPUS]... or NAME=MODEL:GPUS[,MODEL:GPUS]...";
        let (name, rest) = s
            .split_once('=')
            .ok_or_else(|| format!("{flag} {s:?}: {usage}"))?;
        if name.is_empty() {
            return Err(format!("{flag} {s:?}: no team name"));
        }
        let mut limit = TeamLimit::default();
        for (i, item) in rest.split(',').enumerate() {
            let gpus = |n: &str| {
                n.parse::<u64>()
                    .map_err(|e| format!("{flag} {s:?}: {item:?}: GPUS: {e}"))
            };
            match item.split_once(':') {
                None if i == 0 => limit.all = Some(gpus(item)?),
                None => return Err(format!("{flag} {s:?}: {item:?}: expected MODEL:GPUS")),
                Some(("", _)) => return Err(format!("{flag} {s:?}: {item:?}: no model")),
                Some((model, n)) => {
                    if limit.models.insert(model.to_string(), gpus(n)?).is_some() {
                        return Err(format!("{flag} {s:?}: model {model} named twice"));
                    }
                }
            }
        }
        Ok((name.to_string(), limit))
    }

    /// The limit for the bucket of `model` (a named model), if it has one of its own.
    pub fn model(&self, model: &str) -> Option<u64> {
        self.models
            .iter()
            .find(|(m, _)| m.eq_ignore_ascii_case(model))
            .map(|(_, &n)| n)
    }
}
