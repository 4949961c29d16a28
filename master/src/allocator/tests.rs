//! Unit tests of the allocator core: offers, DRF order, demand, filters and timeouts here;
//! `bookkeeping` for what is kept between cycles.

use super::*;

mod bookkeeping;
mod models;

fn res(s: &str) -> Resources {
    Resources::parse(s).unwrap()
}

fn aid(n: u128) -> AgentId {
    AgentId::from_u128(n)
}

fn fid(n: u128) -> FrameworkId {
    FrameworkId::from_u128(n)
}

fn roles(r: &[&str]) -> Vec<String> {
    r.iter().map(|s| s.to_string()).collect()
}

fn alloc() -> Allocator {
    Allocator::new(AllocatorConfig::default())
}

fn unres(s: &str) -> OfferResources {
    OfferResources::unreserved(res(s))
}

#[test]
fn whole_agent_goes_to_lowest_share_framework() {
    let mut a = alloc();
    a.add_framework(fid(1), "f1", &roles(&["r"]), false, None);
    a.add_framework(fid(2), "f2", &roles(&["r"]), false, None);
    a.add_agent(aid(1), "h1", res("cpus:4;mem:1024"), BTreeMap::new());
    a.add_agent(aid(2), "h2", res("cpus:4;mem:1024"), BTreeMap::new());
    let offers = a.allocate(0);
    assert_eq!(offers.len(), 2);
    // Tie at share 0 and 0 offers: name order, so f1 first; then f2 has the lower share.
    assert_eq!(offers[0].framework, fid(1));
    assert_eq!(offers[0].agent, aid(1));
    assert_eq!(offers[1].framework, fid(2));
    assert_eq!(offers[1].agent, aid(2));
    assert_eq!(offers[0].resources.unreserved, res("cpus:4;mem:1024"));
    assert!((a.framework_share(fid(1)) - 0.5).abs() < 1e-9);
    // Nothing left: a second cycle makes no offers.
    assert!(a.allocate(1).is_empty());
}

#[test]
fn offers_are_single_use_and_validated() {
    let mut a = alloc();
    a.add_framework(fid(1), "f1", &roles(&["r"]), false, None);
    a.add_agent(aid(1), "h1", res("cpus:4;mem:1024"), BTreeMap::new());
    let o = a.allocate(0).remove(0);
    let too_much = unres("cpus:5");
    assert!(matches!(
        a.accept(o.id, &too_much, None, 0),
        Err(AllocError::ExceedsOffer { .. })
    ));
    let unknown_kind = unres("gpus:1");
    assert!(matches!(
        a.accept(o.id, &unknown_kind, None, 0),
        Err(AllocError::ExceedsOffer { .. })
    ));
    a.accept(o.id, &unres("cpus:1;mem:100"), Some(0), 0)
        .unwrap();
    assert!(matches!(
        a.accept(o.id, &unres("cpus:1"), None, 0),
        Err(AllocError::UnknownOffer(_))
    ));
    assert!(matches!(
        a.decline(o.id, None, 0),
        Err(AllocError::UnknownOffer(_))
    ));
    assert!(a.rescind(o.id).is_none());
    assert_eq!(a.framework_allocated(fid(1)).total(), res("cpus:1;mem:100"));
    // The unused part comes back at the next cycle (no filter with refuse 0).
    let next = a.allocate(1);
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].resources.unreserved, res("cpus:3;mem:924"));
}

#[test]
fn decline_filters_agent_for_that_framework_until_expiry() {
    let mut a = alloc();
    a.add_framework(fid(1), "f1", &roles(&["r"]), false, None);
    a.add_agent(aid(1), "h1", res("cpus:4;mem:1024"), BTreeMap::new());
    let o = a.allocate(0).remove(0);
    a.decline(o.id, Some(1000), 10).unwrap();
    assert!(a.allocate(500).is_empty());
    assert_eq!(a.metrics().active_filters, 1);
    assert!(a.allocate(1009).is_empty());
    let again = a.allocate(1010);
    assert_eq!(again.len(), 1);
    assert_eq!(a.metrics().active_filters, 0);
    assert_eq!(a.metrics().offers_declined, 1);
}

