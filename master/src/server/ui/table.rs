//! The dashboard's tables: rows filtered by `?q=` (case-insensitive, anywhere in a row's text)
//! and sorted by `?sort=COLUMN&dir=asc|desc` on the server, so both work without script; the
//! page's script does the same in the browser (a text box that hides rows as you type, a click
//! on a header that asks for the sorted table). PURE: rows in, HTML out.
//!
//! Each row is one `<tbody class="item">` (an agent's GPU table travels with its agent), its
//! header cells carry `data-col` and a link to the sorted page. Natural order throughout
//! (`worker-2` before `worker-10`), so the members of a gang sit together.

use std::cmp::Ordering;

use super::esc;

/// What the page was asked for: `?q=&sort=&dir=`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct View {
    /// Keep rows whose text contains this (case-insensitive).
    pub q: Option<String>,
    /// Sort every table that has a column of this key.
    pub sort: Option<String>,
    /// `asc` (the default) or `desc`.
    pub dir: Option<String>,
    /// `main`: the page's `<main>` alone (what the page's script swaps in).
    pub part: Option<String>,
}

impl View {
    /// Refuses a `dir` other than `asc`/`desc` and a `sort` no table of the page has.
    pub fn check(&self, columns: &[&str]) -> Result<(), String> {
        match self.dir.as_deref() {
            None | Some("asc") | Some("desc") => {}
            Some(d) => return Err(format!("dir={d:?}: asc or desc")),
        }
        match self.sort.as_deref() {
            Some(s) if !columns.contains(&s) => Err(format!(
                "sort={s:?}: no column of that name here (columns: {})",
                columns.join(", ")
            )),
            _ => Ok(()),
        }
    }

    fn desc(&self) -> bool {
        self.dir.as_deref() == Some("desc")
    }

    fn needle(&self) -> Option<String> {
        self.q
            .as_deref()
            .map(str::trim)
            .filter(|q| !q.is_empty())
            .map(str::to_lowercase)
    }

    /// The query string of this view sorted by `col` in `dir`.
    fn sorted_by(&self, col: &str, dir: &str) -> String {
        let mut s = form_urlencoded::Serializer::new(String::new());
        if let Some(q) = self.needle() {
            s.append_pair("q", &q);
        }
        s.append_pair("sort", col).append_pair("dir", dir);
        s.finish()
    }
}

/// A column: its key (`?sort=`) and heading.
pub struct Col(pub &'static str, pub &'static str);

/// A cell: its HTML and its plain text (what sorting and filtering look at).
pub struct Cell {
    pub html: String,
    pub text: String,
}

impl Cell {
    /// A cell of plain text (escaped here).
    pub fn text(t: impl Into<String>) -> Self {
        let text = t.into();
        Cell {
            html: esc(&text),
            text,
        }
    }

    /// A cell of HTML with `text` its plain text.
    pub fn html(html: impl Into<String>, text: impl Into<String>) -> Self {
        Cell {
            html: html.into(),
            text: text.into(),
        }
    }

    /// A link to `href` (a dashboard path, escaped here) reading `text`.
    pub fn link(href: &str, text: impl Into<String>) -> Self {
        let text = text.into();
        Cell {
            html: format!("<a href=\"{}\">{}</a>", esc(href), esc(&text)),
            text,
        }
    }
}

/// A row: the attributes of its `<tr>` (already escaped), its cells, and more rows that go
/// with it (HTML).
pub struct Row {
    pub attrs: String,
    pub cells: Vec<Cell>,
    pub after: String,
}

/// `cols` and `rows` as a table `id`, filtered and sorted as `view` asks (rows keep their
/// order otherwise).
pub fn render(id: &str, cols: &[Col], mut rows: Vec<Row>, view: &View) -> String {
    if let Some(q) = view.needle() {
        rows.retain(|r| r.cells.iter().any(|c| c.text.to_lowercase().contains(&q)));
    }
    let sorted = view
        .sort
        .as_deref()
        .and_then(|s| cols.iter().position(|c| c.0 == s));
    if let Some(i) = sorted {
        let key = |r: &Row| r.cells.get(i).map(|c| c.text.clone()).unwrap_or_default();
        rows.sort_by(|a, b| natural(&key(a), &key(b)));
        if view.desc() {
            rows.reverse();
        }
    }
    let mut h = format!("<table class=\"sortable\" id=\"t-{}\"><thead><tr>", esc(id));
    for (i, Col(key, title)) in cols.iter().enumerate() {
        let (arrow, next) = match (sorted == Some(i), view.desc()) {
            (true, false) => (" ▲", "desc"),
            (true, true) => (" ▼", "asc"),
            (false, _) => ("", "asc"),
        };
        h.push_str(&format!(
            "<th data-col=\"{key}\"><a href=\"?{}\">{}{arrow}</a></th>",
            esc(&view.sorted_by(key, next)),
            esc(title)
        ));
    }
    h.push_str("</tr></thead>");
    if rows.is_empty() {
        h.push_str(&format!(
            "<tbody><tr class=\"empty\"><td colspan=\"{}\" class=\"muted\">{}</td></tr></tbody>",
            cols.len(),
            if view.needle().is_some() {
                "no rows match the filter"
            } else {
                "none"
            }
        ));
    }
    for r in rows {
        h.push_str("<tbody class=\"item\"><tr ");
        h.push_str(&r.attrs);
        h.push('>');
        for c in &r.cells {
            h.push_str("<td>");
            h.push_str(&c.html);
            h.push_str("</td>");
        }
        h.push_str("</tr>");
        h.push_str(&r.after);
        h.push_str("</tbody>");
    }
    h.push_str("</table>");
    h
}

