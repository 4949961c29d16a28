//! The operator API's connection handling, limits and authentication.

use super::*;

fn with_auth(value: &str) -> Request {
    Request::builder()
        .header(header::AUTHORIZATION, value)
        .body(Body::empty())
        .unwrap()
}

#[test]
fn bearer_tokens_are_read_strictly() {
    assert_eq!(bearer(&with_auth("Bearer abc")), Some(Ok("abc")));
    assert_eq!(bearer(&with_auth("bearer  abc ")), Some(Ok("abc")));
    for bad in [
        "Basic YWxhZGRpbjpvcGVuc2VzYW1l",
        "Bearer",
        "Bearer   ",
        "abc",
    ] {
        assert!(matches!(bearer(&with_auth(bad)), Some(Err(_))), "{bad:?}");
    }
    let none = Request::builder().body(Body::empty()).unwrap();
    assert_eq!(bearer(&none), None);
}

#[test]
fn the_dashboard_cookie_is_found_among_others() {
    let req = |cookies: &[&str]| {
        let mut b = Request::builder();
        for c in cookies {
            b = b.header(header::COOKIE, *c);
        }
        b.body(Body::empty()).unwrap()
    };
    let session = |r: &Request| cookie(r, SESSION_COOKIE);
    assert_eq!(
        session(&req(&["a=1; gantry_session=tok; b=2"])),
        Some("tok".into())
    );
    assert_eq!(
        session(&req(&["a=1", "gantry_session=t2"])),
        Some("t2".into())
    );
    assert_eq!(session(&req(&["gantry_session="])), None);
    assert_eq!(session(&req(&["xgantry_session=t"])), None);
    assert_eq!(session(&req(&[])), None);
}

#[test]
fn errors_carry_a_code_and_the_right_headers() {
    let e = ApiError::new(StatusCode::UNAUTHORIZED, "who?");
    assert_eq!(e.code(), "unauthorized");
    let resp = e.into_response();
    assert!(resp.headers().contains_key(header::WWW_AUTHENTICATE));
    let resp = ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "big").into_response();
    assert_eq!(resp.headers()[header::CONNECTION], "close");
    assert_eq!(
        ApiError::new(StatusCode::FORBIDDEN, "no").code(),
        "forbidden"
    );
    let e = ApiError::too_many("slow down", Duration::from_millis(2500));
    assert_eq!(e.code(), "too_many_requests");
    let resp = e.into_response();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(resp.headers()[header::RETRY_AFTER], "3");
}

#[test]
fn the_openapi_spec_documents_exactly_the_routes_served() {
    use super::super::routes::{normalize, spec_routes};
    let spec = spec_routes(include_str!("../../../docs/api/openapi.yaml"));
    assert!(spec.len() > 30, "the spec parsed to {spec:?}");
    let served: std::collections::BTreeSet<(String, String)> = all_routes()
        .table
        .into_iter()
        .map(|(m, p)| (m.to_string(), normalize(p)))
        .collect();
    let undocumented: Vec<_> = served.difference(&spec).collect();
    let not_served: Vec<_> = spec.difference(&served).collect();
    assert!(
        undocumented.is_empty() && not_served.is_empty(),
        "served but not in docs/api/openapi.yaml: {undocumented:?}\n\
         in docs/api/openapi.yaml but not served: {not_served:?}"
    );
}
