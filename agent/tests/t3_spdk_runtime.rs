//! T3: the SPDK runtime's guarantees under faults: a panic on the reactor fails only its own
//! request, a request that never gets an answer times out (and an engine call with it)
//! without freezing the others, and requests racing `stop()` are each answered or refused.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use futures::executor::block_on;
use liteio_agent::engine::spdk::{BaseBdev, SpdkLvsEngine};
use liteio_agent::engine::{ErrorKind as EngineKind, PoolEngine};
use liteio_agent::spdk::runtime::{self, Reply, exec, on_reactor};
use liteio_agent::spdk::{ErrorKind, Spdk, SpdkError, SpdkOptions, bdev};

/// One SPDK runtime at a time in this process.
static SERIAL: Mutex<()> = Mutex::new(());

fn start(name: &str, timeout: Duration) -> Spdk {
    Spdk::start(&SpdkOptions {
        name: name.into(),
        request_timeout: timeout,
        ..SpdkOptions::small()
    })
    .expect("SPDK starts")
}

#[test]
fn a_panic_on_the_reactor_fails_its_request_and_spdk_goes_on() {
    let _g = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let spdk = start("t3-panic", Duration::from_secs(10));
    let before = runtime::caught_panics();

    let e = block_on(on_reactor(|| -> liteio_agent::spdk::Result<()> {
        panic!("injected panic on the reactor")
    }))
    .unwrap_err();
    assert!(matches!(e, SpdkError::Panicked), "{e}");
    assert_eq!(e.kind(), ErrorKind::Engine);
    // A panic after the request started an SPDK operation, from a closure holding its reply.
    let e = block_on(exec(|reply: Reply<u32>| {
        let _keep = &reply;
        panic!("injected panic holding the reply")
    }))
    .unwrap_err();
    assert!(matches!(e, SpdkError::Panicked), "{e}");

    // The runtime keeps serving.
    assert_eq!(block_on(on_reactor(|| Ok(7))).unwrap(), 7);
    // Counted once caught (the reply went out while unwinding, before the count).
    assert_eq!(runtime::caught_panics(), before + 2);
    let b = block_on(bdev::create_malloc("panic_after", 4 << 20, 512)).unwrap();
    assert_eq!(b.size_bytes(), 4 << 20);
    block_on(bdev::delete_malloc("panic_after")).unwrap();
    spdk.stop();
}

#[test]
fn a_request_without_an_answer_times_out_and_others_go_on() {
    let _g = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let timeout = Duration::from_secs(1);
    let spdk = start("t3-timeout", timeout);
    let before = runtime::timed_out_requests();

    // A completion that never comes (the reply is leaked, as by a lost SPDK callback).
    let t = Instant::now();
    let e = block_on(exec(|reply: Reply<()>| std::mem::forget(reply))).unwrap_err();
    let waited = t.elapsed();
    assert!(matches!(e, SpdkError::Timeout { .. }), "{e}");
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert!(
        e.to_string().contains("t3_spdk_runtime.rs"),
        "names the caller: {e}"
    );
    assert!(waited >= timeout && waited < timeout * 3, "{waited:?}");
    eprintln!("lost completion: {e} (after {waited:?})");

    // A reactor parked for 3 s: the call times out after 1 s; its late answer is dropped.
    let t = Instant::now();
    let e = block_on(on_reactor(|| {
        std::thread::sleep(Duration::from_secs(3));
        Ok(())
    }))
    .unwrap_err();
    assert!(matches!(e, SpdkError::Timeout { .. }), "{e}");
    assert!(
        t.elapsed() < Duration::from_millis(2500),
        "{:?}",
        t.elapsed()
    );

    // An engine call while the reactor is parked: an error naming the timeout, not a freeze.
    let engine = SpdkLvsEngine::new(
        "to-lvs",
        BaseBdev::Malloc {
            name: "to-base".into(),
            size: 64 << 20,
        },
        0,
    );
    // Wait out the park above, then build the pool.
    std::thread::sleep(Duration::from_secs(2));
    engine.ensure_pool().unwrap();
    let parked = std::thread::spawn(|| {
        block_on(on_reactor(|| {
            std::thread::sleep(Duration::from_secs(3));
            Ok(())
        }))
    });
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let e = engine.info().unwrap_err();
    assert_eq!(e.kind(), EngineKind::PoolUnavailable, "{e}");
    assert!(e.to_string().contains("no answer from SPDK"), "{e}");
    assert!(
        t.elapsed() < Duration::from_millis(2500),
        "{:?}",
        t.elapsed()
    );
    assert!(parked.join().unwrap().is_err());
    assert!(runtime::timed_out_requests() >= before + 4);

    // Once the reactor is free, everything works again.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(block_on(on_reactor(|| Ok(1))).unwrap(), 1);
    assert!(engine.info().unwrap().total_bytes > 0);
    spdk.stop();
}

#[test]
fn requests_racing_stop_are_answered_or_refused() {
    let _g = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    const MAX_ITERATIONS: u32 = 1000;
    // About 5 cycles a second here: 1,000 take some 3 minutes; the budget bounds a slow machine.
    const BUDGET: Duration = Duration::from_secs(300);
    const SENDERS: usize = 4;
    let (answered, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let other = Arc::new(Mutex::new(Vec::<String>::new()));
    let t = Instant::now();
    let mut iterations = 0;
    while iterations < MAX_ITERATIONS && t.elapsed() < BUDGET {
        let spdk = start("t3-stop-race", Duration::from_secs(10));
        let done = Arc::new(AtomicBool::new(false));
        let senders: Vec<_> = (0..SENDERS)
            .map(|_| {
                let (done, answered, refused, other) = (
                    done.clone(),
                    answered.clone(),
                    refused.clone(),
                    other.clone(),
                );
                std::thread::spawn(move || {
                    while !done.load(Ordering::Acquire) {
                        match block_on(on_reactor(|| Ok(()))) {
                            Ok(()) => answered.fetch_add(1, Ordering::Relaxed),
                            Err(SpdkError::NotRunning) => {
                                refused.fetch_add(1, Ordering::Relaxed);
                                std::thread::yield_now();
                                0
                            }
                            Err(e) => {
                                other.lock().unwrap().push(e.to_string());
                                0
                            }
                        };
                    }
                })
            })
            .collect();
        // Let the senders get going, then stop under them.
        std::thread::sleep(Duration::from_millis(2));
        spdk.stop();
        done.store(true, Ordering::Release);
        for s in senders {
            s.join().expect("a sender panicked");
        }
        iterations += 1;
    }
    let (a, r) = (
        answered.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    );
    let other = other.lock().unwrap();
    eprintln!(
        "stop race: {iterations} start/stop iterations in {:?}, {SENDERS} senders: {a} requests answered, {r} refused, {} otherwise",
        t.elapsed(),
        other.len()
    );
    assert!(other.is_empty(), "neither answered nor refused: {other:?}");
    assert!(
        iterations >= 100,
        "only {iterations} iterations in {BUDGET:?}"
    );
    assert!(a > 0 && r > 0, "{a} answered, {r} refused");
}
