//! The queue core without a cluster: offers in, actions out.
//! (Over 800 lines: tests only, one scenario per test, sharing the helpers at the top.)

use super::*;

pub(super) fn gpus(agent: u32) -> Vec<GpuInfo> {
    (0..8)
        .map(|i| GpuInfo {
            uuid: format!("GPU-{agent}-{i}"),
            name: if i < 4 { "NVIDIA A100" } else { "NVIDIA H100" }.into(),
            memory_mib: 40960,
            compute_capability: (8, 0),
            minor: i,
            pci_bus_id: format!("0000:{i:02x}:00.0"),
            numa_node: Some(i / 4),
            pci_root: None,
            healthy: true,
            mig_profile: None,
            parent_uuid: None,
        })
        .collect()
}

pub(super) struct Cluster {
    pub(super) agents: Vec<AgentId>,
}

impl Cluster {
    pub(super) fn new(n: u32) -> Self {
        Cluster {
            agents: (0..n).map(|_| AgentId::random()).collect(),
        }
    }
    /// One offer per agent with `free` GPUs (the first ones busy).
    pub(super) fn offers(&self, free: &[u32]) -> Vec<Offer> {
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
                gpus: gpus(i as u32).into(),
                gpu_free: Vec::new(),
                agent_name: "a".into(),
            })
            .collect()
    }
}

pub(super) fn spec(name: &str, team: &str, prio: Priority, gpus: u32, workers: u32) -> JobSpec {
    JobSpec {
        name: name.into(),
        team: team.into(),
        priority: prio,
        command: vec!["sleep 1".into()],
        cpus: 1.0,
        mem: 64.0,
        gpus: crate::model::Gpus::whole(gpus),
        gpu_model: None,
        gpu_min_memory: None,
        min_workers: workers,
        max_workers: workers,
        deadline_unix: None,
        grace_secs: 5,
        env: Default::default(),
        after: Vec::new(),
        max_retries: 0,
        time_limit_secs: None,
        deadline_best_effort: false,
        array: None,
        array_job: None,
        array_index: None,
    }
}

/// The tasks `actions` kill as preempted.
pub(super) fn kills_of(actions: &[Action]) -> Vec<TaskId> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::KillFor(t, TaskReason::Preempted) => Some(*t),
            _ => None,
        })
        .collect()
}

pub(super) fn launched(actions: &[Action]) -> Vec<TaskInfo> {
    actions
        .iter()
        .flat_map(|a| match a {
            Action::Launch { tasks, .. } => tasks.clone(),
            _ => Vec::new(),
        })
        .collect()
}

