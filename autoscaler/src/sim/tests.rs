//! The simulator's tests.

use super::*;
use crate::config::Config;

const POOLS: &str = r#"
    [[pool]]
    name = "gpu"
    cpus = 16
    mem = 65536
    gpus = 2
    gpu_model = "G2"
    price_per_hour = 3.6
    max = 10
    scale_down_cooldown = "10m"
    provider = { kind = "local" }
"#;

const TRACE: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p0,1000,1024,1,1000,,LS,Running,0,3600,0
p1,1000,1024,1,1000,,LS,Running,0,3600,0
p2,1000,1024,1,500,,BE,Running,1800,5400,1800
p3,1000,1024,8,1000,,BE,Running,1800,5400,1800
";

#[test]
fn the_openb_format_is_read() {
    let t = parse_openb(TRACE).unwrap();
    assert_eq!(t.len(), 4);
    assert_eq!(t[2].gpu, GpuDemand::Fraction(500));
    assert_eq!(t[3].gpu, GpuDemand::Whole(8));
    assert_eq!((t[0].arrival, t[0].duration), (0, 3600));
    assert_eq!(t[2].qos, "BE");
    let header = TRACE.lines().next().unwrap();
    let e = parse_openb(&format!("{header}\np,x,1,1,1,,LS,R,0,1,0\n")).unwrap_err();
    assert_eq!(e.line, 2);
    assert!(e.message.contains("cpu_milli"), "{e}");
    let e = parse_openb("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,1\n").unwrap_err();
    assert!(e.message.contains("creation_time"), "{e}");
}

#[test]
fn an_elastic_fleet_serves_the_trace_and_costs_less_than_a_static_peak_one() {
    let config = Config::parse(POOLS).unwrap();
    let tasks = parse_openb(TRACE).unwrap();
    let s = SimSettings::new(60, 120);
    let elastic = simulate(&config, &tasks, &s);
    assert_eq!(elastic.placed, 3, "{elastic:?}");
    assert_eq!(elastic.unfittable, 1, "the 8-GPU task: {elastic:?}");
    assert_eq!(elastic.never_placed, 0);
    // Two 1-GPU tasks fill the first node; the half-GPU task, later, needs a second.
    assert_eq!(elastic.nodes_created, 2, "{elastic:?}");
    assert_eq!(elastic.pending_p50_s, 120, "{elastic:?}");
    assert_eq!(elastic.peak_nodes["gpu"], 2);
    assert_eq!(elastic.scale_downs, 2);
    let fixed = simulate(&static_fleet(&config, &elastic.peak_nodes), &tasks, &s);
    assert_eq!(fixed.placed, 3);
    assert!(
        elastic.cost > 0.0 && elastic.cost <= fixed.cost,
        "{elastic:?} {fixed:?}"
    );
}

const SPOT_POOLS: &str = r#"
    [autoscaler]
    notice_deadline = "2m"
    spot_failures_before_fallback = 1

    [[pool]]
    name = "spot"
    cpus = 16
    mem = 65536
    gpus = 2
    gpu_model = "G2"
    price_per_hour = 1.0
    spot = true
    fallback = "od"
    max = 10
    scale_down_cooldown = "10m"
    provider = { kind = "local" }

    [[pool]]
    name = "od"
    cpus = 16
    mem = 65536
    gpus = 2
    gpu_model = "G2"
    price_per_hour = 3.0
    max = 10
    scale_down_cooldown = "10m"
    provider = { kind = "local" }
"#;

