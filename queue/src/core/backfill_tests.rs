//! The reservation where GPUs free soonest and EASY backfill, without a cluster.

use super::tests::{kills_of, launched, spec, update, Cluster};
use super::*;

/// The agent index (in `c`) each launched task went to.
fn agents_of(c: &Cluster, q: &Core, tasks: &[TaskInfo]) -> BTreeSet<usize> {
    tasks
        .iter()
        .map(|t| {
            let (job, idx) = q.tasks[&t.task_id];
            let agent = q.jobs[&job].members[&idx].agent_id;
            c.agents.iter().position(|a| *a == agent).unwrap()
        })
        .collect()
}

fn limited(mut s: JobSpec, secs: Option<u64>) -> JobSpec {
    s.time_limit_secs = secs;
    s
}

/// The gang scenario on 24 GPUs (three 8-GPU agents): two 2×8 gangs, six 1-GPU
/// preemptible jobs, then a critical 8-GPU job. The blocked gang's reservation goes where the
/// running gang frees its GPUs, never on the idle agent, so the six small jobs run there at
/// once (no GPU idle while they wait), and the critical job preempts them. The same for any
/// agent ids (the old reservation took the first agents by id: 2 of 3 id sets left 8 GPUs
/// idle).
#[test]
fn a_blocked_gang_reserves_where_gpus_free_soonest_for_any_agent_ids() {
    for round in 0..12 {
        let c = Cluster::new(3);
        let mut q = Core::new(CoreConfig {
            default_time_limit: Some(Duration::from_secs(3600)),
            ..Default::default()
        });
        let t0 = Instant::now();
        let a = limited(spec("a", "nlp", Priority::Normal, 8, 2), Some(600));
        q.submit(a, t0);
        q.submit(spec("b", "nlp", Priority::Normal, 8, 2), t0);
        // a starts on two agents; b reserves where GPUs free first; then the small jobs come.
        let mut first = launched(&q.offers(c.offers(&[8, 8, 8]), t0));
        q.tick(t0);
        let on_a = agents_of(&c, &q, &first);
        // Before any small job runs, b's reservation is already on a's agents (the old
        // placement took the first two agents by id, often the idle one).
        let early: BTreeSet<usize> = q
            .last_reservation
            .as_ref()
            .map(|r| {
                r.parts
                    .iter()
                    .map(|p| c.agents.iter().position(|a| *a == p.0).unwrap())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(
            early, on_a,
            "round {round}: reserved where a frees its GPUs"
        );
        let third = (0..3).find(|i| !on_a.contains(i)).unwrap();
        for i in 0..6 {
            let p = spec(&format!("p{i}"), "cv", Priority::Preemptible, 1, 1);
            first.extend(launched(&q.submit(p, t0).1));
            // The rest of the third agent is offered again after each launch there.
            let free = 8 - (first.len() as u32 - 2);
            let mut counts = [0, 0, 0];
            counts[third] = free;
            let offer: Vec<Offer> = c
                .offers(&counts)
                .into_iter()
                .filter(|o| o.agent_id == c.agents[third])
                .collect();
            first.extend(launched(&q.offers(offer, t0)));
        }
        let names: BTreeSet<&str> = first.iter().map(|t| t.name.as_str()).collect();
        let expect: BTreeSet<&str> = ["a/0", "a/1", "p0/0", "p1/0", "p2/0", "p3/0", "p4/0", "p5/0"]
            .into_iter()
            .collect();
        assert_eq!(
            names, expect,
            "round {round}: every small job starts at once"
        );
        let gang: Vec<TaskInfo> = first
            .iter()
            .filter(|t| t.name.starts_with("a/"))
            .cloned()
            .collect();
        let small: Vec<TaskInfo> = first
            .iter()
            .filter(|t| t.name.starts_with('p'))
            .cloned()
            .collect();
        let gang_agents = agents_of(&c, &q, &gang);
        let small_agents = agents_of(&c, &q, &small);
        assert_eq!(gang_agents.len(), 2);
        assert_eq!(small_agents.len(), 1);
        assert!(gang_agents.is_disjoint(&small_agents), "round {round}");
        for t in &first {
            q.update(&update(t, TaskState::Running, vec![]), t0);
        }
        // b holds the reservation on a's agents, which free first; nothing is idle.
        q.tick(t0);
        let r = q
            .last_reservation
            .clone()
            .unwrap_or_else(|| panic!("b's reservation: {:?} {:?}", q.order(t0), q.holds.holder()));
        assert_eq!(r.holder, 2);
        let reserved: BTreeSet<usize> = r
            .parts
            .iter()
            .map(|p| c.agents.iter().position(|a| *a == p.0).unwrap())
            .collect();
        assert_eq!(reserved, gang_agents, "round {round}");
        assert_eq!(r.start, Some(t0 + Duration::from_secs(600)));
        let s = Duration::from_secs(1);
        q.tick(t0 + s);
        q.tick(t0 + 5 * s);
        assert_eq!(q.stats.idle_while_eligible_gpu_secs, 0.0, "round {round}");
        assert_eq!(q.stats.reserved_idle_gpu_secs, 0.0, "round {round}");
        // The critical job preempts the six small ones (all on the third agent).
        let (_, a) = q.submit(spec("urgent", "cv", Priority::Critical, 8, 1), t0 + 5 * s);
        let kills: Vec<TaskId> = a
            .iter()
            .filter_map(|a| match a {
                Action::KillFor(t, TaskReason::Preempted) => Some(*t),
                _ => None,
            })
            .collect();
        assert_eq!(kills.len(), 6, "round {round}: {a:?}");
        for t in &small {
            q.update(&update(t, TaskState::Killed, vec![]), t0 + 6 * s);
        }
        let third = *small_agents.iter().next().unwrap();
        let mut free = [0, 0, 0];
        free[third] = 8;
        let offers: Vec<Offer> = c
            .offers(&free)
            .into_iter()
            .filter(|o| o.agent_id == c.agents[third])
            .collect();
        let names: Vec<String> = launched(&q.offers(offers, t0 + 6 * s))
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(names, ["urgent/0"], "round {round}");
    }
}

/// EASY backfill on one 8-GPU agent: a 4-GPU job runs with a 100 s limit, an 8-GPU job waits
/// (reserved from t0+100 s). A 1-GPU job limited to 50 s ends before that and backfills on the
/// reserved GPUs; one limited to 200 s or unlimited does not. Reserved GPUs a backfillable
/// job could use count as idle-while-eligible.
#[test]
fn easy_backfill_runs_only_jobs_that_end_before_the_reservation_starts() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    q.submit(
        limited(spec("run", "t", Priority::Normal, 4, 1), Some(100)),
        t0,
    );
    let run = launched(&q.offers(c.offers(&[8]), t0));
    q.update(&update(&run[0], TaskState::Running, vec![]), t0);
    q.submit(spec("big", "t", Priority::Normal, 8, 1), t0);
    q.submit(
        limited(spec("long", "t", Priority::Normal, 1, 1), Some(200)),
        t0,
    );
    q.submit(spec("unlimited", "t", Priority::Normal, 1, 1), t0);
    let t1 = t0 + 10 * s;
    let a = q.offers(c.offers(&[4]), t1);
    assert!(launched(&a).is_empty(), "{a:?}");
    assert_eq!(
        q.last_reservation.as_ref().map(|r| (r.holder, r.start)),
        Some((2, Some(t0 + 100 * s)))
    );
    // Held for big, and nothing waiting could use them without delaying it: reserved.
    q.tick(t1);
    q.tick(t1 + s);
    assert_eq!(q.stats.reserved_idle_gpu_secs, 4.0);
    assert_eq!(q.stats.idle_while_eligible_gpu_secs, 0.0);
    // A job that ends by t0+100 s may run there now.
    let (_, a) = q.submit(
        limited(spec("short", "t", Priority::Normal, 1, 1), Some(50)),
        t1 + s,
    );
    let names: Vec<String> = launched(&a).into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["short/0"]);
    // Another short one, with no offer in hand: the 3 free GPUs are idle while it waits.
    q.submit(
        limited(spec("short2", "t", Priority::Normal, 1, 1), Some(50)),
        t1 + s,
    );
    q.tick(t1 + 2 * s);
    assert_eq!(q.stats.idle_while_eligible_gpu_secs, 3.0);
    assert_eq!(q.stats.reserved_idle_gpu_secs, 4.0);
    let names: Vec<String> = launched(&q.offers(c.offers(&[3]), t1 + 30 * s))
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["short2/0"]);
    // Too late to end before big starts (t0+55 s + 50 s is past t0+100 s): nothing launches
    // (within big's hold: it started at t0 and lasts 60 s).
    q.submit(
        limited(spec("short3", "t", Priority::Normal, 1, 1), Some(50)),
        t1 + 30 * s,
    );
    let names: Vec<String> = launched(&q.offers(c.offers(&[2]), t1 + 45 * s))
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert!(names.is_empty(), "{names:?}");
}

