//! Cost attribution shared by the master's usage reports (`/api/v1/usage`, the
//! `gantry_usage_*` counters) and the autoscaler's cost book: what share of an agent's price a
//! task pays, and the agent attribute that carries the price.
//!
//! A task pays `price_per_hour × share × hours`, where its **share** is dominant over the
//! agent's shape: the largest of its GPUs, CPUs and memory over the agent's, at most 1. On a
//! GPU agent the GPUs are what a task usually holds most of, so a 1-GPU task on a 2-GPU agent
//! pays half the agent whatever CPUs it takes (GPU-dominant, as the price of a GPU machine is
//! mostly its GPUs); a CPU-heavy task pays its CPU share. What no task pays for is the agent's
//! idle cost.
//!
//! It lives here, not in the master or the autoscaler, because both need it and both depend on
//! this pure crate (about task and node shapes) already; the wire protocol crate is no place
//! for a pricing rule.

/// The agent attribute that carries its price: a decimal string, currency units per hour
/// (`gantry-agent --price-per-hour X` sets it; autoscaler pools put their price there).
pub const PRICE_ATTRIBUTE: &str = "price_per_hour";

/// CPUs, memory (MiB) and GPUs of a task or an agent.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Amounts {
    /// CPUs.
    pub cpus: f64,
    /// Memory, MiB.
    pub mem: f64,
    /// GPUs (fractions included).
    pub gpus: f64,
}

/// The task's dominant share of an agent of shape `agent`, in `[0, 1]` (kinds the agent has
/// none of do not count).
pub fn dominant_share(task: &Amounts, agent: &Amounts) -> f64 {
    let part = |used: f64, total: f64| if total > 0.0 { used / total } else { 0.0 };
    let s = part(task.gpus, agent.gpus)
        .max(part(task.cpus, agent.cpus))
        .max(part(task.mem, agent.mem));
    if s.is_nan() {
        0.0
    } else {
        s.clamp(0.0, 1.0)
    }
}

/// A price that is not a finite, non-negative number.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("price per hour {0:?}: expected a finite decimal number ≥ 0 (currency units per hour)")]
pub struct BadPrice(pub String);

/// Parses a price per hour (`"2.5"`): finite and ≥ 0.
pub fn parse_price(text: &str) -> Result<f64, BadPrice> {
    match text.trim().parse::<f64>() {
        Ok(p) if p.is_finite() && p >= 0.0 => Ok(p),
        _ => Err(BadPrice(text.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(cpus: f64, mem: f64, gpus: f64) -> Amounts {
        Amounts { cpus, mem, gpus }
    }

    #[test]
    fn shares_are_dominant_over_the_agent_and_at_most_one() {
        let node = a(8.0, 32768.0, 2.0);
        assert_eq!(dominant_share(&a(1.0, 1024.0, 1.0), &node), 0.5);
        assert_eq!(dominant_share(&a(6.0, 1024.0, 0.0), &node), 0.75);
        assert_eq!(dominant_share(&a(0.5, 1024.0, 0.25), &node), 0.125);
        assert_eq!(dominant_share(&a(1.0, 1024.0, 4.0), &node), 1.0);
        // A CPU agent: GPUs do not count; an empty shape is no share.
        assert_eq!(dominant_share(&a(2.0, 0.0, 1.0), &a(4.0, 0.0, 0.0)), 0.5);
        assert_eq!(dominant_share(&a(2.0, 1.0, 1.0), &Amounts::default()), 0.0);
        assert!((0.0..=1.0).contains(&dominant_share(&a(f64::NAN, f64::NAN, f64::NAN), &node)));
    }

    #[test]
    fn prices_are_finite_and_not_negative() {
        assert_eq!(parse_price(" 2.5 "), Ok(2.5));
        assert_eq!(parse_price("0"), Ok(0.0));
        for bad in ["-1", "NaN", "inf", "", "two"] {
            assert!(parse_price(bad).is_err(), "{bad}");
        }
    }
}
