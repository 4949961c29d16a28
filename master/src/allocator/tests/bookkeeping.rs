//! What the allocator keeps between cycles: quota counts, the filters that declines and accepts
//! install, demand counted across outstanding offers, limits, role slots, and which agents a
//! cycle visits.

use super::*;

#[test]
fn quota_bookkeeping_survives_changes_outside_a_cycle() {
    let mut a = alloc();
    a.set_quota("q", Some(res("cpus:2")), None).unwrap();
    a.add_agent(aid(1), "h1", res("cpus:8"), BTreeMap::new());
    assert!(a.allocate(0).is_empty());
    // A framework of q appears, and tasks it already runs are re-registered before any cycle.
    a.add_framework(fid(1), "q-fw", &roles(&["q"]), false, None);
    a.add_allocation(fid(1), aid(1), "q", &unres("cpus:3"))
        .unwrap();
    a.recover(fid(1), aid(1), &unres("cpus:3"));
    a.add_allocation(fid(1), aid(1), "q", &unres("cpus:1"))
        .unwrap();
    let o = a.allocate(1);
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].resources.unreserved, res("cpus:7"));
    assert!(matches!(
        a.add_allocation(fid(1), aid(1), "q", &unres("cpus:1")),
        Err(AllocError::ExceedsAgent { .. })
    ));
}

/// Two outstanding offers of f1 on h1: one made at 0 (its unused part came back without a
/// filter) and one made later.
fn two_offers_on_one_agent() -> (Allocator, OfferRecord, OfferRecord) {
    let mut a = alloc();
    a.add_framework(fid(1), "f1", &roles(&["r"]), false, None);
    a.add_agent(aid(1), "h1", res("cpus:2;mem:2048"), BTreeMap::new());
    let first = a.allocate(0).remove(0);
    a.accept(first.id, &unres("cpus:1;mem:1024"), Some(0), 1)
        .unwrap();
    let o1 = a.allocate(2).remove(0);
    a.recover(fid(1), aid(1), &unres("cpus:1;mem:1024"));
    let o2 = a.allocate(3).remove(0);
    assert_eq!(a.offers_on(fid(1), aid(1)), vec![o1.id, o2.id]);
    (a, o1, o2)
}

#[test]
fn one_decline_of_all_offers_on_the_agent_installs_one_filter() {
    let (mut a, o1, o2) = two_offers_on_one_agent();
    let done = a.decline_offers(&[o2.id, o1.id], Some(30_000), 10).unwrap();
    assert_eq!(
        done.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![o2.id, o1.id]
    );
    // One filter over the union: the whole agent stays filtered for 30 s (a filter per offer
    // would cover neither half's union).
    assert_eq!(a.metrics().active_filters, 1);
    assert!(a.allocate(1000).is_empty());
    assert!(a.allocate(30_009).is_empty());
    assert_eq!(a.allocate(30_010).len(), 1);
}

#[test]
fn a_decline_leaves_the_offers_it_does_not_name() {
    let (mut a, o1, o2) = two_offers_on_one_agent();
    a.decline(o1.id, Some(30_000), 10).unwrap();
    assert!(a.offer(o2.id).is_some(), "the framework may be using it");
    a.accept(o2.id, &unres("cpus:1;mem:1024"), Some(0), 11)
        .unwrap();
}

#[test]
fn one_accept_of_several_offers_installs_one_filter_over_the_unused_parts() {
    let (mut a, o1, o2) = two_offers_on_one_agent();
    let done = a
        .accept_offers(
            &[
                (o1.id, OfferResources::default()),
                (o2.id, unres("cpus:0.5")),
            ],
            Some(30_000),
            10,
        )
        .unwrap();
    assert_eq!(done.len(), 2);
    assert_eq!(a.in_use(fid(1), aid(1)).total(), res("cpus:0.5"));
    // The unused parts (1.5 cpus, 2048 mem) are refused together.
    assert!(a.allocate(1000).is_empty());
    let back = a.allocate(30_010);
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].resources.unreserved, res("cpus:1.5;mem:2048"));
    // Mixed frameworks or agents are refused and change nothing.
    a.add_framework(fid(2), "f2", &roles(&["r"]), false, None);
    a.add_agent(aid(2), "h2", res("cpus:1"), BTreeMap::new());
    let other = a.allocate(30_011);
    assert_eq!(other.len(), 1);
    assert!(matches!(
        a.decline_offers(&[back[0].id, other[0].id], None, 30_012),
        Err(AllocError::MixedOffers(_))
    ));
    assert!(a.offer(back[0].id).is_some() && a.offer(other[0].id).is_some());
}

