//! Placement requests (pure): several task shapes placed together, all or nothing, each with
//! a [`Rule`] for how its copies sit across agents.
//!
//! - [`Rule::Any`]: each copy on its best agent ([`place_one`]'s scoring), as [`place_all`](crate::offers::place_all).
//! - [`Rule::StrictPack`]: every copy of the shape on one agent, or the request fails (a gang
//!   that talks over shared memory or NVLink). Among the agents that can host them all, the
//!   one the first copy scores best on.
//! - [`Rule::Spread`]: at most `max_per_domain` copies per failure domain, the domain being the
//!   agent ([`Domain::Agent`]) or the value of one of its attributes ([`Domain::Attribute`],
//!   e.g. `rack`; an agent without the attribute hosts none of the shape's copies). Copies go
//!   to the domain holding the fewest of them so far, then to the best agent there.
//!
//! [`place_request`] places the shapes of a [`PlacementRequest`] together: strict packs
//! first (the hardest to satisfy), then spreads, then the rest, larger shapes first within
//! each; each copy is taken out of the agents before the next is placed, so nothing is
//! promised twice. The result is a [`RequestPlan`] with an assignment per copy, or a
//! [`RequestError`] naming the shape that did not fit, and then the agents are unchanged.
//! Placement is greedy (no backtracking): a request it refuses may fit in a way it did not
//! try, but one it accepts always fits.
//!
//! ```
//! use gantry_placement::offers::{AgentView, TaskRequest};
//! use gantry_placement::request::{place_request, Domain, PlacementRequest, Rule};
//!
//! let agent = |name: &str, rack: &str| AgentView {
//!     agent_id: gantry_proto::AgentId::random(),
//!     hostname: name.into(),
//!     offer_ids: vec![gantry_proto::OfferId::random()],
//!     resources: "cpus:8;mem:8192".parse().unwrap(),
//!     attributes: [("rack".to_string(), rack.to_string())].into(),
//!     gpus: Vec::new(),
//! };
//! let mut agents = vec![agent("a", "r1"), agent("b", "r1"), agent("c", "r2")];
//! let request = PlacementRequest::new()
//!     // Two replicas in different racks...
//!     .shape(TaskRequest::new("cpus:1;mem:512".parse().unwrap()), 2, Rule::spread_over("rack"))
//!     // ...and a pair of workers sharing one agent.
//!     .shape(TaskRequest::new("cpus:4;mem:1024".parse().unwrap()), 2, Rule::StrictPack);
//! let plan = place_request(&mut agents, &request).unwrap();
//! let racks: Vec<&str> = plan
//!     .of_shape(0)
//!     .map(|a| agents[a.agent].attributes["rack"].as_str())
//!     .collect();
//! assert_ne!(racks[0], racks[1]);
//! let packed: Vec<usize> = plan.of_shape(1).map(|a| a.agent).collect();
//! assert_eq!(packed[0], packed[1]);
//! ```

use std::collections::BTreeMap;

use super::offers::{evaluate, place_one, take, AgentView, Candidate, TaskRequest};
use gantry_proto::resources::MILLI;

/// What a spread counts copies per.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Domain {
    /// Each agent is its own domain.
    Agent,
    /// Agents with the same value of this attribute (e.g. `rack`, `zone`) form a domain;
    /// agents without it are not used.
    Attribute(String),
}

/// How the copies of one shape sit across agents.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum Rule {
    /// Each copy on its best agent.
    #[default]
    Any,
    /// Every copy on one agent, or none.
    StrictPack,
    /// At most `max_per_domain` copies (at least 1) per domain.
    Spread {
        /// What a domain is.
        domain: Domain,
        /// Copies allowed per domain.
        max_per_domain: u32,
    },
}

impl Rule {
    /// One copy per agent.
    pub fn one_per_agent() -> Self {
        Rule::Spread {
            domain: Domain::Agent,
            max_per_domain: 1,
        }
    }

    /// One copy per value of the attribute `key` (e.g. one per rack).
    pub fn spread_over(key: impl Into<String>) -> Self {
        Rule::Spread {
            domain: Domain::Attribute(key.into()),
            max_per_domain: 1,
        }
    }

