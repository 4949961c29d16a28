//! Accepting offers: validating the offers and tasks, carving each task's resources out of
//! the offers ([`draw`]), RESERVE / UNRESERVE operations, and launching.

use super::*;

impl Master {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn accept(
        &mut self,
        conn: ConnId,
        fw: FrameworkId,
        offer_ids: Vec<OfferId>,
        operations: Vec<Operation>,
        refuse_seconds: Option<f64>,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        // 1. The offers: known, ours, distinct, one agent, one role. An invalid accept drops
        //    its tasks (TASK_DROPPED, Mesos `REASON_INVALID_OFFERS`) so the framework launches
        //    them again on later offers; the valid offers it named return to the pool unfiltered.
        let mut problem: Option<(ErrorKind, String)> = None;
        let mut offers: Vec<OfferRecord> = Vec::new();
        // Distinct ids in O(1) each: an accept may name many.
        let mut named: HashSet<OfferId> = HashSet::new();
        if offer_ids.is_empty() {
            problem = Some((ErrorKind::InvalidRequest, "accept names no offer".into()));
        }
        for oid in &offer_ids {
            match self.allocator.offer(*oid) {
                Some(o) if o.framework == fw && named.insert(*oid) => offers.push(o.clone()),
                Some(o) if o.framework == fw => {
                    problem = Some((
                        ErrorKind::InvalidRequest,
                        format!("offer {oid} named twice"),
                    ))
                }
                _ => {
                    problem = Some((
                        ErrorKind::UnknownOffer,
                        format!(
                            "offer {oid} is unknown, already used, declined, rescinded or expired"
                        ),
                    ))
                }
            }
        }
        let agent_id = offers.first().map(|o| o.agent);
        if offers.iter().any(|o| Some(o.agent) != agent_id) {
            problem.get_or_insert((
                ErrorKind::InvalidRequest,
                "offers of one accept must be on one agent".into(),
            ));
        }
        let role = offers.first().map(|o| o.role.clone()).unwrap_or_default();
        if offers.iter().any(|o| o.role != role) {
            problem.get_or_insert((
                ErrorKind::InvalidRequest,
                "offers of one accept must be for one role".into(),
            ));
        }
        let agent_conn = agent_id
            .and_then(|a| self.agents.get(&a))
            .and_then(|a| a.conn);
        if problem.is_none() && agent_conn.is_none() {
            problem = Some((
                ErrorKind::UnknownAgent,
                "the offers' agent is unknown or disconnected".into(),
            ));
        }
        let mut problem = problem.map(|(kind, m)| (kind, format!("invalid offers: {m}")));
        let refuse = match refuse_ms(refuse_seconds) {
            Ok(r) => r,
            Err(m) => {
                let _ = problem
                    .get_or_insert((ErrorKind::InvalidRequest, format!("invalid accept: {m}")));
                None
            }
        };
        // Past the lease deadline another master may lead already: launching now could run a
        // task twice, so nothing is launched (the framework hears why, and each task ends).
        let lapsed = !self.leads_at(now);
        if lapsed {
            problem = Some((
                ErrorKind::InvalidRequest,
                "this master's leadership lease has lapsed (another master may lead now); no task was launched".into(),
            ));
        }
        if let Some((kind, message)) = problem {
            let ids: Vec<OfferId> = offers.iter().map(|o| o.id).collect();
            let _ = self.allocator.decline_offers(&ids, Some(0), now);
            self.allocation_pending = true;
            out.push(err(conn, kind, format!("accept rejected: {message}")));
            if lapsed {
                self.not_launched(conn, fw, &operations, now, out);
            } else {
                self.drop_tasks(conn, fw, (agent_id, &role), &operations, &message, now, out);
            }
            return;
        }
        let (Some(agent_id), Some(agent_conn)) = (agent_id, agent_conn) else {
            return;
        };
        // Rule 2 (docs/allocator.md): one accept acts on ALL of the framework's outstanding
        // offers on the agent. Those of the same role join the pool (after the named ones);
        // every offer not named is settled with the accept (its unused part under the one
        // filter) and rescinded at the framework, which learns so before it could use it.
        let mut others: Vec<OfferRecord> = Vec::new();
        for oid in self.allocator.offers_on(fw, agent_id) {
            if named.contains(&oid) {
                continue;
            }
            if let Some(o) = self.allocator.offer(oid) {
                others.push(o.clone());
            }
        }
        let foreign_role: Vec<OfferRecord> =
            others.iter().filter(|o| o.role != role).cloned().collect();
        others.retain(|o| o.role == role);
        for o in others.iter().chain(&foreign_role) {
            out.push(Output::ToFramework(
                conn,
                MasterToFramework::Rescind { offer_id: o.id },
            ));
        }
        offers.extend(others);
        // Who may run as whom: the task's user, or the agent's default filled in here (the
        // agent reported it at registration), checked against the principal's ACL.
        let principal = self
            .frameworks
            .get(&fw)
            .map(|f| f.principal.clone())
            .unwrap_or_default();
        let agent_user = self
            .agents
            .get(&agent_id)
            .map(|a| a.task_user.clone())
            .unwrap_or_default();

        // 2. Draw each task from the pool of offered resources.
        let mut pool: Vec<OfferResources> = offers.iter().map(|o| o.resources.clone()).collect();
        let offer_list: Vec<OfferId> = offers.iter().map(|o| o.id).collect();
        let mut used: Vec<OfferResources> = vec![OfferResources::default(); offers.len()];
        let mut launches: Vec<(TaskInfo, OfferResources, Vec<String>)> = Vec::new();
        // What the agent's live tasks hold of its GPUs plus the shares given to earlier tasks
        // of this accept: computed once, at the first task with GPUs.
        // (Built now when offers on the agent earmarked GPU shares: those of other frameworks'
        // offers are not this accept's.)
        let mut accept_gpus: Option<super::gpus::GpuLedger> =
            self.accept_gpu_ledger(agent_id, &offer_list);
        let mut seen_ids: HashSet<TaskId> = HashSet::new();
        // Task groups admitted whole: (group id, policy, members).
        let mut groups: Vec<(String, GroupPolicy, Vec<Admitted>)> = Vec::new();
        for op in operations {
            match op {
                Operation::Launch { tasks } => {
                    for task in tasks {
                        let mut draft = AcceptDraft {
                            pool: &mut pool,
                            used: &mut used,
                            gpus: &mut accept_gpus,
                            seen_ids: &mut seen_ids,
                        };
                        match self.admit_task(task, agent_id, &principal, &agent_user, &mut draft) {
                            Ok(launch) => launches.push(launch),
                            Err(refused) => {
                                let (task, kind, reason) = *refused;
                                self.error_update(
                                    conn,
                                    fw,
                                    &task,
                                    (Some(agent_id), &role),
                                    kind,
                                    &reason,
                                    now,
                                    out,
                                )
                            }
                        }
                    }
                }
                Operation::LaunchGroup { group } => {
                    // All members or none: drawn from copies of the pool, kept only when
                    // every member fits (groups.rs-style rollback, nothing charged otherwise).
                    let mut g_pool = pool.clone();
                    let mut g_used = used.clone();
                    let mut g_gpus = accept_gpus.clone();
                    let mut g_seen = seen_ids.clone();
                    let mut members = Vec::new();
                    let mut refusal = group.problem().map(|p| {
                        (
                            ErrorKind::InvalidTask,
                            format!("task group {:?}: {p}", group.group_id),
                        )
                    });
                    let all: Vec<TaskInfo> = group.tasks.clone();
                    if refusal.is_none() {
                        for task in group.tasks {
                            let mut draft = AcceptDraft {
                                pool: &mut g_pool,
                                used: &mut g_used,
                                gpus: &mut g_gpus,
                                seen_ids: &mut g_seen,
                            };
                            match self.admit_task(
                                task,
                                agent_id,
                                &principal,
                                &agent_user,
                                &mut draft,
                            ) {
                                Ok(launch) => members.push(launch),
                                Err(refused) => {
                                    let (task, kind, reason) = *refused;
                                    refusal = Some((
                                        kind,
                                        format!(
                                            "task group {:?} refused as a whole: member {:?} ({}): {reason}",
                                            group.group_id, task.name, task.task_id
                                        ),
                                    ));
                                    break;
                                }
                            }
                        }
                    }
                    match refusal {
                        Some((kind, reason)) => {
                            out.push(err(conn, kind, reason.clone()));
                            for task in &all {
                                self.group_member_refused(
                                    conn,
                                    fw,
                                    (Some(agent_id), &role),
                                    task,
                                    &reason,
                                    now,
                                    out,
                                );
                            }
                        }
                        None => {
                            pool = g_pool;
                            used = g_used;
                            accept_gpus = g_gpus;
                            seen_ids = g_seen;
                            groups.push((group.group_id, group.policy, members));
                        }
                    }
                }
                Operation::Reserve { role, resources } => {
                    if let Err(rejection) = self.reserve_op(
                        fw,
                        agent_id,
                        &role,
                        &resources,
                        &offer_list,
                        &mut pool,
                        true,
                        out,
                    ) {
                        out.push(err(
                            conn,
                            ErrorKind::InvalidRequest,
                            format!("reserve: {rejection}"),
                        ));
                    }
                }
                Operation::Unreserve { role, resources } => {
                    if let Err(rejection) = self.reserve_op(
                        fw,
                        agent_id,
                        &role,
                        &resources,
                        &offer_list,
                        &mut pool,
                        false,
                        out,
                    ) {
                        out.push(err(
                            conn,
                            ErrorKind::InvalidRequest,
                            format!("unreserve: {rejection}"),
                        ));
                    }
                }
            }
        }

        // 3. Settle the offers with the allocator as one accept: used parts stay, the unused
        //    parts return under one filter over their union.
        let parts: Vec<(OfferId, OfferResources)> = offers
            .iter()
            .map(|o| o.id)
            .zip(used.iter().cloned())
            .chain(
                foreign_role
                    .iter()
                    .map(|o| (o.id, OfferResources::default())),
            )
            .collect();
        if let Err(e) = self.allocator.accept_offers(&parts, refuse, now) {
            tracing::error!("allocator refused a validated accept: {e}");
        }

        // 4. Launch: single tasks one message each, a group as one message.
        for (task, allocation, gpus) in launches {
            let tid = task.task_id;
            self.record_launch(fw, agent_id, &role, &task, allocation, &gpus, now);
            out.push(Output::ToAgent(
                agent_conn,
                MasterToAgent::RunTask {
                    framework_id: fw,
                    task,
                    gpus,
                },
            ));
            self.staging_update(tid, fw, agent_id, now, out);
        }
        for (group_id, policy, members) in groups {
            let ids: Vec<TaskId> = members.iter().map(|(t, _, _)| t.task_id).collect();
            let mut wire = Vec::with_capacity(members.len());
            for (task, allocation, gpus) in members {
                self.record_launch(fw, agent_id, &role, &task, allocation, &gpus, now);
                wire.push(GroupMember { task, gpus });
            }
            out.push(Output::ToAgent(
                agent_conn,
                MasterToAgent::RunTaskGroup {
                    framework_id: fw,
                    group_id,
                    policy,
                    members: wire,
                },
            ));
            for tid in ids {
                self.staging_update(tid, fw, agent_id, now, out);
            }
        }
    }