#[test]
fn the_interruption_model_is_seeded_memoryless_and_at_its_rate() {
    let m = SpotModel {
        rate_per_node_hour: 0.5,
        seed: 7,
        fixed: BTreeMap::from([("pinned".to_string(), 42)]),
    };
    // Reproducible, per node id; the fixed time wins.
    assert_eq!(m.notice_after("a-1"), m.notice_after("a-1"));
    assert_ne!(m.notice_after("a-1"), m.notice_after("a-2"));
    assert_eq!(m.notice_after("pinned"), Some(42));
    let other = SpotModel {
        seed: 8,
        ..m.clone()
    };
    assert_ne!(m.notice_after("a-1"), other.notice_after("a-1"));
    // No rate, no notices.
    assert_eq!(SpotModel::default().notice_after("a-1"), None);
    // An exponential of rate 0.5/h: mean 2 h, and P(notice within an hour) = 1 - e^-0.5
    // (39.3%), over 4,000 nodes.
    let draws: Vec<u64> = (0..4000)
        .map(|i| m.notice_after(&format!("n-{i}")).unwrap())
        .collect();
    let mean_h = draws.iter().sum::<u64>() as f64 / draws.len() as f64 / 3600.0;
    assert!((mean_h - 2.0).abs() < 0.1, "mean {mean_h} h");
    let first_hour = draws.iter().filter(|&&s| s < 3600).count() as f64 / 4000.0;
    assert!((first_hour - 0.393).abs() < 0.03, "{first_hour}");
    // Memoryless: of the nodes that lived an hour, the same share goes in the second.
    let lived: Vec<u64> = draws.iter().copied().filter(|&s| s >= 3600).collect();
    let second = lived.iter().filter(|&&s| s < 7200).count() as f64 / lived.len() as f64;
    assert!((second - 0.393).abs() < 0.04, "{second}");
}

#[test]
fn a_kill_keeps_whole_checkpoint_intervals() {
    assert_eq!(checkpoint_split(1120, 600), (600, 520));
    assert_eq!(checkpoint_split(1200, 600), (1200, 0));
    assert_eq!(checkpoint_split(599, 600), (0, 599));
    assert_eq!(checkpoint_split(1120, 0), (0, 1120), "no checkpoints");
    assert_eq!(checkpoint_split(0, 600), (0, 0));
}

#[test]
fn an_interrupted_task_loses_what_ran_since_its_checkpoint_and_finishes_on_demand() {
    let config = Config::parse(SPOT_POOLS).unwrap();
    let header = TRACE.lines().next().unwrap();
    let tasks = parse_openb(&format!(
        "{header}\nbe,1000,1024,1,1000,,BE,Running,0,3600,0\n"
    ))
    .unwrap();
    let mut s = SimSettings::new(60, 120);
    // The first spot node (`spot-1`, registered at 120 s) gets its notice 1,000 s later.
    s.spot.fixed.insert("spot-1".into(), 1000);
    let r = simulate(&config, &tasks, &s);
    // The BE task goes to spot (3x cheaper), placed at 120 s. Notice at 1,120 s (seen at
    // the 1,140 s tick): the node drains and the core replaces it on demand (one
    // interruption in a row is the fallback's threshold); reclaimed at 1,240 s: the task
    // ran 1,120 s, kept 600 (its checkpoint), lost 520; the on-demand node registers at
    // 1,260 s and runs the remaining 3,000 s.
    assert_eq!(r.interruptions, 1, "{r:?}");
    assert_eq!(r.tasks_interrupted, 1, "{r:?}");
    assert_eq!(r.interrupted_tasks_finished, 1, "{r:?}");
    assert_eq!(r.finished, 1);
    assert_eq!(r.work_lost_task_s, 520, "{r:?}");
    assert!((r.work_lost_gpu_s - 520.0).abs() < 1e-9);
    assert_eq!((r.replacements, r.fallback_replacements), (1, 1), "{r:?}");
    assert_eq!(r.pending_p50_s, 120, "first placement only");
    assert_eq!(r.peak_nodes["spot"], 1);
    assert_eq!(r.peak_nodes["od"], 1);
    // Cost: the spot node from 0 to its reclaim (1,240 s) at 1/h; the on-demand node from
    // 1,140 s to its scale-down (its task ends at 4,260 s, then 10 min idle, then a tick
    // to drain and one to delete) at 3/h.
    let spot = r.cost_per_pool["spot"];
    assert!((spot - 1240.0 / 3600.0).abs() < 1e-9, "{spot}");
    let od_s = r.cost_per_pool["od"] * 3600.0 / 3.0;
    assert!(
        (4260.0 + 600.0 - 1140.0..=4260.0 + 600.0 + 180.0 - 1140.0).contains(&od_s),
        "{od_s}"
    );

    // Without the notice: no loss, one spot node, cheaper.
    let calm = simulate(&config, &tasks, &SimSettings::new(60, 120));
    assert_eq!((calm.interruptions, calm.work_lost_task_s), (0, 0));
    assert!(calm.cost < r.cost);
    // A class that does not checkpoint loses everything it ran.
    let mut s2 = s.clone();
    s2.checkpoint_s.clear();
    let r2 = simulate(&config, &tasks, &s2);
    assert_eq!(r2.work_lost_task_s, 1120, "{r2:?}");
}