    /// Order of placement: strict packs, then spreads, then the rest.
    fn rank(&self) -> u8 {
        match self {
            Rule::StrictPack => 0,
            Rule::Spread { .. } => 1,
            Rule::Any => 2,
        }
    }
}

/// `count` copies of one task shape, placed by `rule`.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeRequest {
    /// What each copy asks for.
    pub task: TaskRequest,
    /// How many copies.
    pub count: u32,
    /// How they sit across agents.
    pub rule: Rule,
}

/// Shapes placed together, all or nothing.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PlacementRequest {
    /// The shapes, in the caller's order (assignments name them by index).
    pub shapes: Vec<ShapeRequest>,
}

impl PlacementRequest {
    /// An empty request.
    pub fn new() -> Self {
        Self::default()
    }

    /// One more shape: `count` copies of `task` placed by `rule`.
    pub fn shape(mut self, task: TaskRequest, count: u32, rule: Rule) -> Self {
        self.shapes.push(ShapeRequest { task, count, rule });
        self
    }
}

/// Where one copy goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeAssignment {
    /// Index of the shape in [`PlacementRequest::shapes`].
    pub shape: usize,
    /// Which copy of the shape (`0..count`).
    pub copy: u32,
    /// Index of the agent in the view list.
    pub agent: usize,
    /// The GPUs (UUIDs) it is expected to get.
    pub gpus: Vec<String>,
}

/// Where every copy of a request goes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestPlan {
    /// One per copy, ordered by shape, then copy.
    pub assignments: Vec<ShapeAssignment>,
}

impl RequestPlan {
    /// The assignments of shape `shape`, by copy.
    pub fn of_shape(&self, shape: usize) -> impl Iterator<Item = &ShapeAssignment> {
        self.assignments.iter().filter(move |a| a.shape == shape)
    }

    /// `(shape, copy)` per agent index (ascending): one accept per agent.
    pub fn launches(&self) -> BTreeMap<usize, Vec<(usize, u32)>> {
        let mut out: BTreeMap<usize, Vec<(usize, u32)>> = BTreeMap::new();
        for a in &self.assignments {
            out.entry(a.agent).or_default().push((a.shape, a.copy));
        }
        out
    }
}

/// Why a request does not fit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Fewer copies of this shape fit than asked for (under its rule, after the shapes placed
    /// before it).
    #[error("shape {shape}: {placed} of {count} copies fit")]
    NoFit {
        /// The shape's index.
        shape: usize,
        /// Copies that fitted before placement stopped.
        placed: u32,
        /// Copies asked for.
        count: u32,
    },
    /// A shape asks for a fraction of a GPU (offer placement deals in whole GPUs).
    #[error("shape {0} asks for a fraction of a GPU; use gantry_placement::Placer")]
    FractionalGpu(usize),
    /// A spread allowing no copy per domain.
    #[error("shape {0}: a spread needs max_per_domain of at least 1")]
    EmptySpread(usize),
}

/// The domain of `agent` under `domain`: `None` when it has none (the agent is not used).
fn domain_of(agent_index: usize, agent: &AgentView, domain: &Domain) -> Option<String> {
    match domain {
        Domain::Agent => Some(format!("#{agent_index}")),
        Domain::Attribute(key) => agent.attributes.get(key).cloned(),
    }
}