#[test]
fn filtered_agent_goes_to_next_framework() {
    let mut a = alloc();
    a.add_framework(fid(1), "f1", &roles(&["r"]), false, None);
    a.add_framework(fid(2), "f2", &roles(&["r"]), false, None);
    a.add_agent(aid(1), "h1", res("cpus:4"), BTreeMap::new());
    let o = a.allocate(0).remove(0);
    assert_eq!(o.framework, fid(1));
    a.decline(o.id, None, 0).unwrap();
    let o2 = a.allocate(1).remove(0);
    assert_eq!(o2.framework, fid(2));
}

#[test]
fn filter_does_not_block_resources_that_were_not_refused() {
    let mut a = alloc();
    a.add_framework(fid(1), "f1", &roles(&["r"]), false, None);
    a.add_agent(aid(1), "h1", res("cpus:4;mem:1000"), BTreeMap::new());
    let o = a.allocate(0).remove(0);
    // Use 2 cpus, refuse the rest (2 cpus, 1000 mem) for a long time.
    a.accept(o.id, &unres("cpus:2"), Some(1_000_000), 0)
        .unwrap();
    assert!(a.allocate(1).is_empty());
    // Tasks end: the offer would now contain more than was refused.
    a.recover(fid(1), aid(1), &unres("cpus:2"));
    let o = a.allocate(2);
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].resources.unreserved, res("cpus:4;mem:1000"));
}

#[test]
fn drf_prefers_lower_dominant_share_across_kinds() {
    let mut a = alloc();
    a.add_agent(aid(1), "h1", res("cpus:10;mem:100"), BTreeMap::new());
    a.add_framework(fid(1), "cpu-heavy", &roles(&["a"]), false, None);
    a.add_framework(fid(2), "mem-heavy", &roles(&["b"]), false, None);
    let first = a.allocate(0);
    assert_eq!(first.len(), 1);
    // cpu-heavy uses 6 cpus (share 0.6); mem-heavy nothing yet.
    let o = &first[0];
    let f_first = o.framework;
    a.accept(o.id, &unres("cpus:6;mem:10"), Some(0), 0).unwrap();
    a.add_agent(aid(2), "h2", res("cpus:10;mem:100"), BTreeMap::new());
    let next = a.allocate(1);
    // Both agents offered; the lower-share framework gets the first agent in order.
    assert_eq!(next.len(), 2);
    assert_ne!(next[0].framework, f_first);
}

#[test]
fn ports_are_offered_and_accounted_but_never_dominate_a_share() {
    let mut a = alloc();
    a.add_framework(fid(1), "f1", &roles(&["r"]), false, None);
    a.add_agent(
        aid(1),
        "h1",
        res("cpus:10;mem:1000;ports:3"),
        BTreeMap::new(),
    );
    let o = a.allocate(0).remove(0);
    assert_eq!(o.resources.unreserved.get("ports"), 3.0, "offered");
    // More ports than offered: refused like any scalar.
    assert!(matches!(
        a.accept(o.id, &unres("cpus:1;ports:4"), None, 0),
        Err(AllocError::ExceedsOffer { .. })
    ));
    // The offer stays outstanding after a refused accept.
    a.accept(o.id, &unres("cpus:1;mem:10;ports:2"), Some(0), 1)
        .unwrap();
    // Two of three ports held, one cpu of ten: the share is the cpus' 0.1, not 2/3.
    assert!((a.framework_share(fid(1)) - 0.1).abs() < 1e-9);
    let o = a.allocate(2).remove(0);
    assert_eq!(o.resources.unreserved.get("ports"), 1.0, "accounted");
}

#[test]
fn tie_break_by_offer_count_then_name() {
    let mut a = alloc();
    a.add_framework(fid(2), "b", &roles(&["r"]), false, None);
    a.add_framework(fid(1), "a", &roles(&["r"]), false, None);
    a.add_agent(aid(1), "h1", res("cpus:1"), BTreeMap::new());
    let o = a.allocate(0).remove(0);
    assert_eq!(o.framework, fid(1), "name order among equals");
    a.accept(o.id, &OfferResources::default(), Some(0), 0)
        .unwrap();
    // Both have share 0 again, but "a" has one offer made: "b" goes first.
    let o = a.allocate(1).remove(0);
    assert_eq!(o.framework, fid(2));
}