    /// Records a launched task (its allocation, GPUs, owners) in STAGING.
    #[allow(clippy::too_many_arguments)]
    fn record_launch(
        &mut self,
        fw: FrameworkId,
        agent_id: AgentId,
        role: &str,
        task: &TaskInfo,
        allocation: OfferResources,
        gpus: &[String],
        now: Millis,
    ) {
        let tid = task.task_id;
        self.tasks.insert(
            tid,
            TaskRec {
                info: task.clone(),
                framework: fw,
                agent: agent_id,
                state: TaskState::Staging,
                allocation,
                recovered: false,
                pending: VecDeque::new(),
                acked: HashSet::new(),
                last_message: "launched".into(),
                usage: None,
                role: role.to_string(),
                gpus: gpus.to_vec(),
                ports: Vec::new(),
                reason: None,
                exit_code: None,
                signal: None,
                staged_at: now,
                started_at: None,
                ended_at: None,
                kill_reason: None,
            },
        );
        if let Some(f) = self.frameworks.get_mut(&fw) {
            f.tasks.insert(tid);
        }
        if let Some(a) = self.agents.get_mut(&agent_id) {
            a.tasks.insert(tid);
        }
        self.emit_task(tid);
    }

    /// The STAGING update of a task sent to its agent.
    fn staging_update(
        &mut self,
        tid: TaskId,
        fw: FrameworkId,
        agent_id: AgentId,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let staging = self.new_update(
            tid,
            fw,
            Some(agent_id),
            TaskState::Staging,
            "sent to agent".into(),
            now,
        );
        // Behind its held updates when the framework is behind (`pacing`).
        self.deliver_update(staging, out);
    }

