//! The runtime's launch path: a [`LaunchPlan`] from the core becomes a task prepared on a
//! blocking thread once the plan's records are committed and started by the agent's
//! supervisor process; its start and exit come back as inputs (its cgroup as a
//! [`Resource`]). A supervisor that dies is reported with the exit it recorded, if any: what
//! follows is the core's decision ([`Input::SupervisorLost`]).

use std::path::PathBuf;

use super::blocking::exit_outcome;
use super::{Agent, Resource};
use crate::container;
use crate::core::{Input, LaunchPlan};
use crate::executor::user::TaskUser;
use crate::executor::{self, LaunchSpec};
use crate::gpu;
use crate::isolation::Baseline;

impl Agent {
    /// Starts a launch after the commit of the task's record (a restarted agent knows every
    /// task it may have started, and every cgroup it may have made). The blocking part — the
    /// user look-up (NSS, LDAP), the cgroup, the directories, fork and exec — runs on a
    /// blocking thread, so no launch holds up the event loop or another task's messages.
    pub(super) fn launch(&mut self, plan: LaunchPlan) {
        let LaunchPlan {
            task,
            sandbox,
            meta,
            cgroup_name,
            mut env,
            mut limits,
            user,
            share,
            framework_id,
        } = plan;
        let id = task.task_id;
        // A fraction of one GPU: its sharing limits (and under MPS its GPU's daemon).
        if let Some(share) = share {
            // (The core started the GPU's daemon before this launch: Effect::StartMps.)
            let pipe = self.mps.as_ref().and_then(|m| m.pipe(&share.uuid));
            for (k, v) in gpu::share::mps_env(
                self.config.gpu_sharing,
                share.gpus_milli,
                share.memory_mib,
                pipe.as_deref().and_then(|p| p.to_str()),
            ) {
                env.insert(k.to_string(), v);
            }
        }
        // runc always allows its default devices in a container's cgroup (`/dev/net/tun`
        // among them); under cgroup v1 the task's own cgroup must allow them too.
        if task.container.is_some() {
            if let Some(rules) = limits.devices.as_mut() {
                rules.push(crate::isolation::devices::DeviceRule::char_rwm(10, 200));
            }
        }
        let tx = self.tx.clone();
        let isolator = self.config.isolator.clone();
        let supervisor = self.supervisor.clone();
        let users = self.users.clone();
        let containers = self.config.containers.clone();
        let images = self.config.images.clone();
        let in_container = task.container.is_some();
        self.launches.push(Box::pin(async move {
            // A registry image: pulled (or found in the cache) first; its lease keeps its
            // layers in the store while this future waits for the task's exit.
            let mut pulled = None;
            let mut _lease = None;
            if let Some(c) = task
                .container
                .as_ref()
                .filter(|c| !c.image.starts_with(container::LOCAL_ROOTFS))
            {
                let got = match &images {
                    None => Err("this agent has no image store (--image-dir)".to_string()),
                    Some(store) => {
                        let progress = |line: String| {
                            tx.input(Input::LaunchProgress {
                                task: id,
                                message: line,
                            })
                        };
                        store
                            .pull(&c.image, &progress)
                            .await
                            .map_err(|e| e.to_string())
                    }
                };
                match got {
                    Ok(image) => {
                        pulled = Some(container::ImageParts::from(&image));
                        _lease = Some(image.lease);
                    }
                    Err(e) => {
                        tx.input(Input::Launched {
                            task: id,
                            result: Err(format!("{}{e}", container::IMAGE_ERROR_PREFIX)),
                        });
                        return;
                    }
                }
            }
            let blocking_meta = meta.clone();
            let spawned = tokio::task::spawn_blocking(move || {
                // The user first, so an unknown user costs no cgroup.
                let user: Option<TaskUser> = match user {
                    None => None,
                    Some(name) => Some(
                        users
                            .lookup_task_user(&name, std::time::Instant::now())
                            .map_err(|e| format!("cannot run the task as user {name:?}: {e}"))?,
                    ),
                };
                let cg = isolator
                    .create(&cgroup_name, &limits)
                    .map_err(|e| format!("task cgroup: {e}"))?;
                // A reused cgroup's counters, for the task's outcome after an agent restart:
                // the supervisor writes them into the launch record with its claim.
                let cgroup_base = (cg.baseline() != Baseline::default())
                    .then(|| serde_json::to_string(&cg.baseline()).ok())
                    .flatten();
                // v1 `tasks`, not `cgroup.procs`: see `TaskCgroup::join_files`.
                let mut procs: Vec<PathBuf> = cg.join_files();
                let mut program = task.command.program.clone();
                let mut user = user;
                // A container task: the supervisor runs the OCI runtime (as root, outside the
                // task cgroup: the runtime puts the container in a child of it).
                if let Some(c) = &task.container {
                    let fw = framework_id.to_string();
                    let req = container_request(
                        &task,
                        c,
                        &fw,
                        &sandbox,
                        &blocking_meta,
                        isolator.hierarchy_path(cg.task_id()),
                        user.as_ref(),
                        &env,
                        pulled,
                    );
                    match container::prepare(&containers, &req) {
                        Ok(p) => program = p,
                        Err(e) => {
                            let _ = cg.destroy();
                            return Err(if e.is_image() {
                                format!("{}{e}", container::IMAGE_ERROR_PREFIX)
                            } else {
                                format!("container: {e}")
                            });
                        }
                    }
                    procs.clear();
                    user = None;
                }
                let spec = LaunchSpec {
                    sandbox: &sandbox,
                    meta: &blocking_meta,
                    program: &program,
                    user: user.as_ref(),
                    env: &env,
                    cgroup_procs: &procs,
                    cgroup_base,
                };
                match executor::prepare(&spec) {
                    Ok(request) => Ok((cg, request)),
                    Err(e) => {
                        let _ = cg.destroy();
                        Err(e.to_string())
                    }
                }
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
            let (cg, prepared) = match spawned {
                Ok(ok) => ok,
                Err(e) => {
                    tx.input(Input::Launched {
                        task: id,
                        result: Err(e),
                    });
                    return;
                }
            };
            match supervisor.launch(prepared, &meta).await {
                Ok((launched, exited)) => {
                    // The task's own handle, for its outcome where its exit is learned (a
                    // container's is settled by the core's `Settle`, with its runtime's state).
                    let own = (!in_container && cg.is_isolated()).then(|| cg.clone());
                    tx.resource(Resource::Cgroup(id, Box::new(cg)));
                    tx.input(Input::Launched {
                        task: id,
                        result: Ok(launched),
                    });
                    match exited.await {
                        Ok(status) => {
                            // Its cgroup's OOM flag and final usage read now, so the exit and
                            // the outcome are one input (the task settles in one batch).
                            let outcome = match own {
                                Some(cg) => {
                                    tokio::task::spawn_blocking(move || exit_outcome(&cg, &meta))
                                        .await
                                        .ok()
                                }
                                None => None,
                            };
                            tx.input(Input::Exited {
                                task: id,
                                status,
                                outcome,
                            })
                        }
                        // The supervisor died: what it recorded, if anything.
                        Err(_) => tx.input(Input::SupervisorLost {
                            task: id,
                            recorded: executor::read_exit(&meta),
                        }),
                    }
                }
                Err(e) => {
                    let _ = tokio::task::spawn_blocking(move || cg.destroy()).await;
                    tx.input(Input::Launched {
                        task: id,
                        result: Err(e.to_string()),
                    });
                }
            }
        }));
    }
}

/// What the container module needs of a launch: the task's user (the agent's own without one)
/// and its GPUs (`NVIDIA_VISIBLE_DEVICES`, the CDI device names).
#[allow(clippy::too_many_arguments)]
fn container_request<'a>(
    task: &'a gantry_proto::TaskInfo,
    c: &'a gantry_proto::ContainerInfo,
    framework_id: &'a str,
    sandbox: &'a std::path::Path,
    meta: &'a std::path::Path,
    task_cgroup: Option<String>,
    user: Option<&TaskUser>,
    env: &'a std::collections::BTreeMap<String, String>,
    pulled: Option<container::ImageParts>,
) -> container::Request<'a> {
    // SAFETY: getuid and getgid cannot fail.
    let (uid, gid, groups) = match user {
        Some(u) => (u.uid, u.gid, u.groups.clone()),
        None => unsafe { (libc::getuid(), libc::getgid(), Vec::new()) },
    };
    let gpus = env
        .get("NVIDIA_VISIBLE_DEVICES")
        .map(|v| {
            v.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    container::Request {
        task_id: task.task_id,
        framework_id,
        container: c,
        program: &task.command.program,
        sandbox,
        meta,
        task_cgroup,
        uid,
        gid,
        groups,
        env,
        gpus,
        pulled,
    }
}
