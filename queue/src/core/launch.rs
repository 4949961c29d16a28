//! Launching: a job's tasks (named `JOBNAME/INDEX`, wrapped so the preemption warning leaves
//! a file), and the growth of running elastic gangs.

use std::collections::BTreeMap;
use std::time::Instant;

use gantry_sdk::placement::gang;
use gantry_sdk::placement::offers::{AgentView, Plan};
use gantry_sdk::protocol::*;

use super::{avail_ids, member_resources, request, Action, Core, JobState, Member};

impl Core {
    /// Records a job's launch and builds its tasks: (agent index, task).
    pub(super) fn start(
        &mut self,
        id: u64,
        plan: &Plan,
        agents: &[(AgentId, String)],
        now: Instant,
    ) -> Vec<(usize, TaskInfo)> {
        let preempt_file = self.config.preempt_file.clone();
        let checkpoint_root = self.config.checkpoint_root.clone();
        let known = &self.agents;
        let Some(job) = self.jobs.get_mut(&id) else {
            return Vec::new();
        };
        let first = job.state == JobState::Pending;
        if first {
            job.state = JobState::Running;
            job.attempts += 1;
            job.attempt_started = Some(now);
            job.waited += now.saturating_duration_since(job.waiting_since);
            self.stats.waits.push(job.waited.as_secs_f64());
        }
        let workers = if first {
            plan.assignments.len() as u32
        } else {
            job.running_members() + plan.assignments.len() as u32
        };
        let mut out = Vec::new();
        for a in &plan.assignments {
            let index = job.next_index;
            job.next_index += 1;
            let task_id = TaskId::random();
            let (agent_id, hostname) = agents
                .get(a.agent)
                .cloned()
                .unwrap_or((AgentId::random(), String::new()));
            let mut env = job.spec.env.clone();
            env.insert("GPU_QUEUE_JOB".into(), job.spec.name.clone());
            env.insert("GPU_QUEUE_JOB_ID".into(), id.to_string());
            env.insert("GPU_QUEUE_WORKER_INDEX".into(), index.to_string());
            env.insert("GPU_QUEUE_WORKERS".into(), workers.to_string());
            env.insert("GPU_QUEUE_PREEMPTIONS".into(), job.preemptions.to_string());
            env.insert("GPU_QUEUE_PREEMPT_FILE".into(), preempt_file.clone());
            env.insert(
                "GPU_QUEUE_GRACE_SECS".into(),
                job.spec.grace_secs.to_string(),
            );
            if let Some(root) = &checkpoint_root {
                env.insert(
                    "GANTRY_QUEUE_CHECKPOINT_DIR".into(),
                    checkpoint_dir(root, id),
                );
            }
            let task = TaskInfo {
                task_id,
                name: format!("{}/{index}", job.spec.name),
                command: wrap(&job.spec.command_info()),
                resources: member_resources(&job.spec),
                env,
                kill_grace_secs: Some(job.spec.grace_secs),
                gpu_selector: if job.spec.gpus.is_fraction() {
                    // A fraction shares the GPU the plan chose (fragmentation-aware): pinned.
                    a.pinned_selector(job.spec.selector().as_ref())
                } else {
                    pinned_selector(
                        job.spec.selector(),
                        known.get(&agent_id).map(|k| &k.gpus),
                        &a.gpus,
                    )
                },
                container: None,
            };
            job.members.insert(
                index,
                Member {
                    task_id,
                    agent_id,
                    hostname,
                    gpus: a.gpus.clone(),
                    state: TaskState::Staging,
                    killing: false,
                    started: now,
                },
            );
            self.tasks.insert(task_id, (id, index));
            out.push((a.agent, task));
        }
        out
    }

    /// Grows running elastic gangs on what is free (launches on the remaining offers).
    pub(super) fn grow(&mut self, views: &mut Vec<AgentView>, now: Instant) -> Vec<Action> {
        let ids: Vec<u64> = self
            .jobs
            .values()
            .filter(|j| {
                j.state == JobState::Running
                    && !j.preempting
                    && j.finished_members == 0
                    && j.running_members() < j.spec.max_workers
            })
            .map(|j| j.id)
            .collect();
        let mut launches: BTreeMap<usize, Vec<TaskInfo>> = BTreeMap::new();
        // Growth, too, stays within the team's borrowing limit.
        let usage = self.usage(now);
        let mut grown: BTreeMap<String, u64> = BTreeMap::new();
        for id in ids {
            let job = &self.jobs[&id];
            let member = request(&job.spec);
            let mut max = job.spec.max_workers;
            if let Some(room) = self.borrow_room(&job.spec, &usage) {
                let room = room.saturating_sub(grown.get(&job.spec.team).copied().unwrap_or(0));
                let extra = room / job.spec.gpus.milli().max(1);
                max = max.min(
                    job.running_members()
                        .saturating_add(extra.min(u64::from(u32::MAX)) as u32),
                );
            }
            let plan = gang::grow(views, &member, job.running_members(), max);
            if plan.assignments.is_empty() {
                continue;
            }
            *grown.entry(job.spec.team.clone()).or_default() +=
                job.spec.gpus.milli() * plan.assignments.len() as u64;
            for (agent, task) in self.start(id, &plan, &avail_ids(views), now) {
                launches.entry(agent).or_default().push(task);
            }
        }
        let mut out = Vec::new();
        for (agent, tasks) in launches {
            let Some(v) = views.get(agent) else { continue };
            self.note_settled(v.offer_ids.iter(), now);
            for o in &v.offer_ids {
                self.offers.remove(o);
            }
            out.push(Action::Launch {
                offers: v.offer_ids.clone(),
                tasks,
            });
        }
        out
    }
}

