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

/// One interruption read from a file ([`parse_interruptions`]): at `at_s` seconds after the
/// workload's first arrival, a termination notice to `node` of `pool`, or, without a node, to
/// the pool's registered node that is not already leaving with the most tasks (the oldest
/// among equals). A notice that finds no such node is counted in
/// [`super::SimResult::interruptions_missed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interruption {
    /// Seconds after the first arrival.
    pub at_s: u64,
    /// The pool.
    pub pool: String,
    /// The node (the simulator names them `POOL-N`, N counting every node created).
    pub node: Option<String>,
}

/// Reads interruption times: CSV lines `time_s,pool[,node]` (seconds after the workload's
/// first arrival); blank lines, lines starting with `#` and a first line starting with
/// `time_s` (a header) are skipped. Sorted by time on return.
pub fn parse_interruptions(text: &str) -> Result<Vec<Interruption>, super::TraceError> {
    let mut out = Vec::new();
    let mut first = true;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let header = first && line.starts_with("time_s");
        first = false;
        if header {
            continue;
        }
        let err = |message: String| super::TraceError {
            line: i + 1,
            message,
        };
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if !(2..=3).contains(&fields.len()) {
            return Err(err(format!(
                "{} fields: want time_s,pool[,node]",
                fields.len()
            )));
        }
        let at_s = fields[0]
            .parse()
            .map_err(|_| err(format!("time_s {:?} is not a number of seconds", fields[0])))?;
        if fields[1].is_empty() {
            return Err(err("empty pool".into()));
        }
        out.push(Interruption {
            at_s,
            pool: fields[1].to_string(),
            node: fields
                .get(2)
                .filter(|n| !n.is_empty())
                .map(|n| n.to_string()),
        });
    }
    out.sort_by_key(|x| x.at_s);
    Ok(out)
}

/// What a killed task keeps and loses, seconds of run time: it ran `ran` seconds in this
/// attempt, of which the last `since_notice` came after its node's notice (`None`: killed
/// without one). A class that checkpoints on notice (`notice_grace`: the seconds its
/// checkpoint takes) and had that long before the kill keeps its state at the notice and loses
/// only the work since the notice minus the grace it spent checkpointing; otherwise it keeps
/// its periodic checkpoints (`interval`, [`checkpoint_split`]), whichever keeps more.
pub fn kill_split(
    ran: u64,
    since_notice: Option<u64>,
    interval: u64,
    notice_grace: Option<u64>,
) -> (u64, u64) {
    let periodic = checkpoint_split(ran, interval);
    match (since_notice, notice_grace) {
        (Some(d), Some(g)) if g <= d => {
            let d = d.min(ran);
            let kept = ran - d;
            if kept >= periodic.0 {
                (kept, d.saturating_sub(g))
            } else {
                periodic
            }
        }
        _ => periodic,
    }
}
