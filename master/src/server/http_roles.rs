//! `POST /weights` and `POST /quota` (also `/api/v1/weights`, `/api/v1/quotas`): an
//! operator's change to a role's weight or quota, validated here and applied by the core.

use super::*;

/// `POST /weights` with `{"role": "eng/ml", "weight": 2.0}`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct WeightRequest {
    role: String,
    weight: f64,
}

/// `POST /quota` (and `POST /api/v1/quotas`) with
/// `{"role": "eng", "guarantee": "cpus:8;mem:16384", "limit": "cpus:16"}`: a part given as
/// text is set, one given as `null` is removed, one left out is kept as it is (a change never
/// drops a part silently); `cpus:0` in a limit is a limit of zero. Invalid quotas (bad syntax,
/// a resource kind the cluster does not know, guarantee above limit, guarantees that do not
/// nest) are answered 400 with the reason. A limit below what the role's tasks hold is
/// accepted, with a warning in the answer (`{"ok": true, "warnings": [...]}`).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaRequest {
    role: String,
    #[serde(default, deserialize_with = "present")]
    guarantee: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    limit: Option<Option<String>>,
}

/// A field that is present: `Some(None)` for `null`, `Some(Some(..))` for a value (a missing
/// field is `None` through `#[serde(default)]`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    use serde::Deserialize;
    Option::<String>::deserialize(d).map(Some)
}

pub(in crate::server) async fn weights_handler(
    State(app): State<App>,
    caller: Option<axum::Extension<Caller>>,
    body: Bytes,
) -> ApiResult {
    let who = app.may_write(&caller_of(caller), OperatorAction::SetWeight)?;
    let req: WeightRequest = parse_json(&body)?;
    operator(
        &app,
        who,
        OperatorCommand::SetWeight {
            role: req.role,
            weight: req.weight,
        },
    )
    .await
}

pub(in crate::server) async fn quota_handler(
    State(app): State<App>,
    caller: Option<axum::Extension<Caller>>,
    body: Bytes,
) -> ApiResult {
    let who = app.may_write(&caller_of(caller), OperatorAction::SetQuota)?;
    let req: QuotaRequest = parse_json(&body)?;
    fn part<T: std::str::FromStr<Err = gantry_proto::ResourceParseError>>(
        s: Option<Option<String>>,
        what: &str,
    ) -> Result<QuotaPart<T>, ApiError> {
        Ok(match s {
            None => QuotaPart::Keep,
            Some(None) => QuotaPart::Remove,
            Some(Some(s)) => QuotaPart::Set(
                s.parse()
                    .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("{what}: {e}")))?,
            ),
        })
    }
    let guarantee: QuotaPart<gantry_proto::Resources> = part(req.guarantee, "guarantee")?;
    // A limit keeps explicit zeros: "cpus:0" means no cpus at all.
    let limit: QuotaPart<gantry_proto::ResourceLimits> = part(req.limit, "limit")?;
    let new_limit = match &limit {
        QuotaPart::Set(l) => Some(l.clone()),
        _ => None,
    };
    let role = req.role.clone();
    let Json(mut answer) = operator(
        &app,
        who,
        OperatorCommand::ChangeQuota {
            role: req.role,
            guarantee,
            limit,
        },
    )
    .await?;
    if let Some(limit) = new_limit {
        // The state after the change: what the role's tasks hold now.
        if let Ok(state) = app.state().await {
            let warnings = crate::server::api::views::limit_warnings(&state, &role, &limit);
            if !warnings.is_empty() {
                for w in &warnings {
                    tracing::warn!(%role, "quota: {w}");
                }
                answer["warnings"] = serde_json::json!(warnings);
            }
        }
    }
    Ok(Json(answer))
}