impl Core {
    /// Records that we accept or decline these offers now: the master acts on all of our
    /// offers on their agents (its rule 2, docs/allocator.md), including any already on their
    /// way to us, which it rescinds.
    pub(super) fn note_settled<'a>(
        &mut self,
        ids: impl Iterator<Item = &'a OfferId>,
        now: Instant,
    ) {
        for id in ids {
            if let Some((o, _)) = self.offers.get(id) {
                self.settled.insert(o.agent_id, now);
            }
        }
    }

    /// Whether `plan` is a gang over several agents one of which has an offer that arrived
    /// after our last accept or decline there, less than [`super::CoreConfig::offer_settle`]
    /// ago: the master may have folded that offer into the accept or decline, and its rescind
    /// may still be on the way. Launched on it, one agent's accept would be refused ("offer
    /// ... is unknown") while the others' run: a partial gang. A single agent's launch is
    /// not held back: a refused accept there drops the whole job, which launches again.
    pub(super) fn unsettled(&self, plan: &Plan, views: &[AgentView], now: Instant) -> bool {
        let agents: std::collections::BTreeSet<AgentId> = plan
            .assignments
            .iter()
            .filter_map(|a| views.get(a.agent).map(|v| v.agent_id))
            .collect();
        if agents.len() < 2 {
            return false;
        }
        let settle = self.config.offer_settle;
        agents.iter().any(|agent| {
            let Some(&at) = self.settled.get(agent) else {
                return false;
            };
            now.saturating_duration_since(at) < settle
                && self
                    .offers
                    .values()
                    .any(|(o, got)| o.agent_id == *agent && *got > at)
        })
    }
}

/// The worker's command under a small `sh` wrapper: on SIGTERM (the preemption or cancel
/// warning, sent to the whole process group) it writes `$GPU_QUEUE_PREEMPT_FILE` in the
/// sandbox, then waits for the job, whose exit status it returns. The second `wait` (the first
/// was interrupted by the trap) runs only while the job is still there to wait for: waiting for
/// a child already reaped answers 127, which was reported as the job's status.
/// Job `id`'s checkpoint directory under `root`.
pub fn checkpoint_dir(root: &str, id: u64) -> String {
    format!("{}/job-{id}", root.trim_end_matches('/'))
}

fn wrap(command: &CommandInfo) -> CommandInfo {
    const SCRIPT: &str = r#"trap 'echo "$(date +%s) SIGTERM: checkpoint now" > "$GPU_QUEUE_PREEMPT_FILE"' TERM
if [ -n "$GANTRY_QUEUE_CHECKPOINT_DIR" ]; then (umask 077; mkdir -p "$GANTRY_QUEUE_CHECKPOINT_DIR") || exit 1; fi
"$@" &
child=$!
wait "$child"; status=$?
if [ -f "$GPU_QUEUE_PREEMPT_FILE" ] && kill -0 "$child" 2>/dev/null; then wait "$child"; status=$?; fi
exit "$status""#;
    let mut argv = vec![
        "/bin/sh".to_string(),
        "-c".into(),
        SCRIPT.into(),
        "gpu-queue-worker".into(),
    ];
    match &command.program {
        Program::Shell(s) => argv.extend(["/bin/sh".to_string(), "-c".into(), s.clone()]),
        Program::Argv(v) => argv.extend(v.iter().cloned()),
    }
    CommandInfo {
        program: Program::Argv(argv),
        user: command.user.clone(),
    }
}

