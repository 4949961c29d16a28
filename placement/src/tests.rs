use super::*;
use proptest::prelude::*;

fn model(models: &mut Models, name: &str) -> ModelId {
    models.intern(name).expect("model")
}

fn task(cpu: u64, mem: u64, gpu: GpuDemand) -> TaskShape {
    TaskShape {
        cpu_milli: cpu,
        memory_mib: mem,
        gpu,
        models: ModelSet::ANY,
    }
}

fn node_with(model: ModelId, gpu_free: &[u32]) -> Node {
    let mut n = Node::idle(model, 64_000, 256_000, gpu_free.len());
    n.gpu_free = gpu_free.to_vec();
    n
}

fn placer(nodes: Vec<Node>, policy: Policy, workload: &[TaskShape]) -> Placer {
    Placer::new(nodes, policy, Workload::from_tasks(workload), 7).expect("placer")
}

#[test]
fn policies_parse_and_print() {
    for p in Policy::ALL {
        assert_eq!(p.name().parse::<Policy>(), Ok(p));
    }
    assert!(matches!(
        "tetris".parse::<Policy>(),
        Err(PlacementError::UnknownPolicy(_))
    ));
}

#[test]
fn scarcity_weights_follow_the_node_list() {
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let b = model(&mut models, "B");
    let frac = task(1000, 1000, GpuDemand::Fraction(500));
    let eight = task(1000, 1000, GpuDemand::Whole(8));
    let cpu = task(1000, 1000, GpuDemand::None);
    let only_a = TaskShape {
        models: ModelSet::ANY.with(a),
        ..frac
    };
    // 8 GPUs of model A on one node, 2 × 4 of model B: 16 GPUs.
    let nodes = vec![
        Node::idle(a, 64_000, 256_000, 8),
        Node::idle(b, 64_000, 256_000, 4),
        Node::idle(b, 64_000, 256_000, 4),
    ];
    let w =
        Workload::new([(frac, 1), (eight, 1), (cpu, 1), (only_a, 1)]).weighted_by_scarcity(&nodes);
    // Any fraction: the whole cluster (weight 1); CPU-only: 1; 8 GPUs or model A: half of
    // the cluster (weight 2). Counts are scaled by 100.
    assert_eq!(w.total_count(), 100 + 200 + 100 + 200);
    assert_eq!(Policy::DEFAULT, Policy::FgdBlend);
}

#[test]
fn demands_are_checked() {
    assert_eq!(GpuDemand::fraction(250), Ok(GpuDemand::Fraction(250)));
    assert_eq!(GpuDemand::fraction(1000), Ok(GpuDemand::Whole(1)));
    assert_eq!(GpuDemand::fraction(0), Err(PlacementError::BadFraction(0)));
    assert_eq!(
        GpuDemand::fraction(1500),
        Err(PlacementError::BadFraction(1500))
    );
    assert_eq!(GpuDemand::whole(0), GpuDemand::None);
    assert_eq!(GpuDemand::Whole(3).milli(), 3000);
}

#[test]
fn bad_nodes_are_refused() {
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let bad = node_with(a, &[1000, 1200]);
    assert_eq!(
        Placer::new(vec![bad], Policy::Fgd, Workload::default(), 1).err(),
        Some(PlacementError::BadGpu {
            node: 0,
            gpu: 1,
            free: 1200
        })
    );
    let mut over = node_with(a, &[1000]);
    over.cpu_free = over.cpu_capacity + 1;
    assert_eq!(
        Placer::new(vec![over], Policy::Random, Workload::default(), 1).err(),
        Some(PlacementError::FreeAboveCapacity { node: 0 })
    );
}

#[test]
fn too_many_models_is_an_error() {
    let mut models = Models::new();
    for i in 0..MAX_MODELS {
        models.intern(&format!("M{i}")).expect("fits");
    }
    assert_eq!(models.intern("M0"), Ok(ModelId(0)));
    assert_eq!(
        models.intern("one-more"),
        Err(PlacementError::TooManyModels)
    );
}

