//! Named scalar resources (`cpus`, `mem`, `disk`, `gpus`, ...) with exact arithmetic.
//!
//! Amounts are kept in fixed-point milli-units (`1.5 cpus` is `1500`), so sums and differences
//! never drift the way floating point does. `mem` and `disk` are in MiB, as in Mesos.
//!
//! On the wire (bincode) a [`Resources`] is a map of milli-units; in human-readable formats
//! (JSON, TOML) it is a map of plain numbers, e.g. `{"cpus":2.0,"mem":1024.0}`.
//!
//! A bag is sparse (`cpus:0` is the empty bag). [`ResourceLimits`] (quota limits) keeps explicit
//! zeros, because there `cpus:0` means "no cpus at all" while an unnamed kind is unlimited.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Milli-units per unit.
pub const MILLI: u64 = 1000;

/// Why a resource string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceParseError {
    #[error("resource entry {0:?} is not of the form NAME:AMOUNT")]
    /// Not `name:amount;name:amount`.
    Syntax(String),
    #[error("resource name {0:?} is empty or has characters other than [A-Za-z0-9_.-]")]
    /// A resource name outside `[a-z0-9_.-]`.
    BadName(String),
    #[error("resource amount {0:?} is not a finite non-negative number")]
    /// An amount that is not a finite, non-negative number.
    BadAmount(String),
    #[error("resource {0:?} is given more than once")]
    /// The same name twice.
    Duplicate(String),
}

/// A bag of named scalar amounts. Zero amounts are never stored, so two equal bags compare equal.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Resources {
    amounts: BTreeMap<Name, u64>,
}

/// A resource name. Shared (`Arc`), so copying a bag copies no strings; the well-known names
/// are interned once per process, so building the common bags allocates no strings at all.
type Name = Arc<str>;