/// The selector a member is launched with: the job's, with the model pinned to the model of
/// the GPUs the plan chose for it when they are all one model and the job named none. The
/// master picks the devices (count and selector, not our plan); without the pin, a job placed on an
/// agent's H100s could be given its A100s and leave a later A100-only job of the same pass
/// without any.
fn pinned_selector(
    selector: Option<GpuSelector>,
    gpus: Option<&BTreeMap<String, gantry_sdk::placement::offers::FreeGpu>>,
    planned: &[String],
) -> Option<GpuSelector> {
    if selector.as_ref().is_some_and(|s| s.model.is_some()) || planned.is_empty() {
        return selector;
    }
    let models: std::collections::BTreeSet<&str> = planned
        .iter()
        .filter_map(|u| gpus.and_then(|g| g.get(u)).map(|g| g.model.as_str()))
        .collect();
    match models.into_iter().collect::<Vec<_>>().as_slice() {
        [model] if !model.is_empty() => {
            let mut s = selector.unwrap_or_default();
            s.model = Some((*model).to_string());
            Some(s)
        }
        _ => selector,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_sdk::placement::offers::FreeGpu;

    fn gpu(uuid: &str, model: &str) -> (String, FreeGpu) {
        (
            uuid.to_string(),
            FreeGpu {
                uuid: uuid.into(),
                model: model.into(),
                memory_mib: 40960,
                numa_node: Some(0),
                pci_bus_id: String::new(),
                free_milli: 1000,
            },
        )
    }

    /// The race behind gang `b`'s partial launch in tests/tests/gpu_queue.rs: the queue
    /// declines its stale offers on both agents as the GPUs there free up; the offers of the
    /// freed GPUs arrive after the decline left, and may have been folded into it by the
    /// master and rescinded on their way. The gang launches only once they have settled, and
    /// never on one agent alone when the other's offer is rescinded.
    #[test]
    fn a_gang_over_several_agents_waits_for_offers_that_may_be_rescinded() {
        use crate::core::tests::{spec, Cluster};
        use crate::core::CoreConfig;
        use crate::model::Priority;
        use std::time::Duration;

        let c = Cluster::new(2);
        let mut q = Core::new(CoreConfig::default());
        let t0 = Instant::now();
        q.submit(spec("b", "t", Priority::Normal, 8, 2), t0);
        let a = q.offers(c.offers(&[4, 4]), t0);
        assert!(
            !a.iter().any(|a| matches!(a, Action::Launch { .. })),
            "{a:?}"
        );
        // Held past the hold: declined (per agent, as the master acts on them).
        let t1 = t0 + Duration::from_secs(21);
        let a = q.tick(t1);
        assert!(a.iter().any(|a| matches!(a, Action::Decline(..))), "{a:?}");
        // The freed GPUs' offers arrive just after: not launched on yet, but kept.
        let t2 = t1 + Duration::from_millis(50);
        let fresh = c.offers(&[8, 8]);
        let a = q.offers(fresh.clone(), t2);
        assert!(
            !a.iter()
                .any(|a| matches!(a, Action::Launch { .. } | Action::Decline(..))),
            "{a:?}"
        );
        // The master had folded agent 1's offer into the decline: its rescind comes. The gang
        // never launches on agent 0 alone.
        q.rescinded(fresh[1].id);
        let t3 = t1 + Duration::from_millis(1500);
        let a = q.tick(t3);
        assert!(
            !a.iter().any(|a| matches!(a, Action::Launch { .. })),
            "{a:?}"
        );
        // The next offer of agent 1 comes once the decline has settled: both launch.
        let t4 = t3 + Duration::from_millis(100);
        let a = q.offers(vec![c.offers(&[8, 8]).remove(1)], t4);
        assert_eq!(
            a.iter()
                .filter(|a| matches!(a, Action::Launch { .. }))
                .count(),
            2,
            "{a:?}"
        );
    }

    /// Without a decline or accept in between, a gang launches on fresh offers at once.
    #[test]
    fn a_gang_on_settled_offers_launches_at_once() {
        use crate::core::tests::{spec, Cluster};
        use crate::core::CoreConfig;
        use crate::model::Priority;

        let c = Cluster::new(2);
        let mut q = Core::new(CoreConfig::default());
        let t0 = Instant::now();
        q.submit(spec("b", "t", Priority::Normal, 8, 2), t0);
        let a = q.offers(c.offers(&[8, 8]), t0);
        assert_eq!(
            a.iter()
                .filter(|a| matches!(a, Action::Launch { .. }))
                .count(),
            2,
            "{a:?}"
        );
    }

    #[test]
    fn the_model_is_pinned_only_when_the_plan_chose_one_model_and_the_job_named_none() {
        let known: BTreeMap<String, FreeGpu> =
            [gpu("a", "NVIDIA A100"), gpu("h", "NVIDIA H100")].into();
        let pinned = pinned_selector(None, Some(&known), &["h".into()]).unwrap();
        assert_eq!(pinned.model.as_deref(), Some("NVIDIA H100"));
        assert_eq!(
            pinned_selector(None, Some(&known), &["a".into(), "h".into()]),
            None
        );
        let named = GpuSelector {
            model: Some("A100".into()),
            ..Default::default()
        };
        assert_eq!(
            pinned_selector(Some(named.clone()), Some(&known), &["a".into()]),
            Some(named)
        );
        let mem = GpuSelector {
            min_memory_mib: Some(1024),
            ..Default::default()
        };
        let both = pinned_selector(Some(mem), Some(&known), &["a".into()]).unwrap();
        assert_eq!(both.model.as_deref(), Some("NVIDIA A100"));
        assert_eq!(both.min_memory_mib, Some(1024));
        assert_eq!(pinned_selector(None, Some(&known), &[]), None);
    }
}