    /// A member of a refused group: `ERROR`, reason `invalid-task`, with the group's one
    /// reason (which names the member at fault). Nothing of it was launched or charged.
    #[allow(clippy::too_many_arguments)]
    fn group_member_refused(
        &mut self,
        conn: ConnId,
        fw: FrameworkId,
        (agent, role): (Option<AgentId>, &str),
        task: &TaskInfo,
        reason: &str,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        if self.tasks.contains_key(&task.task_id) {
            // The id of a task the master runs: no update that would claim it ended.
            return;
        }
        self.refused(
            conn,
            fw,
            (agent, role),
            task,
            (TaskState::Error, TaskReason::InvalidTask),
            reason,
            now,
            out,
        );
    }

    /// Checks one task of an accept (id, form, user, GPU selector, GPUs, resources) and draws
    /// it from the accept's pool. `Err` gives the task back with the kind and the reason.
    fn admit_task(
        &mut self,
        mut task: TaskInfo,
        agent_id: AgentId,
        principal: &str,
        agent_user: &str,
        draft: &mut AcceptDraft<'_>,
    ) -> Result<Admitted, Refusal> {
        let tid = task.task_id;
        let invalid = if self.tasks.contains_key(&tid) || !draft.seen_ids.insert(tid) {
            Some(format!("task id {tid} is already in use"))
        } else {
            validate_task(&task).err().map(|e| e.to_string())
        };
        let invalid = invalid.or_else(|| {
            run_as::task_user(
                &self.config.acls,
                principal,
                &mut task.command.user,
                agent_user,
            )
            .err()
            .map(|e| format!("task {tid}: {e}"))
        });
        let invalid = invalid.or_else(|| {
            let sel = task.gpu_selector.as_ref()?;
            if let Some(bad) = sel.invalid() {
                return Some(format!("task {tid}: {bad}"));
            }
            let want = task.resources.gpu_amount().map(|a| a.gpu_count()).unwrap_or(0);
            if want == 0 {
                return Some(format!("task {tid}: a GPU selector needs gpus"));
            }
            let gpus = self.agents.get(&agent_id).map(|a| a.gpus.as_slice()).unwrap_or_default();
            let matching = gpus.iter().filter(|g| g.healthy && GpuSelector::admits(Some(sel), g)).count() as u64;
            (matching < want).then(|| {
                format!("task {tid}: the agent has {matching} healthy GPUs matching the selector ({sel}); the task asks for {want}")
            })
        });
        if let Some(reason) = invalid {
            return Err(Box::new((task, ErrorKind::InvalidTask, reason)));
        }
        // Per-GPU room (fractions share a GPU up to one whole GPU): the GPUs are chosen here,
        // a fraction's and whole ones (gpus.rs).
        let gpu_choice = if task.resources.gpu_amount() == Ok(GpuAmount::None) {
            Ok(Vec::new())
        } else {
            let ledger = draft.gpus.get_or_insert_with(|| self.gpu_ledger(agent_id));
            match self.choose_gpus(agent_id, &task, ledger) {
                // Nowhere the offers' earmarks leave it: where it would have run without them.
                Err(e) => match ledger.fallback.as_deref() {
                    Some(plain) => self.choose_gpus(agent_id, &task, plain).map_err(|_| e),
                    None => Err(e),
                },
                ok => ok,
            }
        };
        let chosen = match gpu_choice {
            Ok(c) => c,
            Err(reason) => return Err(Box::new((task, ErrorKind::InsufficientResources, reason))),
        };
        match draw(draft.pool, draft.used, &task.resources) {
            Some(alloc) => {
                if let (Some(ledger), Ok(amount)) =
                    (draft.gpus.as_mut(), task.resources.gpu_amount())
                {
                    for uuid in &chosen {
                        ledger.take(uuid, amount.per_gpu_milli());
                    }
                }
                Ok((task, alloc, chosen))
            }
            None => {
                let total: Resources = draft
                    .pool
                    .iter()
                    .fold(Resources::new(), |acc, p| acc.plus(&p.total()));
                let reason = format!(
                    "task {tid} needs {} but the offers have only {total} left",
                    task.resources
                );
                Err(Box::new((task, ErrorKind::InsufficientResources, reason)))
            }
        }
    }

