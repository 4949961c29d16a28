//! The queue core without a cluster: offers in, actions out.

use super::*;

fn gpus(agent: u32) -> Vec<GpuInfo> {
    (0..8)
        .map(|i| GpuInfo {
            uuid: format!("GPU-{agent}-{i}"),
            name: if i < 4 { "NVIDIA A100" } else { "NVIDIA H100" }.into(),
            memory_mib: 40960,
            compute_capability: (8, 0),
            minor: i,
            pci_bus_id: format!("0000:{i:02x}:00.0"),
            numa_node: Some(i / 4),
            healthy: true,
        })
        .collect()
}

struct Cluster {
    agents: Vec<AgentId>,
}

impl Cluster {
    fn new(n: u32) -> Self {
        Cluster {
            agents: (0..n).map(|_| AgentId::random()).collect(),
        }
    }
    /// One offer per agent with `free` GPUs (the first ones busy).
    fn offers(&self, free: &[u32]) -> Vec<Offer> {
        self.agents
            .iter()
            .zip(free)
            .enumerate()
            .map(|(i, (a, &f))| Offer {
                id: OfferId::random(),
                framework_id: FrameworkId::random(),
                agent_id: *a,
                hostname: format!("h{i}"),
                role: "default".into(),
                resources: format!("cpus:{f};mem:{};gpus:{f}", f * 1024)
                    .parse()
                    .unwrap(),
                reserved: Default::default(),
                attributes: Default::default(),
                gpus: gpus(i as u32),
            })
            .collect()
    }
}

fn spec(name: &str, team: &str, prio: Priority, gpus: u32, workers: u32) -> JobSpec {
    JobSpec {
        name: name.into(),
        team: team.into(),
        priority: prio,
        command: vec!["sleep 1".into()],
        cpus: 1.0,
        mem: 64.0,
        gpus,
        gpu_model: None,
        gpu_min_memory: None,
        min_workers: workers,
        max_workers: workers,
        deadline_unix: None,
        grace_secs: 5,
        env: Default::default(),
    }
}

fn launched(actions: &[Action]) -> Vec<TaskInfo> {
    actions
        .iter()
        .flat_map(|a| match a {
            Action::Launch { tasks, .. } => tasks.clone(),
            _ => Vec::new(),
        })
        .collect()
}

fn update(task: &TaskInfo, state: TaskState, gpus: Vec<String>) -> StatusUpdate {
    StatusUpdate {
        update_id: UpdateId::random(),
        task_id: task.task_id,
        framework_id: FrameworkId::random(),
        agent_id: None,
        state,
        source: UpdateSource::Agent,
        reason: None,
        message: String::new(),
        exit_code: None,
        signal: None,
        gpus,
        timestamp_ms: 0,
        reconciliation: false,
    }
}

#[test]
fn a_gang_launches_whole_in_one_pass_or_waits() {
    let c = Cluster::new(2);
    let mut q = Core::new(CoreConfig::default());
    let now = Instant::now();
    q.submit(spec("g", "t", Priority::Normal, 8, 2), now);
    // Only one agent idle: nothing launches.
    let a = q.offers(c.offers(&[8, 4])[..1].to_vec(), now);
    assert!(launched(&a).is_empty(), "{a:?}");
    let a = q.offers(c.offers(&[0, 8])[1..].to_vec(), now);
    let tasks = launched(&a);
    let names: Vec<&str> = tasks.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["g/0", "g/1"]);
    assert_eq!(
        a.iter()
            .filter(|a| matches!(a, Action::Launch { .. }))
            .count(),
        2
    );
}

#[test]
fn backfill_never_takes_the_reserved_gpus() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let now = Instant::now();
    // A running 4-GPU job, then an 8-GPU job that must wait, then small jobs.
    q.submit(spec("run", "t", Priority::Normal, 4, 1), now);
    let a = q.offers(c.offers(&[8]), now);
    let run = launched(&a).remove(0);
    q.update(
        &update(
            &run,
            TaskState::Running,
            vec![
                "GPU-0-0".into(),
                "GPU-0-1".into(),
                "GPU-0-2".into(),
                "GPU-0-3".into(),
            ],
        ),
        now,
    );
    q.submit(spec("big", "t", Priority::Normal, 8, 1), now);
    q.submit(spec("small", "t", Priority::Normal, 1, 1), now);
    let mut offer = c.offers(&[4]);
    offer[0].gpus.retain(|g| g.numa_node == Some(1));
    let a = q.offers(offer, now);
    assert!(
        launched(&a).is_empty(),
        "the free GPUs are reserved for big: {a:?}"
    );
    // When the 4-GPU job ends, big starts; small follows later.
    let a = q.update(&update(&run, TaskState::Finished, vec![]), now);
    assert!(launched(&a).is_empty());
    let a = q.offers(c.offers(&[4]), now);
    let names: Vec<String> = launched(&a).into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["big/0"]);
}

