//! Spot interruptions: the seeded Poisson model ([`SpotModel`]) and what a kill keeps
//! ([`checkpoint_split`]).

use std::collections::BTreeMap;

/// The spot interruption model: a seeded Poisson process per spot node. Each spot node gets
/// its termination notice an exponentially distributed time after it registers, with rate
/// `rate_per_node_hour` (so the chance of a notice within any hour of a node's life is
/// `1 − e^(−rate)`, the same for every hour: the process is memoryless). A node's draw depends
/// on the seed and its id only, so a run is reproducible and one node's fate does not depend
/// on the others'. After the notice the node drains (no new placements) and is reclaimed at the
/// notice's deadline (the configuration's `notice_deadline`): what still runs there is killed.
#[derive(Debug, Clone, Default)]
pub struct SpotModel {
    /// Notices per spot node-hour; 0: none.
    pub rate_per_node_hour: f64,
    /// The seed of the draws.
    pub seed: u64,
    /// Exact notice times for chosen nodes, seconds after they register (overrides the rate).
    pub fixed: BTreeMap<String, u64>,
}

impl SpotModel {
    /// Seconds after it registers at which spot node `id` gets its notice (`None`: never).
    pub fn notice_after(&self, id: &str) -> Option<u64> {
        use rand::{RngExt, SeedableRng};
        if let Some(&s) = self.fixed.get(id) {
            return Some(s);
        }
        if !(self.rate_per_node_hour.is_finite() && self.rate_per_node_hour > 0.0) {
            return None;
        }
        // FNV-1a of the id, mixed with the seed.
        let tag = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(self.seed ^ tag);
        // U in (0, 1]: -ln(U) is an exponential draw of mean 1.
        let u: f64 = 1.0 - rng.random::<f64>();
        let hours = -u.ln() / self.rate_per_node_hour;
        Some((hours * 3600.0).round().min(u64::MAX as f64 / 2.0) as u64)
    }
}

/// Of `ran` seconds a task ran since its attempt started, what a kill keeps (the whole
/// checkpoint intervals: it restarts from its last checkpoint) and what it loses; `interval`
/// 0: no checkpoints, everything is lost.
pub fn checkpoint_split(ran: u64, interval: u64) -> (u64, u64) {
    if interval == 0 {
        return (0, ran);
    }
    let kept = ran / interval * interval;
    (kept, ran - kept)
}