pub(super) fn update(task: &TaskInfo, state: TaskState, gpus: Vec<String>) -> StatusUpdate {
    StatusUpdate {
        gpus,
        ..StatusUpdate::new(task.task_id, FrameworkId::random(), state)
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
    offer[0].gpus = offer[0]
        .gpus
        .iter()
        .filter(|g| g.numa_node == Some(1))
        .cloned()
        .collect();
    let a = q.offers(offer, now);
    assert!(
        launched(&a).is_empty(),
        "the free GPUs are reserved for big: {a:?}"
    );
    // The 4 free GPUs are held for big while the rest drain: reserved, not idle-while-eligible
    // (small could only start there by delaying big).
    let second = Duration::from_secs(1);
    assert!(launched(&q.tick(now)).is_empty());
    assert!(launched(&q.tick(now + second)).is_empty());
    assert_eq!(q.stats.reserved_idle_gpu_secs, 4.0);
    assert_eq!(q.stats.idle_while_eligible_gpu_secs, 0.0);
    // When the 4-GPU job ends, big starts; small follows later. Until the offer comes, the 8
    // free GPUs are idle while big could start on them.
    let a = q.update(&update(&run, TaskState::Finished, vec![]), now);
    assert!(launched(&a).is_empty());
    q.tick(now + 2 * second);
    assert_eq!(q.stats.idle_while_eligible_gpu_secs, 8.0);
    assert_eq!(q.stats.reserved_idle_gpu_secs, 4.0);
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
    // Preemption kills say why (`preempted`), never a bare kill.
    assert!(
        a.iter().all(|a| !matches!(a, Action::Kill(_))),
        "preemption kills carry their reason: {a:?}"
    );
    assert!(a
        .iter()
        .any(|a| matches!(a, Action::KillFor(_, TaskReason::Preempted))));
    let kills: Vec<TaskId> = a
        .iter()
        .filter_map(|a| match a {
            Action::Kill(t) | Action::KillFor(t, _) => Some(*t),
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
    assert!(!a
        .iter()
        .any(|a| matches!(a, Action::Kill(_) | Action::KillFor(..))));
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
            model_quotas: Default::default(),
        },
    );
    teams.insert(
        "b".to_string(),
        TeamConfig {
            weight: 1.0,
            gpu_quota: None,
            model_quotas: Default::default(),
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
            model_quotas: Default::default(),
        },
    );
    teams.insert(
        "small".to_string(),
        TeamConfig {
            weight: 1.0,
            gpu_quota: Some(8),
            model_quotas: Default::default(),
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
    // Weighted DRF (weights 10:1) gives big its quota of 2 first; then the rest of small
    // (within its quota) goes first, then big borrows what is left.
    assert_eq!(names.len(), 8);
    let small_at: Vec<usize> = names
        .iter()
        .enumerate()
        .filter(|(_, n)| n.starts_with("small"))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(small_at, [2, 3, 4], "{names:?}");
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
    more[0].gpus = more[0]
        .gpus
        .iter()
        .filter(|g| g.numa_node == Some(1))
        .cloned()
        .collect();
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
            Action::Kill(t) | Action::KillFor(t, _) => Some(*t),
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

#[test]
fn a_failed_worker_fails_the_gang_and_stops_the_rest() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let now = Instant::now();
    let (id, _) = q.submit(spec("g", "t", Priority::Normal, 2, 2), now);
    let tasks = launched(&q.offers(c.offers(&[8]), now));
    assert_eq!(tasks.len(), 2);
    let a = q.update(&update(&tasks[0], TaskState::Failed, vec![]), now);
    assert!(a.contains(&Action::Kill(tasks[1].task_id)), "{a:?}");
    q.update(&update(&tasks[1], TaskState::Killed, vec![]), now);
    let v = q.view(id, now).unwrap();
    assert_eq!(
        (v.state, v.preemptions, q.stats.preemptions),
        (JobState::Failed, 0, 0)
    );
}

fn after(mut s: JobSpec, deps: &[u64]) -> JobSpec {
    s.after = deps.to_vec();
    s
}

#[test]
fn a_dependent_job_waits_until_its_dependencies_finish() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let now = Instant::now();
    let (a_id, _) = q.submit(spec("a", "t", Priority::Normal, 1, 1), now);
    let (b_id, _) = q.submit(spec("b", "t", Priority::Normal, 1, 1), now);
    let c_spec = after(spec("c", "t", Priority::Critical, 1, 1), &[a_id, b_id]);
    assert_eq!(q.dependency_problem(&c_spec), None);
    let (c_id, _) = q.submit(c_spec, now);
    // Plenty of room, yet only a and b start; c (critical) waits and preempts nobody.
    let acts = q.offers(c.offers(&[8]), now);
    let tasks = launched(&acts);
    let names: Vec<&str> = tasks.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a/0", "b/0"]);
    assert!(!acts
        .iter()
        .any(|a| matches!(a, Action::Kill(_) | Action::KillFor(..))));
    assert!(!q.order(now).contains(&c_id), "c is not eligible yet");
    let v = q.view(c_id, now).unwrap();
    assert_eq!(v.state, JobState::Pending);
    assert_eq!(v.waiting_on, vec![a_id, b_id]);
    assert!(
        v.message.contains("waiting on dependencies: 1, 2"),
        "{}",
        v.message
    );
    for t in &tasks {
        q.update(&update(t, TaskState::Running, vec![]), now);
    }
    q.update(&update(&tasks[0], TaskState::Finished, vec![]), now);
    let v = q.view(c_id, now).unwrap();
    assert_eq!(v.waiting_on, vec![b_id]);
    let acts = q.offers(c.offers(&[7]), now);
    assert!(launched(&acts).is_empty(), "c still waits for b: {acts:?}");
    // b finishes: c becomes eligible and starts on the next offer.
    q.update(&update(&tasks[1], TaskState::Finished, vec![]), now);
    assert_eq!(q.order(now), vec![c_id]);
    let acts = q.offers(c.offers(&[8]), now);
    let names: Vec<String> = launched(&acts).into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["c/0"]);
    assert!(q.view(c_id, now).unwrap().waiting_on.is_empty());
}

#[test]
fn a_failed_or_cancelled_dependency_cancels_the_chain_with_a_reason() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let now = Instant::now();
    let (a_id, _) = q.submit(spec("a", "t", Priority::Normal, 1, 1), now);
    let (b_id, _) = q.submit(after(spec("b", "t", Priority::Normal, 1, 1), &[a_id]), now);
    let (c_id, _) = q.submit(after(spec("c", "t", Priority::Normal, 1, 1), &[b_id]), now);
    let (x_id, _) = q.submit(spec("x", "t", Priority::Normal, 1, 1), now);
    let (y_id, _) = q.submit(after(spec("y", "t", Priority::Normal, 1, 1), &[x_id]), now);
    let tasks = launched(&q.offers(c.offers(&[8]), now));
    assert_eq!(tasks.len(), 2);
    // a fails: b and (through b) c are cancelled, saying why.
    q.update(&update(&tasks[0], TaskState::Failed, vec![]), now);
    let b = q.view(b_id, now).unwrap();
    assert_eq!(b.state, JobState::Cancelled);
    assert!(
        b.message.contains("dependency 1 (a) ended FAILED"),
        "{}",
        b.message
    );
    assert!(b.message.contains("afterok"), "{}", b.message);
    let cv = q.view(c_id, now).unwrap();
    assert_eq!(cv.state, JobState::Cancelled);
    assert!(
        cv.message.contains("dependency 2 (b) ended CANCELLED"),
        "{}",
        cv.message
    );
    // x is cancelled by its user: y too.
    q.cancel(x_id, now).unwrap();
    assert_eq!(q.view(y_id, now).unwrap().state, JobState::Cancelled);
    // Submitting after an already failed job: cancelled at once.
    let (z_id, _) = q.submit(after(spec("z", "t", Priority::Normal, 1, 1), &[a_id]), now);
    assert_eq!(q.view(z_id, now).unwrap().state, JobState::Cancelled);
    // Unknown and repeated ids are refused before submission.
    let bad = after(spec("w", "t", Priority::Normal, 1, 1), &[999]);
    assert!(q.dependency_problem(&bad).unwrap().contains("999"));
    let twice = after(spec("w", "t", Priority::Normal, 1, 1), &[a_id, a_id]);
    assert!(q.dependency_problem(&twice).is_some());
    assert_eq!(q.active_jobs(), 0);
}

