//! GPU sharing in the state machine ([`super::super::gpus`]): fractions share a GPU up
//! to one whole GPU, offers show each GPU's free fraction, MIG devices go to tasks naming their
//! profile, whole-GPU tasks keep idle GPUs.

use super::*;

fn mig(i: u32) -> GpuInfo {
    GpuInfo {
        uuid: format!("MIG-{i}"),
        name: "NVIDIA A100 MIG 1g.10gb".into(),
        memory_mib: 9_856,
        mig_profile: Some("1g.10gb".into()),
        parent_uuid: Some("GPU-9".into()),
        ..gpu_info(9)
    }
}

/// Per launch (task, GPUs the master chose), the error texts, the new offers.
type Launched = (Vec<(TaskId, Vec<String>)>, Vec<String>, Vec<Offer>);

impl Harness {
    /// A master with one agent (`gpus` devices, `gpus:` = their count) and one GPU framework.
    fn with_gpus(gpus: Vec<GpuInfo>) -> (Harness, Vec<Offer>) {
        let mut h = Harness::new();
        let resources = format!("cpus:16;mem:16384;gpus:{}", gpus.len());
        h.register(A, "gpu-agent", register_with_gpus(&resources, gpus));
        let mut info = info("f", "r", None);
        info.capabilities = vec![Capability::GpuResources];
        let out = h.subscribe(F, "f", info);
        let offers = offers(&out, F);
        (h, offers)
    }

    /// Accepts `offer` with `tasks`; returns (task, GPUs chosen by the master) per launch and
    /// the error texts, and the new offers.
    fn launch(&mut self, offer: OfferId, tasks: Vec<TaskInfo>) -> Launched {
        let out = self.input(Input::Framework {
            conn: F,
            msg: FrameworkToMaster::Accept {
                offer_ids: vec![offer],
                operations: vec![Operation::Launch { tasks }],
                refuse_seconds: Some(0.0),
            },
        });
        let launched = out
            .iter()
            .filter_map(|o| match o {
                Output::ToAgent(_, MasterToAgent::RunTask { task, gpus, .. }) => {
                    Some((task.task_id, gpus.clone()))
                }
                _ => None,
            })
            .collect();
        let errors = out
            .iter()
            .filter_map(|o| match o {
                Output::ToFramework(_, MasterToFramework::Error { message, .. }) => {
                    Some(message.clone())
                }
                _ => None,
            })
            .collect();
        (launched, errors, offers(&out, F))
    }

    fn revive(&mut self) -> Vec<Offer> {
        let out = self.input(Input::Framework {
            conn: F,
            msg: FrameworkToMaster::Revive { roles: vec![] },
        });
        offers(&out, F)
    }
}

#[test]
fn fractions_share_one_gpu_and_never_overfill_it() {
    let (mut h, offers) = Harness::with_gpus(vec![gpu_info(0), gpu_info(1)]);
    assert_eq!(offers.len(), 1);
    let o = &offers[0];
    assert_eq!(o.gpu_free.len(), 2);
    assert!(o.gpu_free.iter().all(|g| g.free_milli == 1000));
    assert_eq!(o.gpu_free[0].free_memory_mib, 40_960);
    // Two halves and a quarter: the halves fill one GPU (the tightest fit), the quarter goes
    // to the other; a 0.8 does not fit anywhere any more.
    let (launched, errors, _) = h.launch(
        o.id,
        vec![
            task("cpus:1;mem:10;gpus:0.5"),
            task("cpus:1;mem:10;gpus:0.5"),
            task("cpus:1;mem:10;gpus:0.25"),
            task("cpus:1;mem:10;gpus:0.8"),
        ],
    );
    assert_eq!(launched.len(), 3, "{errors:?}");
    assert_eq!(launched[0].1, launched[1].1, "the halves share a GPU");
    assert_eq!(launched[0].1.len(), 1);
    assert_ne!(launched[2].1, launched[0].1);
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains("800 milli-GPUs free"), "{errors:?}");
    // The offer shows what is left of each GPU: 0 and 750 milli-GPUs.
    let offers = h.revive();
    let free: BTreeMap<String, u32> = offers[0]
        .gpu_free
        .iter()
        .map(|g| (g.uuid.clone(), g.free_milli))
        .collect();
    assert_eq!(free[&launched[0].1[0]], 0);
    assert_eq!(free[&launched[2].1[0]], 750);
    let quarter_gpu = offers[0]
        .gpu_free
        .iter()
        .find(|g| g.uuid == launched[2].1[0])
        .unwrap();
    assert_eq!(quarter_gpu.free_memory_mib, 30_720);
    // A whole GPU no longer fits (no idle GPU) although 0.75 GPUs are free in total.
    let (launched2, errors, _) = h.launch(offers[0].id, vec![task("cpus:1;gpus:1")]);
    assert!(launched2.is_empty());
    assert!(errors[0].contains("0 idle GPUs"), "{errors:?}");
    // The allocator's scalar is exact: 2 - 1.25 = 0.75 GPUs left.
    let offers = h.revive();
    assert_eq!(offers[0].resources.milli("gpus"), 750);
}

