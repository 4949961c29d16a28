use super::*;
use crate::config::{PoolSpec, ProviderSpec, Settings};
use crate::plan::gpu_task;
use proptest::prelude::*;
use std::time::Duration;

fn spec(name: &str, gpus: u32, price: f64, min: u32, max: u32) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        cpus: 16.0,
        mem: 65536,
        disk: 0,
        gpus,
        gpu_model: (gpus > 0).then(|| "A100".to_string()),
        attributes: Default::default(),
        price_per_hour: price,
        spot: false,
        min,
        max,
        scale_up_cooldown: Duration::ZERO,
        scale_down_cooldown: Duration::from_secs(60),
        provision_timeout: Duration::from_secs(600),
        fallback: None,
        provider: ProviderSpec::Local,
    }
}

fn config(pools: Vec<PoolSpec>) -> Config {
    let c = Config {
        autoscaler: Settings::default(),
        pools,
    };
    c.check().unwrap();
    c
}

/// Carries out `actions` as a provider would, naming nodes `POOL-N`.
fn apply(core: &mut Core, actions: &[Action], now: Millis, next: &mut u32) -> Vec<String> {
    let mut made = Vec::new();
    for a in actions {
        match a {
            Action::Create { pool, count, .. } => {
                let ids: Vec<String> = (0..*count)
                    .map(|_| {
                        *next += 1;
                        format!("{pool}-{next}")
                    })
                    .collect();
                core.created(pool, &ids, now);
                made.extend(ids);
            }
            Action::Delete { node } => core.deleted(node, now),
            Action::Drain { .. } => {}
        }
    }
    made
}

fn node(id: &str, busy: bool) -> NodeObs {
    NodeObs {
        id: id.into(),
        registered: true,
        busy,
        ..Default::default()
    }
}

fn creates(actions: &[Action]) -> Vec<(String, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Create { pool, count, .. } => Some((pool.clone(), *count)),
            _ => None,
        })
        .collect()
}

#[test]
fn demand_scales_up_once_then_idle_nodes_drain_and_go_after_the_cooldown() {
    let mut core = Core::new(config(vec![spec("gpu", 2, 3.6, 0, 4)]));
    let mut next = 0;
    let demand = Observation {
        demand: vec![gpu_task(1, 3, &[])],
        nodes: vec![],
        tasks: Vec::new(),
    };
    let a = core.step(0, &demand);
    assert_eq!(creates(&a), [("gpu".to_string(), 2)]);
    let ids = apply(&mut core, &a, 0, &mut next);
    // Still unplaceable while they boot: nothing more is asked for.
    assert!(core.step(1_000, &demand).is_empty());
    // Registered and busy; demand placed.
    let busy = Observation {
        demand: vec![],
        nodes: ids.iter().map(|i| node(i, true)).collect(),
        tasks: Vec::new(),
    };
    assert!(core.step(2_000, &busy).is_empty());
    // Idle from 10 s: nothing before 70 s, then both drain, then go.
    let idle = Observation {
        demand: vec![],
        nodes: ids.iter().map(|i| node(i, false)).collect(),
        tasks: Vec::new(),
    };
    assert!(core.step(10_000, &idle).is_empty());
    assert!(core.step(69_999, &idle).is_empty());
    let a = core.step(70_000, &idle);
    assert_eq!(a.len(), 2);
    assert!(a.iter().all(|a| matches!(
        a,
        Action::Drain {
            deadline_secs: None,
            ..
        }
    )));
    let a = core.step(71_000, &idle);
    assert_eq!(
        a,
        ids.iter()
            .map(|i| Action::Delete { node: i.clone() })
            .collect::<Vec<_>>()
    );
    apply(&mut core, &a, 72_000, &mut next);
    let r = core.report(100_000);
    assert_eq!(r.pools[0].nodes, 0);
    // 2 nodes × 72 s at 3.6/h.
    assert!((r.pools[0].node_seconds - 144.0).abs() < 1e-9, "{r:?}");
    assert!((r.total_cost - 0.144).abs() < 1e-9, "{r:?}");
    assert_eq!(r.pools[0].scale_ups, 1);
    assert_eq!(r.pools[0].scale_downs, 2);
}

