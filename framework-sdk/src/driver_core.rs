//! The driver's decision logic (pure, as the master's and the allocator's are): the
//! [`Driver`](crate::Driver)'s async shell reads the connection, the handle's requests and the
//! clock, hands each input with the time to [`DriverCore`], and carries out the [`Effect`]s it
//! returns in order (frames to the master, calls of the scheduler, the end of the run). No
//! socket, task or clock here, so every rule is unit-tested directly:
//!
//! - **Deduplication**: an update seen before (by `update_id`, the last [`SeenUpdates::CAP`])
//!   reaches the scheduler once; reconciliation answers always do; under explicit acks every
//!   (re)delivery does.
//! - **Acknowledgements**: implicit (after the update's callback, so it leaves after the
//!   scheduler had it) unless explicit; never for reconciliation answers.
//! - **Kill retries** ([`Kills`]): a kill not answered by a terminal update is sent again
//!   after every subscription and every [`KILL_RETRY`], at most [`KILL_ATTEMPTS`] times.
//! - **Requests while disconnected**: offer replies are void (the master rescinds a
//!   disconnected framework's offers), kills join the retries, the rest is sent after the
//!   next subscription, in order; the roles last suppressed ride on the next subscription.
//! - **Reconciliation** ([`Reconciler`]) on subscription and periodically, while subscribed.
//! - **Timers** and the framework's own events: delivered as [`Event::Wake`], connected or
//!   not.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::protocol::*;
use crate::reconcile::{ReconcileConfig, Reconciler};
use crate::timers::{TimerId, Timers};

/// A request from a [`DriverHandle`](crate::DriverHandle).
#[derive(Debug)]
pub(crate) enum Command {
    Send(FrameworkToMaster),
    Stop {
        teardown: bool,
    },
    /// Set (or reset) a timer.
    Timer {
        id: TimerId,
        at: Instant,
        token: u64,
        every: Option<Duration>,
    },
    CancelTimer(TimerId),
    /// The framework's own event: [`Scheduler::wake`](crate::Scheduler::wake) with this token.
    Notify(u64),
}

/// A call of the scheduler.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Event {
    Registered(FrameworkId),
    Offers(Vec<Offer>),
    Rescinded(OfferId),
    Update(StatusUpdate),
    Error(ErrorKind, String),
    Drain(DrainNotice),
    Volume(VolumeDestroyed),
    AgentRemoved(AgentRemoved),
    Agents(Vec<AgentSummary>),
    Disconnected,
    Wake(u64),
}

/// What the shell does, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Effect {
    /// Send this to the master (in this turn's write).
    Send(FrameworkToMaster),
    /// Call the scheduler.
    Deliver(Event),
    /// End the run (after what is queued), tearing the framework down or not.
    Stop { teardown: bool },
    /// The master refused the subscription: the run ends with this error.
    Refused(String),
}

/// The driver's state between inputs: see the module documentation.
pub(crate) struct DriverCore {
    /// What the next subscription carries (its `suppressed_roles` kept up to date).
    info: FrameworkInfo,
    explicit_acks: bool,
    subscribed: bool,
    seen: SeenUpdates,
    kills: Kills,
    timers: Timers,
    reconciler: Reconciler,
    /// Requests made while disconnected, sent after the next subscription.
    pending: Vec<FrameworkToMaster>,
}

impl DriverCore {
    pub(crate) fn new(
        info: FrameworkInfo,
        explicit_acks: bool,
        reconcile: ReconcileConfig,
    ) -> Self {
        Self {
            info,
            explicit_acks,
            subscribed: false,
            seen: SeenUpdates::new(),
            kills: Kills::default(),
            timers: Timers::default(),
            reconciler: Reconciler::new(reconcile),
            pending: Vec::new(),
        }
    }

    /// The subscription to send, as `framework_id` when it has one.
    pub(crate) fn subscription(&self, framework_id: Option<FrameworkId>) -> FrameworkInfo {
        FrameworkInfo {
            framework_id,
            ..self.info.clone()
        }
    }

    /// Whether the master answered the current connection's subscription.
    pub(crate) fn is_subscribed(&self) -> bool {
        self.subscribed
    }

    /// The connection ended (or a new one starts): the scheduler hears of it if it was
    /// subscribed; nothing is due to the master until the next subscription.
    pub(crate) fn disconnected(&mut self) -> Vec<Effect> {
        self.reconciler.disconnected();
        if std::mem::take(&mut self.subscribed) {
            vec![Effect::Deliver(Event::Disconnected)]
        } else {
            Vec::new()
        }
    }