#[test]
fn demand_aware_drf_paper_example() {
    let mut a = alloc();
    a.add_framework(
        fid(1),
        "alice",
        &roles(&["a"]),
        false,
        Some(Demand {
            task: res("cpus:1;mem:4096"),
            count: 100,
            gpu_model: None,
        }),
    );
    a.add_framework(
        fid(2),
        "bob",
        &roles(&["b"]),
        false,
        Some(Demand {
            task: res("cpus:3;mem:1024"),
            count: 100,
            gpu_model: None,
        }),
    );
    a.add_agent(aid(1), "host1", res("cpus:9;mem:18432"), BTreeMap::new());
    let offers = a.allocate(10);
    assert_eq!(offers.len(), 2);
    let alice = offers.iter().find(|o| o.framework == fid(1)).unwrap();
    let bob = offers.iter().find(|o| o.framework == fid(2)).unwrap();
    assert_eq!(alice.resources.unreserved, res("cpus:3;mem:12288"));
    assert_eq!(bob.resources.unreserved, res("cpus:6;mem:2048"));
    assert!((a.framework_share(fid(1)) - 2.0 / 3.0).abs() < 1e-9);
    assert!((a.framework_share(fid(2)) - 2.0 / 3.0).abs() < 1e-9);
    assert!((a.role_share("a") - 2.0 / 3.0).abs() < 1e-9);
}

#[test]
fn demand_count_limits_offers_and_shrinks_on_accept() {
    let mut a = alloc();
    a.add_framework(
        fid(1),
        "f",
        &roles(&["r"]),
        false,
        Some(Demand {
            task: res("cpus:1"),
            count: 2,
            gpu_model: None,
        }),
    );
    a.add_agent(aid(1), "h1", res("cpus:8"), BTreeMap::new());
    let o = a.allocate(0).remove(0);
    assert_eq!(o.resources.unreserved, res("cpus:2"));
    a.accept(o.id, &unres("cpus:2"), None, 0).unwrap();
    // Both tasks accepted: demand is now 0, no more offers.
    assert!(a.allocate(10_000).is_empty());
    a.set_demand(
        fid(1),
        Some(Demand {
            task: res("cpus:1"),
            count: 3,
            gpu_model: None,
        }),
    );
    let o = a.allocate(10_001).remove(0);
    assert_eq!(o.resources.unreserved, res("cpus:3"));
}

#[test]
fn several_demand_shapes_are_all_offered_and_counted_apart() {
    let mut a = alloc();
    a.add_framework(fid(1), "sweep", &roles(&["r"]), true, None);
    // Three one-GPU trials and one two-GPU gang member, declared together.
    a.set_demands(
        fid(1),
        vec![
            Demand {
                task: res("cpus:1;gpus:1"),
                count: 3,
                gpu_model: None,
            },
            Demand {
                task: res("cpus:2;gpus:2"),
                count: 1,
                gpu_model: Some("H100".into()),
            },
        ],
    );
    // The views keep each shape's GPU model (GET /api/v1/demand reads it).
    let models: Vec<Option<String>> = a.demands(fid(1)).into_iter().map(|d| d.gpu_model).collect();
    assert_eq!(models, [None, Some("H100".to_string())]);
    a.add_agent(aid(1), "h1", res("cpus:16;gpus:8"), BTreeMap::new());
    a.set_agent_gpu_models(aid(1), &["NVIDIA H100 80GB HBM3".to_string()]);
    let o = a.allocate(0).remove(0);
    // Every shape's tasks' worth, nothing more: 3 x (1, 1) + 1 x (2, 2).
    assert_eq!(o.resources.unreserved, res("cpus:5;gpus:5"));
    assert!(a.allocate(1).is_empty(), "all demand is in the offer");
    // Two trials and the gang member launched: one trial is still wanted.
    a.accept(o.id, &unres("cpus:4;gpus:4"), None, 2).unwrap();
    let left = a.demands(fid(1));
    assert_eq!(
        left.iter().map(|d| d.count).collect::<Vec<_>>(),
        vec![1, 0],
        "{left:?}"
    );
    let o = a.allocate(10_000).remove(0);
    assert_eq!(o.resources.unreserved, res("cpus:1;gpus:1"));
    // The first shape alone is what `demand` reports.
    assert_eq!(a.demand(fid(1)).map(|d| d.count), Some(1));
    // Declining returns the worth: offered again after the filter.
    a.decline(o.id, Some(0), 10_001).unwrap();
    assert_eq!(
        a.allocate(10_002).remove(0).resources.unreserved,
        res("cpus:1;gpus:1")
    );
}

