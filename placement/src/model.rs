//! GPU models: [`ModelId`] (a model interned by [`Models`]) and [`ModelSet`] (the models a
//! task accepts, a 64-bit mask).

use super::{PlacementError, MAX_MODELS};

/// A GPU model, interned by [`Models`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(pub(crate) u8);

impl ModelId {
    /// The model's index in its [`Models`].
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// The GPU models a task accepts; empty means any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ModelSet(pub(crate) u64);

impl ModelSet {
    /// Any model.
    pub const ANY: ModelSet = ModelSet(0);

    /// This set plus `model`.
    pub fn with(self, model: ModelId) -> ModelSet {
        ModelSet(self.0 | (1u64 << model.0))
    }

    /// Whether a GPU of `model` is acceptable.
    pub fn accepts(self, model: ModelId) -> bool {
        self.0 == 0 || self.0 & (1u64 << model.0) != 0
    }

    /// Whether any model is acceptable.
    pub fn is_any(self) -> bool {
        self.0 == 0
    }

    /// The names of the models in this set, in `models`' order (none for [`ModelSet::ANY`]).
    ///
    /// ```
    /// use gantry_placement::Models;
    /// let mut models = Models::new();
    /// let set = models.set(["T4", "V100M16"]).unwrap();
    /// models.intern("A100").unwrap();
    /// assert_eq!(set.names(&models).collect::<Vec<_>>(), ["T4", "V100M16"]);
    /// ```
    pub fn names(self, models: &Models) -> impl Iterator<Item = &str> {
        models
            .names
            .iter()
            .enumerate()
            .filter(move |(i, _)| self.0 & (1u64 << i) != 0)
            .map(|(_, n)| n.as_str())
    }
}

/// Interns GPU model names.
#[derive(Debug, Clone, Default)]
pub struct Models {
    names: Vec<String>,
}

impl Models {
    /// No models yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of `name`, adding it when new.
    pub fn intern(&mut self, name: &str) -> Result<ModelId, PlacementError> {
        if let Some(id) = self.get(name) {
            return Ok(id);
        }
        if self.names.len() >= MAX_MODELS {
            return Err(PlacementError::TooManyModels);
        }
        let id = u8::try_from(self.names.len()).map_err(|_| PlacementError::TooManyModels)?;
        self.names.push(name.to_string());
        Ok(ModelId(id))
    }

    /// The id of `name`, if interned.
    pub fn get(&self, name: &str) -> Option<ModelId> {
        self.names
            .iter()
            .position(|n| n == name)
            .and_then(|i| u8::try_from(i).ok())
            .map(ModelId)
    }

    /// The name of `id`.
    pub fn name(&self, id: ModelId) -> Option<&str> {
        self.names.get(id.index()).map(String::as_str)
    }

    /// How many models are interned.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether no model is interned.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The set of the given model names (interning them); no names is [`ModelSet::ANY`].
    pub fn set<'a>(
        &mut self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<ModelSet, PlacementError> {
        let mut set = ModelSet::ANY;
        for name in names {
            let name = name.trim();
            if !name.is_empty() {
                set = set.with(self.intern(name)?);
            }
        }
        Ok(set)
    }
}