#[test]
fn critical_job_preempts_only_the_needed_victims_on_one_agent() {
    let c = Cluster::new(2);
    let mut q = Core::new(CoreConfig::default());
    let now = Instant::now();
    for i in 0..16 {
        q.submit(
            spec(&format!("p{i}"), "r", Priority::Preemptible, 1, 1),
            now,
        );
    }
    let offers = c.offers(&[8, 8]);
    let a = q.offers(offers.clone(), now);
    let tasks = launched(&a);
    assert_eq!(tasks.len(), 16);
    // Tell the core which GPU each got.
    let mut per_agent: BTreeMap<usize, u32> = BTreeMap::new();
    for a in &a {
        if let Action::Launch { offers: ids, tasks } = a {
            let agent = offers.iter().position(|o| o.id == ids[0]).unwrap();
            for t in tasks {
                let n = per_agent.entry(agent).or_default();
                q.update(
                    &update(t, TaskState::Running, vec![format!("GPU-{agent}-{n}")]),
                    now,
                );
                *n += 1;
            }
        }
    }
    let (_, a) = q.submit(spec("urgent", "p", Priority::Critical, 8, 1), now);
    let kills: Vec<TaskId> = a
        .iter()
        .filter_map(|a| match a {
            Action::Kill(t) => Some(*t),
            _ => None,
        })
        .collect();
    assert_eq!(kills.len(), 8, "{a:?}");
    let agents: BTreeSet<AgentId> = kills
        .iter()
        .map(|t| {
            let (job, idx) = q.tasks[t];
            q.jobs[&job].members[&idx].agent_id
        })
        .collect();
    assert_eq!(agents.len(), 1, "victims on one agent");
    // A high job arriving meanwhile does not cause more kills while these are under way.
    let (_, a) = q.submit(spec("other", "p", Priority::High, 8, 1), now);
    assert!(!a.iter().any(|a| matches!(a, Action::Kill(_))));
    // Victims end: they are requeued, and urgent goes first on the freed agent.
    let victims: Vec<TaskInfo> = tasks
        .iter()
        .filter(|t| kills.contains(&t.task_id))
        .cloned()
        .collect();
    for v in &victims {
        q.update(&update(v, TaskState::Killed, vec![]), now);
    }
    let agent = *agents.iter().next().unwrap();
    let idx = c.agents.iter().position(|a| *a == agent).unwrap();
    let mut free = [0, 0];
    free[idx] = 8;
    let offers: Vec<Offer> = c
        .offers(&free)
        .into_iter()
        .filter(|o| o.agent_id == agent)
        .collect();
    let a = q.offers(offers, now);
    let names: Vec<String> = launched(&a).into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["urgent/0"]);
    let requeued = q
        .views(now)
        .into_iter()
        .filter(|j| j.preemptions == 1 && j.state == JobState::Pending)
        .count();
    assert_eq!(requeued, 8);
}

#[test]
fn teams_are_ordered_by_weighted_share_and_priority_first() {
    let c = Cluster::new(1);
    let mut teams = BTreeMap::new();
    teams.insert(
        "a".to_string(),
        TeamConfig {
            weight: 3.0,
            gpu_quota: None,
        },
    );
    teams.insert(
        "b".to_string(),
        TeamConfig {
            weight: 1.0,
            gpu_quota: None,
        },
    );
    let mut q = Core::new(CoreConfig {
        teams,
        ..Default::default()
    });
    let now = Instant::now();
    for i in 0..8 {
        q.submit(spec(&format!("a{i}"), "a", Priority::Normal, 1, 1), now);
        q.submit(spec(&format!("b{i}"), "b", Priority::Normal, 1, 1), now);
    }
    q.submit(spec("hi", "b", Priority::High, 1, 1), now);
    let a = q.offers(c.offers(&[8]), now);
    let names: Vec<String> = launched(&a).into_iter().map(|t| t.name).collect();
    assert_eq!(names.len(), 8);
    assert_eq!(names[0], "hi/0");
    let from_a = names.iter().filter(|n| n.starts_with('a')).count();
    assert!((4..=6).contains(&from_a), "3:1 weights: {names:?}");
}