#[test]
fn weighted_shares_round_to_the_nearest_not_up_for_the_lightest_team() {
    // 32 GPUs of 1-GPU jobs, weights 3:2:1 (16, 10.7, 5.3 GPUs): ordering by the share before
    // each launch gives 16/10/6 (the weight-1 team 12% over); counting the launch, 16/11/5.
    let c = Cluster::new(4);
    let mut teams = BTreeMap::new();
    for (t, w) in [("a", 3.0), ("b", 2.0), ("c", 1.0)] {
        teams.insert(
            t.to_string(),
            TeamConfig {
                weight: w,
                gpu_quota: None,
                model_quotas: Default::default(),
            },
        );
    }
    let mut q = Core::new(CoreConfig {
        teams,
        ..Default::default()
    });
    let now = Instant::now();
    for i in 0..40 {
        for t in ["a", "b", "c"] {
            q.submit(spec(&format!("{t}{i}"), t, Priority::Normal, 1, 1), now);
        }
    }
    let acts = q.offers(c.offers(&[8, 8, 8, 8]), now);
    let tasks = launched(&acts);
    let per = |t: &str| tasks.iter().filter(|x| x.name.starts_with(t)).count();
    assert_eq!((per("a"), per("b"), per("c")), (16, 11, 5));
    // One of c's jobs ends: the GPU goes back to c (5 of 32 is under its sixth); one of a's
    // ends: back to a.
    for t in &tasks {
        q.update(&update(t, TaskState::Running, vec![]), now);
    }
    let c0 = tasks.iter().find(|t| t.name == "c0/0").unwrap();
    q.update(&update(c0, TaskState::Finished, vec![]), now);
    let a0 = tasks.iter().find(|t| t.name == "a0/0").unwrap();
    q.update(&update(a0, TaskState::Finished, vec![]), now);
    // (Offers list every GPU of an agent; the core leaves out those its members hold: only
    // the two freed ones are usable.)
    let acts = q.offers(c.offers(&[8, 8, 8, 8]), now);
    let mut names: Vec<String> = launched(&acts).into_iter().map(|t| t.name).collect();
    names.sort();
    assert_eq!(names, ["a16/0", "c5/0"]);
    // 100 s later c has had less than its sixth of the GPU time (5 GPUs of 32, c0 ran for
    // no time): when one of b's jobs ends, the odd GPU goes to c (6 for a while), not to b.
    let t1 = now + Duration::from_secs(100);
    let b0 = tasks.iter().find(|t| t.name == "b0/0").unwrap();
    q.update(&update(b0, TaskState::Finished, vec![]), t1);
    let names: Vec<String> = launched(&q.offers(c.offers(&[8, 8, 8, 8]), t1))
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["c6/0"]);
}

