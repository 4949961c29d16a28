//! Accepting offers: single-use offers, task validation, task users and the run_tasks ACL.

use super::*;

#[test]
fn offers_are_single_use_and_must_fit() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:4;mem:1024");
    let (_fw, offers) = h.framework(F, "f", "r");
    assert_eq!(offers.len(), 1);
    let offer = offers[0].id;
    // Too big: ERROR update, offer consumed, nothing launched.
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(offer, vec![task("cpus:5")]),
    });
    assert_eq!(errors(&out), vec![ErrorKind::InsufficientResources]);
    assert!(!out
        .iter()
        .any(|o| matches!(o, Output::ToAgent(_, MasterToAgent::RunTask { .. }))));
    // The same offer again: unknown.
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(offer, vec![task("cpus:1")]),
    });
    assert!(errors(&out).contains(&ErrorKind::UnknownOffer), "{out:?}");
    // A fresh offer (resources came back) launches.
    let mut offers = offers_of(&out);
    if offers.is_empty() {
        offers = offers_after_revive(&mut h);
    }
    let t = task("cpus:1;mem:100");
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, vec![t.clone()]),
    });
    assert!(out.iter().any(|o| matches!(o, Output::ToAgent(A, MasterToAgent::RunTask { task, .. }) if task.task_id == t.task_id)));
    assert_eq!(h.m.tasks[&t.task_id].state, TaskState::Staging);
}

#[test]
fn containers_are_validated_and_an_empty_command_runs_the_image_entrypoint() {
    use gantry_proto::{ContainerInfo, Volume};
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:4;mem:1024");
    let (_fw, offers) = h.framework(F, "f", "r");
    let mut good = task("cpus:1");
    good.command = "".into();
    good.container = Some(Box::new(
        ContainerInfo::new("reg:5000/img:1").with_volume(Volume::persistent("ckpt", "/ckpt")),
    ));
    let bad = |c: ContainerInfo| {
        let mut t = task("cpus:1");
        t.container = Some(Box::new(c));
        t
    };
    let refused = [
        bad(ContainerInfo::new("")),
        bad(ContainerInfo::new("reg/img:1").with_volume(Volume::host("data", "/data"))),
        bad(ContainerInfo::new("reg/img:1").with_volume(Volume::host("/a/../etc", "/data"))),
        bad(ContainerInfo::new("reg/img:1").with_volume(Volume::persistent("../x", "/x"))),
        bad(ContainerInfo::new("reg/img:1")
            .with_volume(Volume::persistent("a", "/x"))
            .with_volume(Volume::persistent("b", "/x"))),
        bad(ContainerInfo::new("rootfs:../../etc")),
    ];
    let mut tasks = vec![good.clone()];
    tasks.extend(refused.iter().cloned());
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, tasks),
    });
    assert!(out.iter().any(|o| matches!(o, Output::ToAgent(A, MasterToAgent::RunTask { task, .. }) if task.task_id == good.task_id)));
    let messages: Vec<String> = out
        .iter()
        .filter_map(|o| match o {
            Output::ToFramework(_, MasterToFramework::Update(u)) if u.state == TaskState::Error => {
                assert_eq!(u.reason, Some(TaskReason::InvalidTask));
                Some(u.message.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(messages.len(), refused.len(), "{messages:?}");
    for want in [
        "image reference must be",
        "not absolute",
        "not normalized",
        "persistent volume name",
        "two volumes at",
        "not a safe name",
    ] {
        assert!(
            messages
                .iter()
                .any(|m| m.contains("container: ") && m.contains(want)),
            "{want}: {messages:?}"
        );
    }
}

fn offers_after_revive(h: &mut Harness) -> Vec<Offer> {
    let out = h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Revive { roles: vec![] },
    });
    offers(&out, F)
}

#[test]
fn invalid_tasks_are_errors_and_valid_ones_launch() {
    let mut h = Harness::new();
    h.agent(A, "a1", "cpus:4;mem:1024");
    let (_fw, offers) = h.framework(F, "f", "r");
    let good = task("cpus:1");
    let mut empty_cmd = task("cpus:1");
    empty_cmd.command = " ".into();
    let no_res = task("disk:1");
    let mut frac_gpu = task("cpus:1;gpus:0.5");
    frac_gpu.name = "g".into();
    let dup = good.clone();
    let mut empty_argv = task("cpus:1");
    empty_argv.command = CommandInfo::argv(Vec::<String>::new());
    let mut empty_program = task("cpus:1");
    empty_program.command = CommandInfo::argv(["", "x"]);
    let mut bad_user = task("cpus:1");
    bad_user.command = CommandInfo::shell("true").with_user("../root");
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(
            offers[0].id,
            vec![
                good.clone(),
                empty_cmd,
                no_res,
                frac_gpu,
                dup,
                empty_argv,
                empty_program,
                bad_user,
            ],
        ),
    });
    let runs = out
        .iter()
        .filter(|o| matches!(o, Output::ToAgent(_, MasterToAgent::RunTask { .. })))
        .count();
    assert_eq!(runs, 1);
    assert_eq!(errors(&out).len(), 7, "{out:?}");
    let messages: Vec<String> = out
        .iter()
        .filter_map(|o| match o {
            Output::ToFramework(_, MasterToFramework::Update(u)) if u.state == TaskState::Error => {
                assert_eq!(u.reason, Some(TaskReason::InvalidTask));
                Some(u.message.clone())
            }
            _ => None,
        })
        .collect();
    for want in [
        "empty shell command",
        "empty argv",
        "empty program",
        "invalid user name",
    ] {
        assert!(
            messages.iter().any(|m| m.contains(want)),
            "{want}: {messages:?}"
        );
    }
}