#[test]
fn gpu_agents_only_go_to_gpu_frameworks() {
    let mut a = alloc();
    a.add_framework(fid(1), "plain", &roles(&["r"]), false, None);
    a.add_agent(aid(1), "gpu-host", res("cpus:4;gpus:2"), BTreeMap::new());
    assert!(a.allocate(0).is_empty());
    a.add_framework(fid(2), "gpu", &roles(&["r"]), true, None);
    let o = a.allocate(1);
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].framework, fid(2));

    let mut b = Allocator::new(AllocatorConfig {
        filter_gpu_resources: false,
        ..Default::default()
    });
    b.add_framework(fid(1), "plain", &roles(&["r"]), false, None);
    b.add_agent(aid(1), "gpu-host", res("cpus:4;gpus:2"), BTreeMap::new());
    assert_eq!(b.allocate(0).len(), 1);
}

#[test]
fn min_allocatable_keeps_unusable_remnants_from_a_framework() {
    let mut a = alloc();
    a.add_framework(fid(1), "a-gpu", &roles(&["r"]), true, None);
    a.add_framework(fid(2), "b-any", &roles(&["r"]), true, None);
    a.set_min_allocatable(fid(1), &[res("cpus:1;gpus:1"), res("mem:4096")]);
    a.add_agent(
        aid(1),
        "gpu-host",
        res("cpus:8;mem:1024;gpus:2"),
        BTreeMap::new(),
    );
    let o = a.allocate(0);
    assert_eq!(o.len(), 1);
    assert_eq!(
        o[0].framework,
        fid(1),
        "a-gpu sorts first and the agent holds cpus:1;gpus:1"
    );
    // a-gpu takes both GPUs; what is left (cpus and memory, no GPU, under 4 GiB) holds none
    // of its quantities: only b-any is offered it, although a-gpu has no filter.
    a.accept(o[0].id, &unres("cpus:2;gpus:2"), Some(0), 0)
        .unwrap();
    let o = a.allocate(1);
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].framework, fid(2));
    assert_eq!(o[0].resources.unreserved, res("cpus:6;mem:1024"));
    // b-any declines it for a minute: nobody is offered it, although a-gpu has no filter.
    a.decline(o[0].id, Some(60_000), 1).unwrap();
    assert!(a.allocate(2).is_empty());
    // Cleared: a-gpu is offered the remnant.
    a.set_min_allocatable(fid(1), &[]);
    let o = a.allocate(3);
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].framework, fid(1));
    // A quantity naming a resource no agent has is never held ...
    a.rescind(o[0].id);
    a.set_min_allocatable(fid(1), &[res("fpgas:1")]);
    assert!(a.allocate(4).is_empty());
    // ... until an agent with that resource registers.
    a.suppress(fid(2), None);
    a.add_agent(aid(2), "fpga-host", res("cpus:4;fpgas:1"), BTreeMap::new());
    let o = a.allocate(5);
    assert_eq!(o.len(), 1);
    assert_eq!((o[0].framework, o[0].agent), (fid(1), aid(2)));
}

#[test]
fn suppress_and_revive() {
    let mut a = alloc();
    a.add_framework(fid(1), "f", &roles(&["r"]), false, None);
    a.suppress(fid(1), None);
    a.add_agent(aid(1), "h1", res("cpus:4"), BTreeMap::new());
    assert!(a.allocate(0).is_empty());
    a.revive(fid(1), None);
    let o = a.allocate(1).remove(0);
    a.decline(o.id, Some(1_000_000), 1).unwrap();
    assert!(a.allocate(2).is_empty());
    // Revive clears filters.
    a.revive(fid(1), Some("r"));
    assert_eq!(a.allocate(3).len(), 1);
}