#[test]
fn whole_gpus_are_chosen_at_accept_and_fractions_keep_off_them() {
    let (mut h, offers) = Harness::with_gpus(vec![gpu_info(0), gpu_info(1)]);
    // A whole GPU (the master picks it) then a fraction: the fraction may use only the other.
    let (launched, errors, _) = h.launch(
        offers[0].id,
        vec![
            task("cpus:1;gpus:1"),
            task("cpus:1;gpus:0.5"),
            task("cpus:1;gpus:0.6"),
        ],
    );
    assert_eq!(launched.len(), 2, "{errors:?}");
    assert_eq!(launched[0].1.len(), 1, "the master chose the whole GPU");
    assert_eq!(launched[1].1.len(), 1);
    assert_ne!(launched[0].1, launched[1].1);
    assert!(errors[0].contains("600 milli-GPUs"), "{errors:?}");
}

/// Eight GPUs: four A100s on NUMA node 0, four L4s on node 1.
fn mixed_host() -> Vec<GpuInfo> {
    (0..8)
        .map(|i| GpuInfo {
            name: if i < 4 { "NVIDIA A100" } else { "NVIDIA L4" }.into(),
            numa_node: Some(i / 4),
            ..gpu_info(i)
        })
        .collect()
}

fn with_model(mut t: TaskInfo, model: &str) -> TaskInfo {
    t.gpu_selector = Some(GpuSelector {
        model: Some(model.into()),
        ..Default::default()
    });
    t
}

/// The CI failure this replaced: with whole GPUs left to the agent, a task without a selector
/// in flight counted against every model, and an A100 task was refused while two A100s sat
/// idle (the queue's job FAILED). Now each accept takes named GPUs, topology-aware, and the
/// next accept sees them before any agent update.
#[test]
fn back_to_back_whole_gpu_accepts_see_each_others_gpus() {
    let (mut h, offers) = Harness::with_gpus(mixed_host());
    let gpus = |l: &Launched| l.0.iter().map(|(_, g)| g.clone()).collect::<Vec<_>>();
    let two_a100 = h.launch(
        offers[0].id,
        vec![with_model(task("cpus:1;gpus:2"), "A100")],
    );
    assert_eq!(
        gpus(&two_a100),
        vec![vec!["GPU-0", "GPU-1"]],
        "{:?}",
        two_a100.1
    );
    // Four of any model: one NUMA node, the L4s' (the A100 node has only two idle).
    let offers = h.revive();
    let any4 = h.launch(offers[0].id, vec![task("cpus:1;gpus:4")]);
    assert_eq!(
        gpus(&any4),
        vec![vec!["GPU-4", "GPU-5", "GPU-6", "GPU-7"]],
        "{:?}",
        any4.1
    );
    // No agent update yet: one more A100 fits (two are idle), then two more do not.
    let offers = h.revive();
    let free_a100 = offers[0]
        .gpu_free
        .iter()
        .filter(|g| g.free_milli == 1000)
        .count();
    assert_eq!(free_a100, 2, "the offer shows only GPU-2 and GPU-3 idle");
    let one = h.launch(
        offers[0].id,
        vec![with_model(task("cpus:1;gpus:1"), "A100")],
    );
    assert_eq!(gpus(&one), vec![vec!["GPU-2"]], "{:?}", one.1);
    let offers = h.revive();
    let (launched, errors, _) = h.launch(
        offers[0].id,
        vec![with_model(task("cpus:1;gpus:2"), "A100")],
    );
    assert!(launched.is_empty());
    assert!(errors[0].contains("1 idle GPUs"), "{errors:?}");
}

#[test]
fn gpus_above_one_must_be_whole_and_mig_needs_its_profile() {
    let (mut h, offers) = Harness::with_gpus(vec![gpu_info(0), mig(1), mig(2)]);
    let (launched, errors, _) = h.launch(offers[0].id, vec![task("cpus:1;gpus:1.5")]);
    assert!(launched.is_empty());
    assert!(errors[0].contains("whole number"), "{errors:?}");
    let offers = h.revive();
    let mut slice = task("cpus:1;gpus:1");
    slice.gpu_selector = Some(GpuSelector {
        mig_profile: Some("1g.10gb".into()),
        ..GpuSelector::default()
    });
    let mut two_slices = slice.clone();
    two_slices.task_id = TaskId::random();
    two_slices.resources = "cpus:1;gpus:2".parse().unwrap();
    let mut wrong = slice.clone();
    wrong.task_id = TaskId::random();
    wrong.gpu_selector = Some(GpuSelector {
        mig_profile: Some("3g.40gb".into()),
        ..GpuSelector::default()
    });
    // Plain tasks never get MIG devices: two whole GPUs do not fit on one physical GPU, one
    // does (the MIG slice being launched does not hold it).
    let (launched, errors, _) = h.launch(
        offers[0].id,
        vec![
            slice,
            two_slices,
            wrong,
            task("cpus:1;gpus:2"),
            task("cpus:1;gpus:1"),
        ],
    );
    assert_eq!(launched.len(), 2, "{errors:?}");
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(errors
        .iter()
        .all(|e| e.contains("matching") || e.contains("idle GPUs")));
}

