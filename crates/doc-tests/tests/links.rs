//! The links of the README, the guide and docs/*.md: every relative link reaches a file
//! of the repository, every `#anchor` a heading of its page, and the guide's links stay
//! inside the guide (the built book has nothing else), as do its `{{#include}}`s' files.
//! Web links are left alone (the tests run without the network).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The markdown files checked: README.md, CHANGELOG.md, docs/*.md, docs/guide/src/**.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() && !path.is_symlink() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// `path` without `.` and `..` (which may lead through a symlink nowhere real).
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The text outside code: fenced blocks and inline code spans removed.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push('\n');
            continue;
        }
        if fenced {
            out.push('\n');
            continue;
        }
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                out.push(c);
            }
        }
        out.push('\n');
    }
    out
}

/// The anchors of a page's headings, as GitHub and mdBook make them (lowercase, letters,
/// digits, `-` and `_` kept, spaces as `-`, the rest dropped; a repeated one gets `-1`,
/// `-2`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let mut slug = String::new();
        for c in title.to_lowercase().chars() {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                slug.push(c);
            } else if c == ' ' {
                slug.push('-');
            }
        }
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// Every `[text](target)` of a page's prose, and every `{{#include target}}`.
fn links(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].trim().to_owned());
        }
    }
    let mut rest = text;
    while let Some(i) = rest.find("{{#include ") {
        rest = &rest[i + "{{#include ".len()..];
        if let Some(end) = rest.find("}}") {
            out.push(format!("include:{}", rest[..end].trim()));
        }
    }
    out
}

#[test]
fn every_link_reaches_its_file_and_heading() {
    let root = normal(&root());
    let guide = root.join("docs/guide/src");
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let page = normal(&page);
        let text = std::fs::read_to_string(&page).unwrap();
        for link in links(&text) {
            let (include, link) = match link.strip_prefix("include:") {
                Some(target) => (true, target.to_owned()),
                None => (false, link),
            };
            if link.starts_with("http://")
                || link.starts_with("https://")
                || link.starts_with("mailto:")
            {
                continue;
            }
            checked += 1;
            let (file, anchor) = match link.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (link.as_str(), None),
            };
            let target = if file.is_empty() {
                page.clone()
            } else {
                normal(&page.parent().unwrap().join(file))
            };
            let shown = format!("{}: ({link})", page.strip_prefix(&root).unwrap().display());
            if !target.starts_with(&root) || !target.exists() {
                broken.push(format!("{shown}: no such file"));
                continue;
            }
            // The book holds only the guide: a link out of it breaks there (an
            // included file is read at build time, so it may be anywhere).
            if page.starts_with(&guide) && !include && !target.starts_with(&guide) {
                broken.push(format!(
                    "{shown}: leaves the guide (name the file in code instead)"
                ));
            }
            if let Some(anchor) = anchor {
                let target_text = std::fs::read_to_string(&target).unwrap_or_default();
                if !anchors(&target_text).contains(anchor) {
                    broken.push(format!("{shown}: no heading #{anchor}"));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} links found: is the parser right?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_chapter_is_in_the_summary_and_the_summary_names_only_chapters() {
    let guide = root().join("docs/guide/src");
    let summary = std::fs::read_to_string(guide.join("SUMMARY.md")).unwrap();
    let listed: BTreeSet<String> = links(&summary).into_iter().collect();
    for entry in std::fs::read_dir(&guide).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && name != "SUMMARY.md" {
            assert!(listed.contains(&name), "{name} is not in SUMMARY.md");
        }
    }
    for chapter in &listed {
        assert!(
            guide.join(chapter).exists(),
            "SUMMARY.md lists {chapter}, which is missing"
        );
    }
}

#[test]
fn the_anchor_rules_are_github_s() {
    let a = anchors(
        "# `run`, `try_run` or a guard: what each one sees\n## Redlock: several independent masters\n## A\n## A\n",
    );
    assert!(
        a.contains("run-try_run-or-a-guard-what-each-one-sees"),
        "{a:?}"
    );
    assert!(a.contains("redlock-several-independent-masters"), "{a:?}");
    assert!(a.contains("a") && a.contains("a-1"), "{a:?}");
}