    /// Ends every task of an accept that was not carried out because the lease lapsed:
    /// `ERROR` / `launch-failed` (the task never reached an agent; launching it again with
    /// the leader is safe).
    fn not_launched(
        &mut self,
        conn: ConnId,
        fw: FrameworkId,
        operations: &[Operation],
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        for op in operations {
            for task in op.tasks() {
                let mut update = self.new_update(
                    task.task_id,
                    fw,
                    None,
                    TaskState::Error,
                    format!(
                        "task {} not launched: this master's leadership lease has lapsed",
                        task.task_id
                    ),
                    now,
                );
                update.reason = Some(TaskReason::LaunchFailed);
                out.push(Output::ToFramework(conn, MasterToFramework::Update(update)));
            }
        }
    }

    /// Applies a RESERVE (or UNRESERVE) operation to the accept's pool and the allocator.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reserve_op(
        &mut self,
        fw: FrameworkId,
        agent: AgentId,
        role: &str,
        resources: &Resources,
        offer_ids: &[OfferId],
        pool: &mut [OfferResources],
        reserve: bool,
        out: &mut Vec<Output>,
    ) -> Result<(), ReservationRejection> {
        let roles = self
            .frameworks
            .get(&fw)
            .map(|f| f.roles.clone())
            .unwrap_or_default();
        if !roles
            .iter()
            .any(|r| r == role || role.starts_with(&format!("{r}/")))
        {
            return Err(ReservationRejection::NotFrameworkRole(role.to_string()));
        }
        if resources.is_empty() {
            return Err(ReservationRejection::NoResources);
        }
        if !reserve {
            let dynamic = self.agents.get(&agent).and_then(|a| a.dynamic.get(role));
            if !dynamic.is_some_and(|d| d.contains(resources)) {
                return Err(ReservationRejection::NotDynamicallyReserved {
                    resources: resources.clone(),
                    role: role.to_string(),
                });
            }
        }
        // Find one offer in the pool that holds the source resources.
        for (i, p) in pool.iter_mut().enumerate() {
            let fits = if reserve {
                p.unreserved.contains(resources)
            } else {
                p.reserved.get(role).is_some_and(|r| r.contains(resources))
            };
            if !fits {
                continue;
            }
            let result = if reserve {
                self.allocator.reserve(offer_ids[i], role, resources)
            } else {
                self.allocator.unreserve(offer_ids[i], role, resources)
            };
            result?;
            if reserve {
                p.unreserved.checked_sub_assign(resources);
                p.reserved
                    .entry(role.to_string())
                    .or_default()
                    .add_assign(resources);
            } else {
                if let Some(r) = p.reserved.get_mut(role) {
                    r.checked_sub_assign(resources);
                    if r.is_empty() {
                        p.reserved.remove(role);
                    }
                }
                p.unreserved.add_assign(resources);
            }
            if let Some(a) = self.agents.get_mut(&agent) {
                a.apply_reservation(role, resources, reserve);
                let now_reserved = a.dynamic.get(role).cloned().unwrap_or_default();
                out.push(Output::Persist(Mutation::SetReservation(Reservation {
                    agent_id: agent,
                    role: role.to_string(),
                    resources: now_reserved,
                })));
            }
            self.send_agent_summary(agent, out);
            if !reserve {
                self.forget_role(role);
            }
            return Ok(());
        }
        Err(ReservationRejection::NotInOffers {
            resources: resources.clone(),
            reserve,
        })
    }
}