/// Hand-checked expected fragmentation (see fgd.rs for the definition).
#[test]
fn fragmentation_by_hand() {
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let half = task(1000, 1000, GpuDemand::Fraction(500));
    let whole = task(1000, 1000, GpuDemand::Whole(1));
    let w = Workload::from_tasks(&[half, whole]);
    // [500, 1000]: the half-GPU shape uses both GPUs (nothing below 500 free); the whole-GPU
    // shape cannot use the half-free GPU: 500.
    assert_eq!(
        w.fragmentation(Measure::Fgd, &node_with(a, &[500, 1000])),
        500
    );
    // [500, 500]: the whole-GPU shape does not fit at all: all 1000 free milli-GPU.
    assert_eq!(
        w.fragmentation(Measure::Fgd, &node_with(a, &[500, 500])),
        1000
    );
    // [300, 1000]: the half shape cannot use 300, the whole shape cannot either: 300 + 300.
    assert_eq!(
        w.fragmentation(Measure::Fgd, &node_with(a, &[300, 1000])),
        600
    );
    // Nothing free: nothing fragmented.
    assert_eq!(w.fragmentation(Measure::Fgd, &node_with(a, &[0, 0])), 0);
    // CPU exhausted: every shape is blocked, all free GPU is fragmented for both.
    let mut starved = node_with(a, &[1000, 1000]);
    starved.cpu_free = 500;
    assert_eq!(w.fragmentation(Measure::Fgd, &starved), 4000);
}

#[test]
fn fill_by_hand() {
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let t = task(1000, 1000, GpuDemand::Fraction(470));
    let cpu_only = task(1000, 1000, GpuDemand::None);
    let w = Workload::from_tasks(&[t]);
    let mut n = node_with(a, &[1000, 1000]);
    // One more 0.47 task fits: FGD sees nothing fragmented. Four copies fit (two per GPU),
    // leaving 2 × 0.06 GPU stranded.
    assert_eq!(w.fragmentation(Measure::Fgd, &n), 0);
    assert_eq!(w.fragmentation(Measure::FgdFill, &n), 120);
    // CPU for one copy only: the fill leaves 2000 - 470 stranded.
    n.cpu_free = 1500;
    assert_eq!(w.fragmentation(Measure::Fgd, &n), 0);
    assert_eq!(w.fragmentation(Measure::FgdFill, &n), 1530);
    // A CPU-only shape cannot use any GPU: all free GPU, under both measures (twice with fill).
    let w = Workload::from_tasks(&[cpu_only]);
    assert_eq!(w.fragmentation(Measure::Fgd, &n), 2000);
    assert_eq!(w.fragmentation(Measure::FgdFill, &n), 4000);
}

#[test]
fn share_fill_leaves_whole_gpus_to_frag() {
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let whole = task(12_000, 1000, GpuDemand::Whole(1));
    let frac = task(3000, 1000, GpuDemand::Fraction(470));
    let cpu_only = task(1000, 1000, GpuDemand::None);
    // Two idle GPUs and CPU for one 12-core copy: fgd-fill counts the second GPU as stranded
    // for the whole-GPU shape; share-fill (fgd-scarce) leaves whole GPUs to FGD's frag (0).
    let mut n = node_with(a, &[1000, 1000]);
    n.cpu_capacity = 16_000;
    n.cpu_free = 16_000;
    let w = Workload::from_tasks(&[whole]);
    assert_eq!(w.fragmentation(Measure::Fgd, &n), 0);
    assert_eq!(w.fragmentation(Measure::FgdFill, &n), 1000);
    assert_eq!(w.fragmentation(Measure::ShareFill, &n), 0);
    // Fractions keep their fill: 4 copies of 0.47 by GPU room (2 × 0.06 left over), CPU for
    // 5: 120 under both fill measures.
    let w = Workload::from_tasks(&[frac]);
    assert_eq!(w.fragmentation(Measure::FgdFill, &n), 120);
    assert_eq!(w.fragmentation(Measure::ShareFill, &n), 120);
    // A CPU-only shape: FGD's frag (all free GPU), not doubled.
    let w = Workload::from_tasks(&[cpu_only]);
    assert_eq!(w.fragmentation(Measure::ShareFill, &n), 2000);
}

