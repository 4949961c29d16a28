//! The `batch` example's scheduler, unit-tested with the test kit's scripted master
//! (`gantry-sdk-testkit`): its demand, its launches, a task the cluster lost launched again, a
//! master failover (re-subscription, reconciliation) and the teardown when every copy ended.

use gantry_examples::batch::{Batch, BatchSpec};
use gantry_sdk::protocol::*;
use gantry_sdk_testkit::{Session, TestMaster};

fn spec(count: u32) -> BatchSpec {
    BatchSpec {
        name: "b".into(),
        command: CommandInfo::shell("true"),
        count,
        task: "cpus:1;mem:64".parse().unwrap_or_default(),
        env: Default::default(),
        verbose: false,
        gpu_selector: None,
    }
}

/// The next demand the scheduler declares: how many copies it still wants.
async fn demand(session: &mut Session) -> anyhow::Result<u32> {
    Ok(session
        .expect("a demand", |m| match m {
            FrameworkToMaster::SetDemand { demands } => demands.first().map(|d| d.count),
            _ => None,
        })
        .await?)
}

#[tokio::test]
async fn batch_relaunches_what_the_cluster_lost_survives_a_failover_and_tears_down_when_done(
) -> anyhow::Result<()> {
    let mut master = TestMaster::new("batch")?;
    let (batch, progress) = Batch::new(spec(3));
    let running = master.start(batch);
    let mut s = master.accept().await?;
    assert_eq!(demand(&mut s).await?, 3);

    // Two copies fit the first offer.
    let offer = s.offer("a1", "cpus:2;mem:1024")?;
    s.offers(vec![offer.clone()]).await?;
    let (ids, first) = s.expect_launch().await?;
    assert_eq!((ids, first.len()), (vec![offer.id], 2));
    assert_eq!(demand(&mut s).await?, 1);
    for t in &first {
        let update = s.status(t.task_id, TaskState::Running);
        s.update(update.clone()).await?;
        assert_eq!(s.expect_ack().await?, update.update_id);
    }
    // The cluster loses one: it is owed again.
    s.update(s.status(first[0].task_id, TaskState::Lost))
        .await?;
    assert_eq!(demand(&mut s).await?, 2);
    assert_eq!(progress.borrow().relaunched, 1);

    // The master fails over: the batch re-subscribes, declares what it still wants and asks
    // what happened to its tasks meanwhile.
    s.failover();
    let mut s = master.accept().await?;
    assert_eq!(s.subscription().framework_id, Some(master.framework_id()));
    assert_eq!(demand(&mut s).await?, 2);
    s.expect("a reconciliation", |m| {
        matches!(m, FrameworkToMaster::Reconcile { .. }).then_some(())
    })
    .await?;

    // The two copies owed go out on the next offer, and the batch suppresses its offers.
    let offer = s.offer("a2", "cpus:8;mem:1024")?;
    s.offers(vec![offer]).await?;
    let (_, second) = s.expect_launch().await?;
    assert_eq!(second.len(), 2);
    s.expect("a suppress", |m| {
        matches!(m, FrameworkToMaster::Suppress { .. }).then_some(())
    })
    .await?;

    // Every copy ends: one fails by itself (not relaunched), the rest finish; then teardown.
    s.update(s.status(first[1].task_id, TaskState::Failed))
        .await?;
    for t in &second {
        s.update(s.status(t.task_id, TaskState::Finished)).await?;
    }
    s.expect("the teardown", |m| {
        matches!(m, FrameworkToMaster::Teardown).then_some(())
    })
    .await?;
    running.finished().await?;
    let p = progress.borrow().clone();
    assert!(p.done, "{p:?}");
    assert_eq!((p.finished, p.failed, p.relaunched), (2, 1, 1), "{p:?}");
    assert!(
        !s.received()
            .iter()
            .any(|m| matches!(m, FrameworkToMaster::Kill { .. })),
        "nothing killed"
    );
    Ok(())
}
