//! What a task asks for and where it goes: [`GpuDemand`], [`TaskShape`], a candidate
//! [`Node`] (capacity and what is free), [`GpuShare`] and [`Placement`].

use super::{ModelId, ModelSet, PlacementError, GPU_MILLI};

/// A task's GPU demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuDemand {
    /// No GPU.
    None,
    /// A share of one GPU, 1..=999 milli-GPUs.
    Fraction(u32),
    /// Whole idle GPUs on one node.
    Whole(u32),
}

impl GpuDemand {
    /// A checked fraction (1..=999); 1000 is `Whole(1)`.
    pub fn fraction(milli: u32) -> Result<GpuDemand, PlacementError> {
        match milli {
            GPU_MILLI => Ok(GpuDemand::Whole(1)),
            1..=999 => Ok(GpuDemand::Fraction(milli)),
            _ => Err(PlacementError::BadFraction(milli)),
        }
    }

    /// A checked number of whole GPUs (0 is `None`).
    pub fn whole(count: u32) -> GpuDemand {
        if count == 0 {
            GpuDemand::None
        } else {
            GpuDemand::Whole(count)
        }
    }

    /// Total milli-GPUs asked for.
    pub fn milli(self) -> u64 {
        match self {
            GpuDemand::None => 0,
            GpuDemand::Fraction(m) => u64::from(m),
            GpuDemand::Whole(n) => u64::from(n) * u64::from(GPU_MILLI),
        }
    }
}

/// What a task asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskShape {
    /// CPU, milli-cores.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// GPUs.
    pub gpu: GpuDemand,
    /// Acceptable GPU models.
    pub models: ModelSet,
}

/// A candidate node: capacity and what is free now.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Node {
    /// The node's GPU model.
    pub model: ModelId,
    /// CPU capacity, milli-cores.
    pub cpu_capacity: u64,
    /// Memory capacity, MiB.
    pub memory_capacity: u64,
    /// Free CPU, milli-cores.
    pub cpu_free: u64,
    /// Free memory, MiB.
    pub memory_free: u64,
    /// Free milli-GPUs of each GPU (its capacity is [`GPU_MILLI`]).
    pub gpu_free: Vec<u32>,
}

impl Node {
    /// An idle node.
    pub fn idle(model: ModelId, cpu_milli: u64, memory_mib: u64, gpus: usize) -> Node {
        Node {
            model,
            cpu_capacity: cpu_milli,
            memory_capacity: memory_mib,
            cpu_free: cpu_milli,
            memory_free: memory_mib,
            gpu_free: vec![GPU_MILLI; gpus],
        }
    }

    pub(crate) fn check(&self, index: usize) -> Result<(), PlacementError> {
        if self.cpu_free > self.cpu_capacity || self.memory_free > self.memory_capacity {
            return Err(PlacementError::FreeAboveCapacity { node: index });
        }
        for (gpu, &free) in self.gpu_free.iter().enumerate() {
            if free > GPU_MILLI {
                return Err(PlacementError::BadGpu {
                    node: index,
                    gpu,
                    free,
                });
            }
        }
        Ok(())
    }

    /// Free milli-GPUs over all GPUs.
    pub fn gpu_free_total(&self) -> u64 {
        self.gpu_free.iter().map(|&f| u64::from(f)).sum()
    }

    /// Whether CPU, memory and model allow `task` here (GPU room aside).
    pub(crate) fn fits_host(&self, task: &TaskShape) -> bool {
        task.cpu_milli <= self.cpu_free
            && task.memory_mib <= self.memory_free
            && (task.gpu == GpuDemand::None || task.models.accepts(self.model))
    }

    /// Whether `task` fits here.
    pub fn fits(&self, task: &TaskShape) -> bool {
        self.fits_host(task)
            && match task.gpu {
                GpuDemand::None => true,
                GpuDemand::Fraction(d) => self.gpu_free.iter().any(|&f| f >= d),
                GpuDemand::Whole(k) => self.idle_gpus() >= k as usize,
            }
    }

    fn idle_gpus(&self) -> usize {
        self.gpu_free.iter().filter(|&&f| f == GPU_MILLI).count()
    }

    /// The first `k` idle GPUs.
    pub(crate) fn first_idle(&self, k: u32) -> Vec<GpuShare> {
        self.gpu_free
            .iter()
            .enumerate()
            .filter(|(_, &f)| f == GPU_MILLI)
            .take(k as usize)
            .map(|(i, _)| GpuShare {
                gpu: i,
                milli: GPU_MILLI,
            })
            .collect()
    }
}

/// A share of one GPU given to a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuShare {
    /// Index into [`Node::gpu_free`].
    pub gpu: usize,
    /// Milli-GPUs taken from it.
    pub milli: u32,
}

/// Where a task goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Index of the chosen node.
    pub node: usize,
    /// The GPU shares given to the task (empty without GPUs).
    pub gpus: Vec<GpuShare>,
}
