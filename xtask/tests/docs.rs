//! The repository carries its own documentation: every relative link in README.md and docs/
//! resolves to a file inside the repository (and, for a Markdown file with an anchor, to one of
//! its headings), and nothing points at material a clone does not have.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lies in the workspace")
        .canonicalize()
        .expect("the workspace exists")
}

/// README.md, every Markdown file under docs/, and the shipped traces' README.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut files = vec![
        root.join("README.md"),
        root.join("crates/alloc-trace/traces/README.md"),
    ];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The targets of every inline Markdown link `[text](target)` outside code blocks and spans.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        // Drop code spans: a link inside backticks is not a link.
        let mut plain = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                plain.push_str(part);
            }
        }
        let mut rest = plain.as_str();
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].trim().to_owned());
            rest = &after[end..];
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> Vec<String> {
    let mut in_fence = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        } else if !in_fence && line.starts_with('#') {
            out.push(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

#[test]
fn every_relative_link_resolves_inside_the_repository() {
    let root = root();
    let mut checked = 0;
    let mut broken = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let dir = doc.parent().unwrap();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = match target.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                doc.clone()
            } else {
                dir.join(path)
            };
            let Ok(file) = file.canonicalize() else {
                broken.push(format!("{}: {target} does not exist", doc.display()));
                continue;
            };
            if !file.starts_with(&root) {
                broken.push(format!("{}: {target} leaves the repository", doc.display()));
                continue;
            }
            if let Some(fragment) = fragment {
                let is_md = file.extension().is_some_and(|x| x == "md");
                if is_md
                    && !anchors(&std::fs::read_to_string(&file).unwrap())
                        .contains(&fragment.to_owned())
                {
                    broken.push(format!("{}: {target} has no such heading", doc.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked > 50,
        "only {checked} links found: is the scanner right?"
    );
}

#[test]
fn nothing_points_at_material_outside_the_repository() {
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for (i, line) in text.lines().enumerate() {
            assert!(
                !line.contains("shared/spec") && !line.contains("../shared/"),
                "{}:{}: {line}",
                doc.display(),
                i + 1
            );
        }
    }
}

#[test]
fn the_scanner_finds_links_and_anchors() {
    let text = "# A `b` c!\n[x](a.md) `[no](b.md)` [y](../c.md#d-e)\n```\n[z](f.md)\n```\n";
    assert_eq!(links(text), ["a.md", "../c.md#d-e"]);
    assert_eq!(anchors(text), ["a-b-c"]);
}
