//! Pending jobs explain themselves; jobs no agent can ever fit are recognised.

use std::collections::BTreeMap;
use std::time::Instant;

use gantry_sdk::protocol::*;

use super::super::tests::{gpus, launched, spec, update, Cluster};
use super::super::{Core, CoreConfig};
use crate::model::{JobView, Priority, TeamConfig};

fn reason(q: &Core, id: u64, now: Instant) -> (String, Option<u32>, Option<u32>) {
    let v: JobView = q.view(id, now).unwrap();
    (
        v.pending_reason.unwrap_or_default(),
        v.position,
        v.team_position,
    )
}

#[test]
fn a_job_no_agent_can_ever_fit_is_recognised_with_the_reason() {
    let c = Cluster::new(2);
    let mut q = Core::new(CoreConfig::default());
    let now = Instant::now();
    // No agent known yet: nothing is judged.
    assert_eq!(
        q.never_fits(&spec("big", "t", Priority::Normal, 16, 1)),
        None
    );
    q.offers(c.offers(&[8, 8]), now);
    assert_eq!(
        q.never_fits(&spec("big", "t", Priority::Normal, 16, 1))
            .as_deref(),
        Some("needs 16 GPUs on one agent; largest is 8")
    );
    let mut a100 = spec("a", "t", Priority::Normal, 6, 1);
    a100.gpu_model = Some("A100".into());
    assert_eq!(
        q.never_fits(&a100).as_deref(),
        Some("needs 6 A100 GPUs on one agent; largest is 4")
    );
    assert_eq!(
        q.never_fits(&spec("g", "t", Priority::Normal, 8, 3))
            .as_deref(),
        Some("needs 3 workers of 8 GPUs (24 in all); the cluster has room for 2 such workers")
    );
    assert_eq!(q.never_fits(&spec("g", "t", Priority::Normal, 8, 2)), None);
    assert_eq!(
        q.never_fits(&spec("cpu", "t", Priority::Normal, 0, 64)),
        None
    );
}

#[test]
fn an_elastic_queue_accepts_a_job_no_agent_fits_yet_and_says_it_waits_for_one() {
    let c = Cluster::new(2);
    let now = Instant::now();
    let mut h100 = spec("h", "t", Priority::Normal, 1, 1);
    h100.gpu_model = Some("B200".into());
    for elastic in [false, true] {
        let mut q = Core::new(CoreConfig {
            elastic,
            ..CoreConfig::default()
        });
        q.offers(c.offers(&[8, 8]), now);
        let never = "needs 1 B200 GPUs on one agent; largest is 0";
        assert_eq!(q.never_fits(&h100).as_deref(), Some(never));
        if !elastic {
            assert_eq!(q.refusal(&h100).as_deref(), Some(never));
            continue;
        }
        assert_eq!(q.refusal(&h100), None);
        let (id, _) = q.submit(h100.clone(), now);
        assert_eq!(
            reason(&q, id, now).0,
            format!("no agent fits it yet ({never}): waiting for the cluster to grow")
        );
    }
}

#[test]
fn a_removed_agent_no_longer_counts_in_what_fits() {
    let c = Cluster::new(2);
    let mut q = Core::new(CoreConfig::default());
    let now = Instant::now();
    q.offers(c.offers(&[8, 8]), now);
    assert_eq!(q.known_agents(), (2, 16));
    let gang = spec("g", "t", Priority::Normal, 8, 2);
    assert_eq!(q.never_fits(&gang), None);
    // An agent the queue never saw: nothing changes.
    assert!(q.agent_removed(AgentId::random(), now).is_empty());
    assert_eq!(q.known_agents(), (2, 16));
    // The master says the second agent left for good (its offer went with it).
    q.agent_removed(c.agents[1], now);
    assert_eq!(q.known_agents(), (1, 8));
    assert_eq!(
        q.never_fits(&gang).as_deref(),
        Some("needs 2 workers of 8 GPUs (16 in all); the cluster has room for 1 such workers")
    );
    // A one-agent job still fits, and launches on the agent that is left.
    q.submit(spec("one", "t", Priority::Normal, 8, 1), now);
    let tasks = launched(&q.offers(c.offers(&[8])[..1].to_vec(), now));
    assert_eq!(tasks.len(), 1);
}