/// Team and cluster default time limits apply to jobs without their own, and kill them.
#[test]
fn team_and_cluster_default_time_limits() {
    let mut q = Core::new(CoreConfig {
        team_time_limits: [("nlp".to_string(), Duration::from_secs(30))].into(),
        default_time_limit: Some(Duration::from_secs(90)),
        ..Default::default()
    });
    let own = limited(spec("own", "nlp", Priority::Normal, 1, 1), Some(10));
    assert_eq!(q.time_limit(&own), Some(Duration::from_secs(10)));
    let team = spec("team", "nlp", Priority::Normal, 1, 1);
    assert_eq!(q.time_limit(&team), Some(Duration::from_secs(30)));
    let other = spec("other", "cv", Priority::Normal, 1, 1);
    assert_eq!(q.time_limit(&other), Some(Duration::from_secs(90)));
    let c = Cluster::new(1);
    let t0 = Instant::now();
    q.submit(team, t0);
    let tasks = launched(&q.offers(c.offers(&[8]), t0));
    q.update(&update(&tasks[0], TaskState::Running, vec![]), t0);
    let a = q.tick(t0 + Duration::from_secs(30));
    assert!(a.contains(&Action::KillFor(tasks[0].task_id, TaskReason::TimeLimit)));
    assert_eq!(
        q.view(1, t0).unwrap().message,
        "time-limit: killed after its time limit of 30 s"
    );
}

