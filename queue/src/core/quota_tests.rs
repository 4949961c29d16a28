//! Quotas per GPU model, lending limits, and borrowing limits on elastic growth (`quota`),
//! without a cluster. The test agents have four A100s (GPUs 0–3) and four H100s (4–7).

use super::tests::{kills_of, launched, spec, update, Cluster};
use super::*;
use crate::model::TeamLimit;

fn team(spec: &str) -> (String, TeamConfig) {
    TeamConfig::parse(spec).unwrap()
}

/// Each launched task's GPUs, from the core's members.
fn gpus_of(q: &Core, t: &TaskInfo) -> Vec<String> {
    let (job, idx) = q.tasks[&t.task_id];
    q.jobs[&job].members[&idx].gpus.clone()
}

#[test]
fn team_specs_parse_with_per_model_quotas_and_todays_syntax() {
    let (n, t) = team("nlp=2");
    assert_eq!((n.as_str(), t.weight, t.gpu_quota), ("nlp", 2.0, None));
    assert!(!t.has_quota());
    let (_, t) = team("nlp=1:16");
    assert_eq!((t.gpu_quota, t.model_quotas.len()), (Some(16), 0));
    let (_, t) = team("nlp=1:8,A100:4,H100:2");
    assert_eq!(t.gpu_quota, Some(8));
    assert_eq!(
        t.model_quotas,
        [("A100".into(), 4), ("H100".into(), 2)].into()
    );
    assert_eq!(t.nominal_gpus(), 14);
    let (_, t) = team("nlp=8,A100:4");
    assert_eq!((t.weight, t.gpu_quota, t.nominal_gpus()), (8.0, None, 4));
    assert!(t.has_quota());
    for bad in [
        "nlp",
        "=1",
        "nlp=0",
        "nlp=1:x",
        "nlp=1,A100",
        "nlp=1,A100:x",
        "nlp=1,:3",
        "nlp=1,A100:1,A100:2",
    ] {
        assert!(TeamConfig::parse(bad).is_err(), "{bad}");
    }
    assert!(TeamConfig::parse("nlp=1,A100:1,A100:2")
        .unwrap_err()
        .contains("named twice"));
}

/// nlp's quota is 4 A100s; cv's is 8 GPUs of the other models. cv's 8 jobs that name no model
/// fill the agent, 4 of them on A100s: borrowed from nlp's A100 quota (cv has none there).
/// An nlp A100 job reclaims only A100s, from cv's jobs there; an nlp job for H100s (a model
/// no team names: nlp has no quota for it) reclaims nothing.
#[test]
fn a_per_model_quota_reclaims_only_that_model_from_its_borrowers() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig {
        teams: [team("nlp=1,A100:4"), team("cv=1:8")].into(),
        ..Default::default()
    });
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    for i in 0..8 {
        q.submit(spec(&format!("cv{i}"), "cv", Priority::Normal, 1, 1), t0);
    }
    let cv = launched(&q.offers(c.offers(&[8]), t0));
    assert_eq!(cv.len(), 8);
    for t in &cv {
        let g = gpus_of(&q, t);
        q.update(&update(t, TaskState::Running, g), t0 + s);
    }
    let usage = q.usage(t0 + s);
    assert_eq!(usage["cv"].in_bucket(Some("A100")), 4000, "milli-GPUs");
    assert_eq!(usage["cv"].in_bucket(None), 4000);
    // An H100 job of nlp: no quota of nlp covers it, nothing is reclaimed.
    let mut h = spec("h", "nlp", Priority::Normal, 1, 1);
    h.gpu_model = Some("H100".into());
    let (_, a) = q.submit(h, t0 + 2 * s);
    assert!(kills_of(&a).is_empty(), "{a:?}");
    // An A100 job of nlp within its A100 quota: two of cv's A100 jobs are preempted.
    let mut n = spec("n", "nlp", Priority::Normal, 2, 1);
    n.gpu_model = Some("a100".into());
    let (_, a) = q.submit(n, t0 + 3 * s);
    let kills = kills_of(&a);
    assert_eq!(kills.len(), 2, "{a:?}");
    for t in cv.iter().filter(|t| kills.contains(&t.task_id)) {
        let g = gpus_of(&q, t);
        assert!(
            g.iter()
                .all(|u| ["0", "1", "2", "3"].contains(&&u[u.len() - 1..])),
            "an A100 victim: {g:?}"
        );
    }
}

