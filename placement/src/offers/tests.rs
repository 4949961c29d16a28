//! Offer-level placement: unit and property tests.

use super::*;
use proptest::prelude::*;

pub(crate) fn gpu(i: usize, model: &str, numa: u32) -> FreeGpu {
    FreeGpu {
        uuid: format!("GPU-{i}"),
        model: model.into(),
        memory_mib: if model.contains("H100") { 81920 } else { 40960 },
        numa_node: Some(numa),
        pci_bus_id: format!("0000:{i:02x}:00.0"),
        free_milli: 1000,
    }
}

/// An agent with 4 A100s on NUMA 0 and 4 H100s on NUMA 1.
pub(crate) fn agent(name: &str, res: &str) -> AgentView {
    AgentView {
        agent_id: AgentId::random(),
        hostname: name.into(),
        offer_ids: vec![OfferId::random()],
        resources: res.parse().unwrap(),
        attributes: Attributes::new(),
        gpus: (0..8)
            .map(|i| {
                gpu(
                    i,
                    if i < 4 { "NVIDIA A100" } else { "NVIDIA H100" },
                    (i / 4) as u32,
                )
            })
            .collect(),
    }
}

fn req(res: &str) -> TaskRequest {
    TaskRequest::new(res.parse().unwrap())
}

#[test]
fn ports_are_placed_like_any_resource() {
    // Two agents, one port each: two 1-port tasks land on both, a third does not fit.
    let mut agents = vec![
        agent("a", "cpus:8;mem:1024;ports:1"),
        agent("b", "cpus:8;mem:1024;ports:1"),
    ];
    let t = req("cpus:1;mem:64;ports:1");
    let plan = place_all(&mut agents, &[t.clone(), t.clone()]).unwrap();
    let used: std::collections::BTreeSet<usize> =
        plan.assignments.iter().map(|a| a.agent).collect();
    assert_eq!(used.len(), 2, "one port per agent");
    assert!(place_one(&agents, &t).is_none());
}

#[test]
fn multi_gpu_task_stays_in_one_numa_node() {
    let agents = vec![agent("a", "cpus:32;mem:65536;gpus:8")];
    let c = place_one(&agents, &req("cpus:4;mem:1024;gpus:4")).unwrap();
    assert_eq!(numa_span(&agents[0], &c.gpus), 0);
    let mut spanning = req("cpus:4;mem:1024;gpus:5");
    let c = place_one(&agents, &spanning).unwrap();
    assert_eq!(c.score.1, 1, "five GPUs span two NUMA nodes");
    spanning.locality = Locality::Require;
    assert!(place_one(&agents, &spanning).is_none());
}

#[test]
fn selector_picks_the_model_and_memory() {
    let agents = vec![agent("a", "cpus:32;mem:65536;gpus:8")];
    let mut t = req("cpus:1;mem:64;gpus:2");
    t.gpu_selector = Some(GpuSelector {
        model: Some("h100".into()),
        min_memory_mib: None,
        mig_profile: None,
        uuids: Vec::new(),
    });
    let c = place_one(&agents, &t).unwrap();
    assert!(c
        .gpus
        .iter()
        .all(|&i| agents[0].gpus[i].model.contains("H100")));
    t.gpu_selector = Some(GpuSelector {
        model: None,
        min_memory_mib: Some(80_000),
        mig_profile: None,
        uuids: Vec::new(),
    });
    t.resources = "cpus:1;mem:64;gpus:5".parse().unwrap();
    assert!(
        place_one(&agents, &t).is_none(),
        "only four GPUs have 80 GB"
    );
}

#[test]
fn a_plan_pins_its_gpus_and_placement_honours_pins() {
    let mut agents = vec![agent("a", "cpus:32;mem:65536;gpus:8")];
    let plan = place_all(&mut agents.clone(), &[req("cpus:1;mem:64;gpus:2")]).unwrap();
    let a = &plan.assignments[0];
    let sel = a.pinned_selector(None).unwrap();
    assert_eq!(sel.uuids, a.gpus);
    let model = GpuSelector {
        model: Some("A100".into()),
        ..GpuSelector::default()
    };
    assert_eq!(a.pinned_selector(Some(&model)).unwrap().model, model.model);
    // A request pinned to two H100s on NUMA node 1 gets exactly those.
    let want = [
        agents[0].gpus[5].uuid.clone(),
        agents[0].gpus[7].uuid.clone(),
    ];
    let mut t = req("cpus:1;mem:64;gpus:2");
    t.gpu_selector = Some(GpuSelector::pinned(want.clone()));
    let plan = place_all(&mut agents, &[t]).unwrap();
    let mut got = plan.assignments[0].gpus.clone();
    got.sort();
    assert_eq!(got, want);
}