#[test]
fn demand_counts_whole_tasks_in_any_outstanding_offer() {
    let mut a = alloc();
    a.add_framework(fid(1), "f1", &roles(&["r"]), false, None);
    a.add_agent(aid(1), "h1", res("cpus:2;mem:2048"), BTreeMap::new());
    assert_eq!(a.allocate(0).len(), 1, "whole agent, no demand yet");
    let demand = |cpus: f64, count| Demand {
        task: Resources::new().with("cpus", cpus).with("mem", 1024.0),
        count,
        gpu_model: None,
    };
    // The outstanding offer holds 2 tasks' worth: a demand of 2 gets nothing more.
    a.set_demand(fid(1), Some(demand(1.0, 2)));
    a.add_agent(aid(2), "h2", res("cpus:2;mem:2048"), BTreeMap::new());
    assert!(a.allocate(1).is_empty());
    // A shape that does not fit the old offer: offered at once.
    a.set_demand(fid(1), Some(demand(4.0, 1)));
    a.add_agent(aid(3), "h3", res("cpus:4;mem:1024"), BTreeMap::new());
    let o = a.allocate(2);
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].agent, aid(3));
}

#[test]
fn zero_limit_is_a_limit() {
    let mut a = alloc();
    a.set_quota(
        "r",
        None,
        Some(ResourceLimits::parse("cpus:0;mem:1024").unwrap()),
    )
    .unwrap();
    a.add_framework(fid(1), "f1", &roles(&["r"]), false, None);
    a.add_agent(aid(1), "h1", res("cpus:4;mem:4096"), BTreeMap::new());
    let o = a.allocate(0);
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].resources.unreserved, res("mem:1024"));
    let limit = a.metrics().roles["r"].quota_limit.clone().unwrap();
    assert_eq!(limit.limit("cpus"), Some(0));
    assert_eq!(limit.limit("gpus"), None);
}

#[test]
fn refused_nested_guarantee_changes_nothing() {
    let mut a = alloc();
    a.set_quota("p", Some(res("cpus:2")), None).unwrap();
    a.set_quota("p/a", Some(res("cpus:2")), None).unwrap();
    assert!(matches!(
        a.set_quota("p/b", Some(res("cpus:0.001")), None),
        Err(AllocError::InvalidQuota(_))
    ));
    assert!(matches!(
        a.set_quota("p", Some(res("cpus:1")), None),
        Err(AllocError::InvalidQuota(_))
    ));
    // A kind the parent does not guarantee is a guarantee of zero there.
    assert!(a.set_quota("p/a/x", Some(res("mem:1")), None).is_err());
    let m = a.metrics();
    assert_eq!(m.roles["p"].quota_guarantee, Some(res("cpus:2")));
    assert_eq!(
        m.roles.get("p/b").and_then(|r| r.quota_guarantee.clone()),
        None
    );
    // Removing the child's guarantee lets the parent go lower.
    a.set_quota("p/a", None, None).unwrap();
    a.set_quota("p", Some(res("cpus:1")), None).unwrap();
    // Headroom once per subtree: 1 cpu held back (the parent's), not 1 + the child's.
    a.set_quota("p/a", Some(res("cpus:1")), None).unwrap();
    a.add_framework(fid(1), "other", &roles(&["o"]), false, None);
    a.add_agent(aid(1), "h1", res("cpus:4"), BTreeMap::new());
    let o = a.allocate(0);
    assert_eq!(o[0].resources.unreserved, res("cpus:3"));
}