#[test]
fn a_node_that_never_registers_is_deleted_as_failed_and_replaced() {
    let mut core = Core::new(config(vec![spec("gpu", 1, 1.0, 0, 1)]));
    let mut next = 0;
    let demand = Observation {
        demand: vec![gpu_task(1, 1, &[])],
        nodes: vec![],
        tasks: Vec::new(),
    };
    let a = core.step(0, &demand);
    let ids = apply(&mut core, &a, 0, &mut next);
    assert!(core.step(599_999, &demand).is_empty());
    // Past the timeout: deleted; max is 1, so the replacement comes once it is gone.
    let a = core.step(600_000, &demand);
    assert_eq!(
        a,
        [Action::Delete {
            node: ids[0].clone()
        }]
    );
    apply(&mut core, &a, 600_000, &mut next);
    assert_eq!(core.report(600_000).pools[0].provision_failures, 1);
    let a = core.step(601_000, &demand);
    assert_eq!(creates(&a), [("gpu".to_string(), 1)]);
}

#[test]
fn min_is_kept_and_never_drained_below() {
    let mut core = Core::new(config(vec![spec("cpu", 0, 1.0, 2, 5)]));
    let mut next = 0;
    let a = core.step(0, &Observation::default());
    assert_eq!(creates(&a), [("cpu".to_string(), 2)]);
    let ids = apply(&mut core, &a, 0, &mut next);
    let idle = Observation {
        demand: vec![],
        nodes: ids.iter().map(|i| node(i, false)).collect(),
        tasks: Vec::new(),
    };
    for t in [1_000, 100_000, 1_000_000] {
        assert!(core.step(t, &idle).is_empty(), "at {t}");
    }
}

#[test]
fn unfittable_demand_is_reported_and_not_scaled_for() {
    let mut core = Core::new(config(vec![spec("gpu", 2, 1.0, 0, 5)]));
    let a = core.step(
        0,
        &Observation {
            demand: vec![gpu_task(4, 2, &[]), gpu_task(1, 1, &["H100"])],
            nodes: vec![],
            tasks: Vec::new(),
        },
    );
    assert!(a.is_empty(), "{a:?}");
    let r = core.report(0);
    assert_eq!(r.unfittable.len(), 2, "{r:?}");
    assert_eq!(r.unfittable[0].count, 2);
}

#[test]
fn scale_up_cooldown_holds_further_scale_ups() {
    let mut s = spec("gpu", 1, 1.0, 0, 10);
    s.scale_up_cooldown = Duration::from_secs(30);
    let mut core = Core::new(config(vec![s]));
    let mut next = 0;
    let d = |n| Observation {
        demand: vec![gpu_task(1, n, &[])],
        nodes: vec![],
        tasks: Vec::new(),
    };
    let a = core.step(0, &d(1));
    apply(&mut core, &a, 0, &mut next);
    // More demand (beyond the provisioning node) during the cooldown: held.
    assert!(core.step(10_000, &d(3)).is_empty());
    let a = core.step(30_000, &d(3));
    assert_eq!(creates(&a), [("gpu".to_string(), 2)]);
}

#[test]
fn spot_notices_drain_replace_and_fall_back_to_on_demand() {
    let mut spot = spec("spot", 1, 1.0, 0, 5);
    spot.spot = true;
    spot.fallback = Some("ondemand".into());
    let mut c = config(vec![spot, spec("ondemand", 1, 3.0, 0, 5)]);
    c.autoscaler.spot_failures_before_fallback = 2;
    c.autoscaler.notice_deadline = Duration::from_secs(90);
    let mut core = Core::new(c);
    let mut next = 0;
    core.created("spot", &["s1".into(), "s2".into()], 0);
    let obs = |n: Vec<NodeObs>| Observation {
        demand: vec![],
        nodes: n,
        tasks: Vec::new(),
    };
    let noticed = |id: &str| NodeObs {
        notice: true,
        ..node(id, true)
    };
    // First notice: drained with the deadline, replaced in the spot pool.
    let a = core.step(1_000, &obs(vec![noticed("s1"), node("s2", true)]));
    assert_eq!(
        a,
        [
            Action::Drain {
                node: "s1".into(),
                deadline_secs: Some(90)
            },
            Action::Create {
                pool: "spot".into(),
                count: 1,
                reason: "replace"
            }
        ]
    );
    apply(&mut core, &a, 1_000, &mut next);
    // Second in a row (the agent drains itself already): replaced on demand.
    let draining_notice = NodeObs {
        draining: true,
        ..noticed("s2")
    };
    let a = core.step(2_000, &obs(vec![noticed("s1"), draining_notice]));
    assert_eq!(creates(&a), [("ondemand".to_string(), 1)]);
    assert!(!a.iter().any(|a| matches!(a, Action::Drain { .. })));
    let r = core.report(2_000);
    assert_eq!(r.pools[0].interruptions, 2);
    assert_eq!(r.pools[1].interruptions, 0);
    // Once idle they are deleted.
    let a = core.step(3_000, &obs(vec![node("s1", false), node("s2", false)]));
    assert_eq!(a.len(), 2, "{a:?}");
    assert!(a.iter().all(|a| matches!(a, Action::Delete { .. })));
}

