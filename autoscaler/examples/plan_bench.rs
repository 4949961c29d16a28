//! Scale-up decision time: `plan` for 10,000 pending jobs of 50 shapes over 20 pools (issue
//! 31's target: < 100 ms). Prints figures; docs/benchmarks.md records them.
//!
//! `cargo run -p gantry-autoscaler --example plan_bench [--release]`

use std::time::Instant;

use gantry_autoscaler::plan::{plan, DemandItem, PoolShape};
use gantry_placement::GpuDemand;

fn main() {
    let models = ["A100", "H100", "L4", "T4"];
    let pools: Vec<PoolShape> = (0..20u32)
        .map(|i| {
            let gpus = [0, 1, 2, 4, 8][(i % 5) as usize];
            PoolShape {
                name: format!("pool-{i}"),
                cpu_milli: 32_000 + u64::from(i) * 4_000,
                mem_mib: 262_144,
                gpus,
                gpu_model: if gpus == 0 {
                    String::new()
                } else {
                    models[(i % 4) as usize].to_string()
                },
                price_per_hour: 1.0 + f64::from(gpus) * (1.5 + f64::from(i % 4) * 0.5),
                spot: false,
                room: 1_000,
                provisioning: 0,
            }
        })
        .collect();
    let demand: Vec<DemandItem> = (0..50u32)
        .map(|i| DemandItem {
            source: format!("job-class-{i}"),
            cpu_milli: 1_000 + u64::from(i % 8) * 1_000,
            mem_mib: 1_024 * u64::from(1 + i % 16),
            gpu: match i % 5 {
                0 => GpuDemand::None,
                1 => GpuDemand::Fraction(250 + (i % 3) * 250),
                2 => GpuDemand::Whole(1),
                3 => GpuDemand::Whole(2),
                _ => GpuDemand::Whole(8),
            },
            models: if i % 7 == 0 {
                vec![models[(i % 4) as usize].to_string()]
            } else {
                Vec::new()
            },
            on_demand: false,
            count: 200,
        })
        .collect();
    let jobs: u32 = demand.iter().map(|d| d.count).sum();
    for round in 0..3 {
        let t = Instant::now();
        let p = plan(&pools, &demand);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let nodes: u32 = p.add.values().sum();
        println!(
            "round {round}: {jobs} pending jobs, {} pools -> {nodes} nodes in {} pools, \
             {} unfittable, {} capped: {ms:.1} ms",
            pools.len(),
            p.add.len(),
            p.unfittable.iter().map(|u| u.count).sum::<u32>(),
            p.capped
        );
    }
}