#[test]
fn unused_roles_are_forgotten_and_their_slots_reused() {
    let mut a = alloc();
    a.add_agent(aid(1), "h1", res("cpus:4;mem:1024"), BTreeMap::new());
    a.add_framework(fid(1), "f1", &roles(&["eng/ml", "eng/web"]), false, None);
    a.add_framework(fid(2), "f2", &roles(&["ops"]), false, None);
    a.set_weight("weighted", 2.0);
    a.set_quota("quota", Some(res("cpus:1")), None).unwrap();
    // In use: nothing is forgotten.
    for r in ["eng/ml", "eng", "ops", "weighted", "quota", "unknown"] {
        assert!(a.forget_role(r).is_empty(), "{r}");
    }
    let o = a.allocate(0).remove(0);
    a.remove_framework(fid(1));
    a.remove_framework(fid(2));
    // `ops` or `eng/*` may hold the offer; the offer died with its framework.
    assert!(a.offer(o.id).is_none());
    assert_eq!(a.forget_role("eng/ml"), vec!["eng/ml".to_string()]);
    // `eng` still has a child.
    assert!(a.forget_role("eng").is_empty());
    assert_eq!(
        a.forget_role("eng/web"),
        vec!["eng/web".to_string(), "eng".to_string()]
    );
    assert_eq!(a.forget_role("ops"), vec!["ops".to_string()]);
    let names: Vec<&str> = a.role_names().collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.contains(&"weighted") && names.contains(&"quota"));
    // Removing the quota frees its role too.
    a.set_quota("quota", None, None).unwrap();
    assert_eq!(a.forget_role("quota"), vec!["quota".to_string()]);
    assert!(!a.metrics().roles.contains_key("quota"));
    // Slots are reused: a thousand roles that come and go do not grow the table.
    let before = a.roles.len();
    for i in 0..1000 {
        let role = format!("tmp/{i}");
        a.add_framework(fid(10), "tmp", &roles(&[&role]), false, None);
        a.remove_framework(fid(10));
        assert_eq!(a.forget_role(&role).len(), 2);
    }
    assert!(
        a.roles.len() <= before + 2,
        "{} > {before} + 2",
        a.roles.len()
    );
    // And a reused slot works: a new framework in a new role gets the whole agent.
    a.add_framework(fid(11), "late", &roles(&["late/role"]), false, None);
    let offers = a.allocate(1);
    assert_eq!(offers.len(), 1);
    assert_eq!(offers[0].framework, fid(11));
    assert_eq!(offers[0].role, "late/role");
}

/// A cycle passes over agents nothing wanted fits on, and ends once every framework that wants
/// more has what it asked for: with 1,000 agents and frameworks that only declare demand, a
/// cycle walks the frameworks of the few agents that can serve them, not of every agent.
#[test]
fn a_cycle_visits_only_agents_a_wanted_task_fits_and_ends_when_nothing_is_wanted() {
    let mut a = alloc();
    let demand = |cpus: f64, count| {
        Some(Demand {
            task: Resources::new().with("cpus", cpus).with("mem", 1024.0),
            count,
            gpu_model: None,
        })
    };
    // 999 agents with memory only, then ten with cpus.
    for i in 0..999 {
        a.add_agent(aid(i), &format!("m{i}"), res("mem:4096"), BTreeMap::new());
    }
    for i in 999..1009 {
        a.add_agent(
            aid(i),
            &format!("c{i}"),
            res("cpus:4;mem:4096"),
            BTreeMap::new(),
        );
    }
    a.add_framework(fid(1), "f1", &roles(&["r"]), false, demand(1.0, 0));
    a.add_framework(fid(2), "f2", &roles(&["r"]), false, demand(1.0, 0));
    let visits = |a: &Allocator| a.metrics().agent_visits;
    assert!(a.allocate(0).is_empty(), "nothing is wanted");
    assert_eq!(
        visits(&a),
        0,
        "a cycle where nothing is wanted visits no agent"
    );

    // One task wanted: the memory-only agents are passed over, the first with cpus serves it
    // and the cycle ends there.
    a.set_demand(fid(1), demand(1.0, 1));
    let o = a.allocate(1);
    assert_eq!(o.len(), 1);
    assert_eq!((o[0].framework, o[0].agent), (fid(1), aid(999)));
    assert_eq!(visits(&a), 1);

    // Five more tasks for each: both served on the first agents with cpus, then done.
    a.set_demand(fid(1), demand(1.0, 6));
    a.set_demand(fid(2), demand(1.0, 5));
    let o = a.allocate(2);
    let tasks: usize = o
        .iter()
        .map(|r| (r.resources.total().milli("cpus") / 1000) as usize)
        .sum();
    assert_eq!(tasks, 10, "{o:?}");
    assert!(visits(&a) <= 1 + 4, "visits {}", visits(&a));

    // A framework that takes anything: every agent with something free is visited.
    let before = visits(&a);
    a.add_framework(fid(3), "f3", &roles(&["r"]), false, None);
    assert!(!a.allocate(3).is_empty());
    assert!(visits(&a) - before >= 999, "visits {}", visits(&a) - before);
}