#[test]
fn fgd_scarce_finishes_a_used_node_where_fgd_fill_opens_a_cpu_poor_one() {
    // The choice the per-placement traces on openb multigpu40 showed most (fgd-fill against
    // fgd): a 0.81-GPU, 3-core task, two 2-GPU 16-core nodes, one idle, one with a 0.19 sliver
    // and 12 cores free. fgd-fill sees the idle node's second GPU stranded for 12-core
    // whole-GPU tasks and opens it (a second sliver on a second node); fgd-scarce ties on the
    // fragmentation and fills the used node.
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let whole = task(12_000, 1000, GpuDemand::Whole(1));
    let frac = task(3000, 1000, GpuDemand::Fraction(810));
    let mut idle = node_with(a, &[1000, 1000]);
    idle.cpu_capacity = 16_000;
    idle.cpu_free = 16_000;
    let mut used = node_with(a, &[190, 1000]);
    used.cpu_capacity = 16_000;
    used.cpu_free = 12_000;
    let nodes = vec![idle, used];
    for seed in 0..10 {
        let w = Workload::from_tasks(&[whole, frac]);
        let mut fill =
            Placer::new(nodes.clone(), Policy::FgdFill, w.clone(), seed).expect("placer");
        assert_eq!(fill.choose(&frac).map(|p| p.node), Some(0));
        let mut scarce = Placer::new(nodes.clone(), Policy::FgdScarce, w, seed).expect("placer");
        assert_eq!(scarce.choose(&frac).map(|p| p.node), Some(1));
    }
}

#[test]
fn shapes_that_reject_the_model_see_all_free_gpu_as_fragmented() {
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let b = model(&mut models, "B");
    let only_b = TaskShape {
        models: ModelSet::ANY.with(b),
        ..task(1000, 1000, GpuDemand::Whole(1))
    };
    let w = Workload::from_tasks(&[only_b, only_b]);
    assert_eq!(
        w.fragmentation(Measure::Fgd, &node_with(a, &[1000, 400])),
        2 * 1400
    );
    assert_eq!(
        w.fragmentation(Measure::Fgd, &node_with(b, &[1000, 400])),
        2 * 400
    );
}

#[test]
fn fractions_pack_onto_one_gpu() {
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let quarter = task(1000, 1000, GpuDemand::Fraction(250));
    for policy in [Policy::Fgd, Policy::FgdPack, Policy::BestFit] {
        let mut p = placer(vec![node_with(a, &[1000, 1000])], policy, &[quarter]);
        let placed: Vec<Placement> = (0..8).map(|_| p.place(&quarter).expect("fits")).collect();
        // Four quarters fill GPU 0 or 1 completely before the other one is touched.
        let first = placed[0].gpus[0].gpu;
        assert!(placed[..4].iter().all(|pl| pl.gpus
            == vec![GpuShare {
                gpu: first,
                milli: 250
            }]));
        assert!(placed[4..].iter().all(|pl| pl.gpus[0].gpu != first));
        assert_eq!(p.nodes()[0].gpu_free, vec![0, 0], "{policy}");
        assert_eq!(p.place(&quarter), None, "{policy}: the cluster is full");
    }
}

