//! Parsing of the agent's command-line values.

use std::collections::BTreeMap;

use gantry_proto::Attributes;
use gantry_proto::Resources;

/// Errors in the agent's configuration values.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("attribute {0:?} is not of the form KEY:VALUE")]
    Attribute(String),
    #[error("reservation {0:?} is not of the form ROLE=RESOURCES (e.g. ml=cpus:2;mem:1024)")]
    Reservation(String),
    #[error("--price-per-hour / attribute price_per_hour: {0}")]
    Price(#[from] gantry_placement::cost::BadPrice),
    #[error(
        "--price-per-hour {flag} and the attribute price_per_hour:{attribute} disagree (give one)"
    )]
    PriceTwice { flag: String, attribute: String },
    #[error("reservation for role {role:?}: {source}")]
    ReservationResources {
        role: String,
        source: gantry_proto::ResourceParseError,
    },
}

/// Parses `"rack:r1;zone:a"`.
pub fn parse_attributes(text: &str) -> Result<Attributes, ConfigError> {
    let mut out = BTreeMap::new();
    for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (k, v) = entry
            .split_once(':')
            .ok_or_else(|| ConfigError::Attribute(entry.to_string()))?;
        let (k, v) = (k.trim(), v.trim());
        if k.is_empty() {
            return Err(ConfigError::Attribute(entry.to_string()));
        }
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

/// Sets the agent's price (`--price-per-hour`, `None` when not given) as the attribute
/// `price_per_hour` (`gantry_placement::cost::PRICE_ATTRIBUTE`), the way the master's usage
/// reports read it. A price given directly as that attribute is checked the same way: finite
/// and ≥ 0; both given must agree.
pub fn apply_price(attributes: &mut Attributes, flag: Option<&str>) -> Result<(), ConfigError> {
    use gantry_placement::cost::{parse_price, PRICE_ATTRIBUTE};
    let given = attributes.get(PRICE_ATTRIBUTE).cloned();
    if let Some(a) = &given {
        parse_price(a)?;
    }
    if let Some(f) = flag {
        let price = parse_price(f)?;
        if let Some(a) = given {
            if parse_price(&a)? != price {
                return Err(ConfigError::PriceTwice {
                    flag: f.to_string(),
                    attribute: a,
                });
            }
        }
        attributes.insert(PRICE_ATTRIBUTE.to_string(), f.trim().to_string());
    }
    Ok(())
}

/// Parses one `ROLE=RESOURCES` static reservation.
pub fn parse_reservation(text: &str) -> Result<(String, Resources), ConfigError> {
    let (role, res) = text
        .split_once('=')
        .ok_or_else(|| ConfigError::Reservation(text.to_string()))?;
    let role = role.trim().to_string();
    if role.is_empty() {
        return Err(ConfigError::Reservation(text.to_string()));
    }
    let resources = Resources::parse(res).map_err(|source| ConfigError::ReservationResources {
        role: role.clone(),
        source,
    })?;
    Ok((role, resources))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_and_reservations() {
        let a = parse_attributes("rack:r1; zone:a").unwrap();
        assert_eq!(a["rack"], "r1");
        assert!(parse_attributes("rack").is_err());
        let (role, r) = parse_reservation("ml=cpus:2;mem:1024").unwrap();
        assert_eq!(role, "ml");
        assert_eq!(r.get("cpus"), 2.0);
        assert!(parse_reservation("cpus:2").is_err());
        assert!(parse_reservation("ml=cpus:x").is_err());
    }

    #[test]
    fn a_price_is_an_attribute_checked_either_way() {
        let mut a = parse_attributes("rack:r1").unwrap();
        apply_price(&mut a, Some("2.5")).unwrap();
        assert_eq!(a["price_per_hour"], "2.5");
        let mut direct = parse_attributes("price_per_hour:0.4").unwrap();
        apply_price(&mut direct, None).unwrap();
        assert_eq!(direct["price_per_hour"], "0.4");
        apply_price(&mut direct, Some("0.40")).unwrap();
        for (attrs, flag) in [
            ("", Some("-1")),
            ("", Some("NaN")),
            ("", Some("inf")),
            ("price_per_hour:cheap", None),
            ("price_per_hour:-3", None),
            ("price_per_hour:1", Some("2")),
        ] {
            let mut a = parse_attributes(attrs).unwrap();
            assert!(apply_price(&mut a, flag).is_err(), "{attrs} {flag:?}");
        }
        let mut none = parse_attributes("").unwrap();
        apply_price(&mut none, None).unwrap();
        assert!(none.is_empty());
    }
}
