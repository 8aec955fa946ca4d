//! Every Rust block of README.md and of the guide, run against real servers: the blocks
//! are compiled as they are shown (`blocks::<chapter>::<name>`, from the build script),
//! and each block's runner (`runs::<chapter>::<name>`, in `runs/<chapter>.rs`) calls
//! them and checks what a reader would.

include!(concat!(env!("OUT_DIR"), "/blocks.rs"));

mod runs;

/// A runtime for a runner: the blocks are async functions.
fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime")
}
