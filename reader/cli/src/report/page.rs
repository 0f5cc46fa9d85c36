//! The report's page: [`write_html`] inlines what [`super::data`] computed, the page's script and [uPlot](https://github.com/leeoniya/uPlot) (MIT, ~50 KB, for the two time
//! charts) into one file. Every string from a trace reaches the page as JSON data and is put into
//! the DOM as text, never as markup.

use std::io::{self, Write};

use super::data::ReportData;

const TEMPLATE: &str = include_str!("../../assets/report.html");
const STYLE: &str = include_str!("../../assets/report.css");
const SCRIPT: &str = include_str!("../../assets/report.js");
const UPLOT_JS: &str = include_str!("../../assets/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../assets/uPlot.min.css");

/// JSON that is safe inside a `<script>` element: no `<`, `>` or `&` (so no `</script>` or
/// `<!--` can end or change it) and no U+2028/U+2029 (line ends to old JavaScript parsers).
pub fn script_json(value: &impl serde::Serialize) -> String {
    let json = serde_json::to_string(value).expect("report data serializes");
    let mut out = String::with_capacity(json.len() + json.len() / 64);
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// Text safe inside HTML element content and attribute values.
pub fn html_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Writes the page: the template with each `{{NAME}}` replaced once, in one pass, so that nothing
/// inserted is ever scanned for markers again.
pub fn write_html(out: &mut impl Write, data: &ReportData) -> io::Result<()> {
    let mut rest = TEMPLATE;
    while let Some(at) = rest.find("{{") {
        out.write_all(&rest.as_bytes()[..at])?;
        let after = &rest[at + 2..];
        let end = after
            .find("}}")
            .expect("template markers are closed (a test checks)");
        match &after[..end] {
            "TITLE" => out.write_all(html_text(&data.title).as_bytes())?,
            "STYLE" => out.write_all(STYLE.as_bytes())?,
            "UPLOT_CSS" => out.write_all(UPLOT_CSS.as_bytes())?,
            "UPLOT_JS" => out.write_all(UPLOT_JS.as_bytes())?,
            "SCRIPT" => out.write_all(SCRIPT.as_bytes())?,
            "DATA" => out.write_all(script_json(data).as_bytes())?,
            other => unreachable!("unknown template marker {other} (a test checks)"),
        }
        rest = &after[end + 2..];
    }
    out.write_all(rest.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_json_cannot_close_the_script_element() {
        let s = script_json(&"</script><script>alert(1)</script><!-- & \u{2028}");
        assert!(!s.contains('<') && !s.contains('>') && !s.contains('&'));
        assert!(!s.contains('\u{2028}'));
        let back: String = serde_json::from_str(&s).unwrap();
        assert_eq!(back, "</script><script>alert(1)</script><!-- & \u{2028}");
    }

    #[test]
    fn the_template_has_only_known_markers_and_the_page_embeds_the_data() {
        let data = ReportData {
            title: "<b>t</b>".into(),
            ..ReportData::default()
        };
        let mut page = Vec::new();
        write_html(&mut page, &data).unwrap();
        let page = String::from_utf8(page).unwrap();
        assert!(page.contains("<title>ggml-viz report: &lt;b&gt;t&lt;/b&gt;</title>"));
        assert!(page.contains("\\u003cb\\u003et\\u003c/b\\u003e"));
        assert!(!page.contains("{{"), "a marker was left unreplaced");
        // Nothing that would make the browser fetch anything (uPlot's banner names its home).
        let page = page.replace("/*! https://github.com/leeoniya/uPlot", "");
        for needle in ["http://", "https://", "src=", "href=", "@import", "url("] {
            assert!(!page.contains(needle), "{needle} in the page");
        }
    }
}