#[test]
fn latency_sensitive_tasks_run_on_demand_and_best_effort_ones_on_spot() {
    let config = Config::parse(SPOT_POOLS).unwrap();
    let header = TRACE.lines().next().unwrap();
    let tasks = parse_openb(&format!(
        "{header}\nls,1000,1024,1,1000,,LS,Running,0,3600,0\n\
         be,1000,1024,1,1000,,BE,Running,0,3600,0\n"
    ))
    .unwrap();
    let r = simulate(&config, &tasks, &SimSettings::new(60, 120));
    assert_eq!(r.finished, 2);
    // One node of each: the LS task's on demand though spot is cheaper, the BE task's on
    // spot (one 2-GPU node could have held both).
    assert_eq!((r.peak_nodes["od"], r.peak_nodes["spot"]), (1, 1), "{r:?}");
    // Without QoS acted on: one spot node holds both.
    let mut s = SimSettings::new(60, 120);
    s.on_demand_classes.clear();
    let r = simulate(&config, &tasks, &s);
    assert_eq!((r.peak_nodes["od"], r.peak_nodes["spot"]), (0, 1), "{r:?}");
    // The static fleet is bought on demand: the spot pool's peak counts on its fallback.
    let fixed = static_fleet(&config, &r.peak_nodes);
    assert_eq!(fixed.pools.len(), 1);
    assert_eq!(
        (fixed.pools[0].name.as_str(), fixed.pools[0].min),
        ("od", 1)
    );
}

#[test]
fn interruption_times_are_read_from_a_file() {
    let x = parse_interruptions("# a comment\ntime_s,pool,node\n\n30,spot\n10,od,od-3\n").unwrap();
    assert_eq!(
        x,
        [
            Interruption {
                at_s: 10,
                pool: "od".into(),
                node: Some("od-3".into())
            },
            Interruption {
                at_s: 30,
                pool: "spot".into(),
                node: None
            },
        ]
    );
    let e = parse_interruptions("10,spot\ntime_s,pool\n").unwrap_err();
    assert!(
        e.message.contains("time_s"),
        "only a first line is a header: {e}"
    );
    let e = parse_interruptions("10,spot\nsoon,spot\n").unwrap_err();
    assert_eq!(e.line, 2);
    assert!(e.message.contains("soon"), "{e}");
    let e = parse_interruptions("10\n").unwrap_err();
    assert!(e.message.contains("time_s,pool"), "{e}");
    let e = parse_interruptions("10,,n\n").unwrap_err();
    assert!(e.message.contains("pool"), "{e}");
}

#[test]
fn a_checkpoint_at_the_notice_loses_only_the_work_since_it_minus_its_grace() {
    // Ran 1,000 s, the last 120 after the notice; periodic checkpoints every 600 s.
    assert_eq!(kill_split(1000, Some(120), 600, None), (600, 400));
    assert_eq!(kill_split(1000, Some(120), 600, Some(30)), (880, 90));
    // A checkpoint that needs more than the notice gave: the periodic one.
    assert_eq!(kill_split(1000, Some(120), 600, Some(200)), (600, 400));
    // No notice (killed outright): periodic only.
    assert_eq!(kill_split(1000, None, 600, Some(30)), (600, 400));
    // A periodic checkpoint after the notice keeps more.
    assert_eq!(kill_split(1300, Some(120), 600, Some(30)), (1200, 100));
}