#[test]
fn aging_and_deadlines_order_the_queue() {
    let mut q = Core::new(CoreConfig {
        aging: Duration::from_secs(60),
        ..Default::default()
    });
    let t0 = Instant::now();
    let (low, _) = q.submit(spec("old-low", "t", Priority::Low, 1, 1), t0);
    let later = t0 + Duration::from_secs(30);
    let (normal, _) = q.submit(spec("normal", "t", Priority::Normal, 1, 1), later);
    let mut dl = spec("deadline", "t", Priority::Normal, 1, 1);
    dl.deadline_unix = Some(1);
    let (deadline, _) = q.submit(dl, later);
    assert_eq!(q.order(later), [deadline, normal, low]);
    // After 60 s of waiting the low job counts as normal; it is older, but the deadline
    // still goes first.
    let t2 = t0 + Duration::from_secs(61);
    assert_eq!(q.order(t2), [deadline, low, normal]);
    // 180 s: high (aging stops there).
    let t3 = t0 + Duration::from_secs(180);
    assert_eq!(q.view(low, t3).unwrap().effective_priority, Priority::High);
    assert_eq!(
        q.view(low, t0 + Duration::from_secs(10_000))
            .unwrap()
            .effective_priority,
        Priority::High
    );
}

#[test]
fn teams_within_quota_go_before_borrowers() {
    let mut teams = BTreeMap::new();
    teams.insert(
        "big".to_string(),
        TeamConfig {
            weight: 10.0,
            gpu_quota: Some(2),
        },
    );
    teams.insert(
        "small".to_string(),
        TeamConfig {
            weight: 1.0,
            gpu_quota: Some(8),
        },
    );
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig {
        teams,
        ..Default::default()
    });
    let now = Instant::now();
    for i in 0..6 {
        q.submit(spec(&format!("big{i}"), "big", Priority::Normal, 1, 1), now);
    }
    for i in 0..3 {
        q.submit(
            spec(&format!("small{i}"), "small", Priority::Normal, 1, 1),
            now,
        );
    }
    let a = q.offers(c.offers(&[8]), now);
    let names: Vec<String> = launched(&a).into_iter().map(|t| t.name).collect();
    // Weighted DRF alternates while both are within quota; once big holds its quota of 2, the
    // rest of small (within its quota) goes first, then big borrows what is left.
    assert_eq!(names.len(), 8);
    let small_at: Vec<usize> = names
        .iter()
        .enumerate()
        .filter(|(_, n)| n.starts_with("small"))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(small_at, [1, 3, 4], "{names:?}");
}

#[test]
fn elastic_gang_starts_with_what_fits_grows_and_shrinks_for_a_critical_job() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let now = Instant::now();
    let mut e = spec("ddp", "t", Priority::Low, 2, 1);
    e.min_workers = 1;
    e.max_workers = 4;
    q.submit(e, now);
    let a = q.offers(c.offers(&[4]), now);
    let first = launched(&a);
    assert_eq!(first.len(), 2, "as many as fit");
    for (i, t) in first.iter().enumerate() {
        q.update(
            &update(
                t,
                TaskState::Running,
                vec![format!("GPU-0-{}", 2 * i), format!("GPU-0-{}", 2 * i + 1)],
            ),
            now,
        );
    }
    // More GPUs appear (the agent's other NUMA node): the gang grows to four.
    let mut more = c.offers(&[4]);
    more[0].gpus.retain(|g| g.numa_node == Some(1));
    let a = q.offers(more, now);
    let grown = launched(&a);
    assert_eq!(
        grown.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["ddp/2", "ddp/3"]
    );
    for (i, t) in grown.iter().enumerate() {
        q.update(
            &update(
                t,
                TaskState::Running,
                vec![
                    format!("GPU-0-{}", 4 + 2 * i),
                    format!("GPU-0-{}", 5 + 2 * i),
                ],
            ),
            now,
        );
    }
    // A critical 4-GPU job: the gang shrinks by its last two members, and is not requeued.
    let (_, a) = q.submit(spec("urgent", "p", Priority::Critical, 4, 1), now);
    let kills: Vec<TaskId> = a
        .iter()
        .filter_map(|a| match a {
            Action::Kill(t) => Some(*t),
            _ => None,
        })
        .collect();
    let killed: Vec<String> = grown
        .iter()
        .chain(&first)
        .filter(|t| kills.contains(&t.task_id))
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(killed.len(), 2, "{killed:?}");
    assert!(
        killed
            .iter()
            .all(|n| n == "ddp/2" || n == "ddp/3" || n == "ddp/1"),
        "{killed:?}"
    );
    assert!(!killed.contains(&"ddp/0".to_string()));
    for t in grown
        .iter()
        .chain(&first)
        .filter(|t| kills.contains(&t.task_id))
    {
        q.update(&update(t, TaskState::Killed, vec![]), now);
    }
    let ddp = q.views(now).into_iter().find(|j| j.name == "ddp").unwrap();
    assert_eq!(
        (ddp.state, ddp.workers, ddp.preemptions),
        (JobState::Running, 2, 0)
    );
}