/// A lending limit: nlp's quota is 8 and it lends at most 2 of it. On an idle 8-GPU agent cv
/// (no quota) borrows 2 GPUs and its other jobs wait, saying why; nlp's own jobs start at
/// once on the GPUs kept for it, and nlp still reclaims what it lent. Without the limit cv
/// takes all 8.
#[test]
fn a_lending_limit_keeps_idle_quota_for_its_team_and_reclaim_takes_back_the_rest() {
    let c = Cluster::new(1);
    let config = |lend: bool| CoreConfig {
        teams: [team("nlp=1:8")].into(),
        team_lend_limits: if lend {
            [("nlp".to_string(), TeamLimit::all(2))].into()
        } else {
            Default::default()
        },
        ..Default::default()
    };
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let mut free = Core::new(config(false));
    for i in 0..8 {
        free.submit(spec(&format!("cv{i}"), "cv", Priority::Normal, 1, 1), t0);
    }
    assert_eq!(launched(&free.offers(c.offers(&[8]), t0)).len(), 8);

    let mut q = Core::new(config(true));
    for i in 0..8 {
        q.submit(spec(&format!("cv{i}"), "cv", Priority::Normal, 1, 1), t0);
    }
    let cv = launched(&q.offers(c.offers(&[8]), t0));
    assert_eq!(cv.len(), 2);
    for t in &cv {
        let g = gpus_of(&q, t);
        q.update(&update(t, TaskState::Running, g), t0 + s);
    }
    let v = q
        .views(t0 + s)
        .into_iter()
        .find(|v| v.name == "cv2")
        .unwrap();
    assert_eq!(
        v.pending_reason.as_deref(),
        Some("lending limits keep 6 idle GPUs for team nlp (5 would be left free)")
    );
    // nlp's jobs are within its quota: they start on the GPUs kept for it.
    for i in 0..3 {
        q.submit(
            spec(&format!("n{i}"), "nlp", Priority::Normal, 1, 1),
            t0 + 2 * s,
        );
    }
    let nlp = launched(&q.offers(c.offers(&[6]), t0 + 2 * s));
    assert_eq!(nlp.len(), 3, "{nlp:?}");
    assert!(nlp.iter().all(|t| t.name.starts_with('n')));
    for t in &nlp {
        let g = gpus_of(&q, t);
        q.update(&update(t, TaskState::Running, g), t0 + 3 * s);
    }
    // nlp uses 3 of 8: 3 stay kept (8 - 3 - 2), the 3 free GPUs; cv still waits.
    assert!(launched(&q.offers(c.offers(&[3]), t0 + 4 * s)).is_empty());
    // A 4-GPU nlp job (3 + 4 within 8) finds 3 free: one of cv's borrowed GPUs is reclaimed.
    let (_, a) = q.submit(spec("big", "nlp", Priority::Normal, 4, 1), t0 + 5 * s);
    let kills = kills_of(&a);
    assert_eq!(kills.len(), 1, "{a:?}");
    assert!(cv.iter().any(|t| kills.contains(&t.task_id)));
}

/// Elastic growth stays within the borrowing limit: nlp (quota 2, borrowing limit 2) grows an
/// elastic 1..8 gang to 4 workers on an idle 8-GPU agent, no further.
#[test]
fn elastic_growth_stays_within_the_borrowing_limit() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig {
        teams: [team("nlp=1:2")].into(),
        team_borrow_limits: [("nlp".to_string(), TeamLimit::all(2))].into(),
        ..Default::default()
    });
    let t0 = Instant::now();
    let mut e = spec("e", "nlp", Priority::Normal, 1, 1);
    e.max_workers = 8;
    q.submit(e, t0);
    let mut n = launched(&q.offers(c.offers(&[8]), t0)).len();
    n += launched(&q.offers(c.offers(&[8 - n as u32]), t0 + Duration::from_secs(1))).len();
    assert_eq!(n, 4);
}

#[test]
fn team_limits_parse_overall_and_per_model() {
    let p = |s| TeamLimit::parse("--team-borrow-limit", s);
    assert_eq!(p("nlp=4").unwrap(), ("nlp".into(), TeamLimit::all(4)));
    let (_, l) = p("nlp=4,A100:2").unwrap();
    assert_eq!(
        (l.all, l.model("a100"), l.model("H100")),
        (Some(4), Some(2), None)
    );
    let (_, l) = p("nlp=A100:2,H100:0").unwrap();
    assert_eq!(
        (l.all, l.model("A100"), l.model("h100")),
        (None, Some(2), Some(0))
    );
    for bad in [
        "nlp",
        "=1",
        "nlp=x",
        "nlp=1,2",
        "nlp=:2",
        "nlp=A100:x",
        "nlp=A100:1,A100:2",
    ] {
        let e = p(bad).unwrap_err();
        assert!(e.starts_with("--team-borrow-limit"), "{bad}: {e}");
    }
}

