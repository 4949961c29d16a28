//! The test kit against the real driver: every kind of master message reaches the scheduler,
//! what the scheduler sends reaches the script, and a failover re-subscribes the driver with
//! its framework id and a kill still unanswered.

use gantry_sdk::protocol::*;
use gantry_sdk::{DriverHandle, Scheduler};
use gantry_sdk_testkit::TestMaster;

/// Launches one task on the first offer and declines the rest; kills a task once it runs;
/// records every callback.
#[derive(Default)]
struct Recorder {
    events: Vec<String>,
    launched: bool,
}

impl Scheduler for Recorder {
    async fn registered(&mut self, _: &DriverHandle, _: FrameworkId) {
        self.events.push("registered".into());
    }

    async fn offers(&mut self, driver: &DriverHandle, offers: Vec<Offer>) {
        for offer in offers {
            if self.launched {
                driver.decline(vec![offer.id], Some(5.0));
            } else {
                self.launched = true;
                let task = TaskInfo::new("t", "sleep 60", "cpus:1;mem:64".parse().unwrap());
                driver.launch(offer.id, vec![task]);
            }
        }
    }

    async fn offer_rescinded(&mut self, _: &DriverHandle, offer_id: OfferId) {
        self.events.push(format!("rescinded {offer_id}"));
    }

    async fn status_update(&mut self, driver: &DriverHandle, update: &StatusUpdate) {
        self.events
            .push(format!("{} {}", update.task_id, update.state));
        if update.state == TaskState::Running {
            driver.kill(update.task_id);
        }
    }

    async fn error(&mut self, _: &DriverHandle, kind: ErrorKind, message: &str) {
        self.events.push(format!("error {kind:?} {message}"));
    }

    async fn disconnected(&mut self, _: &DriverHandle) {
        self.events.push("disconnected".into());
    }
}

#[tokio::test]
async fn a_script_drives_every_callback_and_reads_what_the_scheduler_sent() -> anyhow::Result<()> {
    let mut master = TestMaster::new("recorder")?;
    let running = master.start(Recorder::default());
    let mut session = master.accept().await?;
    assert_eq!(session.epoch(), 1);
    assert_eq!(session.subscription().roles, ["default"]);
    assert_eq!(session.subscription().framework_id, None);

    let first = session.offer("agent-1", "cpus:4;mem:1024")?;
    let second = session.offer("agent-2", "cpus:4;mem:1024")?;
    assert_eq!(first.agent_id, session.agent_id("agent-1"));
    session.offers(vec![first.clone(), second.clone()]).await?;
    let (offer_ids, tasks) = session.expect_launch().await?;
    assert_eq!(offer_ids, vec![first.id]);
    let task = tasks[0].task_id;
    assert_eq!(session.expect_decline().await?, vec![second.id]);

    session.rescind(second.id).await?;
    session.error(ErrorKind::InvalidRequest, "nope").await?;
    let running_update = session.status(task, TaskState::Running);
    session.update(running_update.clone()).await?;
    // The kill comes from the callback, the acknowledgement when it returns.
    assert_eq!(session.expect_kill().await?, task);
    assert_eq!(session.expect_ack().await?, running_update.update_id);

    // The master fails over before the kill is answered: the driver re-subscribes with its
    // framework id and sends the kill again.
    session.failover();
    let mut session = master.accept().await?;
    assert_eq!(session.epoch(), 2);
    assert_eq!(
        session.subscription().framework_id,
        Some(master.framework_id())
    );
    assert_eq!(session.expect_kill().await?, task);
    let killed = session.status(task, TaskState::Killed);
    session.update(killed.clone()).await?;
    assert_eq!(session.expect_ack().await?, killed.update_id);

    let events = running.scheduler().await.events.clone();
    assert_eq!(
        events,
        [
            "registered".to_string(),
            format!("rescinded {}", second.id),
            "error InvalidRequest nope".into(),
            format!("{task} RUNNING"),
            "disconnected".into(),
            "registered".into(),
            format!("{task} KILLED"),
        ]
    );

    // Teardown reaches the master, and the driver ends.
    running.handle().teardown();
    session
        .expect("the teardown", |m| {
            matches!(m, FrameworkToMaster::Teardown).then_some(())
        })
        .await?;
    running.finished().await?;
    Ok(())
}

#[tokio::test]
async fn a_wait_that_gets_nothing_fails_in_time_with_what_it_waited_for() -> anyhow::Result<()> {
    let mut master = TestMaster::new("idle")?;
    master.set_timeout(std::time::Duration::from_millis(300));
    // A scheduler that never declines or launches (offers kept).
    struct Hoarder;
    impl Scheduler for Hoarder {
        async fn offers(&mut self, _: &DriverHandle, _: Vec<Offer>) {}
    }
    let running = master.start(Hoarder);
    let mut session = master.accept().await?;
    let offer = session.offer("a", "cpus:1;mem:64")?;
    session.offers(vec![offer]).await?;
    let err = session.expect_decline().await.unwrap_err();
    assert!(err.to_string().contains("a decline"), "{err}");
    assert!(session.offer("a", "cpus:lots").is_err());
    running.disconnect().await?;
    Ok(())
}