#[test]
fn a_paused_framework_is_skipped_and_keeps_its_filters_and_suppression() {
    let mut a = alloc();
    a.add_framework(fid(1), "f1", &roles(&["r"]), false, None);
    a.add_framework(fid(2), "f2", &roles(&["r"]), false, None);
    a.add_agent(aid(1), "h1", res("cpus:4"), BTreeMap::new());
    a.add_agent(aid(2), "h2", res("cpus:4"), BTreeMap::new());
    // f1 would get h1 (name order at share 0): paused, f2 gets both.
    a.set_paused(fid(1), true);
    assert!(a.paused(fid(1)));
    let o = a.allocate(0);
    assert_eq!(o.len(), 2);
    assert!(o.iter().all(|o| o.framework == fid(2)));
    // Resumed: f1 is offered again.
    for x in &o {
        a.decline(x.id, Some(0), 0).unwrap();
    }
    a.set_paused(fid(1), false);
    assert!(!a.paused(fid(1)));
    a.add_agent(aid(3), "h3", res("cpus:4"), BTreeMap::new());
    let o = a.allocate(1);
    assert!(o.iter().any(|o| o.framework == fid(1)));
    // Suppressed while paused: resuming does not revive it.
    a.set_paused(fid(2), true);
    a.suppress(fid(2), None);
    a.set_paused(fid(2), false);
    for x in a.allocate(2) {
        assert_ne!(x.framework, fid(2));
    }
    a.revive(fid(2), None);
    a.set_paused(fid(1), true);
    a.add_agent(aid(4), "h4", res("cpus:4"), BTreeMap::new());
    let o = a.allocate(3);
    assert!(!o.is_empty());
    assert!(o.iter().all(|o| o.framework == fid(2)));
}

#[test]
fn remove_agent_rescinds_and_remove_framework_frees() {
    let mut a = alloc();
    a.add_framework(fid(1), "f", &roles(&["r"]), false, None);
    a.add_agent(aid(1), "h1", res("cpus:4"), BTreeMap::new());
    a.add_agent(aid(2), "h2", res("cpus:4"), BTreeMap::new());
    let offers = a.allocate(0);
    assert_eq!(offers.len(), 2);
    a.accept(offers[1].id, &unres("cpus:1"), Some(0), 0)
        .unwrap();
    let gone = a.remove_agent(aid(1));
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].id, offers[0].id);
    assert!(a.offer(offers[0].id).is_none());
    assert_eq!(a.framework_allocated(fid(1)).total(), res("cpus:1"));
    let dropped = a.remove_framework(fid(1));
    assert!(dropped.is_empty());
    a.add_framework(fid(2), "g", &roles(&["r"]), false, None);
    let o = a.allocate(1);
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].resources.unreserved, res("cpus:4"));
    assert_eq!(a.cluster_total(), res("cpus:4"));
}

#[test]
fn update_agent_rescinds_offers_that_no_longer_fit() {
    let mut a = alloc();
    a.add_framework(fid(1), "f", &roles(&["r"]), true, None);
    a.add_agent(aid(1), "h1", res("cpus:4;gpus:2"), BTreeMap::new());
    let o = a.allocate(0).remove(0);
    let gone = a.update_agent(aid(1), res("cpus:4;gpus:1"), BTreeMap::new());
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].id, o.id);
    let o = a.allocate(1).remove(0);
    assert_eq!(o.resources.unreserved, res("cpus:4;gpus:1"));
}

#[test]
fn offer_ids_are_deterministic_and_seeded() {
    let mut a = Allocator::new(AllocatorConfig {
        offer_id_seed: 7,
        ..Default::default()
    });
    a.add_framework(fid(1), "f", &roles(&["r"]), false, None);
    a.add_agent(aid(1), "h1", res("cpus:4"), BTreeMap::new());
    let o = a.allocate(0).remove(0);
    assert_eq!(o.id, OfferId::from_u128((7u128 << 64) | (1 << 24)));
    // Ids sort by age even when slots are reused.
    a.rescind(o.id).unwrap();
    let o2 = a.allocate(1).remove(0);
    assert!(o2.id > o.id);
    assert!(a.offer(o.id).is_none());
    assert!(a.offer(o2.id).is_some());
    assert!(
        a.offer(OfferId::from_u128(o2.id.0.as_u128() & u64::MAX as u128))
            .is_none(),
        "other seed"
    );
}

#[test]
fn offer_timeout_rescinds_old_offers() {
    let mut a = Allocator::new(AllocatorConfig {
        offer_timeout_ms: Some(100),
        ..Default::default()
    });
    a.add_framework(fid(1), "f", &roles(&["r"]), false, None);
    a.add_agent(aid(1), "h1", res("cpus:4"), BTreeMap::new());
    let o = a.allocate(0).remove(0);
    assert_eq!(a.next_offer_expiry(), Some(100));
    assert!(a.expire_offers(99).is_empty());
    let gone = a.expire_offers(100);
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].id, o.id);
    assert_eq!(a.metrics().offers_expired, 1);
    // No filter after a timeout.
    assert_eq!(a.allocate(101).len(), 1);
}

