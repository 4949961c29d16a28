//! Fractions of a GPU in the queue core: placement packs them onto shared GPUs, and quotas,
//! usage and pending reasons count a fraction as its fraction.

use super::tests::{gpus, kills_of, launched, spec, update, Cluster};
use super::*;
use crate::model::Gpus;

/// `spec` with `milli` milli-GPUs per worker.
fn frac(name: &str, team: &str, milli: u32) -> JobSpec {
    let mut s = spec(name, team, Priority::Normal, 0, 1);
    s.gpus = Gpus::from_milli(milli);
    s
}

/// One offer per agent of `c`: 16 CPUs, 16 GiB, its first `free.len()` GPUs with these free
/// milli-GPUs (as the master's `gpu_free` says).
fn offers(c: &Cluster, free: &[u32]) -> Vec<Offer> {
    let mut out = c.offers(&vec![0; c.agents.len()]);
    for (i, o) in out.iter_mut().enumerate() {
        let all = gpus(i as u32);
        let listed: Vec<GpuInfo> = all.into_iter().take(free.len()).collect();
        let total: u64 = free.iter().map(|&f| u64::from(f)).sum();
        o.resources = "cpus:16;mem:16384".parse().unwrap();
        o.resources.set_milli("gpus", total);
        o.gpu_free = listed
            .iter()
            .zip(free)
            .map(|(g, &f)| GpuFree {
                uuid: g.uuid.clone(),
                free_milli: f,
                free_memory_mib: g.memory_mib * u64::from(f) / 1000,
            })
            .collect();
        o.gpus = listed.into();
    }
    out
}

fn pinned(t: &TaskInfo) -> Vec<String> {
    t.gpu_selector
        .as_ref()
        .map(|s| s.uuids.clone())
        .unwrap_or_default()
}

#[test]
fn half_gpu_jobs_share_one_gpu_and_a_whole_gpu_job_gets_an_idle_one() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    q.submit(frac("a", "t", 500), t0);
    q.submit(frac("b", "t", 500), t0);
    q.submit(spec("w", "t", Priority::Normal, 1, 1), t0);
    let a = q.offers(offers(&c, &[1000, 1000]), t0);
    let tasks = launched(&a);
    assert_eq!(tasks.len(), 3, "{a:?}");
    let by = |n: &str| tasks.iter().find(|t| t.name.starts_with(n)).unwrap();
    let (ta, tb, tw) = (by("a/"), by("b/"), by("w/"));
    assert_eq!(ta.resources.milli("gpus"), 500);
    assert_eq!(pinned(ta).len(), 1, "a fraction is pinned to its GPU");
    assert_eq!(pinned(ta), pinned(tb), "the halves share one GPU");
    // The whole GPU is not pinned (the master picks idle GPUs); the GPU it was planned on is
    // the other one.
    assert!(pinned(tw).is_empty());
    let planned = &q.jobs[&3].members[&0].gpus;
    assert_eq!(planned.len(), 1);
    assert_ne!(planned, &pinned(ta));
    // The view shows the fraction.
    let v = q.view(1, t0).unwrap();
    assert_eq!(v.gpus_per_worker, Gpus::from_milli(500));
    assert_eq!(serde_json::to_value(&v).unwrap()["gpus_per_worker"], 0.5);
}

#[test]
fn a_fraction_packs_onto_a_gpu_already_shared() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    q.submit(frac("a", "t", 250), t0);
    // GPU 1 is half used (by another framework): the quarter goes there.
    let a = q.offers(offers(&c, &[1000, 500]), t0);
    let tasks = launched(&a);
    assert_eq!(pinned(&tasks[0]), vec!["GPU-0-1".to_string()]);
}

