//! Nothing to use: this package's test (`tests/docs.rs`) runs every Rust block of
//! README.md and of the guide's chapters (`docs/guide/src/*.md`) against real servers.
//!
//! The markdown shows the code exactly as a user copies it, with no hidden lines: the
//! build script takes each ```` ```rust ```` block, named by the `<!-- test: NAME -->`
//! comment on the line before it, into a module of its own
//! (`blocks::<chapter>::<NAME>`), and a test per block calls the runner of the same
//! name in `tests/runs/<chapter>.rs`, which starts the servers, calls the block's
//! functions and checks what a user would check. A block without a name, or without a
//! runner, fails the build.