/// Places every copy of every shape, or none (see the module documentation). On success
/// `agents` has everything the plan takes removed; on failure it is unchanged.
pub fn place_request(
    agents: &mut Vec<AgentView>,
    request: &PlacementRequest,
) -> Result<RequestPlan, RequestError> {
    for (i, s) in request.shapes.iter().enumerate() {
        if !s.task.resources.milli("gpus").is_multiple_of(MILLI) {
            return Err(RequestError::FractionalGpu(i));
        }
        if matches!(
            s.rule,
            Rule::Spread {
                max_per_domain: 0,
                ..
            }
        ) {
            return Err(RequestError::EmptySpread(i));
        }
    }
    let mut order: Vec<usize> = (0..request.shapes.len()).collect();
    order.sort_by_key(|&i| {
        let s = &request.shapes[i];
        let r = &s.task.resources;
        (
            s.rule.rank(),
            std::cmp::Reverse((r.milli("gpus"), r.milli("cpus"), r.milli("mem"))),
        )
    });
    let mut work = agents.clone();
    let mut assignments = Vec::new();
    for i in order {
        let shape = &request.shapes[i];
        let placed = match &shape.rule {
            Rule::Any => place_any(&mut work, shape),
            Rule::StrictPack => place_packed(&mut work, shape),
            Rule::Spread {
                domain,
                max_per_domain,
            } => place_spread(&mut work, shape, domain, *max_per_domain),
        };
        if (placed.len() as u32) < shape.count {
            return Err(RequestError::NoFit {
                shape: i,
                placed: placed.len() as u32,
                count: shape.count,
            });
        }
        assignments.extend(placed.into_iter().enumerate().map(|(copy, (agent, gpus))| {
            ShapeAssignment {
                shape: i,
                copy: copy as u32,
                agent,
                gpus,
            }
        }));
    }
    assignments.sort_by_key(|a| (a.shape, a.copy));
    *agents = work;
    Ok(RequestPlan { assignments })
}

/// Copies placed so far: `(agent, gpus)` each.
type Placed = Vec<(usize, Vec<String>)>;

/// Each copy on its best agent; stops at the first that fits nowhere.
fn place_any(work: &mut [AgentView], shape: &ShapeRequest) -> Placed {
    let mut placed = Vec::new();
    while (placed.len() as u32) < shape.count {
        let Some(c) = place_one(work, &shape.task) else {
            break;
        };
        let gpus = take(work, &shape.task, &c);
        placed.push((c.agent, gpus));
    }
    placed
}

/// Every copy on the agent the first copy scores best on among those that host them all.
fn place_packed(work: &mut [AgentView], shape: &ShapeRequest) -> Placed {
    let mut hosts: Vec<(Candidate, usize)> = work
        .iter()
        .enumerate()
        .filter_map(|(i, a)| evaluate(i, a, &shape.task).map(|c| (c, i)))
        .collect();
    hosts.sort_by_key(|(c, _)| c.score);
    for (_, i) in hosts {
        let mut one = [work[i].clone()];
        let mut placed = Vec::new();
        while (placed.len() as u32) < shape.count {
            let Some(c) = evaluate(0, &one[0], &shape.task) else {
                break;
            };
            placed.push((i, take(&mut one, &shape.task, &c)));
        }
        if placed.len() as u32 == shape.count {
            let [packed] = one;
            work[i] = packed;
            return placed;
        }
    }
    Vec::new()
}

