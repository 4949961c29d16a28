//! Logging in to the dashboard with an operator token (a session cookie with a CSRF token;
//! a browser with an operator certificate needs none) and logging out.

use super::*;

#[derive(serde::Deserialize)]
pub(super) struct LoginQuery {
    token: Option<String>,
}

pub(super) async fn login_page(
    query: Result<Query<LoginQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if query.ok().and_then(|q| q.0.token).is_some() {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "tokens in URLs are refused (they end up in browser history and logs): \
             POST the login form",
        )
        .into_response();
    }
    login_form_page(StatusCode::OK, None)
}

/// The login form with a fresh CSRF token (cookie + hidden field).
pub(super) fn login_form_page(status: StatusCode, error: Option<&str>) -> Response {
    let Ok(csrf) = crate::security::tokens::generate() else {
        return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "no system randomness")
            .into_response();
    };
    let mut resp = (status, Html(render_login(error, &csrf))).into_response();
    set_cookie(
        &mut resp,
        &format!(
            "{CSRF_COOKIE}={csrf}; Path=/ui/login; Max-Age={CSRF_SECONDS}; HttpOnly; Secure; SameSite=Strict"
        ),
    );
    resp
}

pub(super) fn set_cookie(resp: &mut Response, cookie: &str) {
    if let Ok(v) = HeaderValue::from_str(cookie) {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
}

/// The value of form field `name` in an urlencoded body.
pub(super) fn form_field(body: &Bytes, name: &str) -> String {
    form_urlencoded::parse(body)
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// `POST /ui/login`: checks the form's CSRF token, then the token under the address's
/// failed-authentication limit; starts a session and sends the browser to the dashboard.
pub(super) async fn login_form(
    State(app): State<App>,
    info: Option<axum::Extension<ConnInfo>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let csrf = form_field(&body, "csrf");
    let expected = cookie_in(&headers, CSRF_COOKIE).unwrap_or_default();
    if expected.is_empty() || !bool::from(expected.as_bytes().ct_eq(csrf.as_bytes())) {
        return login_form_page(
            StatusCode::FORBIDDEN,
            Some("the login form expired or was not sent by this dashboard; try again"),
        );
    }
    let token = form_field(&body, "token");
    let remote = info.map(|i| i.0.remote);
    let name = match app.check_token(remote, token.trim()) {
        Ok(name) => name,
        Err(e) if e.status == StatusCode::UNAUTHORIZED => {
            return login_form_page(StatusCode::UNAUTHORIZED, Some("unknown token"))
        }
        Err(e) => return e.into_response(),
    };
    let session = match app.sessions.create(token.trim(), Instant::now()) {
        Ok(s) => s,
        Err(e) => return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e).into_response(),
    };
    tracing::info!(operator = %name, "dashboard login");
    let mut resp = see_other("/ui");
    set_cookie(
        &mut resp,
        &format!(
            "{SESSION_COOKIE}={session}; Path=/; Max-Age={}; HttpOnly; Secure; SameSite=Strict",
            app.sessions.lifetime().as_secs()
        ),
    );
    set_cookie(
        &mut resp,
        &format!("{CSRF_COOKIE}=; Path=/ui/login; Max-Age=0; HttpOnly; Secure; SameSite=Strict"),
    );
    set_cookie(&mut resp, OLD_TOKEN_COOKIE_CLEARED);
    resp
}

/// Earlier versions kept the token itself in the `gantry_token` cookie; logging in or out
/// removes it from the browser (the master no longer reads it).
pub(super) const OLD_TOKEN_COOKIE_CLEARED: &str =
    "gantry_token=; Path=/; Max-Age=0; HttpOnly; Secure; SameSite=Strict";

/// `POST /ui/logout` with the session's CSRF token: ends the session on the master.
pub(super) async fn logout(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    let id = cookie_in(&headers, SESSION_COOKIE).unwrap_or_default();
    let csrf = form_field(&body, "csrf");
    if !app.sessions.end_with_csrf(&id, &csrf, Instant::now()) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "no such session, or the logout form was not sent by this dashboard",
        )
        .into_response();
    }
    let mut resp = see_other("/ui/login");
    set_cookie(
        &mut resp,
        &format!("{SESSION_COOKIE}=; Path=/; Max-Age=0; HttpOnly; Secure; SameSite=Strict"),
    );
    set_cookie(&mut resp, OLD_TOKEN_COOKIE_CLEARED);
    resp
}

pub(super) fn render_login(error: Option<&str>, csrf: &str) -> String {
    let err = error
        .map(|e| format!("<p class=\"bad\">{}</p>", esc(e)))
        .unwrap_or_default();
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Gantry login</title>\
         <link rel=\"stylesheet\" href=\"/ui/style.css\"></head><body>\
         <form class=\"login\" method=\"post\" action=\"/ui/login\"><h2>Gantry dashboard</h2>{err}\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <label>Operator token (<code>gantryctl token create NAME</code>)\
         <input type=\"password\" name=\"token\" autocomplete=\"off\" autofocus></label>\
         <button type=\"submit\">Log in</button>\
         <p class=\"muted\">A browser with an operator certificate needs no token.</p></form></body></html>"
    )
}