/// FGD keeps a GPU usable by the common 0.6-GPU tasks where best-fit fills the fuller one.
#[test]
fn fgd_differs_from_best_fit_by_hand() {
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let common = task(1000, 1000, GpuDemand::Fraction(600));
    let small = task(1000, 1000, GpuDemand::Fraction(300));
    let workload = [common, common, common, small];
    let nodes = || vec![node_with(a, &[700]), node_with(a, &[1000])];
    // Node 0 after: 400 free, useless for the 0.6 shape (+3·400 fragmented); node 1 after: 700,
    // still fits a 0.6 task (0 change for it).
    let mut fgd = placer(nodes(), Policy::Fgd, &workload);
    assert_eq!(fgd.choose(&small).map(|p| p.node), Some(1));
    let mut bf = placer(nodes(), Policy::BestFit, &workload);
    assert_eq!(bf.choose(&small).map(|p| p.node), Some(0));
}

#[test]
fn fgd_picks_the_gpu_on_the_node() {
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let half = task(1000, 1000, GpuDemand::Fraction(500));
    let whole = task(1000, 1000, GpuDemand::Whole(1));
    // On [500, 1000], the half task on GPU 0 keeps GPU 1 idle for whole-GPU tasks.
    let mut p = placer(
        vec![node_with(a, &[500, 1000])],
        Policy::Fgd,
        &[half, whole],
    );
    assert_eq!(
        p.choose(&half),
        Some(Placement {
            node: 0,
            gpus: vec![GpuShare { gpu: 0, milli: 500 }]
        })
    );
}

#[test]
fn fgd_pack_breaks_ties_toward_the_fuller_node() {
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let whole = task(1000, 1000, GpuDemand::Whole(1));
    // Whole-GPU tasks on idle GPUs never fragment: every node ties for FGD.
    let mut nodes = vec![
        node_with(a, &[1000; 8]),
        node_with(a, &[0, 0, 0, 0, 0, 0, 1000, 1000]),
    ];
    nodes.push(node_with(a, &[1000; 4]));
    for seed in 0..20 {
        let mut p = Placer::new(
            nodes.clone(),
            Policy::FgdPack,
            Workload::from_tasks(&[whole]),
            seed,
        )
        .expect("placer");
        assert_eq!(p.choose(&whole).map(|pl| pl.node), Some(1));
    }
}

#[test]
fn model_constraints_are_honoured() {
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let b = model(&mut models, "B");
    let c = model(&mut models, "C");
    let on_b = TaskShape {
        models: models.set(["B", "C"]).expect("set"),
        ..task(1000, 1000, GpuDemand::Fraction(500))
    };
    let cpu_only = TaskShape {
        models: ModelSet::ANY.with(c),
        ..task(1000, 1000, GpuDemand::None)
    };
    for policy in Policy::ALL {
        for seed in 0..10 {
            let nodes = vec![node_with(a, &[1000; 4]), node_with(b, &[1000])];
            let mut p =
                Placer::new(nodes, policy, Workload::from_tasks(&[on_b]), seed).expect("placer");
            assert_eq!(p.place(&on_b).map(|pl| pl.node), Some(1), "{policy}");
            assert_eq!(p.place(&on_b).map(|pl| pl.node), Some(1), "{policy}");
            assert_eq!(p.place(&on_b), None, "{policy}: no B GPU has room left");
            // A model list only constrains GPU tasks.
            assert!(p.place(&cpu_only).is_some());
        }
    }
}

#[test]
fn multi_gpu_tasks_take_idle_gpus_on_one_node() {
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let three = task(1000, 1000, GpuDemand::Whole(3));
    for policy in Policy::ALL {
        let nodes = vec![
            node_with(a, &[1000, 600, 1000, 1000]),
            node_with(a, &[1000, 1000]),
        ];
        let mut p = placer(nodes, policy, &[three]);
        let pl = p.place(&three).expect("fits on node 0");
        assert_eq!(pl.node, 0);
        let gpus: Vec<usize> = pl.gpus.iter().map(|g| g.gpu).collect();
        assert_eq!(gpus, vec![0, 2, 3]);
        assert!(pl.gpus.iter().all(|g| g.milli == GPU_MILLI));
        // Two idle GPUs are left in all, never three on one node.
        assert_eq!(p.place(&three), None, "{policy}");
    }
}

