//! Every Markdown link in the project's own documents resolves: a relative link names an
//! existing file, and a `#anchor` names a heading of its target (GitHub's slugs).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// The documents checked: the READMEs a user reads and everything in docs/.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = [
        "README.md",
        "gateway/README.md",
        "loadgen/README.md",
        "profiles/README.md",
    ]
    .iter()
    .map(|p| root.join(p))
    .collect();
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
        let path = entry.expect("docs/ entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            docs.push(path);
        }
    }
    docs.sort();
    docs
}

/// Lines outside fenced and indented code blocks; with `blank_code`, inline code spans are
/// blanked out too (a link-like text in code is not a link).
fn prose_lines(text: &str, blank_code: bool) -> Vec<String> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || line.starts_with("    ") && !line.trim_start().starts_with(['-', '*', '|']) {
            continue;
        }
        let mut out = String::with_capacity(line.len());
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
                out.push(c);
            } else {
                out.push(if in_code && blank_code { ' ' } else { c });
            }
        }
        lines.push(out);
    }
    lines
}

/// Targets of `[text](target)` and `![alt](target)` links, and of `src="..."` in HTML.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose_lines(text, true) {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            // `[a](b "title")`: the target is the first word.
            let target = after[..end].split_whitespace().next().unwrap_or("");
            targets.push(target.trim_matches(['<', '>']).to_owned());
            rest = &after[end..];
        }
        let mut rest = line.as_str();
        while let Some(at) = rest.find("src=\"") {
            let after = &rest[at + 5..];
            let Some(end) = after.find('"') else { break };
            targets.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    targets
}

/// GitHub's anchor for a heading: lowercase, markup and punctuation but `-` and `_` dropped,
/// spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor a document offers; a repeated heading gets `-1`, `-2`, … as on GitHub.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for line in prose_lines(text, false) {
        let Some(heading) = line.trim_start().strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        // `[text](url)` in a heading keeps only its text.
        let mut plain = String::new();
        let mut rest = heading;
        while let Some(open) = rest.find('[') {
            let Some(mid) = rest[open..].find("](") else {
                break;
            };
            let Some(close) = rest[open + mid..].find(')') else {
                break;
            };
            plain += &rest[..open];
            plain += &rest[open + 1..open + mid];
            rest = &rest[open + mid + close + 1..];
        }
        plain += rest;
        let base = slug(&plain);
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// The broken links of `doc`, each with why.
fn broken_links(doc: &Path, text: &str) -> Vec<String> {
    let mut broken = Vec::new();
    for target in link_targets(text) {
        if target.is_empty() {
            broken.push("an empty link".to_owned());
            continue;
        }
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((path, anchor)) => (path, Some(anchor)),
            None => (target.as_str(), None),
        };
        // An anchor into this document is checked against `text` itself.
        let target_text = if path.is_empty() {
            text.to_owned()
        } else {
            let file = doc.parent().expect("a document's folder").join(path);
            if !file.exists() {
                broken.push(format!("{target}: no such file"));
                continue;
            }
            if anchor.is_none() {
                continue;
            }
            if file.extension().is_none_or(|e| e != "md") {
                broken.push(format!(
                    "{target}: an anchor into a file that is not Markdown"
                ));
                continue;
            }
            std::fs::read_to_string(&file).expect("a readable target")
        };
        if let Some(anchor) = anchor
            && !anchors(&target_text).contains(anchor)
        {
            broken.push(format!("{target}: no heading with anchor #{anchor}"));
        }
    }
    broken
}

#[test]
fn every_link_in_the_documents_resolves() {
    let root = workspace_root();
    let mut broken = Vec::new();
    for doc in documents(&root) {
        let text = std::fs::read_to_string(&doc)
            .unwrap_or_else(|err| panic!("reading {}: {err}", doc.display()));
        for why in broken_links(&doc, &text) {
            broken.push(format!(
                "{}: {why}",
                doc.strip_prefix(&root).unwrap_or(&doc).display()
            ));
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("Quick start"), "quick-start");
    assert_eq!(
        slug("`cargo xtask bench` (the matrix)"),
        "cargo-xtask-bench-the-matrix"
    );
    assert_eq!(slug("3. Probe cost"), "3-probe-cost");
    assert_eq!(
        slug("Wait-for: what held the CPU"),
        "wait-for-what-held-the-cpu"
    );
    assert_eq!(slug("breakdown.json"), "breakdownjson");
    assert_eq!(slug("snake_case and ×ratio"), "snake_case-and-ratio");
}

#[test]
fn broken_links_are_found() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let doc = dir.path().join("a.md");
    std::fs::write(dir.path().join("b.md"), "# Title\n## Same\n## Same\n").expect("b.md");
    let text = "# Top `code`\n\
        [ok](b.md) [ok](b.md#title) [ok](b.md#same-1) [ok](#top-code) [web](https://x.org/y)\n\
        [gone](c.md) [no anchor](b.md#nothing) [here](#missing)\n\
        `[code](not-a-link.md)`\n\
        ```\n[fenced](not-a-link.md)\n```\n\
        <img src=\"missing.svg\">\n";
    let broken = broken_links(&doc, text);
    assert_eq!(
        broken,
        [
            "c.md: no such file",
            "b.md#nothing: no heading with anchor #nothing",
            "#missing: no heading with anchor #missing",
            "missing.svg: no such file",
        ],
        "{broken:?}"
    );
}
