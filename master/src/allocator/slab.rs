//! A slab: values in a `Vec` of slots addressed by dense `u32` keys, with a free list so keys
//! of removed values are reused (last freed, first reused) and lookups need no hashing.

/// Values addressed by dense `u32` keys; removed keys are reused by later inserts.
#[derive(Debug)]
pub(super) struct Slab<T> {
    slots: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    /// Stores `value` in the most recently freed slot (or a new one) and returns its key.
    pub(super) fn insert(&mut self, value: T) -> u32 {
        match self.free.pop() {
            Some(k) => {
                self.slots[k as usize] = Some(value);
                k
            }
            None => {
                self.slots.push(Some(value));
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// Takes the value out and frees its key (`None`, and nothing freed, if the slot is empty).
    pub(super) fn remove(&mut self, key: u32) -> Option<T> {
        let v = self.slots.get_mut(key as usize)?.take()?;
        self.free.push(key);
        Some(v)
    }

    /// The value at `key`, if the slot is live.
    pub(super) fn get(&self, key: u32) -> Option<&T> {
        self.slots.get(key as usize)?.as_ref()
    }

    /// The value at `key`, if the slot is live.
    pub(super) fn get_mut(&mut self, key: u32) -> Option<&mut T> {
        self.slots.get_mut(key as usize)?.as_mut()
    }

    /// The key the next [`Slab::insert`] will return.
    pub(super) fn next_key(&self) -> u32 {
        match self.free.last() {
            Some(k) => *k,
            None => self.slots.len() as u32,
        }
    }

    /// Number of live values.
    pub(super) fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Number of free slots (below [`Slab::capacity`]).
    pub(super) fn vacant(&self) -> usize {
        self.free.len()
    }

    /// Number of slots, live or free (keys are below this).
    pub(super) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Live values in key order.
    pub(super) fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::Slab;

    #[test]
    fn keys_are_dense_and_freed_keys_are_reused_last_first() {
        let mut s = Slab::default();
        assert_eq!(s.insert("a"), 0);
        assert_eq!(s.insert("b"), 1);
        assert_eq!(s.insert("c"), 2);
        assert_eq!(s.remove(0), Some("a"));
        assert_eq!(s.remove(2), Some("c"));
        assert_eq!(s.remove(2), None);
        assert_eq!(s.get(0), None);
        assert_eq!((s.len(), s.vacant(), s.next_key()), (1, 2, 2));
        assert_eq!(s.insert("d"), 2);
        assert_eq!(s.insert("e"), 0);
        assert_eq!(s.insert("f"), 3);
        assert_eq!((s.capacity(), s.len(), s.next_key()), (4, 4, 4));
        assert_eq!(
            s.values().copied().collect::<Vec<_>>(),
            ["e", "b", "d", "f"]
        );
        *s.get_mut(1).unwrap() = "B";
        assert_eq!(s.get(1), Some(&"B"));
        assert_eq!(s.get(9), None);
    }
}