#[test]
fn task_users_default_to_the_agents_and_are_checked_against_run_tasks_acls() {
    let acls = crate::security::acl::Acls::from_toml(
        r#"
[[register_frameworks]]
principals = ["*"]
roles = ["*"]

[[run_tasks]]
principals = ["f"]
users = ["nobody", "alice"]
"#,
    )
    .unwrap();
    let mut h = Harness::new();
    h.m.config.acls = acls;
    h.agent(A, "a1", "cpus:4;mem:1024");
    let (_fw, offers) = h.framework(F, "f", "r");
    let default_user = task("cpus:1");
    let mut alice = task("cpus:1");
    alice.command = CommandInfo::argv(["id", "-u"]).with_user("alice");
    let mut root = task("cpus:1");
    root.command = CommandInfo::shell("cat /etc/shadow").with_user("root");
    let mut bob = task("cpus:1");
    bob.command = CommandInfo::shell("true").with_user("bob");
    let (sent, out) = run_tasks(
        &mut h,
        offers[0].id,
        vec![default_user.clone(), alice.clone(), root.clone(), bob],
    );
    // The default is filled in before launching (the agent reported `nobody`).
    let users: Vec<(TaskId, Option<String>)> = sent
        .iter()
        .map(|t| (t.task_id, t.command.user.clone()))
        .collect();
    assert_eq!(
        users,
        vec![
            (default_user.task_id, Some("nobody".to_string())),
            (alice.task_id, Some("alice".to_string())),
        ]
    );
    assert_eq!(
        h.m.tasks[&default_user.task_id].record().user.as_deref(),
        Some("nobody")
    );
    let refused: Vec<String> = out
        .iter()
        .filter_map(|o| match o {
            Output::ToFramework(_, MasterToFramework::Update(u)) if u.state == TaskState::Error => {
                Some(u.message.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(
        refused[0].contains("may not run tasks as user \"root\""),
        "{refused:?}"
    );
    assert!(refused[1].contains("\"bob\""), "{refused:?}");
}

/// A framework holding two offers on one agent: the rest of the agent after a launch, and the
/// launched task's resources once it finished.
fn two_offers_on_one_agent(h: &mut Harness) -> (FrameworkId, Offer, Offer) {
    h.agent(A, "a1", "cpus:4;mem:1024");
    let (fw, offers) = h.framework(F, "f", "r");
    let t = task("cpus:1;mem:256");
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(offers[0].id, vec![t.clone()]),
    });
    let mut rest = offers_of(&out);
    if rest.is_empty() {
        h.now += 1_000;
        rest = offers_of(&h.input(Input::Tick));
    }
    assert_eq!(rest.len(), 1, "the unused part is offered again: {out:?}");
    let out = h.input(Input::Agent {
        conn: A,
        msg: AgentToMaster::StatusUpdate(agent_update(&t, fw, TaskState::Finished)),
    });
    let back = offers_of(&out);
    assert_eq!(back.len(), 1, "the task's resources are offered: {out:?}");
    assert_eq!(rest[0].agent_id, back[0].agent_id);
    (fw, rest[0].clone(), back[0].clone())
}

fn rescinded(out: &[Output]) -> Vec<OfferId> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToFramework(F, MasterToFramework::Rescind { offer_id }) => Some(*offer_id),
            _ => None,
        })
        .collect()
}