#[test]
fn a_file_notice_interrupts_the_busiest_node_and_notice_checkpoints_cut_the_loss() {
    let config = Config::parse(SPOT_POOLS).unwrap();
    let header = TRACE.lines().next().unwrap();
    let tasks = parse_openb(&format!(
        "{header}\nbe,1000,1024,1,1000,,BE,Running,0,3600,0\n"
    ))
    .unwrap();
    let mut s = SimSettings::new(60, 120);
    // At 1,000 s a notice to the spot pool (its busiest node: spot-1, the task's, registered
    // at 120 s); one to a node that does not exist and one to a pool without nodes miss.
    s.interruptions = parse_interruptions("1000,spot\n1000,spot,spot-9\n1000,od\n").unwrap();
    let r = simulate(&config, &tasks, &s);
    // Reclaimed at 1,120 s: the task ran 1,000 s, keeps its 600 s checkpoint, loses 400.
    assert_eq!(r.interruptions, 1, "{r:?}");
    assert_eq!(r.interruptions_missed, 2, "{r:?}");
    assert_eq!(r.tasks_interrupted, 1, "{r:?}");
    assert_eq!(r.finished, 1);
    assert_eq!(r.work_lost_task_s, 400, "{r:?}");
    // Checkpointing at the notice (30 s of grace): only 120 − 30 s lost.
    s.checkpoint_on_notice.insert("BE".into(), 30);
    let r = simulate(&config, &tasks, &s);
    assert_eq!((r.tasks_interrupted, r.work_lost_task_s), (1, 90), "{r:?}");
}

const CONSOLIDATING_POOLS: &str = r#"
    [autoscaler]
    consolidation = true
    consolidation_delay = "5m"
    consolidation_deadline = "5m"

    [[pool]]
    name = "big"
    cpus = 16
    mem = 65536
    gpus = 4
    gpu_model = "G2"
    price_per_hour = 6.0
    max = 10
    scale_down_cooldown = "10m"
    provider = { kind = "local" }

    [[pool]]
    name = "one"
    cpus = 4
    mem = 16384
    gpus = 1
    gpu_model = "G2"
    price_per_hour = 2.0
    max = 10
    scale_down_cooldown = "10m"
    provider = { kind = "local" }
"#;

#[test]
fn the_simulator_consolidates_by_removal_and_by_replacement_with_several_cheaper_nodes() {
    let config = Config::parse(CONSOLIDATING_POOLS).unwrap();
    let header = TRACE.lines().next().unwrap();
    // Eight 1-GPU tasks at 0 (two big nodes: 1.5/GPU-h beats 2); six end at 10 min, two run
    // 10 h: one per big node, as best-fit fills the first node first.
    let mut trace = header.to_string();
    for i in 0..8 {
        let end = if i == 0 || i == 4 { 36_000 } else { 600 };
        trace.push_str(&format!("\nt{i},1000,1024,1,1000,,BE,Running,0,{end},0"));
    }
    let tasks = parse_openb(&trace).unwrap();
    let mut s = SimSettings::new(60, 120);
    s.checkpoint_on_notice.insert("BE".into(), 30);
    let r = simulate_consolidation(&config, &tasks, &s);
    assert_eq!((r.finished, r.never_placed), (8, 0), "{r:?}");
    assert_eq!(r.peak_nodes["big"], 2, "{r:?}");
    // One big node removed (its task fits the other), then the other replaced by two "one"
    // nodes (4/h against 6/h).
    assert_eq!((r.consolidations, r.replaced_by_cheaper), (2, 1), "{r:?}");
    assert_eq!(r.peak_nodes["one"], 2, "{r:?}");
    assert_eq!(r.moved_tasks, 3, "{r:?}");
    assert!(r.moved_task_s > 3 * 30_000, "{r:?}");
    // Checkpointed at the drain: nothing lost; and cheaper than without consolidation.
    assert_eq!(r.work_lost_task_s, 0, "{r:?}");
    assert!(r.consolidation_saved > 0.0, "{r:?}");
    let mut off = config.clone();
    off.autoscaler.consolidation = false;
    let plain = simulate(&off, &tasks, &s);
    assert_eq!(plain.consolidations, 0);
    assert!((plain.cost - r.cost - r.consolidation_saved).abs() < 1e-9);
    // Without notice checkpoints, a move keeps the periodic ones only: work is lost.
    s.checkpoint_on_notice.clear();
    let r2 = simulate(&config, &tasks, &s);
    assert!(r2.work_lost_task_s > 0, "{r2:?}");
}