#[test]
fn quota_counts_a_fraction_as_its_fraction() {
    let c = Cluster::new(1);
    let mut teams = BTreeMap::new();
    teams.insert("t".to_string(), TeamConfig::parse("t=1:1").unwrap().1);
    let mut q = Core::new(CoreConfig {
        teams,
        ..CoreConfig::default()
    });
    let t0 = Instant::now();
    for n in ["a", "b", "c"] {
        q.submit(frac(n, "t", 500), t0);
    }
    // One GPU and room for two halves: both within the quota of 1.
    let a = q.offers(offers(&c, &[1000]), t0);
    let tasks = launched(&a);
    assert_eq!(tasks.len(), 2, "{a:?}");
    for t in &tasks {
        q.update(&update(t, TaskState::Running, pinned(t)), t0);
    }
    let usage = q.usage(t0);
    assert_eq!(usage["t"].gpus, 1000, "two halves hold one GPU");
    let third = &q.jobs[&3];
    assert!(q.over_quota(&third.spec, q.named_models(), &usage["t"]));
    let reason = q.view(3, t0).unwrap().pending_reason.unwrap();
    assert_eq!(reason, "team t at its quota 1/1");
    // A half that ran 10 s used 5 GPU-seconds.
    let t1 = t0 + Duration::from_secs(10);
    q.update(
        &update(&tasks[0], TaskState::Finished, pinned(&tasks[0])),
        t1,
    );
    assert!(
        (q.stats.gpu_secs["t"] - 5.0).abs() < 1e-6,
        "{:?}",
        q.stats.gpu_secs
    );
    let changes = q.take_changes(t1, 1_000_000);
    assert_eq!(changes.usage[0].gpus, Gpus::from_milli(500));
}

#[test]
fn gpus_are_read_as_a_fraction_below_one_or_whole_and_refused_otherwise() {
    let parse = |v: serde_json::Value| {
        serde_json::from_value::<JobSpec>(serde_json::json!({
            "name": "j", "team": "t", "command": ["true"], "gpus": v
        }))
    };
    assert_eq!(parse(0.5.into()).unwrap().gpus, Gpus::from_milli(500));
    assert_eq!(parse(0.125.into()).unwrap().gpus.milli(), 125);
    assert_eq!(parse(8.into()).unwrap().gpus, Gpus::whole(8));
    assert_eq!(parse(2.0.into()).unwrap().gpus, Gpus::whole(2));
    let s = parse(1.5.into()).unwrap();
    assert_eq!(
        s.problem().as_deref(),
        Some("gpus must be below 1 (a fraction of one GPU) or a whole number, got 1.5")
    );
    assert_eq!(
        parse(65.into()).unwrap().problem().as_deref(),
        Some("at most 64 GPUs per worker")
    );
    let e = parse(0.0005.into()).unwrap_err().to_string();
    assert!(e.contains("milli-GPU precision"), "{e}");
    let e = parse((-1).into()).unwrap_err().to_string();
    assert!(e.contains("non-negative"), "{e}");
    assert!(parse("half".into()).is_err());
    // The command line's form.
    assert_eq!("0.5".parse::<Gpus>().unwrap().to_string(), "0.5");
    assert_eq!("2".parse::<Gpus>().unwrap().to_string(), "2");
    assert!("x".parse::<Gpus>().is_err());
    assert_eq!(crate::model::fmt_milli(1250), "1.25");
    // Written back: whole GPUs as integers (as version 1 of the store wrote them).
    let json = serde_json::to_value(parse(0.25.into()).unwrap()).unwrap();
    assert_eq!(json["gpus"], 0.25);
    let json = serde_json::to_value(parse(4.into()).unwrap()).unwrap();
    assert_eq!(json["gpus"], 4);
    assert!(json["gpus"].is_u64());
}

#[test]
fn a_fraction_that_no_gpu_of_its_kind_can_host_is_refused() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    q.offers(offers(&c, &[1000]), t0);
    let mut s = frac("a", "t", 500);
    s.gpu_model = Some("B200".into());
    let why = q.never_fits(&s).expect("no B200");
    assert!(why.contains("B200"), "{why}");
    s.gpu_model = Some("A100".into());
    assert_eq!(q.never_fits(&s), None);
    // One GPU holds two halves: a gang of three does not fit the one-GPU cluster.
    s.gpu_model = None;
    s.min_workers = 3;
    s.max_workers = 3;
    let why = q.never_fits(&s).expect("room for two");
    assert!(why.contains("room for 2 such workers"), "{why}");
    s.min_workers = 2;
    s.max_workers = 2;
    assert_eq!(q.never_fits(&s), None);
}