#[test]
fn fractions_keep_whole_gpus_idle() {
    // A quarter, a half and a quarter: one GPU, the other stays idle for a whole-GPU task
    // (FGD with only the half in its mix would spread them).
    let (mut h, offers) = Harness::with_gpus(vec![gpu_info(0), gpu_info(1)]);
    let (launched, errors, _) = h.launch(
        offers[0].id,
        vec![
            task("cpus:1;gpus:0.25"),
            task("cpus:1;gpus:0.5"),
            task("cpus:1;gpus:0.25"),
            task("cpus:1;gpus:1"),
        ],
    );
    assert_eq!(launched.len(), 4, "{errors:?}");
    assert_eq!(launched[0].1, launched[1].1);
    assert_eq!(launched[1].1, launched[2].1);
}

#[test]
fn oversized_mig_and_topology_fields_are_refused_at_registration() {
    let mut h = Harness::new();
    let long = "x".repeat(register_limits::MAX_GPU_FIELD + 1);
    let mut profile = mig(1);
    profile.mig_profile = Some(long.clone());
    let root = GpuInfo {
        pci_root: Some(long),
        ..gpu_info(0)
    };
    for g in [profile, root] {
        let out = h.register(A, "big-gpu", register_with_gpus("cpus:1;gpus:1", vec![g]));
        assert!(
            out.iter().any(|o| matches!(o,
                Output::ToAgent(_, MasterToAgent::Error { message }) if message.contains("MIG profile"))),
            "{out:?}"
        );
    }
}

#[test]
fn pinned_uuids_choose_the_gpu_and_malformed_pins_are_refused() {
    let (mut h, offers) = Harness::with_gpus(vec![gpu_info(0), gpu_info(1), gpu_info(2)]);
    let pinned = |r: &str, uuids: &[&str]| {
        let mut t = task(r);
        t.gpu_selector = Some(GpuSelector::pinned(uuids.iter().copied()));
        t
    };
    // A fraction pinned to GPU-2 lands there although the tightest fit would be any idle GPU;
    // a whole GPU pinned to an unknown device, a fraction pinned to a full one, and a list
    // longer than the bound are errors that say why.
    let (launched, errors, _) = h.launch(
        offers[0].id,
        vec![
            pinned("cpus:1;gpus:0.5", &["GPU-2"]),
            pinned("cpus:1;gpus:0.5", &["GPU-2"]),
            pinned("cpus:1;gpus:0.5", &["GPU-2"]),
            pinned("cpus:1;gpus:1", &["GPU-7"]),
            pinned("cpus:1;gpus:1", &["GPU-0"; 65]),
        ],
    );
    assert_eq!(launched.len(), 2, "{errors:?}");
    assert!(launched
        .iter()
        .all(|(_, g)| g == &vec!["GPU-2".to_string()]));
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(errors[0].contains("500 milli-GPUs free"), "{errors:?}");
    assert!(errors[1].contains("0 healthy GPUs matching"), "{errors:?}");
    assert!(errors[2].contains("at most 64"), "{errors:?}");
    // What was refused used nothing: two idle GPUs and GPU-2 full.
    let offers = h.revive();
    let free: BTreeMap<String, u32> = offers[0]
        .gpu_free
        .iter()
        .map(|g| (g.uuid.clone(), g.free_milli))
        .collect();
    assert_eq!(
        free["GPU-0"] + free["GPU-1"] + free["GPU-2"],
        2000,
        "{free:?}"
    );
    assert_eq!(free["GPU-2"], 0);
}

#[test]
fn an_offer_without_gpus_lists_none() {
    let (mut h, offers) = Harness::with_gpus(vec![gpu_info(0), gpu_info(1)]);
    assert_eq!(offers[0].gpus.len(), 2);
    assert_eq!(offers[0].gpu_free.len(), 2);
    // Both GPUs taken: what is left of the agent (cpus and memory) is offered without the
    // GPU list nor their free shares (nothing of them could be drawn from it).
    let (launched, errors, _) = h.launch(offers[0].id, vec![task("cpus:1;mem:10;gpus:2")]);
    assert_eq!(launched.len(), 1, "{errors:?}");
    let offers = h.revive();
    assert_eq!(offers.len(), 1);
    assert_eq!(offers[0].resources.milli("gpus"), 0);
    assert!(offers[0].resources.milli("cpus") > 0);
    assert!(offers[0].gpus.is_empty());
    assert!(offers[0].gpu_free.is_empty());
}
