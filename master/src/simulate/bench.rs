//! `gantry-master bench`: allocation-cycle benchmarks on the real allocator.
//!
//! - **DeclineOffers** (Mesos's `HierarchicalAllocator_BENCHMARK_Test.DeclineOffers` setup):
//!   every agent has `cpus:24;mem:4096;disk:4096`; framework `i % F` already holds `cpus:16` on
//!   agent `i`; all frameworks are in one role and decline every offer with a very long filter.
//!   Each cycle is one `allocate()`; the offers it makes are declined before the next cycle.
//! - **Quota roles**: many roles, each with a quota guarantee and one framework, agents as above;
//!   the frameworks decline with a long filter as well.
//!
//! Reported per setup: the first (cold) cycle, then the median and maximum of the following
//! cycles, offers per cycle, and the growth of the process's resident memory while the allocator
//! was built (allocator state plus the benchmark's id tables).

use std::collections::BTreeMap;
use std::time::Instant;

use gantry_proto::{AgentId, FrameworkId, Resources};
use serde::Serialize;

use super::SimError;
use crate::allocator::{Allocator, AllocatorConfig, OfferResources};

/// Arguments of `gantry-master bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// DeclineOffers sizes as AGENTSxFRAMEWORKS, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1000x100,10000x1000,20000x2000,50000x6000"
    )]
    pub sizes: Vec<String>,
    /// Measured cycles per size after the first one (the median is reported).
    #[arg(long, default_value_t = 9)]
    pub cycles: usize,
    /// Unmeasured cycles (offers declined with a long filter) before the measured ones, to see
    /// cycles where agents already carry many filters.
    #[arg(long, default_value_t = 0)]
    pub warmup: usize,
    /// Number of roles with a quota in the quota benchmark (0 skips it).
    #[arg(long, default_value_t = 3000)]
    pub quota_roles: usize,
    /// Agents in the quota benchmark.
    #[arg(long, default_value_t = 10000)]
    pub quota_agents: usize,
    /// Print one JSON object per result instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Run each setup in-process instead of in a fresh child process (memory figures are then
    /// distorted by the previous setups' freed memory).
    #[arg(long)]
    pub in_process: bool,
    /// Internal: run one setup (`AGENTSxFRAMEWORKS` or `quota`) and print its JSON result.
    #[arg(long, hide = true)]
    pub one: Option<String>,
}

/// Runs one setup in a child process of this executable (fresh heap, so the resident-memory
/// growth is the allocator's own), falling back to in-process when that is not possible.
fn isolated(args: &BenchArgs, one: &str, fallback: impl FnOnce() -> BenchResult) -> BenchResult {
    let child = std::env::current_exe().ok().and_then(|exe| {
        std::process::Command::new(exe)
            .args(["bench", "--one", one, "--cycles", &args.cycles.to_string()])
            .args(["--quota-roles", &args.quota_roles.to_string()])
            .args(["--warmup", &args.warmup.to_string()])
            .args(["--quota-agents", &args.quota_agents.to_string()])
            .stderr(std::process::Stdio::inherit())
            .output()
            .ok()
    });
    child
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|text| {
            text.lines()
                .rev()
                .find_map(|l| serde_json::from_str::<BenchResult>(l).ok())
        })
        .unwrap_or_else(fallback)
}

/// One benchmark result.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct BenchResult {
    pub name: String,
    pub agents: usize,
    pub frameworks: usize,
    pub roles: usize,
    pub first_cycle_ms: f64,
    pub median_cycle_ms: f64,
    /// Median thread CPU time of a cycle.
    pub median_cycle_cpu_ms: f64,
    pub max_cycle_ms: f64,
    pub cycles: usize,
    #[serde(default)]
    pub warmup_cycles: usize,
    pub offers_first_cycle: usize,
    pub offers_per_cycle_median: usize,
    pub build_ms: f64,
    pub rss_growth_mib: f64,
}

/// CPU time consumed by the calling thread, in milliseconds (`CLOCK_THREAD_CPUTIME_ID`): unlike
/// wall time it does not count time the thread waited for a core on a busy machine.
pub fn thread_cpu_ms() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass and has no other effects.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 * 1000.0 + ts.tv_nsec as f64 / 1e6
}

/// Resident set size of this process in KiB (Linux `/proc/self/status`), 0 when unknown.
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn parse_size(s: &str) -> Result<(usize, usize), SimError> {
    let (a, f) = s
        .trim()
        .split_once(['x', 'X', '/'])
        .ok_or_else(|| SimError::Args(format!("size {s:?} is not AGENTSxFRAMEWORKS")))?;
    let a: usize = a
        .trim()
        .parse()
        .map_err(|_| SimError::Args(format!("bad agent count in {s:?}")))?;
    let f: usize = f
        .trim()
        .parse()
        .map_err(|_| SimError::Args(format!("bad framework count in {s:?}")))?;
    if a == 0 || f == 0 {
        return Err(SimError::Args(format!(
            "size {s:?}: counts must be positive"
        )));
    }
    Ok((a, f))
}