#[test]
fn attributes_constrain_agents() {
    let mut a = agent("a", "cpus:8;mem:4096;gpus:8");
    a.attributes.insert("rack".into(), "r1".into());
    let b = agent("b", "cpus:8;mem:4096;gpus:8");
    let agents = vec![a, b];
    let mut t = req("cpus:1;mem:64;gpus:1");
    t.constraints = vec![Constraint::Equals("rack".into(), "r1".into())];
    assert_eq!(place_one(&agents, &t).unwrap().agent, 0);
    t.constraints = vec![Constraint::NotEquals("rack".into(), "r1".into())];
    assert_eq!(place_one(&agents, &t).unwrap().agent, 1);
    t.constraints = vec![Constraint::OneOf("rack".into(), vec!["r9".into()])];
    assert!(place_one(&agents, &t).is_none());
}

#[test]
fn least_stranding_agent_wins() {
    // Agent a has little CPU: a 1-GPU task there would leave GPUs no 1-GPU task can use.
    let agents = vec![
        agent("a", "cpus:2;mem:65536;gpus:8"),
        agent("b", "cpus:16;mem:65536;gpus:8"),
    ];
    let c = place_one(&agents, &req("cpus:2;mem:1024;gpus:1")).unwrap();
    assert_eq!(c.agent, 1);
    // A CPU-only task avoids taking the CPU GPUs need.
    let agents = vec![
        agent("gpu", "cpus:8;mem:65536;gpus:8"),
        agent("cpu", "cpus:8;mem:65536"),
    ];
    let c = place_one(&agents, &req("cpus:4;mem:1024")).unwrap();
    assert_eq!(c.agent, 1);
}

#[test]
fn best_fit_prefers_the_fuller_agent_and_keeps_numa_nodes_whole() {
    let mut busy = agent("busy", "cpus:16;mem:65536;gpus:4");
    busy.gpus.truncate(4); // the A100s on NUMA 0 are free, the H100s busy
    let idle = agent("idle", "cpus:32;mem:131072;gpus:8");
    let agents = vec![idle, busy];
    let c = place_one(&agents, &req("cpus:2;mem:1024;gpus:2")).unwrap();
    assert_eq!(c.agent, 1, "fill the partly used agent first");
    let c = place_one(&agents, &req("cpus:2;mem:1024;gpus:4")).unwrap();
    assert_eq!(c.score.2, 0, "four GPUs fill one NUMA node on either agent");
}

#[test]
fn place_all_is_all_or_nothing() {
    let mut agents = vec![
        agent("a", "cpus:16;mem:65536;gpus:8"),
        agent("b", "cpus:16;mem:65536;gpus:8"),
    ];
    let before = agents.clone();
    let three = vec![req("cpus:1;mem:64;gpus:8"); 3];
    assert_eq!(place_all(&mut agents, &three), Err(PlaceError::NoFit(2)));
    assert_eq!(agents, before, "a failed plan takes nothing");
    let plan = place_all(&mut agents, &three[..2]).unwrap();
    assert_eq!(plan.launches().len(), 2);
    assert_eq!(agents[0].gpu_count() + agents[1].gpu_count(), 0);
    let mut f = vec![agent("a", "cpus:1;mem:64;gpus:2")];
    assert_eq!(
        place_all(&mut f, &[req("gpus:1.5")]),
        Err(PlaceError::BadGpuAmount(0))
    );
}

#[test]
fn from_offers_merges_an_agents_offers_and_drops_busy_gpus() {
    let agent_id = AgentId::random();
    let gpus: Vec<GpuInfo> = (0..4).map(|i| gpu(i, "A100", 0).info()).collect();
    let offer = |res: &str| Offer {
        id: OfferId::random(),
        framework_id: gantry_proto::FrameworkId::random(),
        agent_id,
        hostname: "h".into(),
        role: "r".into(),
        resources: res.parse().unwrap(),
        reserved: Default::default(),
        attributes: Default::default(),
        gpus: gpus.clone().into(),
        gpu_free: Vec::new(),
        agent_name: "a".into(),
    };
    let offers = [offer("cpus:2;gpus:1"), offer("cpus:1;gpus:2")];
    let views = AgentView::from_offers(&offers, &|_, u: &str| u == "GPU-0");
    assert_eq!(views.len(), 1);
    assert_eq!(views[0].offer_ids.len(), 2);
    assert_eq!(views[0].resources.milli("cpus"), 3000);
    assert_eq!(views[0].gpus.len(), 3);
    // Grouped per agent and role: the two offers in role r, one more in role s.
    let mut other_role = offer("cpus:4");
    other_role.role = "s".into();
    let all = [offers[0].clone(), other_role.clone(), offers[1].clone()];
    let groups = group_offers(&all);
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[0].offer_ids, vec![offers[0].id, offers[1].id]);
    assert_eq!(groups[0].resources.milli("cpus"), 3000);
    assert_eq!(
        (groups[1].role.as_str(), groups[1].offer_ids.len()),
        ("s", 1)
    );
}

