//! The dependency lines the README and the guide show work as shown: a project beside a
//! clone of this repository, with exactly those lines in its `Cargo.toml`, resolves
//! (`cargo generate-lockfile`, offline: the index the workspace's build fetched), features
//! included. A wrong path or a feature fencelock does not have fails here.

use std::path::Path;
use std::process::Command;

/// The ```toml blocks of a markdown file that declare fencelock, as `[dependencies]`
/// sections (a lone `fencelock = ...` line gets the header and tokio).
fn dependency_blocks(text: &str) -> Vec<String> {
    text.split("```toml\n")
        .skip(1)
        .map(|rest| rest[..rest.find("\n```").unwrap()].to_owned())
        .filter(|block| block.contains("fencelock = "))
        .map(|block| {
            if block.contains("[dependencies]") {
                block
            } else {
                format!("[dependencies]\n{block}\n")
            }
        })
        .collect()
}

#[test]
fn the_dependency_lines_shown_resolve_beside_a_clone() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap();
    let mut blocks = Vec::new();
    for page in [
        "README.md",
        "docs/guide/src/getting-started.md",
        "docs/guide/src/blocking.md",
    ] {
        let text = std::fs::read_to_string(root.join(page)).unwrap();
        let found = dependency_blocks(&text);
        assert!(!found.is_empty(), "{page} shows no dependency line");
        blocks.extend(found.into_iter().map(|b| (page, b)));
    }
    let tmp = tempfile::tempdir().unwrap();
    // The clone beside the project, as the pages put it.
    std::os::unix::fs::symlink(&root, tmp.path().join("fencelock")).unwrap();
    for (i, (page, block)) in blocks.iter().enumerate() {
        let app = tmp.path().join(format!("app{i}"));
        std::fs::create_dir_all(app.join("src")).unwrap();
        std::fs::write(app.join("src/main.rs"), "fn main() {}\n").unwrap();
        std::fs::write(
            app.join("Cargo.toml"),
            format!("[package]\nname = \"app{i}\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n[workspace]\n\n{block}"),
        )
        .unwrap();
        let out = Command::new(env!("CARGO"))
            .args(["generate-lockfile", "--offline"])
            .current_dir(&app)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{page}'s lines do not resolve:\n{block}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