#[test]
fn an_expired_offer_is_filtered_like_a_decline_when_configured() {
    let mut a = Allocator::new(AllocatorConfig {
        offer_timeout_ms: Some(100),
        filter_expired_offers: true,
        ..Default::default()
    });
    let refuse = a.config().default_refuse_ms;
    a.add_framework(fid(1), "hoarder", &roles(&["r"]), false, None);
    a.add_agent(aid(1), "h1", res("cpus:4"), BTreeMap::new());
    let o = a.allocate(0).remove(0);
    assert_eq!(o.framework, fid(1));
    a.add_framework(fid(2), "honest", &roles(&["r"]), false, None);
    // Held by the hoarder: nothing for the other framework.
    assert!(a.allocate(50).is_empty());
    assert_eq!(a.expire_offers(100).len(), 1);
    // The agent goes to the other framework, not back to the one that let it expire...
    let next = a.allocate(101);
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].framework, fid(2));
    a.decline(next[0].id, Some(0), 102).unwrap();
    // ...which is filtered on that agent for the default refuse time, as after a decline.
    a.remove_framework(fid(2));
    assert!(a.allocate(103).is_empty());
    assert!(a.allocate(100 + refuse - 1).is_empty());
    let back = a.allocate(100 + refuse);
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].framework, fid(1));
}

#[test]
fn unknown_ids_are_harmless() {
    let mut a = alloc();
    assert!(a.remove_agent(aid(9)).is_empty());
    assert!(a.remove_framework(fid(9)).is_empty());
    assert!(a
        .update_agent(aid(9), res("cpus:1"), BTreeMap::new())
        .is_empty());
    a.recover(fid(9), aid(9), &unres("cpus:1"));
    a.suppress(fid(9), None);
    a.revive(fid(9), None);
    a.set_demand(fid(9), None);
    assert_eq!(a.framework_share(fid(9)), 0.0);
    assert_eq!(a.role_share("nope"), 0.0);
    assert!(a.allocate(0).is_empty());
}

#[test]
fn many_filters_on_one_agent() {
    // More frameworks than the threshold at which an agent's filters switch to bitsets.
    let mut a = alloc();
    let n = 70u128;
    for i in 1..=n {
        a.add_framework(fid(i), &format!("f{i:03}"), &roles(&["r"]), false, None);
    }
    a.add_agent(aid(1), "h1", res("cpus:4;mem:100"), BTreeMap::new());
    let mut seen = std::collections::BTreeSet::new();
    for t in 0..n as u64 {
        let o = a.allocate(t).remove(0);
        assert!(seen.insert(o.framework), "each framework once");
        a.decline(o.id, Some(1_000_000), t).unwrap();
    }
    assert!(a.allocate(100).is_empty(), "everyone filtered");
    assert_eq!(a.metrics().active_filters, n as usize);
    // Revive clears one framework's filter.
    a.revive(fid(42), None);
    let o = a.allocate(101).remove(0);
    assert_eq!(o.framework, fid(42));
    a.decline(o.id, Some(1_000_000), 101).unwrap();
    // The agent grows: offers would now contain resources nobody refused.
    let gone = a.update_agent(aid(1), res("cpus:8;mem:100"), BTreeMap::new());
    assert!(gone.is_empty());
    let o = a.allocate(102);
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].resources.unreserved, res("cpus:8;mem:100"));
    // Filters expire.
    a.rescind(o[0].id).unwrap();
    a.update_agent(aid(1), res("cpus:4;mem:100"), BTreeMap::new());
    let before = a.metrics().active_filters;
    assert!(before >= n as usize - 1);
    assert_eq!(a.allocate(2_000_000).len(), 1);
    assert_eq!(a.metrics().active_filters, 0);
    // Removing the agent forgets everything about it.
    a.remove_agent(aid(1));
    a.add_agent(aid(2), "h2", res("cpus:1"), BTreeMap::new());
    assert_eq!(a.allocate(2_000_001).len(), 1);
}