/// Half-GPU tasks pack onto a GPU already shared, and two of them share one GPU, rather
/// than breaking idle GPUs a whole-GPU task could use.
#[test]
fn fractions_pack_onto_shared_gpus_and_keep_idle_ones_whole() {
    let idle = agent("idle", "cpus:16;mem:65536;gpus:8");
    let mut shared = agent("shared", "cpus:16;mem:65536;gpus:7.5");
    shared.gpus[3].free_milli = 500;
    let agents = vec![idle, shared];
    let half = req("cpus:1;mem:64;gpus:0.5");
    let c = place_one(&agents, &half).expect("fits");
    assert_eq!((c.agent, c.gpus.clone()), (1, vec![3]), "the shared GPU");
    // Two halves on an idle agent share one GPU; a whole GPU goes elsewhere.
    let mut work = vec![agent("a", "cpus:16;mem:65536;gpus:2")];
    work[0].gpus.truncate(2);
    let plan = place_all(
        &mut work,
        &[half.clone(), req("cpus:1;mem:64;gpus:1"), half],
    )
    .expect("fits");
    let (h0, w, h1) = (
        &plan.assignments[0].gpus,
        &plan.assignments[1].gpus,
        &plan.assignments[2].gpus,
    );
    assert_eq!(h0, h1, "the halves share a GPU");
    assert_ne!(h0, w);
    assert_eq!(work[0].resources.milli("gpus"), 0);
    assert!(work[0].gpus.is_empty(), "both GPUs used up");
}

#[test]
fn whole_gpus_skip_shared_ones_and_fractions_honour_the_selector() {
    let mut a = agent("a", "cpus:16;mem:65536;gpus:7.25");
    a.gpus[0].free_milli = 250;
    let agents = vec![a];
    // Seven idle GPUs: 7 whole fit, 8 do not; the shared GPU is never given whole.
    let c = place_one(&agents, &req("cpus:1;mem:64;gpus:7")).expect("fits");
    assert!(!c.gpus.contains(&0));
    assert!(place_one(&agents, &req("cpus:1;mem:64;gpus:8")).is_none());
    // A quarter fits the shared GPU; a half does not fit there.
    let c = place_one(&agents, &req("cpus:1;mem:64;gpus:0.25")).expect("fits");
    assert_eq!(c.gpus, vec![0]);
    let c = place_one(&agents, &req("cpus:1;mem:64;gpus:0.5")).expect("fits");
    assert_ne!(c.gpus, vec![0]);
    // A fraction on an H100 only, of at least 80 GB.
    let mut t = req("cpus:1;mem:64;gpus:0.5");
    t.gpu_selector = Some(GpuSelector {
        model: Some("h100".into()),
        min_memory_mib: Some(80_000),
        ..GpuSelector::default()
    });
    let c = place_one(&agents, &t).expect("fits");
    assert!(agents[0].gpus[c.gpus[0]].model.contains("H100"));
    t.gpu_selector = Some(GpuSelector {
        min_memory_mib: Some(100_000),
        ..GpuSelector::default()
    });
    assert!(place_one(&agents, &t).is_none());
    // Constraints and CPU hold for fractions too.
    let mut t = req("cpus:32;mem:64;gpus:0.5");
    assert!(place_one(&agents, &t).is_none());
    t = req("cpus:1;mem:64;gpus:0.5");
    t.constraints = vec![Constraint::Equals("rack".into(), "r1".into())];
    assert!(place_one(&agents, &t).is_none());
}

#[test]
fn views_read_each_gpus_free_share_from_the_offer() {
    let agent_id = AgentId::random();
    let gpus: Vec<GpuInfo> = (0..3).map(|i| gpu(i, "A100", 0).info()).collect();
    let free = [1000u32, 500, 0];
    let offer = Offer {
        id: OfferId::random(),
        framework_id: gantry_proto::FrameworkId::random(),
        agent_id,
        hostname: "h".into(),
        role: "r".into(),
        resources: "cpus:4;gpus:1.5".parse().unwrap(),
        reserved: Default::default(),
        attributes: Default::default(),
        gpus: gpus.clone().into(),
        gpu_free: gpus
            .iter()
            .zip(free)
            .map(|(g, f)| gantry_proto::GpuFree {
                uuid: g.uuid.clone(),
                free_milli: f,
                free_memory_mib: 0,
            })
            .collect(),
        agent_name: "a".into(),
    };
    // GPU-1 holds our own half-GPU task: still listed with its free half; GPU-2 is full.
    let views = AgentView::from_offers([&offer], &|_, u: &str| u == "GPU-1" || u == "GPU-0");
    let got: Vec<(&str, u32)> = views[0]
        .gpus
        .iter()
        .map(|g| (g.uuid.as_str(), g.free_milli))
        .collect();
    assert_eq!(
        got,
        vec![("GPU-1", 500)],
        "busy idle GPU-0 and full GPU-2 dropped"
    );
    let views = AgentView::from_offers([&offer], &|_, _| false);
    assert_eq!(views[0].gpus.len(), 2);
    assert_eq!(views[0].idle_gpus(), 1);
}