fn name_of(name: &str) -> Name {
    static WELL_KNOWN: OnceLock<[Name; 4]> = OnceLock::new();
    let known = WELL_KNOWN.get_or_init(|| ["cpus", "mem", "disk", "gpus"].map(Name::from));
    known
        .iter()
        .find(|k| &***k == name)
        .cloned()
        .unwrap_or_else(|| Name::from(name))
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

fn to_milli(amount: f64) -> Option<u64> {
    if !amount.is_finite() || amount < 0.0 || amount > (u64::MAX / MILLI) as f64 {
        return None;
    }
    Some((amount * MILLI as f64).round() as u64)
}

impl Resources {
    /// An empty bag.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses `"cpus:2;mem:1024;gpus:1"`. Whitespace around entries is ignored; an empty string
    /// is an empty bag; `name:0` entries are accepted and dropped (a bag is sparse; where an
    /// explicit zero means something, as in a quota limit, use [`ResourceLimits::parse`]).
    pub fn parse(text: &str) -> Result<Self, ResourceParseError> {
        let mut out = Resources::new();
        for (name, milli) in parse_entries(text)? {
            out.set_milli(name, milli);
        }
        Ok(out)
    }

    /// Builder-style: sets `name` to `amount` units (negative or non-finite amounts become 0).
    pub fn with(mut self, name: &str, amount: f64) -> Self {
        self.set_milli(name, to_milli(amount).unwrap_or(0));
        self
    }

    /// Sets `name` to exactly `milli` milli-units.
    pub fn set_milli(&mut self, name: &str, milli: u64) {
        if milli == 0 {
            self.amounts.remove(name);
        } else {
            match self.amounts.get_mut(name) {
                Some(v) => *v = milli,
                None => {
                    self.amounts.insert(name_of(name), milli);
                }
            }
        }
    }

    /// The amount of `name` in milli-units (0 when absent).
    pub fn milli(&self, name: &str) -> u64 {
        self.amounts.get(name).copied().unwrap_or(0)
    }

    /// The amount of `name` in units (0.0 when absent).
    pub fn get(&self, name: &str) -> f64 {
        self.milli(name) as f64 / MILLI as f64
    }

    /// True when every amount is zero.
    pub fn is_empty(&self) -> bool {
        self.amounts.is_empty()
    }

    /// `(name, milli-units)` pairs in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.amounts.iter().map(|(k, v)| (&**k, *v))
    }

    /// Resource names present (non-zero) in this bag.
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.amounts.keys().map(|k| &**k)
    }

    /// True when `other` fits inside `self` (every amount of `other` is at most ours).
    pub fn contains(&self, other: &Resources) -> bool {
        other.iter().all(|(name, milli)| self.milli(name) >= milli)
    }

    /// Adds `other` into `self` (saturating).
    pub fn add_assign(&mut self, other: &Resources) {
        for (name, milli) in &other.amounts {
            let v = self.amounts.entry(Name::clone(name)).or_insert(0);
            *v = v.saturating_add(*milli);
        }
    }

    /// `self + other`.
    pub fn plus(&self, other: &Resources) -> Resources {
        let mut out = self.clone();
        out.add_assign(other);
        out
    }

    /// Subtracts `other`, returning `None` (and leaving `self` unchanged) if it does not fit.
    pub fn checked_sub_assign(&mut self, other: &Resources) -> Option<()> {
        if !self.contains(other) {
            return None;
        }
        for (name, milli) in other.iter() {
            let v = self.milli(name) - milli;
            self.set_milli(name, v);
        }
        Some(())
    }

    /// `self - other`, with every amount floored at zero.
    pub fn saturating_sub(&self, other: &Resources) -> Resources {
        let mut out = self.clone();
        for (name, milli) in other.iter() {
            let v = out.milli(name).saturating_sub(milli);
            out.set_milli(name, v);
        }
        out
    }

    /// The element-wise minimum of `self` and `other`.
    pub fn elementwise_min(&self, other: &Resources) -> Resources {
        let mut out = Resources::new();
        for (name, milli) in self.iter() {
            out.set_milli(name, milli.min(other.milli(name)));
        }
        out
    }

    /// Keeps only the named resources.
    pub fn filter(&self, mut keep: impl FnMut(&str) -> bool) -> Resources {
        Resources {
            amounts: self
                .amounts
                .iter()
                .filter(|(k, _)| keep(k))
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
        }
    }

    /// Whole units as a map of plain numbers (for JSON output).
    pub fn to_units(&self) -> BTreeMap<String, f64> {
        self.iter()
            .map(|(k, v)| (k.to_string(), v as f64 / MILLI as f64))
            .collect()
    }
}

impl std::str::FromStr for Resources {
    type Err = ResourceParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Resources::parse(s)
    }
}

/// `name:amount;name:amount`, the syntax the parsers accept.
fn fmt_amounts<'a>(
    amounts: impl Iterator<Item = (&'a str, u64)>,
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    for (i, (name, milli)) in amounts.enumerate() {
        if i > 0 {
            f.write_str(";")?;
        }
        write!(f, "{name}:")?;
        fmt_milli(milli, f)?;
    }
    Ok(())
}

fn fmt_milli(milli: u64, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    if milli.is_multiple_of(MILLI) {
        write!(f, "{}", milli / MILLI)
    } else {
        let s = format!("{}.{:03}", milli / MILLI, milli % MILLI);
        write!(f, "{}", s.trim_end_matches('0'))
    }
}

impl fmt::Display for Resources {
    /// Renders the same syntax [`Resources::parse`] accepts: `cpus:2;mem:1024`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_amounts(self.iter(), f)
    }
}

impl fmt::Debug for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Resources({self})")
    }
}

impl Serialize for Resources {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            self.to_units().serialize(s)
        } else {
            use serde::ser::SerializeMap;
            let mut m = s.serialize_map(Some(self.amounts.len()))?;
            for (k, v) in &self.amounts {
                m.serialize_entry(&**k, v)?;
            }
            m.end()
        }
    }
}