/// The longest filter a framework can set: a `refuse_seconds` past it is "forever" (Mesos
/// caps filters at a year too).
pub const FOREVER_MS: Millis = 365 * 86_400 * 1000;

/// A `refuse_seconds` that is not a duration.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("refuse_seconds {0} is not a non-negative number")]
pub struct BadRefuseSeconds(pub f64);

/// A filter duration in milliseconds (`None`: the allocator's default), capped at
/// [`FOREVER_MS`].
pub(super) fn refuse_ms(refuse_seconds: Option<f64>) -> Result<Option<Millis>, BadRefuseSeconds> {
    match refuse_seconds {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => {
            Ok(Some((s.min((FOREVER_MS / 1000) as f64) * 1000.0) as Millis))
        }
        Some(s) => Err(BadRefuseSeconds(s)),
    }
}

/// Why a task is invalid on its own (before looking at offers), if it is.
pub(super) fn validate_task(task: &TaskInfo) -> Result<(), TaskRejection> {
    let tid = task.task_id;
    if task.name.is_empty() || task.name.len() > 256 {
        return Err(TaskRejection::Name(tid));
    }
    // In a container an empty shell command runs the image's entrypoint (and cmd).
    let image_entrypoint = task.container.is_some()
        && matches!(&task.command.program, gantry_proto::Program::Shell(s) if s.trim().is_empty());
    let problem = if image_entrypoint {
        let mut c = task.command.clone();
        c.program = gantry_proto::Program::Shell("true".into());
        c.problem()
    } else {
        task.command.problem()
    };
    if let Some(problem) = problem {
        return Err(TaskRejection::Command { task: tid, problem });
    }
    if task.resources.milli("cpus") == 0 && task.resources.milli("mem") == 0 {
        return Err(TaskRejection::NoCpusOrMem(tid));
    }
    if let Err(e) = task.resources.gpu_amount() {
        return Err(TaskRejection::FractionalGpus(tid, e));
    }
    if !task
        .resources
        .milli("ports")
        .is_multiple_of(gantry_proto::resources::MILLI)
    {
        return Err(TaskRejection::FractionalPorts(tid));
    }
    if task
        .env
        .keys()
        .any(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
        || task.env.values().any(|v| v.contains('\0'))
    {
        return Err(TaskRejection::Environment(tid));
    }
    if let Some(problem) = task.container.as_ref().and_then(|c| c.problem()) {
        return Err(TaskRejection::Container { task: tid, problem });
    }
    Ok(())
}

/// Takes `need` out of the pool of offers (each with [`OfferResources::carve`]: reserved parts
/// first, then unreserved), recording per-offer use. Returns what the task holds, or `None` (pool untouched) if it does not fit.
pub(super) fn draw(
    pool: &mut [OfferResources],
    used: &mut [OfferResources],
    need: &Resources,
) -> Option<OfferResources> {
    let total = pool
        .iter()
        .fold(Resources::new(), |acc, p| acc.plus(&p.total()));
    if !total.contains(need) {
        return None;
    }
    let mut remaining = need.clone();
    let mut holding = OfferResources::default();
    for (p, u) in pool.iter_mut().zip(used.iter_mut()) {
        let taken = p.carve(&mut remaining);
        u.add_assign(&taken);
        holding.add_assign(&taken);
        if remaining.is_empty() {
            break;
        }
    }
    Some(holding)
}

/// A task of an accept that passed its checks: the task, what it holds of the offers, its GPUs.
type Admitted = (TaskInfo, OfferResources, Vec<String>);

/// A task of an accept refused: the task, the kind of error and the reason.
type Refusal = Box<(TaskInfo, ErrorKind, String)>;

/// What an accept has drawn so far: the pool of offered resources left, what each offer gave,
/// the GPU ledger (once a task asks for GPUs) and the task ids used.
struct AcceptDraft<'a> {
    pool: &'a mut Vec<OfferResources>,
    used: &'a mut Vec<OfferResources>,
    gpus: &'a mut Option<super::gpus::GpuLedger>,
    seen_ids: &'a mut HashSet<TaskId>,
}