/// At most `max` copies per domain, each in the domain with the fewest so far.
fn place_spread(work: &mut [AgentView], shape: &ShapeRequest, domain: &Domain, max: u32) -> Placed {
    let domains: Vec<Option<String>> = work
        .iter()
        .enumerate()
        .map(|(i, a)| domain_of(i, a, domain))
        .collect();
    let mut used: BTreeMap<String, u32> = BTreeMap::new();
    let mut placed = Vec::new();
    while (placed.len() as u32) < shape.count {
        let candidates = work
            .iter()
            .enumerate()
            .filter_map(|(i, a)| {
                let d = domains[i].as_ref()?;
                let n = used.get(d).copied().unwrap_or(0);
                (n < max).then_some(())?;
                evaluate(i, a, &shape.task).map(|c| (n, c))
            })
            .min_by_key(|(n, c)| (*n, c.score));
        let Some((_, c)) = candidates else {
            break;
        };
        if let Some(d) = &domains[c.agent] {
            *used.entry(d.clone()).or_default() += 1;
        }
        let gpus = take(work, &shape.task, &c);
        placed.push((c.agent, gpus));
    }
    placed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offers::tests::{agent, gpu};
    use gantry_proto::{AgentId, Attributes, OfferId, Resources};
    use proptest::prelude::*;
    use std::collections::{BTreeSet, HashMap};

    fn req(res: &str) -> TaskRequest {
        TaskRequest::new(res.parse().unwrap())
    }

    fn in_rack(name: &str, res: &str, rack: Option<&str>) -> AgentView {
        let mut a = agent(name, res);
        if let Some(r) = rack {
            a.attributes.insert("rack".into(), r.into());
        }
        a
    }

    #[test]
    fn strict_pack_puts_every_copy_on_one_agent_or_none() {
        let mut agents = vec![
            agent("a", "cpus:4;mem:4096;gpus:8"),
            agent("b", "cpus:16;mem:4096;gpus:8"),
        ];
        let two = PlacementRequest::new().shape(req("cpus:3;mem:64;gpus:2"), 2, Rule::StrictPack);
        let plan = place_request(&mut agents, &two).unwrap();
        // Only b has the CPU for both.
        assert!(plan.assignments.iter().all(|a| a.agent == 1), "{plan:?}");
        assert_eq!(agents[1].resources.milli("cpus"), 10_000);
        // Six copies fit across both agents, but on no single one: nothing is taken.
        let before = agents.clone();
        let six = PlacementRequest::new().shape(req("cpus:1;mem:64;gpus:2"), 6, Rule::StrictPack);
        assert_eq!(
            place_request(&mut agents, &six),
            Err(RequestError::NoFit {
                shape: 0,
                placed: 0,
                count: 6
            })
        );
        assert_eq!(agents, before);
        let any = PlacementRequest::new().shape(req("cpus:1;mem:64;gpus:2"), 6, Rule::Any);
        assert!(place_request(&mut agents.clone(), &any).is_ok());
    }

    #[test]
    fn spread_puts_at_most_the_limit_per_domain() {
        let mut agents = vec![
            in_rack("a", "cpus:8;mem:4096", Some("r1")),
            in_rack("b", "cpus:8;mem:4096", Some("r1")),
            in_rack("c", "cpus:8;mem:4096", Some("r2")),
            in_rack("d", "cpus:8;mem:4096", None),
        ];
        let r = PlacementRequest::new().shape(req("cpus:1;mem:64"), 2, Rule::spread_over("rack"));
        let plan = place_request(&mut agents.clone(), &r).unwrap();
        let racks: BTreeSet<&str> = plan
            .assignments
            .iter()
            .map(|a| agents[a.agent].attributes["rack"].as_str())
            .collect();
        assert_eq!(racks.len(), 2);
        // A third copy has no rack left (d has no rack attribute).
        let three =
            PlacementRequest::new().shape(req("cpus:1;mem:64"), 3, Rule::spread_over("rack"));
        assert!(matches!(
            place_request(&mut agents, &three),
            Err(RequestError::NoFit { placed: 2, .. })
        ));
        // Two per rack: four copies, even though the agents could hold 32.
        let two_each = Rule::Spread {
            domain: Domain::Attribute("rack".into()),
            max_per_domain: 2,
        };
        let four = PlacementRequest::new().shape(req("cpus:1;mem:64"), 4, two_each.clone());
        assert!(place_request(&mut agents.clone(), &four).is_ok());
        let five = PlacementRequest::new().shape(req("cpus:1;mem:64"), 5, two_each);
        assert!(place_request(&mut agents, &five).is_err());
        // One per agent uses the rackless agent too.
        let per_agent =
            PlacementRequest::new().shape(req("cpus:1;mem:64"), 4, Rule::one_per_agent());
        let plan = place_request(&mut agents, &per_agent).unwrap();
        let used: BTreeSet<usize> = plan.assignments.iter().map(|a| a.agent).collect();
        assert_eq!(used.len(), 4);
        let zero = Rule::Spread {
            domain: Domain::Agent,
            max_per_domain: 0,
        };
        let bad = PlacementRequest::new().shape(req("cpus:1;mem:64"), 1, zero);
        assert_eq!(
            place_request(&mut agents, &bad),
            Err(RequestError::EmptySpread(0))
        );
    }

    #[test]
    fn mixed_shapes_are_placed_together_or_not_at_all() {
        // A strict pack of 2x4 GPUs and four 1-GPU trials, one per agent: the pack goes first
        // (it fits on b only), the trials around it.
        let mut agents = vec![
            agent("a", "cpus:8;mem:8192;gpus:2"),
            agent("b", "cpus:32;mem:65536;gpus:8"),
            agent("c", "cpus:8;mem:8192;gpus:2"),
        ];
        let request = PlacementRequest::new()
            .shape(req("cpus:1;mem:512;gpus:1"), 2, Rule::one_per_agent())
            .shape(req("cpus:4;mem:4096;gpus:4"), 2, Rule::StrictPack);
        let plan = place_request(&mut agents.clone(), &request).unwrap();
        assert!(plan.of_shape(1).all(|a| a.agent == 1));
        let trial_agents: BTreeSet<usize> = plan.of_shape(0).map(|a| a.agent).collect();
        assert_eq!(trial_agents.len(), 2);
        assert!(!trial_agents.contains(&1), "b is full: {plan:?}");
        assert_eq!(plan.launches().values().map(Vec::len).sum::<usize>(), 4);
        // Four trials, one per agent, do not fit: b is full after the pack, and the trials fit
        // on a and c only. Nothing is placed.
        let before = agents.clone();
        let request = PlacementRequest::new()
            .shape(req("cpus:1;mem:512;gpus:1"), 4, Rule::one_per_agent())
            .shape(req("cpus:4;mem:4096;gpus:4"), 2, Rule::StrictPack);
        assert!(matches!(
            place_request(&mut agents, &request),
            Err(RequestError::NoFit {
                shape: 0,
                placed: 2,
                count: 4
            })
        ));
        assert_eq!(agents, before);
        let frac = PlacementRequest::new().shape(req("cpus:1;mem:1;gpus:0.5"), 1, Rule::Any);
        assert_eq!(
            place_request(&mut agents, &frac),
            Err(RequestError::FractionalGpu(0))
        );
    }

    fn view(i: usize, cpus: u64, mem: u64, gpus: usize, rack: Option<u8>) -> AgentView {
        let mut attributes = Attributes::new();
        if let Some(r) = rack {
            attributes.insert("rack".into(), format!("r{r}"));
        }
        AgentView {
            agent_id: AgentId::random(),
            hostname: format!("h{i}"),
            offer_ids: vec![OfferId::random()],
            resources: format!("cpus:{cpus};mem:{mem};gpus:{gpus}")
                .parse()
                .unwrap(),
            attributes,
            gpus: (0..gpus)
                .map(|g| {
                    let mut x = gpu(i * 16 + g, "NVIDIA A100", (g / 4) as u32);
                    x.uuid = format!("GPU-{i}-{g}");
                    x
                })
                .collect(),
        }
    }

    fn agents() -> impl Strategy<Value = Vec<AgentView>> {
        prop::collection::vec(
            (1u64..16, 256u64..4096, 0usize..8, prop::option::of(0u8..3)),
            1..7,
        )
        .prop_map(|specs| {
            specs
                .into_iter()
                .enumerate()
                .map(|(i, (c, m, g, r))| view(i, c, m, g, r))
                .collect()
        })
    }

    fn rule() -> impl Strategy<Value = Rule> {
        prop_oneof![
            Just(Rule::Any),
            Just(Rule::StrictPack),
            (1u32..3).prop_map(|max_per_domain| Rule::Spread {
                domain: Domain::Agent,
                max_per_domain
            }),
            (1u32..3).prop_map(|max_per_domain| Rule::Spread {
                domain: Domain::Attribute("rack".into()),
                max_per_domain
            }),
        ]
    }

    fn request() -> impl Strategy<Value = PlacementRequest> {
        prop::collection::vec((1u64..6, 64u64..1024, 0u64..3, 1u32..5, rule()), 1..4).prop_map(
            |shapes| PlacementRequest {
                shapes: shapes
                    .into_iter()
                    .map(|(c, m, g, count, rule)| ShapeRequest {
                        task: req(&format!("cpus:{c};mem:{m};gpus:{g}")),
                        count,
                        rule,
                    })
                    .collect(),
            },
        )
    }

    proptest! {
        #[test]
        fn a_plan_honours_every_rule_and_never_overcommits(
            original in agents(),
            request in request(),
        ) {
            let mut agents = original.clone();
            match place_request(&mut agents, &request) {
                Err(_) => prop_assert_eq!(&agents, &original, "a refused request takes nothing"),
                Ok(plan) => {
                    // Every copy placed, once.
                    for (s, shape) in request.shapes.iter().enumerate() {
                        let copies: Vec<u32> = plan.of_shape(s).map(|a| a.copy).collect();
                        prop_assert_eq!(copies, (0..shape.count).collect::<Vec<_>>());
                    }
                    // Never over-committed: what is taken per agent fits in what it offered,
                    // and the GPUs given are the agent's own, each to one copy.
                    let mut taken: HashMap<usize, Resources> = HashMap::new();
                    let mut gpus: BTreeSet<String> = BTreeSet::new();
                    for a in &plan.assignments {
                        taken.entry(a.agent).or_default().add_assign(&request.shapes[a.shape].task.resources);
                        prop_assert_eq!(a.gpus.len() as u64, request.shapes[a.shape].task.gpus());
                        for g in &a.gpus {
                            prop_assert!(original[a.agent].gpus.iter().any(|x| &x.uuid == g));
                            prop_assert!(gpus.insert(g.clone()), "GPU {} given twice", g);
                        }
                    }
                    for (i, t) in &taken {
                        prop_assert!(original[*i].resources.contains(t), "agent {} over-committed", i);
                        let mut left = original[*i].resources.clone();
                        prop_assert!(left.checked_sub_assign(t).is_some());
                        prop_assert_eq!(&left, &agents[*i].resources);
                    }
                    for (s, shape) in request.shapes.iter().enumerate() {
                        let on: Vec<usize> = plan.of_shape(s).map(|a| a.agent).collect();
                        match &shape.rule {
                            Rule::Any => {}
                            Rule::StrictPack => {
                                let hosts: BTreeSet<usize> = on.iter().copied().collect();
                                prop_assert_eq!(hosts.len(), 1, "strict pack on one agent");
                            }
                            Rule::Spread { domain, max_per_domain } => {
                                let mut per: HashMap<String, u32> = HashMap::new();
                                for a in on {
                                    let d = domain_of(a, &original[a], domain);
                                    prop_assert!(d.is_some(), "an agent outside every domain was used");
                                    *per.entry(d.unwrap_or_default()).or_default() += 1;
                                }
                                prop_assert!(per.values().all(|n| n <= max_per_domain), "{:?}", per);
                            }
                        }
                    }
                }
            }
        }

        #[test]
        fn strict_pack_fits_whenever_one_agent_can_host_every_copy(
            original in agents(),
            cpus in 1u64..6,
            count in 1u32..5,
        ) {
            let task = req(&format!("cpus:{cpus};mem:64"));
            let mut all = Resources::new();
            for _ in 0..count {
                all.add_assign(&task.resources);
            }
            let fits_somewhere = original.iter().any(|a| a.resources.contains(&all));
            let request = PlacementRequest::new().shape(task, count, Rule::StrictPack);
            let plan = place_request(&mut original.clone(), &request);
            prop_assert_eq!(plan.is_ok(), fits_somewhere);
        }

        #[test]
        fn one_per_agent_fits_whenever_enough_agents_can_host_a_copy(
            original in agents(),
            cpus in 1u64..6,
            count in 1u32..6,
        ) {
            let task = req(&format!("cpus:{cpus};mem:64"));
            let hosts = original.iter().filter(|a| a.resources.contains(&task.resources)).count();
            let request = PlacementRequest::new().shape(task, count, Rule::one_per_agent());
            let plan = place_request(&mut original.clone(), &request);
            prop_assert_eq!(plan.is_ok(), hosts >= count as usize);
            if let Ok(plan) = plan {
                let used: BTreeSet<usize> = plan.assignments.iter().map(|a| a.agent).collect();
                prop_assert_eq!(used.len(), count as usize, "two copies on one agent");
            }
        }
    }
}
