//! The operator port's route table: every route is added through [`Routes`], which builds the
//! axum router and, from the same calls, the list of `(method, path)` pairs the port serves.
//! A unit test compares that list with docs/api/openapi.yaml both ways, so the spec cannot
//! miss an endpoint the server routes (nor document one it does not).

use axum::handler::Handler;
use axum::Router;

/// A router and the `(method, path)` pairs added to it (methods in lower case, as OpenAPI
/// writes them).
pub(super) struct Routes<S> {
    pub(super) router: Router<S>,
    pub(super) table: Vec<(&'static str, &'static str)>,
}

impl<S: Clone + Send + Sync + 'static> Routes<S> {
    pub(super) fn new() -> Self {
        Self {
            router: Router::new(),
            table: Vec::new(),
        }
    }

    /// `GET path` (routes of one path with several methods merge).
    pub(super) fn get<H: Handler<T, S>, T: 'static>(mut self, path: &'static str, h: H) -> Self {
        self.router = self.router.route(path, axum::routing::get(h));
        self.table.push(("get", path));
        self
    }

    /// `POST path`.
    pub(super) fn post<H: Handler<T, S>, T: 'static>(mut self, path: &'static str, h: H) -> Self {
        self.router = self.router.route(path, axum::routing::post(h));
        self.table.push(("post", path));
        self
    }

    /// `DELETE path`.
    pub(super) fn delete<H: Handler<T, S>, T: 'static>(mut self, path: &'static str, h: H) -> Self {
        self.router = self.router.route(path, axum::routing::delete(h));
        self.table.push(("delete", path));
        self
    }

    /// Both tables and routers.
    pub(super) fn merge(mut self, other: Routes<S>) -> Self {
        self.router = self.router.merge(other.router);
        self.table.extend(other.table);
        self
    }

    /// The router changed by `f` (layers), the table as is.
    pub(super) fn map(mut self, f: impl FnOnce(Router<S>) -> Router<S>) -> Self {
        self.router = f(self.router);
        self
    }
}

/// The `(method, path)` pairs an OpenAPI document in this repository's style declares: paths
/// are the two-space-indented keys under `paths:`, methods the four-space-indented keys below
/// them. Path parameters are written `{}` whatever their name.
#[cfg(test)]
pub(super) fn spec_routes(yaml: &str) -> std::collections::BTreeSet<(String, String)> {
    let mut out = std::collections::BTreeSet::new();
    let mut in_paths = false;
    let mut path: Option<String> = None;
    for line in yaml.lines() {
        if !line.starts_with(' ') && !line.trim().is_empty() {
            in_paths = line.trim_end() == "paths:";
            path = None;
            continue;
        }
        if !in_paths {
            continue;
        }
        if let Some(p) = line.strip_prefix("  /") {
            path = p.strip_suffix(':').map(|p| normalize(&format!("/{p}")));
        } else if let (Some(p), Some(m)) = (&path, line.strip_prefix("    ")) {
            let m = m.trim_end();
            if let Some(m) = m.strip_suffix(':') {
                if ["get", "post", "put", "delete", "patch"].contains(&m) {
                    out.insert((m.to_string(), p.clone()));
                }
            }
        }
    }
    out
}

/// A path with every `{param}` written `{}`.
#[cfg(test)]
pub(super) fn normalize(path: &str) -> String {
    let mut out = String::new();
    let mut in_param = false;
    for c in path.chars() {
        match c {
            '{' => {
                in_param = true;
                out.push('{');
            }
            '}' => {
                in_param = false;
                out.push('}');
            }
            _ if in_param => {}
            c => out.push(c),
        }
    }
    out
}