#[test]
fn an_idle_node_with_a_notice_is_not_replaced() {
    let mut spot = spec("spot", 1, 1.0, 0, 5);
    spot.spot = true;
    let mut core = Core::new(config(vec![spot]));
    core.created("spot", &["s1".into()], 0);
    let a = core.step(
        1_000,
        &Observation {
            demand: vec![],
            nodes: vec![NodeObs {
                notice: true,
                ..node("s1", false)
            }],
            tasks: Vec::new(),
        },
    );
    assert!(creates(&a).is_empty(), "{a:?}");
}

// ---------------------------------------------------------------------------------------------
// Properties.

fn arb_pool(i: usize) -> impl Strategy<Value = PoolSpec> {
    (0u32..=4, 1u32..=8, 0u32..=3, 0.5f64..20.0, 0u64..=3).prop_map(
        move |(gpus, max, min, price, cool)| {
            let mut s = spec(&format!("p{i}"), gpus, price, min.min(max), max);
            s.scale_down_cooldown = Duration::from_secs(cool * 10);
            s.scale_up_cooldown = Duration::from_secs(cool * 5);
            s
        },
    )
}

fn arb_demand() -> impl Strategy<Value = Vec<DemandItem>> {
    prop::collection::vec(
        (0u32..=6, 1u32..=12, prop::bool::ANY).prop_map(|(g, n, h100)| {
            let models: &[&str] = if h100 { &["H100"] } else { &[] };
            gpu_task(g, n, models)
        }),
        0..4,
    )
}

/// Per round: demand, and for each node (by index) whether it is busy and gets a notice.
type Round = (Vec<DemandItem>, Vec<(bool, bool)>);