    /// A message from the master at `now`.
    pub(crate) fn message(&mut self, msg: MasterToFramework, now: Instant) -> Vec<Effect> {
        match msg {
            MasterToFramework::Subscribed { framework_id, .. } => {
                self.subscribed = true;
                let kills = self.kills.due(now, true).into_iter();
                let mut out: Vec<Effect> = std::mem::take(&mut self.pending)
                    .into_iter()
                    .chain(kills)
                    .map(Effect::Send)
                    .collect();
                if self.reconciler.subscribed(now.into_std()) {
                    out.push(reconcile_all());
                }
                out.push(Effect::Deliver(Event::Registered(framework_id)));
                out
            }
            MasterToFramework::Offers(offers) => vec![Effect::Deliver(Event::Offers(offers))],
            MasterToFramework::Rescind { offer_id } => {
                vec![Effect::Deliver(Event::Rescinded(offer_id))]
            }
            MasterToFramework::Update(update) => {
                if update.state.is_terminal() {
                    self.kills.ended(update.task_id);
                }
                let explicit = self.explicit_acks;
                let ack = (!update.reconciliation && !explicit).then_some(Effect::Send(
                    FrameworkToMaster::Acknowledge {
                        task_id: update.task_id,
                        update_id: update.update_id,
                    },
                ));
                let deliver =
                    self.seen.insert(update.update_id) || update.reconciliation || explicit;
                let mut out = Vec::with_capacity(2);
                if deliver {
                    out.push(Effect::Deliver(Event::Update(update)));
                }
                out.extend(ack);
                out
            }
            MasterToFramework::Error { kind, message } => {
                if self.subscribed {
                    vec![Effect::Deliver(Event::Error(kind, message))]
                } else {
                    vec![Effect::Refused(message)]
                }
            }
            MasterToFramework::Heartbeat => Vec::new(),
            MasterToFramework::DrainNotice(notice) => vec![Effect::Deliver(Event::Drain(notice))],
            MasterToFramework::VolumeDestroyed(v) => vec![Effect::Deliver(Event::Volume(v))],
            MasterToFramework::AgentRemoved(a) => vec![Effect::Deliver(Event::AgentRemoved(a))],
            MasterToFramework::Agents(a) => vec![Effect::Deliver(Event::Agents(a))],
        }
    }

    /// A request from the handle at `now`. While disconnected: offer replies are dropped,
    /// kills wait for the next subscription with the other retries, the rest is queued.
    pub(crate) fn command(&mut self, cmd: Command, now: Instant) -> Vec<Effect> {
        match cmd {
            Command::Send(msg) => {
                self.note_suppression(&msg);
                let kill = match msg {
                    FrameworkToMaster::Kill { task_id } => Some((task_id, None)),
                    FrameworkToMaster::KillFor { task_id, reason } => Some((task_id, Some(reason))),
                    _ => None,
                };
                if let Some((task_id, reason)) = kill {
                    self.kills.asked(task_id, reason, now);
                    if !self.subscribed {
                        return Vec::new();
                    }
                }
                if self.subscribed {
                    return vec![Effect::Send(msg)];
                }
                if !matches!(
                    msg,
                    FrameworkToMaster::Accept { .. } | FrameworkToMaster::Decline { .. }
                ) {
                    self.pending.push(msg);
                }
                Vec::new()
            }
            Command::Stop { teardown } => vec![Effect::Stop { teardown }],
            Command::Timer {
                id,
                at,
                token,
                every,
            } => {
                self.timers.add(id, at, token, every);
                Vec::new()
            }
            Command::CancelTimer(id) => {
                self.timers.cancel(id);
                Vec::new()
            }
            Command::Notify(token) => vec![Effect::Deliver(Event::Wake(token))],
        }
    }