const LONG_FILTER_MS: u64 = 365 * 24 * 3600 * 1000;

fn agent_resources() -> Resources {
    Resources::new()
        .with("cpus", 24.0)
        .with("mem", 4096.0)
        .with("disk", 4096.0)
}

/// Runs cycles: each `allocate()` is timed, then its offers are declined with a long filter.
struct Cycles {
    first_ms: f64,
    first_offers: usize,
    wall_ms: Vec<f64>,
    cpu_ms: Vec<f64>,
    offers: Vec<usize>,
}

fn run_cycles(alloc: &mut Allocator, warmup: usize, cycles: usize) -> Cycles {
    let mut now = 1_000;
    for _ in 0..warmup {
        for o in alloc.allocate(now) {
            let _ = alloc.decline(o.id, Some(LONG_FILTER_MS), now);
        }
        now += 1_000;
    }
    let start = Instant::now();
    let offers = alloc.allocate(now);
    let first = start.elapsed().as_secs_f64() * 1000.0;
    let first_offers = offers.len();
    for o in offers {
        let _ = alloc.decline(o.id, Some(LONG_FILTER_MS), now);
    }
    let mut times = Vec::with_capacity(cycles);
    let mut cpu = Vec::with_capacity(cycles);
    let mut counts = Vec::with_capacity(cycles);
    for _ in 0..cycles {
        now += 1_000;
        let cpu0 = thread_cpu_ms();
        let start = Instant::now();
        let offers = alloc.allocate(now);
        times.push(start.elapsed().as_secs_f64() * 1000.0);
        cpu.push(thread_cpu_ms() - cpu0);
        counts.push(offers.len());
        for o in offers {
            let _ = alloc.decline(o.id, Some(LONG_FILTER_MS), now);
        }
    }
    Cycles {
        first_ms: first,
        first_offers,
        wall_ms: times,
        cpu_ms: cpu,
        offers: counts,
    }
}

fn median_f(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[s.len() / 2]
}

fn median_u(v: &[usize]) -> usize {
    if v.is_empty() {
        return 0;
    }
    let mut s = v.to_vec();
    s.sort_unstable();
    s[s.len() / 2]
}

/// The DeclineOffers setup at `agents` / `frameworks`.
pub fn decline_offers(
    agents: usize,
    frameworks: usize,
    warmup: usize,
    cycles: usize,
) -> BenchResult {
    let rss0 = rss_kib();
    let build = Instant::now();
    let mut alloc = Allocator::new(AllocatorConfig::default());
    let role = vec!["role1".to_string()];
    let fids: Vec<FrameworkId> = (0..frameworks)
        .map(|i| FrameworkId::from_u128(1 + i as u128))
        .collect();
    for (i, f) in fids.iter().enumerate() {
        alloc.add_framework(*f, &format!("framework{i}"), &role, false, None);
    }
    let held = OfferResources::unreserved(Resources::new().with("cpus", 16.0));
    for i in 0..agents {
        let a = AgentId::from_u128((1u128 << 64) + i as u128);
        alloc.add_agent(a, &format!("agent{i}"), agent_resources(), BTreeMap::new());
        let _ = alloc.add_allocation(fids[i % frameworks], a, "role1", &held);
    }
    let build_ms = build.elapsed().as_secs_f64() * 1000.0;
    let c = run_cycles(&mut alloc, warmup, cycles);
    let rss1 = rss_kib();
    BenchResult {
        name: "DeclineOffers".into(),
        agents,
        frameworks,
        roles: 1,
        first_cycle_ms: c.first_ms,
        median_cycle_ms: median_f(&c.wall_ms),
        median_cycle_cpu_ms: median_f(&c.cpu_ms),
        max_cycle_ms: c.wall_ms.iter().copied().fold(0.0, f64::max),
        cycles,
        warmup_cycles: warmup,
        offers_first_cycle: c.first_offers,
        offers_per_cycle_median: median_u(&c.offers),
        build_ms,
        rss_growth_mib: rss1.saturating_sub(rss0) as f64 / 1024.0,
    }
}