fn arb_rounds() -> impl Strategy<Value = Vec<Round>> {
    prop::collection::vec(
        (
            arb_demand(),
            prop::collection::vec((prop::bool::ANY, prop::bool::weighted(0.05)), 16),
        ),
        1..25,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn never_above_max_never_below_min_by_its_own_drains(
        pools in (arb_pool(0), arb_pool(1), arb_pool(2)),
        rounds in arb_rounds(),
    ) {
        let cfg = config(vec![pools.0, pools.1, pools.2]);
        let mut core = Core::new(cfg.clone());
        let mut next = 0;
        let mut ids: Vec<String> = Vec::new();
        for (r, (demand, flags)) in rounds.iter().enumerate() {
            let now = r as u64 * 7_000;
            let nodes: Vec<NodeObs> = ids
                .iter()
                .zip(flags)
                .map(|(id, (busy, notice))| NodeObs {
                    notice: *notice,
                    ..node(id, *busy)
                })
                .collect();
            let before = core.report(now);
            let actions = core.step(now, &Observation { demand: demand.clone(), nodes, tasks: Vec::new() });
            for (p, spec) in cfg.pools.iter().enumerate() {
                let scale_downs = actions
                    .iter()
                    .filter(|a| matches!(a, Action::Drain { node, deadline_secs: None }
                        if core.node_ids().get(&spec.name).is_some_and(|v| v.contains(node))))
                    .count() as u32;
                // What stays: the pool's nodes not leaving, plus the nodes asked for this round.
                let added: u32 = creates(&actions)
                    .iter()
                    .filter(|(pool, _)| *pool == spec.name)
                    .map(|(_, n)| n)
                    .sum();
                let staying = before.pools[p].nodes - before.pools[p].draining + added;
                prop_assert!(
                    scale_downs == 0 || staying >= scale_downs + spec.min,
                    "pool {} drained {} of {} staying below min {}: {:?} before {:?}", spec.name, scale_downs,
                    staying, spec.min, actions, before
                );
            }
            ids.extend(apply(&mut core, &actions, now, &mut next));
            ids.retain(|i| core.node_ids().values().any(|v| v.contains(i)));
            let after = core.report(now);
            for (p, spec) in cfg.pools.iter().enumerate() {
                prop_assert!(after.pools[p].nodes <= spec.max,
                    "pool {} has {} nodes, max {}", spec.name, after.pools[p].nodes, spec.max);
            }
        }
    }

    #[test]
    fn never_scales_for_demand_no_pool_can_hold(
        pools in (arb_pool(0), arb_pool(1)),
        big in 1u32..=3,
        n in 1u32..=20,
    ) {
        let cfg = config(vec![pools.0, pools.1]);
        let most = cfg.pools.iter().map(|p| p.gpus).max().unwrap_or(0);
        let mut core = Core::new(cfg);
        // More GPUs than any node has, and a model no pool has.
        let demand = vec![gpu_task(most + big, n, &[]), gpu_task(1, n, &["H100"])];
        let actions = core.step(0, &Observation { demand, nodes: vec![], tasks: Vec::new() });
        prop_assert!(
            actions.iter().all(|a| !matches!(a, Action::Create { reason: "demand", .. })),
            "{actions:?}"
        );
        prop_assert_eq!(core.report(0).unfittable.len(), 2);
    }

    #[test]
    fn never_more_nodes_than_the_demand_needs(
        gpus in 1u32..=8,
        tasks in 1u32..=40,
        per in 1u32..=8,
    ) {
        let cfg = config(vec![spec("a", gpus, 1.0, 0, 1000)]);
        let mut core = Core::new(cfg);
        let per = per.min(gpus);
        let actions = core.step(0, &Observation {
            demand: vec![gpu_task(per, tasks, &[])],
            nodes: vec![],
            tasks: Vec::new(),
        });
        let want = tasks.div_ceil(gpus / per);
        prop_assert_eq!(creates(&actions), vec![("a".to_string(), want)]);
    }
}

fn task_on(node: &str, id: &str, gpus: f64) -> crate::cost::TaskObs {
    crate::cost::TaskObs {
        id: id.into(),
        node: node.into(),
        role: "r".into(),
        framework: "f".into(),
        user: "u".into(),
        cpus: 1.0,
        mem: 64.0,
        gpus,
        staged_ms: 0,
    }
}

#[test]
fn consolidation_drains_one_busy_node_whose_tasks_fit_elsewhere_after_the_delay() {
    let mut c = config(vec![
        spec("cheap", 2, 36.0, 0, 4),
        spec("dear", 2, 72.0, 0, 4),
    ]);
    c.autoscaler.consolidation = true;
    c.autoscaler.consolidation_delay = Duration::from_secs(30);
    c.autoscaler.consolidation_deadline = Duration::from_secs(45);
    let mut off = c.clone();
    off.autoscaler.consolidation = false;
    for (mut core, enabled) in [(Core::new(c), true), (Core::new(off), false)] {
        core.created("cheap", &["cheap-1".into()], 0);
        core.created("dear", &["dear-1".into()], 0);
        // Each node runs one 1-GPU task of two GPUs: either task fits the other node.
        let obs = |_t: u64| Observation {
            nodes: vec![node("cheap-1", true), node("dear-1", true)],
            tasks: vec![task_on("cheap-1", "a", 1.0), task_on("dear-1", "b", 1.0)],
            demand: Vec::new(),
        };
        assert!(core.step(0, &obs(0)).is_empty());
        assert!(
            core.step(29_000, &obs(29_000)).is_empty(),
            "before the delay"
        );
        let a = core.step(30_000, &obs(30_000));
        if !enabled {
            assert!(a.is_empty(), "{a:?}");
            continue;
        }
        // The dearer node goes, with the deadline; one at a time.
        assert_eq!(
            a,
            [Action::Drain {
                node: "dear-1".into(),
                deadline_secs: Some(45)
            }]
        );
        assert!(core.step(60_000, &obs(60_000)).is_empty(), "one at a time");
        assert_eq!(core.report(60_000).pools[1].consolidations, 1);
        // Once its task moved (it is idle), it is deleted like any drained node.
        let moved = Observation {
            nodes: vec![node("cheap-1", true), node("dear-1", false)],
            tasks: vec![task_on("cheap-1", "a", 1.0), task_on("cheap-1", "b2", 1.0)],
            demand: Vec::new(),
        };
        assert_eq!(
            core.step(61_000, &moved),
            [Action::Delete {
                node: "dear-1".into()
            }]
        );
        // The full node is not a candidate (nowhere else to go).
        core.deleted("dear-1", 62_000);
        assert!(core.step(200_000, &moved).is_empty());
    }
}

#[test]
fn consolidation_keeps_the_pool_minimum_and_tasks_that_fit_nowhere() {
    let mut c = config(vec![spec("gpu", 2, 36.0, 2, 4)]);
    c.autoscaler.consolidation = true;
    c.autoscaler.consolidation_delay = Duration::ZERO;
    let mut core = Core::new(c);
    core.created("gpu", &["gpu-1".into(), "gpu-2".into()], 0);
    let obs = Observation {
        nodes: vec![node("gpu-1", true), node("gpu-2", true)],
        tasks: vec![task_on("gpu-1", "a", 1.0), task_on("gpu-2", "b", 1.0)],
        demand: Vec::new(),
    };
    // min = 2: neither goes.
    assert!(core.step(1000, &obs).is_empty());
    // With min 0 but a 2-GPU task on each node, nothing fits elsewhere.
    let mut c = config(vec![spec("gpu", 2, 36.0, 0, 4)]);
    c.autoscaler.consolidation = true;
    c.autoscaler.consolidation_delay = Duration::ZERO;
    let mut core = Core::new(c);
    core.created("gpu", &["gpu-1".into(), "gpu-2".into()], 0);
    let obs = Observation {
        nodes: vec![node("gpu-1", true), node("gpu-2", true)],
        tasks: vec![task_on("gpu-1", "a", 2.0), task_on("gpu-2", "b", 0.5)],
        demand: Vec::new(),
    };
    let a = core.step(1000, &obs);
    // gpu-2's half GPU fits nowhere (gpu-1 is full); gpu-1's two GPUs do not fit gpu-2.
    assert!(a.is_empty(), "{a:?}");
}

#[test]
fn consolidation_replaces_a_node_by_a_cheaper_one_that_holds_its_tasks() {
    // A 4-GPU node at 10/h running two 1-GPU tasks: a 2-GPU node at 4/h holds them.
    let mut c = config(vec![
        spec("big", 4, 10.0, 0, 4),
        spec("small", 2, 4.0, 0, 4),
        PoolSpec {
            spot: true,
            ..spec("small-spot", 2, 1.0, 0, 4)
        },
    ]);
    c.autoscaler.consolidation = true;
    c.autoscaler.consolidation_delay = Duration::from_secs(30);
    c.autoscaler.consolidation_deadline = Duration::from_secs(45);
    let mut core = Core::new(c);
    core.created("big", &["big-1".into()], 0);
    let tasks = vec![task_on("big-1", "a", 1.0), task_on("big-1", "b", 1.0)];
    let obs = |nodes: Vec<NodeObs>| Observation {
        nodes,
        tasks: tasks.clone(),
        demand: Vec::new(),
    };
    assert!(core.step(0, &obs(vec![node("big-1", true)])).is_empty());
    assert!(
        core.step(29_000, &obs(vec![node("big-1", true)]))
            .is_empty(),
        "before the delay"
    );
    // One on-demand node of the cheaper pool (not the spot one: big-1 is on demand).
    let a = core.step(30_000, &obs(vec![node("big-1", true)]));
    assert_eq!(
        a,
        [Action::Create {
            pool: "small".into(),
            count: 1,
            reason: "replace-cheaper"
        }]
    );
    core.created("small", &["small-1".into()], 30_000);
    // Until it registers, nothing more; then big-1 drains, with the deadline.
    let starting = NodeObs {
        registered: false,
        ..node("small-1", false)
    };
    assert!(core
        .step(40_000, &obs(vec![node("big-1", true), starting]))
        .is_empty());
    let both = |big_busy: bool| vec![node("big-1", big_busy), node("small-1", false)];
    assert_eq!(
        core.step(50_000, &obs(both(true))),
        [Action::Drain {
            node: "big-1".into(),
            deadline_secs: Some(45)
        }]
    );
    // The new node waits for the tasks, idle past its pool's cooldown (60 s): not drained.
    assert!(core.step(120_000, &obs(both(true))).is_empty());
    // The tasks moved: big-1 goes; the replacement is done, small-1 is busy.
    let moved = Observation {
        nodes: vec![node("big-1", false), node("small-1", true)],
        tasks: vec![task_on("small-1", "a2", 1.0), task_on("small-1", "b2", 1.0)],
        demand: Vec::new(),
    };
    assert_eq!(
        core.step(121_000, &moved),
        [Action::Delete {
            node: "big-1".into()
        }]
    );
    core.deleted("big-1", 122_000);
    let r = core.report(122_000);
    assert_eq!(
        (r.pools[0].consolidations, r.pools[0].replaced_by_cheaper),
        (1, 1)
    );
    // small-1 is the cheapest that holds two GPUs on demand: nothing more.
    let after = Observation {
        nodes: vec![node("small-1", true)],
        ..moved
    };
    assert!(core.step(300_000, &after).is_empty());
}

#[test]
fn no_replacement_for_tasks_a_cheaper_node_cannot_hold_or_of_another_model() {
    let mut c = config(vec![
        spec("big", 4, 10.0, 0, 4),
        spec("small", 2, 6.0, 0, 4),
        PoolSpec {
            gpu_model: Some("T4".into()),
            ..spec("t4", 4, 2.0, 0, 4)
        },
    ]);
    c.autoscaler.consolidation = true;
    c.autoscaler.consolidation_delay = Duration::ZERO;
    let mut core = Core::new(c.clone());
    core.created("big", &["big-1".into()], 0);
    // Three GPUs in use: one node of the 2-GPU pool cannot hold them, two cost more than
    // big-1 (12/h against 10/h); the T4 pool is another model.
    let obs = Observation {
        nodes: vec![node("big-1", true)],
        tasks: vec![task_on("big-1", "a", 2.0), task_on("big-1", "b", 1.0)],
        demand: Vec::new(),
    };
    assert!(core.step(1_000, &obs).is_empty());
    assert!(core.step(100_000, &obs).is_empty());
    // A failed start of the replacement ends it; big-1 stays and may be tried again.
    let mut core = Core::new(c);
    core.created("big", &["big-1".into()], 0);
    let obs = Observation {
        nodes: vec![node("big-1", true)],
        tasks: vec![task_on("big-1", "a", 1.0)],
        demand: Vec::new(),
    };
    assert_eq!(creates(&core.step(1_000, &obs)), [("small".to_string(), 1)]);
    // Pending: no second one while it is under way.
    assert!(core.step(1_500, &obs).is_empty());
    core.create_failed("small", 1_500);
    // Ended (the pool's scale-up cooldown is 0): asked for again.
    assert_eq!(creates(&core.step(2_000, &obs)), [("small".to_string(), 1)]);
}

#[test]
fn one_node_is_replaced_by_several_cheaper_ones_when_together_they_cost_less() {
    // big: 4 GPUs at 10/h; one: 1 GPU at 2/h; two: 2 GPUs at 6/h (two of them: 12/h, more
    // than big).
    let mut c = config(vec![
        spec("big", 4, 10.0, 0, 4),
        spec("two", 2, 6.0, 0, 4),
        spec("one", 1, 2.0, 0, 4),
    ]);
    c.autoscaler.consolidation = true;
    c.autoscaler.consolidation_delay = Duration::ZERO;
    c.autoscaler.consolidation_deadline = Duration::from_secs(45);
    let mut core = Core::new(c);
    core.created("big", &["big-1".into()], 0);
    // Three 1-GPU tasks: three "one" nodes (6/h) save 4/h; one "two" node cannot hold them,
    // two (12/h) would cost more.
    let tasks = vec![
        task_on("big-1", "a", 1.0),
        task_on("big-1", "b", 1.0),
        task_on("big-1", "c", 1.0),
    ];
    let obs = |nodes: Vec<NodeObs>| Observation {
        nodes,
        tasks: tasks.clone(),
        demand: Vec::new(),
    };
    let a = core.step(1_000, &obs(vec![node("big-1", true)]));
    assert_eq!(
        a,
        [Action::Create {
            pool: "one".into(),
            count: 3,
            reason: "replace-cheaper"
        }]
    );
    // Named one at a time: nothing until all three are named and registered.
    core.created("one", &["one-1".into(), "one-2".into()], 2_000);
    let mut nodes = vec![
        node("big-1", true),
        node("one-1", false),
        node("one-2", false),
    ];
    assert!(core.step(3_000, &obs(nodes.clone())).is_empty());
    core.created("one", &["one-3".into()], 3_500);
    nodes.push(NodeObs {
        registered: false,
        ..node("one-3", false)
    });
    assert!(core.step(4_000, &obs(nodes.clone())).is_empty());
    nodes[3] = node("one-3", false);
    assert_eq!(
        core.step(5_000, &obs(nodes.clone())),
        [Action::Drain {
            node: "big-1".into(),
            deadline_secs: Some(45)
        }]
    );
    // The new nodes wait for the tasks (idle past the cooldown, still not drained).
    assert!(core.step(120_000, &obs(nodes)).is_empty());
    let r = core.report(120_000);
    assert_eq!(
        (r.pools[0].consolidations, r.pools[0].replaced_by_cheaper),
        (1, 1)
    );
}

#[test]
fn several_nodes_are_not_asked_for_when_they_cost_as_much_or_the_pool_lacks_room() {
    let mut c = config(vec![
        spec("big", 4, 10.0, 0, 4),
        spec("two", 2, 5.0, 0, 4),
        spec("one", 1, 2.0, 0, 2),
    ]);
    c.autoscaler.consolidation = true;
    c.autoscaler.consolidation_delay = Duration::ZERO;
    let mut core = Core::new(c);
    core.created("big", &["big-1".into()], 0);
    // Four GPUs of work: two "two" nodes cost 10/h (no saving); four "one" nodes would save
    // but the pool's max is 2.
    let obs = Observation {
        nodes: vec![node("big-1", true)],
        tasks: vec![
            task_on("big-1", "a", 2.0),
            task_on("big-1", "b", 1.0),
            task_on("big-1", "c", 1.0),
        ],
        demand: Vec::new(),
    };
    assert!(core.step(1_000, &obs).is_empty());
    // A failed start of one of them ends the replacement: with 3 GPUs of work on big-1 and
    // room for 3 "one" nodes, they are asked for; one is deleted before registering.
    let mut c = config(vec![spec("big", 4, 10.0, 0, 4), spec("one", 1, 2.0, 0, 4)]);
    c.autoscaler.consolidation = true;
    c.autoscaler.consolidation_delay = Duration::ZERO;
    let mut core = Core::new(c);
    core.created("big", &["big-1".into()], 0);
    let obs = Observation {
        nodes: vec![node("big-1", true)],
        tasks: vec![
            task_on("big-1", "a", 1.0),
            task_on("big-1", "b", 1.0),
            task_on("big-1", "c", 1.0),
        ],
        demand: Vec::new(),
    };
    assert_eq!(creates(&core.step(1_000, &obs)), [("one".to_string(), 3)]);
    core.created(
        "one",
        &["one-1".into(), "one-2".into(), "one-3".into()],
        1_500,
    );
    core.deleted("one-2", 1_800);
    let nodes = vec![
        node("big-1", true),
        node("one-1", false),
        node("one-3", false),
    ];
    let obs2 = Observation {
        nodes,
        tasks: obs.tasks.clone(),
        demand: Vec::new(),
    };
    // Ended: big-1 is not drained.
    assert!(!core
        .step(2_000, &obs2)
        .iter()
        .any(|a| matches!(a, Action::Drain { node, .. } if node == "big-1")));
}
