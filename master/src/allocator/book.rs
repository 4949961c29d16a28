//! The offer book: outstanding offers in a slab, offer ids that carry their slot, and the
//! public records built from them. Each agent lists its outstanding offers and each framework
//! keeps a set of its own (the per-agent and per-framework indexes: a disconnect or removal
//! visits only those, never every offer).

use super::*;

#[derive(Debug)]
pub(super) struct OfferState {
    pub(super) id: OfferId,
    pub(super) framework: FrameworkId,
    pub(super) created_at: Millis,
    /// The public record, built on first request (most offers are only returned once).
    pub(super) rec: std::sync::OnceLock<Box<OfferRecord>>,
    pub(super) fw: u32,
    pub(super) agent: u32,
    pub(super) role: u32,
    pub(super) bundle: Bundle,
    pub(super) tasks: ShapeCounts,
    /// GPU shares earmarked on the agent for its tasks' worth.
    pub(super) gpus: Vec<(u32, u32)>,
}

/// Outstanding offers in a [`Slab`]. An offer id carries its slot (low 24 bits) under a global
/// sequence number (next 40 bits) and the configured seed (high 64 bits), so lookups need no
/// hashing, ids still sort by age, and the stored id doubles as the slot's generation check.
pub(super) struct OfferBook {
    slots: Slab<OfferState>,
    seq: u64,
    seed: u64,
}

const SLOT_BITS: u32 = 24;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

impl OfferBook {
    pub(super) fn new(seed: u64) -> Self {
        Self {
            slots: Slab::default(),
            seq: 0,
            seed,
        }
    }

    /// True when fewer than 4096 slots are left (a visit makes only a few offers).
    pub(super) fn is_full(&self) -> bool {
        self.slots.vacant() < 4096 && self.slots.capacity() as u64 + 4096 > SLOT_MASK
    }

    /// The id for the next offer [`OfferBook::insert`]ed (it names the slot it will take).
    pub(super) fn next_id(&mut self) -> OfferId {
        let slot = self.slots.next_key();
        self.seq += 1;
        let low = ((self.seq & ((1 << (64 - SLOT_BITS)) - 1)) << SLOT_BITS) | slot as u64;
        OfferId::from_u128(((self.seed as u128) << 64) | low as u128)
    }

    pub(super) fn slot(&self, id: &OfferId) -> Option<u32> {
        let v = id.0.as_u128();
        if (v >> 64) as u64 != self.seed {
            return None;
        }
        Some((v as u64 & SLOT_MASK) as u32)
    }

    /// Stores the offer made with the id [`OfferBook::next_id`] just returned.
    pub(super) fn insert(&mut self, id: OfferId, st: OfferState) {
        let slot = self.slots.insert(st);
        debug_assert_eq!(
            Some(slot),
            self.slot(&id),
            "offer inserted right after next_id"
        );
    }

    pub(super) fn get(&self, id: &OfferId) -> Option<&OfferState> {
        self.slots.get(self.slot(id)?).filter(|st| st.id == *id)
    }

    pub(super) fn get_mut(&mut self, id: &OfferId) -> Option<&mut OfferState> {
        let s = self.slot(id)?;
        self.slots.get_mut(s).filter(|st| st.id == *id)
    }

    pub(super) fn remove(&mut self, id: &OfferId) -> Option<OfferState> {
        let s = self.slot(id)?;
        if self.slots.get(s).is_some_and(|st| st.id == *id) {
            self.slots.remove(s)
        } else {
            None
        }
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &OfferState> {
        self.slots.values()
    }

    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }
}

impl Allocator {
    pub(super) fn build_record(&self, st: &OfferState) -> OfferRecord {
        OfferRecord {
            id: st.id,
            framework: st.framework,
            agent: self.ag(st.agent).id,
            role: self.roles[st.role as usize].name.to_string(),
            resources: self.offer_resources(&st.bundle),
            created_at: st.created_at,
        }
    }

    pub(super) fn record_of<'a>(&self, st: &'a OfferState) -> &'a OfferRecord {
        st.rec.get_or_init(|| Box::new(self.build_record(st)))
    }

    /// The record of an offer that was just removed from the book.
    pub(super) fn take_record(&self, mut st: OfferState) -> OfferRecord {
        match st.rec.take() {
            Some(r) => *r,
            None => self.build_record(&st),
        }
    }

    /// Removes an outstanding offer, returning its resources to the agent's free pool.
    pub(super) fn drop_offer(&mut self, id: OfferId) -> Option<OfferState> {
        let st = self.offers.remove(&id)?;
        self.release_gpus(st.agent, &st.gpus);
        self.charge(st.fw, st.role, &st.bundle, false);
        self.return_to_agent(st.agent, &st.bundle);
        let fw = self.fw_mut(st.fw);
        release_tasks(&mut fw.offered_tasks, &st.tasks);
        fw.offer_ids.remove(&id);
        if st.tasks.iter().any(|t| *t > 0) {
            self.epoch += 1;
        }
        let agent = self.ag_mut(st.agent);
        agent.offers.retain(|o| *o != id);
        Some(st)
    }

    pub(super) fn return_to_agent(&mut self, a: u32, b: &Bundle) {
        dense::add(&mut self.free_unres, &b.unres);
        let agent = self.ag_mut(a);
        agent.free.add(b);
        agent.stable = None;
    }
}