#[test]
fn a_job_whose_worker_the_cluster_lost_is_requeued_once_and_runs_again() {
    let c = Cluster::new(2);
    let mut q = Core::new(CoreConfig::default());
    let now = Instant::now();
    let (id, _) = q.submit(spec("gang", "t", Priority::Normal, 1, 2), now);
    let tasks = launched(&q.offers(c.offers(&[8, 8]), now));
    assert_eq!(tasks.len(), 2);
    for t in &tasks {
        q.update(&update(t, TaskState::Running, vec![]), now);
    }
    // Its agent stayed unreachable past the master's timeout: the worker is GONE (reported
    // twice, as after a reconciliation): the sibling is killed and the job requeued, once.
    q.update(&update(&tasks[0], TaskState::Gone, vec![]), now);
    q.update(&update(&tasks[0], TaskState::Gone, vec![]), now);
    q.update(&update(&tasks[1], TaskState::Killed, vec![]), now);
    let v = q.view(id, now).unwrap();
    assert_eq!(v.state, JobState::Pending, "{}", v.message);
    assert!(v.message.contains("GONE"), "{}", v.message);
    assert_eq!((q.stats.requeued_lost, q.stats.preemptions), (1, 0));
    // It runs again on the next offers.
    let again = launched(&q.offers(c.offers(&[8, 8]), now));
    assert_eq!(again.len(), 2);
    assert!(again
        .iter()
        .all(|t| tasks.iter().all(|o| o.task_id != t.task_id)));
}

/// The flake of tests/tests/gpu_queue.rs `mixed_jobs_and_gangs_from_three_teams_all_finish`:
/// an agent offered 4 GPUs while our 4-GPU job ran on the other 4 stays offered as 4 once the
/// job ends (the master does not add to an offer we hold, and offers a declared demand only as
/// whole tasks: an 8-GPU worker fits neither in the offer nor in the 4 freed beside it). The
/// queue declines that stale offer with no filter as soon as the worker's end is known, so the
/// master offers the agent whole; it kept it for the offer hold (20 s), every GPU idle.
#[test]
fn an_offer_older_than_a_workers_end_there_is_declined_to_be_offered_whole() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    q.submit(spec("a", "t", Priority::Normal, 4, 1), t0);
    let a = q.offers(c.offers(&[8]), t0);
    let tasks = launched(&a);
    assert_eq!(tasks.len(), 1, "{a:?}");
    let busy: Vec<String> = (0..4).map(|i| format!("GPU-0-{i}")).collect();
    q.update(&update(&tasks[0], TaskState::Running, busy.clone()), t0);
    // The rest of the agent is offered while `a` runs; `b` needs all of it.
    let t1 = t0 + Duration::from_millis(100);
    q.submit(spec("b", "t", Priority::Normal, 8, 1), t1);
    let partial = c.offers(&[4]);
    let a = q.offers(partial.clone(), t1);
    assert!(
        !a.iter()
            .any(|a| matches!(a, Action::Launch { .. } | Action::Decline(..))),
        "{a:?}"
    );
    // `a` ends: the offer lacks what it freed. Declined at once, with no filter.
    let t2 = t1 + Duration::from_secs(2);
    let a = q.update(&update(&tasks[0], TaskState::Finished, busy), t2);
    assert!(
        a.contains(&Action::Decline(vec![partial[0].id], 0.0)),
        "{a:?}"
    );
    // Offered whole again: `b` launches.
    let t3 = t2 + Duration::from_millis(100);
    let a = q.offers(c.offers(&[8]), t3);
    assert_eq!(launched(&a).len(), 1, "{a:?}");
    assert!(!a.iter().any(|a| matches!(a, Action::Decline(..))), "{a:?}");
}