/// A per-model borrowing limit: nlp's quota is 2 A100s (and 8 other GPUs), and it may borrow
/// at most 1 A100 beyond it. Its A100 jobs stop at 3 A100s, saying why; a job naming no model
/// is not placed on a 4th A100 either (its plan is refused), while the overall quota still
/// lets it run on H100s.
#[test]
fn a_per_model_borrowing_limit_caps_the_models_bucket() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig {
        teams: [team("nlp=1:8,A100:2")].into(),
        team_borrow_limits: [(
            "nlp".to_string(),
            TeamLimit::parse("--team-borrow-limit", "nlp=A100:1")
                .unwrap()
                .1,
        )]
        .into(),
        ..Default::default()
    });
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    for i in 0..4 {
        let mut a = spec(&format!("a{i}"), "nlp", Priority::Normal, 1, 1);
        a.gpu_model = Some("A100".into());
        q.submit(a, t0);
    }
    let a = launched(&q.offers(c.offers(&[8]), t0));
    assert_eq!(a.len(), 3, "{a:?}");
    for t in &a {
        let g = gpus_of(&q, t);
        assert!(
            ["0", "1", "2", "3"].contains(&&g[0][g[0].len() - 1..]),
            "{g:?}"
        );
        q.update(&update(t, TaskState::Running, g), t0 + s);
    }
    let v = q
        .views(t0 + s)
        .into_iter()
        .find(|v| v.name == "a3")
        .unwrap();
    assert_eq!(
        v.pending_reason.as_deref(),
        Some("team nlp at its A100 borrowing limit: 3 GPUs used of 2 + 1")
    );
    q.cancel(4, t0 + s).unwrap();
    // Only one A100 (GPU 3) is free: a job naming no model may not take it.
    let offer = |free: &[&str]| {
        let mut o = c.offers(&[8]);
        let n = free.len();
        o[0].resources = format!("cpus:{n};mem:{};gpus:{n}", n * 1024)
            .parse()
            .unwrap();
        o[0].gpus = o[0]
            .gpus
            .iter()
            .filter(|g| free.iter().any(|f| g.uuid.ends_with(f)))
            .cloned()
            .collect::<Vec<_>>()
            .into();
        o
    };
    q.submit(spec("any", "nlp", Priority::Normal, 1, 1), t0 + 2 * s);
    assert!(launched(&q.offers(offer(&["3"]), t0 + 2 * s)).is_empty());
    let v = q
        .views(t0 + 2 * s)
        .into_iter()
        .find(|v| v.name == "any")
        .unwrap();
    assert!(
        v.pending_reason
            .as_deref()
            .is_some_and(|r| r.contains("A100 borrowing limit")),
        "{v:?}"
    );
    // With an H100 free beside it, it runs there.
    let any = launched(&q.offers(offer(&["3", "4"]), t0 + 3 * s));
    assert_eq!(any.len(), 1);
    assert!(gpus_of(&q, &any[0])[0].ends_with('4'));
}

/// A per-model lending limit: nlp (quota 4 A100s and 4 other GPUs) lends at most 1 of its
/// idle A100s and 3 of its other GPUs (the overall limit). cv, without a quota, borrows 1
/// A100 and 3 H100s of an idle 8-GPU agent, no more.
#[test]
fn a_per_model_lending_limit_keeps_that_models_idle_quota() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig {
        teams: [team("nlp=1:4,A100:4")].into(),
        team_lend_limits: [(
            "nlp".to_string(),
            TeamLimit::parse("--team-lend-limit", "nlp=3,A100:1")
                .unwrap()
                .1,
        )]
        .into(),
        ..Default::default()
    });
    let t0 = Instant::now();
    for i in 0..8 {
        q.submit(spec(&format!("cv{i}"), "cv", Priority::Normal, 1, 1), t0);
    }
    let cv = launched(&q.offers(c.offers(&[8]), t0));
    let mut got: Vec<String> = cv
        .iter()
        .map(|t| gpus_of(&q, t)[0].chars().last().unwrap().to_string())
        .collect();
    got.sort();
    let a100s = got.iter().filter(|g| g.as_str() < "4").count();
    assert_eq!((cv.len(), a100s), (4, 1), "{got:?}");
}