/// Estimated starts simulate the queue forward with time limits: on one 8-GPU agent with a
/// 4-GPU job running until t0+100 s, an 8-GPU job starts then, a short 1-GPU job now, a 4-GPU
/// job of 200 s after the 8-GPU one ends, and an unlimited 1-GPU job beside it.
#[test]
fn estimated_starts_follow_time_limits() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    q.submit(
        limited(spec("run", "t", Priority::Normal, 4, 1), Some(100)),
        t0,
    );
    let run = launched(&q.offers(c.offers(&[8]), t0));
    q.update(&update(&run[0], TaskState::Running, vec![]), t0);
    q.submit(
        limited(spec("big", "t", Priority::Normal, 8, 1), Some(50)),
        t0,
    );
    q.submit(
        limited(spec("mid", "t", Priority::Normal, 4, 1), Some(200)),
        t0,
    );
    q.submit(spec("unlimited", "t", Priority::Normal, 1, 1), t0);
    q.submit(
        limited(spec("short", "t", Priority::Normal, 1, 1), Some(30)),
        t0,
    );
    let now = t0 + 10 * s;
    let wall = 1_000_000_000;
    let at = |secs: u64| Some(wall + (secs - 10) * 1000);
    let starts: BTreeMap<String, Option<u64>> = q
        .views_at(now, wall)
        .into_iter()
        .map(|v| (v.name, v.estimated_start_unix_ms))
        .collect();
    assert_eq!(starts["run"], None, "running");
    assert_eq!(starts["big"], at(100));
    assert_eq!(starts["short"], at(10), "fits now, ends before big");
    assert_eq!(starts["mid"], at(150));
    assert_eq!(starts["unlimited"], at(150), "beside mid");
    // Without a wall clock, no estimates.
    assert!(q
        .views(now)
        .iter()
        .all(|v| v.estimated_start_unix_ms.is_none()));
}