    /// When [`DriverCore::due`] next has something to do.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        let mut next = self.timers.next_due();
        if self.subscribed {
            let reconcile = self.reconciler.next_due().map(Instant::from_std);
            for t in [self.kills.next_due(), reconcile].into_iter().flatten() {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        next
    }

    /// What is due at `now`: timers (always), kill retries and periodic reconciliation (while
    /// subscribed).
    pub(crate) fn due(&mut self, now: Instant) -> Vec<Effect> {
        let mut out: Vec<Effect> = self
            .timers
            .due(now)
            .into_iter()
            .map(|token| Effect::Deliver(Event::Wake(token)))
            .collect();
        if self.subscribed {
            let kills = self.kills.due(now, false).into_iter();
            out.extend(kills.map(Effect::Send));
            if self.reconciler.poll(now.into_std()) {
                out.push(reconcile_all());
            }
        }
        out
    }

    /// Keeps the roles last suppressed, which the next subscription carries
    /// (`FrameworkInfo::suppressed_roles`): a framework that suppressed its offers and lost its
    /// connection is not offered everything again when it re-subscribes.
    fn note_suppression(&mut self, msg: &FrameworkToMaster) {
        let info = &mut self.info;
        match msg {
            FrameworkToMaster::Suppress { roles } => {
                let roles = if roles.is_empty() {
                    info.roles.clone()
                } else {
                    roles.clone()
                };
                for r in roles {
                    if info.roles.contains(&r) && !info.suppressed_roles.contains(&r) {
                        info.suppressed_roles.push(r);
                    }
                }
            }
            FrameworkToMaster::Revive { roles } if roles.is_empty() => {
                info.suppressed_roles.clear();
            }
            FrameworkToMaster::Revive { roles } => {
                info.suppressed_roles.retain(|r| !roles.contains(r));
            }
            _ => {}
        }
    }
}

/// An implicit reconciliation (every task of ours).
fn reconcile_all() -> Effect {
    Effect::Send(FrameworkToMaster::Reconcile {
        task_ids: Vec::new(),
    })
}

/// Remembers recently seen update ids so a redelivered update reaches the scheduler once.
pub(crate) struct SeenUpdates {
    set: HashSet<UpdateId>,
    order: VecDeque<UpdateId>,
}

impl SeenUpdates {
    pub(crate) const CAP: usize = 65_536;
    fn new() -> Self {
        Self {
            set: HashSet::new(),
            order: VecDeque::new(),
        }
    }
    /// True if `id` was not seen before.
    fn insert(&mut self, id: UpdateId) -> bool {
        if !self.set.insert(id) {
            return false;
        }
        self.order.push_back(id);
        if self.order.len() > Self::CAP {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        true
    }
}

/// The kill of `task_id`, with the reason it was asked with (`KillFor`) or without (`Kill`).
fn kill_message(task_id: TaskId, reason: Option<TaskReason>) -> FrameworkToMaster {
    match reason {
        Some(reason) => FrameworkToMaster::KillFor { task_id, reason },
        None => FrameworkToMaster::Kill { task_id },
    }
}

/// Kills asked for and not yet answered by a terminal update. A kill can be lost with a
/// connection (sent to a master that died before it read it, or to one that does not know the
/// task yet after a restart); as Mesos expects of its frameworks, the driver sends each again
/// after every subscription and every [`KILL_RETRY`] until the task's terminal update arrives,
/// at most [`KILL_ATTEMPTS`] times.
#[derive(Default)]
pub(crate) struct Kills {
    /// Task → when its kill was last sent, how many times, and the reason it was asked with
    /// (`FrameworkToMaster::KillFor`; `None`: a plain `Kill`).
    sent: HashMap<TaskId, (Instant, u32, Option<TaskReason>)>,
}

/// How often an unanswered kill is sent again.
pub const KILL_RETRY: Duration = Duration::from_secs(5);
/// How many times one kill is sent at most (a task nobody knows is not asked about forever).
pub const KILL_ATTEMPTS: u32 = 24;

impl Kills {
    /// At most this many kills are retried (beyond, a kill is sent once).
    const CAP: usize = 65_536;
    fn asked(&mut self, task_id: TaskId, reason: Option<TaskReason>, now: Instant) {
        if self.sent.len() < Self::CAP || self.sent.contains_key(&task_id) {
            self.sent.insert(task_id, (now, 1, reason));
        }
    }
    fn ended(&mut self, task_id: TaskId) {
        self.sent.remove(&task_id);
    }
    /// When the next retry is due.
    fn next_due(&self) -> Option<Instant> {
        self.sent.values().map(|(t, _, _)| *t + KILL_RETRY).min()
    }
    /// The kills due at `now` (all of them with `all`), marked sent; those sent
    /// [`KILL_ATTEMPTS`] times are given up.
    fn due(&mut self, now: Instant, all: bool) -> Vec<FrameworkToMaster> {
        let mut out = Vec::new();
        self.sent.retain(|id, (at, n, reason)| {
            if !all && *at + KILL_RETRY > now {
                return true;
            }
            if *n >= KILL_ATTEMPTS {
                tracing::warn!(task = %id, "kill not answered after {n} attempts; giving up");
                return false;
            }
            *at = now;
            *n += 1;
            out.push(kill_message(*id, *reason));
            true
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> FrameworkInfo {
        FrameworkInfo {
            framework_id: None,
            name: "fw".into(),
            roles: vec!["a".into(), "b".into()],
            capabilities: Vec::new(),
            failover_timeout_secs: 60.0,
            min_allocatable: Vec::new(),
            suppressed_roles: Vec::new(),
        }
    }

    fn core(explicit_acks: bool, reconcile: ReconcileConfig) -> DriverCore {
        DriverCore::new(info(), explicit_acks, reconcile)
    }

    fn subscribed(fw: FrameworkId) -> MasterToFramework {
        MasterToFramework::Subscribed {
            framework_id: fw,
            epoch: 1,
            heartbeat_interval_ms: 60_000,
        }
    }

    fn ack(u: &StatusUpdate) -> Effect {
        Effect::Send(FrameworkToMaster::Acknowledge {
            task_id: u.task_id,
            update_id: u.update_id,
        })
    }

    fn send(msg: FrameworkToMaster) -> Command {
        Command::Send(msg)
    }

    fn kill(task_id: TaskId) -> FrameworkToMaster {
        FrameworkToMaster::Kill { task_id }
    }

    #[test]
    fn implicit_acks_follow_the_callback_and_duplicates_reach_the_scheduler_once() {
        let t = Instant::now();
        let fw = FrameworkId::random();
        let mut c = core(false, ReconcileConfig::default());
        assert_eq!(
            c.message(subscribed(fw), t),
            vec![Effect::Deliver(Event::Registered(fw))]
        );
        let u = StatusUpdate::new(TaskId::random(), fw, TaskState::Running);
        // Delivered, then acknowledged (after the callback returned).
        assert_eq!(
            c.message(MasterToFramework::Update(u.clone()), t),
            vec![Effect::Deliver(Event::Update(u.clone())), ack(&u)]
        );
        // Redelivered (the ack was lost): acknowledged again, not delivered again.
        assert_eq!(
            c.message(MasterToFramework::Update(u.clone()), t),
            vec![ack(&u)]
        );
        // A reconciliation answer is always delivered and never acknowledged.
        let r = StatusUpdate {
            reconciliation: true,
            ..u.clone()
        };
        for _ in 0..2 {
            assert_eq!(
                c.message(MasterToFramework::Update(r.clone()), t),
                vec![Effect::Deliver(Event::Update(r.clone()))]
            );
        }
        assert!(c.message(MasterToFramework::Heartbeat, t).is_empty());
    }

    #[test]
    fn explicit_acks_deliver_every_redelivery_and_send_only_what_the_scheduler_acks() {
        let t = Instant::now();
        let fw = FrameworkId::random();
        let mut c = core(true, ReconcileConfig::default());
        c.message(subscribed(fw), t);
        let u = StatusUpdate::new(TaskId::random(), fw, TaskState::Finished);
        for _ in 0..2 {
            assert_eq!(
                c.message(MasterToFramework::Update(u.clone()), t),
                vec![Effect::Deliver(Event::Update(u.clone()))]
            );
        }
        let a = FrameworkToMaster::Acknowledge {
            task_id: u.task_id,
            update_id: u.update_id,
        };
        assert_eq!(c.command(send(a.clone()), t), vec![Effect::Send(a)]);
    }

    #[test]
    fn seen_updates_deduplicate_and_stay_bounded() {
        let mut s = SeenUpdates::new();
        let a = UpdateId::random();
        assert!(s.insert(a));
        assert!(!s.insert(a));
        for _ in 0..SeenUpdates::CAP {
            s.insert(UpdateId::random());
        }
        assert!(s.set.len() <= SeenUpdates::CAP);
        assert!(s.insert(a), "oldest ids are forgotten");
    }

    #[test]
    fn kills_are_retried_until_a_terminal_update_and_after_each_subscription() {
        let t0 = Instant::now();
        let fw = FrameworkId::random();
        let mut c = core(false, ReconcileConfig::default());
        c.message(subscribed(fw), t0);
        let (a, b) = (TaskId::random(), TaskId::random());
        assert_eq!(c.command(send(kill(a)), t0), vec![Effect::Send(kill(a))]);
        assert_eq!(c.next_due(), Some(t0 + KILL_RETRY));
        assert!(c.due(t0 + KILL_RETRY / 2).is_empty());
        assert_eq!(c.due(t0 + KILL_RETRY), vec![Effect::Send(kill(a))]);
        // The connection drops: a kill asked meanwhile is not sent, nor retried...
        assert_eq!(c.disconnected(), vec![Effect::Deliver(Event::Disconnected)]);
        assert!(c.command(send(kill(b)), t0 + KILL_RETRY).is_empty());
        assert_eq!(c.next_due(), None);
        assert!(c.due(t0 + KILL_RETRY * 10).is_empty());
        // ...until the next subscription, which sends every kill unanswered, then `registered`.
        let mut effects = c.message(subscribed(fw), t0 + KILL_RETRY * 10);
        assert_eq!(effects.pop(), Some(Effect::Deliver(Event::Registered(fw))));
        let mut sent: Vec<Effect> = effects;
        sent.sort_by_key(|e| format!("{e:?}"));
        let mut want = vec![Effect::Send(kill(a)), Effect::Send(kill(b))];
        want.sort_by_key(|e| format!("{e:?}"));
        assert_eq!(sent, want);
        // a's terminal update answers it; b is retried until KILL_ATTEMPTS, then given up.
        let done = StatusUpdate::new(a, fw, TaskState::Killed);
        c.message(MasterToFramework::Update(done), t0);
        let mut now = t0 + KILL_RETRY * 10;
        let mut sends = 2; // b: asked (held), then sent on the re-subscription
        loop {
            now += KILL_RETRY;
            let due = c.due(now);
            if due.is_empty() {
                break;
            }
            assert_eq!(due, vec![Effect::Send(kill(b))]);
            sends += 1;
        }
        assert_eq!(sends, KILL_ATTEMPTS, "b is sent KILL_ATTEMPTS times");
        assert_eq!(c.next_due(), None);
    }

    #[test]
    fn a_kill_with_a_reason_is_retried_with_that_reason() {
        let t0 = Instant::now();
        let fw = FrameworkId::random();
        let mut c = core(false, ReconcileConfig::default());
        c.message(subscribed(fw), t0);
        let a = TaskId::random();
        let why = FrameworkToMaster::KillFor {
            task_id: a,
            reason: TaskReason::Preempted,
        };
        assert_eq!(
            c.command(send(why.clone()), t0),
            vec![Effect::Send(why.clone())]
        );
        assert_eq!(c.due(t0 + KILL_RETRY), vec![Effect::Send(why.clone())]);
        // A new subscription sends it again, reason and all, then `registered`.
        c.disconnected();
        let effects = c.message(subscribed(fw), t0 + KILL_RETRY * 2);
        assert_eq!(effects[0], Effect::Send(why));
        // Its terminal update answers it.
        c.message(
            MasterToFramework::Update(StatusUpdate::new(a, fw, TaskState::Killed)),
            t0,
        );
        assert_eq!(c.next_due(), None);
    }

    #[test]
    fn requests_made_while_disconnected_wait_for_the_next_subscription_offer_replies_do_not() {
        let t = Instant::now();
        let fw = FrameworkId::random();
        let mut c = core(false, ReconcileConfig::default());
        // Before the first subscription: nothing reaches the master yet.
        let accept = FrameworkToMaster::Accept {
            offer_ids: vec![OfferId::random()],
            operations: Vec::new(),
            refuse_seconds: None,
        };
        let decline = FrameworkToMaster::Decline {
            offer_ids: vec![OfferId::random()],
            refuse_seconds: None,
        };
        let suppress = FrameworkToMaster::Suppress {
            roles: vec!["b".into()],
        };
        let reconcile = FrameworkToMaster::Reconcile {
            task_ids: Vec::new(),
        };
        for msg in [accept, suppress.clone(), decline, reconcile.clone()] {
            assert!(c.command(send(msg), t).is_empty());
        }
        // The subscription carries the suppressed role; the held requests go first.
        assert_eq!(c.subscription(Some(fw)).suppressed_roles, ["b"]);
        assert_eq!(c.subscription(Some(fw)).framework_id, Some(fw));
        assert_eq!(
            c.message(subscribed(fw), t),
            vec![
                Effect::Send(suppress),
                Effect::Send(reconcile),
                Effect::Deliver(Event::Registered(fw)),
            ]
        );
        // Reviving every role clears it for the next subscription.
        let revive = FrameworkToMaster::Revive { roles: Vec::new() };
        assert_eq!(
            c.command(send(revive.clone()), t),
            vec![Effect::Send(revive)]
        );
        assert!(c.subscription(None).suppressed_roles.is_empty());
        // Suppressing all roles names each; an unknown role is not kept.
        let all = FrameworkToMaster::Suppress { roles: Vec::new() };
        c.command(send(all), t);
        let odd = FrameworkToMaster::Suppress {
            roles: vec!["zz".into()],
        };
        c.command(send(odd), t);
        assert_eq!(c.subscription(None).suppressed_roles, ["a", "b"]);
        // Stop is honoured connected or not.
        assert_eq!(
            c.command(Command::Stop { teardown: true }, t),
            vec![Effect::Stop { teardown: true }]
        );
    }

    #[test]
    fn reconciliation_on_subscription_and_periodically_only_while_subscribed() {
        let t = Instant::now();
        let fw = FrameworkId::random();
        let every = Duration::from_secs(600);
        let mut c = core(false, ReconcileConfig::periodic(every));
        let reconcile = Effect::Send(FrameworkToMaster::Reconcile {
            task_ids: Vec::new(),
        });
        assert_eq!(c.next_due(), None);
        assert_eq!(
            c.message(subscribed(fw), t),
            vec![reconcile.clone(), Effect::Deliver(Event::Registered(fw))]
        );
        assert_eq!(c.next_due(), Some(t + every));
        assert!(c.due(t + every / 2).is_empty());
        assert_eq!(c.due(t + every), vec![reconcile]);
        c.disconnected();
        assert_eq!(c.next_due(), None);
        assert!(c.due(t + every * 5).is_empty());
        // Off by default.
        let mut off = core(false, ReconcileConfig::default());
        assert_eq!(
            off.message(subscribed(fw), t),
            vec![Effect::Deliver(Event::Registered(fw))]
        );
        assert_eq!(off.next_due(), None);
    }

    #[test]
    fn timers_and_notifications_wake_the_scheduler_connected_or_not() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let mut c = core(false, ReconcileConfig::default());
        let timer = |id: u64, after: u64, token: u64, every: Option<Duration>| Command::Timer {
            id: TimerId(id),
            at: t + ms(after),
            token,
            every,
        };
        assert!(c.command(timer(1, 10, 7, None), t).is_empty());
        assert!(c.command(timer(2, 20, 8, Some(ms(20))), t).is_empty());
        assert!(c.command(timer(3, 5, 9, None), t).is_empty());
        assert!(c.command(Command::CancelTimer(TimerId(3)), t).is_empty());
        assert_eq!(c.next_due(), Some(t + ms(10)));
        assert_eq!(c.due(t + ms(10)), vec![Effect::Deliver(Event::Wake(7))]);
        assert_eq!(c.due(t + ms(20)), vec![Effect::Deliver(Event::Wake(8))]);
        assert_eq!(c.next_due(), Some(t + ms(40)));
        assert_eq!(
            c.command(Command::Notify(42), t),
            vec![Effect::Deliver(Event::Wake(42))]
        );
    }

    #[test]
    fn an_error_before_the_subscription_is_a_refusal_after_it_the_schedulers() {
        let t = Instant::now();
        let fw = FrameworkId::random();
        let mut c = core(false, ReconcileConfig::default());
        let error = || MasterToFramework::Error {
            kind: ErrorKind::InvalidRequest,
            message: "no".into(),
        };
        assert_eq!(c.message(error(), t), vec![Effect::Refused("no".into())]);
        // No subscription, no `disconnected` callback.
        assert!(c.disconnected().is_empty());
        c.message(subscribed(fw), t);
        assert_eq!(
            c.message(error(), t),
            vec![Effect::Deliver(Event::Error(
                ErrorKind::InvalidRequest,
                "no".into()
            ))]
        );
        let offers = vec![];
        assert_eq!(
            c.message(MasterToFramework::Offers(offers), t),
            vec![Effect::Deliver(Event::Offers(Vec::new()))]
        );
        let offer_id = OfferId::random();
        assert_eq!(
            c.message(MasterToFramework::Rescind { offer_id }, t),
            vec![Effect::Deliver(Event::Rescinded(offer_id))]
        );
    }
}