impl<'de> Deserialize<'de> for Resources {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut out = Resources::new();
        if d.is_human_readable() {
            let map = BTreeMap::<String, f64>::deserialize(d)?;
            for (k, v) in map {
                if !valid_name(&k) {
                    return Err(D::Error::custom(ResourceParseError::BadName(k)));
                }
                let milli = to_milli(v).ok_or_else(|| {
                    D::Error::custom(ResourceParseError::BadAmount(v.to_string()))
                })?;
                out.set_milli(&k, milli);
            }
        } else {
            let map = BTreeMap::<String, u64>::deserialize(d)?;
            for (k, v) in map {
                if !valid_name(&k) {
                    return Err(D::Error::custom(ResourceParseError::BadName(k)));
                }
                out.set_milli(&k, v);
            }
        }
        Ok(out)
    }
}

/// `NAME:AMOUNT` entries of a resource string, in order, validated, zeros kept.
fn parse_entries(text: &str) -> Result<Vec<(&str, u64)>, ResourceParseError> {
    let mut out: Vec<(&str, u64)> = Vec::new();
    for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, amount) = entry
            .split_once(':')
            .ok_or_else(|| ResourceParseError::Syntax(entry.to_string()))?;
        let (name, amount) = (name.trim(), amount.trim());
        if !valid_name(name) {
            return Err(ResourceParseError::BadName(name.to_string()));
        }
        let value: f64 = amount
            .parse()
            .map_err(|_| ResourceParseError::BadAmount(amount.to_string()))?;
        let milli =
            to_milli(value).ok_or_else(|| ResourceParseError::BadAmount(amount.to_string()))?;
        if out.iter().any(|(n, _)| *n == name) {
            return Err(ResourceParseError::Duplicate(name.to_string()));
        }
        out.push((name, milli));
    }
    Ok(out)
}

/// How a task's `gpus` amount is read: below one it is a fraction of one GPU (milli-GPU
/// precision, shared with other fractions as long as they sum to at most one GPU); from one up
/// it is a number of whole GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuAmount {
    /// No GPU.
    None,
    /// A share of one GPU, 1..=999 milli-GPUs.
    Fraction(u32),
    /// Whole GPUs.
    Whole(u64),
}

/// A `gpus` amount above one that is not a whole number (`gpus:1.5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("gpus must be below 1 (a fraction of one GPU) or a whole number, got {}", *.0 as f64 / MILLI as f64)]
pub struct BadGpuAmount(pub u64);

impl GpuAmount {
    /// Reads a `gpus` amount in milli-units.
    pub fn from_milli(milli: u64) -> Result<GpuAmount, BadGpuAmount> {
        match milli {
            0 => Ok(GpuAmount::None),
            1..MILLI => Ok(GpuAmount::Fraction(milli as u32)),
            m if m.is_multiple_of(MILLI) => Ok(GpuAmount::Whole(m / MILLI)),
            m => Err(BadGpuAmount(m)),
        }
    }

    /// Milli-GPUs this amount takes of each GPU it is given (1000 for whole GPUs).
    pub fn per_gpu_milli(self) -> u32 {
        match self {
            GpuAmount::None => 0,
            GpuAmount::Fraction(m) => m,
            GpuAmount::Whole(_) => MILLI as u32,
        }
    }

    /// How many GPUs it is given.
    pub fn gpu_count(self) -> u64 {
        match self {
            GpuAmount::None => 0,
            GpuAmount::Fraction(_) => 1,
            GpuAmount::Whole(k) => k,
        }
    }
}

impl Resources {
    /// This bag's `gpus`, read as a fraction of one GPU or whole GPUs.
    pub fn gpu_amount(&self) -> Result<GpuAmount, BadGpuAmount> {
        GpuAmount::from_milli(self.milli("gpus"))
    }
}

/// Upper bounds per resource kind, e.g. a quota limit. Unlike a [`Resources`] bag, an explicit
/// zero is kept and means "none of this kind" (`cpus:0;mem:1024`); a kind that is not named is
/// unlimited. Serialized like [`Resources`] (a map of numbers), zeros included.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct ResourceLimits {
    amounts: BTreeMap<Name, u64>,
}