/// `roles` roles, each with a quota guarantee and one framework, on `agents` agents.
pub fn quota_roles(agents: usize, roles: usize, warmup: usize, cycles: usize) -> BenchResult {
    let rss0 = rss_kib();
    let build = Instant::now();
    let mut alloc = Allocator::new(AllocatorConfig::default());
    let guarantee = Resources::new().with("cpus", 8.0).with("mem", 1024.0);
    for i in 0..roles {
        let role = format!("quota-role{i}");
        alloc
            .set_quota(&role, Some(guarantee.clone()), None)
            .expect("top-level guarantees always nest");
        alloc.add_framework(
            FrameworkId::from_u128(1 + i as u128),
            &format!("framework{i}"),
            &[role],
            false,
            None,
        );
    }
    for i in 0..agents {
        let a = AgentId::from_u128((1u128 << 64) + i as u128);
        alloc.add_agent(a, &format!("agent{i}"), agent_resources(), BTreeMap::new());
    }
    let build_ms = build.elapsed().as_secs_f64() * 1000.0;
    let c = run_cycles(&mut alloc, warmup, cycles);
    let rss1 = rss_kib();
    BenchResult {
        name: "QuotaRoles".into(),
        agents,
        frameworks: roles,
        roles,
        first_cycle_ms: c.first_ms,
        median_cycle_ms: median_f(&c.wall_ms),
        median_cycle_cpu_ms: median_f(&c.cpu_ms),
        max_cycle_ms: c.wall_ms.iter().copied().fold(0.0, f64::max),
        cycles,
        warmup_cycles: warmup,
        offers_first_cycle: c.first_offers,
        offers_per_cycle_median: median_u(&c.offers),
        build_ms,
        rss_growth_mib: rss1.saturating_sub(rss0) as f64 / 1024.0,
    }
}

/// Runs `gantry-master bench`, printing results to stdout.
pub fn run(args: BenchArgs) -> Result<(), SimError> {
    if let Some(one) = &args.one {
        let r = if one == "quota" {
            quota_roles(
                args.quota_agents,
                args.quota_roles,
                args.warmup,
                args.cycles,
            )
        } else {
            let (a, f) = parse_size(one)?;
            decline_offers(a, f, args.warmup, args.cycles)
        };
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    let sizes: Vec<(usize, usize)> = args
        .sizes
        .iter()
        .map(|s| parse_size(s))
        .collect::<Result<_, _>>()?;
    if !args.json {
        println!(
            "{:<14} {:>7} {:>6} {:>6} {:>10} {:>11} {:>10} {:>9} {:>8} {:>8} {:>9} {:>8}",
            "benchmark",
            "agents",
            "fwks",
            "roles",
            "first ms",
            "median ms",
            "cpu ms",
            "max ms",
            "offers1",
            "offers",
            "build ms",
            "rss MiB"
        );
    }
    let mut results = Vec::new();
    for (a, f) in sizes {
        let r = if args.in_process {
            decline_offers(a, f, args.warmup, args.cycles)
        } else {
            isolated(&args, &format!("{a}x{f}"), || {
                decline_offers(a, f, args.warmup, args.cycles)
            })
        };
        results.push(r);
        print_result(results.last(), args.json)?;
    }
    if args.quota_roles > 0 {
        let (qa, qr, w, c) = (
            args.quota_agents,
            args.quota_roles,
            args.warmup,
            args.cycles,
        );
        results.push(if args.in_process {
            quota_roles(qa, qr, w, c)
        } else {
            isolated(&args, "quota", || quota_roles(qa, qr, w, c))
        });
        print_result(results.last(), args.json)?;
    }
    Ok(())
}

fn print_result(r: Option<&BenchResult>, json: bool) -> Result<(), SimError> {
    let Some(r) = r else { return Ok(()) };
    if json {
        println!("{}", serde_json::to_string(r)?);
    } else {
        println!(
            "{:<14} {:>7} {:>6} {:>6} {:>10.2} {:>11.3} {:>10.3} {:>9.3} {:>8} {:>8} {:>9.0} {:>8.1}",
            r.name,
            r.agents,
            r.frameworks,
            r.roles,
            r.first_cycle_ms,
            r.median_cycle_ms,
            r.median_cycle_cpu_ms,
            r.max_cycle_ms,
            r.offers_first_cycle,
            r.offers_per_cycle_median,
            r.build_ms,
            r.rss_growth_mib
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_decline_offers_offers_every_agent_then_moves_on() {
        let r = decline_offers(20, 4, 0, 3);
        // Every agent has cpus:8 free: 20 offers in the first cycle, and after declines the
        // agents go to other frameworks (4 frameworks, so offers continue for 3 more cycles).
        assert_eq!(r.offers_first_cycle, 20);
        assert_eq!(r.offers_per_cycle_median, 20);
        let done = decline_offers(20, 1, 0, 3);
        assert_eq!(done.offers_first_cycle, 20);
        assert_eq!(
            done.offers_per_cycle_median, 0,
            "one framework, everything filtered"
        );
    }

    #[test]
    fn quota_roles_setup_offers_guarantees() {
        let r = quota_roles(10, 5, 0, 2);
        assert!(r.offers_first_cycle >= 5);
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("10000x1000").unwrap(), (10000, 1000));
        assert!(parse_size("10000").is_err());
        assert!(parse_size("0x1").is_err());
    }
}