#[test]
fn cpu_and_memory_limit_placement() {
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let mut low_cpu = node_with(a, &[1000, 1000]);
    low_cpu.cpu_free = 2000;
    let mut low_mem = node_with(a, &[1000, 1000]);
    low_mem.memory_free = 100;
    let roomy = node_with(a, &[0, 1000]);
    let t = task(4000, 4096, GpuDemand::Fraction(100));
    for policy in Policy::ALL {
        let mut p = placer(
            vec![low_cpu.clone(), low_mem.clone(), roomy.clone()],
            policy,
            &[t],
        );
        assert_eq!(p.place(&t).map(|pl| pl.node), Some(2), "{policy}");
        let big = task(100_000, 1, GpuDemand::None);
        assert_eq!(p.place(&big), None, "{policy}");
    }
}

#[test]
fn release_gives_resources_back() {
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let t = task(1000, 1000, GpuDemand::Fraction(700));
    let mut p = placer(vec![node_with(a, &[1000])], Policy::FgdPack, &[t]);
    let pl = p.place(&t).expect("fits");
    assert_eq!(p.place(&t), None);
    p.release(&pl, &t).expect("release");
    assert_eq!(p.nodes()[0], node_with(a, &[1000]));
    assert!(p.place(&t).is_some(), "the cache saw the release");
    // Releasing more than was taken is refused and changes nothing.
    p.release(&pl, &t).expect("one release is fine");
    assert!(p.release(&pl, &t).is_err());
    // A commit that does not match the free resources is refused.
    let wrong = Placement {
        node: 0,
        gpus: vec![GpuShare { gpu: 0, milli: 300 }],
    };
    assert!(p.commit(&wrong, &t).is_err());
    assert!(p
        .commit(
            &Placement {
                node: 9,
                gpus: vec![]
            },
            &t
        )
        .is_err());
}

#[test]
fn random_is_deterministic_per_seed() {
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let nodes: Vec<Node> = (0..20).map(|_| node_with(a, &[1000; 4])).collect();
    let t = task(1000, 1000, GpuDemand::Fraction(300));
    let run = |policy: Policy, seed: u64| -> Vec<Placement> {
        let mut p =
            Placer::new(nodes.clone(), policy, Workload::from_tasks(&[t]), seed).expect("placer");
        (0..30).map(|_| p.place(&t).expect("fits")).collect()
    };
    for policy in Policy::ALL {
        assert_eq!(run(policy, 42), run(policy, 42), "{policy}");
    }
    assert_ne!(run(Policy::Random, 42), run(Policy::Random, 43));
}

fn arb_demand() -> impl Strategy<Value = GpuDemand> {
    prop_oneof![
        Just(GpuDemand::None),
        (1u32..1000).prop_map(GpuDemand::Fraction),
        (1u32..5).prop_map(GpuDemand::Whole),
    ]
}

fn arb_task() -> impl Strategy<Value = TaskShape> {
    (0u64..20_000, 0u64..40_000, arb_demand(), 0u64..8).prop_map(|(cpu, mem, gpu, models)| {
        TaskShape {
            cpu_milli: cpu,
            memory_mib: mem,
            gpu,
            models: ModelSet(models & 0b11),
        }
    })
}

fn arb_node() -> impl Strategy<Value = Node> {
    (
        0u8..3,
        1u64..64_000,
        1u64..128_000,
        prop::collection::vec(0u32..=1000, 0..9),
    )
        .prop_map(|(model, cpu, mem, gpus)| Node {
            model: ModelId(model),
            cpu_capacity: cpu,
            memory_capacity: mem,
            cpu_free: cpu - cpu / 3,
            memory_free: mem,
            gpu_free: gpus,
        })
}

