//! GPU models in declared demand (`allocator::models`): matching, the model-first order and
//! the reclaim of idle offers.

use super::*;

fn gpu_agent(a: &mut Allocator, n: u128, model: &str) {
    a.add_agent(
        aid(n),
        &format!("h{n}"),
        res("cpus:8;mem:8192;gpus:4"),
        BTreeMap::new(),
    );
    a.set_agent_gpu_models(aid(n), &vec![format!("NVIDIA {model}"); 4]);
}

fn model_demand(task: &str, count: u32, model: &str) -> Demand {
    Demand {
        task: res(task),
        count,
        gpu_model: Some(model.into()),
    }
}

#[test]
fn a_shape_naming_a_model_is_offered_only_on_agents_of_it() {
    let mut a = alloc();
    gpu_agent(&mut a, 1, "A100-SXM4-40GB");
    gpu_agent(&mut a, 2, "H100 80GB HBM3");
    a.add_framework(fid(1), "f", &roles(&["r"]), true, None);
    a.set_demands(fid(1), vec![model_demand("cpus:1;gpus:1", 2, "h100")]);
    let offers = a.allocate(0);
    assert_eq!(offers.len(), 1);
    assert_eq!(offers[0].agent, aid(2));
    assert_eq!(offers[0].resources.unreserved, res("cpus:2;gpus:2"));
    // Several models with `|`: any of them.
    a.rescind(offers[0].id);
    a.set_demands(fid(1), vec![model_demand("cpus:1;gpus:1", 8, "B200|a100")]);
    let offers = a.allocate(1);
    assert_eq!(offers.len(), 1);
    assert_eq!(offers[0].agent, aid(1));
    a.rescind(offers[0].id);
    // A model no agent has: nothing.
    a.set_demands(fid(1), vec![model_demand("cpus:1;gpus:1", 1, "B200")]);
    assert!(a.allocate(2).is_empty());
    // An agent of that model registers later: the declared shape learns it.
    gpu_agent(&mut a, 3, "B200");
    let offers = a.allocate(3);
    assert_eq!((offers.len(), offers[0].agent), (1, aid(3)));
}

#[test]
fn a_model_constrained_task_comes_first_on_its_agents() {
    let mut a = alloc();
    gpu_agent(&mut a, 1, "H100");
    // f1 takes whole agents and is first in the fair order (same share, name order).
    a.add_framework(fid(1), "f1", &roles(&["a"]), true, None);
    a.add_framework(fid(2), "f2", &roles(&["b"]), true, None);
    a.set_demands(fid(2), vec![model_demand("cpus:2;gpus:1", 1, "H100")]);
    let offers = a.allocate(0);
    assert_eq!(offers.len(), 2, "{offers:?}");
    let of = |f: u128| offers.iter().find(|o| o.framework == fid(f)).unwrap();
    assert_eq!(of(2).resources.unreserved, res("cpus:2;gpus:1"));
    assert_eq!(of(1).resources.unreserved, res("cpus:6;mem:8192;gpus:3"));
}

#[test]
fn idle_offers_on_a_wanted_model_are_reclaimed_for_it() {
    let mut a = alloc();
    gpu_agent(&mut a, 1, "T4");
    gpu_agent(&mut a, 2, "V100-SXM2-16GB");
    gpu_agent(&mut a, 3, "V100-SXM2-32GB");
    // f1 holds every agent (nobody else was there).
    a.add_framework(fid(1), "f1", &roles(&["a"]), true, None);
    let held = a.allocate(0);
    assert_eq!(held.len(), 3);
    // f2 arrives wanting one task on a V100 (either kind): nothing is free, so one of f1's
    // idle V100 offers is rescinded (the first best fit), none on the T4.
    a.add_framework(fid(2), "f2", &roles(&["b"]), true, None);
    a.set_demands(
        fid(2),
        vec![model_demand(
            "cpus:2;gpus:1",
            1,
            "v100-sxm2-16gb|V100-SXM2-32GB",
        )],
    );
    let taken = a.reclaim_for_models(0);
    assert_eq!(taken.len(), 1);
    assert_eq!((taken[0].framework, taken[0].agent), (fid(1), aid(2)));
    // The cycle offers that agent to f2 first (its task's worth), the rest back to f1.
    let offers = a.allocate(1);
    let to2: Vec<_> = offers.iter().filter(|o| o.framework == fid(2)).collect();
    assert_eq!(to2.len(), 1);
    assert_eq!(
        (to2[0].agent, &to2[0].resources.unreserved),
        (aid(2), &res("cpus:2;gpus:1"))
    );
    // Covered: nothing more is reclaimed.
    assert!(a.reclaim_for_models(0).is_empty());
    // f2 wants one more: the best fit is what f1 was offered back of agent 2 (3 GPUs).
    a.set_demands(fid(2), vec![model_demand("cpus:2;gpus:1", 2, "V100")]);
    let taken = a.reclaim_for_models(0);
    assert_eq!(taken.len(), 1);
    assert_eq!((taken[0].framework, taken[0].agent), (fid(1), aid(2)));
    // A framework wanting that model itself keeps its offers there.
    a.set_demands(fid(1), vec![model_demand("cpus:1;gpus:1", 100, "V100")]);
    a.set_demands(fid(2), vec![model_demand("cpus:2;gpus:1", 3, "V100")]);
    assert!(a.reclaim_for_models(0).is_empty());
    a.set_demands(fid(1), vec![]);
    // Only offers are reclaimed: accepted resources stay where they run.
    let offers = a.allocate(2);
    let mine = offers.iter().find(|o| o.framework == fid(2)).unwrap();
    a.accept(mine.id, &unres("cpus:2;gpus:1"), None, 2).unwrap();
    assert_eq!(mine.agent, aid(2));
    a.set_demands(
        fid(2),
        vec![model_demand("cpus:2;gpus:4", 1, "V100-SXM2-16GB")],
    );
    assert!(
        a.reclaim_for_models(0).is_empty(),
        "a task runs on one of its 4 GPUs"
    );
    // On the 32 GB V100 all 4 are idle in f1's offer.
    a.set_demands(
        fid(2),
        vec![model_demand("cpus:2;gpus:4", 1, "V100-SXM2-32GB")],
    );
    let taken = a.reclaim_for_models(0);
    assert_eq!((taken.len(), taken[0].agent), (1, aid(3)));
}

#[test]
fn nothing_is_reclaimed_for_a_framework_that_could_not_be_given_the_agent() {
    let mut a = alloc();
    gpu_agent(&mut a, 1, "H100");
    // f2 was offered the agent first and declined it for a minute.
    a.add_framework(fid(2), "f2", &roles(&["b"]), true, None);
    let o = a.allocate(0).remove(0);
    a.decline(o.id, Some(60_000), 0).unwrap();
    a.add_framework(fid(1), "f1", &roles(&["a"]), true, None);
    assert_eq!(a.allocate(1).len(), 1, "f1 holds the agent");
    // Its demand takes nothing from f1 while its filter stands (f1 would get it back each
    // cycle)...
    a.set_demands(fid(2), vec![model_demand("cpus:1;gpus:1", 1, "H100")]);
    assert!(a.reclaim_for_models(2).is_empty());
    // ...nor while its role is at its GPU limit...
    a.set_quota("b", None, Some(ResourceLimits::parse("gpus:0").unwrap()))
        .unwrap();
    assert!(a.reclaim_for_models(60_001).is_empty());
    // ...and once both are gone, it does.
    a.set_quota("b", None, None).unwrap();
    assert_eq!(a.reclaim_for_models(60_001).len(), 1);
}