#[test]
fn demand_declares_a_fractions_shape() {
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    q.submit(frac("a", "t", 500), t0);
    q.submit(frac("b", "t", 500), t0);
    let d = q.demand();
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].task.milli("gpus"), d[0].count), (500, 2));
}

/// A gang of four quarter-GPU workers fills one GPU, not four.
#[test]
fn a_gang_of_fractions_packs_onto_one_gpu() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    let mut s = frac("g", "t", 250);
    s.min_workers = 4;
    s.max_workers = 4;
    q.submit(s, t0);
    let a = q.offers(offers(&c, &[1000, 1000]), t0);
    let tasks = launched(&a);
    assert_eq!(tasks.len(), 4, "{a:?}");
    let gpus: std::collections::BTreeSet<Vec<String>> = tasks.iter().map(pinned).collect();
    assert_eq!(gpus.len(), 1, "{gpus:?}");
}

/// A `critical` whole-GPU job on a GPU two preemptible halves share preempts both (together
/// they give the GPU back); a `critical` half on a GPU a whole job holds preempts it.
#[test]
fn preemption_gives_back_a_fractions_share() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    for n in ["a", "b"] {
        let mut s = frac(n, "t", 500);
        s.priority = Priority::Preemptible;
        q.submit(s, t0);
    }
    let tasks = launched(&q.offers(offers(&c, &[1000]), t0));
    assert_eq!(tasks.len(), 2);
    for t in &tasks {
        q.update(&update(t, TaskState::Running, pinned(t)), t0);
    }
    let (_, a) = q.submit(spec("w", "u", Priority::Critical, 1, 1), t0);
    let mut killed = kills_of(&a);
    killed.sort();
    let mut want: Vec<TaskId> = tasks.iter().map(|t| t.task_id).collect();
    want.sort();
    assert_eq!(killed, want, "{a:?}");

    // The other way round: a whole preemptible job, then a critical half.
    let mut q = Core::new(CoreConfig::default());
    let mut s = spec("w", "t", Priority::Preemptible, 1, 1);
    s.cpus = 1.0;
    q.submit(s, t0);
    let tasks = launched(&q.offers(offers(&c, &[1000]), t0));
    assert_eq!(tasks.len(), 1);
    q.update(
        &update(&tasks[0], TaskState::Running, vec!["GPU-0-0".into()]),
        t0,
    );
    let mut s = frac("h", "u", 500);
    s.priority = Priority::Critical;
    let (_, a) = q.submit(s, t0);
    assert_eq!(kills_of(&a), vec![tasks[0].task_id], "{a:?}");
}

/// The idle-GPU statistic counts the free part of a shared GPU: when one of two halves on a
/// GPU ends, a waiting half-GPU job could start on what it freed, and until the agent's offer
/// brings it, half a GPU is idle while eligible work waits (0.5 GPU-seconds a second).
#[test]
fn the_free_half_of_a_shared_gpu_counts_as_idle_while_a_half_waits() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    for n in ["a", "b", "c"] {
        q.submit(frac(n, "t", 500), t0);
    }
    let tasks = launched(&q.offers(offers(&c, &[1000]), t0));
    assert_eq!(tasks.len(), 2, "two halves fill the GPU");
    for t in &tasks {
        q.update(&update(t, TaskState::Running, pinned(t)), t0);
    }
    q.tick(t0);
    q.tick(t0 + s);
    assert_eq!(q.stats.idle_while_eligible_gpu_secs, 0.0, "nothing free");
    q.update(
        &update(&tasks[0], TaskState::Finished, pinned(&tasks[0])),
        t0 + s,
    );
    q.tick(t0 + 3 * s);
    assert!(
        (q.stats.idle_while_eligible_gpu_secs - 1.0).abs() < 1e-9,
        "half a GPU idle for 2 s: {}",
        q.stats.idle_while_eligible_gpu_secs
    );
}
