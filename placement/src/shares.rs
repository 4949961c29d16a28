//! Placement candidates with GPU shares from offers: a [`Node`] per offer (free CPU and memory, the GPU model,
//! each offered GPU's free milli-GPUs from [`Offer::gpu_free`]) and the [`TaskShape`] of a
//! task's resources, so a scheduler can run a [`super::Placer`] over its offers and learn which
//! agent (and GPU) suits a task, fractions of one GPU included.
//!
//! MIG devices are left out of the node (they are whole devices chosen by profile, not shares).
//! The master re-checks per-GPU room and picks the GPU for a fraction itself at accept, with the
//! same scoring; the node's GPU order is [`OfferNode::gpu_uuids`].

use gantry_proto::{GpuAmount, Offer, Resources};

use super::{GpuDemand, ModelSet, Models, Node, PlacementError, TaskShape, GPU_MILLI};

/// A placement node built from one offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferNode {
    /// The candidate (capacity = what the offer holds).
    pub node: Node,
    /// The UUIDs of `node.gpu_free`'s GPUs, in order.
    pub gpu_uuids: Vec<String>,
}

/// The node an offer describes. The GPU model is the first offered GPU's name (interned in
/// `models`); a GPU without a `gpu_free` entry (an older master) counts as idle.
pub fn node_from_offer(offer: &Offer, models: &mut Models) -> Result<OfferNode, PlacementError> {
    let total = offer.total();
    let gpus: Vec<_> = offer
        .gpus
        .iter()
        .filter(|g| g.healthy && g.mig_profile.is_none())
        .collect();
    let model = models.intern(gpus.first().map_or("", |g| g.name.as_str()))?;
    let gpu_free = gpus
        .iter()
        .map(|g| {
            offer
                .gpu_free
                .iter()
                .find(|f| f.uuid == g.uuid)
                .map_or(GPU_MILLI, |f| f.free_milli.min(GPU_MILLI))
        })
        .collect();
    let cpu = total.milli("cpus");
    let memory = total.milli("mem") / 1000;
    Ok(OfferNode {
        node: Node {
            model,
            cpu_capacity: cpu,
            memory_capacity: memory,
            cpu_free: cpu,
            memory_free: memory,
            gpu_free,
        },
        gpu_uuids: gpus.iter().map(|g| g.uuid.clone()).collect(),
    })
}

/// The shape of a task asking for `resources` (`gpus` below 1: a fraction of one GPU; from 1:
/// whole GPUs) on GPUs of `models`; `None` when its `gpus` is neither.
pub fn task_shape(resources: &Resources, models: ModelSet) -> Option<TaskShape> {
    let gpu = match resources.gpu_amount().ok()? {
        GpuAmount::None => GpuDemand::None,
        GpuAmount::Fraction(m) => GpuDemand::Fraction(m),
        GpuAmount::Whole(k) => GpuDemand::Whole(u32::try_from(k).ok()?),
    };
    Some(TaskShape {
        cpu_milli: resources.milli("cpus"),
        memory_mib: resources.milli("mem") / 1000,
        gpu,
        models,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{Placer, Policy, Workload};
    use super::*;
    use gantry_proto::{AgentId, FrameworkId, GpuFree, GpuInfo, OfferId};

    fn gpu(uuid: &str) -> GpuInfo {
        GpuInfo {
            uuid: uuid.into(),
            name: "NVIDIA A100".into(),
            memory_mib: 81_920,
            compute_capability: (8, 0),
            minor: 0,
            pci_bus_id: String::new(),
            numa_node: None,
            pci_root: None,
            healthy: true,
            mig_profile: None,
            parent_uuid: None,
        }
    }

    #[test]
    fn a_fraction_goes_to_the_offered_gpu_with_the_least_room() {
        let mig = GpuInfo {
            uuid: "MIG-1".into(),
            mig_profile: Some("1g.10gb".into()),
            ..gpu("MIG-1")
        };
        let offer = Offer {
            id: OfferId::from_u128(1),
            framework_id: FrameworkId::from_u128(1),
            agent_id: AgentId::from_u128(1),
            hostname: "h".into(),
            role: "r".into(),
            resources: "cpus:8;mem:4096;gpus:2.75".parse().unwrap(),
            reserved: Default::default(),
            attributes: Default::default(),
            gpus: vec![gpu("GPU-a"), gpu("GPU-b"), mig].into(),
            gpu_free: vec![GpuFree {
                uuid: "GPU-a".into(),
                free_milli: 750,
                free_memory_mib: 61_440,
            }],
            agent_name: "a".into(),
        };
        let mut models = Models::new();
        let on = node_from_offer(&offer, &mut models).unwrap();
        assert_eq!(on.gpu_uuids, ["GPU-a", "GPU-b"]);
        assert_eq!(on.node.gpu_free, vec![750, 1000]);
        assert_eq!((on.node.cpu_free, on.node.memory_free), (8000, 4096));
        let quarter =
            task_shape(&"cpus:1;mem:64;gpus:0.25".parse().unwrap(), ModelSet::ANY).unwrap();
        assert_eq!(quarter.gpu, GpuDemand::Fraction(250));
        assert!(task_shape(&"gpus:1.5".parse().unwrap(), ModelSet::ANY).is_none());
        let whole = TaskShape {
            gpu: GpuDemand::Whole(1),
            ..quarter
        };
        let mut placer = Placer::new(
            vec![on.node.clone()],
            Policy::FgdPack,
            Workload::new([(quarter, 1), (whole, 1)]),
            0,
        )
        .unwrap();
        let p = placer.choose(&quarter).unwrap();
        assert_eq!(on.gpu_uuids[p.gpus[0].gpu], "GPU-a");
    }
}
