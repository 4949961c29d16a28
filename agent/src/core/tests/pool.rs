//! The pool of prepared task cgroups at the core level (`core::pool`).

use super::*;

/// With a pool: cgroups are prepared ahead, a task takes one (recorded before its launch), and
/// after the task ended its empty cgroup goes back to the pool once its terminal update is out.
#[test]
fn pooled_cgroups_are_prepared_taken_and_returned() {
    let mut cfg = config(0);
    cfg.cgroup_pool = crate::core::pool::PoolConfig {
        low: 1,
        high: 2,
        prefix: "pool-t-1-".into(),
    };
    let mut c = AgentCore::new(cfg, Checkpoint::default(), T0, Instant::now());
    let prepared = |fx: &[Effect]| {
        fx.iter()
            .find_map(|e| match e {
                Effect::PrepareCgroups(n) => Some(n.clone()),
                _ => None,
            })
            .unwrap_or_default()
    };
    let plan_of = |fx: &[Effect]| {
        fx.iter()
            .find_map(|e| match e {
                Effect::Launch(p) => Some(p.cgroup_name.clone()),
                _ => None,
            })
            .unwrap()
    };
    // The first flush asks for LOW cgroups to be made.
    let fx = c.flush(T0);
    assert_eq!(prepared(&fx), vec!["pool-t-1-0"]);
    c.handle(
        Input::CgroupsPrepared {
            asked: 1,
            ready: vec!["pool-t-1-0".into()],
        },
        T0,
    );
    register(&mut c);
    let fw = FrameworkId::random();
    let t1 = task("");
    let id1 = t1.task_id;
    let fx = step(&mut c, run_task(fw, t1), T0);
    assert_eq!(plan_of(&fx), "pool-t-1-0");
    assert_eq!(
        c.checkpoint().tasks[&id1].cgroup.as_deref(),
        Some("pool-t-1-0"),
        "the cgroup is recorded with the task before the launch"
    );
    // Under LOW: one more is made.
    assert_eq!(prepared(&fx), vec!["pool-t-1-1"]);
    step(
        &mut c,
        Input::Launched {
            task: id1,
            result: Ok(launched(100)),
        },
        T0 + 1,
    );
    let fx = step(
        &mut c,
        Input::Exited {
            task: id1,
            status: exit(0),
            outcome: None,
        },
        T0 + 2,
    );
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Settle { recycle: true, cgroup: Some(n), .. } if n == "pool-t-1-0")),
        "{fx:?}"
    );
    let fx = step(
        &mut c,
        Input::Settled {
            task: id1,
            status: exit(0),
            outcome: CgroupOutcome::default(),
        },
        T0 + 3,
    );
    assert_eq!(updates(&fx)[0].state, TaskState::Finished);
    c.handle(Input::CgroupRecycled(Some("pool-t-1-0".into())), T0 + 4);
    c.handle(
        Input::CgroupsPrepared {
            asked: 1,
            ready: vec!["pool-t-1-1".into()],
        },
        T0 + 4,
    );
    // The one back last is taken first.
    let t2 = task("");
    let id2 = t2.task_id;
    let fx = step(&mut c, run_task(fw, t2), T0 + 5);
    assert_eq!(plan_of(&fx), "pool-t-1-0");
    let t3 = task("");
    let id3 = t3.task_id;
    let fx = step(&mut c, run_task(fw, t3), T0 + 6);
    assert_eq!(plan_of(&fx), "pool-t-1-1");
    assert_eq!(prepared(&fx), vec!["pool-t-1-2"]);
    let mut recycled = Vec::new();
    for (i, id) in [id2, id3].into_iter().enumerate() {
        let now = T0 + 7 + 2 * i as u64;
        step(
            &mut c,
            Input::Launched {
                task: id,
                result: Ok(launched(101 + i as i32)),
            },
            now,
        );
        let fx = step(
            &mut c,
            Input::Exited {
                task: id,
                status: exit(0),
                outcome: None,
            },
            now + 1,
        );
        recycled.extend(fx.iter().filter_map(|e| match e {
            Effect::Settle { recycle, .. } => Some(*recycle),
            _ => None,
        }));
    }
    // One made and one coming back reach HIGH: the second is removed, not pooled.
    assert_eq!(recycled, vec![true, false]);
    assert!(c.drain_pool().is_empty());
}