/// Quota reclaim: cv (quota 4) borrows nlp's idle quota on one 8-GPU agent; when nlp (quota
/// 4) has a job that fits its quota, cv's newest borrowed jobs are preempted for it, never
/// more than cv borrowed, and nlp at its quota reclaims nothing.
#[test]
fn a_team_within_its_quota_reclaims_borrowed_gpus_newest_first() {
    let quota = |q| TeamConfig {
        weight: 1.0,
        gpu_quota: Some(q),
        model_quotas: Default::default(),
    };
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig {
        teams: [("nlp".to_string(), quota(4)), ("cv".to_string(), quota(4))].into(),
        ..Default::default()
    });
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    for i in 0..8 {
        q.submit(spec(&format!("cv{i}"), "cv", Priority::Normal, 1, 1), t0);
    }
    let mut mask = c.offers(&[4]);
    mask[0].gpus = mask[0].gpus[..4].to_vec().into();
    let old = launched(&q.offers(mask, t0));
    assert_eq!(old.len(), 4);
    let new = launched(&q.offers(c.offers(&[4]), t0 + 10 * s));
    assert_eq!(new.len(), 4);
    for t in old.iter().chain(&new) {
        q.update(&update(t, TaskState::Running, vec![]), t0 + 10 * s);
    }
    let (_, a) = q.submit(spec("n", "nlp", Priority::Low, 2, 1), t0 + 20 * s);
    let kills = kills_of(&a);
    assert_eq!(kills.len(), 2, "{a:?}");
    let new_ids: BTreeSet<TaskId> = new.iter().map(|t| t.task_id).collect();
    assert!(kills.iter().all(|k| new_ids.contains(k)), "newest first");
    for t in new.iter().filter(|t| kills.contains(&t.task_id)) {
        q.update(&update(t, TaskState::Killed, vec![]), t0 + 21 * s);
    }
    let names: Vec<String> = launched(&q.offers(c.offers(&[2]), t0 + 21 * s))
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["n/0"]);
    // Two more nlp GPUs: still within its quota of 4, reclaimed from cv's 2 borrowed.
    let (_, a) = q.submit(spec("n2", "nlp", Priority::Low, 2, 1), t0 + 22 * s);
    assert_eq!(kills_of(&a).len(), 2, "{a:?}");
    // cv is at its quota now (4 running, none borrowed): nlp above its quota reclaims nothing.
    for t in new.iter().filter(|t| !kills.contains(&t.task_id)) {
        q.update(&update(t, TaskState::Killed, vec![]), t0 + 23 * s);
    }
    q.offers(c.offers(&[2]), t0 + 23 * s);
    let (_, a) = q.submit(spec("n3", "nlp", Priority::Low, 1, 1), t0 + 24 * s);
    assert!(kills_of(&a).is_empty(), "{a:?}");
}

/// Deadlines: a pending job past its latest start (deadline minus time limit) is cancelled with
/// the reason `deadline`, unless best-effort; its class rises as its latest start approaches.
#[test]
fn deadlines_raise_priority_and_cancel_past_the_latest_start() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let wall: u64 = 2_000_000_000_000;
    q.set_wall_clock(t0, wall);
    q.submit(spec("hog", "t", Priority::Normal, 8, 1), t0);
    let hog = launched(&q.offers(c.offers(&[8]), t0));
    q.update(&update(&hog[0], TaskState::Running, vec![]), t0);
    let due = |name: &str, in_secs: u64, best_effort: bool| {
        let mut j = limited(spec(name, "t", Priority::Low, 1, 1), Some(30));
        j.deadline_unix = Some(wall / 1000 + in_secs);
        j.deadline_best_effort = best_effort;
        j
    };
    q.submit(due("soon", 100, false), t0);
    q.submit(due("soon-best-effort", 100, true), t0);
    q.submit(due("later", 3600, false), t0);
    let class = |q: &Core, name: &str, at: Instant| {
        q.views(at)
            .into_iter()
            .find(|v| v.name == name)
            .map(|v| (v.state, v.effective_priority))
            .unwrap()
    };
    // Latest start in 70 s, within one aging interval (300 s): two classes up.
    assert_eq!(class(&q, "soon", t0), (JobState::Pending, Priority::High));
    assert_eq!(class(&q, "later", t0), (JobState::Pending, Priority::Low));
    q.tick(t0 + 70 * s);
    assert_eq!(class(&q, "soon", t0 + 70 * s).0, JobState::Pending);
    q.tick(t0 + 71 * s);
    assert_eq!(class(&q, "soon", t0 + 71 * s).0, JobState::Cancelled);
    assert!(q.view(2, t0).unwrap().message.starts_with("deadline: "));
    assert_eq!(
        class(&q, "soon-best-effort", t0 + 71 * s).0,
        JobState::Pending
    );
    assert_eq!(class(&q, "later", t0 + 71 * s).0, JobState::Pending);
}