proptest! {
    /// Whatever the policy, a placement never takes more than a node, or one of its GPUs, has
    /// free; and "fits nowhere" is only said when no node fits.
    #[test]
    fn placements_never_overcommit(
        nodes in prop::collection::vec(arb_node(), 1..6),
        tasks in prop::collection::vec(arb_task(), 1..40),
        policy in prop::sample::select(Policy::ALL.to_vec()),
        seed in any::<u64>(),
    ) {
        let workload = Workload::from_tasks(&tasks[..tasks.len() / 2]);
        let mut p = Placer::new(nodes.clone(), policy, workload, seed).expect("valid nodes");
        let mut shadow = nodes;
        for t in &tasks {
            match p.place(t) {
                Some(pl) => {
                    let n = &mut shadow[pl.node];
                    prop_assert!(t.gpu == GpuDemand::None || t.models.accepts(n.model));
                    n.cpu_free = n.cpu_free.checked_sub(t.cpu_milli).expect("cpu overcommitted");
                    n.memory_free =
                        n.memory_free.checked_sub(t.memory_mib).expect("memory overcommitted");
                    let mut seen = Vec::new();
                    for g in &pl.gpus {
                        prop_assert!(!seen.contains(&g.gpu), "a GPU given twice");
                        seen.push(g.gpu);
                        n.gpu_free[g.gpu] =
                            n.gpu_free[g.gpu].checked_sub(g.milli).expect("GPU overcommitted");
                    }
                    let total: u64 = pl.gpus.iter().map(|g| u64::from(g.milli)).sum();
                    prop_assert_eq!(total, t.gpu.milli());
                    if let GpuDemand::Whole(_) = t.gpu {
                        prop_assert!(pl.gpus.iter().all(|g| g.milli == GPU_MILLI));
                    }
                }
                None => prop_assert!(!shadow.iter().any(|n| n.fits(t)), "a fitting task refused"),
            }
            prop_assert_eq!(p.nodes(), &shadow[..]);
        }
    }
}

/// Shapes differing only in their model list share cached evaluations; the model list is
/// still honoured for each task.
#[test]
fn cached_classes_still_honour_models() {
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let b = model(&mut models, "B");
    let base = task(1000, 1000, GpuDemand::Fraction(400));
    let only_a = TaskShape {
        models: ModelSet::ANY.with(a),
        ..base
    };
    let only_b = TaskShape {
        models: ModelSet::ANY.with(b),
        ..base
    };
    let w = Workload::from_tasks(&[only_a, only_b, base]);
    assert_eq!(w.shapes(), 3);
    assert_eq!(w.classes(), 1);
    for policy in [Policy::Fgd, Policy::FgdPack, Policy::FgdFill] {
        let nodes = vec![node_with(a, &[1000, 1000]), node_with(b, &[1000, 1000])];
        let mut p = Placer::new(nodes, policy, w.clone(), 3).expect("placer");
        for _ in 0..4 {
            assert_eq!(p.place(&only_a).map(|pl| pl.node), Some(0), "{policy}");
            assert_eq!(p.place(&only_b).map(|pl| pl.node), Some(1), "{policy}");
        }
        assert_eq!(p.place(&only_a), None, "{policy}: A is full");
        assert_eq!(p.place(&base), None, "{policy}: both are full");
    }
}

#[test]
fn typical_pods_ignore_memory_and_keep_every_shape_known() {
    let frac = task(4000, 1000, GpuDemand::Fraction(500));
    let frac_more_memory = TaskShape {
        memory_mib: 9000,
        ..frac
    };
    let whole = task(8000, 1000, GpuDemand::Whole(1));
    let w = Workload::typical(&[frac, frac_more_memory, whole]);
    // One group for both fractions (memory is not in the artifact's key), one for the whole
    // GPU: three tasks in all, and each task's own shape has a class for the cache.
    assert_eq!(w.total_count(), 3);
    assert!(w.class_index(&frac).is_some());
    assert!(w.class_index(&frac_more_memory).is_some());
    assert!(w.class_index(&whole).is_some());
}