fn arb_agents() -> impl Strategy<Value = Vec<AgentView>> {
    prop::collection::vec((1u64..32, 0u64..=8), 1..5).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (cpus, gpus))| {
                let mut a = agent(
                    &format!("a{i}"),
                    &format!("cpus:{cpus};mem:65536;gpus:{gpus}"),
                );
                a.gpus.truncate(gpus as usize);
                a
            })
            .collect()
    })
}

proptest! {
    /// A plan never gives out more than is offered, never a whole GPU twice nor a shared
    /// one whole, never more of a GPU than it has free, and respects selectors; a failed
    /// plan leaves the agents untouched.
    #[test]
    fn plans_fit_what_is_offered(
        agents in arb_agents(),
        shared in prop::collection::vec(0u32..1000, 0..4),
        tasks in prop::collection::vec((0u64..6, 0u64..=8, any::<bool>(), 0u32..4), 1..8),
    ) {
        // Some GPUs shared already (their free share below 1000), the offer's amount too.
        let mut agents = agents;
        for (k, &free) in shared.iter().enumerate() {
            let a = k % agents.len();
            let g = k / agents.len();
            if let Some(gpu) = agents[a].gpus.get_mut(g) {
                if gpu.is_idle() && free > 0 {
                    gpu.free_milli = free;
                    let have = agents[a].resources.milli("gpus");
                    agents[a].resources.set_milli("gpus", have - 1000 + u64::from(free));
                }
            }
        }
        let tasks: Vec<TaskRequest> = tasks.into_iter().map(|(c, g, h100, quarter)| {
            let gpus = if quarter > 0 { format!("0.{}", quarter * 25) } else { g.to_string() };
            let mut t = req(&format!("cpus:{c};mem:128;gpus:{gpus}"));
            if h100 {
                t.gpu_selector = Some(GpuSelector { model: Some("H100".into()), min_memory_mib: None, mig_profile: None, uuids: Vec::new() });
            }
            t
        }).collect();
        let mut work = agents.clone();
        match place_all(&mut work, &tasks) {
            Ok(plan) => {
                prop_assert_eq!(plan.assignments.len(), tasks.len());
                for (ai, a) in agents.iter().enumerate() {
                    let mut used = Resources::new();
                    let mut whole = Vec::new();
                    let mut shares: BTreeMap<String, u32> = BTreeMap::new();
                    for x in plan.assignments.iter().filter(|x| x.agent == ai) {
                        let t = &tasks[x.task];
                        used.add_assign(&t.resources);
                        match t.fraction() {
                            Some(m) => {
                                prop_assert_eq!(x.gpus.len(), 1);
                                *shares.entry(x.gpus[0].clone()).or_default() += m;
                            }
                            None => {
                                prop_assert_eq!(x.gpus.len() as u64, t.gpus());
                                whole.extend(x.gpus.iter().cloned());
                            }
                        }
                        for u in &x.gpus {
                            let g = a.gpus.iter().find(|g| &g.uuid == u).unwrap();
                            prop_assert!(g.matches(t.gpu_selector.as_ref()));
                        }
                    }
                    prop_assert!(a.resources.contains(&used));
                    for u in &whole {
                        let g = a.gpus.iter().find(|g| &g.uuid == u).unwrap();
                        prop_assert!(g.is_idle(), "a shared GPU given whole");
                        prop_assert!(!shares.contains_key(u), "a whole GPU also shared");
                    }
                    let n = whole.len();
                    whole.sort();
                    whole.dedup();
                    prop_assert_eq!(whole.len(), n);
                    for (u, m) in &shares {
                        let g = a.gpus.iter().find(|g| &g.uuid == u).unwrap();
                        prop_assert!(*m <= g.free_milli, "{} takes {} of {}", u, m, g.free_milli);
                    }
                }
            }
            Err(_) => prop_assert_eq!(work, agents),
        }
    }
}