#[test]
fn pending_jobs_say_why_they_wait_and_where_they_stand() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let now = Instant::now();
    q.submit(spec("run", "nlp", Priority::Normal, 8, 1), now);
    let tasks = launched(&q.offers(c.offers(&[8]), now));
    q.update(&update(&tasks[0], TaskState::Running, vec![]), now);
    // The first job blocked holds the reservation (the core keeps the holder until its hold
    // times out), even though jobs of a higher class come after it.
    q.submit(spec("low", "nlp", Priority::Low, 4, 1), now);
    q.submit(spec("norm", "cv", Priority::Normal, 4, 1), now);
    q.submit(spec("norm2", "nlp", Priority::Normal, 4, 1), now);
    q.submit(spec("huge", "cv", Priority::Normal, 16, 1), now);
    q.submit(spec("low2", "nlp", Priority::Low, 4, 1), now);
    q.tick(now);
    assert_eq!(
        reason(&q, 2, now),
        (
            "next to run: GPUs are reserved for it as running jobs end".to_string(),
            Some(4),
            Some(2)
        )
    );
    assert_eq!(
        reason(&q, 3, now),
        (
            "waiting for 4 free GPUs (0 free now)".to_string(),
            Some(1),
            Some(1)
        )
    );
    // cv holds no GPU, nlp 8: cv's jobs go first (fair share).
    assert_eq!(
        reason(&q, 4, now),
        (
            "behind 2 jobs of the same priority (fair share, then age)".to_string(),
            Some(3),
            Some(1)
        )
    );
    assert_eq!(
        reason(&q, 6, now),
        (
            "behind 3 higher-priority jobs".to_string(),
            Some(5),
            Some(3)
        )
    );
    assert_eq!(
        reason(&q, 5, now).0,
        "needs 16 GPUs on one agent; largest is 8"
    );
    // Running and ended jobs have neither reason nor position.
    let v = q.view(1, now).unwrap();
    assert_eq!((v.pending_reason, v.position), (None, None));
}

#[test]
fn a_team_over_its_quota_says_so() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig {
        teams: [(
            "nlp".to_string(),
            TeamConfig {
                weight: 1.0,
                gpu_quota: Some(8),
                model_quotas: Default::default(),
            },
        )]
        .into(),
        ..Default::default()
    });
    let now = Instant::now();
    q.submit(spec("run", "nlp", Priority::Normal, 8, 1), now);
    let tasks = launched(&q.offers(c.offers(&[8]), now));
    q.update(&update(&tasks[0], TaskState::Running, vec![]), now);
    q.submit(spec("other", "cv", Priority::Normal, 2, 1), now);
    q.submit(spec("more", "nlp", Priority::Normal, 2, 1), now);
    q.tick(now);
    // The team within its quota goes first (and holds the reservation).
    assert_eq!(reason(&q, 2, now).1, Some(1));
    assert_eq!(
        reason(&q, 3, now),
        ("team nlp at its quota 8/8".to_string(), Some(2), Some(1))
    );
}

/// The master's summary of agent `i` of `c`: 8 GPUs, `unhealthy` of them not.
fn summary(c: &Cluster, i: usize, reserved_for: Option<&str>, unhealthy: usize) -> AgentSummary {
    let mut g = gpus(i as u32);
    for gpu in g.iter_mut().take(unhealthy) {
        gpu.healthy = false;
    }
    let all: Resources = format!("cpus:8;mem:8192;gpus:{}", 8 - unhealthy)
        .parse()
        .unwrap();
    let (resources, reserved) = match reserved_for {
        Some(role) => (Resources::new(), BTreeMap::from([(role.to_string(), all)])),
        None => (all, BTreeMap::new()),
    };
    AgentSummary {
        agent_id: c.agents[i],
        hostname: format!("h{i}"),
        agent_name: format!("a{i}"),
        resources,
        reserved,
        attributes: Default::default(),
        gpus: g,
    }
}

#[test]
fn the_inventory_counts_agents_never_offered() {
    let c = Cluster::new(3);
    let mut q = Core::new(CoreConfig {
        role: "ml".into(),
        ..CoreConfig::default()
    });
    let now = Instant::now();
    // Offers from one agent only (the declared demand drew nothing else yet).
    q.offers(c.offers(&[8])[..1].to_vec(), now);
    let gang = spec("g", "t", Priority::Normal, 8, 2);
    assert_eq!(
        q.never_fits(&gang).as_deref(),
        Some("needs 2 workers of 8 GPUs (16 in all); the cluster has room for 1 such workers")
    );
    // The master's inventory: agent 1 is unreserved, agent 2 reserved for another role.
    q.agents(&[summary(&c, 1, None, 0), summary(&c, 2, Some("other"), 0)]);
    assert_eq!(q.known_agents(), (3, 24));
    assert_eq!(q.never_fits(&gang), None);
    let three = spec("g3", "t", Priority::Normal, 8, 3);
    assert_eq!(
        q.never_fits(&three).as_deref(),
        Some("needs 3 workers of 8 GPUs (24 in all); the cluster has room for 2 such workers"),
        "another role's reservation is not the queue's"
    );
    // Reserved for the queue's own role, it counts.
    q.agents(&[summary(&c, 2, Some("ml"), 0)]);
    assert_eq!(q.never_fits(&three), None);
    // A GPU turns unhealthy: the summary replaces the agent's GPUs.
    q.agents(&[summary(&c, 2, Some("ml"), 1)]);
    assert_eq!(q.known_agents(), (3, 23));
    assert!(q.never_fits(&three).is_some());
}