#[test]
fn the_artifact_score_is_quantised_to_whole_points() {
    let w = Workload::new([(task(1000, 1000, GpuDemand::Fraction(500)), 4)]);
    // No change: σ(0) = 0.5, 50 points.
    assert_eq!(w.artifact_score(0), -50);
    // Changes of F within the same point tie: 4 tasks × 10 milli-GPU is 0.01 GPU normalised.
    assert_eq!(w.artifact_score(40), -49);
    assert_eq!(w.artifact_score(40), w.artifact_score(60));
    // A whole GPU more fragmented (normalised): ⌊100 σ(−1)⌋ = 26.
    assert_eq!(w.artifact_score(4000), -26);
    // Less fragmentation scores higher.
    assert!(w.artifact_score(-4000) < w.artifact_score(0));
}

#[test]
fn the_artifact_ignores_memory_and_takes_the_first_gpu_among_equal_scores() {
    let mut models = Models::new();
    let a = model(&mut models, "A");
    let quarter = task(1000, 1000, GpuDemand::Fraction(250));
    let w = Workload::new([(quarter, 1)]);
    // Memory exhausted: FGD counts all free GPU as fragmented, the artifact does not look.
    let mut n = node_with(a, &[1000, 1000]);
    n.memory_free = 0;
    assert_eq!(w.fragmentation(Measure::Fgd, &n), 2000);
    assert_eq!(w.fragmentation(Measure::Artifact, &n), 0);
    // GPUs with 750 and 500 free: both leave no fragment for quarters, so their scores tie;
    // FGD takes the fuller GPU (index 1), the artifact the first (index 0).
    let nodes = vec![node_with(a, &[750, 500])];
    let mut fgd = Placer::new(nodes.clone(), Policy::Fgd, w.clone(), 1).expect("placer");
    let mut art = Placer::new(nodes, Policy::FgdArtifact, w, 1).expect("placer");
    assert_eq!(fgd.choose(&quarter).map(|p| p.gpus[0].gpu), Some(1));
    assert_eq!(art.choose(&quarter).map(|p| p.gpus[0].gpu), Some(0));
}

proptest! {
    /// `delta_at` (what `fgd-blend` adds) gives the change `best_delta` found for the GPU it
    /// chose, under both measures, for fractions, whole GPUs and CPU-only tasks.
    #[test]
    fn delta_at_agrees_with_best_delta(
        gpus in prop::collection::vec(prop::sample::select(vec![0u32, 190, 470, 530, 1000]), 1..8),
        demand in prop::sample::select(vec![
            GpuDemand::Fraction(470), GpuDemand::Fraction(810), GpuDemand::Whole(1),
            GpuDemand::Whole(2), GpuDemand::None,
        ]),
    ) {
        let mut models = Models::new();
        let m = model(&mut models, "G2");
        let node = node_with(m, &gpus);
        let mix = [
            task(4_000, 8_000, GpuDemand::Fraction(470)),
            task(3_000, 8_000, GpuDemand::Fraction(810)),
            task(12_000, 16_000, GpuDemand::Whole(1)),
            task(32_000, 64_000, GpuDemand::Whole(4)),
            task(8_000, 8_000, GpuDemand::None),
        ];
        let w = Workload::from_tasks(&mix);
        let t = task(4_000, 8_000, demand);
        for measure in [Measure::Fgd, Measure::ShareFill] {
            let now = w.fragmentation(measure, &node);
            if let Some((delta, gpu)) = w.best_delta(measure, &node, now, &t) {
                prop_assert_eq!(w.delta_at(measure, &node, now, &t, gpu), delta);
            }
        }
    }
}