impl ResourceLimits {
    /// No limit on any kind.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses `"cpus:0;mem:1024"`, keeping zero amounts (a limit of zero).
    pub fn parse(text: &str) -> Result<Self, ResourceParseError> {
        let mut out = ResourceLimits::new();
        for (name, milli) in parse_entries(text)? {
            out.amounts.insert(name_of(name), milli);
        }
        Ok(out)
    }

    /// Sets the limit of `name` to `milli` milli-units (zero is kept: a limit of zero).
    pub fn set_milli(&mut self, name: &str, milli: u64) {
        self.amounts.insert(name_of(name), milli);
    }

    /// The limit of `name` in milli-units, `None` when the kind is unlimited.
    pub fn limit(&self, name: &str) -> Option<u64> {
        self.amounts.get(name).copied()
    }

    /// True when no kind is limited.
    pub fn is_empty(&self) -> bool {
        self.amounts.is_empty()
    }

    /// `(name, milli-units)` pairs of the limited kinds, in name order (zeros included).
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.amounts.iter().map(|(k, v)| (&**k, *v))
    }

    /// True when `r` is within every limit.
    pub fn allows(&self, r: &Resources) -> bool {
        self.iter().all(|(name, limit)| r.milli(name) <= limit)
    }
}

impl From<&Resources> for ResourceLimits {
    /// Limits at the amounts of a bag (kinds absent from the bag stay unlimited).
    fn from(r: &Resources) -> Self {
        ResourceLimits {
            amounts: r.amounts.clone(),
        }
    }
}

impl std::str::FromStr for ResourceLimits {
    type Err = ResourceParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ResourceLimits::parse(s)
    }
}

impl fmt::Display for ResourceLimits {
    /// The syntax [`ResourceLimits::parse`] accepts, zeros included: `cpus:0;mem:1024`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_amounts(self.iter(), f)
    }
}

impl fmt::Debug for ResourceLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResourceLimits({self})")
    }
}