/// Arrays: one job per index, named `NAME[INDEX]` with the index in the environment, and a
/// summary of the array's states on its first job.
#[test]
fn an_array_submits_one_job_per_index_with_a_summary() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    let mut s = spec("sweep", "t", Priority::Normal, 2, 1);
    s.array = Some("0-2,7".into());
    let (ids, _) = q.submit_array(s.clone(), "alice".into(), t0).unwrap();
    assert_eq!(ids, [1, 2, 3, 4]);
    let tasks = launched(&q.offers(c.offers(&[8]), t0));
    let envs: Vec<(String, Option<String>)> = tasks
        .iter()
        .map(|t| {
            let env = &t.env;
            (t.name.clone(), env.get("GANTRY_QUEUE_ARRAY_INDEX").cloned())
        })
        .collect();
    assert_eq!(
        envs,
        [
            ("sweep[0]/0".to_string(), Some("0".to_string())),
            ("sweep[1]/0".to_string(), Some("1".to_string())),
            ("sweep[2]/0".to_string(), Some("2".to_string())),
            ("sweep[7]/0".to_string(), Some("7".to_string())),
        ]
    );
    q.update(&update(&tasks[0], TaskState::Finished, vec![]), t0);
    let views = q.views(t0);
    let first = views.iter().find(|v| v.id == 1).unwrap();
    let sum: Vec<(String, u32)> = first.array_summary.clone().unwrap().into_iter().collect();
    assert_eq!(sum, [("FINISHED".into(), 1), ("RUNNING".into(), 3)]);
    assert!(views[1].array_summary.is_none());
    assert_eq!(
        (views[3].array_job, views[3].array_index),
        (Some(1), Some(7))
    );
    // Bad ranges are refused with the reason.
    for bad in ["3-1", "a-b", "0-5000"] {
        s.array = Some(bad.into());
        assert!(
            q.submit_array(s.clone(), String::new(), t0).is_err(),
            "{bad}"
        );
        assert!(s.problem().is_some(), "{bad}");
    }
}

/// Decaying fair-share usage: with a half-life, a team's past GPU-seconds count half after one
/// half-life, so an early flood's head start fades.
#[test]
fn fair_share_usage_decays_with_its_half_life() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig {
        usage_half_life: Some(Duration::from_secs(100)),
        ..Default::default()
    });
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    q.submit(spec("flood", "a", Priority::Normal, 8, 1), t0);
    let tasks = launched(&q.offers(c.offers(&[8]), t0));
    q.update(&update(&tasks[0], TaskState::Running, vec![]), t0);
    q.tick(t0);
    q.tick(t0 + 10 * s);
    let used = |q: &Core, at| q.usage(at).get("a").map_or(0.0, |u| u.gpu_secs);
    assert_eq!(used(&q, t0 + 10 * s), 80.0);
    q.update(&update(&tasks[0], TaskState::Finished, vec![]), t0 + 10 * s);
    q.tick(t0 + 110 * s);
    assert!((used(&q, t0 + 110 * s) - 40.0).abs() < 1e-9);
    q.tick(t0 + 210 * s);
    assert!((used(&q, t0 + 210 * s) - 20.0).abs() < 1e-9);
    // Without a half-life it counts forever.
    assert_eq!(q.stats.gpu_secs["a"], 80.0);
}

/// A worker's GPUs are its team's from its launch: usage and cost count the time it stages
/// (an image pull, say) as well as the time it runs.
#[test]
fn usage_and_cost_count_from_the_launch_staging_included() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let mut offers = c.offers(&[8]);
    // 3,600 an hour for the agent: one a second for all 8 GPUs.
    offers[0].attributes = std::sync::Arc::new(
        [(
            gantry_sdk::placement::cost::PRICE_ATTRIBUTE.to_string(),
            "3600".to_string(),
        )]
        .into(),
    );
    q.submit(spec("pull", "a", Priority::Normal, 4, 1), t0);
    let tasks = launched(&q.offers(offers, t0));
    assert_eq!(tasks.len(), 1);
    // Staging for 10 s: already 40 GPU-seconds and half the agent's price for 10 s.
    assert_eq!(q.gpu_secs(t0 + 10 * s)["a"], 40.0);
    assert_eq!(q.usage(t0 + 10 * s)["a"].gpu_secs, 40.0);
    assert!((q.running_cost("a", t0 + 10 * s) - 5.0).abs() < 1e-9);
    q.update(&update(&tasks[0], TaskState::Running, vec![]), t0 + 10 * s);
    q.update(&update(&tasks[0], TaskState::Finished, vec![]), t0 + 30 * s);
    assert_eq!(q.stats.gpu_secs["a"], 120.0);
    let changes = q.take_changes(t0 + 30 * s, 1_000_000);
    let u = &changes.usage[0];
    assert_eq!(u.secs, 30.0);
    assert!((u.cost.unwrap() - 15.0).abs() < 1e-9, "{u:?}");
}

