//! Operator commands (HTTP API / `gantryctl`): role weights and quotas.

use super::*;

/// Smallest and largest role weight an operator may set (shares are divided by the weight; the
/// bounds keep them finite and comparable).
pub const MIN_WEIGHT: f64 = 0.001;
pub const MAX_WEIGHT: f64 = 1_000_000.0;
/// Resource kinds one quota guarantee or limit may name.
pub const MAX_QUOTA_KINDS: usize = 32;
/// Largest amount of one resource in a quota, in milli-units (10^12 units).
pub const MAX_QUOTA_MILLI: u64 = 1_000_000_000_000_000;

/// An operator request (HTTP API / `gantryctl`).
#[derive(Debug, Clone, PartialEq)]
pub enum OperatorCommand {
    SetWeight {
        role: String,
        weight: f64,
    },
    /// Replaces the role's quota; `None` parts are removed.
    SetQuota {
        role: String,
        guarantee: Option<Resources>,
        /// Kinds named with zero are limited to zero.
        limit: Option<ResourceLimits>,
    },
}

impl Master {
    /// Applies an operator command. Weights and quotas take effect at the next batch
    /// allocation (as in Mesos).
    pub fn operator(&mut self, cmd: OperatorCommand) -> Result<Vec<Output>, OperatorRejection> {
        match cmd {
            OperatorCommand::SetWeight { role, weight } => {
                self.config.limits.check_role(&role)?;
                if !(weight.is_finite() && (MIN_WEIGHT..=MAX_WEIGHT).contains(&weight)) {
                    return Err(OperatorRejection::Weight(weight));
                }
                tracing::info!(%role, weight, "role weight set");
                self.allocator.set_weight(&role, weight);
                if weight == 1.0 {
                    // Back to the default: a role kept only by its weight is unused now.
                    self.forget_role(&role);
                }
                Ok(vec![Output::Persist(Mutation::SetWeight { role, weight })])
            }
            OperatorCommand::SetQuota {
                role,
                guarantee,
                limit,
            } => {
                self.config.limits.check_role(&role)?;
                let parts: [(&str, Vec<(&str, u64)>); 2] = [
                    (
                        "guarantee",
                        guarantee.iter().flat_map(|g| g.iter()).collect(),
                    ),
                    ("limit", limit.iter().flat_map(|l| l.iter()).collect()),
                ];
                for (part, r) in parts {
                    if r.len() > MAX_QUOTA_KINDS {
                        return Err(OperatorRejection::QuotaKinds(part));
                    }
                    if let Some((name, _)) = r.iter().find(|(_, milli)| *milli > MAX_QUOTA_MILLI) {
                        return Err(OperatorRejection::QuotaAmount {
                            part,
                            name: name.to_string(),
                        });
                    }
                }
                if let (Some(g), Some(l)) = (&guarantee, &limit) {
                    if let Some(name) = g
                        .names()
                        .find(|n| l.limit(n).is_some_and(|max| g.milli(n) > max))
                    {
                        return Err(OperatorRejection::GuaranteeOverLimit(name.to_string()));
                    }
                }
                // Refused (nothing changes) when guarantees would not nest.
                self.allocator
                    .set_quota(&role, guarantee.clone(), limit.clone())?;
                tracing::info!(%role, ?guarantee, ?limit, "role quota set");
                if guarantee.is_none() && limit.is_none() {
                    self.forget_role(&role);
                }
                let m = if guarantee.is_none() && limit.is_none() {
                    Mutation::RemoveQuota { role }
                } else {
                    Mutation::SetQuota {
                        role,
                        quota: Quota {
                            guarantee: guarantee.unwrap_or_default(),
                            limit: limit.unwrap_or_default(),
                        },
                    }
                };
                Ok(vec![Output::Persist(m)])
            }
        }
    }
}