#[test]
fn a_decline_acts_on_all_offers_on_the_agent_under_one_filter() {
    let mut h = Harness::new();
    let (_fw, rest, back) = two_offers_on_one_agent(&mut h);
    let out = h.input(Input::Framework {
        conn: F,
        msg: FrameworkToMaster::Decline {
            offer_ids: vec![back.id],
            refuse_seconds: Some(30.0),
        },
    });
    assert_eq!(rescinded(&out), vec![rest.id], "{out:?}");
    assert!(errors(&out).is_empty(), "{out:?}");
    assert_eq!(h.m.allocator.outstanding_offers().count(), 0);
    // Nothing of the agent while the one filter over the union lasts, then all of it.
    h.now += 29_000;
    let out = h.input(Input::Tick);
    assert!(offers_of(&out).is_empty(), "{out:?}");
    h.now += 2_000;
    let out = h.input(Input::Tick);
    let again = offers_of(&out);
    assert_eq!(again.len(), 1, "{out:?}");
    assert_eq!(again[0].total(), res("cpus:4;mem:1024"));
}

#[test]
fn an_accept_combines_all_offers_on_the_agent_and_a_stale_one_drops_its_tasks() {
    let mut h = Harness::new();
    let (fw, rest, back) = two_offers_on_one_agent(&mut h);
    // Naming one offer draws from both: 4 cpus in one accept of the 1-cpu offer.
    let t = task("cpus:4;mem:1024");
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(back.id, vec![t.clone()]),
    });
    assert_eq!(rescinded(&out), vec![rest.id], "{out:?}");
    assert!(errors(&out).is_empty(), "{out:?}");
    assert!(out.iter().any(
        |o| matches!(o, Output::ToAgent(A, MasterToAgent::RunTask { task, .. }) if task.task_id == t.task_id)
    ));
    assert_eq!(
        h.m.allocator.framework_allocated(fw).total(),
        res("cpus:4;mem:1024")
    );
    // An accept naming the offer that was combined (its rescind still in flight): its tasks
    // are DROPPED with the reason, nothing runs, nothing is lost from the allocator.
    let late = task("cpus:1;mem:100");
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(rest.id, vec![late.clone()]),
    });
    let dropped: Vec<&StatusUpdate> = out
        .iter()
        .filter_map(|o| match o {
            Output::ToFramework(F, MasterToFramework::Update(u)) => Some(u),
            _ => None,
        })
        .collect();
    assert_eq!(dropped.len(), 1, "{out:?}");
    assert_eq!(dropped[0].task_id, late.task_id);
    assert_eq!(dropped[0].state, TaskState::Dropped);
    assert_eq!(dropped[0].reason, Some(TaskReason::InvalidOffers));
    assert!(
        dropped[0].message.starts_with("invalid offers: "),
        "{}",
        dropped[0].message
    );
    assert!(!out
        .iter()
        .any(|o| matches!(o, Output::ToAgent(_, MasterToAgent::RunTask { .. }))));
    assert!(!h.m.tasks.contains_key(&late.task_id));
    assert_eq!(
        h.m.allocator.framework_allocated(fw).total(),
        res("cpus:4;mem:1024")
    );
}