impl Serialize for ResourceLimits {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let human = s.is_human_readable();
        let mut m = s.serialize_map(Some(self.amounts.len()))?;
        for (k, v) in &self.amounts {
            if human {
                m.serialize_entry(&**k, &(*v as f64 / MILLI as f64))?;
            } else {
                m.serialize_entry(&**k, v)?;
            }
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for ResourceLimits {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut out = ResourceLimits::new();
        if d.is_human_readable() {
            for (k, v) in BTreeMap::<String, f64>::deserialize(d)? {
                if !valid_name(&k) {
                    return Err(D::Error::custom(ResourceParseError::BadName(k)));
                }
                let milli = to_milli(v).ok_or_else(|| {
                    D::Error::custom(ResourceParseError::BadAmount(v.to_string()))
                })?;
                out.set_milli(&k, milli);
            }
        } else {
            for (k, v) in BTreeMap::<String, u64>::deserialize(d)? {
                if !valid_name(&k) {
                    return Err(D::Error::custom(ResourceParseError::BadName(k)));
                }
                out.set_milli(&k, v);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        let r = Resources::parse("cpus:2.5; mem:1024;disk:0;gpus:1").unwrap();
        assert_eq!(r.milli("cpus"), 2500);
        assert_eq!(r.get("mem"), 1024.0);
        assert_eq!(r.milli("disk"), 0);
        assert_eq!(r.to_string(), "cpus:2.5;gpus:1;mem:1024");
        assert_eq!(Resources::parse(&r.to_string()).unwrap(), r);
    }

    #[test]
    fn parse_rejects_bad_input() {
        assert!(matches!(
            Resources::parse("cpus"),
            Err(ResourceParseError::Syntax(_))
        ));
        assert!(matches!(
            Resources::parse("cpus:-1"),
            Err(ResourceParseError::BadAmount(_))
        ));
        assert!(matches!(
            Resources::parse("cpus:NaN"),
            Err(ResourceParseError::BadAmount(_))
        ));
        assert!(matches!(
            Resources::parse("c pus:1"),
            Err(ResourceParseError::BadName(_))
        ));
        assert!(matches!(
            Resources::parse("cpus:1;cpus:2"),
            Err(ResourceParseError::Duplicate(_))
        ));
        assert!(Resources::parse("").unwrap().is_empty());
    }

    #[test]
    fn arithmetic_is_exact() {
        let tenth = Resources::parse("cpus:0.1").unwrap();
        let mut sum = Resources::new();
        for _ in 0..10 {
            sum.add_assign(&tenth);
        }
        assert_eq!(sum, Resources::parse("cpus:1").unwrap());
        let mut total = Resources::parse("cpus:4;mem:100").unwrap();
        assert!(total
            .checked_sub_assign(&Resources::parse("cpus:5").unwrap())
            .is_none());
        assert_eq!(total, Resources::parse("cpus:4;mem:100").unwrap());
        total
            .checked_sub_assign(&Resources::parse("cpus:4;mem:1").unwrap())
            .unwrap();
        assert_eq!(total, Resources::parse("mem:99").unwrap());
        assert!(total.contains(&Resources::new()));
    }

    #[test]
    fn json_uses_plain_numbers() {
        let r = Resources::parse("cpus:2;mem:1024").unwrap();
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"cpus":2.0,"mem":1024.0}"#
        );
        let back: Resources = serde_json::from_str(r#"{"cpus":2.0,"mem":1024.0}"#).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn gpu_amounts() {
        let g = |t: &str| Resources::parse(t).unwrap().gpu_amount();
        assert_eq!(g("cpus:1"), Ok(GpuAmount::None));
        assert_eq!(g("gpus:0.25"), Ok(GpuAmount::Fraction(250)));
        assert_eq!(g("gpus:0.001"), Ok(GpuAmount::Fraction(1)));
        assert_eq!(g("gpus:1"), Ok(GpuAmount::Whole(1)));
        assert_eq!(g("gpus:3"), Ok(GpuAmount::Whole(3)));
        assert_eq!(g("gpus:1.5"), Err(BadGpuAmount(1500)));
        assert!(BadGpuAmount(1500).to_string().contains("1.5"));
        assert_eq!(GpuAmount::Fraction(250).per_gpu_milli(), 250);
        assert_eq!(GpuAmount::Whole(2).per_gpu_milli(), 1000);
        assert_eq!(GpuAmount::Whole(2).gpu_count(), 2);
        // Four quarters are exactly one GPU.
        let mut sum = Resources::new();
        for _ in 0..4 {
            sum.add_assign(&Resources::parse("gpus:0.25").unwrap());
        }
        assert_eq!(sum.gpu_amount(), Ok(GpuAmount::Whole(1)));
    }

    #[test]
    fn limits_keep_explicit_zeros() {
        let l = ResourceLimits::parse("cpus:0; mem:1024").unwrap();
        assert_eq!(l.limit("cpus"), Some(0));
        assert_eq!(l.limit("mem"), Some(1_024_000));
        assert_eq!(l.limit("gpus"), None, "kinds not named are unlimited");
        assert_eq!(l.to_string(), "cpus:0;mem:1024");
        assert_eq!(ResourceLimits::parse(&l.to_string()).unwrap(), l);
        assert!(!l.allows(&Resources::parse("cpus:0.001").unwrap()));
        assert!(l.allows(&Resources::parse("mem:1024;gpus:8").unwrap()));
        let json = serde_json::to_string(&l).unwrap();
        assert_eq!(json, r#"{"cpus":0.0,"mem":1024.0}"#);
        let back: ResourceLimits = serde_json::from_str(&json).unwrap();
        assert_eq!(back, l);
        // A bag drops the zero: the same text is a different thing as resources.
        assert!(Resources::parse("cpus:0").unwrap().is_empty());
        assert!(matches!(
            ResourceLimits::parse("cpus:1;cpus:0"),
            Err(ResourceParseError::Duplicate(_))
        ));
        assert!(ResourceLimits::parse("").unwrap().is_empty());
    }
}
