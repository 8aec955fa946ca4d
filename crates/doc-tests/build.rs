//! Takes every ```rust block of README.md and of the guide's chapters into
//! `$OUT_DIR/blocks.rs`: a module per block, and a test per block that calls its runner
//! (see src/lib.rs). Top-level items are made `pub` for the runners; nothing else
//! changes.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = vec![("readme".to_owned(), root.join("README.md"))];
    let guide = root.join("docs/guide/src");
    let mut chapters: Vec<PathBuf> = std::fs::read_dir(&guide)
        .expect("docs/guide/src")
        .map(|e| e.expect("a chapter").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .filter(|p| !p.ends_with("SUMMARY.md"))
        .collect();
    chapters.sort();
    println!("cargo:rerun-if-changed={}", guide.display());
    for path in chapters {
        let stem = path
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .replace('-', "_");
        files.push((stem, path));
    }
    let mut blocks = String::from("#[allow(missing_docs)]\npub mod blocks {\n");
    let mut tests = String::from("mod tests {\n");
    for (module, path) in &files {
        println!("cargo:rerun-if-changed={}", path.display());
        let text = std::fs::read_to_string(path).expect("a markdown file");
        let found = rust_blocks(path, &text);
        if found.is_empty() {
            continue;
        }
        writeln!(blocks, "pub mod {module} {{").unwrap();
        writeln!(tests, "mod {module} {{").unwrap();
        for block in found {
            let name = &block.name;
            writeln!(
                blocks,
                "#[allow(dead_code, unused_imports)]\npub mod {name} {{\n// {}, line {}\n{}\n}}",
                path.strip_prefix(&root).unwrap_or(path).display(),
                block.line,
                block.code
            )
            .unwrap();
            writeln!(
                tests,
                "#[test]\nfn {name}() {{\n    crate::runs::{module}::{name}();\n}}"
            )
            .unwrap();
        }
        blocks.push_str("}\n");
        tests.push_str("}\n");
    }
    blocks.push_str("}\n");
    tests.push_str("}\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    std::fs::write(out.join("blocks.rs"), blocks + &tests).unwrap();
}

/// `line` with `pub ` before it when it starts a top-level item (at column 0, as
/// formatted code has them), so that the block's runner, in another module, can call
/// it; the code is otherwise compiled as shown.
fn public(line: &str) -> String {
    const ITEMS: [&str; 8] = [
        "fn ",
        "async fn ",
        "struct ",
        "enum ",
        "const ",
        "static ",
        "type ",
        "trait ",
    ];
    if ITEMS.iter().any(|item| line.starts_with(item)) {
        format!("pub {line}")
    } else {
        line.to_owned()
    }
}

struct Block {
    name: String,
    line: usize,
    code: String,
}

/// The ```rust blocks of a markdown file, each named by the `<!-- test: NAME -->` line
/// before it.
fn rust_blocks(path: &Path, text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks: Vec<Block> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let fence_line = i;
        let end = (i + 1..lines.len())
            .find(|&j| lines[j].trim() == "```")
            .unwrap_or_else(|| panic!("{}:{}: a code block never closed", path.display(), i + 1));
        if info.trim() == "rust" {
            let name = fence_line
                .checked_sub(1)
                .and_then(|p| lines[p].trim().strip_prefix("<!-- test: "))
                .and_then(|rest| rest.strip_suffix(" -->"))
                .unwrap_or_else(|| {
                    panic!(
                        "{}:{}: a rust block without `<!-- test: NAME -->` on the line before it",
                        path.display(),
                        fence_line + 1
                    )
                })
                .to_owned();
            assert!(
                !blocks.iter().any(|b| b.name == name),
                "{}:{}: a second rust block named {name}",
                path.display(),
                fence_line + 1
            );
            blocks.push(Block {
                name,
                line: fence_line + 1,
                code: lines[fence_line + 1..end]
                    .iter()
                    .map(|l| public(l))
                    .collect::<Vec<_>>()
                    .join("\n"),
            });
        } else if info.trim().starts_with("rust") {
            panic!(
                "{}:{}: a rust block is run as it is: no ```{} (write ```rust)",
                path.display(),
                fence_line + 1,
                info.trim()
            );
        }
        i = end + 1;
    }
    blocks
}
