//! A web handler that serialises the requests for one order: two requests for order 42
//! never run at once (on any instance of the service), while requests for other orders
//! go on in parallel. A request waits up to 2 s for the order's lock, and the whole
//! request has 5 s; each outcome becomes an HTTP status.
//!
//! The handler is framework-agnostic: `reserve(&client, order_id)` returns a status and
//! a body. With axum, for instance: `async fn handler(State(client): State<Client>,
//! Path(id): Path<u64>) -> (StatusCode, String)` calling it. This program plays a burst
//! of requests against it and prints one line per response.
//!
//! ```text
//! FENCELOCK_REDIS=redis://127.0.0.1:6379 cargo run -p fencelock --example per_order
//! ```
//!
//! `WORK_MS` (default 300) is how long the stand-in work takes per request; `REQUESTS`
//! (default 4) how many requests each of orders 42 and 7 gets at once.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::{Client, Error};

/// How long a request waits for its order's lock.
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// How long a whole request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The orders being worked on in this process, to show that one order's requests never
/// overlap (a real service has no need of it: the lock is the point).
type Busy = Arc<Mutex<HashSet<u64>>>;

/// The handler: the order's work under the order's lock, as an HTTP status and body.
async fn reserve(client: &Client, order_id: u64, busy: &Busy) -> (u16, String) {
    let work = client
        .lock(format!("orders:{order_id}"))
        .wait(LOCK_WAIT)
        .run(|token| async move {
            if !busy.lock().unwrap().insert(order_id) {
                return format!("order {order_id}: OVERLAP under token {token}");
            }
            tokio::time::sleep(work_time()).await; // read, decide, write with the token
            busy.lock().unwrap().remove(&order_id);
            format!("order {order_id} reserved under fencing token {token}")
        });
    match tokio::time::timeout(REQUEST_TIMEOUT, work).await {
        Ok(Ok(body)) => (200, body),
        // Still held when the wait ran out: the client may retry.
        Ok(Err(Error::Held { .. })) => (409, format!("order {order_id} is busy; retry")),
        // Redis unreachable, or the lease lost while working (the work was cancelled).
        Ok(Err(e)) => (503, format!("order {order_id}: {e}")),
        // Dropping `work` cancels it and releases the lock in the background.
        Err(_) => (504, format!("order {order_id}: timed out")),
    }
}

fn work_time() -> Duration {
    let ms = std::env::var("WORK_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    Duration::from_millis(ms)
}

#[tokio::main]
async fn main() -> Result<(), fencelock::Error> {
    let url = std::env::var("FENCELOCK_REDIS").unwrap_or("redis://127.0.0.1:6379".into());
    let requests: u64 = std::env::var("REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let client = Client::connect(&url).await?;
    let busy = Busy::default();
    let mut handlers = Vec::new();
    for order_id in [42, 7] {
        for _ in 0..requests {
            let (client, busy) = (client.clone(), busy.clone());
            handlers.push(tokio::spawn(async move {
                reserve(&client, order_id, &busy).await
            }));
        }
    }
    for handler in handlers {
        let (status, body) = handler.await.expect("the handler's task");
        println!("{status} {body}");
    }
    Ok(())
}