/// Natural order, case-insensitive: runs of digits compare as numbers (`w2` < `w10`).
pub fn natural(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let run = |s: &[u8]| s.iter().take_while(|c| c.is_ascii_digit()).count();
                let (la, lb) = (run(a), run(b));
                let trim = |s: &[u8]| {
                    let z = s.iter().take_while(|c| **c == b'0').count();
                    s[z..].to_vec()
                };
                let (na, nb) = (trim(&a[..la]), trim(&b[..lb]));
                let o = na.len().cmp(&nb.len()).then_with(|| na.cmp(&nb));
                if o != Ordering::Equal {
                    return o;
                }
                a = &a[la..];
                b = &b[lb..];
            }
            (Some(x), Some(y)) => {
                let o = x.to_ascii_lowercase().cmp(&y.to_ascii_lowercase());
                if o != Ordering::Equal {
                    return o;
                }
                a = &a[1..];
                b = &b[1..];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(names: &[&str]) -> Vec<Row> {
        names
            .iter()
            .map(|n| Row {
                attrs: format!("data-name=\"{n}\""),
                cells: vec![Cell::text(*n), Cell::text(format!("{}", n.len()))],
                after: String::new(),
            })
            .collect()
    }

    fn order(html: &str) -> Vec<&str> {
        html.split("data-name=\"")
            .skip(1)
            .map(|s| &s[..s.find('"').unwrap()])
            .collect()
    }

    const COLS: [Col; 2] = [Col("name", "name"), Col("len", "length")];

    #[test]
    fn natural_order_puts_gang_members_together() {
        let mut v = vec!["w-10", "W-2", "a", "w-1", "w-02b"];
        v.sort_by(|a, b| natural(a, b));
        assert_eq!(v, ["a", "w-1", "W-2", "w-02b", "w-10"]);
    }

    #[test]
    fn rows_are_filtered_and_sorted_as_asked() {
        let r = rows(&["train-10", "train-2", "etl", "Train-1"]);
        let all = render("t", &COLS, r, &View::default());
        assert_eq!(order(&all), ["train-10", "train-2", "etl", "Train-1"]);
        let view = View {
            q: Some(" TRAIN ".into()),
            sort: Some("name".into()),
            dir: Some("desc".into()),
            part: None,
        };
        let html = render(
            "t",
            &COLS,
            rows(&["train-10", "train-2", "etl", "Train-1"]),
            &view,
        );
        assert_eq!(order(&html), ["train-10", "train-2", "Train-1"]);
        // The header links keep the filter and flip the direction of the sorted column.
        assert!(html.contains("href=\"?q=train&amp;sort=name&amp;dir=asc\">name ▼</a>"));
        assert!(html.contains("href=\"?q=train&amp;sort=len&amp;dir=asc\">length</a>"));
        let none = View {
            q: Some("nothing".into()),
            ..View::default()
        };
        assert!(render("t", &COLS, rows(&["a"]), &none).contains("no rows match"));
    }

    #[test]
    fn bad_views_are_refused() {
        let v = |sort: Option<&str>, dir: Option<&str>| View {
            sort: sort.map(Into::into),
            dir: dir.map(Into::into),
            ..View::default()
        };
        assert!(v(Some("name"), Some("desc")).check(&["name"]).is_ok());
        assert!(v(None, Some("up"))
            .check(&["name"])
            .unwrap_err()
            .contains("asc or desc"));
        assert!(v(Some("colour"), None)
            .check(&["name", "state"])
            .unwrap_err()
            .contains("name, state"));
    }

    #[test]
    fn cells_escape() {
        let c = Cell::link("/ui/tasks/\"x", "<script>");
        assert_eq!(c.html, "<a href=\"/ui/tasks/&quot;x\">&lt;script&gt;</a>");
        assert_eq!(c.text, "<script>");
    }
}