/// `--fair-share-wait`: a team below its weighted share whose job has waited that long takes
/// GPUs back from `preemptible` jobs of a team above its share (newest first), and not before.
#[test]
fn an_under_share_team_reclaims_from_over_share_preemptible_work_after_the_wait() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig {
        fair_share_wait: Some(Duration::from_secs(60)),
        aging: Duration::ZERO,
        ..Default::default()
    });
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    for i in 0..8 {
        q.submit(spec(&format!("a{i}"), "a", Priority::Preemptible, 1, 1), t0);
    }
    let tasks = launched(&q.offers(c.offers(&[8]), t0));
    for t in &tasks {
        q.update(&update(t, TaskState::Running, vec![]), t0);
    }
    q.submit(spec("b", "b", Priority::Normal, 2, 1), t0 + s);
    assert!(
        kills_of(&q.tick(t0 + 60 * s)).is_empty(),
        "not before the wait"
    );
    let kills = kills_of(&q.tick(t0 + 61 * s));
    assert_eq!(kills.len(), 2);
}

/// A borrowing limit: a team with quota 2 and borrowing limit 2 uses at most 4 GPUs even on an
/// idle cluster, and its waiting job says why.
#[test]
fn a_team_borrows_at_most_its_borrowing_limit() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig {
        teams: [(
            "nlp".to_string(),
            TeamConfig {
                weight: 1.0,
                gpu_quota: Some(2),
                model_quotas: Default::default(),
            },
        )]
        .into(),
        team_borrow_limits: [("nlp".to_string(), crate::model::TeamLimit::all(2))].into(),
        ..Default::default()
    });
    let t0 = Instant::now();
    for i in 0..6 {
        q.submit(spec(&format!("n{i}"), "nlp", Priority::Normal, 1, 1), t0);
    }
    let names = launched(&q.offers(c.offers(&[8]), t0)).len();
    assert_eq!(names, 4);
    let v = q.views(t0).into_iter().find(|v| v.name == "n4").unwrap();
    assert_eq!(
        v.pending_reason.as_deref(),
        Some("team nlp at its borrowing limit: 4 GPUs used of 2 + 2")
    );
}

/// A reservation outlives the offer hold: a gang waiting an hour for a time-limited job to end
/// keeps its hold (and so its reservation) until the expected start plus the hold timeout,
/// not only the timeout (60 s) from when it began. Before, the hold timed out, the gang backed
/// off, and an unlimited 1-GPU job took the free GPUs it was waiting for.
#[test]
fn a_reservation_lasts_until_its_expected_start_not_only_the_hold_timeout() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    q.submit(
        limited(spec("run", "t", Priority::Normal, 4, 1), Some(3600)),
        t0,
    );
    let run = launched(&q.offers(c.offers(&[8]), t0));
    q.update(&update(&run[0], TaskState::Running, vec![]), t0);
    q.submit(spec("big", "t", Priority::Normal, 8, 1), t0);
    q.submit(spec("unlimited", "t", Priority::Normal, 1, 1), t0);
    let a = q.offers(c.offers(&[4]), t0 + 10 * s);
    assert!(launched(&a).is_empty(), "{a:?}");
    assert_eq!(
        q.last_reservation.as_ref().map(|r| (r.holder, r.start)),
        Some((2, Some(t0 + 3600 * s)))
    );
    // Long past the hold timeout, fresh offers of the 4 free GPUs: still big's.
    for t in [120, 600, 3000, 3650] {
        let now = t0 + t * s;
        q.tick(now);
        let a = q.offers(c.offers(&[4]), now);
        assert!(launched(&a).is_empty(), "at +{t} s: {a:?}");
        assert_eq!(q.holds.holder().map(|(k, _)| *k), Some(2), "at +{t} s");
    }
    // The job ends at its limit: big runs, then the unlimited one.
    let now = t0 + 3655 * s;
    q.update(&update(&run[0], TaskState::Finished, vec![]), now);
    let names: Vec<String> = launched(&q.offers(c.offers(&[8]), now))
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["big/0"]);
}
